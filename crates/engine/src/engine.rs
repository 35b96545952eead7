//! The `Engine` facade: formatting and opening a drive (which builds the layers below and starts their
//! threads), and the public API, each call handed to the layer that owns it: transactions to the commit
//! pipeline, reads to readers, verification to `verify`, the background scrub to `scrubber`.

use crate::alloc::Allocator;
use crate::blockio::BlockIo;
use crate::commit::{Pipeline, sync_write};
use crate::config::EngineConfig;
use crate::core::{Core, Epochs};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::frag_index::{FragDelta, FragIndex};
use crate::keys::*;
use crate::kv::KvMemory;
use crate::plan::Ids;
use crate::qos::Priority;
use crate::reader::Reader;
use crate::scrubber::{ScrubStatus, Scrubber};
use crate::space::{GROWTH_MIN_BYTES, Space};
use crate::stats::{Counters, EngineStats};
use crate::superblock::{BLOCK_SIZE_BYTES, DATA_START_BLOCK, FORMAT_VERSION, SUPERBLOCK_BYTES, Superblock};
use crate::txn::{Op, Outcome, Staged, Transaction};
use crate::verify::{CheckReport, ScrubReport};
use mosaic_store::AlignedBuf;
use parking_lot::Mutex;
use rocksdb::{DB, WriteBatch};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

/// What the block map holds (`Engine::block_map_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMapSize {
    pub entries: u64,
    /// Logical blocks mapped.
    pub blocks: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}

/// How much of the device a drive uses, holds and may grow to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceUsage {
    /// Bytes of blocks that hold data (the superblock area included).
    pub used_bytes: u64,
    /// Bytes the device holds now (a thin drive file's current size).
    pub allocated_bytes: u64,
    /// Bytes the drive may grow to.
    pub capacity_bytes: u64,
}

/// One object drive. Cheap to clone; every clone is the same drive.
#[derive(Clone)]
pub struct Engine {
    pipe: Arc<Pipeline>,
    shared: Arc<Shared>,
}

/// What the facade keeps beside the pipeline.
struct Shared {
    sb: Superblock,
    /// The node's KV memory when this drive shares it (`open_sharing`).
    kv_memory: Option<KvMemory>,
    db_opts: rocksdb::Options,
    scrubber: Arc<Scrubber>,
    dir: PathBuf,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn kv_path(dir: &Path) -> PathBuf {
    dir.join("kv")
}

impl Engine {
    /// Formats `device` (all of it) and creates the metadata database in `dir/kv`.
    pub fn format(dir: &Path, device: Arc<dyn Device>, cfg: EngineConfig) -> Result<Engine> {
        let capacity = device.size_bytes();
        Self::format_with_capacity(dir, device, capacity, cfg)
    }

    /// Formats a drive that may grow to `capacity_bytes`: a thin device holds what is stored and grows in
    /// steps (`Device::grow_to`) as data arrives.
    pub fn format_with_capacity(
        dir: &Path,
        device: Arc<dyn Device>,
        capacity_bytes: u64,
        cfg: EngineConfig,
    ) -> Result<Engine> {
        Self::format_sharing(dir, device, capacity_bytes, cfg, None)
    }

    /// Like `format_with_capacity`, the database drawing on the node's shared KV memory (`open_sharing`).
    pub fn format_sharing(
        dir: &Path,
        device: Arc<dyn Device>,
        capacity_bytes: u64,
        cfg: EngineConfig,
        memory: Option<KvMemory>,
    ) -> Result<Engine> {
        let kv = kv_path(dir);
        if kv.exists() && std::fs::read_dir(&kv)?.next().is_some() {
            return Err(EngineError::InvalidArgument(format!("{} already holds a database", kv.display())));
        }
        let total_blocks = capacity_bytes.min(device.capacity_bytes()) / BLOCK_SIZE_BYTES;
        if total_blocks < DATA_START_BLOCK + 16 {
            return Err(EngineError::InvalidArgument("the data device is too small (minimum 1088 KiB)".into()));
        }
        // A thin device starts with the superblock area and one growth step.
        let first_bytes =
            ((DATA_START_BLOCK * BLOCK_SIZE_BYTES) + GROWTH_MIN_BYTES).min(total_blocks * BLOCK_SIZE_BYTES);
        device.grow_to(first_bytes.max(device.size_bytes().min(total_blocks * BLOCK_SIZE_BYTES)))?;
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            block_size_bytes: BLOCK_SIZE_BYTES as u32,
            device_size_bytes: total_blocks * BLOCK_SIZE_BYTES,
            data_start_block: DATA_START_BLOCK,
        };
        std::fs::create_dir_all(&kv)?;
        let (db, _opts) = crate::kv::open(&kv, true, &kv_options(&cfg, memory.clone()))?;
        let limit = (device.size_bytes() / BLOCK_SIZE_BYTES).min(total_blocks);
        let alloc = Allocator::new(total_blocks, DATA_START_BLOCK, limit);
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
        Self::open_sharing(dir, device, cfg, memory)
    }

    /// Opens a formatted drive: checks the superblock against the database and rebuilds in-memory state.
    pub fn open(dir: &Path, device: Arc<dyn Device>, cfg: EngineConfig) -> Result<Engine> {
        Self::open_sharing(dir, device, cfg, None)
    }

    /// Like `open`, the database's block cache and memtables drawn from `memory`, the node's (shared by its
    /// drives, so that more drives do not multiply the memory); None: the drive's own, by `cfg`.
    pub fn open_sharing(
        dir: &Path,
        device: Arc<dyn Device>,
        cfg: EngineConfig,
        memory: Option<KvMemory>,
    ) -> Result<Engine> {
        let mut buf = AlignedBuf::zeroed(SUPERBLOCK_BYTES);
        device.read_at(buf.as_mut_slice(), 0)?;
        let sb = Superblock::decode(buf.as_slice())?;
        if sb.device_size_bytes > device.capacity_bytes() {
            return Err(EngineError::Corrupt("the data device is smaller than its superblock says".into()));
        }
        let kv = kv_path(dir);
        if !kv.exists() {
            return Err(EngineError::NotADrive(format!("{} is missing", kv.display())));
        }
        let (db, db_opts) = crate::kv::open(&kv, false, &kv_options(&cfg, memory.clone()))?;
        match db.get(META_UUID)? {
            Some(u) if u.as_slice() == sb.uuid => {}
            _ => return Err(EngineError::NotADrive("the database belongs to another device".into())),
        }
        check_kv_format(&db)?;
        let total_blocks = sb.device_size_bytes / BLOCK_SIZE_BYTES;
        let limit = (device.size_bytes() / BLOCK_SIZE_BYTES).min(total_blocks);
        let mut groups = Vec::new();
        for item in db.iterator_cf(crate::kv::cf(&db, CF_ALLOC)?, rocksdb::IteratorMode::Start) {
            let (k, v) = item?;
            groups.push((u64_at(&k, 0)?, v.to_vec()));
        }
        let alloc = Allocator::from_groups(total_blocks, sb.data_start_block, limit, &groups);
        if alloc.limit_blocks() > limit {
            // Blocks in use lie beyond the device's end (a file that lost its tail): grow it back, so they
            // read as what was written there rather than fail.
            device.grow_to(alloc.limit_blocks() * BLOCK_SIZE_BYTES)?;
        }
        let next_nid = match db.iterator_cf(crate::kv::cf(&db, CF_ONODES)?, rocksdb::IteratorMode::End).next() {
            Some(item) => u64_at(&item?.0, 0)? + 1,
            None => 1,
        };
        let (frags, max_seq) = rebuild_frag_index(&db, cfg.inline_max_bytes)?;
        let counters = Arc::new(Counters::default());
        let verified = crate::verified::VerifiedPins::new(
            if cfg.page_cache_reads { cfg.verified_cache_bytes } else { 0 },
            cfg.verified_cache_entries,
            crate::superblock::BLOCK_SIZE_BYTES,
        );
        let io = BlockIo::new(device, sb.data_start_block, counters, cfg.page_cache_reads, verified);
        let core = Arc::new(Core {
            db: Arc::new(db),
            io,
            meta_cache: crate::meta_cache::MetaCache::new(cfg.meta_cache_bytes, 1),
            page_cache: crate::page_cache::PageCache::new(cfg.page_cache_bytes),
            epochs: Epochs::starting_at(1),
            qos: Default::default(),
        });
        let ids = Ids { next_nid: AtomicU64::new(next_nid), next_frag_seq: AtomicU64::new(max_seq + 1) };
        let pipe = Arc::new(Pipeline::new(core.clone(), cfg.clone(), Space::new(alloc), ids, frags));
        let scrubber = Arc::new(Scrubber::default());
        let threads = start_threads(&pipe, &scrubber, &cfg)?;
        tracing::info!(
            dir = %dir.display(),
            device = core.io.device().kind(),
            io = core.io.device().io_path(),
            blocks = total_blocks,
            "drive open"
        );
        let shared =
            Shared { sb, kv_memory: memory, db_opts, scrubber, dir: dir.to_path_buf(), threads: Mutex::new(threads) };
        Ok(Engine { pipe, shared: Arc::new(shared) })
    }

    /// What the background scrub (`EngineConfig::scrub_bytes_per_s`) has found so far.
    pub fn scrub_status(&self) -> ScrubStatus {
        self.shared.scrubber.status()
    }

    /// Waits until the background scrub has finished `passes` passes, at most `timeout`.
    pub fn wait_for_scrub_passes(&self, passes: u64, timeout: std::time::Duration) -> ScrubStatus {
        self.shared.scrubber.wait_for_passes(passes, timeout)
    }

    /// The drive's uuid from its superblock.
    pub fn uuid(&self) -> [u8; 16] {
        self.shared.sb.uuid
    }

    pub fn block_size_bytes(&self) -> u64 {
        BLOCK_SIZE_BYTES
    }

    pub fn config(&self) -> &EngineConfig {
        &self.pipe.cfg
    }

    /// Applies a transaction atomically; returns once it is durable. A failed operation is reported as
    /// `EngineError::Op` naming it (`EngineError::cause` is what went wrong).
    pub fn submit(&self, txn: Transaction) -> Result<Outcome> {
        self.pipe.check_writable()?;
        let class = txn.priority.unwrap_or_else(|| {
            let marks_high = txn.ops.iter().any(|op| matches!(op, Op::SetPriority { high: true, .. }));
            if marks_high { Priority::ForegroundHigh } else { Priority::Foreground }
        });
        // A prioritized transaction holds background work back from its staging writes to its answer.
        let _prioritized = (class == Priority::ForegroundHigh).then(|| self.priority_guard());
        let txn = self.prepare(txn)?;
        self.pipe.submit(txn, class)
    }

    /// Marks the caller's work as prioritized (paper 003) until the guard drops: background work (lazy
    /// sync, scrub) waits before its next step, at most `qos::BACKGROUND_WAIT_MAX` at a time. Transactions
    /// of the ForegroundHigh class and readers of high-priority objects take one themselves.
    pub fn priority_guard(&self) -> crate::qos::PriorityGuard {
        crate::qos::PriorityGuard::new(self.pipe.core.qos.clone())
    }

    /// Moves the whole blocks of large writes out of the committer: they are written to fresh blocks here,
    /// on the caller's thread (so writers proceed in parallel), and the committer only references them.
    /// Pieces inside a block stay in the op and become fragments.
    fn prepare(&self, mut txn: Transaction) -> Result<Transaction> {
        let bs = BLOCK_SIZE_BYTES;
        let inline_max = self.pipe.cfg.inline_max_bytes;
        let needs = |op: &Op| match op {
            Op::Write { offset, data, .. } => {
                let end = offset + data.len() as u64;
                end > inline_max && offset.div_ceil(bs) < end / bs
            }
            _ => false,
        };
        if !txn.ops.iter().any(needs) {
            return Ok(txn);
        }
        let mut ops = Vec::with_capacity(txn.ops.len() + 2);
        for (index, op) in std::mem::take(&mut txn.ops).into_iter().enumerate() {
            if !needs(&op) {
                ops.push(op);
                continue;
            }
            let Op::Write { coll, name, offset, data } = op else { unreachable!("checked by needs") };
            let in_op = |e| EngineError::in_op(index, "write", e);
            crate::plan::check_op_data_len(data.len(), self.pipe.cfg.max_op_data_bytes).map_err(in_op)?;
            let end = offset + data.len() as u64;
            let first_whole = offset.div_ceil(bs) * bs;
            let last_whole = end / bs * bs;
            let head = (first_whole - offset) as usize;
            let whole = (last_whole - first_whole) as usize;
            if head > 0 {
                ops.push(Op::Write { coll, name: name.clone(), offset, data: data[..head].to_vec() });
            }
            let staged = self.stage(&data[head..head + whole], whole as u64 >= 16 * bs).map_err(in_op)?;
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
        self.pipe.stage(data, sequential)
    }

    /// A consistent read view of the drive. It shares its view (a RocksDB snapshot and an epoch pin) with
    /// the other readers begun since the last commit was published.
    pub fn reader(&self) -> Reader {
        Reader::shared(&self.pipe.core, &self.pipe.readers_view)
    }

    pub fn stats(&self) -> EngineStats {
        let core = &self.pipe.core;
        let mut s = crate::stats::load(core.io.counters());
        use rocksdb::statistics::Ticker;
        let opts = &self.shared.db_opts;
        s.kv_wal_bytes = opts.get_ticker_count(Ticker::WalFileBytes);
        s.kv_flush_bytes = opts.get_ticker_count(Ticker::FlushWriteBytes);
        s.kv_compaction_bytes = opts.get_ticker_count(Ticker::CompactWriteBytes);
        s.meta_cache_hits = core.meta_cache.hits.load(Ordering::Relaxed);
        s.meta_cache_misses = core.meta_cache.misses.load(Ordering::Relaxed);
        s.meta_cache_bytes = core.meta_cache.bytes() as u64;
        s.page_cache_hits = core.page_cache.hits.load(Ordering::Relaxed);
        s.page_cache_misses = core.page_cache.misses.load(Ordering::Relaxed);
        s.page_cache_bytes = core.page_cache.bytes() as u64;
        s.verified_cache_bytes = core.io.verified_bytes();
        s.page_cache_dirty_pages = core.page_cache.dirty_pages();
        s.prioritized_in_flight = core.qos.in_flight();
        s.background_waits_for_priority = core.qos.background_waits.load(Ordering::Relaxed);
        {
            let f = self.pipe.frags.lock();
            s.fragments_outstanding = f.total_count;
            s.fragment_bytes_outstanding = f.total_bytes;
        }
        let a = self.pipe.space.alloc.lock();
        s.free_blocks = a.free_blocks();
        s.total_blocks = a.total_blocks();
        s.allocated_blocks = a.limit_blocks();
        s.free_extents = a.free_extent_count() as u64;
        s
    }

    /// Used, allocated and maximum bytes of the drive's device.
    pub fn space_usage(&self) -> SpaceUsage {
        let a = self.pipe.space.alloc.lock();
        let bs = BLOCK_SIZE_BYTES;
        SpaceUsage {
            used_bytes: (a.limit_blocks() - a.free_blocks()) * bs,
            allocated_bytes: a.limit_blocks() * bs,
            capacity_bytes: a.total_blocks() * bs,
        }
    }

    /// Memory the drive's caches and buffers may hold by configuration: the KV block cache, all memtables,
    /// the metadata cache and the page cache. The process's RSS stays within this plus a constant (threads,
    /// allocator, IO buffers in flight), which the engine bench measures.
    /// With a shared `kv_memory`, the KV part is the node's (counted once however many drives share it).
    pub fn memory_budget_bytes(&self) -> u64 {
        let c = &self.pipe.cfg;
        let kv = match &self.shared.kv_memory {
            Some(m) => m.budget_bytes(),
            None => c.kv_block_cache_bytes + crate::kv::DB_WRITE_BUFFER_TOTAL_BYTES,
        };
        (kv + c.meta_cache_bytes + c.page_cache_bytes) as u64
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

    /// Runs lazy sync until no block is over its thresholds (with `all`: until no indexed fragment is
    /// left). Every merge clears its block from the index, so this ends. For benches and tests.
    pub fn sync_fragments(&self, all: bool) -> Result<u64> {
        let mut merged = 0;
        loop {
            let candidates = self.pipe.lazy_sync_candidates(256, all);
            if candidates.is_empty() {
                return Ok(merged);
            }
            merged += candidates.len() as u64;
            self.pipe.merge_now(candidates)?;
        }
    }

    /// Checks that the block map, the refs table and the allocation map agree.
    pub fn check(&self) -> Result<CheckReport> {
        crate::verify::check(&self.reader(), &self.pipe.space.alloc, &self.shared.sb)
    }

    /// Re-reads every block and fragment and verifies its checksum. `max_bytes_per_s` bounds the device
    /// read rate (None: as fast as possible).
    pub fn scrub(&self, max_bytes_per_s: Option<u64>) -> Result<ScrubReport> {
        crate::verify::scrub(&self.reader(), &self.pipe.core.io, max_bytes_per_s)
    }

    /// Whether the drive is open and accepting writes.
    pub fn is_healthy(&self) -> bool {
        self.pipe.core.io.failure().is_none() && !self.pipe.is_shut_down()
    }

    pub fn failure(&self) -> Option<String> {
        self.pipe.core.io.failure()
    }

    /// Stops accepting work, finishes queued transactions, flushes the database and joins the threads.
    pub fn close(&self) -> Result<()> {
        self.pipe.begin_shutdown();
        self.shared.scrubber.stop();
        let threads: Vec<_> = std::mem::take(&mut *self.shared.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        self.pipe.readers_view.release();
        self.pipe.core.db.flush_wal(true)?;
        Ok(())
    }

    /// Path of the drive's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

/// Hooks for the engine's own integration tests (the `testing` feature): not part of the API.
#[cfg(any(test, feature = "testing"))]
impl Engine {
    /// The block-map runs of an object as (first logical block, first physical block, blocks).
    pub fn debug_block_runs(&self, coll: CollectionId, name: &[u8]) -> Result<Vec<(u64, u64, u64)>> {
        let reader = self.reader();
        let nid = reader.lookup(coll, name)?.ok_or(EngineError::NotFound)?.nid;
        let runs = reader.runs_overlapping(nid, 0, u64::MAX)?;
        Ok(runs.into_iter().map(|(lb, r)| (lb, r.physical_start, r.len_blocks())).collect())
    }

    /// The data device under the drive.
    pub fn debug_device(&self) -> Arc<dyn Device> {
        self.pipe.core.io.device().clone()
    }
}

/// Refuses a database whose record formats this build does not know; upgrades version 1 in place.
fn check_kv_format(db: &DB) -> Result<()> {
    // Every KV record format is versioned by this one number (records without their own version byte rely
    // on it; RocksDB checksums every block and WAL record).
    let kv_format = db.get(META_FORMAT)?.and_then(|v| v.try_into().ok()).map(u32::from_be_bytes);
    match kv_format {
        Some(KV_FORMAT_VERSION) => Ok(()),
        Some(1) => {
            // Version 1 records read unchanged; mark the drive so that version-1 builds refuse it from now
            // on (they cannot read the runs this build writes).
            let mut batch = WriteBatch::default();
            batch.put(META_FORMAT, KV_FORMAT_VERSION.to_be_bytes());
            db.write_opt(batch, &sync_write())?;
            tracing::info!(from = 1, to = KV_FORMAT_VERSION, "database format upgraded");
            Ok(())
        }
        found => Err(EngineError::UnsupportedVersion { found: found.unwrap_or(0), supported: KV_FORMAT_VERSION }),
    }
}

/// Rebuilds lazy sync's fragment index from the fragment log; returns it and the highest sequence number.
fn rebuild_frag_index(db: &DB, inline_max_bytes: u64) -> Result<(FragIndex, u64)> {
    let mut frag_index = FragIndex::default();
    let mut max_seq = 0;
    let mut inline_cache: Option<(Nid, bool)> = None;
    for item in db.iterator_cf(crate::kv::cf(db, CF_FRAGS)?, rocksdb::IteratorMode::Start) {
        let (k, v) = item?;
        let (nid, lb, seq) = (u64_at(&k, 0)?, u64_at(&k, 8)?, u64_at(&k, 16)?);
        max_seq = max_seq.max(seq);
        let inline = match inline_cache {
            Some((n, i)) if n == nid => i,
            _ => {
                let i = is_inline_in_db(db, nid, inline_max_bytes)?;
                inline_cache = Some((nid, i));
                i
            }
        };
        // Fragments of objects that live wholly in the KV store are not lazy-sync work.
        if !inline {
            frag_index.apply(&FragDelta::Add(nid, lb, v.len().saturating_sub(8) as u64));
        }
    }
    Ok((frag_index, max_seq))
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
    Ok(crate::blockmap::lives_in_kv(size, has_blocks, inline_max_bytes))
}

fn kv_options(cfg: &EngineConfig, memory: Option<KvMemory>) -> crate::kv::KvOptions {
    crate::kv::KvOptions {
        block_cache_bytes: cfg.kv_block_cache_bytes,
        write_buffer_bytes: cfg.kv_write_buffer_bytes,
        memory,
    }
}

/// The flusher, the committer, the background worker and (with a rate) the scrub.
fn start_threads(pipe: &Arc<Pipeline>, scrubber: &Arc<Scrubber>, cfg: &EngineConfig) -> Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(name.into()).spawn(f);
    let p = pipe.clone();
    threads.push(spawn("mosaic-flush", Box::new(move || crate::commit::flusher(p)))?);
    let p = pipe.clone();
    // The committer writes and reads blocks while it plans a group: in the pipeline's share, which never
    // waits behind a microstore's IO (every microstore's commits wait on it).
    let committer = move || mosaic_store::on_thread_with_share(mosaic_store::PIPELINE, || crate::commit::committer(p));
    threads.push(spawn("mosaic-commit", Box::new(committer))?);
    let p = pipe.clone();
    threads.push(spawn("mosaic-bg", Box::new(move || crate::commit::background(p)))?);
    let (rate, interval) = (cfg.scrub_bytes_per_s, cfg.scrub_pass_interval);
    if rate > 0 {
        let (core, s) = (pipe.core.clone(), scrubber.clone());
        threads.push(spawn("mosaic-scrub", Box::new(move || crate::scrubber::run(core, s, rate, interval)))?);
    }
    Ok(threads)
}
