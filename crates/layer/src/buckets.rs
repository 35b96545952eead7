//! Buckets: a bucket is a collection of the store plus a record (its creation time) in the layer's system
//! collection, created and removed in one transaction.

use crate::error::{LayerError, LayerResult};
use crate::records::*;
use crate::semantics::S3Semantics;
use crate::{BucketInfo, ObjectLayer, validate_bucket_name};
use mosaic_store::{ErrorKind, Op, Snapshot, Store, Txn};

/// Most buckets a store lists (S3 allows a million per account).
pub const MAX_BUCKETS: usize = 1_000_000;

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn create_bucket_impl(&self, bucket: &str) -> LayerResult<()> {
        validate_bucket_name(bucket)?;
        let rec = BucketRecord { version: RECORD_VERSION, created_unix_ms: now_ms() };
        let name = bucket_record_name(bucket);
        let txn = Txn::new()
            .op(Op::CreateCollection { name: bucket_collection(bucket) })
            .op(Op::Reset { coll: self.sys().await?, name: name.clone() })
            .op(Op::SetAttr { coll: self.sys().await?, name, key: ATTR_BUCKET.to_vec(), value: rec.encode() });
        match self.commit(txn).await {
            Err(e) if e.is_op(0, ErrorKind::CollectionExists) => Err(LayerError::BucketExists),
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }

    pub(crate) async fn delete_bucket_impl(&self, bucket: &str) -> LayerResult<()> {
        // Abandoned multipart uploads do not keep a bucket alive in S3; remove them with it.
        for u in self.list_uploads_impl(bucket, "").await? {
            match self.abort_multipart_impl(bucket, &u.key, &u.upload_id).await {
                Ok(()) | Err(LayerError::NoSuchUpload) => {}
                Err(e) => return Err(e),
            }
        }
        let txn = Txn::new()
            .op(Op::RemoveCollection { name: bucket_collection(bucket) })
            .op(Op::Remove { coll: self.sys().await?, name: bucket_record_name(bucket) });
        match self.commit(txn).await {
            Err(e) if e.is_op(0, ErrorKind::CollectionNotFound) => Err(LayerError::NoSuchBucket),
            Err(e) if e.is_op(0, ErrorKind::CollectionNotEmpty) => Err(LayerError::BucketNotEmpty),
            // A bucket without its record (written by a build that crashed between the two): still gone.
            Err(e) if e.is_op(1, ErrorKind::NotFound) => {
                let txn = Txn::new().op(Op::RemoveCollection { name: bucket_collection(bucket) });
                self.commit(txn).await.map(|_| ()).map_err(LayerError::from)
            }
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }

    pub(crate) async fn bucket_info_impl(&self, bucket: &str) -> LayerResult<BucketInfo> {
        let snap = self.store.snapshot();
        self.bucket_coll(&snap, bucket).await?;
        let whose = format!(" of bucket {bucket}");
        let Some(info) = snap.lookup(&self.sys().await?, &bucket_record_name(bucket)).await? else {
            return Err(LayerError::Corrupt(format!("the bucket record{whose} is missing")));
        };
        let raw = snap
            .attr(&info.obj, ATTR_BUCKET)
            .await?
            .ok_or_else(|| LayerError::Corrupt(format!("the bucket record{whose} is empty")))?;
        let rec = BucketRecord::decode(&raw, &whose)?;
        Ok(BucketInfo { name: bucket.to_string(), created_unix_ms: rec.created_unix_ms })
    }

    pub(crate) async fn list_buckets_impl(&self) -> LayerResult<Vec<BucketInfo>> {
        let colls = self.store.snapshot().collections(BUCKET_PREFIX, MAX_BUCKETS).await?;
        let mut out = Vec::with_capacity(colls.len());
        for (name, _) in colls {
            let Some(bucket) = name.strip_prefix(BUCKET_PREFIX) else { continue };
            match self.bucket_info(bucket).await {
                Ok(b) => out.push(b),
                // Deleted since the listing's snapshot.
                Err(LayerError::NoSuchBucket) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
