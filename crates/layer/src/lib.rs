//! The S3 semantics, written once: the [`ObjectLayer`] the S3 frontend calls (DESIGN.md section 4), and
//! [`S3Semantics`], its implementation over any `mosaic_store::Store` (one drive, an erasure set, a
//! cluster), so that nothing of S3 is written twice.
//!
//! This crate knows buckets, keys, object metadata, conditions, multipart uploads and listing. It does not
//! know HTTP, XML, SigV4 or S3 error codes (the `s3` crate maps [`LayerError`] to them), nor how a store
//! keeps its data: it depends on the storage traits only, never on an engine.
//!
//! Modules by concern: `buckets`, `objects` (PUT, append, GET, copy, tags), `multipart`, `listing`,
//! `ingest` (bodies streamed into staged units), `records` (the layer's own records and their names), `upgrade` (names of older builds), `meta` (object
//! metadata and conditions), `semantics` (the struct and the trait's dispatch).

mod acl;
mod body_md5;
mod buckets;
mod cors;
mod error;
mod ingest;
mod lifecycle;
mod listing;
mod lock;
mod meta;
mod multipart;
mod names;
mod objects;
mod parts;
mod records;
mod semantics;
mod sse;
mod switch;
#[doc(hidden)]
pub mod testing;
mod upgrade;
mod versions;

pub use acl::{
    AclGrant, Grantee, MAX_ACL_GRANTS, ObjectAccess, ObjectOwnership, Permission, PublicAccessBlock, validate_acl,
};
pub use buckets::{MAX_BUCKET_POLICY_BYTES, MAX_BUCKET_TAGS, MAX_BUCKETS};
pub use cors::{CORS_METHODS, CorsRule, MAX_CORS_RULES, validate_cors};
pub use error::{LayerError, LayerResult};
pub use lifecycle::{
    LifecycleFilter, LifecycleReport, LifecycleRule, MAX_LIFECYCLE_RULES, expiry_after_days, validate_lifecycle,
};
pub use listing::MAX_LIST_KEYS;
pub use lock::{DefaultRetention, LockChange, LockConfig, LockMode, LockRequest, MAX_RETENTION_DAYS, Retention};
pub use meta::{ListTag, ObjectMeta, Precondition, PutOptions};
pub use multipart::{MAX_PART_BYTES, MAX_PARTS, MIN_PART_BYTES};
pub use names::{MAX_KEY_BYTES, MAX_USER_METADATA_BYTES, validate_bucket_name, validate_key};
pub use objects::MAX_TAGS;
pub use records::bucket_scopes;
pub use semantics::{DEFAULT_MAX_OBJECT_BYTES, S3Semantics, SemanticsConfig};
pub use sse::{
    BucketEncryption, CustomerKey, MAX_KMS_KEY_ID_BYTES, MAX_KMS_KEYS, SseKeys, SseMeta, SseMode, SseRequest,
};
pub use switch::{SWITCH_WAIT, Switch};
pub use versions::MAX_VERSIONS_SCANNED;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};
use std::pin::Pin;

/// A stream of body bytes. An `Err` item aborts the operation that consumes it.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, LayerError>> + Send + Sync>>;

/// Called once the body stream has ended, before the write commits: returns extra metadata to store
/// (such as verified checksums) or an error that aborts the write.
pub type Finisher = Box<dyn FnOnce() -> LayerResult<Vec<(String, String)>> + Send>;

/// A request body plus its finisher.
pub struct PutBody {
    pub stream: ByteStream,
    pub finish: Option<Finisher>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketInfo {
    pub name: String,
    pub created_unix_ms: i64,
    pub versioning: Versioning,
    /// The access key that created the bucket; None for the root key.
    pub owner: Option<String>,
    pub object_lock: Option<LockConfig>,
    pub tags: Vec<(String, String)>,
    pub lifecycle: Option<Vec<LifecycleRule>>,
    /// The bucket's ACL; None: private.
    pub acl: Option<Vec<AclGrant>>,
    /// The bucket's CORS rules; None: no browser may read across origins.
    pub cors: Option<Vec<CorsRule>>,
    /// The bucket's policy document, as it was put (the frontend parses and checks it).
    pub policy: Option<String>,
    pub public_access_block: Option<PublicAccessBlock>,
    /// None: no ownership controls (objects are their writers').
    pub object_ownership: Option<ObjectOwnership>,
    /// Default encryption of writes that ask for none.
    pub encryption: Option<BucketEncryption>,
}

/// How a bucket is made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketOptions {
    /// The access key that creates it and owns it; None for the root key.
    pub owner: Option<String>,
    /// Object lock enabled from the start (versioning with it).
    pub object_lock: bool,
    /// The bucket's ACL (x-amz-acl, x-amz-grant-*); None: private.
    pub acl: Option<Vec<AclGrant>>,
    /// x-amz-object-ownership.
    pub object_ownership: Option<ObjectOwnership>,
}

/// How a DELETE is made: of a version, past GOVERNANCE retention, on conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    pub version_id: Option<String>,
    /// x-amz-bypass-governance-retention, from a requester allowed to.
    pub bypass_governance: bool,
    /// If-Match: the version deleted (the current one, or the one named) must have this ETag (`*`: exist).
    pub if_match: Option<String>,
    /// x-amz-if-match-last-modified-time, in ms.
    pub if_match_last_modified_ms: Option<i64>,
    /// x-amz-if-match-size.
    pub if_match_size: Option<u64>,
    /// Runs in the background IO class (lifecycle), behind client requests.
    pub background: bool,
}

impl DeleteOptions {
    pub fn has_conditions(&self) -> bool {
        self.if_match.is_some() || self.if_match_last_modified_ms.is_some() || self.if_match_size.is_some()
    }
}

/// A bucket's versioning state. Once enabled, a bucket is never unversioned again, only suspended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Versioning {
    #[default]
    Unversioned,
    Enabled,
    Suspended,
}

impl Versioning {
    pub fn is_unversioned(&self) -> bool {
        *self == Versioning::Unversioned
    }
}

/// What a DELETE did: the version it removed or the delete marker it made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteResult {
    /// The version removed (by version id) or the delete marker's version; None where nothing versioned.
    pub version_id: Option<String>,
    pub delete_marker: bool,
}

/// One entry of ListObjectVersions: a version or a delete marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedVersion {
    pub key: String,
    /// None is the "null" version.
    pub version_id: Option<String>,
    pub is_latest: bool,
    pub delete_marker: bool,
    pub size_bytes: u64,
    pub etag: String,
    pub last_modified_unix_ms: i64,
}

#[derive(Clone, Debug, Default)]
pub struct VersionPage {
    pub versions: Vec<ListedVersion>,
    pub common_prefixes: Vec<String>,
    /// Where the next page starts, when more remain: the last key and version (or common prefix) returned.
    pub next_key_marker: Option<String>,
    pub next_version_id_marker: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct VersionQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub key_marker: String,
    /// With `key_marker`: start after this version of that key ("null" for the null version).
    pub version_id_marker: Option<String>,
    pub max_keys: usize,
}

#[derive(Clone, Debug)]
pub struct ListedObject {
    pub key: String,
    pub size_bytes: u64,
    pub etag: String,
    pub last_modified_unix_ms: i64,
}

#[derive(Clone, Debug, Default)]
pub struct ListPage {
    pub objects: Vec<ListedObject>,
    pub common_prefixes: Vec<String>,
    /// The last key or common prefix returned, when more remain.
    pub next_marker: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Return only keys (and common prefixes) strictly greater than this.
    pub start_after: String,
    pub max_keys: usize,
}

/// The keys of a copy: the source's SSE-C key, and the encryption the copy (or the part) is written with.
#[derive(Clone, Debug, Default)]
pub struct CopyKeys {
    pub source: Option<CustomerKey>,
    pub dest: Option<SseRequest>,
}

/// When the bucket's lifecycle rules expire an object's current version, and by which rule
/// (x-amz-expiration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectExpiration {
    /// Midnight UTC after the rule's days have passed since the version was written, or the rule's date.
    pub date_unix_ms: i64,
    pub rule_id: String,
}

/// The tags a copy gets (x-amz-tagging-directive): the source version's (COPY, S3's default) or the ones the
/// request names (REPLACE; none when it names none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CopyTags {
    #[default]
    Source,
    Replace(Vec<(String, String)>),
}

/// A byte range resolved against the object size: [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

pub struct GetResult {
    pub meta: ObjectMeta,
    /// The range served, when the request asked for one.
    pub range: Option<ByteRange>,
    pub body: ByteStream,
}

#[derive(Clone, Debug)]
pub struct UploadInfo {
    pub upload_id: String,
    pub key: String,
    pub initiated_unix_ms: i64,
}

#[derive(Clone, Debug)]
pub struct PartInfo {
    pub part_number: u32,
    pub size_bytes: u64,
    pub etag: String,
    pub last_modified_unix_ms: i64,
    /// Checksums of the part, by algorithm name (e.g. "CRC32").
    pub checksums: Vec<(String, String)>,
}

/// A part named by CompleteMultipartUpload.
#[derive(Clone, Debug)]
pub struct CompletePart {
    pub part_number: u32,
    pub etag: String,
}

/// What a range request asks for, before the object size is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeRequest {
    /// bytes=first-last (last inclusive, None = to the end)
    FromTo { first: u64, last: Option<u64> },
    /// bytes=-n
    Suffix { len: u64 },
}

impl RangeRequest {
    pub fn resolve(self, size: u64) -> LayerResult<ByteRange> {
        match self {
            RangeRequest::FromTo { first, last } => {
                if first >= size {
                    return Err(LayerError::InvalidRange);
                }
                let end = last.map(|l| l.saturating_add(1).min(size)).unwrap_or(size);
                if end <= first {
                    return Err(LayerError::InvalidRange);
                }
                Ok(ByteRange { start: first, end })
            }
            RangeRequest::Suffix { len } => {
                if len == 0 || size == 0 {
                    return Err(LayerError::InvalidRange);
                }
                Ok(ByteRange { start: size - len.min(size), end: size })
            }
        }
    }
}

#[async_trait]
pub trait ObjectLayer: Send + Sync + 'static {
    /// Creates a bucket (None: owned by the root key, no object lock).
    async fn create_bucket(&self, bucket: &str, opts: Option<&BucketOptions>) -> LayerResult<()>;
    async fn delete_bucket(&self, bucket: &str) -> LayerResult<()>;
    async fn bucket_info(&self, bucket: &str) -> LayerResult<BucketInfo>;
    async fn list_buckets(&self) -> LayerResult<Vec<BucketInfo>>;
    /// Enables or suspends versioning (a bucket once versioned is never unversioned again).
    async fn put_bucket_versioning(&self, bucket: &str, versioning: Versioning) -> LayerResult<()>;
    /// Sets a bucket's lifecycle rules (None: removes them).
    async fn put_bucket_lifecycle(&self, bucket: &str, rules: Option<Vec<LifecycleRule>>) -> LayerResult<()>;
    /// One lifecycle pass over every bucket at `now_ms`, where a day lasts `day_ms`.
    async fn lifecycle_pass(&self, now_ms: i64, day_ms: i64) -> LayerResult<LifecycleReport>;
    /// Sets a bucket's object ownership controls (None: removes them).
    async fn put_object_ownership(&self, bucket: &str, ownership: Option<ObjectOwnership>) -> LayerResult<()>;
    /// Sets a bucket's public access block (None: removes it).
    async fn put_public_access_block(&self, bucket: &str, block: Option<PublicAccessBlock>) -> LayerResult<()>;
    /// Sets a bucket's policy document (None: removes it); at most `MAX_BUCKET_POLICY_BYTES`.
    async fn put_bucket_policy(&self, bucket: &str, policy: Option<String>) -> LayerResult<()>;
    /// Sets a bucket's CORS rules (None: removes them).
    async fn put_bucket_cors(&self, bucket: &str, rules: Option<Vec<CorsRule>>) -> LayerResult<()>;
    /// Sets a bucket's default encryption (None: removes it).
    async fn put_bucket_encryption(&self, bucket: &str, encryption: Option<BucketEncryption>) -> LayerResult<()>;
    /// Sets a bucket's ACL (None: private).
    async fn put_bucket_acl(&self, bucket: &str, acl: Option<Vec<AclGrant>>) -> LayerResult<()>;
    /// Sets a bucket's tags (empty: removes them).
    async fn put_bucket_tags(&self, bucket: &str, tags: Vec<(String, String)>) -> LayerResult<()>;
    /// Enables object lock (on a versioned bucket) and sets its default retention.
    async fn put_object_lock_config(&self, bucket: &str, cfg: LockConfig) -> LayerResult<()>;
    /// Sets a version's retention or legal hold (`version_id` None: the current version).
    async fn change_object_lock(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        bypass_governance: bool,
    ) -> LayerResult<()>;

    async fn put_object(&self, bucket: &str, key: &str, body: PutBody, opts: PutOptions) -> LayerResult<ObjectMeta>;
    /// The current version, or the version named (`version_id`, "null" for the null version).
    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        range: Option<RangeRequest>,
        part_number: Option<u32>,
        pre: &Precondition,
    ) -> LayerResult<GetResult> {
        self.get_object_sse(bucket, key, version_id, range, part_number, pre, None).await
    }
    /// GET with the customer's key of an object stored with SSE-C (required for those, refused for others).
    #[allow(clippy::too_many_arguments)]
    async fn get_object_sse(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        range: Option<RangeRequest>,
        part_number: Option<u32>,
        pre: &Precondition,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<GetResult>;
    async fn head_object(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        pre: &Precondition,
    ) -> LayerResult<ObjectMeta> {
        self.head_object_sse(bucket, key, version_id, pre, None).await
    }
    /// A version's metadata for an access check: no conditions, and no SSE-C key needed (nothing of the
    /// body is read).
    async fn object_meta_unchecked(&self, bucket: &str, key: &str, version_id: Option<&str>)
    -> LayerResult<ObjectMeta>;
    /// HEAD with the customer's key of an object stored with SSE-C (checked against the object's).
    async fn head_object_sse(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        pre: &Precondition,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<ObjectMeta>;
    /// Without a version id: removes the key, or in a versioned bucket makes a delete marker its current
    /// version; with one, removes that version. Deleting what does not exist succeeds (S3 semantics).
    async fn delete_object(&self, bucket: &str, key: &str, version_id: Option<&str>) -> LayerResult<DeleteResult> {
        let opts = DeleteOptions { version_id: version_id.map(str::to_string), ..Default::default() };
        self.delete_object_with(bucket, key, &opts).await
    }
    /// DELETE with every option: a locked version is refused (GOVERNANCE unless bypassed), a condition that
    /// does not hold fails with PreconditionFailed.
    async fn delete_object_with(&self, bucket: &str, key: &str, opts: &DeleteOptions) -> LayerResult<DeleteResult>;
    /// Copies without moving data (a clone on the drive). `new_meta` replaces the metadata when given; the
    /// copy is the bucket owner's, private.
    #[allow(clippy::too_many_arguments)]
    async fn copy_object(
        &self,
        src_bucket: &str,
        src_key: &str,
        src_version: Option<&str>,
        src_pre: &Precondition,
        dst_bucket: &str,
        dst_key: &str,
        new_meta: Option<PutOptions>,
    ) -> LayerResult<ObjectMeta> {
        let access = new_meta.as_ref().map(|m| m.access.clone()).unwrap_or_default();
        let keys = CopyKeys { source: None, dest: new_meta.as_ref().and_then(|m| m.sse.clone()) };
        let (src, dst) = ((src_bucket, src_key, src_version), (dst_bucket, dst_key));
        self.copy_object_with(src, src_pre, dst, new_meta, CopyTags::Source, access, keys).await
    }
    /// A copy whose owner and ACL are `access` (a copy never takes the source's: S3 gives it the request's),
    /// whether or not the metadata is replaced. `keys`: the source's SSE-C key and the copy's encryption
    /// (else the destination bucket's default); an encrypted source or copy is read and written again.
    /// `src`: bucket, key and version; `dst`: bucket and key.
    #[allow(clippy::too_many_arguments)]
    async fn copy_object_with(
        &self,
        src: (&str, &str, Option<&str>),
        src_pre: &Precondition,
        dst: (&str, &str),
        new_meta: Option<PutOptions>,
        tags: CopyTags,
        access: ObjectAccess,
        keys: CopyKeys,
    ) -> LayerResult<ObjectMeta>;
    async fn list_objects(&self, bucket: &str, q: &ListQuery) -> LayerResult<ListPage>;
    async fn list_object_versions(&self, bucket: &str, q: &VersionQuery) -> LayerResult<VersionPage>;

    async fn get_tags(&self, bucket: &str, key: &str, version_id: Option<&str>) -> LayerResult<Vec<(String, String)>>;
    /// When a current version `meta` of `key` expires under the bucket's lifecycle rules: the earliest date
    /// of the enabled expiration rules that match it (prefix, size, tags); none without one.
    async fn expiration_of(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> LayerResult<Option<ObjectExpiration>>;
    async fn put_tags(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tags: Vec<(String, String)>,
    ) -> LayerResult<()>;
    /// Sets a version's ACL (None: private); its owner stays.
    async fn put_object_acl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        acl: Option<Vec<AclGrant>>,
    ) -> LayerResult<()>;

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> LayerResult<String>;
    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
    ) -> LayerResult<PartInfo> {
        self.upload_part_sse(bucket, key, upload_id, part, body, None).await
    }
    /// A part of an upload made with SSE-C carries the upload's customer key.
    async fn upload_part_sse(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<PartInfo>;
    /// Copies a range of an existing object into a part.
    #[allow(clippy::too_many_arguments)]
    async fn upload_part_copy(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        src_bucket: &str,
        src_key: &str,
        src_version: Option<&str>,
        range: Option<RangeRequest>,
        src_pre: &Precondition,
    ) -> LayerResult<PartInfo> {
        let keys = CopyKeys::default();
        self.upload_part_copy_sse(bucket, key, upload_id, part, src_bucket, src_key, src_version, range, src_pre, keys)
            .await
    }
    /// UploadPartCopy with the source's SSE-C key and, for an SSE-C upload, the upload's (`keys.dest`).
    #[allow(clippy::too_many_arguments)]
    async fn upload_part_copy_sse(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        src_bucket: &str,
        src_key: &str,
        src_version: Option<&str>,
        range: Option<RangeRequest>,
        src_pre: &Precondition,
        keys: CopyKeys,
    ) -> LayerResult<PartInfo>;
    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        pre: &Precondition,
        extra_meta: Vec<(String, String)>,
    ) -> LayerResult<ObjectMeta>;
    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<()>;
    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<Vec<PartInfo>>;
    /// What CreateMultipartUpload asked for (metadata, checksum algorithm and type, lock, tags).
    async fn upload_options(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<PutOptions>;
    async fn list_uploads(&self, bucket: &str, prefix: &str) -> LayerResult<Vec<UploadInfo>>;

    /// Whether every drive is open and writable.
    fn is_ready(&self) -> bool;
    /// Stops the drives cleanly.
    async fn shutdown(&self) -> LayerResult<()>;
}
