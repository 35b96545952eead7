//! The S3 calls the bench makes, through aws-sdk-s3 with retries off (a retried error would hide a
//! failure) and a per-operation timeout. Bodies stream from the pool and are verified while they stream.

use super::body::{BodySpec, Pool, PoolBody, Verifier, VerifyMode, key_hash};
use super::lean::{LeanClient, ListRequest};
use super::recorder::ErrorClass;
use aws_credential_types::Credentials;
use aws_sdk_s3::config::{BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, SdkBody};
use aws_smithy_types::retry::RetryConfig;
use std::future::Future;
use std::time::Duration;

pub type OpError = (ErrorClass, String);

#[derive(Debug, PartialEq)]
pub struct ListPage {
    pub keys: u64,
    pub prefixes: Vec<String>,
    pub next: Option<String>,
}

#[derive(Clone)]
pub struct BenchClient {
    /// One client per endpoint; requests take them in turn (`--endpoint A,B,C`: load through every node).
    s3: Vec<aws_sdk_s3::Client>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Lists through this instead of the SDK when set (`--list-client lean`).
    lean_list: Option<LeanClient>,
    /// GETs through this instead of the SDK when set (`--get-client lean`).
    lean_get: Option<LeanClient>,
    pool: Pool,
    timeout: Duration,
}

/// Metadata that marks an object high-priority for stores that honour it (Mosaic); others keep it as
/// plain user metadata.
pub const PRIORITY_META_KEY: &str = "mosaic-priority";

/// The SDK's own HTTPS client (rustls), trusting only the given PEM certificates.
fn https_client(pem: Vec<u8>) -> Result<aws_smithy_runtime_api::client::http::SharedHttpClient, String> {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    let trust = TrustStore::empty().with_native_roots(false).with_pem_certificate(pem);
    let context = TlsContext::builder().with_trust_store(trust).build().map_err(|e| format!("TLS: {e}"))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .tls_context(context)
        .build_https())
}

/// Most endpoints one run spreads its requests over.
pub const MAX_ENDPOINTS: usize = 64;

/// The endpoints of `--endpoint`: one URL, or several separated by commas.
pub fn endpoints(list: &str) -> Result<Vec<&str>, String> {
    let all: Vec<&str> = list.split(',').map(str::trim).collect();
    if all.iter().any(|e| e.is_empty()) {
        return Err(format!("--endpoint has an empty entry: {list:?}"));
    }
    if all.len() > MAX_ENDPOINTS {
        return Err(format!("--endpoint names at most {MAX_ENDPOINTS} endpoints, not {}", all.len()));
    }
    Ok(all)
}

impl BenchClient {
    pub fn new(
        endpoint: &str,
        access_key: &str,
        secret_key: &str,
        region: &str,
        ca_pem: Option<Vec<u8>>,
        pool: Pool,
        timeout: Duration,
    ) -> Result<Self, String> {
        let endpoints = endpoints(endpoint)?;
        let mut s3 = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let mut conf = aws_sdk_s3::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .region(Region::new(region.to_string()))
                .endpoint_url(endpoint)
                .credentials_provider(Credentials::new(access_key, secret_key, None, None, "mosaic-bench"))
                .force_path_style(true)
                // Same work for every store: no SDK checksums beyond what S3 requires, no retries.
                .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
                .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
                .retry_config(RetryConfig::disabled());
            if let Some(pem) = &ca_pem {
                conf = conf.http_client(https_client(pem.clone())?);
            }
            s3.push(aws_sdk_s3::Client::from_conf(conf.build()));
        }
        Ok(BenchClient { s3, next: Default::default(), lean_list: None, lean_get: None, pool, timeout })
    }

    /// The client of the next request (endpoints in turn).
    fn s3(&self) -> &aws_sdk_s3::Client {
        debug_assert!(!self.s3.is_empty());
        &self.s3[self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.s3.len()]
    }

    pub fn use_lean_lister(&mut self, lean: LeanClient) {
        self.lean_list = Some(lean);
    }

    pub fn use_lean_getter(&mut self, lean: LeanClient) {
        self.lean_get = Some(lean);
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn timed<T, F: Future<Output = Result<T, OpError>>>(&self, f: F) -> Result<T, OpError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err((ErrorClass::Timeout, format!("no answer within {:?}", self.timeout))),
        }
    }

    pub async fn create_bucket(&self, bucket: &str) -> Result<(), OpError> {
        let r = self.timed(async { self.s3().create_bucket().bucket(bucket).send().await.map_err(classify) }).await;
        match r {
            Err((ErrorClass::Http(_, code), _)) if code == "BucketAlreadyOwnedByYou" => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Turns versioning on: every PUT then makes a version.
    pub async fn enable_versioning(&self, bucket: &str) -> Result<(), OpError> {
        use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
        let cfg = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
        let req = self.s3().put_bucket_versioning().bucket(bucket).versioning_configuration(cfg);
        self.timed(async { req.send().await.map(|_| ()).map_err(classify) }).await
    }

    /// Gives the bucket SSE-S3 default encryption: every PUT is then encrypted at rest.
    pub async fn enable_sse_s3(&self, bucket: &str) -> Result<(), OpError> {
        use aws_sdk_s3::types::{
            ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration,
            ServerSideEncryptionRule,
        };
        let by_default = ServerSideEncryptionByDefault::builder().sse_algorithm(ServerSideEncryption::Aes256).build();
        let rule = ServerSideEncryptionRule::builder()
            .apply_server_side_encryption_by_default(by_default.map_err(|e| (ErrorClass::Transport, e.to_string()))?)
            .build();
        let cfg = ServerSideEncryptionConfiguration::builder().rules(rule).build();
        let cfg = cfg.map_err(|e| (ErrorClass::Transport, e.to_string()))?;
        let req = self.s3().put_bucket_encryption().bucket(bucket).server_side_encryption_configuration(cfg);
        self.timed(async { req.send().await.map(|_| ()).map_err(classify) }).await
    }

    pub async fn delete_bucket(&self, bucket: &str) -> Result<(), OpError> {
        self.timed(async { self.s3().delete_bucket().bucket(bucket).send().await.map(|_| ()).map_err(classify) }).await
    }

    /// PUT of a self-verifying body; returns the bytes sent.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        size: u64,
        pool_offset: u64,
        priority: bool,
    ) -> Result<u64, OpError> {
        let spec = BodySpec { key_hash: key_hash(key), len: size, pool_offset };
        let body = ByteStream::new(SdkBody::from_body_1_x(PoolBody::object(&self.pool, spec)));
        let mut req = self.s3().put_object().bucket(bucket).key(key).content_length(size as i64).body(body);
        if priority {
            req = req.metadata(PRIORITY_META_KEY, "high");
        }
        self.timed(async { req.send().await.map(|_| size).map_err(classify) }).await
    }

    /// S3 append (x-amz-write-offset-bytes) of `len` bytes of the key's stream at `offset`.
    pub async fn append(&self, bucket: &str, key: &str, offset: u64, len: u64) -> Result<u64, OpError> {
        let body = ByteStream::new(SdkBody::from_body_1_x(PoolBody::append(&self.pool, key_hash(key), offset, len)));
        let req = self
            .s3()
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_length(len as i64)
            .write_offset_bytes(offset as i64)
            .body(body);
        self.timed(async { req.send().await.map(|_| len).map_err(classify) }).await
    }

    /// GET, verified byte by byte; `expected_len` is what this client last wrote.
    pub async fn get(&self, bucket: &str, key: &str, mode: VerifyMode, expected_len: u64) -> Result<u64, OpError> {
        if let Some(lean) = &self.lean_get {
            return self.timed(lean.get(&self.pool, bucket, key, mode, expected_len)).await;
        }
        self.timed(async {
            let out = self.s3().get_object().bucket(bucket).key(key).send().await.map_err(classify)?;
            let mut verifier = Verifier::new(&self.pool, key, mode);
            let mut body = out.body;
            loop {
                match body.try_next().await {
                    Ok(Some(chunk)) => verifier.update(&chunk),
                    Ok(None) => break,
                    Err(e) => return Err((ErrorClass::Transport, format!("reading the body: {e}"))),
                }
            }
            finish_get(verifier, key, expected_len)
        })
        .await
    }

    pub async fn delete(&self, bucket: &str, key: &str) -> Result<u64, OpError> {
        self.timed(async {
            self.s3().delete_object().bucket(bucket).key(key).send().await.map(|_| 0).map_err(classify)
        })
        .await
    }

    /// One ListObjectsV2 page.
    pub async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> Result<ListPage, OpError> {
        if let Some(lean) = &self.lean_list {
            let r = ListRequest { bucket, prefix, delimiter, max_keys, versions: false, token };
            return self.timed(lean.page(r)).await;
        }
        self.timed(async {
            let out = self
                .s3()
                .list_objects_v2()
                .bucket(bucket)
                .prefix(prefix)
                .max_keys(max_keys)
                .set_delimiter(delimiter.map(str::to_string))
                .set_continuation_token(token)
                .send()
                .await
                .map_err(classify)?;
            let next =
                if out.is_truncated() == Some(true) { out.next_continuation_token().map(str::to_string) } else { None };
            let prefixes = out.common_prefixes().iter().filter_map(|p| p.prefix().map(str::to_string)).collect();
            Ok(ListPage { keys: out.contents().len() as u64, prefixes, next })
        })
        .await
    }

    /// One page of ListObjectVersions: `keys` counts versions and delete markers. The page token is the
    /// next key marker and version-id marker joined by a NUL (neither holds one).
    pub async fn list_versions_page(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<String>,
        max_keys: i32,
    ) -> Result<ListPage, OpError> {
        if let Some(lean) = &self.lean_list {
            let r = ListRequest { bucket, prefix, delimiter, max_keys, versions: true, token };
            return self.timed(lean.page(r)).await;
        }
        let (key_marker, version_marker) = match token.as_deref().and_then(|t| t.split_once('\0')) {
            Some((k, v)) => (Some(k.to_string()), Some(v.to_string()).filter(|v| !v.is_empty())),
            None => (None, None),
        };
        self.timed(async {
            let out = self
                .s3()
                .list_object_versions()
                .bucket(bucket)
                .prefix(prefix)
                .max_keys(max_keys)
                .set_delimiter(delimiter.map(str::to_string))
                .set_key_marker(key_marker)
                .set_version_id_marker(version_marker)
                .send()
                .await
                .map_err(classify)?;
            let next = match (out.is_truncated(), out.next_key_marker()) {
                (Some(true), Some(k)) => Some(format!("{k}\0{}", out.next_version_id_marker().unwrap_or_default())),
                _ => None,
            };
            let prefixes = out.common_prefixes().iter().filter_map(|p| p.prefix().map(str::to_string)).collect();
            let keys = (out.versions().len() + out.delete_markers().len()) as u64;
            Ok(ListPage { keys, prefixes, next })
        })
        .await
    }

    /// Removes every object of the bucket (1,000 keys per DeleteObjects), not timed.
    pub async fn empty_bucket(&self, bucket: &str) -> Result<u64, OpError> {
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        let mut removed = 0;
        // Every version and delete marker (in an unversioned bucket, each object's null version), so that a
        // versioned bucket empties too.
        loop {
            let out = self
                .timed(async {
                    self.s3().list_object_versions().bucket(bucket).max_keys(1000).send().await.map_err(classify)
                })
                .await?;
            let versions = out.versions().iter().map(|v| (v.key(), v.version_id()));
            let markers = out.delete_markers().iter().map(|m| (m.key(), m.version_id()));
            let ids: Vec<ObjectIdentifier> = versions
                .chain(markers)
                .filter_map(|(k, v)| {
                    let id = ObjectIdentifier::builder().set_key(k.map(str::to_string));
                    id.set_version_id(v.map(str::to_string)).build().ok()
                })
                .collect();
            if ids.is_empty() {
                return Ok(removed);
            }
            removed += ids.len() as u64;
            let del = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| (ErrorClass::Transport, e.to_string()))?;
            self.timed(async { self.s3().delete_objects().bucket(bucket).delete(del).send().await.map_err(classify) })
                .await?;
        }
    }
}

/// Error class of an SDK error: the HTTP status and S3 code when the server answered.
fn classify<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> OpError {
    match &e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().unwrap_or("").to_string();
            let msg = s.err().message().unwrap_or("").to_string();
            (ErrorClass::Http(status, code.clone()), format!("{status} {code} {msg}"))
        }
        SdkError::TimeoutError(_) => (ErrorClass::Timeout, format!("{e:?}")),
        SdkError::ResponseError(r) => {
            (ErrorClass::Http(r.raw().status().as_u16(), String::new()), format!("unreadable response: {e:?}"))
        }
        _ => (ErrorClass::Transport, format!("{e:?}")),
    }
}

/// The end of a GET's body: every byte verified, and as many as this client last wrote.
pub(super) fn finish_get(verifier: Verifier, key: &str, expected_len: u64) -> Result<u64, OpError> {
    let n = verifier.finish().map_err(|e| (ErrorClass::Verify, format!("{key}: {e}")))?;
    if n != expected_len {
        return Err((ErrorClass::Verify, format!("{key}: {n} bytes read back, {expected_len} written")));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_one_or_a_comma_separated_list_within_a_limit() {
        assert_eq!(endpoints("http://a:1").unwrap(), ["http://a:1"]);
        assert_eq!(endpoints("http://a:1, http://b:2,http://c:3").unwrap(), ["http://a:1", "http://b:2", "http://c:3"]);
        assert!(endpoints("http://a:1,,http://b:2").is_err());
        assert!(endpoints("").is_err());
        let at_limit = vec!["http://a:1"; MAX_ENDPOINTS].join(",");
        assert_eq!(endpoints(&at_limit).unwrap().len(), MAX_ENDPOINTS);
        assert!(endpoints(&format!("{at_limit},http://b:2")).is_err());
    }

    #[test]
    fn requests_take_the_endpoints_in_turn() {
        let c = BenchClient::new(
            "http://a:1,http://b:2",
            "k",
            "s",
            "us-east-1",
            None,
            Pool::new(1),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(c.s3.len(), 2);
        for i in 0..4 {
            assert!(std::ptr::eq(c.s3(), &c.s3[i % 2]), "request {i}");
        }
    }
}
