//! Paper 003's prioritized objects: while a read or write of a high-priority object is in flight, background
//! work (lazy sync, scrub) waits before its next step, so foreground-high requests preempt it. The wait is
//! bounded, so background work keeps a minimum share even under a constant stream of prioritized requests.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Scheduling class of a transaction (paper 003's QoS): higher classes are committed first, and background
/// work takes a bounded share of each group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Background,
    Foreground,
    ForegroundHigh,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Background, Priority::Foreground, Priority::ForegroundHigh];
    /// The foreground classes, highest first: the order a group takes them in.
    pub const FOREGROUND: [Priority; 2] = [Priority::ForegroundHigh, Priority::Foreground];

    /// The class's name in metrics and reports.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Background => "background",
            Priority::Foreground => "foreground",
            Priority::ForegroundHigh => "foreground_high",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// One value per scheduling class, indexed by the class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerClass<T>([T; 3]);

impl<T> std::ops::Index<Priority> for PerClass<T> {
    type Output = T;
    fn index(&self, p: Priority) -> &T {
        &self.0[p.slot()]
    }
}

impl<T> std::ops::IndexMut<Priority> for PerClass<T> {
    fn index_mut(&mut self, p: Priority) -> &mut T {
        &mut self.0[p.slot()]
    }
}

impl<T> PerClass<T> {
    /// A value for each class, made from the class.
    pub fn from_fn(f: impl FnMut(Priority) -> T) -> Self {
        PerClass(Priority::ALL.map(f))
    }

    /// (class, value) pairs, lowest class first.
    pub fn iter(&self) -> impl Iterator<Item = (Priority, &T)> {
        Priority::ALL.into_iter().zip(self.0.iter())
    }
}

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
        let mut n = self.in_flight.lock();
        *n = n.checked_add(1).expect("prioritized requests are counted");
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
    work: Arc<HighPriorityWork>,
}

impl PriorityGuard {
    pub(crate) fn new(work: Arc<HighPriorityWork>) -> Self {
        work.enter();
        PriorityGuard { work }
    }
}

impl Drop for PriorityGuard {
    fn drop(&mut self) {
        self.work.leave();
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
