//! A drive's IO scheduler by share (issue 17: a microstore's share of drive IO). Device reads and writes
//! run at once while the device has room (fewer than `in_flight_max_bytes` in flight); past it they wait
//! in one queue, ordered by start-time fair queueing: an IO's tag is where its share's previous IO ended
//! in virtual time (or the virtual time now, if later), and an IO of `bytes` advances its share by
//! `bytes / weight`. While shares are backlogged each gets device bytes in proportion to its weight, within
//! one IO of it; a share that was idle starts from now (idle time is not saved up), and an IO alone is
//! never held (the scheduler only orders what contends). The share is the thread's
//! (`mosaic_store::thread_io_share`), which a drive's blocking thread takes from its request.
//!
//! The drive's commit pipeline (`mosaic_store::PIPELINE`) is never queued: every share's commits wait on it.
//!
//! Scheduled: `read_at`, `read_cached_at*`, `map_cached` and `write_at`. Not: `flush`, `discard` and reads that may not
//! wait (`read_cached_at_uninit_nowait`), which never occupy the device for long.

use crate::device::Device;
use mosaic_store::{IoShares, ShareEntry, ShareId};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Virtual time is in bytes times this over the weight (exact enough for weights up to 2^20).
const VIRTUAL_SCALE: u128 = 1 << 20;
/// Past this many remembered finish tags, those behind the virtual time are dropped (they change nothing),
/// and all of them if that is not enough.
const FINISH_TAGS_MAX: usize = 4_096;

/// Where an IO waits: its tag and its arrival (ties by arrival).
type Key = (u128, u64);

/// The queue's state (no clock, no threads: the model the tests drive).
#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    in_flight_bytes: u64,
    virtual_time: u128,
    finish: HashMap<ShareId, u128>,
    waiting: BTreeSet<Key>,
    arrivals: u64,
}

impl FairQueue {
    fn fits(&self, bytes: u64, max_bytes: u64) -> bool {
        self.in_flight_bytes == 0 || self.in_flight_bytes.saturating_add(bytes) <= max_bytes
    }

    /// An IO arrives: Ok, it runs now; Err(key), it waits (until `take` says its key).
    pub(crate) fn arrive(&mut self, share: ShareId, bytes: u64, weight: u32, max_bytes: u64) -> Result<(), Key> {
        debug_assert!(weight > 0);
        let start = self.virtual_time.max(self.finish.get(&share).copied().unwrap_or(0));
        let cost = u128::from(bytes.max(1)) * VIRTUAL_SCALE / u128::from(weight.max(1));
        if self.finish.len() >= FINISH_TAGS_MAX {
            let now = self.virtual_time;
            self.finish.retain(|_, f| *f > now);
            if self.finish.len() >= FINISH_TAGS_MAX {
                // Still full (many shares, none behind): forget them all; each starts from now, as an
                // idle share does, which costs fairness for a moment and never memory.
                self.finish.clear();
            }
        }
        self.finish.insert(share, start + cost);
        if self.waiting.is_empty() && self.fits(bytes, max_bytes) {
            self.run(start, bytes);
            return Ok(());
        }
        let key = (start, self.arrivals);
        self.arrivals += 1;
        self.waiting.insert(key);
        Err(key)
    }

    /// Whether the waiting IO `key` of `bytes` may run now (it is first and the device has room); if so it
    /// leaves the queue and runs.
    pub(crate) fn take(&mut self, key: Key, bytes: u64, max_bytes: u64) -> bool {
        if self.waiting.first() != Some(&key) || !self.fits(bytes, max_bytes) {
            return false;
        }
        self.waiting.remove(&key);
        self.run(key.0, bytes);
        true
    }

    fn run(&mut self, start: u128, bytes: u64) {
        self.in_flight_bytes += bytes;
        self.virtual_time = self.virtual_time.max(start);
    }

    /// An IO of `bytes` is done.
    pub(crate) fn done(&mut self, bytes: u64) {
        assert!(self.in_flight_bytes >= bytes, "an IO finished that was not in flight");
        self.in_flight_bytes -= bytes;
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// A device whose IO is scheduled by share (see the module).
pub struct ScheduledDevice {
    inner: Arc<dyn Device>,
    shares: Arc<IoShares>,
    queue: Mutex<FairQueue>,
    turn: Condvar,
}

/// An IO holding its place on the device until dropped.
struct Running<'a> {
    device: &'a ScheduledDevice,
    bytes: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.device.queue.lock().done(self.bytes);
        self.device.turn.notify_all();
    }
}

impl ScheduledDevice {
    pub fn new(inner: Arc<dyn Device>, shares: Arc<IoShares>) -> ScheduledDevice {
        ScheduledDevice { inner, shares, queue: Mutex::new(FairQueue::default()), turn: Condvar::new() }
    }

    /// IOs waiting their turn now.
    pub fn waiting(&self) -> usize {
        self.queue.lock().waiting()
    }

    /// Runs one IO of `bytes` in the thread's share, when its turn comes (at once while shares are off).
    fn scheduled<R>(&self, bytes: usize, io: impl FnOnce() -> R) -> R {
        if !self.shares.is_active() {
            return io();
        }
        let share = mosaic_store::thread_io_share();
        if share == mosaic_store::PIPELINE {
            return io();
        }
        // Queued as the share it is served as, so ids the table does not know add no state here.
        let (share, entry): (ShareId, Arc<ShareEntry>) = self.shares.resolve(share);
        let (bytes, max) = (bytes as u64, self.shares.in_flight_max_bytes());
        let mut q = self.queue.lock();
        let waited_us = match q.arrive(share, bytes, entry.weight(), max) {
            Ok(()) => None,
            Err(key) => {
                let since = Instant::now();
                while !q.take(key, bytes, max) {
                    self.turn.wait(&mut q);
                }
                // The next in line may fit beside this one.
                self.turn.notify_all();
                Some(since.elapsed().as_micros() as u64)
            }
        };
        drop(q);
        let _running = Running { device: self, bytes };
        entry.record(bytes, waited_us);
        io()
    }
}

impl Device for ScheduledDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        self.inner.grow_to(size_bytes)
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.scheduled(buf.len(), || self.inner.read_at(buf, offset_bytes))
    }
    fn read_cached_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.scheduled(buf.len(), || self.inner.read_cached_at(buf, offset_bytes))
    }
    fn read_cached_at_uninit(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        self.scheduled(buf.len(), || self.inner.read_cached_at_uninit(buf, offset_bytes))
    }
    fn read_cached_at_uninit_nowait(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        self.inner.read_cached_at_uninit_nowait(buf, offset_bytes)
    }
    fn read_cached_vectored(
        &self,
        pieces: &mut [&mut [std::mem::MaybeUninit<u8>]],
        offset_bytes: u64,
        resident: bool,
    ) -> io::Result<()> {
        // A pinned range is a copy from memory: it takes no turn at the device.
        if resident {
            return self.inner.read_cached_vectored(pieces, offset_bytes, true);
        }
        let bytes = pieces.iter().map(|p| p.len()).sum();
        self.scheduled(bytes, || self.inner.read_cached_vectored(pieces, offset_bytes, false))
    }
    fn map_cached(&self, offset_bytes: u64, len_bytes: usize) -> Option<crate::device::CachedMapping> {
        self.scheduled(len_bytes, || self.inner.map_cached(offset_bytes, len_bytes))
    }
    fn forget_cached(&self, offset_bytes: u64, len_bytes: u64) {
        self.inner.forget_cached(offset_bytes, len_bytes)
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.scheduled(buf.len(), || self.inner.write_at(buf, offset_bytes))
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn io_path(&self) -> &'static str {
        self.inner.io_path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u64 = 1 << 20;

    /// Serves backlogged shares one IO at a time (each IO of `bytes[share]`, weights `weights[share]`) for
    /// `rounds` IOs; returns the bytes each share was served.
    fn serve_backlogged(weights: &[u32], bytes: &[u64], rounds: usize) -> Vec<u64> {
        let mut q = FairQueue::default();
        // A device that holds one IO at a time.
        const ONE: u64 = 1;
        // One IO of share 0's kind runs, so that everything after it waits.
        q.arrive(999, MAX, 1, ONE).unwrap();
        let mut queued: Vec<(Key, usize)> = vec![];
        for s in 0..weights.len() {
            let key = q.arrive(s as ShareId, bytes[s], weights[s], ONE).unwrap_err();
            queued.push((key, s));
        }
        let mut served = vec![0u64; weights.len()];
        q.done(MAX);
        for _ in 0..rounds {
            // The one the queue takes next; it runs alone, then its share queues its next IO at once.
            queued.sort();
            let (key, s) = queued.remove(0);
            assert!(q.take(key, bytes[s], ONE), "the first in line runs on an idle device");
            for (other, os) in &queued {
                assert!(!q.take(*other, bytes[*os], ONE), "one at a time: the device is full");
            }
            served[s] += bytes[s];
            let next = q.arrive(s as ShareId, bytes[s], weights[s], ONE).unwrap_err();
            q.done(bytes[s]);
            queued.push((next, s));
        }
        served
    }

    #[test]
    fn backlogged_shares_are_served_in_proportion_to_their_weights() {
        let served = serve_backlogged(&[300, 100], &[64 << 10, 64 << 10], 400);
        assert_eq!(served[0] / (64 << 10), 300);
        assert_eq!(served[1] / (64 << 10), 100);
        // By bytes, not by IOs: small IOs of a heavy share against large IOs of a light one.
        let served = serve_backlogged(&[100, 100], &[4 << 10, 1 << 20], 2_000);
        let ratio = served[0] as f64 / served[1] as f64;
        assert!((0.9..1.1).contains(&ratio), "equal weights, equal bytes: {served:?}");
    }

    #[test]
    fn an_io_alone_runs_at_once_and_the_device_fills_to_its_limit() {
        let mut q = FairQueue::default();
        assert!(q.arrive(1, 2 * MAX, 1, MAX).is_ok(), "larger than the limit, but alone: it runs");
        let k = q.arrive(2, 4096, 1000, MAX).unwrap_err();
        assert!(!q.take(k, 4096, MAX));
        q.done(2 * MAX);
        assert!(q.take(k, 4096, MAX));
        assert!(q.arrive(2, MAX - 4096, 1000, MAX).is_ok(), "room left: it runs beside");
        assert!(q.arrive(3, 4096, 1, MAX).is_err(), "full");
    }

    #[test]
    fn an_idle_share_saves_nothing_up() {
        let mut q = FairQueue::default();
        // Share 1 runs alone for a long time; share 2 then arrives and the two alternate from there on.
        for _ in 0..100 {
            q.arrive(1, 4096, 1, MAX).unwrap();
            q.done(4096);
        }
        q.arrive(9, MAX, 1, MAX).unwrap();
        let a = q.arrive(1, 4096, 1, MAX).unwrap_err();
        let b = q.arrive(2, 4096, 1, MAX).unwrap_err();
        let a2 = q.arrive(1, 4096, 1, MAX).unwrap_err();
        let b2 = q.arrive(2, 4096, 1, MAX).unwrap_err();
        assert!(b < a2 && a < b2, "share 2 gets no credit for share 1's time alone: {a:?} {b:?} {a2:?} {b2:?}");
    }

    /// A device whose first IO waits until the test opens the gate; it records each IO's share.
    struct Gated {
        inner: crate::device::SimDevice,
        gate: (std::sync::Mutex<bool>, std::sync::Condvar),
        order: std::sync::Mutex<Vec<ShareId>>,
    }

    impl Device for Gated {
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
            self.order.lock().unwrap().push(mosaic_store::thread_io_share());
            let (m, c) = &self.gate;
            let _open = c.wait_while(m.lock().unwrap(), |open| !*open).unwrap();
            self.inner.read_at(buf, offset_bytes)
        }
        fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
            self.inner.write_at(buf, offset_bytes)
        }
        fn flush(&self) -> io::Result<()> {
            self.inner.flush()
        }
        fn kind(&self) -> &'static str {
            "gated"
        }
    }

    #[test]
    fn threads_contending_for_a_device_run_in_their_shares_order() {
        let gated = Arc::new(Gated {
            inner: crate::device::SimDevice::new(1 << 20),
            gate: Default::default(),
            order: Default::default(),
        });
        let shares = IoShares::new(4096, 1);
        shares.set_weight(1, 1).unwrap();
        shares.set_weight(3, 4).unwrap();
        let dev = Arc::new(ScheduledDevice::new(gated.clone(), shares.clone()));
        let read = |dev: Arc<ScheduledDevice>, share: ShareId| {
            std::thread::spawn(move || {
                let mut buf = mosaic_store::AlignedBuf::zeroed(4096);
                mosaic_store::on_thread_with_share(share, || dev.read_at(buf.as_mut_slice(), 0)).unwrap();
            })
        };
        // Off: nothing waits, nothing is counted.
        *gated.gate.0.lock().unwrap() = true;
        read(dev.clone(), 1).join().unwrap();
        assert_eq!(shares.stats(1).unwrap().served_ios, 0);
        *gated.gate.0.lock().unwrap() = false;
        gated.order.lock().unwrap().clear();
        shares.set_active(true);
        // The first IO holds the device; then four of share 1 and four of share 3 queue, alternately.
        let mut threads = vec![read(dev.clone(), 7)];
        while gated.order.lock().unwrap().is_empty() {
            std::thread::yield_now();
        }
        for i in 0..8 {
            threads.push(read(dev.clone(), if i % 2 == 0 { 1 } else { 3 }));
            while dev.waiting() < i + 1 {
                std::thread::yield_now();
            }
        }
        // The commit pipeline's IO does not queue: it reaches the device while the others wait.
        threads.push(read(dev.clone(), mosaic_store::PIPELINE));
        while gated.order.lock().unwrap().len() < 2 {
            std::thread::yield_now();
        }
        assert_eq!(dev.waiting(), 8);
        let (m, c) = &gated.gate;
        *m.lock().unwrap() = true;
        c.notify_all();
        for t in threads {
            t.join().unwrap();
        }
        let order = gated.order.lock().unwrap().clone();
        // Share 3 (weight 4) runs four IOs for each of share 1's while both wait (the first of each tie
        // by arrival).
        assert_eq!(order, vec![7, mosaic_store::PIPELINE, 1, 3, 3, 3, 3, 1, 1, 1]);
        let (s1, s3) = (shares.stats(1).unwrap(), shares.stats(3).unwrap());
        assert_eq!((s1.served_ios, s1.waited_ios, s1.served_bytes), (4, 4, 4 * 4096));
        assert_eq!((s3.served_ios, s3.waited_ios), (4, 4));
        assert_eq!(shares.stats(mosaic_store::UNSHARED).unwrap().served_ios, 1, "share 7 is unknown: unshared");
        assert_eq!(dev.waiting(), 0);
    }

    #[test]
    fn finish_tags_stay_bounded_past_their_limit() {
        let mut q = FairQueue::default();
        for share in 0..(FINISH_TAGS_MAX as ShareId + 1_000) {
            q.arrive(share, 4096, 1, MAX).unwrap();
            q.done(4096);
            assert!(q.finish.len() <= FINISH_TAGS_MAX, "{} tags kept", q.finish.len());
        }
    }

    proptest! {
        /// Start-time fair queueing's bound: over any backlogged run, the bytes served per weight of two
        /// shares differ by at most one largest IO per weight of each.
        #[test]
        fn service_per_weight_stays_within_one_io(
            weights in proptest::collection::vec(1u32..1000, 2..5),
            sizes in proptest::collection::vec(1u64..(1 << 20), 5),
            rounds in 50usize..400,
        ) {
            let bytes: Vec<u64> = (0..weights.len()).map(|i| sizes[i]).collect();
            let served = serve_backlogged(&weights, &bytes, rounds);
            let norm: Vec<f64> = served.iter().zip(&weights).map(|(s, w)| *s as f64 / f64::from(*w)).collect();
            for i in 0..weights.len() {
                for j in 0..weights.len() {
                    let bound = bytes[i] as f64 / f64::from(weights[i]) + bytes[j] as f64 / f64::from(weights[j]);
                    prop_assert!(norm[i] - norm[j] <= bound + 1e-6, "{norm:?} {weights:?} {bytes:?}");
                }
            }
        }
    }
}
