//! The commit pipeline (group commit) and the background work that feeds it (lazy sync, deferred frees).
//!
//! Transactions wait in one queue per priority class. A flusher thread takes a group (highest class
//! first, at most one background transaction while foreground work waits) and makes the data it staged
//! durable with one device flush; the committer thread plans the group (`plan.rs`) and writes its batch
//! with one synchronous WAL write, so the two syncs of consecutive groups overlap. Queued transactions
//! without staged data join the group the committer takes: they need no device flush.

use crate::alloc::{Extent, Placement};
use crate::config::EngineConfig;
use crate::core::Core;
use crate::error::{EngineError, Result};
use crate::frag_index::{FragDelta, FragIndex};
use crate::keys::*;
use crate::overlay::{Overlay, View};
use crate::plan::{FragAdds, Ids, PlanCtx, Planner, TxnState};
use crate::qos::{PerClass, Priority};
use crate::reader::Reader;
use crate::space::Space;
use crate::superblock::BLOCK_SIZE_BYTES;
use crate::txn::{MergedBlock, Op, Outcome, Staged, Transaction};
use parking_lot::{Condvar, Mutex};
use rocksdb::{WriteBatch, WriteOptions};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Most operations in one transaction (a transaction is planned and held in memory whole).
pub const MAX_TXN_OPS: usize = 1 << 16;
/// Blocks lazy sync merges per step.
const LAZY_SYNC_STEP_BLOCKS: usize = 64;
/// How often the background thread looks for work when nothing wakes it.
const BACKGROUND_TICK: std::time::Duration = std::time::Duration::from_millis(50);

pub(crate) struct Pending {
    txn: Transaction,
    reply: mpsc::SyncSender<Result<Outcome>>,
}

#[derive(Default)]
struct Queues {
    classes: PerClass<VecDeque<Pending>>,
    /// Transactions in all classes.
    len: usize,
    shutdown: bool,
}

impl Queues {
    /// The queue lengths add up to `len` (checked on entry and exit of every change).
    fn check(&self) {
        debug_assert_eq!(self.classes.iter().map(|(_, q)| q.len()).sum::<usize>(), self.len, "queue length");
    }
}

/// The write side of a drive: queues, the space, ids, lazy sync's fragment index, deferred frees.
pub(crate) struct Pipeline {
    pub(crate) core: Arc<Core>,
    pub(crate) cfg: EngineConfig,
    pub(crate) space: Space,
    pub(crate) ids: Ids,
    pub(crate) frags: Mutex<FragIndex>,
    /// Extents freed by a committed group, waiting for older readers to finish.
    deferred_free: Mutex<Vec<(u64, Extent)>>,
    queues: Mutex<Queues>,
    queue_not_empty: Condvar,
    queue_not_full: Condvar,
    shutdown: AtomicBool,
    /// Wakes the background worker early (shutdown, fragment pressure).
    bg_wake: (Mutex<bool>, Condvar),
    /// The view clients' readers share until the next epoch is published (`Engine::reader`).
    pub(crate) readers_view: crate::reader::SharedView,
}

pub(crate) fn sync_write() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

impl Pipeline {
    pub(crate) fn new(core: Arc<Core>, cfg: EngineConfig, space: Space, ids: Ids, frags: FragIndex) -> Self {
        Pipeline {
            core,
            cfg,
            space,
            ids,
            frags: Mutex::new(frags),
            deferred_free: Mutex::new(Vec::new()),
            queues: Mutex::new(Queues::default()),
            queue_not_empty: Condvar::new(),
            queue_not_full: Condvar::new(),
            shutdown: AtomicBool::new(false),
            bg_wake: (Mutex::new(false), Condvar::new()),
            readers_view: Default::default(),
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if let Some(why) = self.core.io.failure() {
            return Err(EngineError::ReadOnly(why));
        }
        if self.shutdown.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Queues a prepared transaction in its class and waits until it is durable (or failed).
    pub(crate) fn submit(&self, txn: Transaction, class: Priority) -> Result<Outcome> {
        if txn.ops.len() > MAX_TXN_OPS {
            return Err(EngineError::Limit(format!("a transaction holds at most {MAX_TXN_OPS} operations")));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        {
            let mut q = self.queues.lock();
            q.check();
            while q.len >= self.cfg.queue_max_txns && !q.shutdown {
                self.queue_not_full.wait(&mut q);
            }
            if q.shutdown {
                return Err(EngineError::ShuttingDown);
            }
            q.classes[class].push_back(Pending { txn, reply: tx });
            q.len += 1;
            assert!(q.len <= self.cfg.queue_max_txns, "the queue stays within its limit");
            self.core.io.counters().queue_depth[class].fetch_add(1, Ordering::Relaxed);
            q.check();
        }
        self.queue_not_empty.notify_one();
        rx.recv().map_err(|_| EngineError::ShuttingDown)?
    }

    /// Writes whole blocks of `data` (a multiple of the block size) to fresh device blocks, for a later
    /// `Op::WriteStaged`. Runs on the caller's thread, so many writers stream data in parallel.
    pub(crate) fn stage(&self, data: &[u8], sequential: bool) -> Result<Staged> {
        self.check_writable()?;
        let bs = BLOCK_SIZE_BYTES as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(EngineError::InvalidArgument("staged data must be whole blocks".into()));
        }
        let blocks = (data.len() / bs) as u64;
        let placement = if sequential || blocks >= 16 { Placement::Large } else { Placement::Cold };
        let extents = self.space.allocate(&self.core.io, blocks, placement)?;
        let crcs = data.chunks_exact(bs).map(crate::checksum::crc32c).collect();
        // On error `staged` drops and its blocks go back to the allocator.
        let staged = Staged::new(extents, crcs, data.len() as u64, self.space.alloc.clone());
        let mut done = 0usize;
        for e in staged.extents.clone() {
            let len = (e.len * BLOCK_SIZE_BYTES) as usize;
            self.core.io.write_blocks(e.start, &data[done..done + len])?;
            done += len;
        }
        Ok(staged)
    }

    /// Stops accepting work and wakes every thread so that it can finish.
    pub(crate) fn begin_shutdown(&self) {
        {
            let mut q = self.queues.lock();
            q.shutdown = true;
        }
        self.shutdown.store(true, Ordering::SeqCst);
        self.queue_not_empty.notify_all();
        self.queue_not_full.notify_all();
        let (m, c) = &self.bg_wake;
        *m.lock() = true;
        c.notify_all();
    }

    /// Blocks of objects over lazy sync's thresholds (with `all`: every indexed block), at most `max`.
    pub(crate) fn lazy_sync_candidates(&self, max: usize, all: bool) -> Vec<(Nid, u64)> {
        let f = self.frags.lock();
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

    /// Lazy sync of some blocks with the heavy work outside the committer: merge from a snapshot, write
    /// all merged blocks in one staged IO, then commit a transaction that installs each one whose base and
    /// fragments are unchanged. Blocks with nothing to merge go through `MergeBlock`, which clears them
    /// from the fragment index.
    pub(crate) fn merge_now(&self, candidates: Vec<(Nid, u64)>) -> Result<()> {
        let reader = Reader::new(self.core.clone());
        let mut data = Vec::new();
        let mut merged = Vec::new();
        let mut txn = Transaction::new().with_priority(Priority::Background);
        for (nid, lb) in candidates {
            match reader.merge_input(nid, lb, self.cfg.inline_max_bytes) {
                Ok(Some(m)) => {
                    let crc32c = crate::checksum::crc32c(&m.content);
                    data.extend_from_slice(&m.content);
                    merged.push(MergedBlock { nid, lblock: lb, crc32c, expected_base: m.base, frag_keys: m.frag_keys });
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
            let extents = self.space.allocate(&self.core.io, merged.len() as u64, Placement::Hot)?;
            let crcs = merged.iter().map(|m| m.crc32c).collect();
            let staged = Staged::new(extents, crcs, data.len() as u64, self.space.alloc.clone());
            let mut done = 0usize;
            for e in staged.extents.clone() {
                let len = (e.len * BLOCK_SIZE_BYTES) as usize;
                self.core.io.write_blocks(e.start, &data[done..done + len])?;
                done += len;
            }
            txn.push(Op::InstallMerged { staged, blocks: merged });
        }
        if txn.ops.is_empty() {
            return Ok(());
        }
        self.submit(txn, Priority::Background).map(|_| ())
    }

    /// Moves deferred frees whose epoch no active reader can still see into the allocator.
    fn release_deferred(&self) {
        let oldest_reader = self.core.epochs.oldest_pinned().unwrap_or(u64::MAX);
        let ready: Vec<Extent> = {
            let mut d = self.deferred_free.lock();
            let (ready, wait): (Vec<_>, Vec<_>) = d.drain(..).partition(|(e, _)| *e <= oldest_reader);
            *d = wait;
            ready.into_iter().map(|(_, x)| x).collect()
        };
        if ready.is_empty() {
            return;
        }
        // Before any block can be written again: nothing of it may stay kept as verified (verified.rs).
        for e in &ready {
            self.core.io.forget_verified(e.start, e.len);
        }
        if self.cfg.discard {
            let device = self.core.io.device();
            for e in &ready {
                if device.discard(e.start * BLOCK_SIZE_BYTES, e.len * BLOCK_SIZE_BYTES).is_ok() {
                    self.core.io.counters().discarded_blocks.fetch_add(e.len, Ordering::Relaxed);
                }
            }
        }
        self.space.release(ready);
    }

    fn take_from(&self, q: &mut Queues, class: Priority, group: &mut Vec<Pending>, max: usize) {
        while group.len() < max {
            match q.classes[class].pop_front() {
                Some(p) => {
                    self.core.io.counters().queue_depth[class].fetch_sub(1, Ordering::Relaxed);
                    q.len -= 1;
                    group.push(p);
                }
                None => break,
            }
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
        q.check();
        let max = self.cfg.group_max_txns;
        let mut group = Vec::new();
        // Highest class first; background work gets at most one slot per group while foreground waits.
        for class in Priority::FOREGROUND {
            self.take_from(&mut q, class, &mut group, max);
        }
        let bg_slots = if group.is_empty() { max } else { group.len() + 1 };
        self.take_from(&mut q, Priority::Background, &mut group, bg_slots.min(max + 1));
        q.check();
        drop(q);
        assert!(!group.is_empty() && group.len() <= max + 1, "a group holds 1 to {} transactions", max + 1);
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
        q.check();
        let mut taken = 0;
        for class in Priority::FOREGROUND {
            let queue = &mut q.classes[class];
            let mut i = 0;
            while i < queue.len() && group.len() < max {
                if queue[i].txn.has_staged_data() {
                    i += 1;
                    continue;
                }
                group.push(queue.remove(i).expect("index in range"));
                self.core.io.counters().queue_depth[class].fetch_sub(1, Ordering::Relaxed);
                taken += 1;
            }
        }
        q.len -= taken;
        q.check();
        drop(q);
        if taken > 0 {
            self.queue_not_full.notify_all();
        }
    }

    fn commit_group(&self, group: Vec<Pending>) {
        let core = &self.core;
        let ctx = PlanCtx { cfg: &self.cfg, io: &core.io, space: &self.space, ids: &self.ids, frags: &self.frags };
        let mut group_ov = Overlay::default();
        let mut results: Vec<(mpsc::SyncSender<Result<Outcome>>, Result<Outcome>)> = Vec::new();
        let mut marks: Vec<(Extent, bool)> = Vec::new();
        let mut frees: Vec<Extent> = Vec::new();
        let mut deltas: Vec<FragDelta> = Vec::new();
        let mut group_frag_adds = FragAdds::default();
        let mut page_changes: Vec<crate::page_cache::PageChange> = Vec::new();
        let mut needs_flush = false;
        let mut user_bytes = 0;
        let published = core.epochs.published();
        for p in group {
            let mut ts = TxnState::default();
            let mut view = View::with_cache(&core.db, &group_ov, &core.meta_cache, published);
            let planner = Planner { ctx: &ctx, view: &mut view, ts: &mut ts, group_frag_adds: &group_frag_adds };
            let r = planner.plan(p.txn);
            let top = std::mem::take(&mut view.top);
            drop(view);
            match r {
                Ok(outcome) => {
                    group_ov.absorb(top);
                    marks.append(&mut ts.marks);
                    frees.append(&mut ts.frees);
                    deltas.append(&mut ts.frag_deltas);
                    page_changes.append(&mut ts.page_changes);
                    for (k, n) in ts.frag_adds.drain() {
                        *group_frag_adds.entry(k).or_default() += n;
                    }
                    needs_flush |= ts.device_written;
                    user_bytes += ts.user_bytes;
                    for s in ts.staged.iter_mut() {
                        s.mark_referenced();
                    }
                    results.push((p.reply, Ok(outcome)));
                }
                Err(e) => {
                    // Nothing of a failed transaction is referenced: give its fresh blocks back now. Its
                    // staged blocks go back when `ts` drops.
                    self.space.release(ts.fresh.drain(..));
                    results.push((p.reply, Err(e)));
                }
            }
        }
        let committed = self.make_durable(group_ov, &marks, &page_changes, needs_flush);
        match committed {
            Ok(()) => {
                let epoch = core.epochs.publish_next();
                assert_eq!(epoch, published + 1, "one group commits at a time");
                // Readers from now on take a view of this epoch; the kept one must not pin the last.
                self.readers_view.release();
                self.deferred_free.lock().extend(frees.into_iter().map(|e| (epoch, e)));
                {
                    let mut f = self.frags.lock();
                    for d in &deltas {
                        f.apply(d);
                    }
                }
                self.release_deferred();
                let c = core.io.counters();
                let ok = results.iter().filter(|r| r.1.is_ok()).count() as u64;
                c.transactions_committed.fetch_add(ok, Ordering::Relaxed);
                c.groups_committed.fetch_add(1, Ordering::Relaxed);
                c.user_bytes_written.fetch_add(user_bytes, Ordering::Relaxed);
                for (reply, r) in results {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                // Values installed for this group never became durable.
                core.meta_cache.clear();
                core.page_cache.clear();
                core.io.fail(format!("commit failed: {e}"));
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
        let core = &self.core;
        if needs_flush {
            core.io.flush()?;
        }
        // Names, onodes and attributes of this group go into the metadata cache before its batch is written
        // (see meta_cache.rs); readers use them only once the group's epoch is published. Every change of
        // these column families is a point change in the overlay (no range deletes), so none is missed.
        let epoch = core.epochs.published() + 1;
        core.meta_cache.begin_install(epoch);
        for cf in [CF_NAMES, CF_ONODES, CF_ATTRS] {
            for (k, v) in group_ov.changes(cf) {
                core.meta_cache.install(cf, k, v.clone());
            }
        }
        // Pages the same way (page_cache.rs).
        core.page_cache.apply(page_changes, epoch);
        let mut batch = WriteBatch::default();
        group_ov.into_batch(&core.db, &mut batch)?;
        {
            let mut a = self.space.alloc.lock();
            for (e, used) in marks {
                a.mark(*e, *used);
            }
            let acf = crate::kv::cf(&core.db, CF_ALLOC)?;
            for (g, raw) in a.take_dirty_groups() {
                batch.put_cf(acf, g.to_be_bytes(), raw);
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        core.db.write_opt(batch, &sync_write())?;
        Ok(())
    }
}

/// First stage of the commit pipeline: takes the next group and makes the data its transactions staged
/// durable (one device flush), then hands it to the committer. While the committer writes group n's batch
/// and syncs the WAL, this stage flushes group n+1's data, so the two syncs overlap instead of adding up.
pub(crate) fn flusher(pipe: Arc<Pipeline>, to_committer: mpsc::SyncSender<Vec<Pending>>) {
    while let Some(group) = pipe.take_group() {
        if group.iter().any(|p| p.txn.has_staged_data())
            && let Err(e) = pipe.core.io.flush()
        {
            for p in group {
                let _ = p.reply.send(Err(EngineError::ReadOnly(format!("device flush failed: {e}"))));
            }
            continue;
        }
        if to_committer.send(group).is_err() {
            return;
        }
    }
}

/// The channel between the two stages: one group may wait while the committer syncs the previous one.
pub(crate) fn stage_channel() -> (mpsc::SyncSender<Vec<Pending>>, mpsc::Receiver<Vec<Pending>>) {
    mpsc::sync_channel(1)
}

/// Second stage: plans each flushed group and commits it with one synchronous KV batch. Transactions that
/// arrived while the previous batch was syncing and need no device flush join the group here, so small
/// writes are grouped as before pipelining (measured: without this, groups of 2 KiB writes halved in size
/// and throughput fell from 37 to 21 MiB/s).
pub(crate) fn committer(pipe: Arc<Pipeline>, from_flusher: mpsc::Receiver<Vec<Pending>>) {
    while let Ok(mut group) = from_flusher.recv() {
        pipe.take_unflushed(&mut group);
        pipe.commit_group(group);
        let pressure = pipe.frags.lock().total_bytes > pipe.cfg.frag_budget_bytes;
        if pressure {
            let (m, c) = &pipe.bg_wake;
            *m.lock() = true;
            c.notify_one();
        }
    }
}

/// Background work at the lowest priority: lazy sync and deferred frees. It yields whenever foreground
/// transactions are queued.
pub(crate) fn background(pipe: Arc<Pipeline>) {
    loop {
        {
            let (m, c) = &pipe.bg_wake;
            let mut woken = m.lock();
            if !*woken {
                c.wait_for(&mut woken, BACKGROUND_TICK);
            }
            *woken = false;
        }
        if pipe.is_shut_down() {
            return;
        }
        pipe.release_deferred();
        if !pipe.cfg.lazy_sync || pipe.core.io.failure().is_some() {
            continue;
        }
        // Merge while blocks are over their thresholds. Reads and writes happen here, not in the
        // committer; the committer bounds this work's share (one background transaction per group while
        // foreground transactions wait). Merging soon also lets the memtable flush drop the fragments.
        loop {
            pipe.core.qos.yield_to_prioritized(crate::qos::BACKGROUND_WAIT_MAX);
            let candidates = pipe.lazy_sync_candidates(LAZY_SYNC_STEP_BLOCKS, false);
            if candidates.is_empty() || pipe.is_shut_down() {
                break;
            }
            if let Err(e) = pipe.merge_now(candidates) {
                if !matches!(e, EngineError::ShuttingDown) {
                    tracing::warn!(error = %e, "lazy sync failed");
                }
                break;
            }
        }
    }
}
