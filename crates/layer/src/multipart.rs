//! Multipart uploads: an upload is a record in the multipart collection, each part an object of its own
//! there (its data plus a part record). Completion is one transaction that clones the parts' data into the
//! target where their boundaries fall on the store's units (no data copied), copies the rest, writes the
//! metadata and removes the upload.

use crate::error::{LayerError, LayerResult};
use crate::ingest::Ingested;
use crate::meta::{ObjectMeta, Precondition, PutOptions};
use crate::records::*;
use crate::semantics::{S3Semantics, push_meta_ops, read_meta};
use crate::*;
use md5::{Digest, Md5};
use mosaic_store::{ErrorKind, Op, Snapshot, Store, Txn};
use std::collections::BTreeMap;

pub const MAX_PARTS: u32 = 10_000;
pub const MIN_PART_BYTES: u64 = 5 << 20;
pub const MAX_PART_BYTES: u64 = 5 << 30;
/// Most uploads one ListMultipartUploads call walks (S3 pages them by 1,000; deleting a bucket aborts
/// them all, in calls of this many).
pub const MAX_UPLOADS_LISTED: usize = 10_000;
/// Bytes of a part copied per read when its boundaries do not fall on the store's units.
const COPY_CHUNK_BYTES: u64 = 32 << 20;

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn create_multipart_impl(&self, bucket: &str, key: &str, opts: PutOptions) -> LayerResult<String> {
        validate_key(key)?;
        opts.validate()?;
        self.bucket_coll(&self.store.snapshot(), bucket).await?;
        // A lock asked for in a bucket without object lock is refused now, not at completion.
        self.lock_of_new_version(bucket, &opts.lock).await?;
        // The object key is made now; each part is a stream of it (an SSE-C key comes with every part).
        let mut opts = opts;
        opts.sse_sealed = self.seal_for_write(bucket, opts.sse.as_ref()).await?.map(|(sse, _)| sse);
        opts.sse = None;
        let upload_id = hex::encode(rand::random::<[u8; 16]>());
        let rec = UploadRecord { version: RECORD_VERSION, key: key.to_string(), initiated_unix_ms: now_ms(), opts };
        let name = upload_name(bucket, &upload_id, key);
        let txn = Txn::new().op(Op::Create { coll: self.mpu().await?, name: name.clone() }).op(Op::SetAttr {
            coll: self.mpu().await?,
            name,
            key: ATTR_UPLOAD.to_vec(),
            value: rec.encode(),
        });
        self.commit(txn).await?;
        Ok(upload_id)
    }

    pub(crate) async fn upload_part_impl(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<PartInfo> {
        check_part_number(part)?;
        let rec = self.upload_record(&self.store.snapshot(), bucket, key, upload_id).await?;
        let object_key = self.part_key(&rec, customer)?;
        self.ingest_part(bucket, key, upload_id, part, body, object_key).await
    }

    /// The object key a part of the upload is encrypted with (None: the upload is not encrypted); an
    /// SSE-C upload needs its customer key with every part.
    fn part_key(&self, rec: &UploadRecord, customer: Option<&CustomerKey>) -> LayerResult<Option<mosaic_crypt::Key>> {
        self.check_read_key(rec.opts.sse_sealed.as_ref(), customer)
    }

    async fn ingest_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
        object_key: Option<mosaic_crypt::Key>,
    ) -> LayerResult<PartInfo> {
        let salt = object_key.as_ref().map(|_| crate::sse::new_salt());
        let stream = object_key.as_ref().zip(salt.as_deref());
        let (name, hint) = (part_name(bucket, upload_id, part, key), key.as_bytes().to_vec());
        let target = crate::ingest::StageFor { coll: self.mpu().await?, name, hint };
        let (ing, plain) = self.ingest_encrypting(body, stream, MAX_PART_BYTES, &target).await?;
        self.store_part(bucket, key, upload_id, part, ing, plain, salt).await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn upload_part_copy_impl(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        source: crate::objects::CopySource<'_>,
        range: Option<RangeRequest>,
        keys: CopyKeys,
    ) -> LayerResult<PartInfo> {
        check_part_number(part)?;
        let rec = self.upload_record(&self.store.snapshot(), bucket, key, upload_id).await?;
        let dest_customer = match &keys.dest {
            Some(SseRequest::Customer(c)) => Some(c),
            _ => None,
        };
        let object_key = self.part_key(&rec, dest_customer)?;
        let got = self
            .get_object_impl(source.bucket, source.key, source.version, range, None, source.pre, keys.source.as_ref())
            .await?;
        // A copy range must lie within the source (a GET range is cut to the object instead).
        if let Some(RangeRequest::FromTo { last: Some(last), .. }) = range
            && last >= got.meta.size_bytes
        {
            return Err(LayerError::InvalidRange);
        }
        let len = got.range.map(|r| r.end - r.start).unwrap_or(got.meta.size_bytes);
        if len > MAX_PART_BYTES {
            return Err(LayerError::InvalidArgument("a part is at most 5 GiB".into()));
        }
        self.ingest_part(bucket, key, upload_id, part, PutBody { stream: got.body, finish: None }, object_key).await
    }

    pub(crate) async fn complete_multipart_impl(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        pre: &Precondition,
        extra_meta: Vec<(String, String)>,
    ) -> LayerResult<ObjectMeta> {
        let snap = self.store.snapshot();
        let coll = self.bucket_coll(&snap, bucket).await?;
        let rec = match self.upload_record(&snap, bucket, key, upload_id).await {
            Err(LayerError::NoSuchUpload) => {
                return self.completed_before(&snap, &coll, bucket, key, upload_id, &parts).await;
            }
            r => r?,
        };
        if parts.is_empty() {
            return Err(LayerError::InvalidArgument("a multipart upload needs at least one part".into()));
        }
        let stored: BTreeMap<u32, PartRecord> = self.parts_of(&snap, bucket, upload_id).await?.into_iter().collect();
        let sizes = check_parts(&parts, &stored, self.cfg.min_part_bytes)?;
        // Conditional completion (If-None-Match: * / If-Match) is checked again inside the transaction.
        // A delete marker is no object: the key counts as absent.
        let existing = match snap.lookup(&coll, key.as_bytes()).await? {
            Some(info) => Some(read_meta(&snap, &info.obj, bucket, key).await?).filter(|m| !m.delete_marker),
            None => None,
        };
        if let Some(m) = &existing {
            pre.check(m).map_err(|_| LayerError::PreconditionFailed)?;
        } else if pre.if_match.is_some() {
            return Err(LayerError::NoSuchKey);
        }
        let md5s: Vec<u8> =
            parts.iter().flat_map(|p| hex::decode(&stored[&p.part_number].etag).unwrap_or_default()).collect();
        let etag = format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len());
        let total: u64 = sizes.iter().sum();
        let lock = self.lock_of_new_version(bucket, &rec.opts.lock).await?;
        let mut meta = rec.opts.clone().into_meta(total, etag, now_ms());
        (meta.retention, meta.legal_hold) = (lock.retention, lock.legal_hold);
        meta.part_sizes = sizes.clone();
        meta.checksums.extend(extra_meta);
        meta.part_checksums = part_checksums(&parts, &stored, &meta.checksums);
        drop_part_checksums_past_budget(&mut meta);
        // An encrypted upload's parts are streams of its object key, stored with their packages' tags.
        let stored_sizes: Vec<u64> = match &rec.opts.sse_sealed {
            None => sizes.clone(),
            Some(sse) => {
                let salts = parts
                    .iter()
                    .map(|p| stored[&p.part_number].sse_salt.clone())
                    .collect::<Option<Vec<String>>>()
                    .ok_or_else(|| LayerError::Corrupt(format!("upload {upload_id} has a part without its salt")))?;
                meta.sse = Some(crate::sse::SseMeta { salts, ..sse.clone() });
                sizes.iter().map(|s| mosaic_crypt::stored_len(*s)).collect()
            }
        };
        let stored_total: u64 = stored_sizes.iter().sum();
        meta.upload_id = Some(upload_id.to_string());
        let name = key.as_bytes().to_vec();
        let mut txn = Txn::new();
        let upload = txn.push(Op::AssertExists { coll: self.mpu().await?, name: upload_name(bucket, upload_id, key) });
        let expected = existing.as_ref().map(|m| m.etag.clone().into_bytes());
        let unchanged =
            txn.push(Op::AssertAttr { coll: coll.clone(), name: name.clone(), key: ATTR_ETAG.to_vec(), expected });
        let version = self.push_new_version(&mut txn, &coll, bucket, key).await?;
        version.stamp.apply(&mut meta);
        txn.push(Op::Reset { coll: coll.clone(), name: name.clone() });
        let unit = self.store.geometry().unit_bytes;
        let mut offset = 0u64;
        let mut copied = Vec::new();
        for (p, size) in parts.iter().zip(&stored_sizes) {
            let pname = part_name(bucket, upload_id, p.part_number, key);
            let is_last = offset + size == stored_total;
            if offset.is_multiple_of(unit) && (size.is_multiple_of(unit) || is_last) && *size > 0 {
                txn.push(Op::CloneRange {
                    src_coll: self.mpu().await?,
                    src: pname,
                    src_offset: 0,
                    len: *size,
                    dst_coll: coll.clone(),
                    dst: name.clone(),
                    dst_offset: offset,
                });
            } else if *size > 0 {
                copied.push((pname, offset, *size));
            }
            offset += size;
        }
        // Parts whose boundaries do not fall on units are copied (whole units staged, edges written).
        for (pname, offset, size) in copied {
            let info = snap.lookup(&self.mpu().await?, &pname).await?.ok_or(LayerError::NoSuchUpload)?;
            let mut pos = 0;
            while pos < size {
                let n = (size - pos).min(COPY_CHUNK_BYTES);
                let data = snap.read(&info.obj, pos, n).await?;
                if data.len() as u64 != n {
                    return Err(LayerError::Corrupt(format!(
                        "part {} is shorter than its record",
                        String::from_utf8_lossy(&pname)
                    )));
                }
                self.push_copy_ops(&mut txn, &coll, &name, offset + pos, &data).await?;
                pos += n;
            }
        }
        drop(snap);
        push_meta_ops(&mut txn, &coll, &name, &meta)?;
        if !rec.opts.tags.is_empty() {
            let value = encode_tags(&rec.opts.tags);
            txn.push(Op::SetAttr { coll: coll.clone(), name: name.clone(), key: ATTR_TAGS.to_vec(), value });
        }
        for p in stored.keys() {
            txn.push(Op::Remove { coll: self.mpu().await?, name: part_name(bucket, upload_id, *p, key) });
        }
        txn.push(Op::Remove { coll: self.mpu().await?, name: upload_name(bucket, upload_id, key) });
        match self.commit(txn).await {
            // Completed meanwhile by a concurrent request with the same parts: the same answer.
            Err(e) if e.is_op(upload, ErrorKind::AssertionFailed) => {
                self.completed_before(&self.store.snapshot(), &coll, bucket, key, upload_id, &parts).await
            }
            Err(e) if e.is_op(unchanged, ErrorKind::AssertionFailed) => Err(LayerError::PreconditionFailed),
            Err(e) if version.is_conflict(&e) => Err(LayerError::Conflict),
            // A part replaced or removed since it was checked (a concurrent upload of it, or an abort).
            Err(e) if e.kind == ErrorKind::NotFound => Err(LayerError::NoSuchUpload),
            r => r.map(|_| meta).map_err(LayerError::from),
        }
    }

    /// A CompleteMultipartUpload of an upload that no longer exists: if it completed into the object the key
    /// holds now, with the same parts, the answer is that object (S3 answers a repeated completion again);
    /// else the upload is unknown.
    async fn completed_before(
        &self,
        snap: &S::Snapshot,
        coll: &S::Coll,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[CompletePart],
    ) -> LayerResult<ObjectMeta> {
        let Some(info) = snap.lookup(coll, key.as_bytes()).await? else { return Err(LayerError::NoSuchUpload) };
        let mut meta = read_meta(snap, &info.obj, bucket, key).await?;
        if !meta.is_encrypted() {
            meta.size_bytes = info.size_bytes;
        }
        let md5s: Option<Vec<u8>> = parts
            .iter()
            .map(|p| hex::decode(p.etag.trim().trim_matches('"')).ok())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.concat());
        let same_parts = md5s.is_some_and(|m| meta.etag == format!("{}-{}", hex::encode(Md5::digest(&m)), parts.len()));
        if meta.upload_id.as_deref() == Some(upload_id) && same_parts {
            Ok(meta)
        } else {
            Err(LayerError::NoSuchUpload)
        }
    }

    pub(crate) async fn abort_multipart_impl(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<()> {
        let snap = self.store.snapshot();
        self.upload_record(&snap, bucket, key, upload_id).await?;
        let parts = self.parts_of(&snap, bucket, upload_id).await?;
        drop(snap);
        let mut txn = Txn::new();
        for (p, _) in parts {
            txn.push(Op::Remove { coll: self.mpu().await?, name: part_name(bucket, upload_id, p, key) });
        }
        let upload = txn.push(Op::Remove { coll: self.mpu().await?, name: upload_name(bucket, upload_id, key) });
        match self.commit(txn).await {
            Err(e) if e.is_op(upload, ErrorKind::NotFound) => Err(LayerError::NoSuchUpload),
            // A part went meanwhile (a concurrent abort or completion): the upload is being ended.
            Err(e) if e.kind == ErrorKind::NotFound => Err(LayerError::NoSuchUpload),
            r => r.map(|_| ()).map_err(LayerError::from),
        }
    }

    pub(crate) async fn list_parts_impl(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<Vec<PartInfo>> {
        let snap = self.store.snapshot();
        self.upload_record(&snap, bucket, key, upload_id).await?;
        Ok(self
            .parts_of(&snap, bucket, upload_id)
            .await?
            .into_iter()
            .map(|(n, r)| PartInfo {
                part_number: n,
                size_bytes: r.size_bytes,
                etag: r.etag,
                last_modified_unix_ms: r.last_modified_unix_ms,
                checksums: r.checksums,
            })
            .collect())
    }

    pub(crate) async fn list_uploads_impl(&self, bucket: &str, prefix: &str) -> LayerResult<Vec<UploadInfo>> {
        let snap = self.store.snapshot();
        self.bucket_coll(&snap, bucket).await?;
        let base = format!("{bucket}/").into_bytes();
        let mut from = base.clone();
        let mut out = Vec::new();
        for _ in 0..MAX_UPLOADS_LISTED {
            let batch = snap.list_entries(&self.mpu().await?, &base, &from, 1).await?;
            let Some(entry) = batch.into_iter().next() else { break };
            // The upload's record ("<bucket>/<id>\0<key>") comes first, then its parts ("<bucket>/<id>/...");
            // skip the parts with one seek: '0' sorts right after '/'.
            let id = String::from_utf8_lossy(mosaic_store::without_locator(&entry.name[base.len()..])).into_owned();
            from = [&base[..], id.as_bytes(), b"0"].concat();
            // A part without its upload (left by an upload being removed): not an upload.
            let Some(raw) = snap.attr(&entry.obj, ATTR_UPLOAD).await? else { continue };
            let rec = UploadRecord::decode(&raw, &format!(" of upload {id}"))?;
            if rec.key.starts_with(prefix) {
                out.push(UploadInfo { upload_id: id, key: rec.key, initiated_unix_ms: rec.initiated_unix_ms });
            }
        }
        out.sort_by(|a, b| (&a.key, a.initiated_unix_ms).cmp(&(&b.key, b.initiated_unix_ms)));
        Ok(out)
    }

    pub(crate) async fn upload_record(
        &self,
        snap: &S::Snapshot,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> LayerResult<UploadRecord> {
        // Ids are made here (32 hex digits); anything else names no upload (and no other record).
        if upload_id.len() != 32 || !upload_id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(LayerError::NoSuchUpload);
        }
        let info = snap
            .lookup(&self.mpu().await?, &upload_name(bucket, upload_id, key))
            .await?
            .ok_or(LayerError::NoSuchUpload)?;
        let raw = snap.attr(&info.obj, ATTR_UPLOAD).await?.ok_or(LayerError::NoSuchUpload)?;
        let rec = UploadRecord::decode(&raw, &format!(" of upload {upload_id}"))?;
        if rec.key != key {
            return Err(LayerError::NoSuchUpload);
        }
        Ok(rec)
    }

    async fn parts_of(&self, snap: &S::Snapshot, bucket: &str, upload_id: &str) -> LayerResult<Vec<(u32, PartRecord)>> {
        let prefix = parts_prefix(bucket, upload_id);
        let mut out = Vec::new();
        for entry in snap.list_entries(&self.mpu().await?, &prefix, &prefix, MAX_PARTS as usize + 1).await? {
            let num: u32 = std::str::from_utf8(mosaic_store::without_locator(&entry.name[prefix.len()..]))
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|n| (1..=MAX_PARTS).contains(n))
                .ok_or_else(|| LayerError::Corrupt(format!("upload {upload_id} holds a part with a bad name")))?;
            let whose = format!(" {num} of upload {upload_id}");
            let raw = snap
                .attr(&entry.obj, ATTR_PART)
                .await?
                .ok_or_else(|| LayerError::Corrupt(format!("the part record{whose} is missing")))?;
            out.push((num, PartRecord::decode(&raw, &whose)?));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    async fn store_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        ing: Ingested<S::Staged>,
        plain: crate::sse::Plaintext,
        sse_salt: Option<String>,
    ) -> LayerResult<PartInfo> {
        let rec = PartRecord {
            version: RECORD_VERSION,
            etag: plain.md5_hex,
            size_bytes: plain.size_bytes,
            last_modified_unix_ms: now_ms(),
            checksums: ing.extra.clone(),
            sse_salt,
        };
        let name = part_name(bucket, upload_id, part, key);
        let coll = &self.mpu().await?;
        let mut txn = Txn::new();
        // The upload must still exist when the part commits.
        let upload = txn.push(Op::AssertExists { coll: coll.clone(), name: upload_name(bucket, upload_id, key) });
        txn.push(Op::Reset { coll: coll.clone(), name: name.clone() });
        ing.push_ops(&mut txn, coll, &name, 0);
        txn.push(Op::SetAttr { coll: coll.clone(), name, key: ATTR_PART.to_vec(), value: rec.encode() });
        match self.commit(txn).await {
            Err(e) if e.is_op(upload, ErrorKind::AssertionFailed) => return Err(LayerError::NoSuchUpload),
            r => r?,
        };
        Ok(PartInfo {
            part_number: part,
            size_bytes: rec.size_bytes,
            etag: rec.etag,
            last_modified_unix_ms: rec.last_modified_unix_ms,
            checksums: rec.checksums,
        })
    }
}

fn check_part_number(part: u32) -> LayerResult<()> {
    if part == 0 || part > MAX_PARTS {
        return Err(LayerError::InvalidArgument(format!("part numbers are 1 to {MAX_PARTS}")));
    }
    Ok(())
}

/// Each completed part's checksum in the algorithm of the object's checksum (the one key beside "TYPE"),
/// or none at all when a part lacks it.
fn part_checksums(
    parts: &[CompletePart],
    stored: &BTreeMap<u32, PartRecord>,
    sums: &BTreeMap<String, String>,
) -> Vec<String> {
    let Some(algo) = sums.keys().find(|k| k.as_str() != "TYPE") else { return Vec::new() };
    let each = parts.iter().map(|p| {
        let rec = stored.get(&p.part_number)?;
        rec.checksums.iter().find(|(a, _)| a == algo).map(|(_, v)| v.clone())
    });
    each.collect::<Option<Vec<String>>>().unwrap_or_default()
}

/// Largest metadata record that keeps its parts' checksums. The record is one attribute (at most 64 KiB
/// on a drive) that lists up to 1,000 part sizes; the checksums (up to 47 bytes a part) are a hint
/// for GET/HEAD `partNumber` and GetObjectAttributes, so an upload of many parts keeps only the object's
/// checksum rather than fail a completion that would fit without them.
const PART_CHECKSUMS_MAX_RECORD_BYTES: usize = 32 << 10;

fn drop_part_checksums_past_budget(meta: &mut ObjectMeta) {
    if !meta.part_checksums.is_empty() && meta.encode().len() > PART_CHECKSUMS_MAX_RECORD_BYTES {
        meta.part_checksums = Vec::new();
    }
    debug_assert!(meta.part_checksums.is_empty() || meta.encode().len() <= PART_CHECKSUMS_MAX_RECORD_BYTES);
}

/// Checks the parts a completion names against the stored ones (ascending, present, same ETag, all but the
/// last at least `min_part_bytes`, 5 MiB as in S3); returns their sizes.
fn check_parts(
    parts: &[CompletePart],
    stored: &BTreeMap<u32, PartRecord>,
    min_part_bytes: u64,
) -> LayerResult<Vec<u64>> {
    // The order first: a list out of order is refused whatever its parts are.
    if parts.windows(2).any(|w| w[1].part_number <= w[0].part_number) {
        return Err(LayerError::InvalidPartOrder);
    }
    let mut sizes = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let s = stored.get(&p.part_number).ok_or_else(|| LayerError::InvalidPart(format!("part {}", p.part_number)))?;
        if p.etag.trim().trim_matches('"') != s.etag {
            return Err(LayerError::InvalidPart(format!("part {} ETag", p.part_number)));
        }
        if hex::decode(&s.etag).map_or(true, |d| d.len() != 16) {
            return Err(LayerError::Corrupt(format!("the ETag of part {} is damaged", p.part_number)));
        }
        if i + 1 < parts.len() && s.size_bytes < min_part_bytes {
            return Err(LayerError::EntityTooSmall);
        }
        sizes.push(s.size_bytes);
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_checksums_are_kept_only_within_the_record_budget() {
        let sha256 = "arcu6553sHVAiX4MjW0j7I7vD4w6R+Gz9Ok0Q9lTa+0=".to_string();
        let with_parts = |n: usize| ObjectMeta {
            part_sizes: vec![5 << 20; n],
            part_checksums: vec![sha256.clone(); n],
            ..Default::default()
        };
        let mut few = with_parts(100);
        drop_part_checksums_past_budget(&mut few);
        assert_eq!(few.part_checksums.len(), 100);
        // 1,000 parts of SHA-256 checksums pass the budget: the sizes stay, the checksums go.
        let mut many = with_parts(1000);
        drop_part_checksums_past_budget(&mut many);
        assert!(many.part_checksums.is_empty());
        assert_eq!(many.part_sizes.len(), 1000);
        assert!(many.encode().len() <= PART_CHECKSUMS_MAX_RECORD_BYTES);
    }
}
