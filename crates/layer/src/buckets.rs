//! Buckets: a bucket is a collection of the store plus a record (its creation time) in the layer's system
//! collection, created and removed in one transaction.

use crate::acl::AclGrant;
use crate::cors::CorsRule;
use crate::error::{LayerError, LayerResult};
use crate::records::*;
use crate::semantics::S3Semantics;
use crate::{BucketInfo, BucketOptions, LockConfig, ObjectLayer, Versioning, validate_bucket_name};
use mosaic_store::{ErrorKind, Op, Snapshot, Store, Txn};

/// Most tags of a bucket (S3's limit).
pub const MAX_BUCKET_TAGS: usize = 50;
/// Largest bucket policy document (S3's limit).
pub const MAX_BUCKET_POLICY_BYTES: usize = 20 * 1024;
/// Most buckets a store lists (S3 allows a million per account).
/// Tries a change of a bucket's record makes while other changes of it land first.
const MAX_RECORD_UPDATE_TRIES: usize = 64;
pub const MAX_BUCKETS: usize = 1_000_000;

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn create_bucket_impl(&self, bucket: &str, opts: BucketOptions) -> LayerResult<()> {
        validate_bucket_name(bucket)?;
        crate::acl::validate_acl(opts.acl.as_deref().unwrap_or_default())?;
        let rec = BucketRecord {
            version: RECORD_VERSION,
            created_unix_ms: now_ms(),
            versioning: if opts.object_lock { Versioning::Enabled } else { Versioning::Unversioned },
            owner: opts.owner,
            object_lock: opts.object_lock.then_some(LockConfig { enabled: true, default_retention: None }),
            tags: Vec::new(),
            lifecycle: None,
            acl: opts.acl,
            cors: None,
            policy: None,
            public_access_block: None,
            object_ownership: opts.object_ownership,
            encryption: None,
        };
        let name = bucket_record_name(bucket);
        let txn = Txn::new()
            .op(Op::CreateCollection { name: bucket_collection(bucket) })
            .op(Op::Reset { coll: self.sys().await?, name: name.clone() })
            .op(Op::SetAttr { coll: self.sys().await?, name, key: ATTR_BUCKET.to_vec(), value: rec.encode() });
        let r = match self.commit(txn).await {
            Err(e) if e.is_op(0, ErrorKind::CollectionExists) => self.adopt_orphan_collection(bucket, &rec).await,
            // Cut short (e.g. another node created the same bucket at the same instant and took some of the
            // drives first): if the bucket is there now, it exists; else the error stands (retryable).
            Err(e) => match self.record_present(bucket).await {
                Ok(true) => Err(LayerError::BucketExists),
                _ => Err(e.into()),
            },
            Ok(_) => Ok(()),
        };
        self.forget_bucket_state(bucket);
        r
    }

    /// Whether a bucket's record is there (whatever it holds).
    async fn record_present(&self, bucket: &str) -> LayerResult<bool> {
        let sys = self.sys().await?;
        Ok(self.store.snapshot().lookup(&sys, &bucket_record_name(bucket)).await?.is_some())
    }

    /// CreateBucket found the bucket's collection. With its record, the bucket exists. Without one, and
    /// empty, it is what a creation cut short left behind (its collection committed on a quorum of drives,
    /// its record on fewer, e.g. two nodes creating one bucket at once): the creation finishes it. The record
    /// is created, never replaced, so of two that finish it one wins and the other is told it exists.
    async fn adopt_orphan_collection(&self, bucket: &str, rec: &BucketRecord) -> LayerResult<()> {
        if self.record_present(bucket).await? {
            return Err(LayerError::BucketExists);
        }
        let snap = self.store.snapshot();
        let Some(coll) = snap.collection(&bucket_collection(bucket)).await? else {
            // Removed meanwhile: the name is free again, but this creation raced a delete.
            return Err(LayerError::Conflict);
        };
        if !snap.list_entries(&coll, b"", b"", 1).await?.is_empty() {
            return Err(LayerError::Corrupt(format!("bucket {bucket} holds objects but has no record")));
        }
        drop(snap);
        let (sys, name) = (self.sys().await?, bucket_record_name(bucket));
        let txn = Txn::new().op(Op::Create { coll: sys.clone(), name: name.clone() }).op(Op::SetAttr {
            coll: sys,
            name,
            key: ATTR_BUCKET.to_vec(),
            value: rec.encode(),
        });
        match self.commit(txn).await {
            Err(e) if e.is_op(0, ErrorKind::AlreadyExists) => Err(LayerError::BucketExists),
            Err(e) => Err(e.into()),
            Ok(_) => {
                tracing::warn!(
                    bucket,
                    "an empty bucket collection without a record (a creation cut short) was completed"
                );
                Ok(())
            }
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
        let committed = self.commit(txn).await;
        self.forget_bucket_state(bucket);
        match committed {
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

    /// A bucket's record as the trait shows it, from the cache of bucket states (every request of a
    /// non-root key reads it for its access check).
    pub(crate) async fn bucket_info_impl(&self, bucket: &str) -> LayerResult<BucketInfo> {
        Ok((*self.bucket_state(bucket).await?).clone())
    }

    /// Enables or suspends versioning. A bucket once versioned cannot become unversioned again.
    /// Enables or suspends versioning. A bucket once versioned cannot become unversioned again, and a bucket
    /// with object lock stays versioned.
    pub(crate) async fn put_bucket_versioning_impl(&self, bucket: &str, v: Versioning) -> LayerResult<()> {
        if v == Versioning::Unversioned {
            return Err(LayerError::InvalidArgument("versioning can be Enabled or Suspended".into()));
        }
        self.update_bucket_record(bucket, |rec| {
            if rec.object_lock.is_some() && v != Versioning::Enabled {
                return Err(LayerError::InvalidBucketState(
                    "versioning cannot be suspended on a bucket with object lock".into(),
                ));
            }
            rec.versioning = v;
            Ok(())
        })
        .await
    }

    /// Sets a bucket's tags (empty: removes them).
    pub(crate) async fn put_bucket_tags_impl(&self, bucket: &str, tags: Vec<(String, String)>) -> LayerResult<()> {
        if tags.len() > MAX_BUCKET_TAGS {
            return Err(LayerError::InvalidTag(format!("at most {MAX_BUCKET_TAGS} tags per bucket")));
        }
        crate::objects::validate_tags(&tags)?;
        self.update_bucket_record(bucket, |rec| {
            rec.tags = tags.clone();
            Ok(())
        })
        .await
    }

    /// Sets a bucket's policy document (None: removes it).
    pub(crate) async fn put_bucket_policy_impl(&self, bucket: &str, policy: Option<String>) -> LayerResult<()> {
        if policy.as_ref().is_some_and(|p| p.len() > MAX_BUCKET_POLICY_BYTES) {
            return Err(LayerError::InvalidArgument(format!(
                "a bucket policy has at most {MAX_BUCKET_POLICY_BYTES} bytes"
            )));
        }
        self.update_bucket_record(bucket, |rec| {
            rec.policy = policy.clone();
            Ok(())
        })
        .await
    }

    /// Sets a bucket's CORS rules (None: removes them).
    pub(crate) async fn put_bucket_cors_impl(&self, bucket: &str, rules: Option<Vec<CorsRule>>) -> LayerResult<()> {
        if let Some(r) = &rules {
            crate::cors::validate_cors(r)?;
        }
        self.update_bucket_record(bucket, |rec| {
            rec.cors = rules.clone();
            Ok(())
        })
        .await
    }

    /// Sets a bucket's ACL (None: private).
    pub(crate) async fn put_bucket_acl_impl(&self, bucket: &str, acl: Option<Vec<AclGrant>>) -> LayerResult<()> {
        crate::acl::validate_acl(acl.as_deref().unwrap_or_default())?;
        self.update_bucket_record(bucket, |rec| {
            rec.acl = acl.clone();
            Ok(())
        })
        .await
    }

    /// Changes a bucket's record with `f`, asserting it unchanged since it was read; when another change
    /// landed first, reads it again and applies `f` to that (bounded: `MAX_RECORD_UPDATE_TRIES`), so
    /// concurrent changes of one bucket's settings all land, the last one winning, as in S3.
    pub(crate) async fn update_bucket_record(
        &self,
        bucket: &str,
        mut f: impl FnMut(&mut BucketRecord) -> LayerResult<()>,
    ) -> LayerResult<()> {
        for _ in 0..MAX_RECORD_UPDATE_TRIES {
            match self.try_update_bucket_record(bucket, &mut f).await {
                Err(LayerError::Conflict) => tokio::task::yield_now().await,
                done => return done,
            }
        }
        Err(LayerError::Conflict)
    }

    async fn try_update_bucket_record(
        &self,
        bucket: &str,
        f: &mut impl FnMut(&mut BucketRecord) -> LayerResult<()>,
    ) -> LayerResult<()> {
        let (mut rec, before) = self.bucket_record_raw(bucket).await?;
        f(&mut rec)?;
        let (coll, name) = (self.sys().await?, bucket_record_name(bucket));
        let txn = Txn::new()
            .op(Op::AssertAttr {
                coll: coll.clone(),
                name: name.clone(),
                key: ATTR_BUCKET.to_vec(),
                expected: Some(before),
            })
            .op(Op::SetAttr { coll, name, key: ATTR_BUCKET.to_vec(), value: rec.encode() });
        let r = self.commit(txn).await;
        self.forget_bucket_state(bucket);
        match r {
            // Changed (or removed) meanwhile.
            Err(e) if e.is_op(0, ErrorKind::AssertionFailed) => Err(LayerError::Conflict),
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }

    /// A bucket's record.
    pub(crate) async fn bucket_record(&self, bucket: &str) -> LayerResult<BucketRecord> {
        Ok(self.bucket_record_raw(bucket).await?.0)
    }

    /// A bucket's record and its bytes as stored.
    async fn bucket_record_raw(&self, bucket: &str) -> LayerResult<(BucketRecord, Vec<u8>)> {
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
        Ok((BucketRecord::decode(&raw, &whose)?, raw))
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

/// The trait's view of a bucket's record.
pub(crate) fn info_of(bucket: &str, rec: BucketRecord) -> BucketInfo {
    BucketInfo {
        name: bucket.to_string(),
        created_unix_ms: rec.created_unix_ms,
        versioning: rec.versioning,
        owner: rec.owner,
        object_lock: rec.object_lock,
        tags: rec.tags,
        lifecycle: rec.lifecycle,
        acl: rec.acl,
        cors: rec.cors,
        policy: rec.policy,
        public_access_block: rec.public_access_block,
        object_ownership: rec.object_ownership,
        encryption: rec.encryption,
    }
}
