//! Streaming a request body into the store: whole aligned units (the store's `unit_bytes`) are staged as
//! they arrive, so the data is written once, directly to its final place; the rest (a small body, or the
//! tail past the last whole unit) goes into the commit's transaction. The MD5 of the body (its ETag) is
//! computed on the way (`BodyMd5`: off the request's task for a bulk microstore's request).
//!
//! Bodies fill aligned buffers (64 KiB doubling to 8 MiB, full-size ones kept for reuse: a fresh 8 MiB
//! buffer costs page faults and zeroing comparable to copying the data into it); a full buffer is staged
//! by a task while the next one fills (one stage in flight per request).

use crate::body_md5::BodyMd5;
use crate::error::{LayerError, LayerResult};
use crate::semantics::{S3Semantics, StoreTxn};
use crate::{ByteStream, PutBody};
use futures::StreamExt;
use md5::{Digest, Md5};
use mosaic_store::{AlignedBuf, Op, Store};
use parking_lot::Mutex;

/// Bytes of one full staging buffer.
pub(crate) const STAGE_BUFFER_BYTES: usize = 8 << 20;
/// Idle buffers kept for reuse (memory held between requests: this many buffers).
const IDLE_BUFFERS_MAX: usize = 4;
/// The smallest buffer handed out.
const FIRST_BUFFER_BYTES: usize = 64 << 10;

#[derive(Default)]
pub(crate) struct StageBuffers {
    idle: Mutex<Vec<AlignedBuf>>,
}

impl StageBuffers {
    /// A buffer of at least `len_bytes` (a power of two from 64 KiB), capped at one full buffer.
    pub(crate) fn take_at_least(&self, len_bytes: usize) -> AlignedBuf {
        let len_bytes = len_bytes.next_power_of_two().clamp(FIRST_BUFFER_BYTES, STAGE_BUFFER_BYTES);
        if len_bytes == STAGE_BUFFER_BYTES
            && let Some(buf) = self.idle.lock().pop()
        {
            return buf;
        }
        AlignedBuf::zeroed(len_bytes)
    }

    /// Returns a buffer; only full-size ones are kept.
    pub(crate) fn give(&self, buf: AlignedBuf) {
        if buf.len() != STAGE_BUFFER_BYTES {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_BUFFERS_MAX {
            idle.push(buf);
        }
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }
}

/// A body read into the store: whole units staged, the rest kept for the commit.
/// The object a body's units are staged for: its collection and name (a store places units by both), and
/// the hint its devices place them by (the key: a part's units are placed as its object's).
#[derive(Clone)]
pub(crate) struct StageFor<C> {
    pub(crate) coll: C,
    pub(crate) name: Vec<u8>,
    pub(crate) hint: Vec<u8>,
}

pub(crate) struct Ingested<St> {
    pub(crate) staged: Vec<(u64, St)>,
    pub(crate) tail_offset: u64,
    pub(crate) tail: Vec<u8>,
    pub(crate) size_bytes: u64,
    pub(crate) md5_hex: String,
    /// What the body's finisher returned (verified checksums).
    pub(crate) extra: Vec<(String, String)>,
}

impl<St> Ingested<St> {
    /// The ops that write the body at `base` of object `name`.
    pub(crate) fn push_ops<C: Clone>(self, txn: &mut mosaic_store::Txn<C, St>, coll: &C, name: &[u8], base: u64) {
        for (offset, staged) in self.staged {
            txn.push(Op::WriteStaged { coll: coll.clone(), name: name.to_vec(), offset: base + offset, staged });
        }
        if !self.tail.is_empty() {
            txn.push(Op::Write {
                coll: coll.clone(),
                name: name.to_vec(),
                offset: base + self.tail_offset,
                data: self.tail,
            });
        }
    }
}

/// A staging write in flight: the offset of its data in the body, and the task writing it.
type StageInFlight<St> = (u64, tokio::task::JoinHandle<LayerResult<(St, AlignedBuf)>>);

impl<S: Store> S3Semantics<S> {
    /// Bytes of a full staging buffer that are staged at once: whole units.
    fn stage_chunk_bytes(&self) -> usize {
        let unit = self.store.geometry().unit_bytes as usize;
        let chunk = STAGE_BUFFER_BYTES / unit * unit;
        assert!(chunk > 0, "a unit larger than a staging buffer ({unit} bytes)");
        chunk
    }

    /// Streams a body into the store, `base_offset` being where it starts in its object; more than
    /// `max_bytes` fails with EntityTooLarge. `target` is the object the body is for (a multipart part's is
    /// the part, named with its upload's key as locator): the store places its units by it. `hash`: whether
    /// to hash it (an encrypted body's ETag is its plaintext's, hashed before encryption).
    pub(crate) async fn ingest(
        &self,
        body: PutBody,
        base_offset: u64,
        max_bytes: u64,
        target: &StageFor<S::Coll>,
        hash: bool,
    ) -> LayerResult<Ingested<S::Staged>> {
        let geometry = self.store.geometry();
        let unit = geometry.unit_bytes as usize;
        let chunk_bytes = self.stage_chunk_bytes();
        let inline_max = geometry.inline_max_bytes as usize;
        let mut stream = body.stream;
        let mut md5 = hash.then(BodyMd5::new);
        // Bytes not (yet) in an aligned buffer: the whole body while it is small, or when it cannot be staged.
        let mut small: Vec<u8> = Vec::new();
        let mut fill: Option<(AlignedBuf, usize)> = None;
        let mut in_flight: Option<StageInFlight<S::Staged>> = None;
        let mut staged = Vec::new();
        let mut launched_bytes = 0u64;
        let mut total = 0u64;
        // Staging is only possible when the object's units line up with the store's.
        let can_stage = base_offset.is_multiple_of(unit as u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            total += chunk.len() as u64;
            if total > max_bytes {
                return Err(LayerError::EntityTooLarge);
            }
            if let Some(md5) = md5.as_mut() {
                md5.update(chunk.clone()).await?;
            }
            let mut rest: &[u8] = &chunk;
            if fill.is_none() {
                if !can_stage || total as usize <= inline_max {
                    small.extend_from_slice(rest);
                    continue;
                }
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
                let room = buf.len().min(chunk_bytes) - *filled;
                let n = rest.len().min(room);
                buf.as_mut_slice()[*filled..*filled + n].copy_from_slice(&rest[..n]);
                *filled += n;
                rest = &rest[n..];
                if *filled == chunk_bytes {
                    let (full, _) = fill.take().expect("just filled");
                    if let Some(done) = in_flight.take() {
                        staged.push(self.finish_stage(done).await?);
                    }
                    in_flight = Some((launched_bytes, self.launch_stage(full, chunk_bytes, target)));
                    launched_bytes += chunk_bytes as u64;
                    fill = Some((self.stage_buffers.take_at_least(chunk_bytes), 0));
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
            let whole = filled / unit * unit;
            tail = buf.as_slice()[whole..filled].to_vec();
            if whole > 0 {
                staged.push(self.finish_stage((launched_bytes, self.launch_stage(buf, whole, target))).await?);
                launched_bytes += whole as u64;
            } else {
                self.stage_buffers.give(buf);
            }
        }
        debug_assert_eq!(launched_bytes + tail.len() as u64, total, "every byte is staged or in the tail");
        let md5_hex = match md5 {
            Some(md5) => hex::encode(md5.finish().await?),
            None => String::new(),
        };
        Ok(Ingested { staged, tail_offset: launched_bytes, tail, size_bytes: total, md5_hex, extra })
    }

    /// Stages the first `len` bytes (whole units) of a buffer in a task.
    fn launch_stage(
        &self,
        buf: AlignedBuf,
        len: usize,
        target: &StageFor<S::Coll>,
    ) -> tokio::task::JoinHandle<LayerResult<(S::Staged, AlignedBuf)>> {
        debug_assert!(len > 0 && len.is_multiple_of(self.store.geometry().unit_bytes as usize));
        let (store, target) = (self.store.clone(), target.clone());
        // As part of the request: its drives (here and on other nodes) count and schedule the staging
        // write as the request's.
        tokio::spawn(mosaic_store::carry_request(async move {
            store.stage_in(&target.coll, &target.name, buf, len, &target.hint).await.map_err(LayerError::from)
        }))
    }

    /// Waits for a staging write and returns its buffer to the pool.
    async fn finish_stage(&self, (offset, task): StageInFlight<S::Staged>) -> LayerResult<(u64, S::Staged)> {
        let (staged, buf) = task.await.map_err(|e| LayerError::Internal(format!("staging task: {e}")))??;
        self.stage_buffers.give(buf);
        Ok((offset, staged))
    }

    /// Reads a whole body into memory (appends, which go into one operation); returns it and its MD5.
    pub(crate) async fn ingest_to_memory(&self, body: PutBody, max: u64) -> LayerResult<(Vec<u8>, [u8; 16])> {
        let mut stream: ByteStream = body.stream;
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

    /// Adds ops writing `data` at an arbitrary offset: whole units staged, the edges as writes.
    pub(crate) async fn push_copy_ops(
        &self,
        txn: &mut StoreTxn<S>,
        coll: &S::Coll,
        name: &[u8],
        offset: u64,
        data: &[u8],
    ) -> LayerResult<()> {
        let unit = self.store.geometry().unit_bytes;
        let head = ((unit - offset % unit) % unit).min(data.len() as u64) as usize;
        if head > 0 {
            txn.push(Op::Write { coll: coll.clone(), name: name.to_vec(), offset, data: data[..head].to_vec() });
        }
        let body = &data[head..];
        let whole = body.len() / unit as usize * unit as usize;
        let mut done = 0;
        while done < whole {
            let n = (whole - done).min(self.stage_chunk_bytes());
            let mut buf = self.stage_buffers.take_at_least(n);
            buf.as_mut_slice()[..n].copy_from_slice(&body[done..done + n]);
            let (staged, buf) = self.store.stage_in(coll, name, buf, n, name).await?;
            self.stage_buffers.give(buf);
            let at = offset + (head + done) as u64;
            txn.push(Op::WriteStaged { coll: coll.clone(), name: name.to_vec(), offset: at, staged });
            done += n;
        }
        if whole < body.len() {
            let at = offset + (head + whole) as u64;
            txn.push(Op::Write { coll: coll.clone(), name: name.to_vec(), offset: at, data: body[whole..].to_vec() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_the_limit() {
        let pool = StageBuffers::default();
        let bufs: Vec<AlignedBuf> = (0..IDLE_BUFFERS_MAX + 2).map(|_| pool.take_at_least(STAGE_BUFFER_BYTES)).collect();
        assert!(bufs.iter().all(|b| b.len() == STAGE_BUFFER_BYTES));
        for b in bufs {
            pool.give(b);
        }
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX);
        let _again = pool.take_at_least(STAGE_BUFFER_BYTES + 1);
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX - 1);
        // Smaller requests get small buffers, which are not kept.
        let small = pool.take_at_least(20_000);
        assert_eq!(small.len(), 64 << 10);
        assert_eq!(pool.take_at_least(100 << 10).len(), 128 << 10);
        pool.give(small);
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX - 1);
    }
}
