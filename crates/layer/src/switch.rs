//! `Switch`: an [`ObjectLayer`] that hands every call to the layer it holds now, which can be replaced while
//! it serves. A cluster node serves S3 through one: when the cluster map changes, the node composes the
//! store of the new map and switches to it; calls under way finish on the layer they started on. Before the
//! first layer (a node not yet in a cluster with placement) every call is refused as unavailable, with the
//! reason the holder gave. A removal that a layer refuses because it is being replaced (`Switching`: its
//! group's step is being switched, nothing of it done) waits for the next layer and is made there, so that
//! clients do not see the switch.

use crate::*;
use async_trait::async_trait;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// How long a call refused as `Switching` waits, in all, for the next layers before it is refused (a step
/// is served within a Raft commit and a composition; a step that fails is armed again at once, which lifts
/// its seal, and the call is then made again on the same layer).
pub const SWITCH_WAIT: Duration = Duration::from_secs(5);

/// The most times one call is made (each time on a newer layer, or on the same one once `SWITCH_WAIT`
/// passed).
pub const SWITCH_ATTEMPTS_MAX: u32 = 8;

pub struct Switch {
    current: parking_lot::RwLock<Result<Arc<dyn ObjectLayer>, String>>,
    /// Counts the layers set: a call refused as `Switching` waits for it to change.
    generation: tokio::sync::watch::Sender<u64>,
    /// Calls refused as `Switching` that wait for the next layer now.
    waiting: std::sync::atomic::AtomicUsize,
    /// Calls made again after a `Switching` refusal, since the switch was made.
    made_again: std::sync::atomic::AtomicU64,
}

/// One call counted in `Switch::waiting` while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        debug_assert!(before > 0, "a waiting call ends once");
    }
}

impl Switch {
    /// A switch with no layer yet: calls are refused with `why`.
    pub fn new(why: impl Into<String>) -> Self {
        Switch {
            current: parking_lot::RwLock::new(Err(why.into())),
            generation: tokio::sync::watch::Sender::new(0),
            waiting: Default::default(),
            made_again: Default::default(),
        }
    }

    /// Serves the next calls with `layer`; returns the one it replaces.
    pub fn set(&self, layer: Arc<dyn ObjectLayer>) -> Option<Arc<dyn ObjectLayer>> {
        let replaced = std::mem::replace(&mut *self.current.write(), Ok(layer)).ok();
        self.generation.send_modify(|g| *g += 1);
        replaced
    }

    /// Refuses the next calls with `why`; returns the layer it held.
    pub fn clear(&self, why: impl Into<String>) -> Option<Arc<dyn ObjectLayer>> {
        let replaced = std::mem::replace(&mut *self.current.write(), Err(why.into())).ok();
        self.generation.send_modify(|g| *g += 1);
        replaced
    }

    /// The layer serving now.
    pub fn current(&self) -> LayerResult<Arc<dyn ObjectLayer>> {
        self.current.read().clone().map_err(LayerError::Unavailable)
    }

    /// Calls waiting for a newer layer now (after a `Switching` refusal).
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls made again after a `Switching` refusal so far (each time a call was made again counts).
    pub fn made_again_total(&self) -> u64 {
        self.made_again.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `call` on the layer serving now; refused as `Switching`, made again on each newer layer (or on the
    /// same one once `SWITCH_WAIT` passed), at most `SWITCH_ATTEMPTS_MAX` times. Only for calls that can be
    /// made again: a `Switching` refusal did nothing, and their inputs are not consumed.
    async fn across_switches<'a, T>(
        &'a self,
        call: impl Fn(Arc<dyn ObjectLayer>) -> BoxFuture<'a, LayerResult<T>>,
    ) -> LayerResult<T> {
        let deadline = tokio::time::Instant::now() + SWITCH_WAIT;
        let mut layers = self.generation.subscribe();
        let mut attempts = 0;
        loop {
            layers.borrow_and_update();
            attempts += 1;
            // The layer is dropped with its call: a replaced layer drains while this call waits.
            let refused = match call(self.current()?).await {
                Err(LayerError::Switching(why)) => why,
                done => return done,
            };
            if attempts >= SWITCH_ATTEMPTS_MAX || tokio::time::Instant::now() >= deadline {
                return Err(LayerError::Switching(refused));
            }
            let _waiting = Waiting::new(&self.waiting);
            let _ = tokio::time::timeout_at(deadline, layers.changed()).await;
            self.made_again.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl ObjectLayer for Switch {
    async fn create_bucket(&self, bucket: &str, opts: Option<&BucketOptions>) -> LayerResult<()> {
        self.current()?.create_bucket(bucket, opts).await
    }
    async fn delete_bucket(&self, bucket: &str) -> LayerResult<()> {
        self.current()?.delete_bucket(bucket).await
    }
    async fn bucket_info(&self, bucket: &str) -> LayerResult<BucketInfo> {
        self.current()?.bucket_info(bucket).await
    }
    async fn list_buckets(&self) -> LayerResult<Vec<BucketInfo>> {
        self.current()?.list_buckets().await
    }
    async fn put_bucket_versioning(&self, bucket: &str, versioning: Versioning) -> LayerResult<()> {
        self.current()?.put_bucket_versioning(bucket, versioning).await
    }
    async fn put_bucket_lifecycle(&self, bucket: &str, rules: Option<Vec<LifecycleRule>>) -> LayerResult<()> {
        self.current()?.put_bucket_lifecycle(bucket, rules).await
    }
    async fn lifecycle_pass(&self, now_ms: i64, day_ms: i64) -> LayerResult<LifecycleReport> {
        self.current()?.lifecycle_pass(now_ms, day_ms).await
    }
    async fn put_object_ownership(&self, bucket: &str, ownership: Option<ObjectOwnership>) -> LayerResult<()> {
        self.current()?.put_object_ownership(bucket, ownership).await
    }
    async fn put_public_access_block(&self, bucket: &str, block: Option<PublicAccessBlock>) -> LayerResult<()> {
        self.current()?.put_public_access_block(bucket, block).await
    }
    async fn put_bucket_policy(&self, bucket: &str, policy: Option<String>) -> LayerResult<()> {
        self.current()?.put_bucket_policy(bucket, policy).await
    }
    async fn put_bucket_cors(&self, bucket: &str, rules: Option<Vec<CorsRule>>) -> LayerResult<()> {
        self.current()?.put_bucket_cors(bucket, rules).await
    }
    async fn put_bucket_encryption(&self, bucket: &str, encryption: Option<BucketEncryption>) -> LayerResult<()> {
        self.current()?.put_bucket_encryption(bucket, encryption).await
    }
    async fn put_bucket_acl(&self, bucket: &str, acl: Option<Vec<AclGrant>>) -> LayerResult<()> {
        self.current()?.put_bucket_acl(bucket, acl).await
    }
    async fn put_bucket_tags(&self, bucket: &str, tags: Vec<(String, String)>) -> LayerResult<()> {
        self.current()?.put_bucket_tags(bucket, tags).await
    }
    async fn put_object_lock_config(&self, bucket: &str, cfg: LockConfig) -> LayerResult<()> {
        self.current()?.put_object_lock_config(bucket, cfg).await
    }
    async fn change_object_lock(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        bypass_governance: bool,
    ) -> LayerResult<()> {
        self.current()?.change_object_lock(bucket, key, version_id, change, bypass_governance).await
    }
    async fn put_object(&self, bucket: &str, key: &str, body: PutBody, opts: PutOptions) -> LayerResult<ObjectMeta> {
        self.current()?.put_object(bucket, key, body, opts).await
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
        self.current()?.get_object_sse(bucket, key, version_id, range, part_number, pre, customer).await
    }
    async fn object_meta_unchecked(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> LayerResult<ObjectMeta> {
        self.current()?.object_meta_unchecked(bucket, key, version_id).await
    }
    async fn head_object_sse(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        pre: &Precondition,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<ObjectMeta> {
        self.current()?.head_object_sse(bucket, key, version_id, pre, customer).await
    }
    async fn delete_object_with(&self, bucket: &str, key: &str, opts: &DeleteOptions) -> LayerResult<DeleteResult> {
        self.across_switches(|l| Box::pin(async move { l.delete_object_with(bucket, key, opts).await })).await
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
        self.current()?.copy_object_with(src, src_pre, dst, new_meta, tags, access, keys).await
    }
    async fn list_objects(&self, bucket: &str, q: &ListQuery) -> LayerResult<ListPage> {
        self.current()?.list_objects(bucket, q).await
    }
    async fn list_object_versions(&self, bucket: &str, q: &VersionQuery) -> LayerResult<VersionPage> {
        self.current()?.list_object_versions(bucket, q).await
    }
    async fn get_tags(&self, bucket: &str, key: &str, version_id: Option<&str>) -> LayerResult<Vec<(String, String)>> {
        self.current()?.get_tags(bucket, key, version_id).await
    }
    async fn expiration_of(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> LayerResult<Option<ObjectExpiration>> {
        self.current()?.expiration_of(bucket, key, meta).await
    }
    async fn put_tags(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tags: Vec<(String, String)>,
    ) -> LayerResult<()> {
        self.current()?.put_tags(bucket, key, version_id, tags).await
    }
    async fn put_object_acl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        acl: Option<Vec<AclGrant>>,
    ) -> LayerResult<()> {
        self.current()?.put_object_acl(bucket, key, version_id, acl).await
    }
    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> LayerResult<String> {
        self.current()?.create_multipart(bucket, key, opts).await
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
        self.current()?.upload_part_sse(bucket, key, upload_id, part, body, customer).await
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
        self.current()?
            .upload_part_copy_sse(bucket, key, upload_id, part, src_bucket, src_key, src_version, range, src_pre, keys)
            .await
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
        let (parts, extra_meta) = (&parts, &extra_meta);
        self.across_switches(|l| {
            Box::pin(async move {
                l.complete_multipart(bucket, key, upload_id, parts.clone(), pre, extra_meta.clone()).await
            })
        })
        .await
    }
    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<()> {
        self.across_switches(|l| Box::pin(async move { l.abort_multipart(bucket, key, upload_id).await })).await
    }
    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<Vec<PartInfo>> {
        self.current()?.list_parts(bucket, key, upload_id).await
    }
    async fn upload_options(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<PutOptions> {
        self.current()?.upload_options(bucket, key, upload_id).await
    }
    async fn list_uploads(&self, bucket: &str, prefix: &str) -> LayerResult<Vec<UploadInfo>> {
        self.current()?.list_uploads(bucket, prefix).await
    }
    fn is_ready(&self) -> bool {
        self.current().is_ok_and(|l| l.is_ready())
    }
    /// Shuts the layer serving now down; later calls are refused.
    async fn shutdown(&self) -> LayerResult<()> {
        match self.clear("the server is stopping") {
            Some(layer) => layer.shutdown().await,
            None => Ok(()),
        }
    }
}
