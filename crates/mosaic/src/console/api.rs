//! The console page's JSON calls. Every call but sign-in needs a live session; every change also needs
//! the session's CSRF token in `x-mosaic-csrf`. Bucket and object calls become S3 requests signed with
//! the session's key (see `s3`); admin calls are the admin API's, for root sessions only.

use super::Console;
use super::s3::{Answer, Signer, object_path, query, records, texts};
use super::session::{self, Session};
use crate::admin_server::{AdminState, Resp};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Largest body of one upload call: larger files are sent as multipart parts of at most this.
pub const MAX_UPLOAD_BYTES: usize = 16 << 20;
/// Largest JSON body of a call.
pub const MAX_JSON_BYTES: usize = 256 << 10;
/// Most keys deleted by one call.
pub const MAX_DELETE_KEYS: usize = 1000;
/// Most objects and folders one listing call returns.
pub const MAX_PAGE: usize = 1000;
/// Most listing pages one usage call walks (a larger bucket is reported as "at least").
pub const MAX_USAGE_PAGES: usize = 100;
/// How long a link lasts when the caller does not say.
const DEFAULT_LINK_SECS: u64 = 3600;

pub fn error(status: u16, message: impl Into<String>) -> Resp {
    reply(status, json!({ "error": message.into() }))
}

/// Why a call is refused (HTTP status, message), small enough to pass around; `error` answers it.
struct Refused(u16, String);

impl From<Refused> for Resp {
    fn from(Refused(status, message): Refused) -> Resp {
        error(status, message)
    }
}

fn reply(status: u16, v: Value) -> Resp {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .body(Full::new(Bytes::from(serde_json::to_vec(&v).expect("serializes"))))
        .expect("valid response")
}

/// A request's query parameters, decoded as a form (`+` is a space, as browsers' URLSearchParams send it).
fn params(uri: &http::Uri) -> HashMap<String, String> {
    let decode = |s: &str| percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// A bucket name that can go into a path as it is (S3 refuses the rest with its own reasons).
fn bucket_param(p: &HashMap<String, String>) -> Result<String, Refused> {
    let b = p.get("bucket").cloned().unwrap_or_default();
    let fine = !b.is_empty() && b.len() <= 63 && b.bytes().all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c));
    if !fine {
        return Err(Refused(400, format!("{b:?} is not a bucket name: 1-63 letters, digits, '-', '.' or '_'")));
    }
    Ok(b)
}

fn key_param(p: &HashMap<String, String>) -> Result<String, Refused> {
    match p.get("key") {
        Some(k) if !k.is_empty() && k.len() <= 1024 => Ok(k.clone()),
        _ => Err(Refused(400, "an object key of 1 to 1024 bytes is needed".into())),
    }
}

/// The body, at most `limit` bytes.
async fn body(req: http::Request<hyper::body::Incoming>, limit: usize) -> Result<Bytes, Refused> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(Refused(413, format!("the body is larger than {limit} bytes")))
        }
        Err(e) => Err(Refused(400, format!("the body broke off: {e}"))),
    }
}

async fn json_body(req: http::Request<hyper::body::Incoming>) -> Result<Value, Refused> {
    let b = body(req, MAX_JSON_BYTES).await?;
    serde_json::from_slice(&b).map_err(|e| Refused(400, format!("the body is not JSON: {e}")))
}

/// The secret of a key the server knows (root or an access key).
async fn secret_of(state: &AdminState, access_key: &str) -> Option<String> {
    use s3s::auth::S3Auth;
    state.keys.get_secret_key(access_key).await.ok().map(|s| s.expose().to_string())
}

pub async fn route(state: &Arc<AdminState>, console: &Console, req: http::Request<hyper::body::Incoming>) -> Resp {
    let (method, path) = (req.method().as_str().to_string(), req.uri().path().to_string());
    let call = path.trim_start_matches("/console/api/").to_string();
    if (method.as_str(), call.as_str()) == ("POST", "login") {
        return login(state, console, req).await;
    }
    let Some(id) = session::cookie_id(req.headers()) else {
        return error(401, "sign in first");
    };
    let Some(session) = console.sessions.get(&id) else {
        return error(401, "the session has ended: sign in again");
    };
    if method != "GET" && method != "HEAD" {
        let token = req.headers().get(session::CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !session::same_secret(&session.csrf, token) {
            return error(403, "the request lacks this session's CSRF token");
        }
    }
    let Some(secret) = secret_of(state, &session.access_key).await else {
        console.sessions.end(&id);
        return error(401, "the key of this session no longer exists");
    };
    let signer = Signer { access_key: session.access_key.clone(), secret_key: secret };
    let call = Call { state, console, session: &session, signer: &signer };
    let p = params(req.uri());
    match (method.as_str(), call_name(&path)) {
        ("POST", "logout") => {
            console.sessions.end(&id);
            let mut r = reply(200, json!({ "signed_out": true }));
            let cookie = session::set_cookie(None, console.secure).parse().expect("valid cookie");
            r.headers_mut().insert(http::header::SET_COOKIE, cookie);
            r
        }
        ("GET", "me") => reply(200, me(&session)),
        ("GET", "buckets") => call.buckets().await,
        ("POST", "bucket") => call.bucket_change("PUT", &p).await,
        ("DELETE", "bucket") => call.bucket_change("DELETE", &p).await,
        ("GET", "objects") => call.objects(&p).await,
        ("GET", "usage") => call.usage(&p).await,
        ("GET", "object") => call.object_info(&p).await,
        ("PUT", "object") => call.put_object(&p, req).await,
        ("DELETE", "object") => call.delete_objects(&p, None).await,
        ("POST", "delete") => match json_body(req).await {
            Ok(v) => call.delete_objects(&p, Some(v)).await,
            Err(r) => r.into(),
        },
        ("POST", "link") => call.link(&p, req.headers()),
        ("POST", "upload") => call.multipart("POST", &p, Bytes::new()).await,
        ("PUT", "upload") => match body(req, MAX_UPLOAD_BYTES).await {
            Ok(b) => call.multipart("PUT", &p, b).await,
            Err(r) => r.into(),
        },
        ("DELETE", "upload") => call.multipart("DELETE", &p, Bytes::new()).await,
        ("POST", "complete") => match json_body(req).await {
            Ok(v) => call.complete(&p, v).await,
            Err(r) => r.into(),
        },
        (m, "admin") => call.admin(m, &path).await,
        _ => error(404, format!("no console call {method} {path}")),
    }
}

/// `buckets` of `/console/api/buckets`; `admin` for every `/console/api/admin/...`.
fn call_name(path: &str) -> &str {
    let call = path.trim_start_matches("/console/api/");
    if call.starts_with("admin/") { "admin" } else { call }
}

fn me(s: &Session) -> Value {
    json!({ "access_key": s.access_key, "root": s.root, "csrf": s.csrf })
}

async fn login(state: &AdminState, console: &Console, req: http::Request<hyper::body::Incoming>) -> Resp {
    let ip = req.extensions().get::<crate::admin_server::Peer>().map(|p| p.0.ip());
    if let Some(wait) = ip.and_then(|ip| console.failures.wait(ip)) {
        let mut r =
            error(429, format!("too many failed sign-ins from this address: try again in {} s", wait.as_secs() + 1));
        r.headers_mut().insert(http::header::RETRY_AFTER, (wait.as_secs() + 1).into());
        return r;
    }
    let v = match json_body(req).await {
        Ok(v) => v,
        Err(r) => return r.into(),
    };
    let (Some(ak), Some(sk)) = (v["access_key"].as_str(), v["secret_key"].as_str()) else {
        return error(400, "give access_key and secret_key");
    };
    let known = secret_of(state, ak).await;
    // The same answer, after the same work, for an unknown key and a wrong secret.
    let fits = session::same_secret(known.as_deref().unwrap_or("\u{0}no such key"), sk) && known.is_some();
    if !fits {
        if let Some(ip) = ip {
            console.failures.failed(ip);
        }
        tracing::warn!(access_key = ak, "console sign-in refused");
        return error(401, "the access key or the secret is wrong");
    }
    let (id, s) = console.sessions.start(ak, state.keys.is_root(ak));
    tracing::info!(access_key = ak, root = s.root, "console sign-in");
    let mut r = reply(200, me(&s));
    let cookie =
        session::set_cookie(Some((&id, console.sessions.max_age())), console.secure).parse().expect("valid cookie");
    r.headers_mut().insert(http::header::SET_COOKIE, cookie);
    r
}

/// One console call, made as the session's key.
struct Call<'a> {
    state: &'a Arc<AdminState>,
    console: &'a Console,
    session: &'a Session,
    signer: &'a Signer,
}

/// The S3 error of an answer as the console's error (its status, its code and message).
fn s3_failure(a: &Answer) -> Option<Refused> {
    let (code, message) = a.error()?;
    Some(Refused(a.status, if message.is_empty() { code } else { format!("{code}: {message}") }))
}

impl Call<'_> {
    async fn s3(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<Answer, Refused> {
        let a = self
            .console
            .s3
            .call(self.signer, method, path_and_query, headers, body)
            .await
            .map_err(|e| Refused(502, e))?;
        match s3_failure(&a) {
            Some(r) => Err(r),
            None => Ok(a),
        }
    }

    async fn buckets(&self) -> Resp {
        let a = match self.s3("GET", "/", &[], Bytes::new()).await {
            Ok(a) => a,
            Err(r) => return r.into(),
        };
        let buckets: Vec<Value> = records(&a.body, "Bucket", &["Name", "CreationDate"])
            .into_iter()
            .map(|b| json!({ "name": b.get("Name"), "created": b.get("CreationDate") }))
            .collect();
        reply(200, json!({ "buckets": buckets }))
    }

    async fn bucket_change(&self, method: &str, p: &HashMap<String, String>) -> Resp {
        let b = match bucket_param(p) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        match self.s3(method, &format!("/{b}"), &[], Bytes::new()).await {
            Ok(_) => reply(200, json!({ "bucket": b, "done": if method == "PUT" { "created" } else { "deleted" } })),
            Err(r) => r.into(),
        }
    }

    /// One page of a folder: its subfolders and objects (by the `/` delimiter), from `token` on.
    async fn objects(&self, p: &HashMap<String, String>) -> Resp {
        let b = match bucket_param(p) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        let prefix = p.get("prefix").cloned().unwrap_or_default();
        let page = p.get("max").and_then(|m| m.parse::<usize>().ok()).unwrap_or(200).clamp(1, MAX_PAGE).to_string();
        let mut q =
            vec![("list-type", "2"), ("delimiter", "/"), ("prefix", prefix.as_str()), ("max-keys", page.as_str())];
        if let Some(t) = p.get("token").filter(|t| !t.is_empty()) {
            q.push(("continuation-token", t.as_str()));
        }
        let a = match self.s3("GET", &format!("/{b}?{}", query(&q)), &[], Bytes::new()).await {
            Ok(a) => a,
            Err(r) => return r.into(),
        };
        let objects: Vec<Value> = records(&a.body, "Contents", &["Key", "Size", "LastModified", "ETag"])
            .into_iter()
            .map(|o| {
                let size = o.get("Size").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
                json!({ "key": o.get("Key"), "size": size, "modified": o.get("LastModified"), "etag": o.get("ETag") })
            })
            .collect();
        let next = super::s3::first_text(&a.body, "NextContinuationToken");
        let folders = texts(&a.body, Some("CommonPrefixes"), "Prefix");
        reply(200, json!({ "bucket": b, "prefix": prefix, "folders": folders, "objects": objects, "next": next }))
    }

    /// A bucket's objects and bytes, by listing it (at most `MAX_USAGE_PAGES` pages of 1,000; past that
    /// the counts are a lower bound, `complete: false`). S3 has no call for it, and the console only speaks
    /// S3 for buckets, so a key counts only what it may list.
    async fn usage(&self, p: &HashMap<String, String>) -> Resp {
        let b = match bucket_param(p) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        let (mut objects, mut bytes, mut token, mut complete) = (0u64, 0u64, None::<String>, false);
        for _ in 0..MAX_USAGE_PAGES {
            let mut q = vec![("list-type", "2"), ("max-keys", "1000")];
            if let Some(t) = &token {
                q.push(("continuation-token", t.as_str()));
            }
            let a = match self.s3("GET", &format!("/{b}?{}", query(&q)), &[], Bytes::new()).await {
                Ok(a) => a,
                Err(r) => return r.into(),
            };
            for size in texts(&a.body, Some("Contents"), "Size") {
                objects += 1;
                bytes += size.parse::<u64>().unwrap_or(0);
            }
            token = super::s3::first_text(&a.body, "NextContinuationToken");
            if token.is_none() {
                complete = true;
                break;
            }
        }
        reply(200, json!({ "bucket": b, "objects": objects, "bytes": bytes, "complete": complete }))
    }

    /// An object's metadata, checksums and tags.
    async fn object_info(&self, p: &HashMap<String, String>) -> Resp {
        let (b, k) = match (bucket_param(p), key_param(p)) {
            (Ok(b), Ok(k)) => (b, k),
            (Err(r), _) | (_, Err(r)) => return r.into(),
        };
        let path = object_path(&b, &k);
        let checksums = [("x-amz-checksum-mode".to_string(), "ENABLED".to_string())];
        let head = match self.s3("HEAD", &path, &checksums, Bytes::new()).await {
            Ok(a) => a,
            Err(r) => return r.into(),
        };
        let mut headers = serde_json::Map::new();
        for (name, v) in &head.headers {
            let n = name.as_str();
            let shown = n.starts_with("x-amz-meta-")
                || n.starts_with("x-amz-checksum-")
                || n.starts_with("x-amz-server-side")
                || [
                    "content-type",
                    "content-length",
                    "etag",
                    "last-modified",
                    "cache-control",
                    "content-encoding",
                    "content-disposition",
                    "x-amz-version-id",
                    "x-amz-storage-class",
                ]
                .contains(&n);
            if shown && let Ok(v) = v.to_str() {
                headers.insert(n.to_string(), Value::String(v.to_string()));
            }
        }
        let tags = match self.s3("GET", &format!("{path}?tagging"), &[], Bytes::new()).await {
            Ok(a) => records(&a.body, "Tag", &["Key", "Value"])
                .into_iter()
                .map(|t| json!({ "key": t.get("Key"), "value": t.get("Value") }))
                .collect(),
            Err(_) => Vec::new(),
        };
        reply(200, json!({ "bucket": b, "key": k, "headers": headers, "tags": tags }))
    }

    async fn put_object(&self, p: &HashMap<String, String>, req: http::Request<hyper::body::Incoming>) -> Resp {
        let (b, k) = match (bucket_param(p), key_param(p)) {
            (Ok(b), Ok(k)) => (b, k),
            (Err(r), _) | (_, Err(r)) => return r.into(),
        };
        let content_type = req.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
        let data = match body(req, MAX_UPLOAD_BYTES).await {
            Ok(d) => d,
            Err(r) => return r.into(),
        };
        let mut headers: Vec<(String, String)> =
            content_type.into_iter().map(|t| ("content-type".to_string(), t)).collect();
        // Stored with the object and checked by the S3 port against what it received.
        use base64::Engine as _;
        let crc = base64::engine::general_purpose::STANDARD.encode(mosaic_engine::crc32c(&data).to_be_bytes());
        headers.push(("x-amz-checksum-crc32c".to_string(), crc));
        let size = data.len();
        match self.s3("PUT", &object_path(&b, &k), &headers, data).await {
            Ok(a) => {
                let etag = a.headers.get("etag").and_then(|v| v.to_str().ok()).unwrap_or("");
                reply(200, json!({ "bucket": b, "key": k, "size": size, "etag": etag }))
            }
            Err(r) => r.into(),
        }
    }

    /// Deletes one key (`key=`) or the keys of a JSON body (`{"keys": [...]}`), one S3 call each so that
    /// each is authorized alone; reports every key that failed.
    async fn delete_objects(&self, p: &HashMap<String, String>, list: Option<Value>) -> Resp {
        let b = match bucket_param(p) {
            Ok(b) => b,
            Err(r) => return r.into(),
        };
        let keys: Vec<String> = match list {
            None => match key_param(p) {
                Ok(k) => vec![k],
                Err(r) => return r.into(),
            },
            Some(v) => v["keys"]
                .as_array()
                .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
        };
        if keys.is_empty() || keys.len() > MAX_DELETE_KEYS {
            return error(400, format!("give 1 to {MAX_DELETE_KEYS} keys to delete"));
        }
        let mut failed = Vec::new();
        for k in &keys {
            if let Err(Refused(_, why)) = self.s3("DELETE", &object_path(&b, k), &[], Bytes::new()).await {
                failed.push(json!({ "key": k, "error": why }));
            }
        }
        let status = if failed.is_empty() { 200 } else { 207 };
        reply(status, json!({ "deleted": keys.len() - failed.len(), "failed": failed }))
    }

    /// A presigned GET of an object on the S3 port (`download=1`: saved as a file by the browser).
    fn link(&self, p: &HashMap<String, String>, headers: &http::HeaderMap) -> Resp {
        let (b, k) = match (bucket_param(p), key_param(p)) {
            (Ok(b), Ok(k)) => (b, k),
            (Err(r), _) | (_, Err(r)) => return r.into(),
        };
        let secs = match p.get("expires_s").map(|s| s.parse::<u64>()) {
            None => DEFAULT_LINK_SECS,
            Some(Ok(s)) => s,
            Some(Err(_)) => return error(400, "expires_s must be a number of seconds"),
        };
        let mut path = object_path(&b, &k);
        if p.get("download").is_some_and(|d| d == "1") {
            // RFC 6266/5987: the file's name escaped, so any key makes an ASCII header.
            let name = k.rsplit('/').next().unwrap_or(&k);
            let disposition = format!("attachment; filename*=UTF-8''{}", super::s3::escaped(name));
            path = format!("{path}?{}", query(&[("response-content-disposition", disposition.as_str())]));
        }
        let host = browser_host(headers);
        match self.console.s3.presign(self.signer, &host, "GET", &path, Duration::from_secs(secs)) {
            Ok(url) => reply(200, json!({ "url": url, "expires_s": secs })),
            Err(e) => error(400, e),
        }
    }

    /// Starts (POST), sends a part of (PUT) or aborts (DELETE) a multipart upload.
    async fn multipart(&self, method: &str, p: &HashMap<String, String>, data: Bytes) -> Resp {
        let (b, k) = match (bucket_param(p), key_param(p)) {
            (Ok(b), Ok(k)) => (b, k),
            (Err(r), _) | (_, Err(r)) => return r.into(),
        };
        let path = object_path(&b, &k);
        let upload = p.get("upload_id").cloned().unwrap_or_default();
        let q = match method {
            "POST" => "uploads".to_string(),
            "PUT" => {
                let part = p.get("part").and_then(|n| n.parse::<u32>().ok()).filter(|n| (1..=10_000).contains(n));
                let Some(part) = part else { return error(400, "part must be 1 to 10000") };
                query(&[("partNumber", part.to_string().as_str()), ("uploadId", upload.as_str())])
            }
            _ => query(&[("uploadId", upload.as_str())]),
        };
        match self.s3(method, &format!("{path}?{q}"), &[], data).await {
            Ok(a) if method == "POST" => reply(200, json!({ "upload_id": super::s3::first_text(&a.body, "UploadId") })),
            Ok(a) => reply(200, json!({ "etag": a.headers.get("etag").and_then(|v| v.to_str().ok()) })),
            Err(r) => r.into(),
        }
    }

    async fn complete(&self, p: &HashMap<String, String>, v: Value) -> Resp {
        let (b, k) = match (bucket_param(p), key_param(p)) {
            (Ok(b), Ok(k)) => (b, k),
            (Err(r), _) | (_, Err(r)) => return r.into(),
        };
        let upload = p.get("upload_id").cloned().unwrap_or_default();
        let Some(parts) = v["parts"].as_array().filter(|a| !a.is_empty() && a.len() <= 10_000) else {
            return error(400, "give the parts: [{\"part\": n, \"etag\": e}]");
        };
        let mut xml = String::from("<CompleteMultipartUpload>");
        for part in parts {
            let (Some(n), Some(etag)) = (part["part"].as_u64(), part["etag"].as_str()) else {
                return error(400, "each part needs its number and ETag");
            };
            let etag = quick_xml::escape::escape(etag);
            xml.push_str(&format!("<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let path = format!("{}?{}", object_path(&b, &k), query(&[("uploadId", upload.as_str())]));
        match self.s3("POST", &path, &[], Bytes::from(xml)).await {
            Ok(a) => match a.error() {
                // CompleteMultipartUpload can fail with 200 and an error body.
                Some((code, message)) => error(500, format!("{code}: {message}")),
                None => reply(200, json!({ "bucket": b, "key": k, "etag": super::s3::first_text(&a.body, "ETag") })),
            },
            Err(r) => r.into(),
        }
    }

    /// The admin API's answer for a root session.
    async fn admin(&self, method: &str, path: &str) -> Resp {
        if !self.session.root {
            return error(403, "only the root key administers the server");
        }
        let rest = path.trim_start_matches("/console/api/admin/");
        let admin_path = format!("/admin/v1/{rest}");
        let resp = crate::admin_server::dispatch(self.state.clone(), method, &admin_path).await;
        if method == "DELETE"
            && let Some(key) = admin_path.strip_prefix("/admin/v1/keys/")
        {
            self.console.sessions.end_key(key);
        }
        resp
    }
}

/// The host name the browser reached the console by (links point there, on the S3 port).
fn browser_host(headers: &http::HeaderMap) -> String {
    let host = headers.get(http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|h| format!("[{h}]")).unwrap_or_default(),
        None => host.split(':').next().unwrap_or("").to_string(),
    };
    let fine = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b));
    if fine { name } else { "127.0.0.1".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded() {
        let uri: http::Uri = "/console/api/objects?bucket=b&prefix=a%2Fb%20c+d%2B&token=".parse().unwrap();
        let p = params(&uri);
        assert_eq!(p["prefix"], "a/b c d+");
        assert_eq!(p["token"], "");
        assert!(bucket_param(&p).is_ok());
        let bad: http::Uri = "/x?bucket=a/b".parse().unwrap();
        assert!(bucket_param(&params(&bad)).is_err());
        let long: http::Uri = format!("/x?bucket=b&key={}", "k".repeat(1025)).parse().unwrap();
        assert!(key_param(&params(&long)).is_err());
    }

    #[test]
    fn links_use_the_host_the_browser_used() {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::HOST, "console.example:9001".parse().unwrap());
        assert_eq!(browser_host(&h), "console.example");
        h.insert(http::header::HOST, "[::1]:9001".parse().unwrap());
        assert_eq!(browser_host(&h), "[::1]");
        h.insert(http::header::HOST, "evil\"host".parse().unwrap());
        assert_eq!(browser_host(&h), "127.0.0.1");
        assert_eq!(call_name("/console/api/admin/keys/x"), "admin");
    }
}
