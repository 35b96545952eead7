//! The lean client: GETs and listing pages as plain signed HTTP requests (aws-sigv4 over reqwest), for the
//! workloads where the SDK's own cost per request would bound the ratio between two servers.
//!
//! Why: on this machine of two cores the client shares the CPU with the server it measures. The SDK spends
//! more CPU on a 4 KiB GET (its orchestrator, endpoint rules, interceptors) than a fast server spends
//! answering it, and longer deserializing a page of 1,000 versions than a fast server takes to write it: a
//! ratio measured through it tends toward 1 as servers get faster. The lean client signs the same SigV4
//! headers, verifies every body byte as the SDK path does, and is used for every server of a comparison
//! (`--get-client lean`, `--list-client lean`).

use super::body::{Pool, Verifier, VerifyMode};
use super::client::{ListPage, OpError, finish_get};
use super::lean_list::{error_code, parse_page};
use super::recorder::ErrorClass;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

/// A page's XML is at most this large (1,000 entries with keys of 1 KiB, their owners and markers).
const PAGE_MAX_BYTES: usize = 8 << 20;

/// An error answer's body is read up to this many bytes (an S3 error document is a few hundred).
const ERROR_BODY_MAX_BYTES: usize = 64 << 10;

#[derive(Clone)]
pub struct LeanClient {
    http: reqwest::Client,
    /// GETs take the endpoints in turn; listings go to the first.
    endpoints: Arc<[String]>,
    next: Arc<AtomicUsize>,
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

impl LeanClient {
    pub fn new(
        endpoints: &[&str],
        access_key: &str,
        secret_key: &str,
        region: &str,
        ca_pem: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self, String> {
        if endpoints.is_empty() {
            return Err("the lean client needs an endpoint".into());
        }
        let mut http = reqwest::Client::builder().timeout(timeout);
        if let Some(pem) = ca_pem {
            let cert = reqwest::Certificate::from_pem(pem).map_err(|e| format!("CA certificate: {e}"))?;
            http = http.tls_built_in_root_certs(false).add_root_certificate(cert);
        }
        let http = http.build().map_err(|e| format!("HTTP client: {e}"))?;
        let identity = Credentials::new(access_key, secret_key, None, None, "mosaic-bench").into();
        let endpoints = endpoints.iter().map(|e| e.trim_end_matches('/').to_string()).collect();
        Ok(LeanClient { http, endpoints, next: Default::default(), identity, region: region.to_string() })
    }

    /// GET of `key`, every byte verified while it streams; returns the bytes read. Keys are the bench's
    /// own (letters, digits, `-._~/`), which need no percent-encoding; any other key is refused.
    pub async fn get(
        &self,
        pool: &Pool,
        bucket: &str,
        key: &str,
        mode: VerifyMode,
        expected_len: u64,
    ) -> Result<u64, OpError> {
        if !is_plain(bucket) || !is_plain(key) {
            return Err((ErrorClass::Transport, format!("the lean client takes plain names only, not {bucket}/{key}")));
        }
        let endpoint = &self.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len()];
        let url = format!("{endpoint}/{bucket}/{key}");
        let mut resp = self.send_get(&url).await?;
        let mut verifier = Verifier::new(pool, key, mode);
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            verifier.update(&chunk);
        }
        finish_get(verifier, key, expected_len)
    }

    pub async fn page(&self, r: ListRequest<'_>) -> Result<ListPage, OpError> {
        let url = self.list_url(&r)?;
        let resp = self.send_get(url.as_str()).await?;
        if resp.content_length().is_some_and(|n| n > PAGE_MAX_BYTES as u64) {
            return Err((ErrorClass::Transport, format!("a listing page of more than {PAGE_MAX_BYTES} bytes")));
        }
        let body = resp.bytes().await.map_err(transport)?;
        if body.len() > PAGE_MAX_BYTES {
            return Err((ErrorClass::Transport, format!("a listing page of more than {PAGE_MAX_BYTES} bytes")));
        }
        parse_page(&body, r.versions).map_err(|e| (ErrorClass::Transport, format!("listing XML: {e}")))
    }

    /// A signed GET of `url`; an answer other than 2xx is an error with its status and S3 code.
    async fn send_get(&self, url: &str) -> Result<reqwest::Response, OpError> {
        let headers = self.sign(url)?;
        let mut req = self.http.get(url);
        for (name, value) in &headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            body.extend_from_slice(&chunk[..chunk.len().min(ERROR_BODY_MAX_BYTES - body.len())]);
            if body.len() == ERROR_BODY_MAX_BYTES {
                break;
            }
        }
        let code = error_code(&body).unwrap_or_default();
        Err((ErrorClass::Http(status, code.clone()), format!("HTTP {status} {code}")))
    }

    fn list_url(&self, r: &ListRequest<'_>) -> Result<reqwest::Url, OpError> {
        let mut url = reqwest::Url::parse(&format!("{}/{}", self.endpoints[0], r.bucket))
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

/// A name that stands in a URL path as it is: not empty, only unreserved characters and `/`.
fn is_plain(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
}

fn transport(e: reqwest::Error) -> OpError {
    if e.is_timeout() { (ErrorClass::Timeout, e.to_string()) } else { (ErrorClass::Transport, e.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::body::{BodySpec, PoolBody, key_hash};
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Answers one request with `status`, `body` and closes; returns the client and the request's head.
    async fn answer_once(status: &str, body: Vec<u8>) -> (LeanClient, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let status = status.to_string();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended before its head");
                head.extend_from_slice(&buf[..n]);
            }
            let reply = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            conn.write_all(reply.as_bytes()).await.unwrap();
            conn.write_all(&body).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        let client = LeanClient::new(&[&endpoint], "AKID", "secret", "us-east-1", None, Duration::from_secs(10));
        (client.unwrap(), server)
    }

    async fn object(pool: &Pool, key: &str, len: u64) -> Vec<u8> {
        let body = PoolBody::object(pool, BodySpec { key_hash: key_hash(key), len, pool_offset: 12_345 });
        body.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_get_is_signed_and_its_body_verified() {
        let pool = Pool::new(3);
        let data = object(&pool, "obj-0000000001", 4096).await;
        let (client, server) = answer_once("200 OK", data).await;
        let n = client.get(&pool, "bucket", "obj-0000000001", VerifyMode::Object, 4096).await;
        assert_eq!(n, Ok(4096));
        let head = server.await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /bucket/obj-0000000001 http/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: aws4-hmac-sha256 credential=akid/"), "{head}");
        assert!(head.contains("x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb924"), "{head}");
        assert!(head.contains("x-amz-date: "), "{head}");
    }

    #[tokio::test]
    async fn a_damaged_or_short_body_is_a_verify_error() {
        let pool = Pool::new(3);
        let mut data = object(&pool, "k", 4096).await;
        data[4000] ^= 1;
        let (client, _server) = answer_once("200 OK", data.clone()).await;
        let r = client.get(&pool, "b", "k", VerifyMode::Object, 4096).await;
        assert!(matches!(r, Err((ErrorClass::Verify, _))), "{r:?}");
        data[4000] ^= 1;
        data.truncate(4095);
        let (client, _server) = answer_once("200 OK", data).await;
        let r = client.get(&pool, "b", "k", VerifyMode::Object, 4096).await;
        assert!(matches!(r, Err((ErrorClass::Verify, _))), "{r:?}");
    }

    #[tokio::test]
    async fn an_error_answer_gives_its_status_and_s3_code() {
        let xml = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>".to_vec();
        let (client, _server) = answer_once("404 Not Found", xml).await;
        let r = client.get(&Pool::new(1), "b", "k", VerifyMode::Object, 1).await;
        assert_eq!(r.map_err(|e| e.0), Err(ErrorClass::Http(404, "NoSuchKey".into())));
    }

    #[tokio::test]
    async fn a_name_that_needs_encoding_is_refused_before_sending() {
        let client = LeanClient::new(&["http://127.0.0.1:9"], "k", "s", "us-east-1", None, Duration::from_secs(1));
        let r = client.unwrap().get(&Pool::new(1), "b", "a b", VerifyMode::Object, 1).await;
        assert!(matches!(r, Err((ErrorClass::Transport, ref m)) if m.contains("plain names")), "{r:?}");
    }

    #[test]
    fn only_names_that_need_no_encoding_are_plain() {
        assert!(is_plain("obj-0000000001"));
        assert!(is_plain("p00001/obj-0000000001"));
        assert!(is_plain("a.b_c~d"));
        assert!(!is_plain(""));
        assert!(!is_plain("a b"));
        assert!(!is_plain("a%20b"));
        assert!(!is_plain("a?b"));
        assert!(!is_plain("é"));
    }

    #[test]
    fn a_client_needs_an_endpoint() {
        assert!(LeanClient::new(&[], "k", "s", "us-east-1", None, Duration::from_secs(1)).is_err());
    }
}
