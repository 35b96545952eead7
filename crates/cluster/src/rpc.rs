//! Calls between nodes: HTTP/1.1 POSTs whose bodies are frames (`frame::Kind::Rpc`), each authenticated
//! by an HMAC-SHA256 of the cluster secret over a timestamp, the path and the body, accepted within five
//! minutes. A node without the secret can neither send nor forge a call; a call altered on the way fails
//! its HMAC. With `Tls`, calls go over TLS: they are private on the way, and a caller talks only to a
//! node whose certificate the cluster's authority signed for the address it calls.

use crate::frame::{self, Kind};
use bytes::Bytes;
use hmac::{KeyInit, Mac};
use http_body_util::{BodyExt, Limited};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub const AUTH_HEADER: &str = "x-mosaic-cluster-auth";
/// Largest call or answer: a drive command carries up to 64 MiB of data (a staged shard of 8 MiB, an
/// inline write up to the set's operation limit).
pub const MAX_RPC_BYTES: usize = 72 << 20;
const MAX_SKEW_SECS: u64 = 300;
/// Most connections a node serves at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 512;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster secret: 32 random bytes, written as 64 hex digits.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn generate() -> Self {
        Secret(rand::random())
    }

    pub fn parse(hex_digits: &str) -> Result<Self, String> {
        let raw = hex::decode(hex_digits.trim()).map_err(|_| "a cluster secret is 64 hex digits".to_string())?;
        let bytes: [u8; 32] = raw.try_into().map_err(|_| "a cluster secret is 64 hex digits".to_string())?;
        Ok(Secret(bytes))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A key for one purpose, derived from the secret (HMAC-SHA256 of the secret over `purpose`): what it
    /// signs can never pass for a call's signature.
    pub fn derive(&self, purpose: &[u8]) -> [u8; 32] {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(b"derived key: ");
        mac.update(purpose);
        mac.finalize().into_bytes().into()
    }

    /// The MAC of a call whose body is `parts` one after the other.
    fn mac(&self, unix_s: u64, path: &str, parts: &[&[u8]]) -> hmac::Hmac<Sha256> {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(&unix_s.to_be_bytes());
        mac.update(path.as_bytes());
        mac.update(&[0]);
        for part in parts {
            mac.update(part);
        }
        mac
    }

    /// The value of `AUTH_HEADER` for a call to `path` with `body` at `unix_s`.
    pub fn sign(&self, unix_s: u64, path: &str, body: &[u8]) -> String {
        self.sign_parts(unix_s, path, &[body])
    }

    /// `sign` of a body sent in parts (the same value as for the parts joined).
    fn sign_parts(&self, unix_s: u64, path: &str, parts: &[&[u8]]) -> String {
        format!("{unix_s}:{}", hex::encode(self.mac(unix_s, path, parts).finalize().into_bytes()))
    }

    /// Checks `header` for a call to `path` with `body`, received at `now_s`.
    pub fn verify(&self, header: Option<&str>, now_s: u64, path: &str, body: &[u8]) -> Result<(), &'static str> {
        let header = header.ok_or("no cluster authentication")?;
        let (time, mac) = header.split_once(':').ok_or("malformed cluster authentication")?;
        let unix_s: u64 = time.parse().map_err(|_| "malformed cluster authentication")?;
        if unix_s.abs_diff(now_s) > MAX_SKEW_SECS {
            return Err("cluster call too far from this node's time");
        }
        let raw = hex::decode(mac).map_err(|_| "malformed cluster authentication")?;
        self.mac(unix_s, path, &[body]).verify_slice(&raw).map_err(|_| "cluster authentication fails (wrong secret?)")
    }
}

pub fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The node could not be reached or did not answer in time: it may be down.
    #[error("node {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    /// The node answered with a refusal.
    #[error("node {addr} refused {path}: {status} {message}")]
    Refused { addr: String, path: String, status: u16, message: String },
    #[error("bad answer from {addr}: {reason}")]
    BadAnswer { addr: String, reason: String },
}

/// TLS on the cluster port: the certificate this node serves, and the authorities whose certificates it
/// accepts from the nodes it calls (each node's certificate names the address other nodes reach it at).
/// The secret still authenticates every call; TLS adds privacy and the called node's identity.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    roots: Vec<reqwest::Certificate>,
}

impl Tls {
    pub fn new(acceptor: tokio_rustls::TlsAcceptor, roots: Vec<reqwest::Certificate>) -> Result<Self, String> {
        if roots.is_empty() {
            return Err("cluster TLS needs the certificate of the authority that signed the nodes' certificates".into());
        }
        Ok(Tls { acceptor, roots })
    }
}

/// Sends calls to other nodes. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RpcClient {
    http: reqwest::Client,
    secret: Secret,
    /// "http", or "https" with TLS.
    scheme: &'static str,
}

impl RpcClient {
    /// Calls signed with `secret`; over TLS, trusting `tls`'s authorities, when `tls` is given.
    pub fn new(secret: Secret, tls: Option<&Tls>) -> Result<Self, String> {
        let mut http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(8)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            http = http.https_only(true).tls_built_in_root_certs(false);
            for root in &tls.roots {
                http = http.add_root_certificate(root.clone());
            }
        }
        let http = http.build().map_err(|e| format!("cluster RPC client: {e}"))?;
        Ok(RpcClient { http, secret, scheme: if tls.is_some() { "https" } else { "http" } })
    }

    /// The key this node signs its drive commands' capabilities with (the cluster's).
    pub fn capability_key(&self) -> crate::capability::CapabilityKey {
        crate::capability::CapabilityKey::of(&self.secret)
    }

    /// Calls `path` on the node at `addr` with `request` (JSON), waiting at most `timeout`.
    pub async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        request: &Q,
        timeout: Duration,
    ) -> Result<A, RpcError> {
        let body = frame::encode(Kind::Rpc, request)
            .map_err(|e| RpcError::BadAnswer { addr: addr.into(), reason: format!("the call does not encode: {e}") })?;
        let raw = self.call_raw(addr, path, Parts::from(body), timeout).await?;
        frame::decode(Kind::Rpc, &raw).map_err(|e| RpcError::BadAnswer { addr: addr.into(), reason: e.to_string() })
    }

    /// Calls `path` on the node at `addr` with a framed `body` (sent part after part, not joined); the
    /// answer's frame, unchecked.
    pub async fn call_raw(&self, addr: &str, path: &str, body: Parts, timeout: Duration) -> Result<Bytes, RpcError> {
        let answer = self.call_streamed(addr, path, body, timeout).await?;
        let raw = answer
            .response
            .bytes()
            .await
            .map_err(|e| RpcError::Unreachable { addr: addr.into(), reason: with_causes(&e) })?;
        if raw.len() > MAX_RPC_BYTES {
            return Err(RpcError::BadAnswer { addr: addr.into(), reason: "an answer over the size limit".into() });
        }
        Ok(raw)
    }

    /// `call_raw` whose answer is taken part by part as it arrives (`StreamedAnswer::next_part`), so a
    /// large answer can be written where it goes without being gathered into one buffer first. A refused
    /// call is an error here, with its message, as in `call_raw`.
    pub async fn call_streamed(
        &self,
        addr: &str,
        path: &str,
        body: Parts,
        timeout: Duration,
    ) -> Result<StreamedAnswer, RpcError> {
        let unreachable = |reason: String| RpcError::Unreachable { addr: addr.to_string(), reason };
        let auth = self.secret.sign_parts(now_s(), path, &[&body.head, &body.payload]);
        let response = self
            .http
            .post(format!("{}://{addr}{path}", self.scheme))
            .header(AUTH_HEADER, auth)
            .body(reqwest::Body::wrap(body))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| unreachable(with_causes(&e)))?;
        let status = response.status();
        if response.content_length().is_some_and(|n| n > MAX_RPC_BYTES as u64) {
            return Err(RpcError::BadAnswer { addr: addr.into(), reason: "an answer over the size limit".into() });
        }
        if !status.is_success() {
            let raw = response.bytes().await.map_err(|e| unreachable(with_causes(&e)))?;
            let message = String::from_utf8_lossy(&raw[..raw.len().min(512)]).into_owned();
            return Err(RpcError::Refused { addr: addr.into(), path: path.into(), status: status.as_u16(), message });
        }
        Ok(StreamedAnswer { addr: addr.to_string(), response, received_bytes: 0 })
    }
}

/// A successful call's answer, taken part by part; bounded like a whole answer.
pub struct StreamedAnswer {
    addr: String,
    response: reqwest::Response,
    received_bytes: usize,
}

impl StreamedAnswer {
    /// The next part of the answer as it arrived, or None after the last.
    pub async fn next_part(&mut self) -> Result<Option<Bytes>, RpcError> {
        let part = self
            .response
            .chunk()
            .await
            .map_err(|e| RpcError::Unreachable { addr: self.addr.clone(), reason: with_causes(&e) })?;
        if let Some(p) = &part {
            self.received_bytes = self.received_bytes.saturating_add(p.len());
            if self.received_bytes > MAX_RPC_BYTES {
                return Err(RpcError::BadAnswer {
                    addr: self.addr.clone(),
                    reason: "an answer over the size limit".into(),
                });
            }
        }
        Ok(part)
    }
}

/// An error with what caused it (reqwest says only "error sending request"; the cause says a refused
/// connection, a timeout or a certificate the caller does not trust).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    // Bounded: a chain is a few links; a cycle must not loop.
    for _ in 0..8 {
        let Some(c) = cause else { break };
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// What a node does with an authenticated call: the answer's frame, or a status and a message.
pub type Answer = Result<Parts, (StatusCode, String)>;

/// A call's or an answer's body as it is sent: a head, then a payload of bulk bytes that is sent as it is
/// rather than copied after the head (a drive frame's data). Sent with its exact length.
#[derive(Debug, Default)]
pub struct Parts {
    pub head: Bytes,
    pub payload: Bytes,
}

impl Parts {
    pub fn new(head: impl Into<Bytes>, payload: Bytes) -> Self {
        Parts { head: head.into(), payload }
    }

    pub fn len_bytes(&self) -> usize {
        self.head.len() + self.payload.len()
    }
}

impl From<Vec<u8>> for Parts {
    fn from(head: Vec<u8>) -> Self {
        Parts { head: head.into(), payload: Bytes::new() }
    }
}

impl hyper::body::Body for Parts {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = match (self.head.is_empty(), self.payload.is_empty()) {
            (false, _) => std::mem::take(&mut self.head),
            (true, false) => std::mem::take(&mut self.payload),
            (true, true) => return std::task::Poll::Ready(None),
        };
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(next))))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.payload.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.len_bytes() as u64)
    }
}

pub trait Handler: Send + Sync + 'static {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>>;
}

/// Hands each call to the handler of the longest path prefix that matches it.
pub struct Router {
    routes: Vec<(&'static str, Arc<dyn Handler>)>,
}

impl Router {
    pub fn new() -> Self {
        Router { routes: Vec::new() }
    }

    pub fn route(mut self, prefix: &'static str, handler: Arc<dyn Handler>) -> Self {
        self.routes.push((prefix, handler));
        self.routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self
    }
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

impl Handler for Router {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        match self.routes.iter().find(|(prefix, _)| path.starts_with(prefix)) {
            Some((_, handler)) => handler.clone().handle(path, body),
            None => Box::pin(async move { Err((StatusCode::NOT_FOUND, format!("no cluster call {path}"))) }),
        }
    }
}

/// Parses a call's body.
pub fn parse<Q: DeserializeOwned>(body: &[u8]) -> Result<Q, (StatusCode, String)> {
    frame::decode(Kind::Rpc, body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))
}

/// An answer's frame.
pub fn answer<A: Serialize>(value: &A) -> Answer {
    frame::encode(Kind::Rpc, value).map(Parts::from).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// Serves calls on `listener` (over TLS with `tls`) until `stop` resolves; then open connections are closed
/// too (a node that stops serving must not go on answering on connections kept alive).
pub async fn serve(
    listener: TcpListener,
    secret: Secret,
    tls: Option<Tls>,
    handler: Arc<dyn Handler>,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // Reap finished connections so the set stays as large as the open ones.
        while connections.try_join_next().is_some() {}
        let (stream, _) = tokio::select! {
            _ = &mut stop => {
                // Waited for, not only told: a connection task in the middle of a poll would otherwise
                // serve one more call after the server said it stopped.
                connections.abort_all();
                while connections.join_next().await.is_some() {}
                return;
            }
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "cluster RPC accept");
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let _ = stream.set_nodelay(true);
        let (secret, handler, acceptor) = (secret.clone(), handler.clone(), tls.as_ref().map(|t| t.acceptor.clone()));
        connections.spawn(async move {
            match acceptor {
                None => serve_connection(stream, secret, handler).await,
                // The handshake is bounded like a request's headers: a caller that stalls in it holds a
                // connection permit no longer.
                Some(acceptor) => match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => serve_connection(stream, secret, handler).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "cluster RPC TLS handshake failed"),
                    Err(_) => tracing::debug!("cluster RPC TLS handshake timed out"),
                },
            }
            drop(permit);
        });
    }
}

/// Serves the calls of one connection.
async fn serve_connection<Io>(io: Io, secret: Secret, handler: Arc<dyn Handler>)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| serve_call(req, secret.clone(), handler.clone()));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "cluster RPC connection");
    }
}

async fn serve_call(
    req: Request<hyper::body::Incoming>,
    secret: Secret,
    handler: Arc<dyn Handler>,
) -> Result<Response<Parts>, std::convert::Infallible> {
    let reply = |status: StatusCode, body: Parts| {
        let mut r = Response::new(body);
        *r.status_mut() = status;
        Ok(r)
    };
    if req.method() != hyper::Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, b"cluster calls are POSTs".to_vec().into());
    }
    let path = req.uri().path().to_string();
    let auth = req.headers().get(AUTH_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = match Limited::new(req.into_body(), MAX_RPC_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(StatusCode::PAYLOAD_TOO_LARGE, format!("cluster call body: {e}").into_bytes().into()),
    };
    if let Err(why) = secret.verify(auth.as_deref(), now_s(), &path, &body) {
        return reply(StatusCode::UNAUTHORIZED, why.as_bytes().to_vec().into());
    }
    match handler.handle(path, body).await {
        Ok(frame) => reply(StatusCode::OK, frame),
        Err((status, message)) => reply(status, message.into_bytes().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_signed_and_checked() {
        let secret = Secret::generate();
        let now = now_s();
        let header = secret.sign(now, "/raft/vote", b"body");
        assert_eq!(secret.verify(Some(&header), now, "/raft/vote", b"body"), Ok(()));
        assert!(secret.verify(Some(&header), now, "/raft/vote", b"bodx").is_err());
        assert!(secret.verify(Some(&header), now, "/raft/append", b"body").is_err());
        assert!(secret.verify(Some(&header), now + 301, "/raft/vote", b"body").is_err());
        assert!(Secret::generate().verify(Some(&header), now, "/raft/vote", b"body").is_err());
        assert!(secret.verify(None, now, "/raft/vote", b"body").is_err());
        assert!(secret.verify(Some("x"), now, "/raft/vote", b"body").is_err());
        assert!(secret.verify(Some("1:zz"), now, "/raft/vote", b"body").is_err());
        let again = Secret::parse(&secret.to_hex()).unwrap();
        assert_eq!(again.sign(now, "/p", b""), secret.sign(now, "/p", b""));
        assert!(Secret::parse("abc").is_err());
        assert!(Secret::parse(&"0".repeat(66)).is_err());
    }
}
