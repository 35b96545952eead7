//! Aligned buffers that request bodies fill before their whole blocks are staged on the drive. Kept for
//! reuse: a fresh 8 MiB buffer costs page faults and zeroing comparable to copying the data into it.

use mosaic_engine::AlignedBuf;
use parking_lot::Mutex;

/// Bytes of one staging buffer: the unit a streaming body is written to the drive in.
pub(crate) const STAGE_CHUNK_BYTES: usize = 8 << 20;
/// Idle buffers kept for reuse (memory held between requests: this many chunks).
const IDLE_BUFFERS_MAX: usize = 4;

#[derive(Default)]
pub(crate) struct StageBuffers {
    idle: Mutex<Vec<AlignedBuf>>,
}

impl StageBuffers {
    pub(crate) fn take(&self) -> AlignedBuf {
        self.idle.lock().pop().unwrap_or_else(|| AlignedBuf::zeroed(STAGE_CHUNK_BYTES))
    }

    pub(crate) fn give(&self, buf: AlignedBuf) {
        debug_assert_eq!(buf.len(), STAGE_CHUNK_BYTES);
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
        let bufs: Vec<AlignedBuf> = (0..IDLE_BUFFERS_MAX + 2).map(|_| pool.take()).collect();
        assert!(bufs.iter().all(|b| b.len() == STAGE_CHUNK_BYTES));
        for b in bufs {
            pool.give(b);
        }
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX);
        let _again = pool.take();
        assert_eq!(pool.idle_count(), IDLE_BUFFERS_MAX - 1);
    }
}
