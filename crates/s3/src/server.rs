//! The HTTP side: accepting connections (TCP_NODELAY, a connection limit, header timeouts against
//! slow-loris), a request id per request (x-amz-request-id and in error XML), one log line and metrics per
//! request, and graceful shutdown that lets in-flight requests finish within a bound.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use s3s::service::S3Service;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use crate::access::SecureTransport;

/// Largest XML request body (DeleteObjects of 1,000 keys of 1,024 bytes fits).
const XML_MAX_BODY_BYTES: usize = 2 << 20;

/// GetObjectAttributes bodies larger than this keep their ETag as s3s writes it (a page of 1,000 parts
/// with checksums stays below).
const MAX_ATTRIBUTES_BODY_BYTES: usize = 1 << 20;
/// Error bodies larger than this are passed through without a RequestId inserted.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub max_headers: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits { max_connections: 1024, header_read_timeout: Duration::from_secs(30), max_headers: 100 }
    }
}

/// What serves S3 requests: s3s over the layer, plus what Mosaic answers before and after s3s (CORS).
#[derive(Clone)]
pub struct Service {
    s3: S3Service,
    layer: Arc<dyn mosaic_layer::ObjectLayer>,
    host: Option<Arc<crate::host::DomainHost>>,
    microstores: Option<Arc<mosaic_microstore::Microstores>>,
}

impl Service {
    /// Routes every request through its bucket's microstore (its workers) and counts it in the bucket's
    /// workload window.
    pub fn with_microstores(mut self, microstores: Arc<mosaic_microstore::Microstores>) -> Service {
        self.microstores = Some(microstores);
        self
    }
}

/// Builds the s3s service over an ObjectLayer with root credentials only and optional virtual-host domain.
pub fn build_service(
    layer: Arc<dyn mosaic_layer::ObjectLayer>,
    access_key: &str,
    secret_key: &str,
    domain: Option<&str>,
) -> Result<Service, String> {
    let keys = Arc::new(crate::access::KeyRing::new(access_key, secret_key, Default::default()));
    build_service_with_keys(layer, keys, domain, true)
}

/// Builds the s3s service with the root key and the access keys of `keys` (authentication and access).
/// `sse_c_over_http`: whether SSE-C keys are accepted over plain HTTP.
pub fn build_service_with_keys(
    layer: Arc<dyn mosaic_layer::ObjectLayer>,
    keys: Arc<crate::access::KeyRing>,
    domain: Option<&str>,
    sse_c_over_http: bool,
) -> Result<Service, String> {
    let s3 = crate::MosaicS3::new(layer.clone(), keys.clone(), sse_c_over_http);
    let mut b = s3s::service::S3ServiceBuilder::new(s3);
    b.set_auth(KeyRingAuth(keys.clone()));
    b.set_access(crate::access::Access { keys, facts: layer.clone() });
    let mut host = None;
    if let Some(d) = domain {
        b.set_host(crate::host::DomainHost::new(d)?);
        host = Some(Arc::new(crate::host::DomainHost::new(d)?));
    }
    let mut cfg = s3s::config::S3Config::default();
    // Bounds the XML bodies s3s buffers (DeleteObjects, CompleteMultipartUpload, tagging).
    cfg.xml_max_body_size = XML_MAX_BODY_BYTES;
    b.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(cfg))));
    Ok(Service { s3: b.build(), layer, host, microstores: None })
}

/// s3s takes its auth provider by value: this shares the key ring.
struct KeyRingAuth(Arc<crate::access::KeyRing>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for KeyRingAuth {
    async fn get_secret_key(&self, access_key: &str) -> s3s::S3Result<s3s::auth::SecretKey> {
        self.0.get_secret_key(access_key).await
    }
}

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(0);

/// 24 upper-case hex digits: the time in microseconds, then a sequence number (hex by hand: `format!`'s
/// padding machinery cost about 1% of a small GET).
fn request_id() -> String {
    let n = REQUEST_SEQ.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    let mut id = String::with_capacity(24);
    push_hex(&mut id, t as u64, 16);
    push_hex(&mut id, u64::from(n as u32), 8);
    debug_assert_eq!(id, format!("{:016X}{:08X}", t as u64, n as u32));
    id
}

/// The low `digits` hex digits of `v`, upper case, zero-padded.
fn push_hex(out: &mut String, v: u64, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for i in (0..digits).rev() {
        out.push(HEX[((v >> (4 * i)) & 0xF) as usize] as char);
    }
}

/// Whether a query string names parameter `k` (bare or with a value).
fn query_has(q: &str, k: &str) -> bool {
    q.split('&').any(|p| p.strip_prefix(k).is_some_and(|rest| rest.is_empty() || rest.starts_with('=')))
}

/// A coarse operation name for logs and metrics, from the method and the query.
fn op_name(req: &http::Request<hyper::body::Incoming>) -> &'static str {
    let q = req.uri().query().unwrap_or("");
    let has = |k: &str| query_has(q, k);
    let path = req.uri().path().trim_start_matches('/');
    let has_key = path.contains('/') && !path.ends_with('/') || path.split('/').nth(1).is_some_and(|k| !k.is_empty());
    let m = req.method().as_str();
    match (m, has_key) {
        ("GET", false) if path.is_empty() => "ListBuckets",
        ("GET", false) if has("uploads") => "ListMultipartUploads",
        ("GET", false) if has("location") => "GetBucketLocation",
        ("GET", false) => "ListObjects",
        ("HEAD", false) => "HeadBucket",
        ("PUT", false) => "CreateBucket",
        ("DELETE", false) => "DeleteBucket",
        ("POST", false) if has("delete") => "DeleteObjects",
        ("GET", true) if has("uploadId") => "ListParts",
        ("GET", true) if has("tagging") => "GetObjectTagging",
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("PUT", true) if has("tagging") => "PutObjectTagging",
        ("PUT", true) if has("partNumber") => "UploadPart",
        ("PUT", true) if req.headers().contains_key("x-amz-copy-source") => "CopyObject",
        ("PUT", true) => "PutObject",
        ("POST", true) if has("uploads") => "CreateMultipartUpload",
        ("POST", true) if has("uploadId") => "CompleteMultipartUpload",
        ("DELETE", true) if has("uploadId") => "AbortMultipartUpload",
        ("DELETE", true) if has("tagging") => "DeleteObjectTagging",
        ("DELETE", true) => "DeleteObject",
        _ => "Other",
    }
}

async fn handle(
    service: Service,
    home: Option<tokio::runtime::Handle>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<s3s::Body>, s3s::HttpError> {
    let id = request_id();
    let op = op_name(&req);
    let method = req.method().clone();
    // For the log line; a clone shares the request's bytes.
    let uri = req.uri().clone();
    let started = Instant::now();
    let empty_expect_continue = expects_continue_without_body(&req);
    let cors_asked = cors_request(&service, &req);
    let post_upload = crate::post::is_post_upload(&req);
    let attributes_asked = method == http::Method::GET && query_has(req.uri().query().unwrap_or(""), "attributes");
    let received_bytes = crate::metered::put_size(req.headers());
    let mut leaves_bulk_connection = false;
    let metered = match admit(&service, &req, op, received_bytes, started).await {
        Ok(m) => m,
        Err(refused) => return Ok(with_request_id(refused, &id).await),
    };
    let mut resp = if method == http::Method::OPTIONS {
        preflight(&service, &req).await
    } else if xml_body_over_limit(&req) {
        // s3s answers a streamed XML body past its limit with 500 InternalError (http_body_util's
        // LengthLimitError is not the error type it checks for); refuse it here, before reading it.
        error_response(400, "MaxMessageLengthExceeded", "Your request was too big.")
    } else if let Some(why) = presign_expiry_out_of_range(&req) {
        // s3s accepts presigned URLs valid for any time; S3 allows 1 second to 7 days.
        error_response(400, "AuthorizationQueryParametersError", why)
    } else {
        let req = match with_known_length(req).await {
            Ok(r) => r,
            Err(refused) => return Ok(with_request_id(refused, &id).await),
        };
        let req = match &metered {
            Some(m) => m.pace_request(req),
            None => req,
        };
        // Run in the microstore's IO share (its drives schedule what this request reads and writes by it)
        // and its CPU class (a bulk microstore's requests on the bulk class's threads).
        let share = metered.as_ref().map_or(mosaic_store::UNSHARED, |m| m.io_share());
        // A connection on the bulk runtime (it has a home) serving another class's request: the request
        // runs at home, but this connection's socket IO would stay at the bulk nice. It is closed after
        // this answer, so the client's next request opens a connection placed by its own class.
        leaves_bulk_connection = home.is_some() && !mosaic_store::is_bulk(share);
        let s3 = service.s3.clone();
        match mosaic_store::run_in_class(share, home.as_ref(), async move { s3.call(req).await }).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(request_id = %id, op, error = ?e, "request failed");
                return Err(e);
            }
            Err(e) => {
                tracing::error!(request_id = %id, op, error = %e, "request failed");
                error_response(500, "InternalError", "We encountered an internal error. Please try again.")
            }
        }
    };
    if post_upload {
        resp = crate::post::corrected(resp);
    }
    if let Some(asked) = cors_asked {
        add_cors_headers(&service, asked, &mut resp).await;
    }
    let status = resp.status();
    if let Ok(v) = http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-amz-request-id", v);
    }
    if status.as_u16() >= 400 {
        resp = with_request_id(resp, &id).await;
    } else if attributes_asked {
        resp = unquoted_etag(resp).await;
    }
    if empty_expect_continue || leaves_bulk_connection {
        // hyper (rightly) sends no 100 Continue for an empty body; botocore then misreads the next
        // 100-continue exchange on the same connection (boto/botocore#3010, seen with `aws s3 sync`
        // uploading an empty file). Closing this connection keeps such clients correct. (Or the request
        // left a bulk connection, above.)
        resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    if let Some(m) = metered {
        resp = m.follow(op, resp);
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let (requests, duration) = request_metrics(op, status.as_u16());
    requests.increment(1);
    duration.record(ms / 1000.0);
    // Bytes by their declared lengths (a body cut short still counts whole): what the console plots as
    // MiB/s in and out.
    let sent_bytes = resp.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    // Handles taken once: no registry lookup per request.
    static BYTES: std::sync::OnceLock<(metrics::Counter, metrics::Counter)> = std::sync::OnceLock::new();
    let (received, sent) = BYTES.get_or_init(|| {
        (metrics::counter!("mosaic_s3_received_bytes_total"), metrics::counter!("mosaic_s3_sent_bytes_total"))
    });
    received.increment(received_bytes);
    sent.increment(sent_bytes.unwrap_or(0));
    // One line per request costs a write to stderr each: at debug, like an access log one turns on. Server
    // errors always show.
    if status.is_server_error() {
        tracing::warn!(request_id = %id, op, method = %method, path = %uri.path(), status = status.as_u16(), ms = format!("{ms:.2}"), "request failed");
    } else {
        tracing::debug!(request_id = %id, op, method = %method, path = %uri.path(), status = status.as_u16(), ms = format!("{ms:.2}"), "request");
    }
    Ok(resp)
}

/// Most (operation, status) pairs whose metric handles are kept; past it (not expected: operations are a
/// fixed list and statuses few) each request looks its handles up in the registry.
const REQUEST_METRICS_MAX: usize = 1024;

type RequestHandles = std::collections::HashMap<(&'static str, u16), (metrics::Counter, metrics::Histogram)>;
static KEPT_REQUEST_METRICS: std::sync::LazyLock<parking_lot::RwLock<RequestHandles>> =
    std::sync::LazyLock::new(Default::default);

/// The request counter and duration histogram of `op` answered with `status`: taken from the registry once
/// per pair and kept, since a lookup by labels (building the key, hashing it, the registry's lock) cost
/// about 1.5% of a small GET's CPU.
fn request_metrics(op: &'static str, status: u16) -> (metrics::Counter, metrics::Histogram) {
    if let Some(h) = KEPT_REQUEST_METRICS.read().get(&(op, status)) {
        return h.clone();
    }
    let label = status.to_string();
    let handles = (
        metrics::counter!("mosaic_s3_requests_total", "op" => op, "status" => label.clone()),
        metrics::histogram!("mosaic_s3_request_duration_seconds", "op" => op, "status" => label),
    );
    let mut kept = KEPT_REQUEST_METRICS.write();
    if kept.len() < REQUEST_METRICS_MAX {
        kept.insert((op, status), handles.clone());
    }
    debug_assert!(kept.len() <= REQUEST_METRICS_MAX);
    handles
}

/// Admits a request into its bucket's microstore; Err: the answer instead (503 SlowDown when its workers
/// and their queue are full, or it waited too long).
async fn admit<B>(
    service: &Service,
    req: &http::Request<B>,
    op: &'static str,
    put_bytes: u64,
    started: Instant,
) -> Result<Option<crate::metered::Metered>, http::Response<s3s::Body>> {
    let Some(ms) = &service.microstores else { return Ok(None) };
    let bucket = bucket_of(service, req);
    match ms.admit(bucket.as_deref()).await {
        Ok(admission) => Ok(Some(crate::metered::Metered::new(ms.clone(), admission, bucket, op, put_bytes, started))),
        Err(refused) => {
            metrics::counter!("mosaic_microstore_refused_total").increment(1);
            tracing::debug!(?refused, bucket, "request refused by its microstore");
            Err(error_response(503, "SlowDown", "Please reduce your request rate."))
        }
    }
}

/// The bucket a request addresses: by virtual host, else the first segment of its path.
fn bucket_of<B>(service: &Service, req: &http::Request<B>) -> Option<String> {
    let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok());
    crate::host::bucket_of_request(service.host.as_deref(), host, req.uri().path())
}

/// A request from a browser across origins (it names an Origin): the bucket, the origin and the method
/// its CORS headers are chosen by.
struct CorsAsked {
    bucket: String,
    origin: String,
    method: String,
}

fn cors_request<B>(service: &Service, req: &http::Request<B>) -> Option<CorsAsked> {
    if req.method() == http::Method::OPTIONS {
        return None;
    }
    let origin = req.headers().get(http::header::ORIGIN)?.to_str().ok()?.to_string();
    let asked_method = req.headers().get("access-control-request-method").and_then(|v| v.to_str().ok());
    let method = asked_method.unwrap_or(req.method().as_str()).to_string();
    Some(CorsAsked { bucket: bucket_of(service, req)?, origin, method })
}

/// The bucket's CORS rules; Err: the answer to give instead (no such bucket).
async fn cors_rules(service: &Service, bucket: &str) -> Result<Vec<mosaic_layer::CorsRule>, http::Response<s3s::Body>> {
    match service.layer.bucket_info(bucket).await {
        Ok(info) => Ok(info.cors.unwrap_or_default()),
        Err(mosaic_layer::LayerError::NoSuchBucket) => {
            Err(error_response(404, "NoSuchBucket", "The specified bucket does not exist"))
        }
        Err(e) => {
            tracing::warn!(bucket, error = %e, "reading CORS rules failed");
            Err(error_response(503, "ServiceUnavailable", "The bucket's CORS rules could not be read; try again."))
        }
    }
}

/// Adds the Access-Control-* headers of the rule matching a cross-origin request, if one does.
async fn add_cors_headers(service: &Service, asked: CorsAsked, resp: &mut http::Response<s3s::Body>) {
    let Ok(rules) = cors_rules(service, &asked.bucket).await else { return };
    if let Some(rule) = crate::cors::find_rule(&rules, &asked.origin, &asked.method, &[]) {
        resp.headers_mut().extend(crate::cors::rule_headers(rule, &asked.origin, None));
    }
}

/// The answer to a CORS preflight (OPTIONS): 200 with the matching rule's headers, 403 when no rule
/// matches, 400 without Origin or Access-Control-Request-Method.
async fn preflight(service: &Service, req: &http::Request<hyper::body::Incoming>) -> http::Response<s3s::Body> {
    let h = req.headers();
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(method)) = (text("origin"), text("access-control-request-method")) else {
        let m = "Insufficient information. Origin request header and Access-Control-Request-Method are needed.";
        return error_response(400, "BadRequest", m);
    };
    let Some(bucket) = bucket_of(service, req) else {
        return error_response(400, "BadRequest", "A CORS preflight names a bucket.");
    };
    let Some(asked) = crate::cors::requested_headers(text("access-control-request-headers")) else {
        return error_response(400, "BadRequest", "Too many headers in Access-Control-Request-Headers.");
    };
    let rules = match cors_rules(service, &bucket).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match crate::cors::find_rule(&rules, origin, method, &asked) {
        Some(rule) => {
            let mut resp = http::Response::new(s3s::Body::empty());
            resp.headers_mut().extend(crate::cors::rule_headers(rule, origin, Some(&asked)));
            resp
        }
        None => error_response(403, "AccessForbidden", "CORSResponse: This CORS request is not allowed."),
    }
}

/// Subresources whose PUT carries an XML document (bucket and object configuration).
const XML_SUBRESOURCES: [&str; 12] = [
    "tagging",
    "acl",
    "cors",
    "lifecycle",
    "policy",
    "versioning",
    "website",
    "notification",
    "logging",
    "replication",
    "encryption",
    "object-lock",
];

/// A request whose body s3s parses as XML, announcing more bytes than the XML limit.
fn xml_body_over_limit(req: &http::Request<hyper::body::Incoming>) -> bool {
    let len = req.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if len.is_none_or(|n| n <= XML_MAX_BODY_BYTES as u64) {
        return false;
    }
    let q = req.uri().query().unwrap_or("");
    let has = |k: &str| query_has(q, k);
    let path = req.uri().path().trim_start_matches('/');
    let is_bucket = !path.trim_end_matches('/').contains('/');
    match req.method().as_str() {
        "POST" => has("delete") || has("uploadId"),
        "PUT" => XML_SUBRESOURCES.iter().any(|r| has(r)) || (is_bucket && q.is_empty()),
        _ => false,
    }
}

/// Largest body of a PUT sent without Content-Length (Transfer-Encoding: chunked) that is read whole to
/// learn its length; larger ones are refused (multipart uploads take any size).
const UNSIZED_BODY_MAX_BYTES: usize = 64 << 20;
/// Most bytes all such bodies hold at once.
const UNSIZED_BODIES_BUDGET_BYTES: usize = 256 << 20;
static UNSIZED_BUDGET: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(UNSIZED_BODIES_BUDGET_BYTES)));

/// The request as s3s takes it. A PUT body sent chunked without Content-Length (curl -T -, streaming
/// uploaders) is read first, within limits, so that s3s, which needs the length, gets it.
async fn with_known_length(
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Request<s3s::Body>, http::Response<s3s::Body>> {
    let h = req.headers();
    let chunked = h.get(http::header::TRANSFER_ENCODING).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let without_length = req.method() == http::Method::PUT
        && chunked
        && !h.contains_key(http::header::CONTENT_LENGTH)
        && !h.contains_key("x-amz-decoded-content-length");
    if !without_length {
        return Ok(req.map(s3s::Body::from));
    }
    let too_big = || {
        let m = "A body without Content-Length may be at most 64 MiB; send Content-Length or use a multipart upload";
        error_response(411, "MissingContentLength", m)
    };
    // Its share of the budget, held as long as the request (and so its body) lives.
    let budget = UNSIZED_BUDGET.clone().acquire_many_owned(UNSIZED_BODY_MAX_BYTES as u32).await;
    let Ok(held) = budget else { return Err(too_big()) };
    let (mut parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, UNSIZED_BODY_MAX_BYTES);
    let bytes = match http_body_util::BodyExt::collect(limited).await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_big()),
        Err(_) => return Err(error_response(400, "IncompleteBody", "The request body ended early")),
    };
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts.headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(bytes.len()));
    parts.extensions.insert(Arc::new(held));
    debug_assert!(bytes.len() <= UNSIZED_BODY_MAX_BYTES);
    Ok(http::Request::from_parts(parts, s3s::Body::from(bytes)))
}

/// Longest validity of a presigned URL (SigV4: 7 days).
const PRESIGN_EXPIRES_MAX_S: u64 = 604_800;

/// Why a presigned URL's X-Amz-Expires is refused, if it is.
fn presign_expiry_out_of_range(req: &http::Request<hyper::body::Incoming>) -> Option<&'static str> {
    let q = req.uri().query()?;
    let v = q.split('&').find_map(|p| p.strip_prefix("X-Amz-Expires="))?;
    match v.parse::<u64>() {
        // 0 is a URL that has expired already: s3s refuses it as such (403).
        Ok(s) if s <= PRESIGN_EXPIRES_MAX_S => None,
        Err(_) => Some("X-Amz-Expires must be a whole number of seconds from 0 to 604800"),
        Ok(_) => Some(
            "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be less than 604800 seconds",
        ),
    }
}

fn error_response(status: u16, code: &str, message: &str) -> http::Response<s3s::Body> {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut r = http::Response::new(s3s::Body::from(xml));
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    r
}

fn expects_continue_without_body(req: &http::Request<hyper::body::Incoming>) -> bool {
    let h = req.headers();
    let expect = h.get(http::header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    expect && h.get(http::header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() == b"0")
}

/// GetObjectAttributes answers its ETag unquoted (unlike every other ETag of S3); s3s writes its ETag type
/// quoted, so the quotes come off here. Bodies larger than `MAX_ATTRIBUTES_BODY_BYTES` pass unchanged.
async fn unquoted_etag(resp: http::Response<s3s::Body>) -> http::Response<s3s::Body> {
    let (mut parts, body) = resp.into_parts();
    if body.size_hint().upper().is_none_or(|u| u as usize > MAX_ATTRIBUTES_BODY_BYTES) {
        return http::Response::from_parts(parts, body);
    }
    let Ok(collected) = body.collect().await else {
        return http::Response::from_parts(parts, s3s::Body::empty());
    };
    let text = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
    let fixed = text.replacen("<ETag>&quot;", "<ETag>", 1).replacen("&quot;</ETag>", "</ETag>", 1);
    let fixed = fixed.replacen("<ETag>\"", "<ETag>", 1).replacen("\"</ETag>", "</ETag>", 1);
    parts.headers.insert(http::header::CONTENT_LENGTH, fixed.len().into());
    http::Response::from_parts(parts, s3s::Body::from(fixed))
}

/// Inserts <RequestId> into an S3 error body that lacks one (s3s's own errors, such as auth failures).
async fn with_request_id(resp: http::Response<s3s::Body>, id: &str) -> http::Response<s3s::Body> {
    let (parts, body) = resp.into_parts();
    let small = body.size_hint().upper().is_some_and(|u| u as usize <= MAX_ERROR_BODY_BYTES);
    if !small {
        return http::Response::from_parts(parts, body);
    }
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let text = String::from_utf8_lossy(&bytes);
    let fixed = if text.contains("</Error>") && !text.contains("<RequestId>") {
        Bytes::from(text.replace("</Error>", &format!("<RequestId>{id}</RequestId></Error>")))
    } else {
        bytes
    };
    let mut parts = parts;
    parts.headers.insert(http::header::CONTENT_LENGTH, fixed.len().into());
    http::Response::from_parts(parts, s3s::Body::from(fixed))
}

/// Serves until `shutdown` resolves, then stops accepting and waits up to `drain` for in-flight requests.
/// With `tls`, every connection is HTTPS (the handshake is bounded by the header read timeout).
pub async fn serve(
    listener: TcpListener,
    service: Service,
    limits: HttpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Tells connections not yet handed to hyper (placed by their first request head) that the server
    // stops: a client that connected and sent nothing must not hold the drain until its header timeout.
    let (stopping, stopping_seen) = tokio::sync::watch::channel(false);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Without TCP_NODELAY small responses wait on Nagle plus the client's delayed ACK (~40 ms).
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let (service, limits, tls, stopping) = (service.clone(), limits.clone(), tls.clone(), stopping_seen.clone());
        // Foreground work: what a client waits for, which background work yields to (paper 003).
        tokio::spawn(mosaic_store::in_foreground(async move {
            let Some(tls) = tls else {
                serve_plain(stream, peer, service, &limits, watcher, stopping).await;
                drop(permit);
                return;
            };
            match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => {
                    serve_connection(stream, peer, Some(SecureTransport), service, &limits, watcher, None).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
            drop(permit);
        }));
    }
    drop(listener);
    let _ = stopping.send(true);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(drain) => tracing::warn!("in-flight requests did not finish within the drain timeout"),
    }
    Ok(())
}

/// Serves a plain HTTP connection where its first request's CPU class runs (`crate::affinity`); the
/// caller's task lasts as long as the connection, wherever it is served.
async fn serve_plain(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    service: Service,
    limits: &HttpLimits,
    watcher: hyper_util::server::graceful::Watcher,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let placed = crate::affinity::place(
        service.host.as_deref(),
        service.microstores.as_deref(),
        &stream,
        limits.header_read_timeout,
        stopping,
    );
    let runtime = match placed.await {
        crate::affinity::Placement::Here => {
            return serve_connection(stream, peer, None, service, limits, watcher, None).await;
        }
        crate::affinity::Placement::Closed => return tracing::debug!(%peer, "closed before a request head"),
        crate::affinity::Placement::Bulk(runtime) => runtime,
    };
    // A socket is registered with one runtime's reactor: it leaves this one as a std socket and joins the
    // bulk runtime's there.
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => return tracing::debug!(%peer, error = %e, "a connection could not leave its runtime"),
    };
    let (home, limits) = (tokio::runtime::Handle::current(), limits.clone());
    let served = runtime.spawn(mosaic_store::in_foreground(async move {
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => serve_connection(stream, peer, None, service, &limits, watcher, Some(home)).await,
            Err(e) => tracing::debug!(%peer, error = %e, "a connection could not join the bulk runtime"),
        }
    }));
    if let Err(e) = served.await {
        tracing::error!(%peer, error = %e, "a connection on the bulk runtime failed");
    }
}

/// Serves one connection on the running runtime. `home`: the runtime it was accepted on, when that is
/// another (a connection served on the bulk class's runtime hands its other classes' requests home).
async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    secure: Option<SecureTransport>,
    service: Service,
    limits: &HttpLimits,
    watcher: hyper_util::server::graceful::Watcher,
    home: Option<tokio::runtime::Handle>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(crate::access::PeerIp(peer.ip()));
        if let Some(s) = secure {
            req.extensions_mut().insert(s);
        }
        handle(service.clone(), home.clone(), req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.max_headers)
        // A client that shuts down its write side after sending a request (nc, some scripts) still
        // gets its answer; the header timeout still bounds connections that never finish a request.
        .half_close(true)
        .serve_connection(TokioIo::new(io), svc);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handles are kept for at most `REQUEST_METRICS_MAX` pairs; past it requests still get theirs.
    #[test]
    fn request_metric_handles_are_kept_up_to_their_bound() {
        for status in 0..(REQUEST_METRICS_MAX as u16 + 100) {
            let (requests, duration) = request_metrics("GetObject", status);
            requests.increment(1);
            duration.record(0.001);
        }
        assert_eq!(KEPT_REQUEST_METRICS.read().len(), REQUEST_METRICS_MAX);
        assert!(KEPT_REQUEST_METRICS.read().contains_key(&("GetObject", 7)));
    }

    #[test]
    fn request_ids_are_24_hex_digits_of_time_then_sequence() {
        let (a, b) = (request_id(), request_id());
        assert_eq!(a.len(), 24);
        assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c)), "{a}");
        let seq = |id: &str| u32::from_str_radix(&id[16..], 16).unwrap();
        // Other tests' requests may take numbers in between.
        let step = seq(&b).wrapping_sub(seq(&a));
        assert!((1..1 << 20).contains(&step), "{a} then {b}");
        let mut s = String::new();
        push_hex(&mut s, 0xAB, 4);
        push_hex(&mut s, u64::MAX, 16);
        assert_eq!(s, format!("{:04X}{:016X}", 0xAB, u64::MAX));
    }

    #[test]
    fn query_parameters_are_matched_whole() {
        assert!(query_has("uploads", "uploads"));
        assert!(query_has("a=1&uploadId=x", "uploadId"));
        assert!(query_has("tagging=", "tagging"));
        assert!(!query_has("uploadIdx=1", "uploadId"));
        assert!(!query_has("x=uploads", "uploads"));
        assert!(!query_has("", "delete"));
    }
}
