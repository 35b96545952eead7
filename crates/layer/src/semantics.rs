//! `S3Semantics`: the S3 object semantics, written once over any [`Store`]. This module holds the struct,
//! its opening, and the helpers its concerns share; each concern lives in its own module (`buckets`,
//! `objects`, `multipart`, `listing`, `ingest`), and [`ObjectLayer`] is implemented here by handing every
//! call to the module that owns it.

use crate::error::{LayerError, LayerResult};
use crate::ingest::StageBuffers;
use crate::meta::{ObjectMeta, Precondition, PutOptions};
use crate::records::*;
use crate::*;
use async_trait::async_trait;
use mosaic_store::{ErrorKind, ObjectInfo, Op, Outcome, Snapshot, Store, StoreError, Txn};
use std::sync::Arc;

/// Largest object accepted by PUT by default: S3's 5 TiB.
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 5 << 40;

#[derive(Clone, Debug)]
pub struct SemanticsConfig {
    /// Largest object accepted by PUT, in bytes.
    pub max_object_bytes: u64,
    /// The keys of SSE-S3 and SSE-KMS; None: those are refused (SSE-C needs no server key).
    pub sse_keys: Option<Arc<crate::sse::SseKeys>>,
    /// How long a bucket's record (versioning, lock, encryption, policy, ACL) read for requests is trusted
    /// before it is read again. None: until this layer changes it, which holds only when this layer is the
    /// bucket's one writer (one node). A cluster's nodes each cache records another node may change, so
    /// they bound the staleness (S3 itself documents bucket settings as eventually consistent).
    pub bucket_state_ttl: Option<std::time::Duration>,
    /// Smallest part but the last of a completed multipart upload (S3: 5 MiB); tests lower it to complete
    /// uploads of many parts without writing gigabytes.
    pub min_part_bytes: u64,
    /// Locks shared with the other processes that serve the same store (a cluster's nodes): a new version
    /// of a key is made under its shared lock too, so that two nodes writing one versioned key take turns
    /// instead of one failing with a conflict. None: this process is the store's only writer.
    pub shared_locks: Option<Arc<dyn mosaic_store::SharedLocks>>,
}

impl Default for SemanticsConfig {
    fn default() -> Self {
        SemanticsConfig {
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
            sse_keys: None,
            bucket_state_ttl: None,
            min_part_bytes: crate::MIN_PART_BYTES,
            shared_locks: None,
        }
    }
}

/// The S3 semantics over a store: buckets are collections, objects are store objects with their metadata
/// in attributes and a listing tag on their name, multipart parts are objects of their own cloned into
/// the target at completion.
pub struct S3Semantics<S: Store> {
    pub(crate) store: Arc<S>,
    pub(crate) cfg: SemanticsConfig,
    /// The layer's own collections, found (or created) at open, or on first use when too few drives
    /// answered then (the store serves errors until they do).
    sys: tokio::sync::OnceCell<S::Coll>,
    mpu: tokio::sync::OnceCell<S::Coll>,
    pub(crate) stage_buffers: Arc<StageBuffers>,
    /// Each bucket's versioning and lock, read once from its record (at most one entry per bucket).
    pub(crate) bucket_cache: parking_lot::RwLock<crate::versions::BucketCache>,
    /// Writers of one versioned key take turns (see `versions`).
    pub(crate) key_locks: crate::versions::KeyLocks,
}

/// A transaction of this layer's store.
pub(crate) type StoreTxn<S> = Txn<<S as Store>::Coll, <S as Store>::Staged>;

/// A store error as a layer error, when no operation of the transaction gives it a more precise meaning.
impl From<StoreError> for LayerError {
    fn from(e: StoreError) -> Self {
        match e.kind {
            ErrorKind::NotFound => LayerError::NoSuchKey,
            ErrorKind::AlreadyExists | ErrorKind::AssertionFailed => LayerError::PreconditionFailed,
            ErrorKind::CollectionNotFound => LayerError::NoSuchBucket,
            ErrorKind::CollectionExists => LayerError::BucketExists,
            ErrorKind::CollectionNotEmpty => LayerError::BucketNotEmpty,
            ErrorKind::OffsetMismatch => LayerError::InvalidWriteOffset,
            ErrorKind::NoSpace => LayerError::StorageFull,
            ErrorKind::Unavailable => LayerError::Unavailable(e.message),
            ErrorKind::Switching => LayerError::Switching(e.message),
            ErrorKind::Corrupt => LayerError::Corrupt(e.message),
            ErrorKind::Limit | ErrorKind::InvalidArgument => LayerError::InvalidArgument(e.message),
            ErrorKind::Internal => LayerError::Internal(e.to_string()),
        }
    }
}

impl<S: Store> S3Semantics<S> {
    /// Opens the semantics on a store, creating the layer's own collections on first use.
    /// A store that cannot answer now (too few drives) still opens: requests get `Unavailable` until it can.
    pub async fn open(store: Arc<S>, cfg: SemanticsConfig) -> LayerResult<Self> {
        let key_locks = crate::versions::KeyLocks::new(cfg.shared_locks.clone());
        let s = S3Semantics {
            store,
            cfg,
            sys: tokio::sync::OnceCell::new(),
            mpu: tokio::sync::OnceCell::new(),
            stage_buffers: Arc::default(),
            bucket_cache: Default::default(),
            key_locks,
        };
        let collections = [s.sys().await.map(|_| ()), s.mpu().await.map(|_| ())];
        let upgraded = if collections.iter().all(|r| r.is_ok()) { s.upgrade_names().await } else { Ok(()) };
        for r in collections.into_iter().chain([upgraded]) {
            match r {
                Ok(_) => {}
                Err(LayerError::Unavailable(why) | LayerError::Switching(why)) => {
                    tracing::warn!(%why, "the store cannot answer yet; requests fail until enough drives return");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(s)
    }

    /// The layer's system collection (bucket records).
    pub(crate) async fn sys(&self) -> LayerResult<S::Coll> {
        self.sys.get_or_try_init(|| ensure_collection(&*self.store, SYS_COLLECTION)).await.cloned()
    }

    /// The collection of multipart uploads and their parts.
    pub(crate) async fn mpu(&self) -> LayerResult<S::Coll> {
        self.mpu.get_or_try_init(|| ensure_collection(&*self.store, MPU_COLLECTION)).await.cloned()
    }

    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub(crate) async fn commit(&self, txn: StoreTxn<S>) -> Result<Outcome, StoreError> {
        self.store.commit(txn).await
    }

    /// The collection of a bucket in `snap`.
    pub(crate) async fn bucket_coll(&self, snap: &S::Snapshot, bucket: &str) -> LayerResult<S::Coll> {
        snap.collection(&bucket_collection(bucket)).await?.ok_or(LayerError::NoSuchBucket)
    }

    /// Looks up an object (its current version, or the version named) and its metadata in one snapshot;
    /// prioritizes the snapshot's reads when the object is high-priority. A delete marker is no object.
    pub(crate) async fn stat_object(&self, bucket: &str, key: &str, version_id: Option<&str>) -> LayerResult<Stat<S>> {
        validate_key(key)?;
        let snap = self.store.snapshot();
        let coll = self.bucket_coll(&snap, bucket).await?;
        let (name, info, mut meta) = match version_id {
            None => {
                let info = snap.lookup(&coll, key.as_bytes()).await?.ok_or(LayerError::NoSuchKey)?;
                let meta = read_meta(&snap, &info.obj, bucket, key).await?;
                (key.as_bytes().to_vec(), info, meta)
            }
            Some(v) => {
                let found = self.locate(&snap, &coll, bucket, key, v).await?.ok_or(LayerError::NoSuchVersion)?;
                (found.name, found.info, found.meta)
            }
        };
        if meta.delete_marker {
            return Err(LayerError::DeleteMarker { version_id: meta.version_id, named: version_id.is_some() });
        }
        if info.high_priority {
            snap.prioritize();
        }
        // The store's size is the truth (appends change it), except for an encrypted body, whose stored
        // size counts its packages' tags (and which cannot be appended to).
        if !meta.is_encrypted() {
            meta.size_bytes = info.size_bytes;
        }
        Ok(Stat { snap: Arc::new(snap), coll, name, info, meta })
    }
}

/// An object found by `stat_object`.
pub(crate) struct Stat<S: Store> {
    pub(crate) snap: Arc<S::Snapshot>,
    pub(crate) coll: S::Coll,
    /// Its name in the bucket's collection (the key, or a noncurrent version's name).
    pub(crate) name: Vec<u8>,
    pub(crate) info: ObjectInfo<S::Obj>,
    pub(crate) meta: ObjectMeta,
}

/// An object's metadata record as stored (what a transaction asserts unchanged).
pub(crate) async fn read_meta_raw<Sn: Snapshot>(
    snap: &Sn,
    obj: &Sn::Obj,
    bucket: &str,
    key: &str,
) -> LayerResult<Vec<u8>> {
    snap.attr(obj, ATTR_META)
        .await?
        .ok_or_else(|| LayerError::Corrupt(format!("object {bucket}/{key} has no metadata record")))
}

/// An object's metadata record.
pub(crate) async fn read_meta<Sn: Snapshot>(
    snap: &Sn,
    obj: &Sn::Obj,
    bucket: &str,
    key: &str,
) -> LayerResult<ObjectMeta> {
    let raw = snap
        .attr(obj, ATTR_META)
        .await?
        .ok_or_else(|| LayerError::Corrupt(format!("object {bucket}/{key} has no metadata record")))?;
    let mut meta = ObjectMeta::decode(&raw)?;
    if meta.parts_unread() {
        let mut table = Vec::new();
        for i in 0..meta.part_table_chunks() {
            let chunk = snap.attr(obj, &crate::parts::chunk_attr(i)).await?.ok_or_else(|| {
                LayerError::Corrupt(format!("object {bucket}/{key} lacks part {i} of its part table"))
            })?;
            table.extend_from_slice(&chunk);
        }
        meta.read_part_table(&table)?;
    }
    Ok(meta)
}

/// The ops that record an object's metadata: the metadata attribute, the ETag attribute (what conditional
/// writes assert on; a delete marker has none, as it is no object), the version attribute (in versioned
/// buckets: what a new version asserts unchanged), the listing tag of its name entry (what a listing
/// reads), and its priority.
pub(crate) fn push_meta_ops<C: Clone, St>(
    txn: &mut Txn<C, St>,
    coll: &C,
    name: &[u8],
    meta: &ObjectMeta,
) -> LayerResult<()> {
    let (c, n) = (|| coll.clone(), || name.to_vec());
    debug_assert!(!meta.parts_unread(), "a record is written with its part table");
    txn.push(Op::SetAttr { coll: c(), name: n(), key: ATTR_META.to_vec(), value: meta.encode() });
    for (i, chunk) in meta.part_table()?.into_iter().flatten().enumerate() {
        txn.push(Op::SetAttr { coll: c(), name: n(), key: crate::parts::chunk_attr(i), value: chunk });
    }
    if !meta.delete_marker {
        txn.push(Op::SetAttr { coll: c(), name: n(), key: ATTR_ETAG.to_vec(), value: meta.etag.as_bytes().to_vec() });
    }
    if meta.version_ns != 0 {
        let suffix = crate::versions::Stamp::of(meta).suffix();
        txn.push(Op::SetAttr { coll: c(), name: n(), key: ATTR_VERSION.to_vec(), value: suffix.into_bytes() });
    }
    txn.push(Op::SetNameTag { coll: c(), name: n(), tag: crate::meta::ListTag::of(meta).encode() });
    let high = crate::meta::wants_high_priority(&meta.user_metadata);
    txn.push(Op::SetPriority { coll: c(), name: n(), high });
    Ok(())
}

async fn ensure_collection<S: Store>(store: &S, name: &str) -> LayerResult<S::Coll> {
    if let Some(c) = store.snapshot().collection(name).await? {
        return Ok(c);
    }
    match store.commit(Txn::new().op(Op::CreateCollection { name: name.into() })).await {
        Ok(_) => {}
        // Created meanwhile by someone else: as good.
        Err(e) if e.kind == ErrorKind::CollectionExists => {}
        Err(e) => return Err(e.into()),
    }
    store
        .snapshot()
        .collection(name)
        .await?
        .ok_or_else(|| LayerError::Internal(format!("collection {name} vanished after its creation")))
}

#[async_trait]
impl<S: Store> ObjectLayer for S3Semantics<S> {
    async fn create_bucket(&self, bucket: &str, opts: Option<&BucketOptions>) -> LayerResult<()> {
        self.create_bucket_impl(bucket, opts.cloned().unwrap_or_default()).await
    }

    async fn delete_bucket(&self, bucket: &str) -> LayerResult<()> {
        self.delete_bucket_impl(bucket).await
    }

    async fn bucket_info(&self, bucket: &str) -> LayerResult<BucketInfo> {
        self.bucket_info_impl(bucket).await
    }

    async fn list_buckets(&self) -> LayerResult<Vec<BucketInfo>> {
        self.list_buckets_impl().await
    }

    async fn put_bucket_versioning(&self, bucket: &str, versioning: Versioning) -> LayerResult<()> {
        self.put_bucket_versioning_impl(bucket, versioning).await
    }

    async fn put_bucket_lifecycle(&self, bucket: &str, rules: Option<Vec<LifecycleRule>>) -> LayerResult<()> {
        self.put_lifecycle_impl(bucket, rules).await
    }

    async fn lifecycle_pass(&self, now_ms: i64, day_ms: i64) -> LayerResult<LifecycleReport> {
        S3Semantics::lifecycle_pass(self, now_ms, day_ms).await
    }

    async fn put_object_ownership(&self, bucket: &str, ownership: Option<ObjectOwnership>) -> LayerResult<()> {
        self.update_bucket_record(bucket, |rec| {
            rec.object_ownership = ownership;
            Ok(())
        })
        .await
    }

    async fn put_public_access_block(&self, bucket: &str, block: Option<PublicAccessBlock>) -> LayerResult<()> {
        self.update_bucket_record(bucket, |rec| {
            rec.public_access_block = block;
            Ok(())
        })
        .await
    }

    async fn put_bucket_policy(&self, bucket: &str, policy: Option<String>) -> LayerResult<()> {
        self.put_bucket_policy_impl(bucket, policy).await
    }

    async fn put_bucket_cors(&self, bucket: &str, rules: Option<Vec<CorsRule>>) -> LayerResult<()> {
        self.put_bucket_cors_impl(bucket, rules).await
    }

    async fn put_bucket_encryption(&self, bucket: &str, encryption: Option<BucketEncryption>) -> LayerResult<()> {
        if let Some(e) = &encryption {
            e.validate()?;
        }
        self.update_bucket_record(bucket, |rec| {
            rec.encryption = encryption.clone();
            Ok(())
        })
        .await
    }

    async fn put_bucket_acl(&self, bucket: &str, acl: Option<Vec<AclGrant>>) -> LayerResult<()> {
        self.put_bucket_acl_impl(bucket, acl).await
    }

    async fn put_bucket_tags(&self, bucket: &str, tags: Vec<(String, String)>) -> LayerResult<()> {
        self.put_bucket_tags_impl(bucket, tags).await
    }

    async fn put_object_lock_config(&self, bucket: &str, cfg: LockConfig) -> LayerResult<()> {
        self.put_lock_config_impl(bucket, cfg).await
    }

    async fn change_object_lock(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        bypass_governance: bool,
    ) -> LayerResult<()> {
        self.change_lock_impl(bucket, key, version_id, change, bypass_governance).await
    }

    async fn put_object(&self, bucket: &str, key: &str, body: PutBody, opts: PutOptions) -> LayerResult<ObjectMeta> {
        self.put_object_impl(bucket, key, body, opts).await
    }

    async fn get_object_sse(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        range: Option<RangeRequest>,
        part_number: Option<u32>,
        pre: &Precondition,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<GetResult> {
        self.get_object_impl(bucket, key, version_id, range, part_number, pre, customer).await
    }

    async fn object_meta_unchecked(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> LayerResult<ObjectMeta> {
        Ok(self.stat_object(bucket, key, version_id).await?.meta)
    }

    async fn head_object_sse(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        pre: &Precondition,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<ObjectMeta> {
        let meta = self.stat_object(bucket, key, version_id).await?.meta;
        pre.check(&meta)?;
        self.check_read_key(meta.sse.as_ref(), customer)?;
        Ok(meta)
    }

    async fn delete_object_with(&self, bucket: &str, key: &str, opts: &DeleteOptions) -> LayerResult<DeleteResult> {
        self.delete_object_impl(bucket, key, opts).await
    }

    async fn copy_object_with(
        &self,
        src: (&str, &str, Option<&str>),
        src_pre: &Precondition,
        dst: (&str, &str),
        new_meta: Option<PutOptions>,
        tags: CopyTags,
        access: ObjectAccess,
        keys: CopyKeys,
    ) -> LayerResult<ObjectMeta> {
        let (bucket, key, version) = src;
        let src = crate::objects::CopySource { bucket, key, version, pre: src_pre };
        let copy = crate::objects::CopyWrite { new_meta, tags, access, keys };
        self.copy_object_impl(src, dst.0, dst.1, copy).await
    }

    async fn list_objects(&self, bucket: &str, q: &ListQuery) -> LayerResult<ListPage> {
        self.list_objects_impl(bucket, q).await
    }

    async fn list_object_versions(&self, bucket: &str, q: &VersionQuery) -> LayerResult<VersionPage> {
        self.list_object_versions_impl(bucket, q).await
    }

    async fn get_tags(&self, bucket: &str, key: &str, version_id: Option<&str>) -> LayerResult<Vec<(String, String)>> {
        self.get_tags_impl(bucket, key, version_id).await
    }
    async fn expiration_of(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> LayerResult<Option<ObjectExpiration>> {
        self.expiration_of_impl(bucket, key, meta).await
    }

    async fn put_tags(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tags: Vec<(String, String)>,
    ) -> LayerResult<()> {
        self.put_tags_impl(bucket, key, version_id, tags).await
    }

    async fn put_object_acl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        acl: Option<Vec<AclGrant>>,
    ) -> LayerResult<()> {
        self.put_object_acl_impl(bucket, key, version_id, acl).await
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> LayerResult<String> {
        self.create_multipart_impl(bucket, key, opts).await
    }

    async fn upload_part_sse(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<PartInfo> {
        self.upload_part_impl(bucket, key, upload_id, part, body, customer).await
    }

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
    ) -> LayerResult<PartInfo> {
        let src = crate::objects::CopySource { bucket: src_bucket, key: src_key, version: src_version, pre: src_pre };
        self.upload_part_copy_impl(bucket, key, upload_id, part, src, range, keys).await
    }

    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        pre: &Precondition,
        extra_meta: Vec<(String, String)>,
    ) -> LayerResult<ObjectMeta> {
        self.complete_multipart_impl(bucket, key, upload_id, parts, pre, extra_meta).await
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<()> {
        self.abort_multipart_impl(bucket, key, upload_id).await
    }

    async fn upload_options(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<PutOptions> {
        Ok(self.upload_record(&self.store.snapshot(), bucket, key, upload_id).await?.opts)
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<Vec<PartInfo>> {
        self.list_parts_impl(bucket, key, upload_id).await
    }

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> LayerResult<Vec<UploadInfo>> {
        self.list_uploads_impl(bucket, prefix).await
    }

    fn is_ready(&self) -> bool {
        self.store.is_ready()
    }

    async fn shutdown(&self) -> LayerResult<()> {
        self.store.close().await.map_err(LayerError::from)
    }
}
