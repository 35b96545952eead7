//! The ceiling: a minimal S3-shaped server that keeps objects in memory and answers GETs with the headers
//! Mosaic sends (Content-Length, Content-Type, ETag, Last-Modified, Accept-Ranges, x-amz-request-id), with
//! no storage, no signature check and no checksum. Measured with `mosaic bench s3` like any store, it is
//! the upper bound of HTTP plus the client on a machine: a store's GETs are reported as a fraction of it
//! (issue 14). Bench tooling, never part of the product: it checks nothing and trusts every request.
//!
//! It serves what the bench's GET workloads need with `--keep`: CreateBucket, PutObject, GetObject and
//! HeadObject; anything else is 501. Objects and bytes are bounded.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

/// Most objects the ceiling keeps.
pub const MAX_OBJECTS: usize = 1_000_000;
/// Most bytes it keeps in all (and the largest object).
pub const MAX_BYTES: u64 = 8 << 30;

struct Object {
    data: Bytes,
    etag: String,
}

#[derive(Default)]
struct Store {
    objects: HashMap<String, Arc<Object>>,
    bytes: u64,
}

/// The Last-Modified every object reports (a fixed, valid HTTP date: the ceiling keeps no time).
const LAST_MODIFIED: &str = "Tue, 24 Nov 2026 00:00:00 GMT";

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert("x-amz-request-id", hyper::header::HeaderValue::from_static("0000000000000000"));
    r
}

fn etag_of(data: &[u8]) -> String {
    // Not MD5 (the ceiling must cost nothing per request): a cheap stable tag, quoted as S3 quotes ETags.
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    format!("\"{h:016x}{:016x}\"", data.len())
}

async fn handle(
    store: Arc<RwLock<Store>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().trim_start_matches('/').to_string();
    let is_object = path.contains('/');
    Ok(match (req.method().clone(), is_object) {
        (Method::PUT, false) => reply(StatusCode::OK, Bytes::new()),
        (Method::PUT, true) => {
            let body = match Limited::new(req.into_body(), MAX_BYTES as usize).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, Bytes::new())),
            };
            let etag = etag_of(&body);
            let mut s = store.write();
            let old = s.objects.get(&path).map_or(0, |o| o.data.len() as u64);
            if s.bytes - old + body.len() as u64 > MAX_BYTES || (old == 0 && s.objects.len() >= MAX_OBJECTS) {
                return Ok(reply(StatusCode::INSUFFICIENT_STORAGE, Bytes::new()));
            }
            s.bytes = s.bytes - old + body.len() as u64;
            s.objects.insert(path, Arc::new(Object { data: body, etag: etag.clone() }));
            let mut r = reply(StatusCode::OK, Bytes::new());
            r.headers_mut().insert("etag", etag.parse().expect("an ETag is a header value"));
            r
        }
        (m @ (Method::GET | Method::HEAD), true) => {
            let Some(o) = store.read().objects.get(&path).cloned() else {
                return Ok(reply(StatusCode::NOT_FOUND, Bytes::new()));
            };
            let body = if m == Method::GET { o.data.clone() } else { Bytes::new() };
            let mut r = reply(StatusCode::OK, body);
            let h = r.headers_mut();
            h.insert("content-length", o.data.len().into());
            h.insert("content-type", hyper::header::HeaderValue::from_static("binary/octet-stream"));
            h.insert("etag", o.etag.parse().expect("an ETag is a header value"));
            h.insert("last-modified", hyper::header::HeaderValue::from_static(LAST_MODIFIED));
            h.insert("accept-ranges", hyper::header::HeaderValue::from_static("bytes"));
            r
        }
        _ => reply(StatusCode::NOT_IMPLEMENTED, Bytes::new()),
    })
}

/// Serves on `listener` until the task is dropped or aborted.
pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let store = Arc::new(RwLock::new(Store::default()));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let store = store.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(store.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}
