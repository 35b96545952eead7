//! The MD5 of a body (its ETag). A request of a bulk microstore (`mosaic_store::is_bulk`: judged on
//! throughput beside one judged on latency) that the S3 server runs in its CPU class
//! (`mosaic_store::run_in_class`) is on a bulk thread already and hashes on its task. One that is not
//! computes it off the request's task, in the bulk CPU class:
//! chunks gather into batches of `BATCH_BYTES`, and each batch is hashed on a bulk thread while the next
//! one gathers. One batch is in flight at a time, so the bytes are hashed in order and a request holds at
//! most two batches; a body that outruns its hashing waits for it (the hash paces the body). What is left
//! at the end (less than a batch) is hashed on the task. Any other request hashes on its task, as it reads.
//!
//! Why: MD5 runs at about 650 MB/s a core and was a third of the server's CPU under a large-object load
//! (docs/bench/2026-12-07-bulk-cpu.md); on the task it runs on the async threads that every request's
//! work shares, at every microstore's priority. Not for every request: off the task a 64 MiB PUT with no
//! microstores was 3-11% slower (the hops, and the chunks held until hashed).

use crate::error::{LayerError, LayerResult};
use bytes::Bytes;
use md5::{Digest, Md5};
use mosaic_store::ShareId;

/// Bytes hashed by one hop to a blocking thread.
pub(crate) const BATCH_BYTES: usize = 1 << 20;

pub(crate) struct BodyMd5 {
    /// The state while no batch is in flight (the state travels with the batch).
    state: Option<Md5>,
    in_flight: Option<tokio::task::JoinHandle<Md5>>,
    batch: Vec<Bytes>,
    batch_bytes: usize,
    share: ShareId,
    /// Whether batches go to bulk threads (else every chunk is hashed on the task).
    off_task: bool,
}

impl BodyMd5 {
    /// A hash of a body read by the running task (off the task when its IO share is bulk).
    pub(crate) fn new() -> BodyMd5 {
        let share = mosaic_store::io_share();
        // On a bulk thread already (the request runs in its CPU class, `mosaic_store::run_in_class`), the
        // task's own thread is where the hash belongs: no hop.
        BodyMd5::with_share(share, mosaic_store::is_bulk(share) && !mosaic_store::on_bulk_thread())
    }

    fn with_share(share: ShareId, off_task: bool) -> BodyMd5 {
        BodyMd5 { state: Some(Md5::new()), in_flight: None, batch: Vec::new(), batch_bytes: 0, share, off_task }
    }

    /// Adds the next bytes of the body.
    pub(crate) async fn update(&mut self, chunk: Bytes) -> LayerResult<()> {
        if !self.off_task {
            self.state.as_mut().expect("hashed on the task: the state stays here").update(&chunk);
            return Ok(());
        }
        self.batch_bytes += chunk.len();
        self.batch.push(chunk);
        if self.batch_bytes >= BATCH_BYTES {
            let mut md5 = self.take_state().await?;
            let batch = std::mem::take(&mut self.batch);
            self.batch_bytes = 0;
            self.in_flight = Some(mosaic_store::spawn_blocking_in(self.share, move || {
                batch.iter().for_each(|c| md5.update(c));
                md5
            }));
        }
        debug_assert!(self.batch_bytes < BATCH_BYTES && self.state.is_some() != self.in_flight.is_some());
        Ok(())
    }

    /// The MD5 of every byte given.
    pub(crate) async fn finish(mut self) -> LayerResult<[u8; 16]> {
        let mut md5 = self.take_state().await?;
        self.batch.iter().for_each(|c| md5.update(c));
        Ok(md5.finalize().into())
    }

    /// The state after every batch launched (waiting for the one in flight).
    async fn take_state(&mut self) -> LayerResult<Md5> {
        match self.in_flight.take() {
            Some(h) => h.await.map_err(|e| LayerError::Internal(format!("a hashing task failed: {e}"))),
            None => Ok(self.state.take().expect("the state is here while no batch is in flight")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hashes off the task (batches on a blocking thread: no share is bulk in this test process).
    fn hash_in_chunks(body: &[u8], chunk_sizes: &[usize]) -> [u8; 16] {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut h = BodyMd5::with_share(mosaic_store::UNSHARED, true);
            let (mut at, mut sizes) = (0, chunk_sizes.iter().cycle());
            while at < body.len() {
                let n = (*sizes.next().unwrap()).min(body.len() - at);
                h.update(Bytes::copy_from_slice(&body[at..at + n])).await.unwrap();
                at += n;
            }
            h.finish().await.unwrap()
        })
    }

    /// At, just under and just past a batch, and with no bytes at all: the plain MD5 of the body.
    #[test]
    fn the_hash_is_the_body_s_md5_at_the_batch_edges() {
        for len in [0, 1, BATCH_BYTES - 1, BATCH_BYTES, BATCH_BYTES + 1, 3 * BATCH_BYTES + 17] {
            let body: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let want: [u8; 16] = Md5::digest(&body).into();
            assert_eq!(hash_in_chunks(&body, &[65_536]), want, "{len} bytes in 64 KiB chunks");
            assert_eq!(hash_in_chunks(&body, &[BATCH_BYTES + 3, 1]), want, "{len} bytes, chunks past a batch");
        }
    }

    #[tokio::test]
    async fn a_request_of_no_bulk_share_hashes_on_its_task() {
        let mut h = BodyMd5::new();
        assert!(!h.off_task);
        let body = vec![7u8; BATCH_BYTES + 1];
        h.update(Bytes::from(body.clone())).await.unwrap();
        assert!(h.in_flight.is_none() && h.batch.is_empty(), "nothing gathered, nothing sent");
        assert_eq!(h.finish().await.unwrap(), <[u8; 16]>::from(Md5::digest(&body)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Any body in any chunking hashes as the whole body does (the order holds across batches).
        #[test]
        fn any_chunking_hashes_as_the_whole_body(
            len in 0usize..(3 * BATCH_BYTES),
            sizes in proptest::collection::vec(1usize..(BATCH_BYTES / 2), 1..8),
            seed in any::<u8>(),
        ) {
            let body: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            let want: [u8; 16] = Md5::digest(&body).into();
            prop_assert_eq!(hash_in_chunks(&body, &sizes), want);
        }
    }
}
