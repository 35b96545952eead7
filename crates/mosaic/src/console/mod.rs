//! The web console (issue 19), served on the admin port: its page and scripts are embedded in the binary
//! (no build step, no Node.js), and its API answers the page.
//!
//! - `session`: sign-in, the session cookie and the CSRF token.
//! - `s3`: every bucket and object operation is an S3 request to the server's own S3 port, signed with
//!   the signed-in key, so grants apply exactly as they do to any S3 client.
//! - `api`: the page's JSON calls.
//!
//! What a root session asks of `/console/api/admin/...` is the admin API's `/admin/v1/...` answer: drives,
//! keys, microstores and the cluster are shown from the same code that serves `mosaic admin`.

pub mod api;
pub mod s3;
pub mod session;

use crate::admin_server::{AdminState, Resp};
use bytes::Bytes;
use http_body_util::Full;

/// What the console needs besides the admin state.
pub struct Console {
    pub sessions: session::Sessions,
    pub failures: session::Failures,
    pub s3: s3::S3Port,
    /// Whether the admin port serves TLS (the cookie is then `Secure`).
    pub secure: bool,
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Whether the admin port's path belongs to the console.
pub fn serves(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with("/console/")
}

/// The console's answer to a request on its paths.
pub async fn route(state: &std::sync::Arc<AdminState>, req: http::Request<hyper::body::Incoming>) -> Resp {
    let Some(console) = &state.console else {
        return api::error(404, "the console is turned off on this server");
    };
    let (method, path) = (req.method().as_str().to_string(), req.uri().path().to_string());
    match (method.as_str(), path.as_str()) {
        ("GET", "/" | "/console" | "/console/") => asset("text/html; charset=utf-8", INDEX_HTML),
        ("GET", "/console/app.js") => asset("text/javascript; charset=utf-8", APP_JS),
        ("GET", "/console/app.css") => asset("text/css; charset=utf-8", APP_CSS),
        _ if path.starts_with("/console/api/") => api::route(state, console, req).await,
        _ => api::error(404, format!("no console page {path}")),
    }
}

/// An embedded file, with headers that keep the page to its own origin.
fn asset(content_type: &'static str, body: &'static str) -> Resp {
    http::Response::builder()
        .status(200)
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("x-frame-options", "DENY")
        .header(
            "content-security-policy",
            "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'",
        )
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("valid response")
}
