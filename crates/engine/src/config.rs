//! The engine's configuration: cache sizes, thresholds of lazy sync, limits of the commit pipeline, the
//! background scrub. Every field has a default that works for a drive that sets nothing.

use crate::superblock::BLOCK_SIZE_BYTES;

/// How unaligned writes are handled: the fragment log of paper 001, or the classic read-modify-write kept
/// as the ablation baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    FragmentLog,
    Rmw,
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Objects up to this size that have no data blocks live wholly in the KV store. The server's default
    /// (16 KiB) is measured in docs/bench/2026-11-22-inline-threshold.md.
    pub inline_max_bytes: u64,
    /// Lazy sync merges a block once it has this many fragments...
    pub lazy_sync_frag_count: u32,
    /// ...or this many fragment bytes.
    pub lazy_sync_frag_bytes: u64,
    /// Total fragment bytes above which lazy sync runs regardless of the per-block thresholds.
    pub frag_budget_bytes: u64,
    pub write_mode: WriteMode,
    /// Run the lazy-sync thread. Off only in tests that want fragments to stay.
    pub lazy_sync: bool,
    pub group_max_txns: usize,
    /// How long the committer may hold a small group of foreground transactions for more to join it
    /// (`commit::Gather`: only while groups of several transactions have been forming, so a lone client
    /// never waits); zero commits every group at once.
    pub commit_gather: std::time::Duration,
    pub queue_max_txns: usize,
    pub kv_block_cache_bytes: usize,
    pub kv_write_buffer_bytes: usize,
    /// Discard (TRIM / punch hole) freed extents in batches.
    pub discard: bool,
    /// Largest data carried inline in one Write/Append op; bigger writes must be staged.
    pub max_op_data_bytes: usize,
    /// Object reads go through the kernel's page cache (hot data from memory, outside the process's
    /// memory); every block is still checked against its checksum, and one that fails is read again from
    /// the device. Writes, scrub and lazy-sync reads always go to the device directly.
    pub page_cache_reads: bool,
    /// Device read rate of the background scrub (bytes per second of blocks verified); 0: no background
    /// scrub.
    pub scrub_bytes_per_s: u64,
    /// A scrub pass starts no sooner than this after the previous one started (an empty or unchanged drive
    /// is not walked over and over).
    pub scrub_pass_interval: std::time::Duration,
    /// Bytes of the metadata cache of name entries and onodes (counted with a per-entry overhead);
    /// 0 turns it off.
    pub meta_cache_bytes: usize,
    /// Bytes of the page cache of recently written blocks (clean, dirty and fragment pages); 0 turns it
    /// off.
    pub page_cache_bytes: usize,
    /// Bytes of large reads kept verified and pinned in the kernel's page cache (`verified.rs`): a read of
    /// them again is served from memory with no checksum pass. Pinned pages are not reclaimed while kept;
    /// 0 keeps none (every large read is still served in place, pinned while it is sent).
    pub verified_cache_bytes: u64,
    /// At most this many segments kept verified (each holds one descriptor).
    pub verified_cache_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            inline_max_bytes: 16 * 1024,
            lazy_sync_frag_count: 8,
            lazy_sync_frag_bytes: BLOCK_SIZE_BYTES,
            frag_budget_bytes: 1 << 30,
            write_mode: WriteMode::FragmentLog,
            lazy_sync: true,
            group_max_txns: 128,
            commit_gather: std::time::Duration::from_micros(2000),
            queue_max_txns: 4096,
            kv_block_cache_bytes: 64 << 20,
            kv_write_buffer_bytes: 32 << 20,
            discard: false,
            max_op_data_bytes: 64 << 20,
            page_cache_reads: true,
            scrub_bytes_per_s: 0,
            scrub_pass_interval: std::time::Duration::from_secs(24 * 3600),
            meta_cache_bytes: 16 << 20,
            page_cache_bytes: 32 << 20,
            verified_cache_bytes: 256 << 20,
            verified_cache_entries: 1024,
        }
    }
}
