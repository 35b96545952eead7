//! A lean lister for the `list` workload (`--list-client lean`): ListObjectsV2 and ListObjectVersions
//! pages as plain signed GETs (aws-sigv4) whose XML is scanned for what the walk needs (entries counted,
//! common prefixes, the next page's markers) instead of deserialized into SDK types.
//!
//! Why: on this machine the SDK takes longer to deserialize a page of 1,000 versions than a fast server
//! takes to answer it, so with the SDK the client, not the servers, bounds the ratio between two servers.
//! The same lean client is used for every server.

use super::client::{ListPage, OpError};
use super::recorder::ErrorClass;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use quick_xml::events::Event;
use std::time::{Duration, SystemTime};

/// A page's XML is at most this large (1,000 entries with keys of 1 KiB, their owners and markers).
const PAGE_MAX_BYTES: usize = 8 << 20;

/// Elements nested deeper than this in a listing are refused (a listing nests three deep).
const DEPTH_MAX: usize = 16;

#[derive(Clone)]
pub struct LeanLister {
    http: reqwest::Client,
    endpoint: String,
    identity: Identity,
    region: String,
}

/// What one listing request asks for.
pub struct ListRequest<'a> {
    pub bucket: &'a str,
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    pub max_keys: i32,
    /// ListObjectVersions (with key and version-id markers) rather than ListObjectsV2.
    pub versions: bool,
    /// The previous page's token: a continuation token, or the key and version-id markers joined by a NUL.
    pub token: Option<String>,
}

impl LeanLister {
    pub fn new(
        endpoint: &str,
        access_key: &str,
        secret_key: &str,
        region: &str,
        ca_pem: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut http = reqwest::Client::builder().timeout(timeout);
        if let Some(pem) = ca_pem {
            let cert = reqwest::Certificate::from_pem(pem).map_err(|e| format!("CA certificate: {e}"))?;
            http = http.tls_built_in_root_certs(false).add_root_certificate(cert);
        }
        let http = http.build().map_err(|e| format!("HTTP client: {e}"))?;
        let identity = Credentials::new(access_key, secret_key, None, None, "mosaic-bench").into();
        let endpoint = endpoint.trim_end_matches('/').to_string();
        Ok(LeanLister { http, endpoint, identity, region: region.to_string() })
    }

    pub async fn page(&self, r: ListRequest<'_>) -> Result<ListPage, OpError> {
        let url = self.url(&r)?;
        let headers = self.sign(url.as_str())?;
        let mut req = self.http.get(url);
        for (name, value) in &headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        if resp.content_length().is_some_and(|n| n > PAGE_MAX_BYTES as u64) {
            return Err((ErrorClass::Transport, format!("a listing page of more than {PAGE_MAX_BYTES} bytes")));
        }
        let body = resp.bytes().await.map_err(transport)?;
        if body.len() > PAGE_MAX_BYTES {
            return Err((ErrorClass::Transport, format!("a listing page of more than {PAGE_MAX_BYTES} bytes")));
        }
        if !(200..300).contains(&status) {
            let code = error_code(&body).unwrap_or_default();
            return Err((ErrorClass::Http(status, code.clone()), format!("HTTP {status} {code}")));
        }
        parse_page(&body, r.versions).map_err(|e| (ErrorClass::Transport, format!("listing XML: {e}")))
    }

    fn url(&self, r: &ListRequest<'_>) -> Result<reqwest::Url, OpError> {
        let mut url = reqwest::Url::parse(&format!("{}/{}", self.endpoint, r.bucket))
            .map_err(|e| (ErrorClass::Transport, format!("endpoint: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            if r.versions {
                q.append_pair("versions", "");
            } else {
                q.append_pair("list-type", "2");
            }
            q.append_pair("max-keys", &r.max_keys.to_string());
            q.append_pair("prefix", r.prefix);
            if let Some(d) = r.delimiter {
                q.append_pair("delimiter", d);
            }
            match (&r.token, r.versions) {
                (Some(t), true) => {
                    let (key, version) = t.split_once('\0').unwrap_or((t, ""));
                    q.append_pair("key-marker", key);
                    if !version.is_empty() {
                        q.append_pair("version-id-marker", version);
                    }
                }
                (Some(t), false) => {
                    q.append_pair("continuation-token", t);
                }
                (None, _) => {}
            }
        }
        Ok(url)
    }

    /// The SigV4 headers of a GET of `url` with an empty body, as S3 signs (single encoding, no path
    /// normalization, x-amz-content-sha256).
    fn sign(&self, url: &str) -> Result<Vec<(String, String)>, OpError> {
        let failed = |e: String| (ErrorClass::Transport, format!("signing: {e}"));
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| failed(e.to_string()))?
            .into();
        let signable = SignableRequest::new("GET", url, std::iter::empty(), SignableBody::Bytes(&[]))
            .map_err(|e| failed(e.to_string()))?;
        let (instructions, _) = sign(signable, &params).map_err(|e| failed(e.to_string()))?.into_parts();
        Ok(instructions.headers().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }
}

fn transport(e: reqwest::Error) -> OpError {
    if e.is_timeout() { (ErrorClass::Timeout, e.to_string()) } else { (ErrorClass::Transport, e.to_string()) }
}

/// A text the walk needs.
#[derive(Clone, Copy, PartialEq)]
enum Field {
    IsTruncated,
    NextKeyMarker,
    NextVersionIdMarker,
    NextContinuationToken,
    CommonPrefix,
}

/// The field an element at `depth` (the root is 1) holds, given its parent's name.
fn field_of(depth: usize, parent: &[u8], name: &[u8]) -> Option<Field> {
    match (depth, parent, name) {
        (2, _, b"IsTruncated") => Some(Field::IsTruncated),
        (2, _, b"NextKeyMarker") => Some(Field::NextKeyMarker),
        (2, _, b"NextVersionIdMarker") => Some(Field::NextVersionIdMarker),
        (2, _, b"NextContinuationToken") => Some(Field::NextContinuationToken),
        (3, b"CommonPrefixes", b"Prefix") => Some(Field::CommonPrefix),
        _ => None,
    }
}

fn is_entry(depth: usize, name: &[u8]) -> bool {
    depth == 2 && matches!(name, b"Contents" | b"Version" | b"DeleteMarker")
}

/// The entries, common prefixes and next page of a ListObjectsV2 or ListObjectVersions answer.
pub fn parse_page(xml: &[u8], versions: bool) -> Result<ListPage, String> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    // The names of the open elements, and the field being read with its text so far.
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut field: Option<Field> = None;
    let mut text = String::new();
    let mut keys = 0u64;
    let mut prefixes = Vec::new();
    let (mut truncated, mut next_key, mut next_version, mut next_token) = (false, None, None, None);
    loop {
        match reader.read_event().map_err(|e| e.to_string())? {
            Event::Start(e) => {
                if path.len() == DEPTH_MAX {
                    return Err(format!("elements nested more than {DEPTH_MAX} deep"));
                }
                let name = e.local_name();
                let depth = path.len() + 1;
                keys += u64::from(is_entry(depth, name.as_ref()));
                field = field_of(depth, path.last().map_or(&[][..], Vec::as_slice), name.as_ref());
                text.clear();
                path.push(name.as_ref().to_vec());
            }
            Event::Empty(e) => keys += u64::from(is_entry(path.len() + 1, e.local_name().as_ref())),
            Event::Text(t) if field.is_some() => text.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(g) if field.is_some() => {
                // An entity inside a text (`&amp;`): quick-xml reports it apart from the text around it.
                let raw = format!("&{};", String::from_utf8_lossy(&g));
                text.push_str(&quick_xml::escape::unescape(&raw).map_err(|e| e.to_string())?);
            }
            Event::End(_) => {
                path.pop();
                let value = std::mem::take(&mut text);
                match field.take() {
                    Some(Field::IsTruncated) => truncated = value == "true",
                    Some(Field::NextKeyMarker) => next_key = Some(value),
                    Some(Field::NextVersionIdMarker) => next_version = Some(value),
                    Some(Field::NextContinuationToken) => next_token = Some(value),
                    Some(Field::CommonPrefix) => prefixes.push(value),
                    None => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err("the document ends inside an element".into());
    }
    let next = match (truncated, versions) {
        (false, _) => None,
        (true, true) => {
            let key = next_key.ok_or("a truncated page without NextKeyMarker")?;
            Some(format!("{key}\0{}", next_version.unwrap_or_default()))
        }
        (true, false) => Some(next_token.ok_or("a truncated page without NextContinuationToken")?),
    };
    Ok(ListPage { keys, prefixes, next })
}

/// The `Code` of an S3 error answer.
fn error_code(xml: &[u8]) -> Option<String> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut in_code = false;
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => in_code = e.local_name().as_ref() == b"Code",
            Event::Text(t) if in_code => return t.decode().ok().map(|s| s.into_owned()),
            Event::End(_) => in_code = false,
            Event::Eof => return None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_page;

    #[test]
    fn a_versions_page_counts_versions_and_markers_and_names_the_next_page() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?><ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>true</IsTruncated><KeyMarker></KeyMarker><NextKeyMarker>a&amp;b</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker><Prefix></Prefix><Version><Key>a</Key><Owner><ID>x</ID></Owner></Version><Version><Key>a&amp;b</Key></Version><DeleteMarker><Key>c</Key></DeleteMarker><CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes></ListVersionsResult>"#;
        let page = parse_page(xml, true).unwrap();
        assert_eq!(page.keys, 3);
        assert_eq!(page.prefixes, ["d/"]);
        assert_eq!(page.next.as_deref(), Some("a&b\0v1"));
    }

    #[test]
    fn a_last_v2_page_has_no_next_and_a_truncated_one_needs_its_token() {
        let last = br#"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key></Contents><Contents><Key>l</Key></Contents></ListBucketResult>"#;
        let page = parse_page(last, false).unwrap();
        assert_eq!((page.keys, page.next), (2, None));
        let cut =
            br#"<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>k</Key></Contents></ListBucketResult>"#;
        assert!(parse_page(cut, false).is_err());
        let more = br#"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t</NextContinuationToken></ListBucketResult>"#;
        assert_eq!(parse_page(more, false).unwrap().next.as_deref(), Some("t"));
    }

    #[test]
    fn broken_or_too_deep_xml_is_an_error() {
        assert!(parse_page(b"<a><b></a>", true).is_err());
        let deep = "<a>".repeat(40) + &"</a>".repeat(40);
        assert!(parse_page(deep.as_bytes(), true).is_err());
    }
}
