//! The engine's counters (DESIGN.md 3.6): what the papers measure, kept as atomics so the hot path only
//! does relaxed increments. `EngineStats` is a point-in-time copy for benches and Prometheus.

use crate::qos::{PerClass, Priority};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Histogram buckets of IO sizes: 4 KiB, 8 KiB, ... 4 MiB and larger (11 buckets).
pub const IO_SIZE_BUCKETS: usize = 11;
/// Histogram buckets of sequential run lengths (consecutive device writes each starting where the previous
/// ended, paper 000's "sequential chain length") in blocks: 1, 2-3, 4-7, ... 1024 and more (11 buckets).
pub const RUN_BUCKETS: usize = 11;

#[derive(Default)]
pub(crate) struct Counters {
    pub user_bytes_written: AtomicU64,
    pub device_bytes_written: AtomicU64,
    pub device_bytes_read: AtomicU64,
    /// IOs issued to the device, writes and reads apart (bytes per IO: paper 000's IO size).
    pub device_write_ios: AtomicU64,
    pub device_read_ios: AtomicU64,
    /// Bytes read through the kernel's page cache (from memory when cached, else from the device).
    pub cached_bytes_read: AtomicU64,
    /// Of `cached_bytes_read`, bytes verified and served in place from the page cache (mapped, not copied).
    pub mapped_bytes_read: AtomicU64,
    /// Of `cached_bytes_read`, bytes served from what an earlier read kept verified (no checksum pass):
    /// mapped, or copied into a scattered read's pieces (`Reader::read_into`).
    pub verified_bytes_read: AtomicU64,
    /// Cached reads whose blocks failed their checksum and were read again from the device.
    pub cache_rereads: AtomicU64,
    /// Object reads (`Reader::read` calls): the background scrub's signal of foreground reads.
    pub object_reads: AtomicU64,
    pub rmw_on_write_path: AtomicU64,
    pub rmw_in_lazy_sync: AtomicU64,
    /// Checksum units read on the write path because a change cut through one (a run's blocks changed
    /// in the middle of a 16 KiB unit: never for S3 writes, which replace or append whole objects).
    pub checksum_split_reads: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub transactions_committed: AtomicU64,
    pub groups_committed: AtomicU64,
    /// Groups the committer held for more transactions to join (`commit::Gather`).
    pub groups_gathered: AtomicU64,
    pub device_flushes: AtomicU64,
    pub blocks_scrubbed: AtomicU64,
    pub discarded_blocks: AtomicU64,
    pub io_size_hist: [AtomicU64; IO_SIZE_BUCKETS],
    pub write_run_hist: [AtomicU64; RUN_BUCKETS],
    /// Transactions waiting in each class's queue.
    pub queue_depth: PerClass<AtomicU64>,
    /// The run being extended: (device offset where it ends, its length in bytes).
    current_run: Mutex<(u64, u64)>,
}

fn log2_bucket(v: u64, buckets: usize) -> usize {
    (63 - v.max(1).leading_zeros() as usize).min(buckets - 1)
}

impl Counters {
    pub(crate) fn record_write(&self, offset_bytes: u64, bytes: u64) {
        self.device_bytes_written.fetch_add(bytes, Relaxed);
        self.device_write_ios.fetch_add(1, Relaxed);
        self.io_size_hist[log2_bucket(bytes / 4096, IO_SIZE_BUCKETS)].fetch_add(1, Relaxed);
        let mut run = self.current_run.lock();
        if run.0 == offset_bytes && run.1 > 0 {
            run.1 += bytes;
        } else {
            if run.1 > 0 {
                self.write_run_hist[log2_bucket(run.1 / 4096, RUN_BUCKETS)].fetch_add(1, Relaxed);
            }
            run.1 = bytes;
        }
        run.0 = offset_bytes + bytes;
    }

    pub(crate) fn record_read(&self, bytes: u64) {
        self.device_bytes_read.fetch_add(bytes, Relaxed);
        self.device_read_ios.fetch_add(1, Relaxed);
        self.io_size_hist[log2_bucket(bytes / 4096, IO_SIZE_BUCKETS)].fetch_add(1, Relaxed);
    }
}

/// A snapshot of the counters plus gauges read at snapshot time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub user_bytes_written: u64,
    pub device_bytes_written: u64,
    pub device_bytes_read: u64,
    pub device_write_ios: u64,
    pub device_read_ios: u64,
    pub cached_bytes_read: u64,
    pub mapped_bytes_read: u64,
    pub verified_bytes_read: u64,
    /// Bytes kept verified now (gauge).
    pub verified_cache_bytes: u64,
    pub cache_rereads: u64,
    pub object_reads: u64,
    pub meta_cache_hits: u64,
    pub meta_cache_misses: u64,
    pub meta_cache_bytes: u64,
    pub page_cache_hits: u64,
    pub page_cache_misses: u64,
    pub page_cache_bytes: u64,
    pub page_cache_dirty_pages: u64,
    /// Prioritized requests in flight (reads of high-priority objects, ForegroundHigh transactions).
    pub prioritized_in_flight: u64,
    /// Background steps (lazy sync, scrub) that waited for prioritized requests.
    pub background_waits_for_priority: u64,
    pub kv_wal_bytes: u64,
    pub kv_flush_bytes: u64,
    pub kv_compaction_bytes: u64,
    pub rmw_on_write_path: u64,
    pub rmw_in_lazy_sync: u64,
    pub checksum_split_reads: u64,
    pub fragments_outstanding: u64,
    pub fragment_bytes_outstanding: u64,
    pub checksum_errors: u64,
    pub transactions_committed: u64,
    pub groups_committed: u64,
    pub groups_gathered: u64,
    pub device_flushes: u64,
    pub blocks_scrubbed: u64,
    pub discarded_blocks: u64,
    pub free_blocks: u64,
    pub total_blocks: u64,
    /// Blocks the device holds now (a thin drive file grows toward `total_blocks`).
    pub allocated_blocks: u64,
    pub free_extents: u64,
    pub io_size_hist: Vec<u64>,
    pub write_run_hist: Vec<u64>,
    pub queue_depth: PerClass<u64>,
}

impl EngineStats {
    /// KV bytes written to storage: WAL plus memtable flushes plus compaction output.
    pub fn kv_bytes_written(&self) -> u64 {
        self.kv_wal_bytes + self.kv_flush_bytes + self.kv_compaction_bytes
    }

    /// Sequential write runs ended so far (paper 000's chains; the run being extended is not counted).
    pub fn write_runs(&self) -> u64 {
        self.write_run_hist.iter().sum()
    }
}

pub(crate) fn load(c: &Counters) -> EngineStats {
    EngineStats {
        user_bytes_written: c.user_bytes_written.load(Relaxed),
        device_bytes_written: c.device_bytes_written.load(Relaxed),
        device_bytes_read: c.device_bytes_read.load(Relaxed),
        device_write_ios: c.device_write_ios.load(Relaxed),
        device_read_ios: c.device_read_ios.load(Relaxed),
        cached_bytes_read: c.cached_bytes_read.load(Relaxed),
        mapped_bytes_read: c.mapped_bytes_read.load(Relaxed),
        verified_bytes_read: c.verified_bytes_read.load(Relaxed),
        cache_rereads: c.cache_rereads.load(Relaxed),
        object_reads: c.object_reads.load(Relaxed),
        rmw_on_write_path: c.rmw_on_write_path.load(Relaxed),
        rmw_in_lazy_sync: c.rmw_in_lazy_sync.load(Relaxed),
        checksum_split_reads: c.checksum_split_reads.load(Relaxed),
        checksum_errors: c.checksum_errors.load(Relaxed),
        transactions_committed: c.transactions_committed.load(Relaxed),
        groups_committed: c.groups_committed.load(Relaxed),
        groups_gathered: c.groups_gathered.load(Relaxed),
        device_flushes: c.device_flushes.load(Relaxed),
        blocks_scrubbed: c.blocks_scrubbed.load(Relaxed),
        discarded_blocks: c.discarded_blocks.load(Relaxed),
        io_size_hist: c.io_size_hist.iter().map(|a| a.load(Relaxed)).collect(),
        write_run_hist: c.write_run_hist.iter().map(|a| a.load(Relaxed)).collect(),
        queue_depth: PerClass::from_fn(|p: Priority| c.queue_depth[p].load(Relaxed)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_writes_make_one_run() {
        let c = Counters::default();
        for i in 0..4 {
            c.record_write(i * 4096, 4096); // one run of 4 blocks
        }
        c.record_write(1 << 20, 4096); // a new run: the 4-block run is recorded
        c.record_write(0, 8192); // another new run: the 1-block run is recorded
        let s = load(&c);
        assert_eq!(s.write_run_hist[2], 1, "{:?}", s.write_run_hist);
        assert_eq!(s.write_run_hist[0], 1, "{:?}", s.write_run_hist);
        assert_eq!(s.device_bytes_written, 4 * 4096 + 4096 + 8192);
        assert_eq!(s.device_write_ios, 6);
        assert_eq!(s.write_runs(), 2, "the run being extended is not counted");
        c.record_read(4096);
        assert_eq!((load(&c).device_read_ios, load(&c).device_write_ios), (1, 6));
    }
}
