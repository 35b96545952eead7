//! Objects: PUT (an overwrite is one transaction: reset, data, metadata, so readers see the old object or
//! the new one), S3 append, GET and HEAD with conditions, ranges and part numbers, DELETE, CopyObject (a
//! clone: no data moves) and tags.

use crate::error::{LayerError, LayerResult};
use crate::meta::{META_VERSION, ObjectMeta, Precondition, PutOptions};
use crate::records::*;
use crate::semantics::{S3Semantics, Stat, push_meta_ops, read_meta};
use crate::*;
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use mosaic_store::{ErrorKind, Op, Snapshot, Store, Txn};
use std::sync::Arc;

/// Bytes per chunk of a GET body.
const READ_CHUNK_BYTES: u64 = 1 << 20;
/// Chunks of a GET body read ahead of the one being sent (memory per GET: this many chunks).
const READ_AHEAD_CHUNKS: usize = 4;
/// Most bytes a body keeps read ahead of the socket (so that many slow readers do not hold much memory).
const READ_AHEAD_BYTES: u64 = 8 << 20;
/// Largest single read of a body.
const READ_CHUNK_MAX_BYTES: u64 = 4 << 20;
pub const MAX_TAGS: usize = 10;

/// Where a write's conditions sit in its transaction, to answer the S3 error of the one that failed.
#[derive(Default)]
struct WriteConditions {
    /// If-Match: the key must exist (NoSuchKey).
    exists: Option<usize>,
    /// If-Match with an ETag, If-None-Match: * (PreconditionFailed).
    precondition: Vec<usize>,
    /// If-None-Match with an ETag: the ETag read before is still the object's (ConditionalConflict).
    unchanged: Option<usize>,
}

impl WriteConditions {
    fn error_of(&self, e: mosaic_store::StoreError) -> LayerError {
        let failed = |i: &usize| e.is_op(*i, ErrorKind::AssertionFailed);
        if self.exists.as_ref().is_some_and(failed) {
            LayerError::NoSuchKey
        } else if self.precondition.iter().any(failed) {
            LayerError::PreconditionFailed
        } else if self.unchanged.as_ref().is_some_and(failed) {
            LayerError::ConditionalConflict
        } else {
            e.into()
        }
    }
}

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn put_object_impl(
        &self,
        bucket: &str,
        key: &str,
        body: PutBody,
        opts: PutOptions,
    ) -> LayerResult<ObjectMeta> {
        validate_key(key)?;
        opts.validate()?;
        let coll = self.bucket_coll(&self.store.snapshot(), bucket).await?;
        if let Some(offset) = opts.write_offset {
            let state = self.bucket_state(bucket).await?;
            if !state.versioning.is_unversioned() {
                return Err(LayerError::InvalidArgument("appends are not supported in versioned buckets".into()));
            }
            if opts.sse.is_some() || state.encryption.is_some() {
                return Err(LayerError::InvalidArgument("appends are not supported with encryption".into()));
            }
            return self.append(coll, bucket, key, body, opts, offset).await;
        }
        // A high-priority object holds background work back from its first byte to its commit.
        let _prioritized = crate::meta::wants_high_priority(&opts.user_metadata).then(|| self.store.hold_priority());
        let lock = self.lock_of_new_version(bucket, &opts.lock).await?;
        let sealed = self.seal_for_write(bucket, opts.sse.as_ref()).await?;
        let salt = sealed.as_ref().map(|_| crate::sse::new_salt());
        let stream = sealed.as_ref().zip(salt.as_deref()).map(|((_, k), s)| (k, s));
        let (name, hint) = (key.as_bytes().to_vec(), key.as_bytes().to_vec());
        let target = crate::ingest::StageFor { coll: coll.clone(), name, hint };
        let (ing, plain) = self.ingest_encrypting(body, stream, self.cfg.max_object_bytes, &target).await?;
        let mut meta = opts.clone().into_meta(plain.size_bytes, plain.md5_hex, now_ms());
        meta.sse = sealed.map(|(sse, _)| crate::sse::SseMeta { salts: salt.into_iter().collect(), ..sse });
        (meta.retention, meta.legal_hold) = (lock.retention, lock.legal_hold);
        meta.checksums.extend(ing.extra.iter().cloned());
        let name = key.as_bytes().to_vec();
        let mut txn = Txn::new();
        let conditions = self.push_write_conditions(&mut txn, &coll, key, &opts).await?;
        let version = self.push_new_version(&mut txn, &coll, bucket, key).await?;
        version.stamp.apply(&mut meta);
        txn.push(Op::Reset { coll: coll.clone(), name: name.clone() });
        ing.push_ops(&mut txn, &coll, &name, 0);
        push_meta_ops(&mut txn, &coll, &name, &meta)?;
        if !opts.tags.is_empty() {
            let value = encode_tags(&opts.tags);
            txn.push(Op::SetAttr { coll: coll.clone(), name: name.clone(), key: ATTR_TAGS.to_vec(), value });
        }
        match self.commit(txn).await {
            Err(e) if version.is_conflict(&e) => Err(LayerError::Conflict),
            Err(e) => Err(conditions.error_of(e)),
            Ok(_) => Ok(meta),
        }
    }

    /// A write's conditions as assertions at the head of its transaction, so that no concurrent writer slips
    /// between check and write. If-None-Match with an ETag has no assertion of its own: the current ETag is
    /// read first (equal: 412), then asserted unchanged (a change meanwhile: 409, as S3 answers).
    async fn push_write_conditions(
        &self,
        txn: &mut Txn<S::Coll, S::Staged>,
        coll: &S::Coll,
        key: &str,
        opts: &PutOptions,
    ) -> LayerResult<WriteConditions> {
        let name = key.as_bytes().to_vec();
        let mut c = WriteConditions::default();
        let assert_etag = |expected: Option<Vec<u8>>| Op::AssertAttr {
            coll: coll.clone(),
            name: name.clone(),
            key: ATTR_ETAG.to_vec(),
            expected,
        };
        if opts.if_none_match_any {
            c.precondition.push(txn.push(assert_etag(None)));
        }
        if let Some(etag) = &opts.if_none_match {
            let snap = self.store.snapshot();
            let current = match snap.lookup(coll, key.as_bytes()).await? {
                Some(info) => snap.attr(&info.obj, ATTR_ETAG).await?,
                None => None,
            };
            if current.as_deref() == Some(etag.trim().trim_matches('"').as_bytes()) {
                return Err(LayerError::PreconditionFailed);
            }
            c.unchanged = Some(txn.push(assert_etag(current)));
        }
        if let Some(etag) = &opts.if_match {
            // A missing key, or one whose current version is a delete marker (no ETag), is NoSuchKey.
            let snap = self.store.snapshot();
            let current = match snap.lookup(coll, key.as_bytes()).await? {
                Some(info) => snap.attr(&info.obj, ATTR_ETAG).await?,
                None => None,
            };
            let Some(current) = current else { return Err(LayerError::NoSuchKey) };
            c.exists = Some(txn.push(Op::AssertExists { coll: coll.clone(), name: name.clone() }));
            let etag = etag.trim().trim_matches('"');
            let expected = if etag == "*" { current } else { etag.as_bytes().to_vec() };
            c.precondition.push(txn.push(assert_etag(Some(expected))));
        }
        Ok(c)
    }

    /// S3 append (`x-amz-write-offset-bytes`): the bytes go into one append operation at the current end,
    /// which must be `offset`; the ETag chains the previous one with the new bytes' MD5.
    async fn append(
        &self,
        coll: S::Coll,
        bucket: &str,
        key: &str,
        body: PutBody,
        opts: PutOptions,
        offset: u64,
    ) -> LayerResult<ObjectMeta> {
        let snap = self.store.snapshot();
        let existing = match snap.lookup(&coll, key.as_bytes()).await? {
            Some(info) => Some((read_meta(&snap, &info.obj, bucket, key).await?, info.size_bytes)),
            None => None,
        };
        drop(snap);
        let (old_meta, old_size) = match existing {
            Some((m, _)) if m.is_encrypted() => {
                return Err(LayerError::InvalidArgument("an encrypted object cannot be appended to".into()));
            }
            Some((m, size)) => (Some(m), size),
            None if offset == 0 => (None, 0),
            None => return Err(LayerError::NoSuchKey),
        };
        if offset != old_size {
            return Err(LayerError::InvalidWriteOffset);
        }
        let geometry = self.store.geometry();
        let max = self.cfg.max_object_bytes.saturating_sub(offset).min(geometry.max_op_data_bytes);
        let (data, md5) = self.ingest_to_memory(body, max).await?;
        let new_size = offset + data.len() as u64;
        let etag = match &old_meta {
            Some(m) => {
                let mut h = Md5::new();
                h.update(m.etag.as_bytes());
                h.update(md5);
                hex::encode(h.finalize())
            }
            None => hex::encode(md5),
        };
        let mut meta = match old_meta.clone() {
            Some(m) => m,
            None => opts.clone().into_meta(0, String::new(), now_ms()),
        };
        meta.size_bytes = new_size;
        meta.etag = etag;
        meta.last_modified_unix_ms = now_ms();
        meta.checksums.clear();
        let name = key.as_bytes().to_vec();
        let mut txn = Txn::new();
        // The object must still be the one whose end was checked.
        let expected = old_meta.map(|m| m.etag.into_bytes());
        let same =
            txn.push(Op::AssertAttr { coll: coll.clone(), name: name.clone(), key: ATTR_ETAG.to_vec(), expected });
        let append =
            txn.push(Op::Append { coll: coll.clone(), name: name.clone(), data, expected_offset: Some(offset) });
        push_meta_ops(&mut txn, &coll, &name, &meta)?;
        match self.commit(txn).await {
            // A concurrent writer changed the object between our read and the commit.
            Err(e) if e.is_op(same, ErrorKind::AssertionFailed) || e.is_op(append, ErrorKind::OffsetMismatch) => {
                Err(LayerError::InvalidWriteOffset)
            }
            r => r.map(|_| meta).map_err(LayerError::from),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn get_object_impl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        range: Option<RangeRequest>,
        part_number: Option<u32>,
        pre: &Precondition,
        customer: Option<&crate::sse::CustomerKey>,
    ) -> LayerResult<GetResult> {
        let Stat { snap, info, meta, .. } = self.stat_object(bucket, key, version_id).await?;
        pre.check(&meta)?;
        let range = resolve_range(&meta, range, part_number)?;
        let object_key = self.check_read_key(meta.sse.as_ref(), customer)?;
        let (start, end) = range.map(|r| (r.start, r.end)).unwrap_or((0, meta.size_bytes));
        let mut body = match (&meta.sse, object_key) {
            (Some(sse), Some(k)) => {
                let stored = crate::sse::stored_size(meta.size_bytes, &meta.part_sizes);
                if info.size_bytes != stored {
                    return Err(LayerError::Corrupt(format!(
                        "{bucket}/{key} holds {} bytes where its encryption needs {stored}",
                        info.size_bytes
                    )));
                }
                crate::sse::decrypt_range(snap, info.obj, sse, &k, meta.size_bytes, &meta.part_sizes, start, end)?
            }
            _ => {
                let chunk_bytes = read_chunk_bytes(self.store.geometry().unit_bytes);
                if end > start && end - start <= chunk_bytes {
                    // One chunk (every small object): read it here, without a stream of reads in flight.
                    // The snapshot (and a high-priority object's prioritized reader) lives until the body
                    // is taken, as a streamed body's does.
                    let data = read_exact(snap.as_ref(), &info.obj, start, end - start).await?;
                    let body: ByteStream = Box::pin(futures::stream::once(async move {
                        drop(snap);
                        Ok(data)
                    }));
                    return Ok(GetResult { meta, range, body });
                }
                body_stream(snap, info.obj, start, end, chunk_bytes)
            }
        };
        // Read the first chunk before answering: a damaged or unreadable object then gets an error status
        // instead of a 200 whose body breaks off (small objects fail wholly up front).
        let body: ByteStream = match body.next().await {
            Some(Err(e)) => return Err(e),
            Some(Ok(first)) => Box::pin(futures::stream::once(async { Ok(first) }).chain(body)),
            None => body,
        };
        Ok(GetResult { meta, range, body })
    }

    /// DELETE without a version id: removes the key in an unversioned bucket, else makes a delete marker
    /// its current version. With a version id: removes that version for good (the next newest becomes
    /// current when it was the current one), unless object lock keeps it. Deleting what does not exist
    /// succeeds (S3 semantics); conditions (If-Match and the like) apply to the version deleted.
    pub(crate) async fn delete_object_impl(
        &self,
        bucket: &str,
        key: &str,
        opts: &DeleteOptions,
    ) -> LayerResult<DeleteResult> {
        validate_key(key)?;
        let coll = self.bucket_coll(&self.store.snapshot(), bucket).await?;
        if let Some(v) = opts.version_id.as_deref() {
            return self.delete_version(&coll, bucket, key, v, opts).await;
        }
        if self.versioning(bucket).await?.is_unversioned() {
            if opts.has_conditions() {
                return self.delete_version(&coll, bucket, key, "null", opts).await;
            }
            return match self.commit(txn_of(opts).op(Op::Remove { coll, name: key.as_bytes().to_vec() })).await {
                Err(e) if e.is_op(0, ErrorKind::NotFound) => Ok(DeleteResult::default()),
                r => r.map(|_| DeleteResult::default()).map_err(LayerError::from),
            };
        }
        if opts.has_conditions() {
            let snap = self.store.snapshot();
            let Some(info) = snap.lookup(&coll, key.as_bytes()).await? else { return Ok(DeleteResult::default()) };
            check_delete_conditions(&read_meta(&snap, &info.obj, bucket, key).await?, opts)?;
            // The current version is asserted unchanged below (its version attribute).
        }
        let name = key.as_bytes().to_vec();
        let mut txn = txn_of(opts);
        let version = self.push_new_version(&mut txn, &coll, bucket, key).await?;
        let mut marker = PutOptions::default().into_meta(0, String::new(), now_ms());
        marker.delete_marker = true;
        version.stamp.apply(&mut marker);
        txn.push(Op::Reset { coll: coll.clone(), name: name.clone() });
        push_meta_ops(&mut txn, &coll, &name, &marker)?;
        match self.commit(txn).await {
            Err(e) if version.is_conflict(&e) => Err(LayerError::Conflict),
            r => {
                r.map(|_| DeleteResult { version_id: marker.version_id, delete_marker: true }).map_err(LayerError::from)
            }
        }
    }

    /// Removes one version for good: refused while object lock keeps it; its metadata record is asserted
    /// unchanged since the lock and the conditions were checked on it.
    async fn delete_version(
        &self,
        coll: &S::Coll,
        bucket: &str,
        key: &str,
        v: &str,
        opts: &DeleteOptions,
    ) -> LayerResult<DeleteResult> {
        let _lock = self.key_locks.lock(bucket, key).await?;
        let snap = self.store.snapshot();
        let named = opts.version_id.clone();
        let Some(found) = self.locate(&snap, coll, bucket, key, v).await? else {
            return Ok(DeleteResult { version_id: named, delete_marker: false });
        };
        check_delete_conditions(&found.meta, opts)?;
        crate::lock::check_removable(&found.meta, opts.bypass_governance, now_ms())?;
        let raw = crate::semantics::read_meta_raw(&snap, &found.info.obj, bucket, key).await?;
        let mut txn = txn_of(opts);
        let at = txn.push(Op::AssertAttr {
            coll: coll.clone(),
            name: found.name.clone(),
            key: ATTR_META.to_vec(),
            expected: Some(raw),
        });
        match found.current {
            // The next newest version becomes current, in the removed one's place.
            true => match self.newest_noncurrent(&snap, coll, key).await? {
                Some(next) => crate::versions::push_move_version(&mut txn, coll, &next, &found.name),
                None => _ = txn.push(Op::Remove { coll: coll.clone(), name: found.name.clone() }),
            },
            false => _ = txn.push(Op::Remove { coll: coll.clone(), name: found.name.clone() }),
        }
        drop(snap);
        let done = DeleteResult { version_id: named, delete_marker: found.meta.delete_marker };
        match self.commit(txn).await {
            Err(e) if e.is_op(at, ErrorKind::AssertionFailed) => Err(LayerError::Conflict),
            r => r.map(|_| done).map_err(LayerError::from),
        }
    }

    pub(crate) async fn copy_object_impl(
        &self,
        source: CopySource<'_>,
        dst_bucket: &str,
        dst_key: &str,
        copy: CopyWrite,
    ) -> LayerResult<ObjectMeta> {
        let CopyWrite { new_meta, tags, access, keys } = copy;
        validate_key(dst_key)?;
        crate::acl::validate_acl(access.acl.as_deref().unwrap_or_default())?;
        if let CopyTags::Replace(t) = &tags {
            validate_object_tags(t)?;
        }
        let Stat { snap, coll: src_coll, name: src, meta: src_meta, info: src_info } =
            self.stat_object(source.bucket, source.key, source.version).await?;
        source.pre.check(&src_meta)?;
        let dst_coll = self.bucket_coll(&snap, dst_bucket).await?;
        // The source's tags as of the version whose conditions were checked (the same snapshot).
        let tags = match tags {
            CopyTags::Replace(t) => t,
            CopyTags::Source => match snap.attr(&src_info.obj, ATTR_TAGS).await? {
                Some(raw) => decode_tags(&raw, &format!("{}/{}", source.bucket, source.key))?,
                None => Vec::new(),
            },
        };
        drop(snap);
        let same = source.bucket == dst_bucket && src.as_slice() == dst_key.as_bytes();
        if same && new_meta.is_none() && keys.dest.is_none() {
            return Err(LayerError::InvalidRequest(
                "This copy request is illegal because it is trying to copy an object to itself without changing \
                 the object's metadata, storage class, website redirect location or encryption attributes"
                    .into(),
            ));
        }
        let encrypted_copy = keys.dest.is_some() || self.bucket_state(dst_bucket).await?.encryption.is_some();
        if src_meta.is_encrypted() || keys.source.is_some() || encrypted_copy {
            let copy = CopyWrite { new_meta, tags: CopyTags::Replace(tags), access, keys };
            return self.copy_through(source, dst_bucket, dst_key, copy).await;
        }
        let new_lock = new_meta.as_ref().map(|o| o.lock);
        let mut meta = match new_meta {
            Some(opts) => {
                opts.validate()?;
                let mut m = opts.into_meta(src_meta.size_bytes, src_meta.etag.clone(), now_ms());
                m.checksums = src_meta.checksums.clone();
                m.part_sizes = src_meta.part_sizes.clone();
                m.part_checksums = src_meta.part_checksums.clone();
                m
            }
            None => ObjectMeta { last_modified_unix_ms: now_ms(), ..src_meta.clone() },
        };
        meta.version = META_VERSION;
        meta.version_id = None;
        meta.version_ns = 0;
        meta.upload_id = None;
        meta.tag_count = tags.len();
        meta.access = access;
        // The copy is a new version: the lock it asks for, else the bucket's default, never the source's.
        let asked = new_lock.unwrap_or_default();
        let lock = self.lock_of_new_version(dst_bucket, &asked).await?;
        (meta.retention, meta.legal_hold) = (lock.retention, lock.legal_hold);
        let dst = dst_key.as_bytes().to_vec();
        let mut txn = Txn::new();
        // The source must be the version whose conditions were checked.
        let expected = Some(src_meta.etag.clone().into_bytes());
        let source =
            txn.push(Op::AssertAttr { coll: src_coll.clone(), name: src.clone(), key: ATTR_ETAG.to_vec(), expected });
        let version = self.push_new_version(&mut txn, &dst_coll, dst_bucket, dst_key).await?;
        version.stamp.apply(&mut meta);
        if same && let Some(kept) = version.kept.clone() {
            // The current version copied onto itself in a versioned bucket: a new version with its data,
            // cloned from where the old one was just kept.
            txn.push(Op::Clone { coll: dst_coll.clone(), from: kept, to_coll: dst_coll.clone(), to: dst.clone() });
        } else if !same {
            txn.push(Op::Clone { coll: src_coll, from: src, to_coll: dst_coll.clone(), to: dst.clone() });
        }
        // The copy's tags, whatever the clone brought along (the count is in the record written with them).
        txn.push(if tags.is_empty() {
            Op::RemoveAttr { coll: dst_coll.clone(), name: dst.clone(), key: ATTR_TAGS.to_vec() }
        } else {
            Op::SetAttr {
                coll: dst_coll.clone(),
                name: dst.clone(),
                key: ATTR_TAGS.to_vec(),
                value: encode_tags(&tags),
            }
        });
        push_meta_ops(&mut txn, &dst_coll, &dst, &meta)?;
        match self.commit(txn).await {
            Err(e) if e.is_op(source, ErrorKind::AssertionFailed) => Err(LayerError::Conflict),
            Err(e) if version.is_conflict(&e) => Err(LayerError::Conflict),
            r => r.map(|_| meta).map_err(LayerError::from),
        }
    }

    /// A copy that reads the source and writes it again: the source or the copy is encrypted (a clone
    /// would carry the source's key). The plaintext's checksums stay the source's.
    async fn copy_through(
        &self,
        source: CopySource<'_>,
        dst_bucket: &str,
        dst_key: &str,
        copy: CopyWrite,
    ) -> LayerResult<ObjectMeta> {
        let CopyWrite { new_meta, tags, access, keys } = copy;
        let got = self
            .get_object_impl(source.bucket, source.key, source.version, None, None, source.pre, keys.source.as_ref())
            .await?;
        let mut opts = match new_meta {
            Some(o) => o,
            None => PutOptions::from_meta(&got.meta),
        };
        opts.validate()?;
        opts.access = access;
        opts.tags = match tags {
            CopyTags::Replace(t) => t,
            CopyTags::Source => self.get_tags_impl(source.bucket, source.key, source.version).await?,
        };
        opts.sse = keys.dest;
        opts.sse_sealed = None;
        let checksums: Vec<(String, String)> = got.meta.checksums.clone().into_iter().collect();
        let body = PutBody { stream: got.body, finish: Some(Box::new(move || Ok(checksums))) };
        self.put_object_impl(dst_bucket, dst_key, body, opts).await
    }

    pub(crate) async fn get_tags_impl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> LayerResult<Vec<(String, String)>> {
        let Stat { snap, info, .. } = self.stat_object(bucket, key, version_id).await?;
        match snap.attr(&info.obj, ATTR_TAGS).await? {
            Some(raw) => decode_tags(&raw, &format!("{bucket}/{key}")),
            None => Ok(Vec::new()),
        }
    }

    pub(crate) async fn put_tags_impl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tags: Vec<(String, String)>,
    ) -> LayerResult<()> {
        validate_object_tags(&tags)?;
        let _lock = self.key_locks.lock(bucket, key).await?;
        let Stat { snap, coll, name, info, .. } = self.stat_object(bucket, key, version_id).await?;
        // The tag count lives in the metadata record, changed with the tags in one transaction.
        let raw = crate::semantics::read_meta_raw(&*snap, &info.obj, bucket, key).await?;
        drop(snap);
        let mut meta = ObjectMeta::decode(&raw)?;
        meta.tag_count = tags.len();
        let (c, n) = (|| coll.clone(), || name.clone());
        let mut txn = Txn::new();
        let same = txn.push(Op::AssertAttr { coll: c(), name: n(), key: ATTR_META.to_vec(), expected: Some(raw) });
        txn.push(Op::SetAttr { coll: c(), name: n(), key: ATTR_META.to_vec(), value: meta.encode() });
        txn.push(if tags.is_empty() {
            Op::RemoveAttr { coll: c(), name: n(), key: ATTR_TAGS.to_vec() }
        } else {
            Op::SetAttr { coll: c(), name: n(), key: ATTR_TAGS.to_vec(), value: encode_tags(&tags) }
        });
        match self.commit(txn).await {
            // Deleted or changed since it was found.
            Err(e) if e.is_op(same, ErrorKind::AssertionFailed) => Err(LayerError::Conflict),
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }
}

impl<S: Store> S3Semantics<S> {
    /// Sets a version's ACL (None: private); the owner stays.
    pub(crate) async fn put_object_acl_impl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        acl: Option<Vec<crate::acl::AclGrant>>,
    ) -> LayerResult<()> {
        validate_key(key)?;
        crate::acl::validate_acl(acl.as_deref().unwrap_or_default())?;
        self.change_meta(bucket, key, version_id, |meta| {
            meta.access.acl = acl;
            Ok(())
        })
        .await
    }

    /// Changes a version's metadata record with `f` under the key's lock, asserting the record unchanged
    /// since it was read (a concurrent change or delete answers Conflict rather than being overwritten).
    pub(crate) async fn change_meta(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        f: impl FnOnce(&mut ObjectMeta) -> LayerResult<()>,
    ) -> LayerResult<()> {
        let _lock = self.key_locks.lock(bucket, key).await?;
        let stat = self.stat_object(bucket, key, version_id).await?;
        let raw = crate::semantics::read_meta_raw(&*stat.snap, &stat.info.obj, bucket, key).await?;
        let mut meta = ObjectMeta::decode(&raw)?;
        f(&mut meta)?;
        let (coll, name) = (stat.coll, stat.name);
        drop(stat.snap);
        let txn = Txn::new()
            .op(Op::AssertAttr { coll: coll.clone(), name: name.clone(), key: ATTR_META.to_vec(), expected: Some(raw) })
            .op(Op::SetAttr { coll, name, key: ATTR_META.to_vec(), value: meta.encode() });
        match self.commit(txn).await {
            Err(e) if e.is_op(0, ErrorKind::AssertionFailed) => Err(LayerError::Conflict),
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }
}

/// The source of a copy: the object (a version of it) and the conditions it must meet.
/// What a copy writes besides the source's data: new metadata (REPLACE) or the source's, its tags, its
/// owner and ACL, and the encryption keys.
pub(crate) struct CopyWrite {
    pub(crate) new_meta: Option<PutOptions>,
    pub(crate) tags: CopyTags,
    pub(crate) access: crate::acl::ObjectAccess,
    pub(crate) keys: CopyKeys,
}

pub(crate) struct CopySource<'a> {
    pub(crate) bucket: &'a str,
    pub(crate) key: &'a str,
    pub(crate) version: Option<&'a str>,
    pub(crate) pre: &'a Precondition,
}

/// A DELETE's transaction, in the background IO class when the options say so.
fn txn_of<C, St>(opts: &DeleteOptions) -> Txn<C, St> {
    if opts.background { Txn::new().with_priority(mosaic_store::Priority::Background) } else { Txn::new() }
}

/// Tag keys are 1-128 characters, values 0-256, keys unique.
/// An object's tag set: at most `MAX_TAGS`, each valid.
pub(crate) fn validate_object_tags(tags: &[(String, String)]) -> LayerResult<()> {
    if tags.len() > MAX_TAGS {
        return Err(LayerError::InvalidTag(format!("at most {MAX_TAGS} tags per object")));
    }
    validate_tags(tags)
}

pub(crate) fn validate_tags(tags: &[(String, String)]) -> LayerResult<()> {
    for (i, (k, v)) in tags.iter().enumerate() {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
            return Err(LayerError::InvalidTag("tag keys are 1-128 and values 0-256 characters".into()));
        }
        if tags[..i].iter().any(|(x, _)| x == k) {
            return Err(LayerError::InvalidTag(format!("the tag key {k:?} is given twice")));
        }
    }
    Ok(())
}

/// The conditions of a DELETE on the version it deletes: a delete marker matches only If-Match `*`.
fn check_delete_conditions(meta: &ObjectMeta, opts: &DeleteOptions) -> LayerResult<()> {
    if let Some(m) = &opts.if_match {
        let m = m.trim().trim_matches('"');
        if m != "*" && (meta.delete_marker || m != meta.etag) {
            return Err(LayerError::PreconditionFailed);
        }
    }
    if let Some(t) = opts.if_match_last_modified_ms
        && (meta.delete_marker || t.div_euclid(1000) != meta.last_modified_unix_ms.div_euclid(1000))
    {
        return Err(LayerError::PreconditionFailed);
    }
    if let Some(size) = opts.if_match_size
        && (meta.delete_marker || size != meta.size_bytes)
    {
        return Err(LayerError::PreconditionFailed);
    }
    Ok(())
}

/// The byte range a GET serves: from a Range header or a part number (not both), None for the whole.
pub(crate) fn resolve_range(
    meta: &ObjectMeta,
    range: Option<RangeRequest>,
    part_number: Option<u32>,
) -> LayerResult<Option<ByteRange>> {
    match (range, part_number) {
        (Some(_), Some(_)) => Err(LayerError::InvalidArgument("Range and partNumber cannot be combined".into())),
        (Some(r), None) => Ok(Some(r.resolve(meta.size_bytes)?)),
        (None, Some(p)) if meta.part_sizes.is_empty() => {
            if p != 1 {
                return Err(LayerError::InvalidPartNumber);
            }
            Ok(None)
        }
        (None, Some(p)) => {
            let idx = p.checked_sub(1).ok_or(LayerError::InvalidPartNumber)? as usize;
            let sizes = &meta.part_sizes;
            if idx >= sizes.len() {
                return Err(LayerError::InvalidPartNumber);
            }
            let start: u64 = sizes[..idx].iter().sum();
            Ok(Some(ByteRange { start, end: start + sizes[idx] }))
        }
        (None, None) => Ok(None),
    }
}

/// Bytes of one read of a body: 1 MiB, or 256 units where a unit is larger than 4 KiB (an erasure set's
/// stripe: each of its drives then reads 1 MiB at a time, as one drive does).
fn read_chunk_bytes(unit_bytes: u64) -> u64 {
    READ_CHUNK_BYTES.max(unit_bytes.saturating_mul(256)).min(READ_CHUNK_MAX_BYTES)
}

/// `len` bytes at `pos`; fewer is an error (the object shrank under the snapshot's reader).
async fn read_exact<Sn: Snapshot>(snap: &Sn, obj: &Sn::Obj, pos: u64, len: u64) -> LayerResult<Bytes> {
    match snap.read(obj, pos, len).await {
        Ok(data) if data.len() as u64 == len => Ok(data),
        Ok(_) => Err(LayerError::Internal("object shrank while reading".into())),
        Err(e) => Err(e.into()),
    }
}

/// The body of [start, end) as a stream of chunks of `chunk_bytes`, reads in flight (at most
/// `READ_AHEAD_BYTES` of them, at least two) so the store stays busy while the client drains the socket.
/// The first error ends the stream; a short read is an error.
pub(crate) fn body_stream<Sn: Snapshot>(
    snap: Arc<Sn>,
    obj: Sn::Obj,
    start: u64,
    end: u64,
    chunk_bytes: u64,
) -> ByteStream {
    debug_assert!(chunk_bytes > 0);
    let chunks = (start..end).step_by(chunk_bytes as usize).map(move |pos| (pos, (end - pos).min(chunk_bytes)));
    let ahead = ((READ_AHEAD_BYTES / chunk_bytes) as usize).clamp(2, READ_AHEAD_CHUNKS);
    let reads = futures::stream::iter(chunks)
        .map(move |(pos, len)| {
            let (snap, obj) = (snap.clone(), obj.clone());
            async move { read_exact(snap.as_ref(), &obj, pos, len).await }
        })
        .buffered(ahead);
    let s = reads.scan(false, |failed, item| {
        let out = if *failed { None } else { Some(item) };
        *failed = out.as_ref().is_some_and(|i| i.is_err());
        futures::future::ready(out)
    });
    // A store's read futures need not be Sync; the stream is only ever polled through `&mut`.
    Box::pin(sync_wrapper::SyncStream::new(s))
}
