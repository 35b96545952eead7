//! The S3 operations: s3s parses and authenticates requests; this module turns them into ObjectLayer calls
//! and the layer's answers into S3 responses.

use crate::access::KeyRing;
use crate::checksum::{Algo, Expectations, verified_body};
use crate::errors::to_s3;
use crate::sse::{copy_source_customer_headers, customer_headers};
use futures::StreamExt;
use mosaic_layer::{
    AclGrant, ObjectAccess, ObjectOwnership as Ownership, Permission as AclPermission, PublicAccessBlock,
};
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
/// Largest max-buckets of one ListBuckets page (S3's limit).
const MAX_LIST_BUCKETS: i32 = 10_000;

#[derive(Clone)]
pub struct MosaicS3 {
    layer: Arc<dyn ObjectLayer>,
    /// Who owns what a request creates, and which buckets a key sees in ListBuckets.
    keys: Arc<KeyRing>,
    /// SSE-C keys accepted over plain HTTP (else refused: a key sent in the clear is no secret).
    sse_c_over_http: bool,
}

impl MosaicS3 {
    pub fn new(layer: Arc<dyn ObjectLayer>, keys: Arc<KeyRing>, sse_c_over_http: bool) -> Self {
        MosaicS3 { layer, keys, sse_c_over_http }
    }

    /// The SSE-C key of a request's headers, if any.
    /// An SSE-C key of a request: accepted over TLS, and over plain HTTP only when configured so.
    fn customer_key(
        &self,
        extensions: &http::Extensions,
        h: &crate::sse::CustomerHeaders<'_>,
    ) -> S3Result<Option<mosaic_layer::CustomerKey>> {
        let secure = extensions.get::<crate::access::SecureTransport>().is_some();
        crate::sse::customer_key(h, secure || self.sse_c_over_http)
    }

    /// The encryption headers of a part's answer: its upload's.
    async fn upload_echo(&self, bucket: &str, key: &str, upload_id: &str) -> S3Result<crate::sse::Echo> {
        let opts = self.layer.upload_options(bucket, key, upload_id).await.map_err(to_s3)?;
        Ok(crate::sse::echo(opts.sse_sealed.as_ref()))
    }

    /// x-amz-expiration of the current version `meta` (none for a version asked by id). A hint: a failure to
    /// work it out leaves the header out rather than failing the request.
    async fn expiration(
        &self,
        bucket: &str,
        key: &str,
        meta: &ObjectMeta,
        version_asked: Option<&str>,
    ) -> Option<String> {
        if version_asked.is_some() {
            return None;
        }
        match self.layer.expiration_of(bucket, key, meta).await {
            Ok(e) => e.as_ref().and_then(expiration_header),
            Err(err) => {
                tracing::debug!(bucket, key, error = %err, "x-amz-expiration left out");
                None
            }
        }
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
        if let Ok(m) = self.layer.object_meta_unchecked(bucket, key, version).await {
            let mut h = http::HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_str(&format!("\"{}\"", m.etag)) {
                h.insert(http::header::ETAG, v);
            }
            if let Some(v) = http_date(m.last_modified_unix_ms).and_then(|s| http::HeaderValue::from_str(&s).ok()) {
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
        self.layer.object_meta_unchecked(bucket, key, version).await.map_err(to_s3)
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

/// x-amz-grant-write of an object write (kept in its ACL, as S3 lists it; WRITE means nothing on an object).
fn grant_write_header(headers: &http::HeaderMap) -> Option<String> {
    headers.get("x-amz-grant-write").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// BlockPublicAcls: a public ACL on the bucket or one of its objects is refused.
fn refuse_public_acl(info: &mosaic_layer::BucketInfo, acl: Option<&[AclGrant]>) -> S3Result<()> {
    let blocked = info.public_access_block.is_some_and(|b| b.block_public_acls);
    if blocked && acl.unwrap_or_default().iter().any(|g| g.is_public()) {
        return Err(s3_error!(AccessDenied, "the bucket's public access block refuses public ACLs"));
    }
    Ok(())
}

fn ownership_of(o: &ObjectOwnership) -> S3Result<Ownership> {
    match o.as_str() {
        ObjectOwnership::BUCKET_OWNER_ENFORCED => Ok(Ownership::BucketOwnerEnforced),
        ObjectOwnership::BUCKET_OWNER_PREFERRED => Ok(Ownership::BucketOwnerPreferred),
        ObjectOwnership::OBJECT_WRITER => Ok(Ownership::ObjectWriter),
        other => Err(s3_error!(InvalidArgument, "unknown object ownership {other}")),
    }
}

fn ownership_dto(o: Ownership) -> ObjectOwnership {
    ObjectOwnership::from_static(match o {
        Ownership::BucketOwnerEnforced => ObjectOwnership::BUCKET_OWNER_ENFORCED,
        Ownership::BucketOwnerPreferred => ObjectOwnership::BUCKET_OWNER_PREFERRED,
        Ownership::ObjectWriter => ObjectOwnership::OBJECT_WRITER,
    })
}

/// BucketOwnerEnforced: ACLs are disabled (only bucket-owner-full-control is accepted, as S3 does).
fn acls_disabled() -> s3s::S3Error {
    s3_error!(AccessControlListNotSupported, "The bucket does not allow ACLs")
}

fn public_access_block_dto(b: PublicAccessBlock) -> PublicAccessBlockConfiguration {
    PublicAccessBlockConfiguration {
        block_public_acls: Some(b.block_public_acls),
        block_public_policy: Some(b.block_public_policy),
        ignore_public_acls: Some(b.ignore_public_acls),
        restrict_public_buckets: Some(b.restrict_public_buckets),
    }
}

/// The x-amz-grant-* headers of a request, by the permission each grants.
type GrantHeaders<'a> = [(Option<&'a str>, AclPermission); 5];

fn grant_headers<'a>(
    read: &'a Option<String>,
    write: &'a Option<String>,
    read_acp: &'a Option<String>,
    write_acp: &'a Option<String>,
    full_control: &'a Option<String>,
) -> GrantHeaders<'a> {
    [
        (read.as_deref(), AclPermission::Read),
        (write.as_deref(), AclPermission::Write),
        (read_acp.as_deref(), AclPermission::ReadAcp),
        (write_acp.as_deref(), AclPermission::WriteAcp),
        (full_control.as_deref(), AclPermission::FullControl),
    ]
}

impl MosaicS3 {
    /// The Owner element of an owner's canonical id.
    fn owner_dto(&self, id: &str) -> Owner {
        Owner { id: Some(id.to_string()), display_name: self.keys.display_name(id) }
    }

    /// The canonical id of a bucket's owner.
    async fn bucket_owner_id(&self, bucket: &str) -> S3Result<String> {
        let info = self.layer.bucket_info(bucket).await.map_err(to_s3)?;
        Ok(self.keys.owner_id(info.owner.as_deref()))
    }

    /// The grants a request asks for with x-amz-acl or x-amz-grant-* (not both), as stored (None: private).
    fn requested_acl(
        &self,
        canned: Option<&str>,
        grants: GrantHeaders<'_>,
        owner_id: &str,
        bucket_owner_id: &str,
    ) -> S3Result<Option<Option<Vec<AclGrant>>>> {
        let from_headers = crate::acl::from_headers(grants, &|id| self.keys.knows_id(id))?;
        let grants = match (canned, from_headers) {
            (Some(_), Some(_)) => {
                return Err(s3_error!(InvalidRequest, "x-amz-acl and x-amz-grant-* headers cannot be used together"));
            }
            (Some(c), None) => crate::acl::canned(c, owner_id, bucket_owner_id)?,
            (None, Some(g)) => g,
            (None, None) => return Ok(None),
        };
        Ok(Some(crate::acl::stored(grants, owner_id)))
    }

    /// The owner and ACL of an object a request writes into `bucket`. The root key's writes and the bucket
    /// owner's are the bucket owner's; another key's are its own; an anonymous writer's are anonymous's.
    async fn written_access(
        &self,
        creds: &Option<s3s::auth::Credentials>,
        bucket: &str,
        canned: Option<&str>,
        grants: GrantHeaders<'_>,
    ) -> S3Result<ObjectAccess> {
        let writer = creds.as_ref().map(|c| c.access_key.as_str());
        let by_root = writer.is_some_and(|k| self.is_root(k));
        if by_root && canned.is_none() && grants.iter().all(|(h, _)| h.is_none()) {
            return Ok(ObjectAccess::default());
        }
        let info = self.layer.bucket_info(bucket).await.map_err(to_s3)?;
        let bucket_owner_id = self.keys.owner_id(info.owner.as_deref());
        let writer_id = match writer {
            Some(_) if by_root => bucket_owner_id.clone(),
            Some(k) => crate::acl::canonical_id(k),
            None => crate::acl::ANONYMOUS_ID.to_string(),
        };
        let to_bucket_owner = canned == Some("bucket-owner-full-control");
        match info.object_ownership {
            Some(Ownership::BucketOwnerEnforced) => {
                let headers = grants.iter().any(|(h, _)| h.is_some());
                if headers || canned.is_some_and(|c| c != "bucket-owner-full-control") {
                    return Err(acls_disabled());
                }
                return Ok(ObjectAccess::default());
            }
            Some(Ownership::BucketOwnerPreferred) if to_bucket_owner => return Ok(ObjectAccess::default()),
            _ => {}
        }
        let acl = self.requested_acl(canned, grants, &writer_id, &bucket_owner_id)?.flatten();
        refuse_public_acl(&info, acl.as_deref())?;
        Ok(ObjectAccess { owner_id: (writer_id != bucket_owner_id).then_some(writer_id), acl })
    }

    /// The grants of a PutBucketAcl or PutObjectAcl: a canned ACL, grant headers, or a policy document.
    fn acl_of_put(
        &self,
        canned: Option<&str>,
        grants: GrantHeaders<'_>,
        policy: Option<AccessControlPolicy>,
        owner_id: &str,
        bucket_owner_id: &str,
    ) -> S3Result<Option<Vec<AclGrant>>> {
        let requested = self.requested_acl(canned, grants, owner_id, bucket_owner_id)?;
        match (requested, policy) {
            (Some(_), Some(_)) => {
                Err(s3_error!(UnexpectedContent, "an ACL is given either in headers or in the request body, not both"))
            }
            (Some(acl), None) => Ok(acl),
            (None, Some(p)) => {
                let g = crate::acl::from_policy(p, owner_id, &|id| self.keys.knows_id(id))?;
                Ok(crate::acl::stored(g, owner_id))
            }
            (None, None) => Err(s3_error!(MissingSecurityHeader, "an ACL needs x-amz-acl, x-amz-grant-* or a body")),
        }
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

/// The Content-Encoding an object keeps: as given, without aws-chunked (a transfer detail, not the
/// object's encoding); None when nothing else is left.
fn stored_content_encoding(given: &str) -> Option<String> {
    if !given.split(',').any(|p| p.trim().eq_ignore_ascii_case("aws-chunked")) {
        return Some(given.to_string()).filter(|e| !e.trim().is_empty());
    }
    let kept: Vec<&str> =
        given.split(',').map(str::trim).filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("aws-chunked")).collect();
    (!kept.is_empty()).then(|| kept.join(", "))
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
        content_encoding: content_encoding.as_deref().and_then(stored_content_encoding),
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

/// The checksums of part `part` (1-based) of a multipart object: its own value in the object's algorithm
/// and the object's checksum type; none when the parts carried no checksum.
fn part_checksums(m: &ObjectMeta, part: u32, enabled: bool) -> Checksums {
    let algo = m.checksums.keys().find(|k| k.as_str() != "TYPE");
    let value = part.checked_sub(1).and_then(|i| m.part_checksums.get(i as usize));
    let mut sums = std::collections::BTreeMap::new();
    if let (Some(algo), Some(value)) = (algo, value) {
        sums.insert(algo.clone(), value.clone());
        if let Some(kind) = m.checksums.get("TYPE") {
            sums.insert("TYPE".to_string(), kind.clone());
        }
    }
    checksums(&sums, enabled)
}

/// The checksums a request names (x-amz-checksum-*, or a completed part's fields), by algorithm name.
macro_rules! named_checksums {
    ($x:expr) => {
        [
            (Algo::Crc32, &$x.checksum_crc32),
            (Algo::Crc32c, &$x.checksum_crc32c),
            (Algo::Crc64Nvme, &$x.checksum_crc64nvme),
            (Algo::Sha1, &$x.checksum_sha1),
            (Algo::Sha256, &$x.checksum_sha256),
        ]
        .into_iter()
        .filter_map(|(a, v)| v.clone().map(|v| (a.name(), v)))
        .collect::<Vec<(&'static str, String)>>()
    };
}

/// A checksum value without a composite's "-N" suffix (base64 has no '-').
fn without_part_count(v: &str) -> &str {
    v.rsplit_once('-').filter(|(_, n)| n.parse::<u32>().is_ok()).map_or(v, |(b, _)| b)
}

/// CompleteMultipartUpload's checks of the checksums it names: each part's must be the one the part was
/// stored with (InvalidPart), the object's must be the one its parts make (BadDigest).
fn check_completion_checksums(
    listed: &[mosaic_layer::PartInfo],
    named_per_part: &[(u32, Vec<(&'static str, String)>)],
    named_whole: &[(&'static str, String)],
    computed: &[(String, String)],
) -> S3Result<()> {
    for (n, named) in named_per_part {
        let Some(stored) = listed.iter().find(|l| l.part_number == *n) else { continue };
        for (algo, v) in named {
            let kept = stored.checksums.iter().find(|(a, _)| a == algo);
            if kept.is_some_and(|(_, s)| s != v) {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n}: the {algo} checksum is not the one the part was uploaded with"
                ));
            }
        }
    }
    for (algo, v) in named_whole {
        match computed.iter().find(|(a, _)| a == algo) {
            Some((_, c)) if without_part_count(c) == without_part_count(v) => {}
            Some(_) => {
                return Err(s3_error!(BadDigest, "The {algo} checksum given does not match the parts' checksum"));
            }
            None => {
                return Err(s3_error!(BadDigest, "The parts carry no {algo} checksum to check the one given against"));
            }
        }
    }
    Ok(())
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
/// An HTTP date ("Fri, 23 Dec 2012 00:00:00 GMT") of a time in ms since the epoch.
fn http_date(unix_ms: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp(unix_ms.div_euclid(1000)).ok()?;
    let s = t.format(&time::format_description::well_known::Rfc2822).ok()?;
    Some(s.replace("+0000", "GMT"))
}

/// x-amz-expiration's value: `expiry-date="...", rule-id="..."`. A rule id may hold any character XML
/// allows; in the header, what is not visible ASCII (and the quote and backslash) is percent-encoded.
fn expiration_header(e: &mosaic_layer::ObjectExpiration) -> Option<String> {
    let date = http_date(e.date_unix_ms)?;
    let mut id = String::with_capacity(e.rule_id.len());
    for b in e.rule_id.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' && b != b'%' {
            id.push(b as char);
        } else {
            id.push_str(&format!("%{b:02X}"));
        }
    }
    Some(format!("expiry-date=\"{date}\", rule-id=\"{id}\""))
}

fn version_header(m: &ObjectMeta) -> Option<String> {
    m.version_id.clone()
}

/// A page of a multipart object's parts for GetObjectAttributes (numbers after `marker`, at most
/// `max_parts`, 1,000 by default).
fn object_parts(m: &ObjectMeta, marker: Option<i32>, max_parts: Option<i32>) -> S3Result<GetObjectAttributesParts> {
    let sizes = &m.part_sizes;
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
        .map(|(n, s)| {
            let c = part_checksums(m, n as u32, true);
            ObjectPart {
                part_number: Some(n),
                size: Some(s as i64),
                checksum_crc32: c.crc32,
                checksum_crc32c: c.crc32c,
                checksum_crc64nvme: c.crc64nvme,
                checksum_sha1: c.sha1,
                checksum_sha256: c.sha256,
            }
        })
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
        let owner_id = self.keys.owner_id(owner.as_deref());
        let grants = grant_headers(
            &input.grant_read,
            &input.grant_write,
            &input.grant_read_acp,
            &input.grant_write_acp,
            &input.grant_full_control,
        );
        let canned = input.acl.as_ref().map(|a| a.as_str());
        let acl = self.requested_acl(canned, grants, &owner_id, &owner_id)?.flatten();
        let object_ownership = input.object_ownership.as_ref().map(ownership_of).transpose()?;
        if object_ownership == Some(Ownership::BucketOwnerEnforced) && acl.is_some() {
            return Err(s3_error!(InvalidBucketAclWithObjectOwnership, "ACLs are disabled by BucketOwnerEnforced"));
        }
        let opts = BucketOptions {
            owner: owner.clone(),
            object_lock: input.object_lock_enabled_for_bucket.unwrap_or(false),
            acl,
            object_ownership,
        };
        match self.layer.create_bucket(&input.bucket, Some(&opts)).await {
            Ok(()) => {}
            // As S3 in us-east-1: creating again a bucket one owns succeeds (with the ACL it has); another's
            // is taken.
            Err(LayerError::BucketExists) => {
                let existing = self.layer.bucket_info(&input.bucket).await.map_err(to_s3)?;
                if existing.owner != owner || existing.acl != opts.acl {
                    return Err(s3_error!(BucketAlreadyExists));
                }
            }
            Err(e) => return Err(to_s3(e)),
        }
        Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{}", input.bucket)) }))
    }

    async fn put_bucket_policy(
        &self,
        req: S3Request<PutBucketPolicyInput>,
    ) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        let i = req.input;
        let policy =
            crate::policy::Policy::parse(&i.policy, &i.bucket).map_err(|m| s3_error!(MalformedPolicy, "{m}"))?;
        let info = self.layer.bucket_info(&i.bucket).await.map_err(to_s3)?;
        if info.public_access_block.is_some_and(|b| b.block_public_policy) && policy.is_public() {
            return Err(s3_error!(AccessDenied, "the bucket's public access block refuses public policies"));
        }
        self.layer.put_bucket_policy(&i.bucket, Some(i.policy)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketPolicyOutput {}))
    }

    async fn get_bucket_policy(
        &self,
        req: S3Request<GetBucketPolicyInput>,
    ) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let Some(policy) = info.policy else {
            return Err(s3_error!(NoSuchBucketPolicy, "The bucket policy does not exist"));
        };
        Ok(S3Response::new(GetBucketPolicyOutput { policy: Some(policy) }))
    }

    async fn delete_bucket_policy(
        &self,
        req: S3Request<DeleteBucketPolicyInput>,
    ) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        self.layer.put_bucket_policy(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketPolicyOutput {}))
    }

    async fn get_bucket_policy_status(
        &self,
        req: S3Request<GetBucketPolicyStatusInput>,
    ) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
        let bucket = req.input.bucket;
        let info = self.layer.bucket_info(&bucket).await.map_err(to_s3)?;
        // Public by its policy or by its ACL (grants to everyone or every signed request).
        let by_policy = info
            .policy
            .as_deref()
            .is_some_and(|t| crate::policy::Policy::parse(t, &bucket).is_ok_and(|p| p.is_public()));
        let by_acl = info.acl.as_deref().unwrap_or_default().iter().any(|g| g.is_public());
        let public = by_policy || by_acl;
        let status = PolicyStatus { is_public: Some(public) };
        Ok(S3Response::new(GetBucketPolicyStatusOutput { policy_status: Some(status) }))
    }

    async fn put_bucket_ownership_controls(
        &self,
        req: S3Request<PutBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<PutBucketOwnershipControlsOutput>> {
        let i = req.input;
        let [rule] = i.ownership_controls.rules.as_slice() else {
            return Err(s3_error!(MalformedXML, "ownership controls have exactly one rule"));
        };
        let ownership = ownership_of(&rule.object_ownership)?;
        let info = self.layer.bucket_info(&i.bucket).await.map_err(to_s3)?;
        if ownership == Ownership::BucketOwnerEnforced && info.acl.is_some() {
            return Err(s3_error!(
                InvalidBucketAclWithObjectOwnership,
                "Bucket ACLs other than private are not compatible with BucketOwnerEnforced"
            ));
        }
        self.layer.put_object_ownership(&i.bucket, Some(ownership)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketOwnershipControlsOutput {}))
    }

    async fn get_bucket_ownership_controls(
        &self,
        req: S3Request<GetBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<GetBucketOwnershipControlsOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let Some(o) = info.object_ownership else {
            return Err(s3_error!(OwnershipControlsNotFoundError, "The bucket ownership controls were not found"));
        };
        let rules = vec![OwnershipControlsRule { object_ownership: ownership_dto(o) }];
        Ok(S3Response::new(GetBucketOwnershipControlsOutput { ownership_controls: Some(OwnershipControls { rules }) }))
    }

    async fn delete_bucket_ownership_controls(
        &self,
        req: S3Request<DeleteBucketOwnershipControlsInput>,
    ) -> S3Result<S3Response<DeleteBucketOwnershipControlsOutput>> {
        self.layer.put_object_ownership(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketOwnershipControlsOutput {}))
    }

    async fn put_public_access_block(
        &self,
        req: S3Request<PutPublicAccessBlockInput>,
    ) -> S3Result<S3Response<PutPublicAccessBlockOutput>> {
        let c = req.input.public_access_block_configuration;
        let block = PublicAccessBlock {
            block_public_acls: c.block_public_acls.unwrap_or(false),
            ignore_public_acls: c.ignore_public_acls.unwrap_or(false),
            block_public_policy: c.block_public_policy.unwrap_or(false),
            restrict_public_buckets: c.restrict_public_buckets.unwrap_or(false),
        };
        self.layer.put_public_access_block(&req.input.bucket, Some(block)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutPublicAccessBlockOutput {}))
    }

    async fn get_public_access_block(
        &self,
        req: S3Request<GetPublicAccessBlockInput>,
    ) -> S3Result<S3Response<GetPublicAccessBlockOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let Some(block) = info.public_access_block else {
            let mut e = s3s::S3Error::with_message(
                s3s::S3ErrorCode::Custom("NoSuchPublicAccessBlockConfiguration".into()),
                "The public access block configuration was not found",
            );
            e.set_status_code(http::StatusCode::NOT_FOUND);
            return Err(e);
        };
        Ok(S3Response::new(GetPublicAccessBlockOutput {
            public_access_block_configuration: Some(public_access_block_dto(block)),
        }))
    }

    async fn delete_public_access_block(
        &self,
        req: S3Request<DeletePublicAccessBlockInput>,
    ) -> S3Result<S3Response<DeletePublicAccessBlockOutput>> {
        self.layer.put_public_access_block(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeletePublicAccessBlockOutput {}))
    }

    async fn put_bucket_encryption(
        &self,
        req: S3Request<PutBucketEncryptionInput>,
    ) -> S3Result<S3Response<PutBucketEncryptionOutput>> {
        let i = req.input;
        let e = crate::sse::bucket_encryption_from_dto(i.server_side_encryption_configuration)?;
        self.layer.put_bucket_encryption(&i.bucket, Some(e)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketEncryptionOutput::default()))
    }

    async fn get_bucket_encryption(
        &self,
        req: S3Request<GetBucketEncryptionInput>,
    ) -> S3Result<S3Response<GetBucketEncryptionOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let Some(e) = info.encryption else {
            let mut err = s3_error!(
                ServerSideEncryptionConfigurationNotFoundError,
                "The server side encryption configuration was not found"
            );
            err.set_status_code(http::StatusCode::NOT_FOUND);
            return Err(err);
        };
        Ok(S3Response::new(GetBucketEncryptionOutput {
            server_side_encryption_configuration: Some(crate::sse::bucket_encryption_to_dto(&e)),
        }))
    }

    async fn delete_bucket_encryption(
        &self,
        req: S3Request<DeleteBucketEncryptionInput>,
    ) -> S3Result<S3Response<DeleteBucketEncryptionOutput>> {
        self.layer.put_bucket_encryption(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketEncryptionOutput::default()))
    }

    async fn put_bucket_cors(&self, req: S3Request<PutBucketCorsInput>) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let i = req.input;
        let rules = crate::cors::from_dto(i.cors_configuration);
        self.layer.put_bucket_cors(&i.bucket, Some(rules)).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketCorsOutput {}))
    }

    async fn get_bucket_cors(&self, req: S3Request<GetBucketCorsInput>) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let Some(rules) = info.cors else {
            return Err(s3_error!(NoSuchCORSConfiguration, "The CORS configuration does not exist"));
        };
        Ok(S3Response::new(GetBucketCorsOutput { cors_rules: Some(crate::cors::to_dto(rules)) }))
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        self.layer.put_bucket_cors(&req.input.bucket, None).await.map_err(to_s3)?;
        Ok(S3Response::new(DeleteBucketCorsOutput {}))
    }

    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> S3Result<S3Response<GetBucketAclOutput>> {
        let info = self.layer.bucket_info(&req.input.bucket).await.map_err(to_s3)?;
        let owner_id = self.keys.owner_id(info.owner.as_deref());
        let grants = info.acl.unwrap_or_else(|| crate::acl::private(&owner_id));
        let (owner, grants) = crate::acl::to_dto(&grants, &owner_id, &|id| self.keys.display_name(id));
        Ok(S3Response::new(GetBucketAclOutput { owner: Some(owner), grants: Some(grants) }))
    }

    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> S3Result<S3Response<PutBucketAclOutput>> {
        let i = req.input;
        let owner_id = self.bucket_owner_id(&i.bucket).await?;
        let grants =
            grant_headers(&i.grant_read, &i.grant_write, &i.grant_read_acp, &i.grant_write_acp, &i.grant_full_control);
        let canned = i.acl.as_ref().map(|a| a.as_str());
        let info = self.layer.bucket_info(&i.bucket).await.map_err(to_s3)?;
        if info.object_ownership == Some(Ownership::BucketOwnerEnforced) {
            return Err(acls_disabled());
        }
        let acl = self.acl_of_put(canned, grants, i.access_control_policy, &owner_id, &owner_id)?;
        refuse_public_acl(&info, acl.as_deref())?;
        self.layer.put_bucket_acl(&i.bucket, acl).await.map_err(to_s3)?;
        Ok(S3Response::new(PutBucketAclOutput {}))
    }

    async fn get_object_acl(&self, req: S3Request<GetObjectAclInput>) -> S3Result<S3Response<GetObjectAclOutput>> {
        let i = req.input;
        let version = i.version_id.as_deref();
        let meta = self.layer.object_meta_unchecked(&i.bucket, &i.key, version).await.map_err(to_s3)?;
        let owner_id = match meta.access.owner_id {
            Some(id) => id,
            None => self.bucket_owner_id(&i.bucket).await?,
        };
        let grants = meta.access.acl.unwrap_or_else(|| crate::acl::private(&owner_id));
        let (owner, grants) = crate::acl::to_dto(&grants, &owner_id, &|id| self.keys.display_name(id));
        Ok(S3Response::new(GetObjectAclOutput { owner: Some(owner), grants: Some(grants), ..Default::default() }))
    }

    async fn put_object_acl(&self, req: S3Request<PutObjectAclInput>) -> S3Result<S3Response<PutObjectAclOutput>> {
        let i = req.input;
        let version = i.version_id.as_deref();
        let meta = self.layer.object_meta_unchecked(&i.bucket, &i.key, version).await.map_err(to_s3)?;
        let info = self.layer.bucket_info(&i.bucket).await.map_err(to_s3)?;
        if info.object_ownership == Some(Ownership::BucketOwnerEnforced) {
            return Err(acls_disabled());
        }
        let bucket_owner_id = self.keys.owner_id(info.owner.as_deref());
        let owner_id = meta.access.owner_id.unwrap_or_else(|| bucket_owner_id.clone());
        let grants =
            grant_headers(&i.grant_read, &i.grant_write, &i.grant_read_acp, &i.grant_write_acp, &i.grant_full_control);
        let canned = i.acl.as_ref().map(|a| a.as_str());
        let acl = self.acl_of_put(canned, grants, i.access_control_policy, &owner_id, &bucket_owner_id)?;
        refuse_public_acl(&info, acl.as_deref())?;
        self.layer.put_object_acl(&i.bucket, &i.key, version, acl).await.map_err(to_s3)?;
        Ok(S3Response::new(PutObjectAclOutput { ..Default::default() }))
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
        // The region by name, as RGW answers (AWS leaves us-east-1 empty; clients read both as us-east-1).
        let region = BucketLocationConstraint::from_static("us-east-1");
        Ok(S3Response::new(GetBucketLocationOutput { location_constraint: Some(region) }))
    }

    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self.layer.list_buckets().await.map_err(to_s3)?;
        // Anonymous requesters own no bucket: they see none.
        let Some(requester) = req.credentials.as_ref().map(|c| c.access_key.clone()) else {
            let owner = Owner { id: Some(crate::acl::ANONYMOUS_ID.into()), display_name: None };
            return Ok(S3Response::new(ListBucketsOutput {
                buckets: Some(Vec::new()),
                owner: Some(owner),
                ..Default::default()
            }));
        };
        let i = &req.input;
        let max = match i.max_buckets {
            None => usize::MAX,
            Some(m) if (1..=MAX_LIST_BUCKETS).contains(&m) => m as usize,
            Some(_) => return Err(s3_error!(InvalidArgument, "max-buckets is 1 to {MAX_LIST_BUCKETS}")),
        };
        let after = match i.continuation_token.as_deref().filter(|t| !t.is_empty()) {
            Some(t) => crate::token::decode(t)
                .map_err(|_| s3_error!(InvalidArgument, "The continuation token provided is incorrect"))?,
            None => String::new(),
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        // list_buckets is in name order.
        let mut seen: Vec<_> = buckets
            .into_iter()
            .filter(|b| b.name.as_str() > after.as_str() && b.name.starts_with(&prefix))
            .filter(|b| self.keys.sees_bucket(&requester, &b.name, b.owner.as_deref()))
            .take(max.saturating_add(1))
            .collect();
        let next = (seen.len() > max).then(|| {
            seen.truncate(max);
            seen.last().map(|b| crate::token::encode(&b.name)).unwrap_or_default()
        });
        let buckets = seen
            .into_iter()
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: Some(ts(b.created_unix_ms)),
                bucket_region: Some("us-east-1".into()),
            })
            .collect();
        let owner = self.owner_dto(&crate::acl::canonical_id(&requester));
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner),
            continuation_token: next,
            prefix: i.prefix.clone(),
        }))
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
        let grant_write = grant_write_header(&req.headers);
        let grants = grant_headers(
            &input.grant_read,
            &grant_write,
            &input.grant_read_acp,
            &input.grant_write_acp,
            &input.grant_full_control,
        );
        let canned = input.acl.as_ref().map(|a| a.as_str());
        opts.access = self.written_access(&req.credentials, &input.bucket, canned, grants).await?;
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
        let customer = self.customer_key(&req.extensions, &customer_headers!(input))?;
        opts.sse =
            crate::sse::write_request(input.server_side_encryption.as_ref(), input.ssekms_key_id.as_deref(), customer)?;
        let body = verified_body(layer_stream(input.body), exp).map_err(to_s3)?;
        let meta = self.layer.put_object(&input.bucket, &input.key, body, opts).await.map_err(to_s3)?;
        let c = checksums(&meta.checksums, true);
        let e = crate::sse::echo(meta.sse.as_ref());
        let expiration = self.expiration(&input.bucket, &input.key, &meta, None).await;
        Ok(S3Response::new(PutObjectOutput {
            expiration,
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        crate::sse::refuse_on_read(&req.headers)?;
        let i = req.input;
        let pre = precondition(&i.if_match, &i.if_none_match, &i.if_modified_since, &i.if_unmodified_since);
        let part = match i.part_number {
            Some(p) if p < 1 => return Err(s3_error!(InvalidArgument, "partNumber must be at least 1")),
            p => p.map(|p| p as u32),
        };
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        let range = i.range.as_ref().map(range_of);
        let got = self
            .layer
            .get_object_sse(&i.bucket, &i.key, i.version_id.as_deref(), range, part, &pre, customer.as_ref())
            .await;
        let got = match got {
            Ok(g) => g,
            Err(e) => return Err(self.not_modified_with_etag(e, &i.bucket, &i.key, i.version_id.as_deref()).await),
        };
        let m = got.meta;
        let enabled = i.checksum_mode.as_ref().is_some_and(|c| c.as_str() == "ENABLED");
        // A checksum of the whole object does not describe a range of it; a part of a multipart object has
        // its own.
        let c = match part {
            Some(n) if !m.part_sizes.is_empty() => part_checksums(&m, n, enabled),
            Some(_) => checksums(&m.checksums, enabled),
            None => checksums(&m.checksums, enabled && got.range.is_none()),
        };
        let (len, content_range) = match got.range {
            Some(r) => (r.end - r.start, Some(format!("bytes {}-{}/{}", r.start, r.end - 1, m.size_bytes))),
            None => (m.size_bytes, None),
        };
        let body = StreamingBlob::wrap(got.body);
        let lock = crate::lock::headers_of(&m);
        let e = crate::sse::echo(m.sse.as_ref());
        let expiration = self.expiration(&i.bucket, &i.key, &m, i.version_id.as_deref()).await;
        let out = GetObjectOutput {
            expiration,
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        crate::sse::refuse_on_read(&req.headers)?;
        let i = req.input;
        let pre = precondition(&i.if_match, &i.if_none_match, &i.if_modified_since, &i.if_unmodified_since);
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        let head = self.layer.head_object_sse(&i.bucket, &i.key, i.version_id.as_deref(), &pre, customer.as_ref());
        let m = match head.await {
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
        let c = match i.part_number {
            Some(n) if !m.part_sizes.is_empty() => part_checksums(&m, n as u32, enabled),
            _ => checksums(&m.checksums, enabled),
        };
        let lock = crate::lock::headers_of(&m);
        let e = crate::sse::echo(m.sse.as_ref());
        let expiration = self.expiration(&i.bucket, &i.key, &m, i.version_id.as_deref()).await;
        let out = HeadObjectOutput {
            expiration,
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        };
        let mut resp = S3Response::new(out);
        // HeadObjectOutput has no field for it; GET's x-amz-tagging-count, on HEAD as S3 sends it.
        if m.tag_count > 0 {
            resp.headers.insert("x-amz-tagging-count", http::HeaderValue::from(m.tag_count));
        }
        Ok(resp)
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
        let grant_write = grant_write_header(&req.headers);
        let grants =
            grant_headers(&i.grant_read, &grant_write, &i.grant_read_acp, &i.grant_write_acp, &i.grant_full_control);
        let access =
            self.written_access(&req.credentials, &i.bucket, i.acl.as_ref().map(|a| a.as_str()), grants).await?;
        let source = self.customer_key(&req.extensions, &copy_source_customer_headers!(i))?;
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        let dest = crate::sse::write_request(i.server_side_encryption.as_ref(), i.ssekms_key_id.as_deref(), customer)?;
        let keys = mosaic_layer::CopyKeys { source, dest };
        let tags = match i.tagging_directive.as_ref().map(|d| d.as_str()) {
            None | Some("COPY") => mosaic_layer::CopyTags::Source,
            Some("REPLACE") => mosaic_layer::CopyTags::Replace(tagging_header(&i.tagging)?),
            Some(other) => {
                return Err(s3_error!(InvalidArgument, "Unknown tagging directive {other:?}: COPY or REPLACE"));
            }
        };
        let src = (src_bucket.as_str(), src_key.as_str(), src_version.as_deref());
        let dst = (i.bucket.as_str(), i.key.as_str());
        let m = self.layer.copy_object_with(src, &pre, dst, new_meta, tags, access, keys).await.map_err(to_s3)?;
        let c = checksums(&m.checksums, true);
        let e = crate::sse::echo(m.sse.as_ref());
        let expiration = self.expiration(&i.bucket, &i.key, &m, None).await;
        Ok(S3Response::new(CopyObjectOutput {
            expiration,
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        let owner = self.owner_dto(&self.bucket_owner_id(&i.bucket).await?);
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
                        owner: Some(owner.clone()),
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
        // The bucket record is read for the owner only when asked for (ListObjectsV2 omits it by default).
        let owner = match i.fetch_owner {
            Some(true) => Some(self.owner_dto(&self.bucket_owner_id(&i.bucket).await?)),
            _ => None,
        };
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
                        owner: owner.clone(),
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
        // One header value may list several attributes ("ETag,ObjectSize", as botocore sends them).
        let wants = |a: &str| i.object_attributes.iter().flat_map(|x| x.as_str().split(',')).any(|x| x.trim() == a);
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        let m = self
            .layer
            .head_object_sse(&i.bucket, &i.key, i.version_id.as_deref(), &Precondition::default(), customer.as_ref())
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
        let parts =
            if m.part_sizes.is_empty() { None } else { Some(object_parts(&m, i.part_number_marker, i.max_parts)?) };
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
        let owner = self.owner_dto(&self.bucket_owner_id(&i.bucket).await?);
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
                    owner: Some(owner.clone()),
                    version_id,
                });
            } else {
                versions.push(ObjectVersion {
                    e_tag: Some(ETag::Strong(v.etag)),
                    is_latest: Some(v.is_latest),
                    key: Some(enc(v.key)),
                    last_modified: Some(ts(v.last_modified_unix_ms)),
                    owner: Some(owner.clone()),
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
        let mut tags = self.layer.get_tags(&i.bucket, &i.key, i.version_id.as_deref()).await.map_err(to_s3)?;
        // In key order, as S3 answers (keys are unique in a set).
        tags.sort_unstable_by(|a, b| a.0.cmp(&b.0));
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
        let grant_write = grant_write_header(&req.headers);
        let grants =
            grant_headers(&i.grant_read, &grant_write, &i.grant_read_acp, &i.grant_write_acp, &i.grant_full_control);
        opts.access =
            self.written_access(&req.credentials, &i.bucket, i.acl.as_ref().map(|a| a.as_str()), grants).await?;
        opts.lock = crate::lock::lock_request(
            &i.object_lock_mode,
            &i.object_lock_retain_until_date,
            &i.object_lock_legal_hold_status,
        )?;
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        opts.sse = crate::sse::write_request(i.server_side_encryption.as_ref(), i.ssekms_key_id.as_deref(), customer)?;
        let id = self.layer.create_multipart(&i.bucket, &i.key, opts.clone()).await.map_err(to_s3)?;
        let sealed = self.layer.upload_options(&i.bucket, &i.key, &id).await.map_err(to_s3)?.sse_sealed;
        let e = crate::sse::echo(sealed.as_ref());
        Ok(S3Response::new(CreateMultipartUploadOutput {
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        let customer = self.customer_key(&req.extensions, &customer_headers!(i))?;
        let body = verified_body(layer_stream(i.body), exp).map_err(to_s3)?;
        let part = i.part_number as u32;
        let p = self
            .layer
            .upload_part_sse(&i.bucket, &i.key, &i.upload_id, part, body, customer.as_ref())
            .await
            .map_err(to_s3)?;
        let c = checksums_of_list(&p.checksums);
        let e = self.upload_echo(&i.bucket, &i.key, &i.upload_id).await?;
        Ok(S3Response::new(UploadPartOutput {
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        let source = self.customer_key(&req.extensions, &copy_source_customer_headers!(i))?;
        let dest = self.customer_key(&req.extensions, &customer_headers!(i))?.map(mosaic_layer::SseRequest::Customer);
        let p = self
            .layer
            .upload_part_copy_sse(
                &i.bucket,
                &i.key,
                &i.upload_id,
                i.part_number as u32,
                &src_bucket,
                &src_key,
                src_version.as_deref(),
                range,
                &pre,
                mosaic_layer::CopyKeys { source, dest },
            )
            .await
            .map_err(to_s3)?;
        let e = self.upload_echo(&i.bucket, &i.key, &i.upload_id).await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
            sse_customer_algorithm: e.customer_algorithm,
            sse_customer_key_md5: e.customer_key_md5,
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
        let named_whole = named_checksums!(i);
        let completed = i.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        let named_per_part: Vec<(u32, Vec<(&'static str, String)>)> = completed
            .iter()
            .filter_map(|p| p.part_number.map(|n| (n.max(0) as u32, named_checksums!(p))))
            .filter(|(_, named)| !named.is_empty())
            .collect();
        let parts: Vec<CompletePart> = completed
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
        let upload = self.layer.upload_options(&i.bucket, &i.key, &i.upload_id).await.ok();
        // An SSE-C upload completes with its key, as its parts were uploaded.
        if let Some(sealed) = upload.as_ref().and_then(|o| o.sse_sealed.as_ref())
            && sealed.mode == mosaic_layer::SseMode::Customer
        {
            let given = self.customer_key(&req.extensions, &customer_headers!(i))?;
            if given.as_ref().map(|c| c.md5_b64()) != sealed.customer_key_md5.as_deref() {
                return Err(s3_error!(
                    InvalidRequest,
                    "The upload was made with a customer-provided key; complete it with the same key"
                ));
            }
        }
        let asked = upload.and_then(|o| o.checksum_type);
        let full_object = asked.as_deref() == Some("FULL_OBJECT");
        let extra = crate::multipart::composite_checksum(&listed, &parts, full_object);
        // A retried completion (the upload gone) is answered from the object; there is nothing to check.
        if !listed.is_empty() {
            check_completion_checksums(&listed, &named_per_part, &named_whole, &extra)?;
        }
        let m =
            self.layer.complete_multipart(&i.bucket, &i.key, &i.upload_id, parts, &pre, extra).await.map_err(to_s3)?;
        let c = checksums(&m.checksums, true);
        let e = crate::sse::echo(m.sse.as_ref());
        let customer_echo = crate::sse::customer_echo_headers(&e);
        let expiration = self.expiration(&i.bucket, &i.key, &m, None).await;
        let mut resp = S3Response::new(CompleteMultipartUploadOutput {
            expiration,
            server_side_encryption: e.sse,
            ssekms_key_id: e.kms_key_id,
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
        });
        // The response has no fields for SSE-C; its headers, as the other answers about the object carry.
        resp.headers.extend(customer_echo);
        Ok(resp)
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
        // The upload's owner: its writer, else the bucket's.
        let upload = self.layer.upload_options(&i.bucket, &i.key, &i.upload_id).await.map_err(to_s3)?;
        let owner = match upload.access.owner_id {
            Some(id) => self.owner_dto(&id),
            None => self.owner_dto(&self.bucket_owner_id(&i.bucket).await?),
        };
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
            owner: Some(owner.clone()),
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
        let owner = self.owner_dto(&self.bucket_owner_id(&i.bucket).await?);
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
                        owner: Some(owner.clone()),
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

#[cfg(test)]
mod tests {
    use super::stored_content_encoding as enc;

    #[test]
    fn aws_chunked_is_no_content_encoding() {
        assert_eq!(enc("gzip").as_deref(), Some("gzip"));
        assert_eq!(enc("deflate, gzip").as_deref(), Some("deflate, gzip"));
        assert_eq!(enc("deflate,gzip").as_deref(), Some("deflate,gzip"));
        assert_eq!(enc("gzip, aws-chunked").as_deref(), Some("gzip"));
        assert_eq!(enc("aws-chunked,deflate,gzip").as_deref(), Some("deflate, gzip"));
        assert_eq!(enc("aws-chunked"), None);
        assert_eq!(enc("aws-chunked, AWS-CHUNKED"), None);
        assert_eq!(enc(""), None);
    }
}
