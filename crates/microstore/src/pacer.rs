//! A microstore's bandwidth share: the object bytes its requests move (PUT bodies in, GET bodies out) are
//! paced to a rate when the resource manager sets one (paper 002: bandwidth first for large objects), so a
//! large-object tenant cannot take the drives and cores a small-object tenant's latency depends on.
//! Virtual-time pacing: each chunk is scheduled after the ones before it at the rate; a chunk waits only
//! when its turn is more than a burst ahead of now.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a body may run ahead of its rate before it waits.
const BURST: Duration = Duration::from_millis(50);
/// Lowest rate a pacer can be set to (a cap below it would stall large requests for minutes).
pub const MIN_RATE_BYTES_PER_S: u64 = 1 << 20;

pub struct Pacer {
    /// 0: unlimited.
    rate_bytes_per_s: AtomicU64,
    /// When the bytes scheduled so far are done at the rate.
    next_free: Mutex<Option<Instant>>,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer { rate_bytes_per_s: AtomicU64::new(0), next_free: Mutex::new(None) }
    }
}

impl Pacer {
    /// None: unlimited.
    pub fn rate_bytes_per_s(&self) -> Option<u64> {
        let r = self.rate_bytes_per_s.load(Ordering::Acquire);
        (r > 0).then_some(r)
    }

    pub fn set_rate(&self, rate_bytes_per_s: Option<u64>) {
        let r = rate_bytes_per_s.map(|r| r.max(MIN_RATE_BYTES_PER_S)).unwrap_or(0);
        self.rate_bytes_per_s.store(r, Ordering::Release);
        if r == 0 {
            *self.next_free.lock() = None;
        }
    }

    /// Schedules `bytes` at `now`; how long to wait before moving the next chunk (None: go on).
    pub fn schedule(&self, bytes: u64, now: Instant) -> Option<Duration> {
        let rate = self.rate_bytes_per_s.load(Ordering::Acquire);
        if rate == 0 || bytes == 0 {
            return None;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
        let mut next = self.next_free.lock();
        // Idle time is not saved up: a pacer that was idle starts from now.
        let start = next.map_or(now, |n| n.max(now));
        let done = start + cost;
        *next = Some(done);
        let ahead = done.saturating_duration_since(now);
        (ahead > BURST).then(|| ahead - BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlimited_pacer_never_waits() {
        let p = Pacer::default();
        assert_eq!(p.schedule(u64::MAX, Instant::now()), None);
        assert_eq!(p.rate_bytes_per_s(), None);
    }

    #[test]
    fn bytes_past_the_burst_wait_for_their_turn_at_the_rate() {
        let p = Pacer::default();
        p.set_rate(Some(10 << 20));
        let t0 = Instant::now();
        // 10 MiB/s: 256 KiB takes 25 ms, inside the burst.
        assert_eq!(p.schedule(256 << 10, t0), None);
        // 1 MiB more: done at 125 ms, 75 ms past the burst.
        let wait = p.schedule(1 << 20, t0).unwrap();
        assert!((wait.as_secs_f64() - 0.075).abs() < 0.001, "{wait:?}");
        // Later, after the schedule drained, nothing waits; idle time is not saved up.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.schedule(256 << 10, later), None);
        let wait = p.schedule(1 << 20, later).unwrap();
        assert!((wait.as_secs_f64() - 0.075).abs() < 0.001, "{wait:?}");
    }

    #[test]
    fn a_rate_below_the_minimum_is_raised_and_unlimited_forgets_the_schedule() {
        let p = Pacer::default();
        p.set_rate(Some(1));
        assert_eq!(p.rate_bytes_per_s(), Some(MIN_RATE_BYTES_PER_S));
        let t0 = Instant::now();
        assert!(p.schedule(64 << 20, t0).is_some());
        p.set_rate(None);
        assert_eq!(p.schedule(64 << 20, t0), None);
    }
}
