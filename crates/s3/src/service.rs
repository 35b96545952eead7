//! The S3 operations: s3s parses and authenticates requests; this module turns them into ObjectLayer calls
//! and the layer's answers into S3 responses.

use crate::access::KeyRing;
use crate::checksum::{Algo, Expectations, verified_body};
use crate::errors::to_s3;
use futures::StreamExt;
use mosaic_layer::{
    BucketOptions, ByteStream, CompletePart, DeleteOptions, LayerError, ListQuery, LockChange, ObjectLayer, ObjectMeta,
    Precondition, PutOptions, RangeRequest, VersionQuery, Versioning,
};
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result, s3_error};
use std::collections::HashMap;
use std::sync::Arc;

/// Largest number of keys in one DeleteObjects request (S3's limit).
const MAX_DELETE_KEYS: usize = 1000;
/// Deletes of one DeleteObjects request in flight at once.
const DELETE_OBJECTS_IN_FLIGHT: usize = 16;
const MAX_LIST_KEYS: i32 = 1000;

#[derive(Clone)]
pub struct MosaicS3 {
    layer: Arc<dyn ObjectLayer>,
    /// Who owns what a request creates, and which buckets a key sees in ListBuckets.
    keys: Arc<KeyRing>,
}

impl MosaicS3 {
    pub fn new(layer: Arc<dyn ObjectLayer>, keys: Arc<KeyRing>) -> Self {
        MosaicS3 { layer, keys }
    }

    fn is_root(&self, access_key: &str) -> bool {
        self.keys.is_root(access_key)
    }

    /// The S3 error of a failed GET or HEAD; a 304 carries the object's ETag and Last-Modified, as S3's does
    /// (caches revalidate with them).
    async fn not_modified_with_etag(
        &self,
        e: LayerError,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> s3s::S3Error {
        if e != LayerError::NotModified {
            return to_s3(e);
        }
        let mut err = to_s3(e);
        if let Ok(m) = self.layer.head_object(bucket, key, version, &Precondition::default()).await {
            let mut h = http::HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_str(&format!("\"{}\"", m.etag)) {
                h.insert(http::header::ETAG, v);
            }
            let modified = time::OffsetDateTime::from_unix_timestamp(m.last_modified_unix_ms.div_euclid(1000)).ok();
            let fmt = time::format_description::well_known::Rfc2822;
            if let Some(v) = modified
                .and_then(|t| t.format(&fmt).ok())
                .and_then(|s| http::HeaderValue::from_str(&s.replace("+0000", "GMT")).ok())
            {
                h.insert(http::header::LAST_MODIFIED, v);
            }
            err.set_headers(h);
        }
        err
    }

    /// The metadata (and so the lock) of a version, for GetObjectRetention and GetObjectLegalHold; a bucket
    /// without object lock answers 400 InvalidRequest, as S3 does.
    async fn locked_version(&self, bucket: &str, key: &str, version: Option<&str>) -> S3Result<ObjectMeta> {
        if self.layer.bucket_info(bucket).await.map_err(to_s3)?.object_lock.is_none() {
            return Err(s3_error!(InvalidRequest, "Bucket is missing Object Lock Configuration"));
        }
        self.layer.head_object(bucket, key, version, &Precondition::default()).await.map_err(to_s3)
    }

    /// Whether a request asked to bypass GOVERNANCE retention and may: the root key and the bucket's owner
    /// may; keys granted access to someone else's bucket may not. Also checks that the bucket exists.
    async fn may_bypass(
        &self,
        creds: &Option<s3s::auth::Credentials>,
        bucket: &str,
        asked: Option<bool>,
    ) -> S3Result<bool> {
        let info = self.layer.bucket_info(bucket).await.map_err(to_s3)?;
        if !asked.unwrap_or(false) {
            return Ok(false);
        }
        let who = creds.as_ref().map(|c| c.access_key.as_str()).unwrap_or("");
        Ok(self.is_root(who) || info.owner.as_deref() == Some(who))
    }
}

fn ts(ms: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

fn unix_s(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

fn etag_of(s: &str) -> ETag {
    ETag::Strong(s.to_string())
}

fn cond_str(c: &ETagCondition) -> String {
    match c {
        ETagCondition::Any => "*".to_string(),
        ETagCondition::ETag(ETag::Strong(s)) | ETagCondition::ETag(ETag::Weak(s)) => s.clone(),
    }
}

fn layer_stream(blob: Option<StreamingBlob>) -> ByteStream {
    match blob {
        Some(b) => Box::pin(b.map(|r| r.map_err(|e| LayerError::IncompleteBody(e.to_string())))),
        None => Box::pin(futures::stream::empty()),
    }
}

fn range_of(r: &Range) -> RangeRequest {
    match *r {
        Range::Int { first, last } => RangeRequest::FromTo { first, last },
        Range::Suffix { length } => RangeRequest::Suffix { len: length },
    }
}

fn expires_str(e: &Option<Timestamp>) -> Option<String> {
    e.as_ref().map(|t| {
        let mut v = Vec::new();
        let _ = t.format(TimestampFormat::HttpDate, &mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

fn parse_expires(s: &Option<String>) -> Option<Timestamp> {
    s.as_deref().and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

/// Headers that carry checksums or ask for one.
fn expectations<T>(
    req: &S3Request<T>,
    content_md5: Option<String>,
    given: [(Algo, Option<String>); 5],
    requested: Option<&ChecksumAlgorithm>,
    content_length: Option<i64>,
) -> S3Result<Expectations> {
    let trailer = req
        .headers
        .get("x-amz-trailer")
        .and_then(|v| v.to_str().ok())
        .map(|v| Algo::parse(v.trim()).ok_or_else(|| s3_error!(InvalidArgument, "unsupported trailer {v}")))
        .transpose()?;
    // SDKs name the algorithm in x-amz-sdk-checksum-algorithm, which s3s does not map into the input.
    let named = requested
        .map(|a| a.as_str().to_string())
        .or_else(|| req.headers.get("x-amz-sdk-checksum-algorithm").and_then(|v| v.to_str().ok()).map(str::to_string));
    let requested = match named {
        Some(a) => {
            Some(Algo::parse(&a).ok_or_else(|| s3_error!(InvalidArgument, "unsupported checksum algorithm {a}"))?)
        }
        None => None,
    };
    let headers: Vec<(Algo, String)> = given.into_iter().filter_map(|(a, v)| v.map(|v| (a, v))).collect();
    if headers.len() > 1 {
        return Err(s3_error!(InvalidRequest, "Expecting a single x-amz-checksum- header"));
    }
    // With aws-chunked encoding Content-Length is the encoded size; the decoded size is checked by s3s.
    let chunked = req.headers.get("x-amz-decoded-content-length").is_some()
        || req.headers.get("content-encoding").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("aws-chunked"));
    Ok(Expectations {
        content_md5,
        headers,
        trailer,
        requested,
        trailing: req.trailing_headers.clone(),
        content_length: if chunked { None } else { content_length.and_then(|l| u64::try_from(l).ok()) },
    })
}

/// The body expectations of an upload-shaped input (PutObject, UploadPart: same fields, different types).
macro_rules! body_expectations {
    ($req:expr) => {
        expectations(
            &$req,
            $req.input.content_md5.clone(),
            [
                (Algo::Crc32, $req.input.checksum_crc32.clone()),
                (Algo::Crc32c, $req.input.checksum_crc32c.clone()),
                (Algo::Crc64Nvme, $req.input.checksum_crc64nvme.clone()),
                (Algo::Sha1, $req.input.checksum_sha1.clone()),
                (Algo::Sha256, $req.input.checksum_sha256.clone()),
            ],
            $req.input.checksum_algorithm.as_ref(),
            $req.input.content_length,
        )
    };
}

fn put_options(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: &Option<Timestamp>,
    metadata: Option<HashMap<String, String>>,
) -> PutOptions {
    PutOptions {
        content_type,
        // aws-chunked is a transfer detail, not the object's encoding.
        content_encoding: content_encoding
            .map(|e| e.split(',').map(str::trim).filter(|p| *p != "aws-chunked").collect::<Vec<_>>().join(","))
            .filter(|e| !e.is_empty()),
        content_disposition,
        content_language,
        cache_control,
        expires: expires_str(expires),
        user_metadata: metadata.unwrap_or_default().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect(),
        ..Default::default()
    }
}

struct Checksums {
    crc32: Option<String>,
    crc32c: Option<String>,
    crc64nvme: Option<String>,
    sha1: Option<String>,
    sha256: Option<String>,
    kind: Option<ChecksumType>,
}

fn checksums(meta_sums: &std::collections::BTreeMap<String, String>, enabled: bool) -> Checksums {
    let get = |k: &str| if enabled { meta_sums.get(k).cloned() } else { None };
    Checksums {
        crc32: get("CRC32"),
        crc32c: get("CRC32C"),
        crc64nvme: get("CRC64NVME"),
        sha1: get("SHA1"),
        sha256: get("SHA256"),
        kind: get("TYPE").map(ChecksumType::from),
    }
}

fn checksums_of_list(list: &[(String, String)]) -> Checksums {
    let m: std::collections::BTreeMap<String, String> = list.iter().cloned().collect();
    checksums(&m, true)
}

fn precondition(
    if_match: &Option<ETagCondition>,
    if_none_match: &Option<ETagCondition>,
    if_modified_since: &Option<Timestamp>,
    if_unmodified_since: &Option<Timestamp>,
) -> Precondition {
    Precondition {
        if_match: if_match.as_ref().map(cond_str),
        if_none_match: if_none_match.as_ref().map(cond_str),
        if_modified_since_unix_s: if_modified_since.as_ref().map(unix_s),
        if_unmodified_since_unix_s: if_unmodified_since.as_ref().map(unix_s),
        for_copy_source: false,
    }
}

/// The copy source's bucket, key and version id.
fn copy_source(cs: &CopySource) -> S3Result<(String, String, Option<String>)> {
    match cs {
        CopySource::Bucket { bucket, key, version_id } => {
            Ok((bucket.to_string(), key.to_string(), version_id.as_deref().map(str::to_string)))
        }
        _ => Err(s3_error!(NotImplemented, "access point copy sources are not supported")),
    }
}

fn encode_url(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(MAX_LIST_KEYS as usize),
        Some(m) if m < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(m) => Ok(m.min(MAX_LIST_KEYS) as usize),
    }
}

fn owner() -> Owner {
    Owner { display_name: Some("mosaic".into()), id: Some("mosaic".into()) }
}

/// The x-amz-tagging header of a write: URL-encoded `key=value` pairs joined by `&`.
fn tagging_header(h: &Option<String>) -> S3Result<Vec<(String, String)>> {
    let Some(h) = h.as_deref().filter(|h| !h.is_empty()) else { return Ok(Vec::new()) };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| s3_error!(InvalidTag, "x-amz-tagging is not URL-encoded UTF-8"))
    };
    h.split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

/// The x-amz-version-id of a version: its id; none for a null version (as S3 answers writes in
/// unversioned and suspended buckets).
fn version_header(m: &ObjectMeta) -> Option<String> {
    m.version_id.clone()
}

/// A page of a multipart object's parts for GetObjectAttributes (numbers after `marker`, at most
/// `max_parts`, 1,000 by default).
fn object_parts(sizes: &[u64], marker: Option<i32>, max_parts: Option<i32>) -> S3Result<GetObjectAttributesParts> {
    let marker = marker.unwrap_or(0);
    let max = max_parts.unwrap_or(1000);
    if marker < 0 || max < 0 {
        return Err(s3_error!(InvalidArgument, "part-number-marker and max-parts must not be negative"));
    }
    let parts: Vec<ObjectPart> = sizes
        .iter()
        .enumerate()
        .map(|(i, s)| (i as i32 + 1, *s))
        .filter(|(n, _)| *n > marker)
        .take(max.min(1000) as usize)
        .map(|(n, s)| ObjectPart { part_number: Some(n), size: Some(s as i64), ..Default::default() })
        .collect();
    let last = parts.last().and_then(|p| p.part_number).unwrap_or(marker);
    let truncated = (last as usize) < sizes.len();
    Ok(GetObjectAttributesParts {
        is_truncated: Some(truncated),
        max_parts: Some(max),
        next_part_number_marker: Some(last),
        part_number_marker: Some(marker),
        parts: Some(parts),
        total_parts_count: Some(sizes.len() as i32),
    })
}

fn meta_map(m: &ObjectMeta) -> Option<HashMap<String, String>> {
    if m.user_metadata.is_empty() {
        None
    } else {
        Some(m.user_metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

#[async_trait::async_trait]
impl S3 for MosaicS3 {
    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let input = req.input;
        if let Some(c) = input.create_bucket_configuration.as_ref().and_then(|c| c.location_constraint.as_ref())
            && !c.as_str().is_empty()
            && c.as_str() != "us-east-1"
        {
            return Err(s3_error!(
                InvalidLocationConstraint,
                "this store serves region us-east-1; omit the location constraint or use us-east-1"
            ));
        }
        let owner = req.credentials.as_ref().map(|c| c.access_key.clone()).filter(|k| !self.is_root(k));
        let opts =
            BucketOptions { owner: owner.clone(), object_lock: input.object_lock_enabled_for_bucket.unwrap_or(false) };
        match self.layer.create_bucket(&input.bucket, Some(&opts)).await {
            Ok(()) => {}
            // As S3 in us-east-1: creating again a bucket one owns succeeds; another's is taken.
            Err(LayerError::BucketExists) => {
                let existing = self.layer.bucket_info(&input.bucket).await.map_err(to_s3)?;
                if existing.owner != owner {
                    return Err(s3_error!(BucketAlreadyExists));
                }
            }
            Err(e) => return Err(to_s3(e)),
        }
        Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{}", input.bucket)) }))
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.layer.delete_bucket(&req.input.bucket).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        Ok(S3Response::new(HeadBucketOutput { bucket_region: Some("us-east-1".into()), ..Default::default() }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        Ok(S3Response::new(GetBucketLocationOutput { location_constraint: None }))
    }

    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self.layer.list_buckets().await.map_err(to_s3)?;
        let requester = req.credentials.as_ref().map(|c| c.access_key.clone()).unwrap_or_default();
        let buckets = buckets
            .into_iter()
            .filter(|b| self.keys.sees_bucket(&requester, &b.name, b.owner.as_deref()))
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: Some(ts(b.created_unix_ms)),
                bucket_region: Some("us-east-1".into()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), owner: Some(owner()), ..Default::default() }))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let exp = body_expectations!(req)?;
        let input = req.input;
        let mut opts = put_options(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            &input.expires,
            input.metadata,
        );
        opts.if_none_match_any = matches!(input.if_none_match, Some(ETagCondition::Any));
        opts.if_none_match = match &input.if_none_match {
            Some(c @ ETagCondition::ETag(_)) => Some(cond_str(c)),
            _ => None,
        };
        opts.if_match = input.if_match.as_ref().map(cond_str);
        opts.tags = tagging_header(&input.tagging)?;
        opts.lock = crate::lock::lock_request(
            &input.object_lock_mode,
            &input.object_lock_retain_until_date,
            &input.object_lock_legal_hold_status,
        )?;
        opts.write_offset = match input.write_offset_bytes {
            Some(o) if o < 0 => {
                return Err(s3_error!(InvalidArgument, "x-amz-write-offset-bytes must not be negative"));
            }
            Some(o) => Some(o as u64),
            None => None,
        };
        let body = verified_body(layer_stream(input.body), exp).map_err(to_s3)?;
        let meta = self.layer.put_object(&input.bucket, &input.key, body, opts).await.map_err(to_s3)?;
        let c = checksums(&meta.checksums, true);
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag_of(&meta.etag)),
            version_id: version_header(&meta),
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            checksum_type: c.kind,
            size: Some(meta.size_bytes as i64),
            ..Default::default()
        }))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let i = req.input;
        let pre = precondition(&i.if_match, &i.if_none_match, &i.if_modified_since, &i.if_unmodified_since);
        let part = match i.part_number {
            Some(p) if p < 1 => return Err(s3_error!(InvalidArgument, "partNumber must be at least 1")),
            p => p.map(|p| p as u32),
        };
        let got = self
            .layer
            .get_object(&i.bucket, &i.key, i.version_id.as_deref(), i.range.as_ref().map(range_of), part, &pre)
            .await;
        let got = match got {
            Ok(g) => g,
            Err(e) => return Err(self.not_modified_with_etag(e, &i.bucket, &i.key, i.version_id.as_deref()).await),
        };
        let m = got.meta;
        let enabled = i.checksum_mode.as_ref().is_some_and(|c| c.as_str() == "ENABLED");
        // A checksum of the whole object does not describe a range of it.
        let c = checksums(&m.checksums, enabled && got.range.is_none());
        let (len, content_range) = match got.range {
            Some(r) => (r.end - r.start, Some(format!("bytes {}-{}/{}", r.start, r.end - 1, m.size_bytes))),
            None => (m.size_bytes, None),
        };
        let body = StreamingBlob::wrap(got.body);
        let lock = crate::lock::headers_of(&m);
        let out = GetObjectOutput {
            body: Some(body),
            accept_ranges: Some("bytes".into()),
            content_length: Some(len as i64),
            content_range,
            e_tag: Some(etag_of(&m.etag)),
            last_modified: Some(ts(m.last_modified_unix_ms)),
            content_type: i.response_content_type.or(m.content_type.clone()).or(Some("binary/octet-stream".into())),
            content_encoding: i.response_content_encoding.or(m.content_encoding.clone()),
            content_disposition: i.response_content_disposition.or(m.content_disposition.clone()),
            content_language: i.response_content_language.or(m.content_language.clone()),
            cache_control: i.response_cache_control.or(m.cache_control.clone()),
            expires: i.response_expires.or(parse_expires(&m.expires)),
            metadata: meta_map(&m),
            parts_count: if m.part_sizes.is_empty() { None } else { Some(m.part_sizes.len() as i32) },
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            checksum_type: c.kind,
            version_id: version_header(&m),
            tag_count: (m.tag_count > 0).then_some(m.tag_count as i32),
            object_lock_mode: lock.mode,
            object_lock_retain_until_date: lock.until,
            object_lock_legal_hold_status: lock.legal_hold,
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = req.input;
        let pre = precondition(&i.if_match, &i.if_none_match, &i.if_modified_since, &i.if_unmodified_since);
        let m = match self.layer.head_object(&i.bucket, &i.key, i.version_id.as_deref(), &pre).await {
            Ok(m) => m,
            Err(e) => return Err(self.not_modified_with_etag(e, &i.bucket, &i.key, i.version_id.as_deref()).await),
        };
        let mut len = m.size_bytes;
        let mut content_range = None;
        if let Some(p) = i.part_number {
            if p < 1 {
                return Err(s3_error!(InvalidArgument, "partNumber must be at least 1"));
            }
            let idx = (p - 1) as usize;
            if m.part_sizes.is_empty() {
                if p != 1 {
                    return Err(crate::errors::invalid_part_number());
                }
            } else {
                let size = *m.part_sizes.get(idx).ok_or_else(crate::errors::invalid_part_number)?;
                let start: u64 = m.part_sizes[..idx].iter().sum();
                len = size;
                content_range = Some(format!("bytes {}-{}/{}", start, start + size - 1, m.size_bytes));
            }
        }
        let enabled = i.checksum_mode.as_ref().is_some_and(|c| c.as_str() == "ENABLED");
        let c = checksums(&m.checksums, enabled);
        let lock = crate::lock::headers_of(&m);
        Ok(S3Response::new(HeadObjectOutput {
            object_lock_mode: lock.mode,
            object_lock_retain_until_date: lock.until,
            object_lock_legal_hold_status: lock.legal_hold,
            accept_ranges: Some("bytes".into()),
            content_length: Some(len as i64),
            content_range,
            e_tag: Some(etag_of(&m.etag)),
            last_modified: Some(ts(m.last_modified_unix_ms)),
            content_type: i.response_content_type.or(m.content_type.clone()).or(Some("binary/octet-stream".into())),
            content_encoding: m.content_encoding.clone(),
            content_disposition: m.content_disposition.clone(),
            content_language: m.content_language.clone(),
            cache_control: m.cache_control.clone(),
            expires: parse_expires(&m.expires),
            metadata: meta_map(&m),
            parts_count: if m.part_sizes.is_empty() { None } else { Some(m.part_sizes.len() as i32) },
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            checksum_type: c.kind,
            version_id: version_header(&m),
            ..Default::default()
        }))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let bypass =
            self.may_bypass(&req.credentials, &req.input.bucket, req.input.bypass_governance_retention).await?;
        let i = req.input;
        let opts = DeleteOptions {
            version_id: i.version_id.clone(),
            bypass_governance: bypass,
            if_match: i.if_match.as_ref().map(cond_str),
            if_match_last_modified_ms: i.if_match_last_modified_time.as_ref().map(|t| unix_s(t) * 1000),
            if_match_size: match i.if_match_size {
                Some(s) if s < 0 => return Err(s3_error!(InvalidArgument, "x-amz-if-match-size must not be negative")),
                s => s.map(|s| s as u64),
            },
            background: false,
        };
        let d = self.layer.delete_object_with(&i.bucket, &i.key, &opts).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteObjectOutput {
            delete_marker: d.delete_marker.then_some(true),
            version_id: d.version_id,
            ..Default::default()
        }))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let i = req.input;
        if i.delete.objects.len() > MAX_DELETE_KEYS {
            return Err(s3_error!(MalformedXML, "at most {MAX_DELETE_KEYS} keys per DeleteObjects request"));
        }
        let bypass = self.may_bypass(&req.credentials, &i.bucket, i.bypass_governance_retention).await?;
        let quiet = i.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        // Several deletes in flight (each is its own transaction; the store groups their commits), answered
        // in the request's order.
        let bucket = &i.bucket;
        let layer = &self.layer;
        let results: Vec<_> = futures::stream::iter(i.delete.objects)
            .map(|o| async move {
                let opts = DeleteOptions {
                    version_id: o.version_id.clone(),
                    bypass_governance: bypass,
                    if_match: o.e_tag.as_ref().map(|e| match e {
                        ETag::Strong(s) | ETag::Weak(s) => s.clone(),
                    }),
                    if_match_last_modified_ms: o.last_modified_time.as_ref().map(|t| unix_s(t) * 1000),
                    if_match_size: o.size.and_then(|s| u64::try_from(s).ok()),
                    background: false,
                };
                let r = layer.delete_object_with(bucket, &o.key, &opts).await;
                (o, r)
            })
            .buffered(DELETE_OBJECTS_IN_FLIGHT)
            .collect()
            .await;
        for (o, result) in results {
            match result {
                Ok(d) => {
                    if !quiet {
                        let marker_made = d.delete_marker && o.version_id.is_none();
                        deleted.push(DeletedObject {
                            key: Some(o.key),
                            version_id: o.version_id.clone(),
                            delete_marker: d.delete_marker.then_some(true),
                            delete_marker_version_id: if marker_made { d.version_id } else { None },
                        })
                    }
                }
                Err(e) => {
                    let s = to_s3(e);
                    errors.push(Error {
                        code: Some(s.code().as_str().to_string()),
                        key: Some(o.key),
                        message: s.message().map(str::to_string),
                        version_id: o.version_id,
                    });
                }
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: if errors.is_empty() { None } else { Some(errors) },
            ..Default::default()
        }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = req.input;
        let (src_bucket, src_key, src_version) = copy_source(&i.copy_source)?;
        let mut pre = precondition(
            &i.copy_source_if_match,
            &i.copy_source_if_none_match,
            &i.copy_source_if_modified_since,
            &i.copy_source_if_unmodified_since,
        );
        pre.for_copy_source = true;
        let replace = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == "REPLACE");
        let new_meta = replace.then(|| {
            put_options(
                i.content_type.clone(),
                i.content_encoding.clone(),
                i.content_disposition.clone(),
                i.content_language.clone(),
                i.cache_control.clone(),
                &i.expires,
                i.metadata.clone(),
            )
        });
        let m = self
            .layer
            .copy_object(&src_bucket, &src_key, src_version.as_deref(), &pre, &i.bucket, &i.key, new_meta)
            .await
            .map_err(to_s3)?;
        let c = checksums(&m.checksums, true);
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag_of(&m.etag)),
                last_modified: Some(ts(m.last_modified_unix_ms)),
                checksum_crc32: c.crc32,
                checksum_crc32c: c.crc32c,
                checksum_crc64nvme: c.crc64nvme,
                checksum_sha1: c.sha1,
                checksum_sha256: c.sha256,
                checksum_type: c.kind,
            }),
            copy_source_version_id: src_version,
            version_id: version_header(&m),
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let url = i.encoding_type.as_ref().is_some_and(|e| e.as_str() == "url");
        let q = ListQuery {
            prefix: i.prefix.clone().unwrap_or_default(),
            delimiter: delimiter_of(&i.delimiter),
            start_after: i.marker.clone().unwrap_or_default(),
            max_keys: max_keys(i.max_keys)?,
        };
        let page = self.layer.list_objects(&i.bucket, &q).await.map_err(to_s3)?;
        let enc = |s: String| if url { encode_url(&s) } else { s };
        let truncated = page.next_marker.is_some();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc(q.prefix.clone())),
            marker: Some(enc(q.start_after.clone())),
            max_keys: Some(q.max_keys as i32),
            is_truncated: Some(truncated),
            next_marker: if q.delimiter.is_some() { page.next_marker.clone().map(enc) } else { None },
            delimiter: q.delimiter.clone().map(enc),
            encoding_type: i.encoding_type,
            contents: Some(
                page.objects
                    .into_iter()
                    .map(|o| Object {
                        key: Some(enc(o.key)),
                        size: Some(o.size_bytes as i64),
                        e_tag: Some(etag_of(&o.etag)),
                        last_modified: Some(ts(o.last_modified_unix_ms)),
                        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                        owner: Some(owner()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            common_prefixes: Some(
                page.common_prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let url = i.encoding_type.as_ref().is_some_and(|e| e.as_str() == "url");
        let start_after = match &i.continuation_token {
            // An empty token is no token (S3 lists from the start and echoes it).
            Some(t) if !t.is_empty() => crate::token::decode(t)
                .map_err(|_| s3_error!(InvalidArgument, "The continuation token provided is incorrect"))?,
            _ => i.start_after.clone().unwrap_or_default(),
        };
        let q = ListQuery {
            prefix: i.prefix.clone().unwrap_or_default(),
            delimiter: delimiter_of(&i.delimiter),
            start_after,
            max_keys: max_keys(i.max_keys)?,
        };
        let page = self.layer.list_objects(&i.bucket, &q).await.map_err(to_s3)?;
        let enc = |s: String| if url { encode_url(&s) } else { s };
        let fetch_owner = i.fetch_owner.unwrap_or(false);
        let key_count = (page.objects.len() + page.common_prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(q.prefix.clone())),
            max_keys: Some(q.max_keys as i32),
            key_count: Some(key_count),
            continuation_token: i.continuation_token,
            is_truncated: Some(page.next_marker.is_some()),
            next_continuation_token: page.next_marker.as_deref().map(crate::token::encode),
            delimiter: q.delimiter.clone().map(enc),
            encoding_type: i.encoding_type,
            start_after: i.start_after.map(enc),
            contents: Some(
                page.objects
                    .into_iter()
                    .map(|o| Object {
                        key: Some(enc(o.key)),
                        size: Some(o.size_bytes as i64),
                        e_tag: Some(etag_of(&o.etag)),
                        last_modified: Some(ts(o.last_modified_unix_ms)),
                        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                        owner: fetch_owner.then(owner),
                        ..Default::default()
                    })
                    .collect(),
            ),
            common_prefixes: Some(
                page.common_prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect(),
            ),
            ..Default::default()
        }))
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let i = req.input;
        let rules = crate::lifecycle::rules_of(&i.lifecycle_configuration)?;
        self.layer.put_bucket_lifecycle(&i.bucket, Some(rules)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketLifecycleConfigurationOutput::default()))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let b = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let rules = b
            .lifecycle
            .ok_or_else(|| s3_error!(NoSuchLifecycleConfiguration, "The lifecycle configuration does not exist"))?;
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
            rules: Some(crate::lifecycle::rules_dto(&rules)),
            ..Default::default()
        }))
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        self.layer.put_bucket_lifecycle(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketLifecycleOutput::default()))
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let i = req.input;
        let mut tags = Vec::with_capacity(i.tagging.tag_set.len());
        for t in i.tagging.tag_set {
            let k = t.key.ok_or_else(|| s3_error!(InvalidTag, "a tag needs a key"))?;
            tags.push((k, t.value.unwrap_or_default()));
        }
        self.layer.put_bucket_tags(&i.bucket, tags).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketTaggingOutput::default()))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let b = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        if b.tags.is_empty() {
            return Err(s3_error!(NoSuchTagSet, "The TagSet does not exist"));
        }
        let tag_set = b.tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect();
        Ok(S3Response::new(GetBucketTaggingOutput { tag_set }))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        self.layer.put_bucket_tags(&req.input.bucket, Vec::new()).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketTaggingOutput::default()))
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let i = req.input;
        let wants = |a: &str| i.object_attributes.iter().any(|x| x.as_str() == a);
        let m = self
            .layer
            .head_object(&i.bucket, &i.key, i.version_id.as_deref(), &Precondition::default())
            .await
            .map_err(to_s3)?;
        let c = checksums(&m.checksums, true);
        let any = [&c.crc32, &c.crc32c, &c.crc64nvme, &c.sha1, &c.sha256].iter().any(|x| x.is_some());
        let checksum = any.then_some(Checksum {
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            checksum_type: c.kind,
        });
        let parts = if m.part_sizes.is_empty() {
            None
        } else {
            Some(object_parts(&m.part_sizes, i.part_number_marker, i.max_parts)?)
        };
        Ok(S3Response::new(GetObjectAttributesOutput {
            e_tag: wants("ETag").then(|| etag_of(&m.etag)),
            checksum: checksum.filter(|_| wants("Checksum")),
            object_parts: parts.filter(|_| wants("ObjectParts")),
            storage_class: wants("StorageClass").then(|| StorageClass::from_static(StorageClass::STANDARD)),
            object_size: wants("ObjectSize").then_some(m.size_bytes as i64),
            last_modified: Some(ts(m.last_modified_unix_ms)),
            version_id: version_header(&m),
            ..Default::default()
        }))
    }

    async fn put_object_lock_configuration(
        &self,
        req: S3Request<PutObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<PutObjectLockConfigurationOutput>> {
        let i = req.input;
        let cfg = crate::lock::config_of(&i.object_lock_configuration)?;
        self.layer.put_object_lock_config(&i.bucket, cfg).await.map_err(to_s3)?;
        Ok(S3Response::new(PutObjectLockConfigurationOutput::default()))
    }

    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        let b = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let cfg = b.object_lock.ok_or_else(|| {
            s3_error!(ObjectLockConfigurationNotFoundError, "Object Lock configuration does not exist for this bucket")
        })?;
        Ok(S3Response::new(GetObjectLockConfigurationOutput {
            object_lock_configuration: Some(crate::lock::config_dto(cfg)),
        }))
    }

    async fn put_object_retention(
        &self,
        req: S3Request<PutObjectRetentionInput>,
    ) -> S3Result<S3Response<PutObjectRetentionOutput>> {
        let bypass =
            self.may_bypass(&req.credentials, &req.input.bucket, req.input.bypass_governance_retention).await?;
        let i = req.input;
        let r = crate::lock::retention_of(&i.retention)?;
        self.layer
            .change_object_lock(&i.bucket, &i.key, i.version_id.as_deref(), LockChange::Retention(r), bypass)
            .await
            .map_err(to_s3)?;
        Ok(S3Response::new(PutObjectRetentionOutput::default()))
    }

    async fn get_object_retention(
        &self,
        req: S3Request<GetObjectRetentionInput>,
    ) -> S3Result<S3Response<GetObjectRetentionOutput>> {
        let i = req.input;
        let m = self.locked_version(&i.bucket, &i.key, i.version_id.as_deref()).await?;
        let retention = crate::lock::retention_dto(m.retention).ok_or_else(|| {
            s3_error!(NoSuchObjectLockConfiguration, "The specified object does not have a retention")
        })?;
        Ok(S3Response::new(GetObjectRetentionOutput { retention: Some(retention) }))
    }

    async fn put_object_legal_hold(
        &self,
        req: S3Request<PutObjectLegalHoldInput>,
    ) -> S3Result<S3Response<PutObjectLegalHoldOutput>> {
        let i = req.input;
        let on = crate::lock::legal_hold_on(&i.legal_hold)?;
        self.layer
            .change_object_lock(&i.bucket, &i.key, i.version_id.as_deref(), LockChange::LegalHold(on), false)
            .await
            .map_err(to_s3)?;
        Ok(S3Response::new(PutObjectLegalHoldOutput::default()))
    }

    async fn get_object_legal_hold(
        &self,
        req: S3Request<GetObjectLegalHoldInput>,
    ) -> S3Result<S3Response<GetObjectLegalHoldOutput>> {
        let i = req.input;
        let m = self.locked_version(&i.bucket, &i.key, i.version_id.as_deref()).await?;
        Ok(S3Response::new(GetObjectLegalHoldOutput { legal_hold: Some(crate::lock::legal_hold_dto(m.legal_hold)) }))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let i = req.input;
        let c = i.versioning_configuration;
        if c.mfa_delete.as_ref().is_some_and(|m| m.as_str() == "Enabled") {
            return Err(s3_error!(NotImplemented, "MFA delete is not supported"));
        }
        let v = match c.status.as_ref().map(|s| s.as_str()) {
            Some("Enabled") => Versioning::Enabled,
            Some("Suspended") => Versioning::Suspended,
            _ => return Err(s3_error!(MalformedXML, "the versioning status must be Enabled or Suspended")),
        };
        self.layer.put_bucket_versioning(&i.bucket, v).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketVersioningOutput {}))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let b = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let status = match b.versioning {
            Versioning::Unversioned => None,
            Versioning::Enabled => Some(BucketVersioningStatus::from_static(BucketVersioningStatus::ENABLED)),
            Versioning::Suspended => Some(BucketVersioningStatus::from_static(BucketVersioningStatus::SUSPENDED)),
        };
        Ok(S3Response::new(GetBucketVersioningOutput { status, mfa_delete: None }))
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let i = req.input;
        let url = i.encoding_type.as_ref().is_some_and(|e| e.as_str() == "url");
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let version_id_marker = i.version_id_marker.clone().filter(|v| !v.is_empty());
        if version_id_marker.is_some() && key_marker.is_empty() {
            return Err(s3_error!(InvalidArgument, "A version-id marker cannot be specified without a key marker"));
        }
        let q = VersionQuery {
            prefix: i.prefix.clone().unwrap_or_default(),
            delimiter: delimiter_of(&i.delimiter),
            key_marker,
            version_id_marker,
            max_keys: max_keys(i.max_keys)?,
        };
        let page = self.layer.list_object_versions(&i.bucket, &q).await.map_err(to_s3)?;
        let enc = |s: String| if url { encode_url(&s) } else { s };
        let mut versions = Vec::new();
        let mut markers = Vec::new();
        for v in page.versions {
            let version_id = Some(v.version_id.unwrap_or_else(|| "null".into()));
            if v.delete_marker {
                markers.push(DeleteMarkerEntry {
                    is_latest: Some(v.is_latest),
                    key: Some(enc(v.key)),
                    last_modified: Some(ts(v.last_modified_unix_ms)),
                    owner: Some(owner()),
                    version_id,
                });
            } else {
                versions.push(ObjectVersion {
                    e_tag: Some(etag_of(&v.etag)),
                    is_latest: Some(v.is_latest),
                    key: Some(enc(v.key)),
                    last_modified: Some(ts(v.last_modified_unix_ms)),
                    owner: Some(owner()),
                    size: Some(v.size_bytes as i64),
                    storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
                    version_id,
                    ..Default::default()
                });
            }
        }
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(i.bucket),
            prefix: Some(enc(q.prefix.clone())),
            key_marker: Some(enc(q.key_marker.clone())),
            version_id_marker: Some(q.version_id_marker.clone().unwrap_or_default()),
            max_keys: Some(q.max_keys as i32),
            is_truncated: Some(page.next_key_marker.is_some()),
            next_key_marker: page.next_key_marker.map(enc),
            next_version_id_marker: page.next_version_id_marker,
            delimiter: q.delimiter.clone().map(enc),
            encoding_type: i.encoding_type,
            versions: Some(versions),
            delete_markers: Some(markers),
            common_prefixes: Some(
                page.common_prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect(),
            ),
            ..Default::default()
        }))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let i = req.input;
        let tags = self.layer.get_tags(&i.bucket, &i.key, i.version_id.as_deref()).await.map_err(to_s3)?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect(),
            version_id: i.version_id,
        }))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let i = req.input;
        let mut tags = Vec::new();
        for t in i.tagging.tag_set {
            let k = t.key.ok_or_else(|| s3_error!(InvalidTag, "a tag needs a key"))?;
            if tags.iter().any(|(x, _): &(String, String)| *x == k) {
                return Err(s3_error!(InvalidTag, "duplicate tag key {k}"));
            }
            tags.push((k, t.value.unwrap_or_default()));
        }
        self.layer.put_tags(&i.bucket, &i.key, i.version_id.as_deref(), tags).await.map_err(|e| match e {
            LayerError::InvalidArgument(m) => s3_error!(InvalidTag, "{m}"),
            e => to_s3(e),
        })?;
        Ok(S3Response::new(PutObjectTaggingOutput { version_id: i.version_id }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let i = req.input;
        self.layer.put_tags(&i.bucket, &i.key, i.version_id.as_deref(), Vec::new()).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteObjectTaggingOutput { version_id: i.version_id }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = req.input;
        let mut opts = put_options(
            i.content_type,
            i.content_encoding,
            i.content_disposition,
            i.content_language,
            i.cache_control,
            &i.expires,
            i.metadata,
        );
        opts.checksum_algorithm = i.checksum_algorithm.as_ref().map(|a| a.as_str().to_string());
        opts.checksum_type = i.checksum_type.as_ref().map(|t| t.as_str().to_string());
        opts.tags = tagging_header(&i.tagging)?;
        opts.lock = crate::lock::lock_request(
            &i.object_lock_mode,
            &i.object_lock_retain_until_date,
            &i.object_lock_legal_hold_status,
        )?;
        let id = self.layer.create_multipart(&i.bucket, &i.key, opts.clone()).await.map_err(to_s3)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            checksum_algorithm: i.checksum_algorithm,
            checksum_type: i.checksum_type,
            ..Default::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let exp = body_expectations!(req)?;
        let i = req.input;
        if i.part_number < 1 {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        let body = verified_body(layer_stream(i.body), exp).map_err(to_s3)?;
        let p =
            self.layer.upload_part(&i.bucket, &i.key, &i.upload_id, i.part_number as u32, body).await.map_err(to_s3)?;
        let c = checksums_of_list(&p.checksums);
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag_of(&p.etag)),
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            ..Default::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let i = req.input;
        if i.part_number < 1 {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        let (src_bucket, src_key, src_version) = copy_source(&i.copy_source)?;
        let range = match &i.copy_source_range {
            Some(r) => {
                let parsed = Range::parse(r).map_err(|_| s3_error!(InvalidArgument, "bad x-amz-copy-source-range"))?;
                match parsed {
                    Range::Int { first, last: Some(last) } => Some(RangeRequest::FromTo { first, last: Some(last) }),
                    _ => return Err(s3_error!(InvalidArgument, "x-amz-copy-source-range must be bytes=first-last")),
                }
            }
            None => None,
        };
        let mut pre = precondition(
            &i.copy_source_if_match,
            &i.copy_source_if_none_match,
            &i.copy_source_if_modified_since,
            &i.copy_source_if_unmodified_since,
        );
        pre.for_copy_source = true;
        let p = self
            .layer
            .upload_part_copy(
                &i.bucket,
                &i.key,
                &i.upload_id,
                i.part_number as u32,
                &src_bucket,
                &src_key,
                src_version.as_deref(),
                range,
                &pre,
            )
            .await
            .map_err(to_s3)?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag_of(&p.etag)),
                last_modified: Some(ts(p.last_modified_unix_ms)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let i = req.input;
        let parts: Vec<CompletePart> = i
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let n = p.part_number.filter(|n| (1..=10_000).contains(n));
                let n = n.ok_or_else(|| s3_error!(InvalidPart, "part numbers are 1 to 10000"))?;
                let etag = match p.e_tag {
                    Some(ETag::Strong(s)) | Some(ETag::Weak(s)) => s,
                    None => return Err(s3_error!(InvalidPart, "part {n} has no ETag")),
                };
                Ok(CompletePart { part_number: n as u32, etag })
            })
            .collect::<S3Result<_>>()?;
        if parts.is_empty() {
            return Err(s3_error!(MalformedXML, "CompleteMultipartUpload needs at least one part"));
        }
        let pre = Precondition {
            if_match: i.if_match.as_ref().map(cond_str),
            if_none_match: i.if_none_match.as_ref().map(cond_str),
            ..Default::default()
        };
        // Composite checksum of the parts, when the upload asked for one.
        let listed = match self.layer.list_parts(&i.bucket, &i.key, &i.upload_id).await {
            Ok(l) => l,
            // Completed already (a retried completion): the layer answers it from the object.
            Err(LayerError::NoSuchUpload) => Vec::new(),
            Err(e) => return Err(to_s3(e)),
        };
        let asked = self.layer.upload_options(&i.bucket, &i.key, &i.upload_id).await.ok().and_then(|o| o.checksum_type);
        let full_object = asked.as_deref() == Some("FULL_OBJECT");
        let extra = crate::multipart::composite_checksum(&listed, &parts, full_object);
        let m =
            self.layer.complete_multipart(&i.bucket, &i.key, &i.upload_id, parts, &pre, extra).await.map_err(to_s3)?;
        let c = checksums(&m.checksums, true);
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            e_tag: Some(etag_of(&m.etag)),
            location: Some(format!("/{}/{}", i.bucket, i.key)),
            version_id: version_header(&m),
            checksum_crc32: c.crc32,
            checksum_crc32c: c.crc32c,
            checksum_crc64nvme: c.crc64nvme,
            checksum_sha1: c.sha1,
            checksum_sha256: c.sha256,
            checksum_type: c.kind,
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = req.input;
        self.layer.abort_multipart(&i.bucket, &i.key, &i.upload_id).await.map_err(to_s3)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let i = req.input;
        let parts = self.layer.list_parts(&i.bucket, &i.key, &i.upload_id).await.map_err(to_s3)?;
        let marker = i.part_number_marker.unwrap_or(0).max(0) as u32;
        let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let after: Vec<_> = parts.into_iter().filter(|p| p.part_number > marker).collect();
        let truncated = after.len() > max;
        let page: Vec<_> = after.into_iter().take(max).collect();
        let next = if truncated { page.last().map(|p| p.part_number as i32) } else { None };
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            part_number_marker: Some(marker as i32),
            next_part_number_marker: next,
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            owner: Some(owner()),
            parts: Some(
                page.into_iter()
                    .map(|p| {
                        let c = checksums_of_list(&p.checksums);
                        Part {
                            part_number: Some(p.part_number as i32),
                            size: Some(p.size_bytes as i64),
                            e_tag: Some(etag_of(&p.etag)),
                            last_modified: Some(ts(p.last_modified_unix_ms)),
                            checksum_crc32: c.crc32,
                            checksum_crc32c: c.crc32c,
                            checksum_crc64nvme: c.crc64nvme,
                            checksum_sha1: c.sha1,
                            checksum_sha256: c.sha256,
                        }
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let uploads = self.layer.list_uploads(&i.bucket, &prefix).await.map_err(to_s3)?;
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        let max = i.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
        let after: Vec<_> = uploads
            .into_iter()
            .filter(|u| key_marker.is_empty() || u.key > key_marker || (u.key == key_marker && u.upload_id > id_marker))
            .collect();
        let truncated = after.len() > max;
        let page: Vec<_> = after.into_iter().take(max).collect();
        let (next_key, next_id) = match (truncated, page.last()) {
            (true, Some(u)) => (Some(u.key.clone()), Some(u.upload_id.clone())),
            _ => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: Some(prefix),
            key_marker: i.key_marker,
            upload_id_marker: i.upload_id_marker,
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            uploads: Some(
                page.into_iter()
                    .map(|u| MultipartUpload {
                        key: Some(u.key),
                        upload_id: Some(u.upload_id),
                        initiated: Some(ts(u.initiated_unix_ms)),
                        owner: Some(owner()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }
}

/// A listing's delimiter: an empty one is no delimiter (S3 neither groups by it nor echoes it).
fn delimiter_of(d: &Option<String>) -> Option<String> {
    d.clone().filter(|d| !d.is_empty())
}
