//! The background scrub: walks the block map in small steps at a bounded rate, re-reads every block from
//! the device (never the page cache) and checks its crc32c, and starts over when it reaches the end. Each
//! step works on a fresh snapshot, so the walk never holds back the reuse of freed blocks. While foreground
//! work runs (transactions waiting or committed, object reads since the last step) a step is 16 blocks
//! instead of 256 and is followed by the pause of a full step: the scrub then reads at 1/16 of its rate.
//!
//! A new pass starts no sooner than `EngineConfig::scrub_pass_interval` after the previous one started, so
//! an empty or unchanged drive is not walked again and again (an idle server stays idle).
//!
//! Findings are kept per pass (at most `DAMAGED_LISTED_MAX`); `mosaic admin scrub` still runs a full
//! scrub on demand. The position is not persisted: a restart begins a new pass.

use crate::core::Core;
use crate::error::Result;
use crate::keys::*;
use crate::qos::Priority;
use crate::reader::Reader;
use crate::superblock::BLOCK_SIZE_BYTES;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Blocks verified per step while nothing else waits.
const STEP_BLOCKS: usize = 256;
/// Blocks per step while foreground transactions wait.
const BUSY_STEP_BLOCKS: usize = 16;
/// Damaged objects remembered per pass.
pub const DAMAGED_LISTED_MAX: usize = 1000;

/// What the background scrub has found so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubStatus {
    /// Whole passes over the block map finished since the drive was opened.
    pub passes_completed: u64,
    /// Blocks verified since the drive was opened.
    pub blocks_checked: u64,
    /// Damaged objects of the last finished pass: (nid, what is wrong), by nid.
    pub damaged: Vec<(Nid, String)>,
    /// Passes begun since the drive was opened (at most one more than those completed).
    pub passes_started: u64,
    /// While waiting for the pass interval: how long until the next pass may start.
    pub next_pass_in: Option<Duration>,
}

#[derive(Default)]
pub(crate) struct Scrubber {
    status: Mutex<ScrubStatus>,
    pass_done: Condvar,
    /// Wakes the scrub thread from its rate-limit wait (shutdown).
    wake: (Mutex<bool>, Condvar),
}

impl Scrubber {
    pub(crate) fn status(&self) -> ScrubStatus {
        self.status.lock().clone()
    }

    /// Waits until at least `passes` passes have finished or `timeout` has passed; returns the status.
    pub(crate) fn wait_for_passes(&self, passes: u64, timeout: Duration) -> ScrubStatus {
        let deadline = Instant::now() + timeout;
        let mut status = self.status.lock();
        while status.passes_completed < passes {
            if self.pass_done.wait_until(&mut status, deadline).timed_out() {
                break;
            }
        }
        status.clone()
    }

    pub(crate) fn stop(&self) {
        let (m, c) = &self.wake;
        *m.lock() = true;
        c.notify_all();
    }

    fn stopped(&self) -> bool {
        *self.wake.0.lock()
    }

    /// Sleeps until `until` unless stopped first; returns false when stopped.
    fn pause_until(&self, until: Instant) -> bool {
        let (m, c) = &self.wake;
        let mut stopped = m.lock();
        while !*stopped && Instant::now() < until {
            c.wait_until(&mut stopped, until);
        }
        !*stopped
    }
}

/// The scrub thread: runs until the engine shuts down.
/// It reads through snapshots of `core` (block IO verifies), yields to prioritized work (`core.qos`), and
/// keeps its findings in `scrubber`, which also stops it.
pub(crate) fn run(core: Arc<Core>, scrubber: Arc<Scrubber>, bytes_per_s: u64, pass_interval: Duration) {
    assert!(bytes_per_s > 0, "the scrub thread runs only with a rate");
    let mut from = nid_key(0).to_vec();
    let mut damaged: BTreeMap<Nid, String> = BTreeMap::new();
    let mut foreground_seen = foreground_work(&core);
    let mut pass_started: Option<Instant> = None;
    while !scrubber.stopped() {
        if pass_started.is_none() {
            pass_started = Some(Instant::now());
            let mut s = scrubber.status.lock();
            s.passes_started += 1;
            s.next_pass_in = None;
            debug_assert_eq!(s.passes_started, s.passes_completed + 1, "one pass at a time");
        }
        core.qos.yield_to_prioritized(crate::qos::BACKGROUND_WAIT_MAX);
        let started = Instant::now();
        let foreground_now = foreground_work(&core);
        let depth = &core.io.counters().queue_depth;
        let waiting: u64 = Priority::FOREGROUND.iter().map(|p| depth[*p].load(Ordering::Relaxed)).sum();
        let busy = foreground_now != foreground_seen || waiting > 0;
        foreground_seen = foreground_now;
        let limit = if busy { BUSY_STEP_BLOCKS } else { STEP_BLOCKS };
        let (checked, reached_end) = match step(&core, &mut from, limit, &mut damaged) {
            Ok(r) => r,
            Err(e) => {
                // The drive failing or shutting down ends the walk; the error is the drive's to report.
                tracing::debug!(error = %e, "background scrub stopped");
                return;
            }
        };
        // The pause is that of a full step either way: a busy step reads 1/16 of the bytes in the same time.
        let paced_blocks = if busy { STEP_BLOCKS } else { checked.max(1) };
        let mut due =
            started + Duration::from_secs_f64((paced_blocks as u64 * BLOCK_SIZE_BYTES) as f64 / bytes_per_s as f64);
        {
            let mut s = scrubber.status.lock();
            s.blocks_checked += checked as u64;
            if reached_end {
                s.passes_completed += 1;
                s.damaged = std::mem::take(&mut damaged).into_iter().collect();
                from = nid_key(0).to_vec();
                let next = pass_started.take().expect("a pass is under way") + pass_interval;
                due = due.max(next);
                s.next_pass_in = Some(due.saturating_duration_since(Instant::now()));
                debug_assert_eq!(s.passes_started, s.passes_completed, "the pass that ended is counted once");
                scrubber.pass_done.notify_all();
            }
        }
        if !scrubber.pause_until(due) {
            return;
        }
    }
}

/// A value that changes whenever foreground work happened: transactions committed and object reads (the
/// scrub's own reads are not object reads).
fn foreground_work(core: &Core) -> (u64, u64) {
    let c = core.io.counters();
    (c.transactions_committed.load(Ordering::Relaxed), c.object_reads.load(Ordering::Relaxed))
}

/// Verifies the blocks of block-map runs from `from` on, whole runs until at least `limit` blocks; moves
/// `from` past them. Returns the blocks checked and whether the walk reached the end of the map.
fn step(
    core: &Arc<Core>,
    from: &mut Vec<u8>,
    limit: usize,
    damaged: &mut BTreeMap<Nid, String>,
) -> Result<(usize, bool)> {
    let reader = Reader::new(core.clone());
    let entries = reader.scan(CF_BLOCKS, from, &[0xff; 17], limit)?;
    let mut checked = 0usize;
    let mut taken = 0usize;
    for (k, v) in &entries {
        let (nid, start) = (u64_at(k, 0)?, u64_at(k, 8)?);
        let run = BlockRun::decode(v)?;
        for unit in run.units(0, run.len_blocks()) {
            if let Some(what) = core.io.verify_unit(start, &run, unit) {
                tracing::warn!(nid, block = start + unit.first, %what, "background scrub found a damaged block");
                if damaged.len() < DAMAGED_LISTED_MAX {
                    damaged.entry(nid).or_insert(what);
                }
            }
        }
        checked += run.len_blocks() as usize;
        taken += 1;
        *from = k.to_vec();
        from.push(0);
        if checked >= limit {
            break;
        }
    }
    Ok((checked, taken == entries.len() && entries.len() < limit))
}
