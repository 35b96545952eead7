//! Paper 003's prioritized objects: while a read or write of a high-priority object is in flight, background
//! work (lazy sync, scrub) waits before its next step, so foreground-high requests preempt it. The wait is
//! bounded, so background work keeps a minimum share even under a constant stream of prioritized requests.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest a background step waits for prioritized work to finish before it runs anyway.
pub(crate) const BACKGROUND_WAIT_MAX: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(crate) struct HighPriorityWork {
    in_flight: Mutex<u64>,
    idle: Condvar,
    /// Background steps that waited for prioritized work.
    pub(crate) background_waits: AtomicU64,
}

impl HighPriorityWork {
    fn enter(&self) {
        *self.in_flight.lock() += 1;
    }

    fn leave(&self) {
        let mut n = self.in_flight.lock();
        assert!(*n > 0, "a prioritized request left twice");
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        *self.in_flight.lock()
    }

    /// Called by background work before each step: waits while prioritized requests are in flight, at
    /// most `max_wait`. Returns whether it waited.
    pub(crate) fn yield_to_prioritized(&self, max_wait: Duration) -> bool {
        let deadline = Instant::now() + max_wait;
        let mut n = self.in_flight.lock();
        if *n == 0 {
            return false;
        }
        self.background_waits.fetch_add(1, Ordering::Relaxed);
        while *n > 0 && !self.idle.wait_until(&mut n, deadline).timed_out() {}
        true
    }
}

/// Held while a prioritized request is in flight (a read of a high-priority object, or a transaction of
/// the ForegroundHigh class until it is answered).
pub struct PriorityGuard {
    work: Arc<crate::engine::Inner>,
}

impl PriorityGuard {
    pub(crate) fn new(inner: Arc<crate::engine::Inner>) -> Self {
        inner.high_priority.enter();
        PriorityGuard { work: inner }
    }
}

impl Drop for PriorityGuard {
    fn drop(&mut self) {
        self.work.high_priority.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_waits_only_while_prioritized_work_runs_and_at_most_the_bound() {
        let w = Arc::new(HighPriorityWork::default());
        assert!(!w.yield_to_prioritized(Duration::from_secs(10)), "nothing in flight: no wait");
        w.enter();
        let t0 = Instant::now();
        assert!(w.yield_to_prioritized(Duration::from_millis(20)));
        assert!(t0.elapsed() >= Duration::from_millis(20), "waited up to the bound");
        // Leaving wakes a waiting background step before its bound.
        let w2 = w.clone();
        let waiter = std::thread::spawn(move || w2.yield_to_prioritized(Duration::from_secs(600)));
        while w.background_waits.load(Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        w.leave();
        assert!(waiter.join().unwrap());
        assert_eq!(w.in_flight(), 0);
    }
}
