//! The object drive: opening and formatting, the commit pipeline (group commit), staging of whole blocks,
//! and background work (lazy sync, deferred frees). Planning of individual operations lives in `plan.rs`,
//! reads in `reader.rs`.

use crate::aligned::AlignedBuf;
use crate::alloc::{Allocator, Extent, Placement};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::keys::*;
use crate::overlay::{Overlay, View};
use crate::plan::{FragDelta, Planner, TxnState};
use crate::stats::{Counters, EngineStats};
use crate::superblock::{FORMAT_VERSION, SUPERBLOCK_BYTES, Superblock};
use crate::txn::{Op, Outcome, Priority, Staged, Transaction};
use parking_lot::{Condvar, Mutex};
use rocksdb::{DB, WriteBatch, WriteOptions};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

pub const BLOCK_SIZE_BYTES: u64 = 4096;

/// What the block map holds (`Engine::block_map_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMapSize {
    pub entries: u64,
    /// Logical blocks mapped.
    pub blocks: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}
/// The first 1 MiB of the device holds the superblock and room for its successors.
pub const DATA_START_BLOCK: u64 = 256;
/// Largest object the engine accepts: S3's 5 TiB.
pub const MAX_OBJECT_BYTES: u64 = 5 << 40;

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
    /// Bytes of the metadata cache of name entries and onodes (counted with a per-entry overhead);
    /// 0 turns it off.
    pub meta_cache_bytes: usize,
    /// Bytes of the page cache of recently written blocks (clean, dirty and fragment pages); 0 turns it
    /// off.
    pub page_cache_bytes: usize,
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
            queue_max_txns: 4096,
            kv_block_cache_bytes: 64 << 20,
            kv_write_buffer_bytes: 32 << 20,
            discard: false,
            max_op_data_bytes: 64 << 20,
            page_cache_reads: true,
            scrub_bytes_per_s: 0,
            meta_cache_bytes: 16 << 20,
            page_cache_bytes: 32 << 20,
        }
    }
}

struct Pending {
    txn: Transaction,
    reply: mpsc::SyncSender<Result<Outcome>>,
}

#[derive(Default)]
struct Queues {
    classes: [VecDeque<Pending>; 3],
    len: usize,
    shutdown: bool,
}

/// Per-block fragment accounting for lazy sync.
#[derive(Default)]
pub(crate) struct FragIndex {
    pub(crate) blocks: BTreeMap<(Nid, u64), (u32, u64)>,
    pub(crate) total_count: u64,
    pub(crate) total_bytes: u64,
}

impl FragIndex {
    fn apply(&mut self, d: &FragDelta) {
        match *d {
            FragDelta::Add(nid, lb, bytes) => {
                let e = self.blocks.entry((nid, lb)).or_default();
                e.0 += 1;
                e.1 += bytes;
                self.total_count += 1;
                self.total_bytes += bytes;
            }
            FragDelta::ClearBlock(nid, lb) => {
                if let Some((c, b)) = self.blocks.remove(&(nid, lb)) {
                    self.total_count -= c as u64;
                    self.total_bytes -= b;
                }
            }
            FragDelta::ClearObject(nid) | FragDelta::ClearFrom(nid, _) => {
                let first = if let FragDelta::ClearFrom(_, lb) = *d { lb } else { 0 };
                let keys: Vec<_> = self.blocks.range((nid, first)..=(nid, u64::MAX)).map(|(k, _)| *k).collect();
                for k in keys {
                    let (c, b) = self.blocks.remove(&k).expect("present");
                    self.total_count -= c as u64;
                    self.total_bytes -= b;
                }
            }
        }
    }
}

pub(crate) struct Inner {
    pub(crate) db: Arc<DB>,
    pub(crate) db_opts: rocksdb::Options,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) sb: Superblock,
    pub(crate) cfg: EngineConfig,
    pub(crate) alloc: Arc<Mutex<Allocator>>,
    pub(crate) counters: Counters,
    pub(crate) next_nid: AtomicU64,
    pub(crate) next_frag_seq: AtomicU64,
    pub(crate) frag_index: Mutex<FragIndex>,
    /// Commit epoch: incremented after every durable group.
    pub(crate) epoch: AtomicU64,
    /// Active readers by the epoch they started in.
    pub(crate) readers: Mutex<BTreeMap<u64, usize>>,
    /// Extents freed by a committed group, waiting for older readers to finish.
    deferred_free: Mutex<Vec<(u64, Extent)>>,
    queues: Mutex<Queues>,
    queue_not_empty: Condvar,
    queue_not_full: Condvar,
    failed: Mutex<Option<String>>,
    pub(crate) shutdown: AtomicBool,
    pub(crate) scrubber: crate::scrubber::Scrubber,
    /// Names and onodes, newest committed values (meta_cache.rs).
    pub(crate) meta_cache: crate::meta_cache::MetaCache,
    /// Clean, dirty and fragment pages of recently written blocks (page_cache.rs).
    pub(crate) page_cache: crate::page_cache::PageCache,
    /// Prioritized requests in flight; background work waits for them (bounded).
    pub(crate) high_priority: crate::qos::HighPriorityWork,
    /// Wakes the background worker early (shutdown, fragment pressure).
    bg_wake: (Mutex<bool>, Condvar),
    pub(crate) dir: PathBuf,
}

/// One object drive. Cheap to clone; every clone is the same drive.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

fn kv_path(dir: &Path) -> PathBuf {
    dir.join("kv")
}

impl Engine {
    /// Formats `device` and creates the metadata database in `dir/kv`.
    pub fn format(dir: &Path, device: Arc<dyn Device>, cfg: EngineConfig) -> Result<Engine> {
        let kv = kv_path(dir);
        if kv.exists() && std::fs::read_dir(&kv)?.next().is_some() {
            return Err(EngineError::InvalidArgument(format!("{} already holds a database", kv.display())));
        }
        let total_blocks = device.size_bytes() / BLOCK_SIZE_BYTES;
        if total_blocks < DATA_START_BLOCK + 16 {
            return Err(EngineError::InvalidArgument("the data device is too small (minimum 1088 KiB)".into()));
        }
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            block_size_bytes: BLOCK_SIZE_BYTES as u32,
            device_size_bytes: total_blocks * BLOCK_SIZE_BYTES,
            data_start_block: DATA_START_BLOCK,
        };
        std::fs::create_dir_all(&kv)?;
        let (db, _opts) = crate::kv::open(&kv, true, &kv_options(&cfg))?;
        let alloc = Allocator::new(total_blocks, DATA_START_BLOCK);
        let mut batch = WriteBatch::default();
        batch.put(META_UUID, sb.uuid);
        batch.put(META_FORMAT, KV_FORMAT_VERSION.to_be_bytes());
        let acf = crate::kv::cf(&db, CF_ALLOC)?;
        for (g, raw) in alloc.all_groups() {
            batch.put_cf(acf, g.to_be_bytes(), raw);
        }
        db.write_opt(batch, &sync_write())?;
        drop(db);
        // The superblock goes last: a device with a superblock always has a complete database.
        let mut buf = AlignedBuf::zeroed(SUPERBLOCK_BYTES);
        buf.as_mut_slice().copy_from_slice(&sb.encode());
        device.write_at(buf.as_slice(), 0)?;
        device.flush()?;
        Self::open(dir, device, cfg)
    }

    /// Opens a formatted drive: checks the superblock against the database and rebuilds in-memory state.
    pub fn open(dir: &Path, device: Arc<dyn Device>, cfg: EngineConfig) -> Result<Engine> {
        let mut buf = AlignedBuf::zeroed(SUPERBLOCK_BYTES);
        device.read_at(buf.as_mut_slice(), 0)?;
        let sb = Superblock::decode(buf.as_slice())?;
        if sb.device_size_bytes > device.size_bytes() {
            return Err(EngineError::Corrupt("the data device is smaller than its superblock says".into()));
        }
        let kv = kv_path(dir);
        if !kv.exists() {
            return Err(EngineError::NotADrive(format!("{} is missing", kv.display())));
        }
        let (db, db_opts) = crate::kv::open(&kv, false, &kv_options(&cfg))?;
        match db.get(META_UUID)? {
            Some(u) if u.as_slice() == sb.uuid => {}
            _ => return Err(EngineError::NotADrive("the database belongs to another device".into())),
        }
        // Every KV record format is versioned by this one number (records without their own version
        // byte rely on it; RocksDB checksums every block and WAL record).
        let kv_format = db.get(META_FORMAT)?.and_then(|v| v.try_into().ok()).map(u32::from_be_bytes);
        match kv_format {
            Some(KV_FORMAT_VERSION) => {}
            Some(1) => {
                // Version 1 records read unchanged; mark the drive so that version-1 builds refuse it
                // from now on (they cannot read the runs this build writes).
                let mut batch = WriteBatch::default();
                batch.put(META_FORMAT, KV_FORMAT_VERSION.to_be_bytes());
                db.write_opt(batch, &sync_write())?;
                tracing::info!(from = 1, to = KV_FORMAT_VERSION, "database format upgraded");
            }
            found => {
                return Err(EngineError::UnsupportedVersion {
                    found: found.unwrap_or(0),
                    supported: KV_FORMAT_VERSION,
                });
            }
        }
        let total_blocks = sb.device_size_bytes / BLOCK_SIZE_BYTES;
        let mut groups = Vec::new();
        for item in db.iterator_cf(crate::kv::cf(&db, CF_ALLOC)?, rocksdb::IteratorMode::Start) {
            let (k, v) = item?;
            groups.push((u64_at(&k, 0)?, v.to_vec()));
        }
        let alloc = Allocator::from_groups(total_blocks, sb.data_start_block, &groups);
        let next_nid = match db.iterator_cf(crate::kv::cf(&db, CF_ONODES)?, rocksdb::IteratorMode::End).next() {
            Some(item) => u64_at(&item?.0, 0)? + 1,
            None => 1,
        };
        let mut frag_index = FragIndex::default();
        let mut max_seq = 0;
        let mut inline_cache: Option<(Nid, bool)> = None;
        for item in db.iterator_cf(crate::kv::cf(&db, CF_FRAGS)?, rocksdb::IteratorMode::Start) {
            let (k, v) = item?;
            let (nid, lb, seq) = (u64_at(&k, 0)?, u64_at(&k, 8)?, u64_at(&k, 16)?);
            max_seq = max_seq.max(seq);
            let inline = match inline_cache {
                Some((n, i)) if n == nid => i,
                _ => {
                    let i = is_inline_in_db(&db, nid, cfg.inline_max_bytes)?;
                    inline_cache = Some((nid, i));
                    i
                }
            };
            // Fragments of objects that live wholly in the KV store are not lazy-sync work.
            if !inline {
                frag_index.apply(&FragDelta::Add(nid, lb, v.len().saturating_sub(8) as u64));
            }
        }
        let (meta_cache_bytes, page_cache_bytes) = (cfg.meta_cache_bytes, cfg.page_cache_bytes);
        let inner = Arc::new(Inner {
            db: Arc::new(db),
            db_opts,
            device,
            sb,
            cfg,
            alloc: Arc::new(Mutex::new(alloc)),
            counters: Counters::default(),
            next_nid: AtomicU64::new(next_nid),
            next_frag_seq: AtomicU64::new(max_seq + 1),
            frag_index: Mutex::new(frag_index),
            epoch: AtomicU64::new(1),
            readers: Mutex::new(BTreeMap::new()),
            deferred_free: Mutex::new(Vec::new()),
            queues: Mutex::new(Queues::default()),
            queue_not_empty: Condvar::new(),
            queue_not_full: Condvar::new(),
            failed: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            scrubber: Default::default(),
            high_priority: Default::default(),
            meta_cache: crate::meta_cache::MetaCache::new(meta_cache_bytes, 1),
            page_cache: crate::page_cache::PageCache::new(page_cache_bytes),
            bg_wake: (Mutex::new(false), Condvar::new()),
            dir: dir.to_path_buf(),
        });
        let mut threads = Vec::new();
        // One group may wait between the stages: the flusher works on the next while the committer syncs.
        let (to_committer, from_flusher) = mpsc::sync_channel(1);
        let i = inner.clone();
        threads.push(std::thread::Builder::new().name("mosaic-flush".into()).spawn(move || flusher(i, to_committer))?);
        let i = inner.clone();
        threads
            .push(std::thread::Builder::new().name("mosaic-commit".into()).spawn(move || committer(i, from_flusher))?);
        let i = inner.clone();
        threads.push(std::thread::Builder::new().name("mosaic-bg".into()).spawn(move || background(i))?);
        let rate = inner.cfg.scrub_bytes_per_s;
        if rate > 0 {
            let i = inner.clone();
            let scrub = std::thread::Builder::new().name("mosaic-scrub".into());
            threads.push(scrub.spawn(move || crate::scrubber::run(i, rate))?);
        }
        tracing::info!(
            dir = %dir.display(),
            device = inner.device.kind(),
            io = inner.device.io_path(),
            blocks = total_blocks,
            "drive open"
        );
        Ok(Engine { inner, threads: Arc::new(Mutex::new(threads)) })
    }

    /// What the background scrub (`EngineConfig::scrub_bytes_per_s`) has found so far.
    pub fn scrub_status(&self) -> crate::scrubber::ScrubStatus {
        self.inner.scrubber.status()
    }

    /// Waits until the background scrub has finished `passes` passes, at most `timeout`.
    pub fn wait_for_scrub_passes(&self, passes: u64, timeout: std::time::Duration) -> crate::scrubber::ScrubStatus {
        self.inner.scrubber.wait_for_passes(passes, timeout)
    }

    /// The drive's uuid from its superblock.
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.sb.uuid
    }

    pub fn block_size_bytes(&self) -> u64 {
        BLOCK_SIZE_BYTES
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// Applies a transaction atomically; returns once it is durable.
    pub fn submit(&self, txn: Transaction) -> Result<Outcome> {
        self.check_writable()?;
        let class = txn.priority.unwrap_or_else(|| {
            let marks_high = txn.ops.iter().any(|op| matches!(op, Op::SetPriority { high: true, .. }));
            if marks_high { Priority::ForegroundHigh } else { Priority::Foreground }
        });
        // A prioritized transaction holds background work back from its staging writes to its answer.
        let _prioritized = (class == Priority::ForegroundHigh).then(|| self.priority_guard());
        let txn = self.prepare(txn)?;
        let class = class as usize;
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut q = self.inner.queues.lock();
            while q.len >= self.inner.cfg.queue_max_txns && !q.shutdown {
                self.inner.queue_not_full.wait(&mut q);
            }
            if q.shutdown {
                return Err(EngineError::ShuttingDown);
            }
            q.classes[class].push_back(Pending { txn, reply: tx });
            q.len += 1;
            self.inner.counters.queue_depth[class].fetch_add(1, Ordering::Relaxed);
        }
        self.inner.queue_not_empty.notify_one();
        rx.recv().map_err(|_| EngineError::ShuttingDown)?
    }

    /// Marks the caller's work as prioritized (paper 003) until the guard drops: background work (lazy
    /// sync, scrub) waits before its next step, at most `qos::BACKGROUND_WAIT_MAX` at a time. Transactions
    /// of the ForegroundHigh class and readers of high-priority objects take one themselves.
    pub fn priority_guard(&self) -> crate::qos::PriorityGuard {
        crate::qos::PriorityGuard::new(self.inner.clone())
    }

    /// Moves the whole blocks of large writes out of the committer: they are written to fresh blocks here,
    /// on the caller's thread (so writers proceed in parallel), and the committer only references them.
    /// Pieces inside a block stay in the op and become fragments.
    fn prepare(&self, mut txn: Transaction) -> Result<Transaction> {
        let bs = BLOCK_SIZE_BYTES;
        let needs = |op: &Op| match op {
            Op::Write { offset, data, .. } => {
                let end = offset + data.len() as u64;
                end > self.inner.cfg.inline_max_bytes && offset.div_ceil(bs) < end / bs
            }
            _ => false,
        };
        if !txn.ops.iter().any(needs) {
            return Ok(txn);
        }
        let mut ops = Vec::with_capacity(txn.ops.len() + 2);
        for op in std::mem::take(&mut txn.ops) {
            if !needs(&op) {
                ops.push(op);
                continue;
            }
            let Op::Write { coll, name, offset, data } = op else { unreachable!("checked by needs") };
            crate::plan::check_op_data_len(data.len(), self.inner.cfg.max_op_data_bytes)?;
            let end = offset + data.len() as u64;
            let first_whole = offset.div_ceil(bs) * bs;
            let last_whole = end / bs * bs;
            let head = (first_whole - offset) as usize;
            let whole = (last_whole - first_whole) as usize;
            if head > 0 {
                ops.push(Op::Write { coll, name: name.clone(), offset, data: data[..head].to_vec() });
            }
            let staged = self.stage(&data[head..head + whole], whole as u64 >= 16 * bs)?;
            ops.push(Op::WriteStaged { coll, name: name.clone(), offset: first_whole, staged });
            if head + whole < data.len() {
                ops.push(Op::Write { coll, name, offset: last_whole, data: data[head + whole..].to_vec() });
            }
        }
        txn.ops = ops;
        Ok(txn)
    }

    /// Writes whole blocks of `data` (a multiple of the block size) to fresh device blocks, for a later
    /// `Op::WriteStaged`. Runs on the caller's thread, so many writers stream data in parallel.
    pub fn stage(&self, data: &[u8], sequential: bool) -> Result<Staged> {
        self.check_writable()?;
        let bs = BLOCK_SIZE_BYTES as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(EngineError::InvalidArgument("staged data must be whole blocks".into()));
        }
        let blocks = (data.len() / bs) as u64;
        let placement = if sequential || blocks >= 16 { Placement::Large } else { Placement::Cold };
        let extents = self.allocate(blocks, placement)?;
        let mut staged = Staged {
            extents,
            crcs: Vec::with_capacity(blocks as usize),
            len_bytes: data.len() as u64,
            released: false,
            alloc: self.inner.alloc.clone(),
        };
        staged.crcs.extend(data.chunks_exact(bs).map(crate::checksum::crc32c));
        let mut done = 0usize;
        for e in staged.extents.clone() {
            let len = (e.len * BLOCK_SIZE_BYTES) as usize;
            // On error `staged` drops and its blocks go back to the allocator.
            self.inner.write_blocks(e.start, &data[done..done + len])?;
            done += len;
        }
        Ok(staged)
    }

    pub(crate) fn allocate(&self, blocks: u64, placement: Placement) -> Result<Vec<Extent>> {
        self.inner.allocate(blocks, placement)
    }

    /// A consistent read view of the drive.
    pub fn reader(&self) -> crate::reader::Reader {
        crate::reader::Reader::new(self.inner.clone())
    }

    pub fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let mut s = crate::stats::load(&i.counters);
        use rocksdb::statistics::Ticker;
        s.kv_wal_bytes = i.db_opts.get_ticker_count(Ticker::WalFileBytes);
        s.kv_flush_bytes = i.db_opts.get_ticker_count(Ticker::FlushWriteBytes);
        s.kv_compaction_bytes = i.db_opts.get_ticker_count(Ticker::CompactWriteBytes);
        s.meta_cache_hits = i.meta_cache.hits.load(Ordering::Relaxed);
        s.meta_cache_misses = i.meta_cache.misses.load(Ordering::Relaxed);
        s.meta_cache_bytes = i.meta_cache.bytes() as u64;
        s.page_cache_hits = i.page_cache.hits.load(Ordering::Relaxed);
        s.page_cache_misses = i.page_cache.misses.load(Ordering::Relaxed);
        s.page_cache_bytes = i.page_cache.bytes() as u64;
        s.page_cache_dirty_pages = i.page_cache.dirty_pages();
        s.prioritized_in_flight = i.high_priority.in_flight();
        s.background_waits_for_priority = i.high_priority.background_waits.load(Ordering::Relaxed);
        {
            let f = i.frag_index.lock();
            s.fragments_outstanding = f.total_count;
            s.fragment_bytes_outstanding = f.total_bytes;
        }
        let a = i.alloc.lock();
        s.free_blocks = a.free_blocks();
        s.total_blocks = a.total_blocks();
        s.free_extents = a.free_extent_count() as u64;
        s
    }

    /// Memory the drive's caches and buffers may hold by configuration: the KV block cache, all memtables,
    /// the metadata cache and the page cache. The process's RSS stays within this plus a constant (threads, allocator,
    /// IO buffers in flight), which the engine bench measures.
    pub fn memory_budget_bytes(&self) -> u64 {
        let c = &self.inner.cfg;
        (c.kv_block_cache_bytes + crate::kv::DB_WRITE_BUFFER_TOTAL_BYTES + c.meta_cache_bytes + c.page_cache_bytes)
            as u64
    }

    /// Size of the block map: its entries and the bytes of their keys and values (one pass over the
    /// column family; for benches and tests).
    pub fn block_map_size(&self) -> Result<BlockMapSize> {
        let reader = self.reader();
        let snap = reader.snapshot_iter_access();
        let mut size = BlockMapSize::default();
        for item in snap.iter(CF_BLOCKS)? {
            let (k, v) = item?;
            size.entries += 1;
            size.bytes += (k.len() + v.len()) as u64;
            size.blocks += BlockRun::decode(&v)?.len_blocks();
        }
        Ok(size)
    }

    /// The block-map runs of an object as (first logical block, first physical block, blocks). For tests.
    #[doc(hidden)]
    pub fn debug_block_runs(&self, coll: CollectionId, name: &[u8]) -> Result<Vec<(u64, u64, u64)>> {
        let reader = self.reader();
        let nid = reader.lookup(coll, name)?.ok_or(EngineError::NotFound)?.nid;
        let runs = reader.runs_overlapping(nid, 0, u64::MAX)?;
        Ok(runs.into_iter().map(|(lb, r)| (lb, r.physical_start, r.len_blocks())).collect())
    }

    /// Runs lazy sync until no block is over its thresholds (with `all`: until no indexed fragment is
    /// left). Every merge clears its block from the index, so this ends. For benches and tests.
    pub fn sync_fragments(&self, all: bool) -> Result<u64> {
        let mut merged = 0;
        loop {
            let candidates = self.inner.lazy_sync_candidates(256, all);
            if candidates.is_empty() {
                return Ok(merged);
            }
            merged += candidates.len() as u64;
            self.merge_now(candidates)?;
        }
    }

    /// Lazy sync of some blocks with the heavy work outside the committer: merge from a snapshot, write
    /// all merged blocks in one staged IO, then commit a transaction that installs each one whose base and
    /// fragments are unchanged. Blocks with nothing to merge go through `MergeBlock`, which clears them
    /// from the fragment index.
    fn merge_now(&self, candidates: Vec<(Nid, u64)>) -> Result<()> {
        let reader = self.reader();
        let mut data = Vec::new();
        let mut merged = Vec::new();
        let mut txn = Transaction::new().with_priority(Priority::Background);
        for (nid, lb) in candidates {
            match reader.merge_input(nid, lb, self.inner.cfg.inline_max_bytes) {
                Ok(Some(m)) => {
                    let crc32c = crate::checksum::crc32c(&m.content);
                    data.extend_from_slice(&m.content);
                    merged.push(crate::txn::MergedBlock {
                        nid,
                        lblock: lb,
                        crc32c,
                        expected_base: m.base,
                        frag_keys: m.frag_keys,
                    });
                }
                // Nothing to merge, or a damaged base (reads report it, scrub names it).
                Ok(None) | Err(EngineError::Checksum { .. }) => {
                    txn.push(Op::MergeBlock { nid, lblock: lb });
                }
                Err(e) => return Err(e),
            }
        }
        drop(reader);
        if !merged.is_empty() {
            let extents = self.allocate(merged.len() as u64, Placement::Hot)?;
            let staged = Staged {
                extents,
                crcs: merged.iter().map(|m| m.crc32c).collect(),
                len_bytes: data.len() as u64,
                released: false,
                alloc: self.inner.alloc.clone(),
            };
            let mut done = 0usize;
            for e in staged.extents.clone() {
                let len = (e.len * BLOCK_SIZE_BYTES) as usize;
                self.inner.write_blocks(e.start, &data[done..done + len])?;
                done += len;
            }
            txn.push(Op::InstallMerged { staged, blocks: merged });
        }
        if txn.ops.is_empty() {
            return Ok(());
        }
        self.submit(txn).map(|_| ())
    }

    /// Whether the drive is open and accepting writes.
    pub fn is_healthy(&self) -> bool {
        self.inner.failed.lock().is_none() && !self.inner.shutdown.load(Ordering::SeqCst)
    }

    pub fn failure(&self) -> Option<String> {
        self.inner.failed.lock().clone()
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(why) = self.inner.failed.lock().clone() {
            return Err(EngineError::ReadOnly(why));
        }
        if self.inner.shutdown.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    /// Stops accepting work, finishes queued transactions, flushes the database and joins the threads.
    pub fn close(&self) -> Result<()> {
        {
            let mut q = self.inner.queues.lock();
            q.shutdown = true;
        }
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.queue_not_empty.notify_all();
        self.inner.queue_not_full.notify_all();
        {
            let (m, c) = &self.inner.bg_wake;
            *m.lock() = true;
            c.notify_all();
        }
        self.inner.scrubber.stop();
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        self.inner.db.flush_wal(true)?;
        Ok(())
    }

    /// Path of the drive's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    #[doc(hidden)]
    pub fn debug_device(&self) -> Arc<dyn Device> {
        self.inner.device.clone()
    }
}

fn is_inline_in_db(db: &DB, nid: Nid, inline_max_bytes: u64) -> Result<bool> {
    let size = match db.get_cf(crate::kv::cf(db, CF_ONODES)?, nid_key(nid))? {
        Some(raw) => Onode::decode(&raw)?.size_bytes,
        None => return Ok(false),
    };
    let has_blocks = db
        .iterator_cf(
            crate::kv::cf(db, CF_BLOCKS)?,
            rocksdb::IteratorMode::From(&nid_key(nid), rocksdb::Direction::Forward),
        )
        .next()
        .transpose()?
        .is_some_and(|(k, _)| k.starts_with(&nid_key(nid)));
    Ok(size <= inline_max_bytes && !has_blocks)
}

fn kv_options(cfg: &EngineConfig) -> crate::kv::KvOptions {
    crate::kv::KvOptions { block_cache_bytes: cfg.kv_block_cache_bytes, write_buffer_bytes: cfg.kv_write_buffer_bytes }
}

pub(crate) fn sync_write() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

impl Inner {
    pub(crate) fn allocate(&self, blocks: u64, placement: Placement) -> Result<Vec<Extent>> {
        let mut a = self.alloc.lock();
        a.allocate(blocks, placement)
            .ok_or(EngineError::NoSpace { needed_blocks: blocks, free_blocks: a.free_blocks() })
    }

    /// Writes whole blocks starting at physical block `start`.
    pub(crate) fn write_blocks(&self, start: u64, data: &[u8]) -> Result<()> {
        debug_assert!((data.len() as u64).is_multiple_of(BLOCK_SIZE_BYTES));
        debug_assert!(start >= self.sb.data_start_block);
        // Pieces of at most 4 MiB, written straight from `data` when it is aligned (the S3 layer stages from
        // aligned buffers), else copied into an aligned buffer first.
        const CHUNK: usize = 4 << 20;
        let aligned = (data.as_ptr() as usize).is_multiple_of(crate::aligned::IO_ALIGN_BYTES);
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(CHUNK);
            let copy = (!aligned).then(|| AlignedBuf::copy_of(&data[done..done + n]));
            let piece = copy.as_ref().map_or(&data[done..done + n], |b| &b.as_slice()[..n]);
            let off = start * BLOCK_SIZE_BYTES + done as u64;
            if let Err(e) = self.device.write_at(piece, off) {
                self.fail(format!("device write failed at byte {off}: {e}"));
                return Err(e.into());
            }
            self.counters.record_write(off, n as u64);
            done += n;
        }
        Ok(())
    }

    /// Reads whole blocks starting at physical block `start` into `out` (a multiple of the block size).
    pub(crate) fn read_blocks(&self, start: u64, out: &mut [u8]) -> Result<()> {
        const CHUNK: usize = 4 << 20;
        let mut buf = AlignedBuf::zeroed(CHUNK.min(out.len()));
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(CHUNK);
            let off = start * BLOCK_SIZE_BYTES + done as u64;
            self.device.read_at(&mut buf.as_mut_slice()[..n], off)?;
            self.counters.record_read(n as u64);
            out[done..done + n].copy_from_slice(&buf.as_slice()[..n]);
            done += n;
        }
        Ok(())
    }

    /// Reads `len_bytes` (a whole number of blocks, at most one run) straight into an aligned buffer: one
    /// device read, no bounce copy.
    /// `cached`: through the kernel's page cache (see `EngineConfig::page_cache_reads`).
    pub(crate) fn read_run(&self, start: u64, len_bytes: usize, cached: bool) -> Result<AlignedBuf> {
        debug_assert!(len_bytes > 0 && len_bytes.is_multiple_of(BLOCK_SIZE_BYTES as usize));
        let mut buf = AlignedBuf::zeroed(len_bytes);
        if cached {
            self.device.read_cached_at(buf.as_mut_slice(), start * BLOCK_SIZE_BYTES)?;
            self.counters.cached_bytes_read.fetch_add(len_bytes as u64, Ordering::Relaxed);
        } else {
            self.device.read_at(buf.as_mut_slice(), start * BLOCK_SIZE_BYTES)?;
            self.counters.record_read(len_bytes as u64);
        }
        Ok(buf)
    }

    pub(crate) fn fail(&self, why: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::error!(reason = %why, "drive is now read-only");
            *f = Some(why);
        }
    }

    fn lazy_sync_candidates(&self, max: usize, all: bool) -> Vec<(Nid, u64)> {
        let f = self.frag_index.lock();
        let over_budget = f.total_bytes > self.cfg.frag_budget_bytes;
        f.blocks
            .iter()
            .filter(|(_, (c, b))| {
                // A lone fragment (typically an object's tail) stays unless space pressure says otherwise.
                all || over_budget
                    || *c >= self.cfg.lazy_sync_frag_count
                    || (*c > 1 && *b >= self.cfg.lazy_sync_frag_bytes)
            })
            .take(max)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Moves deferred frees whose epoch no active reader can still see into the allocator.
    fn release_deferred(&self) {
        let oldest_reader = self.readers.lock().keys().next().copied().unwrap_or(u64::MAX);
        let ready: Vec<Extent> = {
            let mut d = self.deferred_free.lock();
            let (ready, wait): (Vec<_>, Vec<_>) = d.drain(..).partition(|(e, _)| *e <= oldest_reader);
            *d = wait;
            ready.into_iter().map(|(_, x)| x).collect()
        };
        if ready.is_empty() {
            return;
        }
        if self.cfg.discard {
            for e in &ready {
                if self.device.discard(e.start * BLOCK_SIZE_BYTES, e.len * BLOCK_SIZE_BYTES).is_ok() {
                    self.counters.discarded_blocks.fetch_add(e.len, Ordering::Relaxed);
                }
            }
        }
        let mut a = self.alloc.lock();
        for e in ready {
            a.release(e);
        }
    }

    fn take_group(&self) -> Option<Vec<Pending>> {
        let mut q = self.queues.lock();
        while q.len == 0 {
            if q.shutdown {
                return None;
            }
            self.queue_not_empty.wait(&mut q);
        }
        let max = self.cfg.group_max_txns;
        let mut group = Vec::new();
        // Highest class first; background work gets at most one slot per group while foreground waits.
        for class in [Priority::ForegroundHigh, Priority::Foreground] {
            while group.len() < max {
                match q.classes[class as usize].pop_front() {
                    Some(p) => {
                        self.counters.queue_depth[class as usize].fetch_sub(1, Ordering::Relaxed);
                        group.push(p)
                    }
                    None => break,
                }
            }
        }
        let bg_slots = if group.is_empty() { max } else { 1 };
        for _ in 0..bg_slots {
            match q.classes[Priority::Background as usize].pop_front() {
                Some(p) => {
                    self.counters.queue_depth[0].fetch_sub(1, Ordering::Relaxed);
                    group.push(p)
                }
                None => break,
            }
        }
        q.len -= group.len();
        drop(q);
        self.queue_not_full.notify_all();
        Some(group)
    }

    /// Moves queued foreground transactions that reference no staged data into `group`, up to the group
    /// limit: they need no device flush, so they can skip the flusher.
    fn take_unflushed(&self, group: &mut Vec<Pending>) {
        let max = self.cfg.group_max_txns;
        if group.len() >= max {
            return;
        }
        let mut q = self.queues.lock();
        let mut taken = 0;
        for class in [Priority::ForegroundHigh, Priority::Foreground] {
            let queue = &mut q.classes[class as usize];
            let mut i = 0;
            while i < queue.len() && group.len() < max {
                if queue[i].txn.has_staged_data() {
                    i += 1;
                    continue;
                }
                group.push(queue.remove(i).expect("index in range"));
                self.counters.queue_depth[class as usize].fetch_sub(1, Ordering::Relaxed);
                taken += 1;
            }
        }
        q.len -= taken;
        drop(q);
        if taken > 0 {
            self.queue_not_full.notify_all();
        }
    }

    fn commit_group(&self, group: Vec<Pending>) {
        let mut group_ov = Overlay::default();
        let mut results: Vec<(mpsc::SyncSender<Result<Outcome>>, Result<Outcome>)> = Vec::new();
        let mut marks: Vec<(Extent, bool)> = Vec::new();
        let mut frees: Vec<Extent> = Vec::new();
        let mut deltas: Vec<FragDelta> = Vec::new();
        let mut page_changes: Vec<crate::page_cache::PageChange> = Vec::new();
        let mut needs_flush = false;
        let mut user_bytes = 0;
        for p in group {
            let mut ts = TxnState::default();
            let mut view = View::with_cache(&self.db, &group_ov, &self.meta_cache, self.epoch.load(Ordering::SeqCst));
            let r = Planner { inner: self, view: &mut view, ts: &mut ts }.plan(p.txn);
            let top = std::mem::take(&mut view.top);
            drop(view);
            match r {
                Ok(outcome) => {
                    group_ov.absorb(top);
                    marks.append(&mut ts.marks);
                    frees.append(&mut ts.frees);
                    deltas.append(&mut ts.frag_deltas);
                    page_changes.append(&mut ts.page_changes);
                    needs_flush |= ts.device_written;
                    user_bytes += ts.user_bytes;
                    for s in ts.staged.iter_mut() {
                        s.released = true;
                    }
                    results.push((p.reply, Ok(outcome)));
                }
                Err(e) => {
                    // Nothing of a failed transaction is referenced: give its fresh blocks back now.
                    let mut a = self.alloc.lock();
                    for x in ts.fresh.drain(..) {
                        a.release(x);
                    }
                    drop(a);
                    // Staged blocks of the failed transaction go back when `ts` drops.
                    results.push((p.reply, Err(e)));
                }
            }
        }
        let committed = self.make_durable(group_ov, &marks, &page_changes, needs_flush);
        match committed {
            Ok(()) => {
                let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
                self.deferred_free.lock().extend(frees.into_iter().map(|e| (epoch, e)));
                {
                    let mut f = self.frag_index.lock();
                    for d in &deltas {
                        f.apply(d);
                    }
                }
                self.release_deferred();
                let ok = results.iter().filter(|r| r.1.is_ok()).count() as u64;
                self.counters.transactions_committed.fetch_add(ok, Ordering::Relaxed);
                self.counters.groups_committed.fetch_add(1, Ordering::Relaxed);
                self.counters.user_bytes_written.fetch_add(user_bytes, Ordering::Relaxed);
                for (reply, r) in results {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                // Values installed for this group never became durable.
                self.meta_cache.clear();
                self.page_cache.clear();
                self.fail(format!("commit failed: {e}"));
                for (reply, r) in results {
                    let _ = reply.send(r.and(Err(EngineError::ReadOnly(e.to_string()))));
                }
            }
        }
    }

    /// Device flush (if planning wrote data: the read-modify-write baseline, small whole-block writes) and
    /// then one synchronous KV batch: the group's commit point. Staged data was flushed by the flusher.
    fn make_durable(
        &self,
        group_ov: Overlay,
        marks: &[(Extent, bool)],
        page_changes: &[crate::page_cache::PageChange],
        needs_flush: bool,
    ) -> Result<()> {
        if needs_flush {
            self.device.flush()?;
            self.counters.device_flushes.fetch_add(1, Ordering::Relaxed);
        }
        // Names and onodes of this group go into the metadata cache before its batch is written (see
        // meta_cache.rs); readers use them only once the group's epoch is published.
        let epoch = self.epoch.load(Ordering::SeqCst) + 1;
        self.meta_cache.begin_install(epoch);
        for cf in [CF_NAMES, CF_ONODES] {
            for (k, v) in group_ov.changes(cf) {
                self.meta_cache.install(cf, k, v.clone());
            }
        }
        // Pages the same way (page_cache.rs).
        self.page_cache.apply(page_changes, epoch);
        let mut batch = WriteBatch::default();
        group_ov.into_batch(&self.db, &mut batch)?;
        {
            let mut a = self.alloc.lock();
            for (e, used) in marks {
                a.mark(*e, *used);
            }
            let acf = crate::kv::cf(&self.db, CF_ALLOC)?;
            for (g, raw) in a.take_dirty_groups() {
                batch.put_cf(acf, g.to_be_bytes(), raw);
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.db.write_opt(batch, &sync_write())?;
        Ok(())
    }
}

/// First stage of the commit pipeline: takes the next group and makes the data its transactions staged
/// durable (one device flush), then hands it to the committer. While the committer writes group n's batch
/// and syncs the WAL, this stage flushes group n+1's data, so the two syncs overlap instead of adding up.
fn flusher(inner: Arc<Inner>, to_committer: mpsc::SyncSender<Vec<Pending>>) {
    while let Some(group) = inner.take_group() {
        if group.iter().any(|p| p.txn.has_staged_data()) {
            if let Err(e) = inner.device.flush() {
                inner.fail(format!("device flush failed: {e}"));
                for p in group {
                    let _ = p.reply.send(Err(EngineError::ReadOnly(format!("device flush failed: {e}"))));
                }
                continue;
            }
            inner.counters.device_flushes.fetch_add(1, Ordering::Relaxed);
        }
        if to_committer.send(group).is_err() {
            return;
        }
    }
}

/// Second stage: plans each flushed group and commits it with one synchronous KV batch. Transactions that
/// arrived while the previous batch was syncing and need no device flush join the group here, so small
/// writes are grouped as before pipelining (measured: without this, groups of 2 KiB writes halved in size
/// and throughput fell from 37 to 21 MiB/s).
fn committer(inner: Arc<Inner>, from_flusher: mpsc::Receiver<Vec<Pending>>) {
    while let Ok(mut group) = from_flusher.recv() {
        inner.take_unflushed(&mut group);
        inner.commit_group(group);
        let pressure = inner.frag_index.lock().total_bytes > inner.cfg.frag_budget_bytes;
        if pressure {
            let (m, c) = &inner.bg_wake;
            *m.lock() = true;
            c.notify_one();
        }
    }
}

/// Background work at the lowest priority: lazy sync and deferred frees. It yields whenever foreground
/// transactions are queued.
fn background(inner: Arc<Inner>) {
    // A handle for submitting; it owns no threads, so dropping it stops nothing.
    let engine = Engine { inner: inner.clone(), threads: Arc::new(Mutex::new(Vec::new())) };
    loop {
        {
            let (m, c) = &inner.bg_wake;
            let mut woken = m.lock();
            if !*woken {
                c.wait_for(&mut woken, std::time::Duration::from_millis(50));
            }
            *woken = false;
        }
        if inner.shutdown.load(Ordering::SeqCst) {
            return;
        }
        inner.release_deferred();
        if !inner.cfg.lazy_sync || inner.failed.lock().is_some() {
            continue;
        }
        // Merge while blocks are over their thresholds. Reads and writes happen here, not in the
        // committer; the committer bounds this work's share (one background transaction per group while
        // foreground transactions wait). Merging soon also lets the memtable flush drop the fragments.
        loop {
            inner.high_priority.yield_to_prioritized(crate::qos::BACKGROUND_WAIT_MAX);
            let candidates = inner.lazy_sync_candidates(64, false);
            if candidates.is_empty() || inner.shutdown.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = engine.merge_now(candidates) {
                if !matches!(e, EngineError::ShuttingDown) {
                    tracing::warn!(error = %e, "lazy sync failed");
                }
                break;
            }
        }
    }
}
