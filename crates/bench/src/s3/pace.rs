//! An open-loop arrival schedule: operations are due at a fixed rate whatever the server's latency, and
//! the workers of a paced tenant take the next due operation in turn. An operation's latency counts from
//! the moment it was due, not from when a worker was free to send it, so a server that falls behind shows
//! the wait in its percentiles (a closed loop hides it: a slow server slows its own clients down, and the
//! operations it would have delayed are never sent).
//!
//! Why a bench needs it: with two tenants on one machine, a closed-loop small-object tenant that gets lower
//! latency also sends more operations, which take cores from the other tenant. At one offered rate the
//! latencies and the other tenant's throughput compare like for like.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most operations per second one paced tenant may ask for.
pub const RATE_OPS_PER_S_MAX: u32 = 100_000;

/// Arrival times `start + i / rate` for i = 0, 1, 2, ..., handed out once each.
#[derive(Debug)]
pub struct Pace {
    start: Instant,
    rate_ops_per_s: u32,
    next: AtomicU64,
}

impl Pace {
    pub fn new(start: Instant, rate_ops_per_s: u32) -> Pace {
        assert!((1..=RATE_OPS_PER_S_MAX).contains(&rate_ops_per_s), "rate {rate_ops_per_s} out of range");
        Pace { start, rate_ops_per_s, next: AtomicU64::new(0) }
    }

    /// The due time of the next operation not yet taken (each one is taken by exactly one caller).
    pub fn take(&self) -> Instant {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let due = self.due(i);
        debug_assert!(due >= self.start);
        due
    }

    fn due(&self, i: u64) -> Instant {
        // Nanoseconds in u128: no overflow for any count a run can reach, and no drift from summing steps.
        let nanos = u128::from(i) * 1_000_000_000 / u128::from(self.rate_ops_per_s);
        self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_evenly_spaced_from_the_start_without_drift() {
        let t0 = Instant::now();
        let p = Pace::new(t0, 3);
        let due: Vec<Duration> = (0..7).map(|_| p.take() - t0).collect();
        let ms: Vec<u128> = due.iter().map(|d| d.as_nanos() / 1_000_000).collect();
        assert_eq!(ms, [0, 333, 666, 1000, 1333, 1666, 2000]);
        // The millionth arrival at 1,000 op/s is due at exactly 1,000 s.
        let p = Pace::new(t0, 1000);
        assert_eq!(p.due(1_000_000) - t0, Duration::from_secs(1000));
    }

    #[test]
    fn workers_in_parallel_take_each_arrival_once() {
        let t0 = Instant::now();
        let p = std::sync::Arc::new(Pace::new(t0, RATE_OPS_PER_S_MAX));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || (0..1000).map(|_| p.take() - t0).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<Duration> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4000, "no arrival handed out twice");
        assert_eq!(all[3999], Duration::from_nanos(3999 * 10_000));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn a_rate_past_the_limit_is_refused() {
        Pace::new(Instant::now(), RATE_OPS_PER_S_MAX + 1);
    }
}
