//! The ObjectLayer on one engine drive. A bucket is a collection; an object is an engine object with its
//! S3 metadata in attributes; an overwrite is one transaction (reset + writes + attributes), so readers see
//! the old object or the new one. CopyObject is a clone and CompleteMultipartUpload clones the parts'
//! blocks into the target: no data is copied where block boundaries allow.

use crate::error::{LayerError, LayerResult};
use crate::meta::{ListTag, ListedFields, META_VERSION, ObjectMeta, Precondition, PutOptions};
use crate::names::{validate_bucket_name, validate_key};
use crate::stage_buffers::{STAGE_CHUNK_BYTES, StageBuffers};
use crate::*;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use mosaic_engine::{BLOCK_SIZE_BYTES, CollectionId, Engine, EngineError, Op, Reader, Transaction};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

const SYS_COLLECTION: &str = "sys";
const MPU_COLLECTION: &str = "mpu";
const BUCKET_PREFIX: &str = "b/";
const ATTR_META: &[u8] = b"s3.meta";
const ATTR_ETAG: &[u8] = b"s3.etag";
const ATTR_TAGS: &[u8] = b"s3.tags";
const ATTR_UPLOAD: &[u8] = b"s3.upload";
const ATTR_PART: &[u8] = b"s3.part";
/// Bytes per chunk of a GET body.
const READ_CHUNK_BYTES: u64 = 1 << 20;
/// Chunks of a GET body read ahead of the one being sent (memory per GET: this many chunks).
const READ_AHEAD_CHUNKS: usize = 4;
pub const MAX_PARTS: u32 = 10_000;
pub const MIN_PART_BYTES: u64 = 5 << 20;
pub const MAX_PART_BYTES: u64 = 5 << 30;
pub const MAX_TAGS: usize = 10;

#[derive(Clone, Debug)]
pub struct SingleDriveConfig {
    /// Largest object accepted by PUT, in bytes.
    pub max_object_bytes: u64,
}

impl Default for SingleDriveConfig {
    fn default() -> Self {
        SingleDriveConfig { max_object_bytes: 5 << 40 }
    }
}

pub struct SingleDrive {
    engine: Engine,
    cfg: SingleDriveConfig,
    sys: CollectionId,
    mpu: CollectionId,
    stage_buffers: Arc<StageBuffers>,
}

/// A full staging buffer being written to the drive: its offset in the body and the task writing it.
type StageInFlight = (u64, tokio::task::JoinHandle<LayerResult<(mosaic_engine::Staged, mosaic_engine::AlignedBuf)>>);

#[derive(Serialize, Deserialize)]
struct BucketRecord {
    version: u8,
    created_unix_ms: i64,
}

#[derive(Serialize, Deserialize)]
struct UploadRecord {
    version: u8,
    key: String,
    initiated_unix_ms: i64,
    opts: PutOptions,
}

#[derive(Serialize, Deserialize, Clone)]
struct PartRecord {
    version: u8,
    etag: String,
    size_bytes: u64,
    last_modified_unix_ms: i64,
    checksums: Vec<(String, String)>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> LayerResult<T> + Send + 'static) -> LayerResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| LayerError::Internal(format!("worker failed: {e}")))?
}

/// The ops that record an object's metadata: the metadata attribute, the ETag attribute (what conditional
/// writes assert on) and the listing tag of its name entry (what a listing reads).
fn push_meta_ops(txn: &mut Transaction, coll: CollectionId, name: &[u8], meta: &ObjectMeta) {
    txn.push(Op::SetAttr { coll, name: name.to_vec(), key: ATTR_META.to_vec(), value: meta.encode() });
    txn.push(Op::SetAttr { coll, name: name.to_vec(), key: ATTR_ETAG.to_vec(), value: meta.etag.as_bytes().to_vec() });
    txn.push(Op::SetNameTag { coll, name: name.to_vec(), tag: ListTag::of(meta).encode() });
    let high = crate::meta::wants_high_priority(&meta.user_metadata);
    txn.push(Op::SetPriority { coll, name: name.to_vec(), high });
}

fn bucket_collection(bucket: &str) -> String {
    format!("{BUCKET_PREFIX}{bucket}")
}

fn upload_name(bucket: &str, upload_id: &str) -> Vec<u8> {
    format!("{bucket}/{upload_id}").into_bytes()
}

fn part_name(bucket: &str, upload_id: &str, part: u32) -> Vec<u8> {
    format!("{bucket}/{upload_id}/{part:05}").into_bytes()
}

/// A body read into the drive: whole blocks staged, the rest kept for the commit.
struct Ingested {
    staged: Vec<(u64, mosaic_engine::Staged)>,
    tail_offset: u64,
    tail: Vec<u8>,
    size_bytes: u64,
    md5_hex: String,
    extra: Vec<(String, String)>,
}

impl Ingested {
    fn push_ops(self, txn: &mut Transaction, coll: CollectionId, name: &[u8], base: u64) {
        for (offset, staged) in self.staged {
            txn.push(Op::WriteStaged { coll, name: name.to_vec(), offset: base + offset, staged });
        }
        if !self.tail.is_empty() {
            txn.push(Op::Write { coll, name: name.to_vec(), offset: base + self.tail_offset, data: self.tail });
        }
    }
}

impl SingleDrive {
    /// Opens the layer on a drive, creating its system collections on first use.
    pub fn new(engine: Engine, cfg: SingleDriveConfig) -> LayerResult<Self> {
        let sys = ensure_collection(&engine, SYS_COLLECTION)?;
        let mpu = ensure_collection(&engine, MPU_COLLECTION)?;
        Ok(SingleDrive { engine, cfg, sys, mpu, stage_buffers: Arc::default() })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn bucket_coll(&self, reader: &Reader, bucket: &str) -> LayerResult<CollectionId> {
        reader.collection(&bucket_collection(bucket))?.ok_or(LayerError::NoSuchBucket)
    }

    async fn submit(&self, txn: Transaction) -> LayerResult<mosaic_engine::Outcome> {
        let engine = self.engine.clone();
        blocking(move || engine.submit(txn).map_err(LayerError::from)).await
    }

    /// Streams a body into the drive: whole blocks are staged as they arrive (the data is written once,
    /// directly to its final blocks); small bodies stay in memory for an inline write.
    ///
    /// Past `inline_max_bytes` the body fills aligned 8 MiB buffers; a full one is written by a blocking
    /// task while the next fills, so receiving and writing overlap (at most one write in flight, two
    /// buffers per request).
    async fn ingest(&self, body: PutBody, base_offset: u64, max_bytes: u64) -> LayerResult<Ingested> {
        let bs = BLOCK_SIZE_BYTES as usize;
        let inline_max = self.engine.config().inline_max_bytes as usize;
        let mut stream = body.stream;
        let mut md5 = Md5::new();
        // Bytes not (yet) in an aligned buffer: the whole body while it is small, or when it cannot be staged.
        let mut small: Vec<u8> = Vec::new();
        let mut fill: Option<(mosaic_engine::AlignedBuf, usize)> = None;
        let mut in_flight: Option<StageInFlight> = None;
        let mut staged = Vec::new();
        let mut launched_bytes = 0u64;
        let mut total = 0u64;
        // Staging is only possible when the object's blocks line up with the drive's.
        let can_stage = base_offset.is_multiple_of(BLOCK_SIZE_BYTES);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            total += chunk.len() as u64;
            if total > max_bytes {
                return Err(LayerError::EntityTooLarge);
            }
            md5.update(&chunk);
            let mut rest: &[u8] = &chunk;
            if fill.is_none() {
                if !can_stage || total as usize <= inline_max {
                    small.extend_from_slice(rest);
                    continue;
                }
                debug_assert!(small.len() <= inline_max && inline_max < STAGE_CHUNK_BYTES);
                let mut buf = self.stage_buffers.take_at_least(small.len() + rest.len());
                buf.as_mut_slice()[..small.len()].copy_from_slice(&small);
                fill = Some((buf, small.len()));
                small.clear();
            }
            while !rest.is_empty() {
                let (buf, filled) = fill.as_mut().expect("staging has begun");
                if *filled == buf.len() {
                    // A buffer smaller than a chunk is full: move to one twice its size.
                    let mut bigger = self.stage_buffers.take_at_least(buf.len() * 2);
                    bigger.as_mut_slice()[..*filled].copy_from_slice(&buf.as_slice()[..*filled]);
                    *buf = bigger;
                }
                let n = rest.len().min(buf.len() - *filled);
                buf.as_mut_slice()[*filled..*filled + n].copy_from_slice(&rest[..n]);
                *filled += n;
                rest = &rest[n..];
                if *filled == STAGE_CHUNK_BYTES {
                    debug_assert_eq!(buf.len(), STAGE_CHUNK_BYTES);
                    let (full, _) = fill.take().expect("just filled");
                    if let Some(done) = in_flight.take() {
                        staged.push(self.finish_stage(done).await?);
                    }
                    in_flight = Some((launched_bytes, self.launch_stage(full, STAGE_CHUNK_BYTES)));
                    launched_bytes += STAGE_CHUNK_BYTES as u64;
                    fill = Some((self.stage_buffers.take_at_least(STAGE_CHUNK_BYTES), 0));
                }
            }
        }
        let extra = match body.finish {
            Some(f) => f()?,
            None => Vec::new(),
        };
        if let Some(done) = in_flight.take() {
            staged.push(self.finish_stage(done).await?);
        }
        let mut tail = small;
        if let Some((buf, filled)) = fill {
            let whole = filled / bs * bs;
            tail = buf.as_slice()[whole..filled].to_vec();
            if whole > 0 {
                staged.push(self.finish_stage((launched_bytes, self.launch_stage(buf, whole))).await?);
                launched_bytes += whole as u64;
            } else {
                self.stage_buffers.give(buf);
            }
        }
        let md5_raw: [u8; 16] = md5.finalize().into();
        Ok(Ingested {
            staged,
            tail_offset: launched_bytes,
            tail,
            size_bytes: total,
            md5_hex: hex::encode(md5_raw),
            extra,
        })
    }

    /// Writes the first `len` bytes (whole blocks) of a staging buffer to fresh blocks on a blocking thread.
    fn launch_stage(
        &self,
        buf: mosaic_engine::AlignedBuf,
        len: usize,
    ) -> tokio::task::JoinHandle<LayerResult<(mosaic_engine::Staged, mosaic_engine::AlignedBuf)>> {
        debug_assert!(len > 0 && len.is_multiple_of(BLOCK_SIZE_BYTES as usize));
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || {
            let staged = engine.stage(&buf.as_slice()[..len], true)?;
            Ok((staged, buf))
        })
    }

    /// Waits for a staging write and returns its buffer to the pool.
    async fn finish_stage(&self, (offset, task): StageInFlight) -> LayerResult<(u64, mosaic_engine::Staged)> {
        let (staged, buf) = task.await.map_err(|e| LayerError::Internal(format!("staging task: {e}")))??;
        self.stage_buffers.give(buf);
        Ok((offset, staged))
    }

    fn read_meta(reader: &Reader, nid: u64) -> LayerResult<ObjectMeta> {
        let raw = reader.attr(nid, ATTR_META)?.ok_or_else(|| LayerError::Corrupt("object has no metadata".into()))?;
        ObjectMeta::decode(&raw)
    }

    /// Looks up an object and its metadata in one snapshot.
    fn stat_object(&self, bucket: &str, key: &str) -> LayerResult<(Arc<Reader>, u64, ObjectMeta)> {
        validate_key(key)?;
        let mut reader = self.engine.reader();
        let coll = self.bucket_coll(&reader, bucket)?;
        let info = reader.lookup(coll, key.as_bytes())?.ok_or(LayerError::NoSuchKey)?;
        if info.high_priority {
            reader.prioritize();
        }
        let reader = Arc::new(reader);
        let mut meta = Self::read_meta(&reader, info.nid)?;
        // The drive's size is the truth (appends change it).
        meta.size_bytes = info.size_bytes;
        Ok((reader, info.nid, meta))
    }

    /// The body as a stream of chunks, `READ_AHEAD_CHUNKS` reads in flight so the device stays busy while
    /// the client drains the socket. The first error ends the stream.
    fn body_stream(reader: Arc<Reader>, nid: u64, start: u64, end: u64) -> ByteStream {
        use futures::StreamExt;
        let chunks =
            (start..end).step_by(READ_CHUNK_BYTES as usize).map(move |pos| (pos, (end - pos).min(READ_CHUNK_BYTES)));
        let reads = futures::stream::iter(chunks)
            .map(move |(pos, len)| {
                let r = reader.clone();
                async move {
                    match blocking(move || r.read(nid, pos, len).map_err(LayerError::from)).await {
                        Ok(data) if data.len() as u64 == len => Ok(Bytes::from(data)),
                        Ok(_) => Err(LayerError::Internal("object shrank while reading".into())),
                        Err(e) => Err(e),
                    }
                }
            })
            .buffered(READ_AHEAD_CHUNKS);
        let s = reads.scan(false, |failed, item| {
            let out = if *failed { None } else { Some(item) };
            *failed = out.as_ref().is_some_and(|i| i.is_err());
            futures::future::ready(out)
        });
        Box::pin(s)
    }

    async fn append(
        &self,
        coll: CollectionId,
        key: &str,
        body: PutBody,
        opts: PutOptions,
        offset: u64,
    ) -> LayerResult<ObjectMeta> {
        let reader = self.engine.reader();
        let existing = match reader.lookup(coll, key.as_bytes())? {
            Some(info) => Some((Self::read_meta(&reader, info.nid)?, info.size_bytes)),
            None => None,
        };
        drop(reader);
        let (old_meta, old_size) = match existing {
            Some((m, size)) => (Some(m), size),
            None if offset == 0 => (None, 0),
            None => return Err(LayerError::NoSuchKey),
        };
        if offset != old_size {
            return Err(LayerError::InvalidWriteOffset);
        }
        let max = self.cfg.max_object_bytes.saturating_sub(offset).min(self.engine.config().max_op_data_bytes as u64);
        let ing = self.ingest_to_memory(body, max).await?;
        let new_size = offset + ing.0.len() as u64;
        // An appended object's ETag chains the previous one with the new bytes' MD5.
        let etag = match &old_meta {
            Some(m) => {
                let mut h = Md5::new();
                h.update(m.etag.as_bytes());
                h.update(ing.1);
                hex::encode(h.finalize())
            }
            None => hex::encode(ing.1),
        };
        let mut meta = match old_meta.clone() {
            Some(m) => m,
            None => opts.clone().into_meta(0, String::new(), now_ms()),
        };
        meta.size_bytes = new_size;
        meta.etag = etag.clone();
        meta.last_modified_unix_ms = now_ms();
        meta.checksums.clear();
        let name = key.as_bytes().to_vec();
        let mut txn = Transaction::new();
        txn.push(Op::AssertAttr {
            coll,
            name: name.clone(),
            key: ATTR_ETAG.to_vec(),
            expected: old_meta.map(|m| m.etag.into_bytes()),
        });
        txn.push(Op::Append { coll, name: name.clone(), data: ing.0, expected_offset: Some(offset) });
        push_meta_ops(&mut txn, coll, &name, &meta);
        match self.submit(txn).await {
            // A concurrent writer changed the object between our read and the commit.
            Err(LayerError::PreconditionFailed) => Err(LayerError::InvalidWriteOffset),
            Err(e) => Err(e),
            Ok(_) => Ok(meta),
        }
    }

    async fn ingest_to_memory(&self, body: PutBody, max: u64) -> LayerResult<(Vec<u8>, [u8; 16])> {
        let mut stream = body.stream;
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if (buf.len() + chunk.len()) as u64 > max {
                return Err(LayerError::EntityTooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        if let Some(f) = body.finish {
            f()?;
        }
        let md5: [u8; 16] = Md5::digest(&buf).into();
        Ok((buf, md5))
    }

    fn upload_record(&self, reader: &Reader, bucket: &str, key: &str, upload_id: &str) -> LayerResult<UploadRecord> {
        let info = reader.lookup(self.mpu, &upload_name(bucket, upload_id))?.ok_or(LayerError::NoSuchUpload)?;
        let raw = reader.attr(info.nid, ATTR_UPLOAD)?.ok_or(LayerError::NoSuchUpload)?;
        let rec: UploadRecord =
            serde_json::from_slice(&raw).map_err(|e| LayerError::Corrupt(format!("upload record: {e}")))?;
        if rec.key != key {
            return Err(LayerError::NoSuchUpload);
        }
        Ok(rec)
    }

    fn parts_of(&self, reader: &Reader, bucket: &str, upload_id: &str) -> LayerResult<Vec<(u32, PartRecord)>> {
        let prefix = format!("{bucket}/{upload_id}/").into_bytes();
        let mut out = Vec::new();
        for (name, nid) in reader.list(self.mpu, &prefix, &prefix, MAX_PARTS as usize + 1)? {
            let num: u32 = std::str::from_utf8(&name[prefix.len()..])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| LayerError::Corrupt("bad part name".into()))?;
            let raw = reader.attr(nid, ATTR_PART)?.ok_or_else(|| LayerError::Corrupt("part without record".into()))?;
            let rec: PartRecord =
                serde_json::from_slice(&raw).map_err(|e| LayerError::Corrupt(format!("part record: {e}")))?;
            out.push((num, rec));
        }
        Ok(out)
    }

    async fn store_part(&self, bucket: &str, upload_id: &str, part: u32, ing: Ingested) -> LayerResult<PartInfo> {
        let rec = PartRecord {
            version: 1,
            etag: ing.md5_hex.clone(),
            size_bytes: ing.size_bytes,
            last_modified_unix_ms: now_ms(),
            checksums: ing.extra.clone(),
        };
        let name = part_name(bucket, upload_id, part);
        let coll = self.mpu;
        let mut txn = Transaction::new();
        // The upload must still exist when the part commits.
        txn.push(Op::AssertAttr {
            coll,
            name: upload_name(bucket, upload_id),
            key: b"s3.live".to_vec(),
            expected: Some(b"1".to_vec()),
        });
        txn.push(Op::Reset { coll, name: name.clone() });
        ing.push_ops(&mut txn, coll, &name, 0);
        txn.push(Op::SetAttr {
            coll,
            name,
            key: ATTR_PART.to_vec(),
            value: serde_json::to_vec(&rec).expect("serializes"),
        });
        match self.submit(txn).await {
            Err(LayerError::PreconditionFailed) => return Err(LayerError::NoSuchUpload),
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

    fn check_part_number(part: u32) -> LayerResult<()> {
        if part == 0 || part > MAX_PARTS {
            return Err(LayerError::InvalidArgument(format!("part numbers are 1 to {MAX_PARTS}")));
        }
        Ok(())
    }
}

fn ensure_collection(engine: &Engine, name: &str) -> LayerResult<CollectionId> {
    if let Some(id) = engine.reader().collection(name)? {
        return Ok(id);
    }
    match engine.submit(Transaction::new().op(Op::CreateCollection { name: name.into() })) {
        Ok(out) => Ok(out.created_collections[0]),
        Err(EngineError::CollectionExists(_)) => {
            engine.reader().collection(name)?.ok_or_else(|| LayerError::Internal("collection vanished".into()))
        }
        Err(e) => Err(e.into()),
    }
}

#[async_trait]
impl ObjectLayer for SingleDrive {
    async fn create_bucket(&self, bucket: &str) -> LayerResult<()> {
        validate_bucket_name(bucket)?;
        let rec = BucketRecord { version: 1, created_unix_ms: now_ms() };
        let name = format!("bucket/{bucket}").into_bytes();
        let txn = Transaction::new()
            .op(Op::CreateCollection { name: bucket_collection(bucket) })
            .op(Op::Reset { coll: self.sys, name: name.clone() })
            .op(Op::SetAttr {
                coll: self.sys,
                name,
                key: b"bucket".to_vec(),
                value: serde_json::to_vec(&rec).expect("serializes"),
            });
        self.submit(txn).await.map(|_| ())
    }

    async fn delete_bucket(&self, bucket: &str) -> LayerResult<()> {
        // Abandoned multipart uploads do not keep a bucket alive in S3; remove them with it.
        let uploads = self.list_uploads(bucket, "").await?;
        for u in uploads {
            self.abort_multipart(bucket, &u.key, &u.upload_id).await?;
        }
        let txn = Transaction::new()
            .op(Op::RemoveCollection { name: bucket_collection(bucket) })
            .op(Op::Remove { coll: self.sys, name: format!("bucket/{bucket}").into_bytes() });
        match self.submit(txn).await {
            Err(LayerError::NoSuchKey) => Err(LayerError::NoSuchBucket),
            r => r.map(|_| ()),
        }
    }

    async fn bucket_info(&self, bucket: &str) -> LayerResult<BucketInfo> {
        let reader = self.engine.reader();
        self.bucket_coll(&reader, bucket)?;
        let created_unix_ms = match reader.lookup(self.sys, format!("bucket/{bucket}").as_bytes())? {
            Some(info) => reader
                .attr(info.nid, b"bucket")?
                .and_then(|raw| serde_json::from_slice::<BucketRecord>(&raw).ok())
                .map(|r| r.created_unix_ms)
                .unwrap_or(0),
            None => 0,
        };
        Ok(BucketInfo { name: bucket.to_string(), created_unix_ms })
    }

    async fn list_buckets(&self) -> LayerResult<Vec<BucketInfo>> {
        let names: Vec<String> = self
            .engine
            .reader()
            .collections()?
            .into_iter()
            .filter_map(|(n, _)| n.strip_prefix(BUCKET_PREFIX).map(str::to_string))
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            match self.bucket_info(&n).await {
                Ok(b) => out.push(b),
                Err(LayerError::NoSuchBucket) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn put_object(&self, bucket: &str, key: &str, body: PutBody, opts: PutOptions) -> LayerResult<ObjectMeta> {
        validate_key(key)?;
        opts.validate()?;
        let coll = self.bucket_coll(&self.engine.reader(), bucket)?;
        if let Some(offset) = opts.write_offset {
            return self.append(coll, key, body, opts, offset).await;
        }
        // A high-priority object holds background work back from its first byte to its commit.
        let _prioritized = crate::meta::wants_high_priority(&opts.user_metadata).then(|| self.engine.priority_guard());
        let ing = self.ingest(body, 0, self.cfg.max_object_bytes).await?;
        let mut meta = opts.clone().into_meta(ing.size_bytes, ing.md5_hex.clone(), now_ms());
        meta.checksums.extend(ing.extra.iter().cloned());
        let name = key.as_bytes().to_vec();
        let mut txn = Transaction::new();
        if opts.if_none_match_any {
            txn.push(Op::AssertAttr { coll, name: name.clone(), key: ATTR_ETAG.to_vec(), expected: None });
        }
        if let Some(etag) = &opts.if_match {
            let etag = etag.trim().trim_matches('"');
            if etag != "*" {
                txn.push(Op::AssertAttr {
                    coll,
                    name: name.clone(),
                    key: ATTR_ETAG.to_vec(),
                    expected: Some(etag.as_bytes().to_vec()),
                });
            } else {
                txn.push(Op::SetAttr { coll, name: name.clone(), key: b"s3.probe".to_vec(), value: vec![] });
                txn.push(Op::RemoveAttr { coll, name: name.clone(), key: b"s3.probe".to_vec() });
            }
        }
        txn.push(Op::Reset { coll, name: name.clone() });
        ing.push_ops(&mut txn, coll, &name, 0);
        push_meta_ops(&mut txn, coll, &name, &meta);
        match self.submit(txn).await {
            // If-Match on a missing key is a failed precondition too.
            Err(LayerError::NoSuchKey) if opts.if_match.is_some() => Err(LayerError::PreconditionFailed),
            r => r.map(|_| meta),
        }
    }

    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: Option<RangeRequest>,
        part_number: Option<u32>,
        pre: &Precondition,
    ) -> LayerResult<GetResult> {
        let (reader, nid, meta) = self.stat_object(bucket, key)?;
        pre.check(&meta)?;
        let size = meta.size_bytes;
        let range = match (range, part_number) {
            (Some(_), Some(_)) => {
                return Err(LayerError::InvalidArgument("Range and partNumber cannot be combined".into()));
            }
            (Some(r), None) => Some(r.resolve(size)?),
            (None, Some(p)) => {
                if meta.part_sizes.is_empty() {
                    if p != 1 {
                        return Err(LayerError::InvalidRange);
                    }
                    None
                } else {
                    let idx = p.checked_sub(1).ok_or(LayerError::InvalidRange)? as usize;
                    let sizes = &meta.part_sizes;
                    if idx >= sizes.len() {
                        return Err(LayerError::InvalidRange);
                    }
                    let start: u64 = sizes[..idx].iter().sum();
                    Some(ByteRange { start, end: start + sizes[idx] })
                }
            }
            (None, None) => None,
        };
        let (start, end) = range.map(|r| (r.start, r.end)).unwrap_or((0, size));
        let mut body = Self::body_stream(reader, nid, start, end);
        // Read the first chunk before answering: a damaged or unreadable object then gets an error status
        // instead of a 200 whose body breaks off (small objects fail wholly up front).
        let body: ByteStream = match futures::StreamExt::next(&mut body).await {
            Some(Err(e)) => return Err(e),
            Some(Ok(first)) => Box::pin(futures::StreamExt::chain(futures::stream::once(async { Ok(first) }), body)),
            None => body,
        };
        Ok(GetResult { meta, range, body })
    }

    async fn head_object(&self, bucket: &str, key: &str, pre: &Precondition) -> LayerResult<ObjectMeta> {
        let (_, _, meta) = self.stat_object(bucket, key)?;
        pre.check(&meta)?;
        Ok(meta)
    }

    async fn delete_object(&self, bucket: &str, key: &str) -> LayerResult<()> {
        validate_key(key)?;
        let coll = self.bucket_coll(&self.engine.reader(), bucket)?;
        match self.submit(Transaction::new().op(Op::Remove { coll, name: key.as_bytes().to_vec() })).await {
            Err(LayerError::NoSuchKey) => Ok(()),
            r => r.map(|_| ()),
        }
    }

    async fn copy_object(
        &self,
        src_bucket: &str,
        src_key: &str,
        src_pre: &Precondition,
        dst_bucket: &str,
        dst_key: &str,
        new_meta: Option<PutOptions>,
    ) -> LayerResult<ObjectMeta> {
        validate_key(dst_key)?;
        let (reader, _, src_meta) = self.stat_object(src_bucket, src_key)?;
        src_pre.check(&src_meta)?;
        let src_coll = self.bucket_coll(&reader, src_bucket)?;
        let dst_coll = self.bucket_coll(&reader, dst_bucket)?;
        drop(reader);
        let same = src_coll == dst_coll && src_key == dst_key;
        if same && new_meta.is_none() {
            return Err(LayerError::InvalidArgument(
                "copying an object to itself requires the REPLACE metadata directive".into(),
            ));
        }
        let mut meta = match new_meta {
            Some(opts) => {
                opts.validate()?;
                let mut m = opts.into_meta(src_meta.size_bytes, src_meta.etag.clone(), now_ms());
                m.checksums = src_meta.checksums.clone();
                m.part_sizes = src_meta.part_sizes.clone();
                m
            }
            None => ObjectMeta { last_modified_unix_ms: now_ms(), ..src_meta.clone() },
        };
        meta.version = META_VERSION;
        let src = src_key.as_bytes().to_vec();
        let dst = dst_key.as_bytes().to_vec();
        let mut txn = Transaction::new();
        // The source must be the version whose conditions were checked.
        txn.push(Op::AssertAttr {
            coll: src_coll,
            name: src.clone(),
            key: ATTR_ETAG.to_vec(),
            expected: Some(src_meta.etag.clone().into_bytes()),
        });
        if !same {
            txn.push(Op::Clone { coll: src_coll, from: src, to_coll: dst_coll, to: dst.clone() });
            txn.push(Op::RemoveAttr { coll: dst_coll, name: dst.clone(), key: ATTR_TAGS.to_vec() });
        }
        push_meta_ops(&mut txn, dst_coll, &dst, &meta);
        match self.submit(txn).await {
            Err(LayerError::PreconditionFailed) => Err(LayerError::Conflict),
            r => r.map(|_| meta),
        }
    }

    async fn list_objects(&self, bucket: &str, q: &ListQuery) -> LayerResult<ListPage> {
        let reader = self.engine.reader();
        let coll = self.bucket_coll(&reader, bucket)?;
        let mut page = ListPage::default();
        if q.max_keys == 0 {
            return Ok(page);
        }
        let prefix = q.prefix.as_bytes();
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        // Strictly after start_after: the smallest key greater than it is start_after + "\0".
        let mut from: Vec<u8> = if q.start_after.is_empty() {
            prefix.to_vec()
        } else {
            let mut f = q.start_after.as_bytes().to_vec();
            f.push(0);
            f
        };
        let mut returned = 0usize;
        // Objects of the page without a listing tag (written before tags existed), statted together once
        // the names are known: their index in `page.objects` and nid.
        let mut untagged: Vec<(usize, u64)> = Vec::new();
        'outer: loop {
            let want = q.max_keys - returned + 1;
            let batch = reader.list_entries(coll, prefix, &from, want.min(1001))?;
            if batch.is_empty() {
                break;
            }
            let batch_len = batch.len();
            for entry in batch {
                let key = String::from_utf8(entry.name.clone())
                    .map_err(|_| LayerError::Corrupt("a stored key is not UTF-8".into()))?;
                if returned == q.max_keys {
                    page.next_marker =
                        page.objects.last().map(|o| o.key.clone()).max(page.common_prefixes.last().cloned());
                    break 'outer;
                }
                if let Some(d) = delim
                    && let Some(pos) = key[q.prefix.len()..].find(d)
                {
                    let cp = key[..q.prefix.len() + pos + d.len()].to_string();
                    // Skip everything under this common prefix with one seek.
                    from = match mosaic_engine::prefix_end(cp.as_bytes()) {
                        Some(f) => f,
                        None => break 'outer,
                    };
                    // A continuation that ended on this prefix has already returned it.
                    if cp.as_str() <= q.start_after.as_str() {
                        continue 'outer;
                    }
                    page.common_prefixes.push(cp);
                    returned += 1;
                    continue 'outer;
                }
                let tag = entry.tag.as_deref().and_then(ListTag::decode);
                if tag.is_none() {
                    untagged.push((page.objects.len(), entry.nid));
                }
                let tag = tag.unwrap_or_default();
                page.objects.push(ListedObject {
                    key,
                    size_bytes: tag.size_bytes,
                    etag: tag.etag,
                    last_modified_unix_ms: tag.last_modified_unix_ms,
                });
                returned += 1;
                from = entry.name;
                from.push(0);
            }
            if batch_len < want.min(1001) {
                break;
            }
        }
        if !untagged.is_empty() {
            let nids: Vec<u64> = untagged.iter().map(|(_, nid)| *nid).collect();
            for ((i, _), (info, meta)) in untagged.iter().zip(reader.stat_many(&nids, ATTR_META)?) {
                let o = &mut page.objects[*i];
                o.size_bytes = info.size_bytes;
                (o.etag, o.last_modified_unix_ms) = match meta {
                    Some(raw) => {
                        let f = ListedFields::decode(&raw)?;
                        (f.etag, f.last_modified_unix_ms)
                    }
                    None => (String::new(), (info.mtime_ns / 1_000_000) as i64),
                };
            }
        }
        Ok(page)
    }

    async fn get_tags(&self, bucket: &str, key: &str) -> LayerResult<Vec<(String, String)>> {
        let (reader, nid, _) = self.stat_object(bucket, key)?;
        match reader.attr(nid, ATTR_TAGS)? {
            Some(raw) => serde_json::from_slice(&raw).map_err(|e| LayerError::Corrupt(format!("tags: {e}"))),
            None => Ok(Vec::new()),
        }
    }

    async fn put_tags(&self, bucket: &str, key: &str, tags: Vec<(String, String)>) -> LayerResult<()> {
        if tags.len() > MAX_TAGS {
            return Err(LayerError::InvalidArgument(format!("at most {MAX_TAGS} tags per object")));
        }
        for (k, v) in &tags {
            if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
                return Err(LayerError::InvalidArgument("tag keys are 1-128 and values 0-256 characters".into()));
            }
        }
        let (reader, _, _) = self.stat_object(bucket, key)?;
        let coll = self.bucket_coll(&reader, bucket)?;
        drop(reader);
        let name = key.as_bytes().to_vec();
        let op = if tags.is_empty() {
            Op::RemoveAttr { coll, name, key: ATTR_TAGS.to_vec() }
        } else {
            Op::SetAttr { coll, name, key: ATTR_TAGS.to_vec(), value: serde_json::to_vec(&tags).expect("serializes") }
        };
        self.submit(Transaction::new().op(op)).await.map(|_| ())
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> LayerResult<String> {
        validate_key(key)?;
        opts.validate()?;
        self.bucket_coll(&self.engine.reader(), bucket)?;
        let upload_id = hex::encode(rand::random::<[u8; 16]>());
        let rec = UploadRecord { version: 1, key: key.to_string(), initiated_unix_ms: now_ms(), opts };
        let name = upload_name(bucket, &upload_id);
        let txn = Transaction::new()
            .op(Op::Create { coll: self.mpu, name: name.clone() })
            .op(Op::SetAttr {
                coll: self.mpu,
                name: name.clone(),
                key: ATTR_UPLOAD.to_vec(),
                value: serde_json::to_vec(&rec).expect("serializes"),
            })
            .op(Op::SetAttr { coll: self.mpu, name, key: b"s3.live".to_vec(), value: b"1".to_vec() });
        self.submit(txn).await?;
        Ok(upload_id)
    }

    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: PutBody,
    ) -> LayerResult<PartInfo> {
        Self::check_part_number(part)?;
        self.upload_record(&self.engine.reader(), bucket, key, upload_id)?;
        let ing = self.ingest(body, 0, MAX_PART_BYTES).await?;
        self.store_part(bucket, upload_id, part, ing).await
    }

    async fn upload_part_copy(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        src_bucket: &str,
        src_key: &str,
        range: Option<RangeRequest>,
        src_pre: &Precondition,
    ) -> LayerResult<PartInfo> {
        Self::check_part_number(part)?;
        self.upload_record(&self.engine.reader(), bucket, key, upload_id)?;
        let got = self.get_object(src_bucket, src_key, range, None, src_pre).await?;
        let len = got.range.map(|r| r.end - r.start).unwrap_or(got.meta.size_bytes);
        if len > MAX_PART_BYTES {
            return Err(LayerError::InvalidArgument("a part is at most 5 GiB".into()));
        }
        let ing = self.ingest(PutBody { stream: got.body, finish: None }, 0, MAX_PART_BYTES).await?;
        self.store_part(bucket, upload_id, part, ing).await
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
        let reader = self.engine.reader();
        let coll = self.bucket_coll(&reader, bucket)?;
        let rec = self.upload_record(&reader, bucket, key, upload_id)?;
        if parts.is_empty() {
            return Err(LayerError::InvalidArgument("a multipart upload needs at least one part".into()));
        }
        let stored: std::collections::BTreeMap<u32, PartRecord> =
            self.parts_of(&reader, bucket, upload_id)?.into_iter().collect();
        let mut last = 0;
        let mut md5s = Vec::with_capacity(parts.len() * 16);
        let mut sizes = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            if p.part_number <= last {
                return Err(LayerError::InvalidPartOrder);
            }
            last = p.part_number;
            let s =
                stored.get(&p.part_number).ok_or_else(|| LayerError::InvalidPart(format!("part {}", p.part_number)))?;
            if p.etag.trim().trim_matches('"') != s.etag {
                return Err(LayerError::InvalidPart(format!("part {} ETag", p.part_number)));
            }
            if i + 1 < parts.len() && s.size_bytes < MIN_PART_BYTES {
                return Err(LayerError::EntityTooSmall);
            }
            md5s.extend(hex::decode(&s.etag).map_err(|_| LayerError::Corrupt("part ETag".into()))?);
            sizes.push(s.size_bytes);
        }
        // Conditional completion (If-None-Match: * / If-Match) is checked atomically in the transaction.
        let existing = match reader.lookup(coll, key.as_bytes())? {
            Some(info) => Some(Self::read_meta(&reader, info.nid)?),
            None => None,
        };
        if let Some(m) = &existing {
            pre.check(m).map_err(|_| LayerError::PreconditionFailed)?;
        } else if pre.if_match.is_some() {
            return Err(LayerError::NoSuchKey);
        }
        let etag = format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len());
        let total: u64 = sizes.iter().sum();
        let mut meta = rec.opts.clone().into_meta(total, etag.clone(), now_ms());
        meta.part_sizes = sizes.clone();
        meta.checksums.extend(extra_meta);
        let name = key.as_bytes().to_vec();
        let mut txn = Transaction::new();
        txn.push(Op::AssertAttr {
            coll,
            name: name.clone(),
            key: ATTR_ETAG.to_vec(),
            expected: existing.as_ref().map(|m| m.etag.clone().into_bytes()),
        });
        txn.push(Op::Reset { coll, name: name.clone() });
        let mut offset = 0u64;
        let mut copied = Vec::new();
        for (p, size) in parts.iter().zip(&sizes) {
            let pname = part_name(bucket, upload_id, p.part_number);
            let is_last = offset + size == total;
            if offset.is_multiple_of(BLOCK_SIZE_BYTES) && (size % BLOCK_SIZE_BYTES == 0 || is_last) && *size > 0 {
                txn.push(Op::CloneRange {
                    src_coll: self.mpu,
                    src: pname.clone(),
                    src_offset: 0,
                    len: *size,
                    dst_coll: coll,
                    dst: name.clone(),
                    dst_offset: offset,
                });
            } else if *size > 0 {
                copied.push((pname.clone(), offset, *size));
            }
            offset += size;
        }
        drop(reader);
        // Parts whose boundaries do not fall on blocks are copied (the fragment path takes the edges).
        for (pname, offset, size) in copied {
            let r = Arc::new(self.engine.reader());
            let info = r.lookup(self.mpu, &pname)?.ok_or_else(|| LayerError::InvalidPart("vanished".into()))?;
            let mut pos = 0;
            while pos < size {
                let n = (size - pos).min(32 << 20);
                let rr = r.clone();
                let data = blocking(move || rr.read(info.nid, pos, n).map_err(LayerError::from)).await?;
                self.push_copy_ops(&mut txn, coll, &name, offset + pos, data).await?;
                pos += n;
            }
        }
        debug_assert_eq!(meta.etag, etag);
        push_meta_ops(&mut txn, coll, &name, &meta);
        for p in stored.keys() {
            txn.push(Op::Remove { coll: self.mpu, name: part_name(bucket, upload_id, *p) });
        }
        txn.push(Op::Remove { coll: self.mpu, name: upload_name(bucket, upload_id) });
        match self.submit(txn).await {
            Err(LayerError::NoSuchKey) => Err(LayerError::NoSuchUpload),
            r => r.map(|_| meta),
        }
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<()> {
        let reader = self.engine.reader();
        self.upload_record(&reader, bucket, key, upload_id)?;
        let parts = self.parts_of(&reader, bucket, upload_id)?;
        drop(reader);
        let mut txn = Transaction::new();
        for (p, _) in parts {
            txn.push(Op::Remove { coll: self.mpu, name: part_name(bucket, upload_id, p) });
        }
        txn.push(Op::Remove { coll: self.mpu, name: upload_name(bucket, upload_id) });
        match self.submit(txn).await {
            Err(LayerError::NoSuchKey) => Err(LayerError::NoSuchUpload),
            r => r.map(|_| ()),
        }
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> LayerResult<Vec<PartInfo>> {
        let reader = self.engine.reader();
        self.upload_record(&reader, bucket, key, upload_id)?;
        Ok(self
            .parts_of(&reader, bucket, upload_id)?
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

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> LayerResult<Vec<UploadInfo>> {
        let reader = self.engine.reader();
        self.bucket_coll(&reader, bucket)?;
        let base = format!("{bucket}/").into_bytes();
        let mut from = base.clone();
        let mut out = Vec::new();
        loop {
            let batch = reader.list(self.mpu, &base, &from, 1)?;
            let Some((name, nid)) = batch.into_iter().next() else { break };
            // Skip this upload's parts ("<bucket>/<id>/...") with one seek: '0' sorts right after '/'.
            from = name.clone();
            from.push(b'0');
            let Some(raw) = reader.attr(nid, ATTR_UPLOAD)? else { continue };
            let rec: UploadRecord =
                serde_json::from_slice(&raw).map_err(|e| LayerError::Corrupt(format!("upload record: {e}")))?;
            if rec.key.starts_with(prefix) {
                let id = String::from_utf8_lossy(&name[base.len()..]).into_owned();
                out.push(UploadInfo { upload_id: id, key: rec.key, initiated_unix_ms: rec.initiated_unix_ms });
            }
        }
        out.sort_by(|a, b| (&a.key, a.initiated_unix_ms).cmp(&(&b.key, b.initiated_unix_ms)));
        Ok(out)
    }

    fn is_ready(&self) -> bool {
        self.engine.is_healthy()
    }

    async fn shutdown(&self) -> LayerResult<()> {
        let engine = self.engine.clone();
        blocking(move || engine.close().map_err(LayerError::from)).await
    }
}

impl SingleDrive {
    /// Adds ops writing `data` at an arbitrary offset: edges as fragments, whole blocks staged.
    async fn push_copy_ops(
        &self,
        txn: &mut Transaction,
        coll: CollectionId,
        name: &[u8],
        offset: u64,
        data: Vec<u8>,
    ) -> LayerResult<()> {
        let bs = BLOCK_SIZE_BYTES;
        let head = ((bs - offset % bs) % bs).min(data.len() as u64) as usize;
        if head > 0 {
            txn.push(Op::Write { coll, name: name.to_vec(), offset, data: data[..head].to_vec() });
        }
        let body = &data[head..];
        let whole = body.len() / bs as usize * bs as usize;
        if whole > 0 {
            let engine = self.engine.clone();
            let chunk = body[..whole].to_vec();
            let staged = blocking(move || engine.stage(&chunk, true).map_err(LayerError::from)).await?;
            txn.push(Op::WriteStaged { coll, name: name.to_vec(), offset: offset + head as u64, staged });
        }
        if whole < body.len() {
            txn.push(Op::Write {
                coll,
                name: name.to_vec(),
                offset: offset + (head + whole) as u64,
                data: body[whole..].to_vec(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_engine::{EngineConfig, SimDevice};

    fn body(data: &'static [u8]) -> PutBody {
        PutBody { stream: Box::pin(futures::stream::iter([Ok(Bytes::from_static(data))])), finish: None }
    }

    /// A drive written before listing tags existed has name entries without one: a listing still shows
    /// each object's size, ETag and time, from its onode and metadata record.
    #[test]
    fn objects_without_a_listing_tag_are_listed_from_their_metadata() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(64 << 20)), EngineConfig::default()).unwrap();
        let layer = SingleDrive::new(engine.clone(), SingleDriveConfig::default()).unwrap();
        rt.block_on(async {
            layer.create_bucket("bkt").await.unwrap();
            let tagged = layer.put_object("bkt", "a", body(b"hello"), PutOptions::default()).await.unwrap();
            // "b" as an older build wrote it: data and metadata, no tag.
            let coll = layer.bucket_coll(&engine.reader(), "bkt").unwrap();
            let untagged = ObjectMeta { version: META_VERSION, size_bytes: 3, etag: "e0".into(), ..Default::default() };
            let write = Op::Write { coll, name: b"b".to_vec(), offset: 0, data: b"abc".to_vec() };
            let meta = Op::SetAttr { coll, name: b"b".to_vec(), key: ATTR_META.to_vec(), value: untagged.encode() };
            engine.submit(Transaction::new().op(write).op(meta)).unwrap();
            let entries = engine.reader().list_entries(coll, b"", b"", 10).unwrap();
            assert_eq!(entries.iter().map(|e| e.tag.is_some()).collect::<Vec<_>>(), [true, false]);

            let q = ListQuery { max_keys: 1000, ..Default::default() };
            let page = layer.list_objects("bkt", &q).await.unwrap();
            let got: Vec<(&str, u64, &str, i64)> = page
                .objects
                .iter()
                .map(|o| (o.key.as_str(), o.size_bytes, o.etag.as_str(), o.last_modified_unix_ms))
                .collect();
            assert_eq!(got, [("a", 5, tagged.etag.as_str(), tagged.last_modified_unix_ms), ("b", 3, "e0", 0)]);
        });
        engine.close().unwrap();
    }

    /// `x-amz-meta-mosaic-priority: high` marks the object in the drive; a GET of it holds a prioritized
    /// request until its body is dropped; an overwrite without the metadata clears the mark.
    #[test]
    fn priority_metadata_marks_the_object_and_its_reads() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(64 << 20)), EngineConfig::default()).unwrap();
        let layer = SingleDrive::new(engine.clone(), SingleDriveConfig::default()).unwrap();
        let high = |key: &str| {
            let coll = layer.bucket_coll(&engine.reader(), "bkt").unwrap();
            engine.reader().lookup(coll, key.as_bytes()).unwrap().unwrap().high_priority
        };
        rt.block_on(async {
            layer.create_bucket("bkt").await.unwrap();
            let mut opts = PutOptions::default();
            opts.user_metadata.insert(crate::meta::PRIORITY_METADATA_KEY.into(), "High".into());
            layer.put_object("bkt", "hot", body(b"hello"), opts).await.unwrap();
            layer.put_object("bkt", "plain", body(b"hello"), PutOptions::default()).await.unwrap();
            assert!(high("hot"));
            assert!(!high("plain"));

            let got = layer.get_object("bkt", "hot", None, None, &Precondition::default()).await.unwrap();
            assert_eq!(engine.stats().prioritized_in_flight, 1, "the GET's reader is prioritized");
            drop(got);
            let got = layer.get_object("bkt", "plain", None, None, &Precondition::default()).await.unwrap();
            assert_eq!(engine.stats().prioritized_in_flight, 0);
            drop(got);

            layer.put_object("bkt", "hot", body(b"again"), PutOptions::default()).await.unwrap();
            assert!(!high("hot"), "an overwrite without the metadata is not prioritized");
        });
        assert_eq!(engine.stats().prioritized_in_flight, 0);
        engine.close().unwrap();
    }
}
