//! The console's S3 calls: made to the server's own S3 port, signed (SigV4) with the signed-in key, so
//! that what a console user sees and may do is decided exactly where it is for any S3 client, by the
//! same code. Links to share and download are presigned URLs of that port.

use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::time::{Duration, SystemTime};

/// What S3 leaves unescaped in a path: unreserved characters (and `/` between key segments).
const KEY_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
const QUERY_VALUE: &AsciiSet = KEY_SEGMENT;

/// The longest a shared link stays valid (S3's limit for presigned URLs).
pub const MAX_LINK_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long an S3 call of the console may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A key and its secret, to sign with.
pub struct Signer {
    pub access_key: String,
    pub secret_key: String,
}

/// An S3 answer.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The S3 error's code and message, for an answer that is one.
    pub fn error(&self) -> Option<(String, String)> {
        if self.status < 300 {
            return None;
        }
        let code = first_text(&self.body, "Code").unwrap_or_else(|| format!("HTTP {}", self.status));
        let message = first_text(&self.body, "Message").unwrap_or_default();
        Some((code, message))
    }
}

/// The S3 port as the console reaches it.
pub struct S3Port {
    /// `http://127.0.0.1:9000` (or https).
    pub endpoint: String,
    /// The port the S3 listener serves on (links are made for the host the browser used, on this port).
    pub port: u16,
    pub https: bool,
    client: reqwest::Client,
}

/// `/bucket/key` with the key's segments escaped as S3 expects.
pub fn object_path(bucket: &str, key: &str) -> String {
    let segments: Vec<String> = key.split('/').map(|s| utf8_percent_encode(s, KEY_SEGMENT).to_string()).collect();
    format!("/{bucket}/{}", segments.join("/"))
}

/// `s` with everything but unreserved characters percent-escaped.
pub fn escaped(s: &str) -> String {
    utf8_percent_encode(s, KEY_SEGMENT).to_string()
}

/// `a=b&c=d` with the values escaped.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let each: Vec<String> = pairs
        .iter()
        .map(|(k, v)| if v.is_empty() { k.to_string() } else { format!("{k}={}", utf8_percent_encode(v, QUERY_VALUE)) })
        .collect();
    each.join("&")
}

fn settings(presign: Option<Duration>) -> SigningSettings {
    let mut s = SigningSettings::default();
    // S3 signs paths as sent: escaped once, never normalized.
    s.percent_encoding_mode = PercentEncodingMode::Single;
    s.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    if let Some(expires) = presign {
        s.signature_location = SignatureLocation::QueryParams;
        s.expires_in = Some(expires);
    }
    s
}

fn signed(
    who: &Signer,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    presign: Option<Duration>,
) -> Result<http::Request<()>, String> {
    let identity =
        aws_credential_types::Credentials::new(&who.access_key, &who.secret_key, None, None, "console").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(SystemTime::now())
        .settings(settings(presign))
        .build()
        .map_err(|e| format!("cannot sign: {e}"))?
        .into();
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let mut req = req.body(()).map_err(|e| format!("bad request: {e}"))?;
    let host = req.uri().authority().ok_or("a URL without a host")?.to_string();
    req.headers_mut().insert("host", host.parse().map_err(|_| "bad host")?);
    let pairs: Vec<(String, String)> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    // Bodies are not hashed: the S3 port checks what it stores against its own checksums.
    let signable = SignableRequest::new(
        method,
        url,
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::UnsignedPayload,
    )
    .map_err(|e| format!("cannot sign: {e}"))?;
    let (instructions, _) = sign(signable, &params).map_err(|e| format!("cannot sign: {e}"))?.into_parts();
    instructions.apply_to_request_http1x(&mut req);
    Ok(req)
}

impl S3Port {
    pub fn new(endpoint: String, port: u16, https: bool, root_certificate: Option<&[u8]>) -> Result<S3Port, String> {
        let mut b = reqwest::Client::builder().timeout(CALL_TIMEOUT);
        if let Some(pem) = root_certificate {
            let cert = reqwest::Certificate::from_pem(pem).map_err(|e| format!("the S3 port's certificate: {e}"))?;
            b = b.add_root_certificate(cert);
        }
        let client = b.build().map_err(|e| format!("cannot make the console's S3 client: {e}"))?;
        Ok(S3Port { endpoint, port, https, client })
    }

    /// Sends one signed S3 request (`path_and_query` starts with `/`).
    pub async fn call(
        &self,
        who: &Signer,
        method: &str,
        path_and_query: &str,
        headers: &[(String, String)],
        body: Bytes,
    ) -> Result<Answer, String> {
        debug_assert!(path_and_query.starts_with('/'));
        let url = format!("{}{path_and_query}", self.endpoint);
        let mut all = headers.to_vec();
        all.push(("x-amz-content-sha256".into(), "UNSIGNED-PAYLOAD".into()));
        let req = signed(who, method, &url, &all, None)?;
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| "bad method")?;
        let mut r = self.client.request(method, &url);
        for (k, v) in req.headers() {
            if k != "host" {
                r = r.header(k, v);
            }
        }
        let resp = r.body(body).send().await.map_err(|e| format!("the S3 port did not answer: {e}"))?;
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        let body = resp.bytes().await.map_err(|e| format!("the S3 port's answer broke off: {e}"))?;
        Ok(Answer { status, headers, body })
    }

    /// A presigned URL on `host` (the host the browser reached the console by) for `path_and_query`.
    pub fn presign(
        &self,
        who: &Signer,
        host: &str,
        method: &str,
        path_and_query: &str,
        expires: Duration,
    ) -> Result<String, String> {
        if expires.is_zero() || expires > MAX_LINK_EXPIRY {
            return Err(format!("a link lasts from 1 second to {} seconds", MAX_LINK_EXPIRY.as_secs()));
        }
        let scheme = if self.https { "https" } else { "http" };
        let url = format!("{scheme}://{host}:{}{path_and_query}", self.port);
        let req = signed(who, method, &url, &[], Some(expires))?;
        Ok(req.uri().to_string())
    }
}

/// The text of every element named `tag` directly inside an element named `parent` (or, with `parent`
/// None, anywhere), in order.
pub fn texts(xml: &[u8], parent: Option<&str>, tag: &str) -> Vec<String> {
    records(xml, parent.unwrap_or(""), &[tag]).into_iter().filter_map(|mut r| r.remove(tag)).collect()
}

/// The first text of an element named `tag`, anywhere.
pub fn first_text(xml: &[u8], tag: &str) -> Option<String> {
    records(xml, "", &[tag]).into_iter().find_map(|mut r| r.remove(tag))
}

/// For every element named `record` (or, with "", the document), the texts of its children named in
/// `fields`.
pub fn records(xml: &[u8], record: &str, fields: &[&str]) -> Vec<std::collections::HashMap<String, String>> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut out = Vec::new();
    let mut current: Option<std::collections::HashMap<String, String>> = record.is_empty().then(Default::default);
    let mut path: Vec<String> = Vec::new();
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                if name == record {
                    current = Some(Default::default());
                }
                path.push(name);
            }
            Ok(Event::End(_)) => {
                if path.pop().as_deref() == Some(record)
                    && !record.is_empty()
                    && let Some(r) = current.take()
                {
                    out.push(r);
                }
            }
            Ok(Event::Text(t)) => {
                let (Some(r), Some(name)) = (current.as_mut(), path.last()) else { continue };
                if fields.contains(&name.as_str()) {
                    let text = t.decode().map(|s| s.into_owned()).unwrap_or_default();
                    let text = quick_xml::escape::unescape(&text).map(|s| s.into_owned()).unwrap_or(text);
                    r.entry(name.clone()).or_default().push_str(&text);
                }
            }
            Ok(Event::GeneralRef(g)) => {
                // An entity inside a text (`&amp;`): quick-xml reports it apart from the text around it.
                let (Some(r), Some(name)) = (current.as_mut(), path.last()) else { continue };
                if fields.contains(&name.as_str()) {
                    let raw = format!("&{};", String::from_utf8_lossy(&g));
                    let text = quick_xml::escape::unescape(&raw).map(|s| s.into_owned()).unwrap_or(raw);
                    r.entry(name.clone()).or_default().push_str(&text);
                }
            }
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
        buf.clear();
    }
    if record.is_empty()
        && let Some(r) = current
    {
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_as_s3_signs_them() {
        assert_eq!(object_path("b", "a b/c+d/é"), "/b/a%20b/c%2Bd/%C3%A9");
        assert_eq!(
            query(&[("list-type", "2"), ("prefix", "a/b c"), ("delimiter", "/")]),
            "list-type=2&prefix=a%2Fb%20c&delimiter=%2F"
        );
        assert_eq!(query(&[("uploads", "")]), "uploads");
    }

    #[test]
    fn listings_are_read() {
        let xml = br#"<?xml version="1.0"?><ListBucketResult><Name>b</Name><IsTruncated>true</IsTruncated>
            <Contents><Key>a &amp; b</Key><Size>3</Size></Contents><Contents><Key>c</Key><Size>0</Size></Contents>
            <CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes><NextContinuationToken>t1</NextContinuationToken>
            </ListBucketResult>"#;
        let objects = records(xml, "Contents", &["Key", "Size"]);
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0]["Key"], "a & b");
        assert_eq!(objects[1]["Size"], "0");
        assert_eq!(texts(xml, Some("CommonPrefixes"), "Prefix"), vec!["d/"]);
        assert_eq!(first_text(xml, "NextContinuationToken").as_deref(), Some("t1"));
        assert_eq!(first_text(b"<not xml", "Key"), None);
    }
}
