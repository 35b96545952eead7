//! Browser POST uploads (s3s parses the form, checks the signature and the POST policy, and stores the
//! file through `put_object`): where S3's answers differ from s3s's, they are corrected here.
//!
//! - success_action_redirect's `etag` parameter is the quoted ETag in S3; s3s leaves the quotes off.

/// Whether a request is a POST upload: a multipart form POSTed to a bucket.
pub(crate) fn is_post_upload<B>(req: &http::Request<B>) -> bool {
    let form = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("multipart/form-data"));
    let path = req.uri().path().trim_matches('/');
    req.method() == http::Method::POST && form && !path.is_empty() && !path.contains('/')
}

/// S3's answer to a POST upload in place of s3s's.
pub(crate) fn corrected(resp: http::Response<s3s::Body>) -> http::Response<s3s::Body> {
    if resp.status() == http::StatusCode::SEE_OTHER { quoted_redirect_etag(resp) } else { resp }
}

fn quoted_redirect_etag(mut resp: http::Response<s3s::Body>) -> http::Response<s3s::Body> {
    let Some(location) = resp.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()) else {
        return resp;
    };
    let fixed = quote_etag_param(location);
    if let Ok(v) = http::HeaderValue::from_str(&fixed) {
        resp.headers_mut().insert(http::header::LOCATION, v);
    }
    resp
}

/// `etag=VALUE` in a URL's query with VALUE quoted (`%22VALUE%22`) unless it already is.
fn quote_etag_param(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else { return url.to_string() };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.strip_prefix("etag=") {
            Some(v) if !v.starts_with("%22") => format!("etag=%22{v}%22"),
            _ => p.to_string(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_etags_are_quoted_once() {
        let u = "http://h/b?bucket=b&key=k&etag=abc";
        assert_eq!(quote_etag_param(u), "http://h/b?bucket=b&key=k&etag=%22abc%22");
        assert_eq!(quote_etag_param(&quote_etag_param(u)), quote_etag_param(u));
        assert_eq!(quote_etag_param("http://h/b"), "http://h/b");
    }

    #[test]
    fn post_uploads_are_forms_to_a_bucket() {
        let req = |method: &str, path: &str, ct: &str| {
            http::Request::builder().method(method).uri(path).header("content-type", ct).body(()).unwrap()
        };
        assert!(is_post_upload(&req("POST", "/bkt", "multipart/form-data; boundary=x")));
        assert!(is_post_upload(&req("POST", "/bkt/", "Multipart/Form-Data; boundary=x")));
        assert!(!is_post_upload(&req("POST", "/bkt/key", "multipart/form-data; boundary=x")));
        assert!(!is_post_upload(&req("POST", "/bkt?delete", "application/xml")));
        assert!(!is_post_upload(&req("PUT", "/bkt", "multipart/form-data")));
        assert!(!is_post_upload(&req("POST", "/", "multipart/form-data")));
    }
}
