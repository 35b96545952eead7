//! The commit pipeline (group commit) and the background work that feeds it (lazy sync, deferred frees).
//!
//! Transactions wait in one queue per priority class. Those that staged data (whole blocks written before
//! the commit) are the flusher thread's: it takes a group of them (highest class first, at most one
//! background transaction while foreground work waits) and makes their data durable with one device
//! flush. The committer thread takes that group, or, while none is ready, the queued transactions without
//! staged data (they need no device flush, so they never pass through the flusher: a small write wakes one
//! thread, not two), adds those to a flushed group too, plans the group (`plan.rs`) and writes its batch
//! with one synchronous WAL write. The device flush of one group overlaps the commit of the one before.

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
use std::time::{Duration, Instant};

/// Most operations in one transaction (a transaction is planned and held in memory whole).
pub const MAX_TXN_OPS: usize = 1 << 16;
/// Blocks lazy sync merges per step.
const LAZY_SYNC_STEP_BLOCKS: usize = 64;
/// How often the background thread looks for work when nothing wakes it.
const BACKGROUND_TICK: std::time::Duration = std::time::Duration::from_millis(50);

pub(crate) struct Pending {
    txn: Transaction,
    /// The transaction references staged data (`Transaction::has_staged_data`): the flusher's to take.
    staged: bool,
    /// Queued in a foreground class: work a client waits for (only such work is gathered, `Gather`).
    foreground: bool,
    reply: mpsc::SyncSender<Result<Outcome>>,
}

/// The transactions of `group` a client waits for.
fn foreground_len(group: &[Pending]) -> usize {
    group.iter().filter(|p| p.foreground).count()
}

#[derive(Default)]
struct Queues {
    classes: PerClass<VecDeque<Pending>>,
    /// Transactions in all classes.
    len: usize,
    /// Of those, the transactions with staged data (the rest are the committer's to take).
    staged: usize,
    /// A group whose staged data the flusher made durable, for the committer: at most one, so the flusher
    /// flushes one group ahead of the commits and no more.
    flushed: Option<Vec<Pending>>,
    /// The flusher stopped (shutdown): nothing more comes to `flushed`.
    flusher_done: bool,
    /// The committer stopped: a group flushed from now on has nobody to commit it.
    committer_done: bool,
    shutdown: bool,
}

impl Queues {
    /// The queue lengths add up to `len`, and `staged` counts the transactions with staged data (checked on
    /// entry and exit of every change).
    fn check(&self) {
        debug_assert_eq!(self.classes.iter().map(|(_, q)| q.len()).sum::<usize>(), self.len, "queue length");
        debug_assert_eq!(
            self.classes.iter().map(|(_, q)| q.iter().filter(|p| p.staged).count()).sum::<usize>(),
            self.staged,
            "staged transactions queued"
        );
        debug_assert!(self.staged <= self.len);
    }

    /// Moves up to `max` transactions of `class` whose `staged` mark is `staged` into `group`, oldest first.
    fn take(
        &mut self,
        class: Priority,
        staged: bool,
        group: &mut Vec<Pending>,
        max: usize,
        c: &crate::stats::Counters,
    ) {
        let queue = &mut self.classes[class];
        let mut i = 0;
        while i < queue.len() && group.len() < max {
            if queue[i].staged != staged {
                i += 1;
                continue;
            }
            group.push(queue.remove(i).expect("index in range"));
            c.queue_depth[class].fetch_sub(1, Ordering::Relaxed);
            self.len -= 1;
            if staged {
                self.staged -= 1;
            }
        }
    }

    /// The committer's share of `take_group`: queued transactions without staged data join `group`, up to
    /// `max`.
    fn join_unstaged(&mut self, group: &mut Vec<Pending>, max: usize, c: &crate::stats::Counters) {
        if group.len() < max && self.len > self.staged {
            let before = group.len();
            self.take_group(false, group, max, c);
            debug_assert!(group[before..].iter().all(|p| !p.staged), "the committer takes no unflushed data");
        }
    }

    /// Moves queued transactions of one kind into `group`: the foreground classes first, highest first, up
    /// to `max`; then background work, which fills the group only when nothing else is in it (an empty
    /// group that no foreground work joined) and gets at most one slot otherwise: a group the flusher made
    /// durable, which the committer extends, may hold foreground work that background work must not delay.
    fn take_group(&mut self, staged: bool, group: &mut Vec<Pending>, max: usize, c: &crate::stats::Counters) {
        for class in Priority::FOREGROUND {
            self.take(class, staged, group, max, c);
        }
        let bg_slots = if group.is_empty() { max } else { group.len() + 1 };
        self.take(Priority::Background, staged, group, bg_slots.min(max + 1), c);
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
    /// Wakes the flusher: a transaction with staged data queued, the flushed group taken, shutdown.
    flusher_wake: Condvar,
    /// Wakes the committer: a transaction without staged data queued, a group flushed, the flusher done.
    committer_wake: Condvar,
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
            flusher_wake: Condvar::new(),
            committer_wake: Condvar::new(),
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
        let staged = txn.has_staged_data();
        {
            let mut q = self.queues.lock();
            q.check();
            while q.len >= self.cfg.queue_max_txns && !q.shutdown {
                self.queue_not_full.wait(&mut q);
            }
            if q.shutdown {
                return Err(EngineError::ShuttingDown);
            }
            let foreground = class != Priority::Background;
            q.classes[class].push_back(Pending { txn, staged, foreground, reply: tx });
            q.len += 1;
            q.staged += usize::from(staged);
            assert!(q.len <= self.cfg.queue_max_txns, "the queue stays within its limit");
            self.core.io.counters().queue_depth[class].fetch_add(1, Ordering::Relaxed);
            q.check();
        }
        if staged {
            self.flusher_wake.notify_one();
        } else {
            self.committer_wake.notify_one();
        }
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
        self.flusher_wake.notify_all();
        self.committer_wake.notify_all();
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

    /// The flusher's next group: queued transactions with staged data (see `Queues::take_group`). None once
    /// shutdown began and none is left.
    fn take_staged_group(&self) -> Option<Vec<Pending>> {
        let mut q = self.queues.lock();
        while q.staged == 0 {
            if q.shutdown {
                return None;
            }
            self.flusher_wake.wait(&mut q);
        }
        q.check();
        let max = self.cfg.group_max_txns;
        let mut group = Vec::new();
        q.take_group(true, &mut group, max, self.core.io.counters());
        q.check();
        drop(q);
        assert!(!group.is_empty() && group.len() <= max + 1, "a group holds 1 to {} transactions", max + 1);
        debug_assert!(group.iter().all(|p| p.staged), "the flusher takes transactions with staged data only");
        self.queue_not_full.notify_all();
        Some(group)
    }

    /// Gives the committer a group the flusher made durable, once it took the one before. Gives the group
    /// back when the committer has stopped.
    fn hand_to_committer(&self, group: Vec<Pending>) -> std::result::Result<(), Vec<Pending>> {
        let mut q = self.queues.lock();
        while q.flushed.is_some() && !q.committer_done {
            self.flusher_wake.wait(&mut q);
        }
        if q.committer_done {
            return Err(group);
        }
        q.flushed = Some(group);
        drop(q);
        self.committer_wake.notify_one();
        Ok(())
    }

    /// The committer's next group: the group the flusher made durable, joined by queued transactions
    /// without staged data up to the group limit; while none is flushed, those transactions alone. None once
    /// the flusher is done and nothing is left.
    fn take_commit_group(&self, gather: &mut Gather) -> Option<Vec<Pending>> {
        let max = self.cfg.group_max_txns;
        let mut q = self.queues.lock();
        loop {
            q.check();
            let flushed = q.flushed.take();
            let had_flushed = flushed.is_some();
            let mut group = flushed.unwrap_or_default();
            q.join_unstaged(&mut group, max, self.core.io.counters());
            q.check();
            let waiting = foreground_len(&group);
            if waiting > 0 && !had_flushed && waiting < gather.target() {
                self.queue_not_full.notify_all();
                self.gather(&mut q, &mut group, gather);
                q.check();
            }
            if !group.is_empty() {
                gather.record(foreground_len(&group));
                drop(q);
                if had_flushed {
                    self.flusher_wake.notify_one();
                }
                self.queue_not_full.notify_all();
                assert!(group.len() <= max + 1, "a group holds at most {} transactions", max + 1);
                return Some(group);
            }
            if q.flusher_done {
                return None;
            }
            self.committer_wake.wait(&mut q);
        }
    }

    /// Holds `group` (foreground transactions without staged data) for up to the gathering window while
    /// more join it, until it reaches the gathering target; stops early for a flushed group (whose
    /// transactions wait already) and at shutdown.
    fn gather(&self, q: &mut parking_lot::MutexGuard<'_, Queues>, group: &mut Vec<Pending>, gather: &Gather) {
        let (target, before) = (gather.target(), group.len());
        debug_assert!((1..target).contains(&foreground_len(group)), "held only while short of the target");
        let max = self.cfg.group_max_txns;
        let deadline = Instant::now() + gather.window;
        while foreground_len(group) < target && q.flushed.is_none() && !self.is_shut_down() {
            let timed_out = self.committer_wake.wait_until(q, deadline).timed_out();
            q.join_unstaged(group, max, self.core.io.counters());
            if timed_out {
                break;
            }
        }
        self.core.io.counters().groups_gathered.fetch_add(1, Ordering::Relaxed);
        debug_assert!(group.len() >= before && group.len() <= max + 1, "gathering only adds to a group");
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
        // Objects this group destroys (their onode deleted): their onode and attributes leave the cache
        // instead of staying as deletions, since no reader that starts later asks for a dead nid (a reset
        // of every overwrite makes one), and those entries would push out live ones. Sorted: overlay order.
        let destroyed: Vec<&[u8]> =
            group_ov.changes(CF_ONODES).filter(|(_, v)| v.is_none()).map(|(k, _)| k.as_slice()).collect();
        debug_assert!(destroyed.is_sorted(), "the overlay's keys come in order");
        for cf in [CF_NAMES, CF_ONODES, CF_ATTRS] {
            for (k, v) in group_ov.changes(cf) {
                let dead_nid = cf != CF_NAMES
                    && v.is_none()
                    && k.len() >= NID_KEY_BYTES
                    && destroyed.binary_search(&&k[..NID_KEY_BYTES]).is_ok();
                if dead_nid {
                    core.meta_cache.forget(cf, k);
                } else {
                    core.meta_cache.install(cf, k, v.as_deref());
                }
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

/// First stage of the commit pipeline: takes the next group of transactions with staged data and makes
/// that data durable (one device flush), then hands the group to the committer. While the committer writes
/// group n's batch and syncs the WAL, this stage flushes group n+1's data, so the two syncs overlap
/// instead of adding up.
pub(crate) fn flusher(pipe: Arc<Pipeline>) {
    while let Some(group) = pipe.take_staged_group() {
        if let Err(e) = pipe.core.io.flush() {
            for p in group {
                let _ = p.reply.send(Err(EngineError::ReadOnly(format!("device flush failed: {e}"))));
            }
            continue;
        }
        // A committer that stopped drops the group: its writers learn that the engine shut down.
        if pipe.hand_to_committer(group).is_err() {
            break;
        }
    }
    pipe.queues.lock().flusher_done = true;
    pipe.committer_wake.notify_all();
}

/// Second stage: commits each group with one synchronous KV batch (see `take_commit_group`). Transactions
/// that need no device flush join the group here, so small writes are grouped as before pipelining
/// (measured: without this, groups of 2 KiB writes halved in size and throughput fell from 37 to 21 MiB/s).
pub(crate) fn committer(pipe: Arc<Pipeline>) {
    // However the committer ends, the flusher must not wait for it to take a group.
    struct Done<'a>(&'a Pipeline);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.queues.lock().committer_done = true;
            self.0.flusher_wake.notify_all();
        }
    }
    let _done = Done(&pipe);
    let mut gather = Gather::new(pipe.cfg.commit_gather);
    while let Some(group) = pipe.take_commit_group(&mut gather) {
        pipe.commit_group(group);
        let pressure = pipe.frags.lock().total_bytes > pipe.cfg.frag_budget_bytes;
        if pressure {
            let (m, c) = &pipe.bg_wake;
            *m.lock() = true;
            c.notify_one();
        }
    }
}

/// Most transactions a group is held for (`Gather`): measured on a 4+2 set under 16 clients' 4 KiB PUTs,
/// holding groups of fewer for up to 2 ms took the server's CPU per PUT to 0.89x on average
/// (docs/bench/2026-12-07-commit-gather.md).
const GATHER_TARGET_MAX_TXNS: usize = 4;
/// Groups per period of `Gather`'s memory of group sizes.
const GATHER_PERIOD_GROUPS: u32 = 32;

/// Group commit's gathering: PostgreSQL's `commit_delay`, sized by the groups that have been forming.
/// Every group costs a synchronous WAL write (a device flush) and wakes its waiters, so a loaded drive
/// that commits groups of one or two spends most of its committer's CPU there (a 4+2 set under 16
/// clients' 4 KiB PUTs: 3.5 fdatasync and 36 context switches per PUT over its six drives). The committer
/// holds a short group for up to `window` while more transactions join, up to the largest group of the
/// last one to two periods (at most GATHER_TARGET_MAX_TXNS). A lone client's transactions come one after
/// another (each waits for the one before), so its groups are of one and it is never held; two clients
/// are held for each other, not for a third. A held group ends early for a flushed group and shutdown.
pub(crate) struct Gather {
    window: Duration,
    /// Largest group of the current period, and of the period before.
    max_now: usize,
    max_before: usize,
    /// Groups committed in the current period.
    groups: u32,
}

impl Gather {
    pub(crate) fn new(window: Duration) -> Self {
        Gather { window, max_now: 0, max_before: 0, groups: 0 }
    }

    /// The size a short group is held to: 0 (never held) when gathering is off.
    fn target(&self) -> usize {
        if self.window.is_zero() {
            return 0;
        }
        self.max_now.max(self.max_before).min(GATHER_TARGET_MAX_TXNS)
    }

    /// Notes a group about to be committed, by its foreground transactions (background work never
    /// holds a client's write).
    fn record(&mut self, foreground_txns: usize) {
        self.max_now = self.max_now.max(foreground_txns);
        self.groups += 1;
        if self.groups >= GATHER_PERIOD_GROUPS {
            (self.max_before, self.max_now, self.groups) = (self.max_now, 0, 0);
        }
        debug_assert!(self.groups < GATHER_PERIOD_GROUPS);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Gathering holds a group only up to the size groups have reached in the last one to two periods,
    /// at most GATHER_TARGET_MAX_TXNS, and never with a zero window.
    #[test]
    fn gathering_targets_the_recent_largest_group_and_forgets_it() {
        let mut g = Gather::new(Duration::from_millis(2));
        assert_eq!(g.target(), 0, "nothing formed yet: no group is held");
        // A large group as the first of a period is remembered through the rest of it and the whole next
        // one, and bounded.
        g.record(GATHER_TARGET_MAX_TXNS + 5);
        assert_eq!(g.target(), GATHER_TARGET_MAX_TXNS, "bounded");
        for _ in 0..2 * GATHER_PERIOD_GROUPS - 2 {
            g.record(1);
        }
        assert_eq!(g.target(), GATHER_TARGET_MAX_TXNS);
        g.record(1);
        assert_eq!(g.target(), 1, "forgotten: a lone client's groups of one are never short of the target");
        g.record(3);
        assert_eq!(g.target(), 3);
        let mut lone = Gather::new(Duration::from_millis(2));
        for _ in 0..3 * GATHER_PERIOD_GROUPS {
            lone.record(1);
            lone.record(0);
            assert!(lone.target() <= 1, "background-only groups change nothing");
        }
        let mut off = Gather::new(Duration::ZERO);
        off.record(GATHER_TARGET_MAX_TXNS);
        assert_eq!(off.target(), 0, "a zero window never holds");
    }

    /// Queues `n` transactions without staged data in `class`; their replies are dropped.
    fn queue(q: &mut Queues, class: Priority, n: usize, c: &crate::stats::Counters) {
        for _ in 0..n {
            let (reply, _) = mpsc::sync_channel(1);
            let foreground = class != Priority::Background;
            q.classes[class].push_back(Pending { txn: Transaction::new(), staged: false, foreground, reply });
            q.len += 1;
            c.queue_depth[class].fetch_add(1, Ordering::Relaxed);
        }
        q.check();
    }

    /// Background work fills only a group nothing else is in; a group that holds work (foreground work the
    /// flusher made durable, or foreground work taken now) gives it one slot.
    #[test]
    fn background_work_gets_one_slot_in_a_group_that_holds_work() {
        let c = crate::stats::Counters::default();
        let mut q = Queues::default();
        queue(&mut q, Priority::Background, 6, &c);
        let mut group = Vec::new();
        q.take_group(false, &mut group, 4, &c);
        assert_eq!(group.len(), 4, "an empty group: background work fills it");

        // A group the flusher made durable, extended by the committer with no foreground work queued.
        let mut flushed = Vec::new();
        queue(&mut q, Priority::Foreground, 1, &c);
        q.take(Priority::Foreground, false, &mut flushed, 1, &c);
        q.take_group(false, &mut flushed, 4, &c);
        assert_eq!(flushed.len(), 2, "one background slot beside the flushed foreground work");

        queue(&mut q, Priority::ForegroundHigh, 2, &c);
        let mut group = Vec::new();
        q.take_group(false, &mut group, 4, &c);
        assert_eq!(group.len(), 2 + 1, "two foreground, one background");
        assert_eq!(q.len, 0);
        q.check();
    }
}
