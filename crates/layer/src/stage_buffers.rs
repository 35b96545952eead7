//! Aligned buffers that request bodies fill before their whole blocks are staged on the drive. Full-size
//! buffers are kept for reuse: a fresh 8 MiB buffer costs page faults and zeroing comparable to copying the
//! data into it. A body starts in a buffer sized to what has arrived and moves to one twice as large as it
//! grows, so a 64 KiB object never pays for zeroing 8 MiB.

use mosaic_engine::AlignedBuf;
use parking_lot::Mutex;

/// Bytes of one staging buffer: the unit a streaming body is written to the drive in.
pub(crate) const STAGE_CHUNK_BYTES: usize = 8 << 20;
/// Idle buffers kept for reuse (memory held between requests: this many chunks).
const IDLE_BUFFERS_MAX: usize = 4;
/// The smallest buffer handed out.
const FIRST_BUFFER_BYTES: usize = 64 << 10;

#[derive(Default)]
pub(crate) struct StageBuffers {
    idle: Mutex<Vec<AlignedBuf>>,
}

impl StageBuffers {
    /// A buffer of at least `len_bytes` (a power of two from 64 KiB), capped at one chunk.
    pub(crate) fn take_at_least(&self, len_bytes: usize) -> AlignedBuf {
        let len_bytes = len_bytes.next_power_of_two().clamp(FIRST_BUFFER_BYTES, STAGE_CHUNK_BYTES);
        if len_bytes == STAGE_CHUNK_BYTES
            && let Some(buf) = self.idle.lock().pop()
        {
            return buf;
        }
        AlignedBuf::zeroed(len_bytes)
    }

    /// Returns a buffer; only full-size ones are kept.
    pub(crate) fn give(&self, buf: AlignedBuf) {
        if buf.len() != STAGE_CHUNK_BYTES {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_the_limit() {
        let pool = StageBuffers::default();
        let bufs: Vec<AlignedBuf> = (0..IDLE_BUFFERS_MAX + 2).map(|_| pool.take_at_least(STAGE_CHUNK_BYTES)).collect();
        assert!(bufs.iter().all(|b| b.len() == STAGE_CHUNK_BYTES));
        for b in bufs {
            pool.give(b);
        }
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX);
        let _again = pool.take_at_least(STAGE_CHUNK_BYTES + 1);
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX - 1);
        // Smaller requests get small buffers, which are not kept.
        let small = pool.take_at_least(20_000);
        assert_eq!(small.len(), 64 << 10);
        assert_eq!(pool.take_at_least(100 << 10).len(), 128 << 10);
        pool.give(small);
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX - 1);
    }
}
