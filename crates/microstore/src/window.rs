//! One bucket's sliding window: a ring of time slots, each counting the requests that ended in it. A
//! summary merges the slots of the last `slots * slot_ms`, so old traffic leaves the window a slot at a time.

use crate::histogram::Histogram;
use serde::Serialize;

/// What a request did, as the classes count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A read of object data (GetObject).
    Get,
    /// A write of object data (PutObject, UploadPart, CopyObject, CompleteMultipartUpload).
    Put,
    Delete,
    /// Everything else (HEAD, listings, configuration): counted in the rate, not in the mix.
    Other,
}

/// One finished request.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub op: OpKind,
    /// The object bytes it moved (the body of a PUT, of a GET's answer); 0 for others.
    pub size_bytes: u64,
    pub latency_us: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    pub slot_ms: u64,
    pub slots: usize,
}

/// Most slots a window has (bounds a bucket's memory: each slot holds two histograms).
pub const MAX_SLOTS: usize = 120;

impl Default for WindowConfig {
    /// One minute in 5-second slots.
    fn default() -> Self {
        WindowConfig { slot_ms: 5_000, slots: 12 }
    }
}

impl WindowConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.slot_ms == 0 || self.slot_ms > 3_600_000 {
            return Err(format!("a window slot is 1 ms to 1 h long, not {} ms", self.slot_ms));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(format!("a window has 1 to {MAX_SLOTS} slots, not {}", self.slots));
        }
        Ok(())
    }

    pub fn window_ms(&self) -> u64 {
        self.slot_ms * self.slots as u64
    }
}

#[derive(Clone, Debug, Default)]
struct Slot {
    /// The slot's number since time 0 (`now_ms / slot_ms`); a slot of another number is stale.
    number: u64,
    gets: u64,
    puts: u64,
    deletes: u64,
    others: u64,
    bytes_read: u64,
    bytes_written: u64,
    sizes: Histogram,
    latency_us: Histogram,
}

impl Slot {
    fn reset(&mut self, number: u64) {
        self.number = number;
        self.gets = 0;
        self.puts = 0;
        self.deletes = 0;
        self.others = 0;
        self.bytes_read = 0;
        self.bytes_written = 0;
        self.sizes.clear();
        self.latency_us.clear();
    }
}

/// What a window saw over its span.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    pub others: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// The time the counts cover (the window, or less while the window is young).
    pub span_ms: u64,
    /// Median and 99th percentile of the object sizes of GETs and PUTs (None without any).
    pub size_bytes_p50: Option<u64>,
    pub size_bytes_p99: Option<u64>,
    pub latency_ms_p50: Option<f64>,
    pub latency_ms_p99: Option<f64>,
}

impl Summary {
    pub fn requests(&self) -> u64 {
        self.gets + self.puts + self.deletes + self.others
    }

    /// The share of GETs among GETs, PUTs and DELETEs (None without any).
    pub fn get_share(&self) -> Option<f64> {
        let data = self.gets + self.puts + self.deletes;
        (data > 0).then(|| self.gets as f64 / data as f64)
    }

    pub fn put_share(&self) -> Option<f64> {
        let data = self.gets + self.puts + self.deletes;
        (data > 0).then(|| self.puts as f64 / data as f64)
    }

    pub fn requests_per_s(&self) -> f64 {
        per_second(self.requests(), self.span_ms)
    }

    pub fn bytes_per_s(&self) -> f64 {
        per_second(self.bytes_read + self.bytes_written, self.span_ms)
    }
}

fn per_second(n: u64, span_ms: u64) -> f64 {
    if span_ms == 0 { 0.0 } else { n as f64 * 1000.0 / span_ms as f64 }
}

pub struct Window {
    config: WindowConfig,
    ring: Vec<Slot>,
    /// The slot number of the first sample (a young window's span starts there).
    first_slot: Option<u64>,
}

impl Window {
    pub fn new(config: WindowConfig) -> Window {
        assert!(config.validate().is_ok(), "window config checked before use: {config:?}");
        Window { config, ring: vec![Slot::default(); config.slots], first_slot: None }
    }

    fn slot_number(&self, now_ms: u64) -> u64 {
        now_ms / self.config.slot_ms
    }

    pub fn record(&mut self, now_ms: u64, sample: Sample) {
        let number = self.slot_number(now_ms);
        self.first_slot.get_or_insert(number);
        let pos = (number % self.config.slots as u64) as usize;
        let slot = &mut self.ring[pos];
        if slot.number > number {
            // A sample a whole window older than what the slot holds (clocks read out of order) counts nowhere.
            return;
        }
        if slot.number != number {
            slot.reset(number);
        }
        match sample.op {
            OpKind::Get => {
                slot.gets += 1;
                slot.bytes_read = slot.bytes_read.saturating_add(sample.size_bytes);
                slot.sizes.record(sample.size_bytes);
            }
            OpKind::Put => {
                slot.puts += 1;
                slot.bytes_written = slot.bytes_written.saturating_add(sample.size_bytes);
                slot.sizes.record(sample.size_bytes);
            }
            OpKind::Delete => slot.deletes += 1,
            OpKind::Other => slot.others += 1,
        }
        slot.latency_us.record(sample.latency_us);
        debug_assert_eq!(self.ring[pos].number, number);
    }

    /// Whether the window holds nothing newer than one window before `now_ms`.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        let now = self.slot_number(now_ms);
        !self.ring.iter().any(|s| self.is_live(s, now) && s.gets + s.puts + s.deletes + s.others > 0)
    }

    fn is_live(&self, slot: &Slot, now: u64) -> bool {
        slot.number <= now && now - slot.number < self.config.slots as u64
    }

    pub fn summary(&self, now_ms: u64) -> Summary {
        let now = self.slot_number(now_ms);
        let mut sum = Summary::default();
        let (mut sizes, mut latency) = (Histogram::default(), Histogram::default());
        for slot in self.ring.iter().filter(|s| self.is_live(s, now)) {
            sum.gets += slot.gets;
            sum.puts += slot.puts;
            sum.deletes += slot.deletes;
            sum.others += slot.others;
            sum.bytes_read = sum.bytes_read.saturating_add(slot.bytes_read);
            sum.bytes_written = sum.bytes_written.saturating_add(slot.bytes_written);
            sizes.merge(&slot.sizes);
            latency.merge(&slot.latency_us);
        }
        // The span runs from the oldest slot the window covers (or the first sample's, if later) to now.
        let oldest = now.saturating_sub(self.config.slots as u64 - 1).max(self.first_slot.unwrap_or(now));
        sum.span_ms = now_ms.saturating_sub(oldest * self.config.slot_ms).max(1);
        sum.size_bytes_p50 = sizes.quantile(0.5);
        sum.size_bytes_p99 = sizes.quantile(0.99);
        sum.latency_ms_p50 = latency.quantile(0.5).map(|us| us as f64 / 1000.0);
        sum.latency_ms_p99 = latency.quantile(0.99).map(|us| us as f64 / 1000.0);
        debug_assert!(sum.span_ms <= self.config.window_ms());
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CONFIG: WindowConfig = WindowConfig { slot_ms: 1_000, slots: 10 };

    fn sample(op: OpKind, size_bytes: u64) -> Sample {
        Sample { op, size_bytes, latency_us: 1_000 }
    }

    #[test]
    fn a_config_out_of_bounds_is_refused() {
        assert!(WindowConfig { slot_ms: 0, slots: 1 }.validate().is_err());
        assert!(WindowConfig { slot_ms: 1, slots: 0 }.validate().is_err());
        assert!(WindowConfig { slot_ms: 1, slots: MAX_SLOTS }.validate().is_ok());
        assert!(WindowConfig { slot_ms: 1, slots: MAX_SLOTS + 1 }.validate().is_err());
    }

    #[test]
    fn old_traffic_leaves_the_window_a_slot_at_a_time() {
        let mut w = Window::new(CONFIG);
        w.record(500, sample(OpKind::Get, 10));
        w.record(1_500, sample(OpKind::Put, 20));
        assert_eq!((w.summary(9_999).gets, w.summary(9_999).puts), (1, 1));
        assert_eq!((w.summary(10_000).gets, w.summary(10_000).puts), (0, 1));
        assert_eq!(w.summary(11_000).requests(), 0);
        assert!(w.is_idle(11_000));
        assert!(!w.is_idle(10_999));
    }

    #[test]
    fn a_slot_reused_after_a_lap_starts_empty() {
        let mut w = Window::new(CONFIG);
        w.record(0, sample(OpKind::Get, 10));
        w.record(10_000, sample(OpKind::Delete, 0));
        let s = w.summary(10_000);
        assert_eq!((s.gets, s.deletes), (0, 1));
    }

    #[test]
    fn rates_divide_by_the_time_covered() {
        let mut w = Window::new(CONFIG);
        for t in 0..100 {
            w.record(t * 100, sample(OpKind::Put, 1_000));
        }
        let s = w.summary(10_000 - 1);
        assert_eq!(s.span_ms, 9_999);
        assert!((s.requests_per_s() - 10.0).abs() < 0.01, "{}", s.requests_per_s());
        assert!((s.bytes_per_s() - 10_000.0).abs() < 10.0);
        assert_eq!(s.put_share(), Some(1.0));
    }

    /// The model: every sample with its time; the window counts those of the last `slots` slots.
    fn model_gets(samples: &[(u64, bool)], now_ms: u64) -> u64 {
        let now = now_ms / CONFIG.slot_ms;
        samples.iter().filter(|(t, get)| *get && t / CONFIG.slot_ms + CONFIG.slots as u64 > now).count() as u64
    }

    proptest! {
        #[test]
        fn the_window_counts_what_a_list_of_samples_counts(mut steps in proptest::collection::vec((0u64..3_000, any::<bool>()), 1..200)) {
            let mut w = Window::new(CONFIG);
            let mut t = 0;
            let mut samples = vec![];
            for (dt, get) in steps.drain(..) {
                t += dt;
                samples.push((t, get));
                w.record(t, sample(if get { OpKind::Get } else { OpKind::Other }, 1));
                prop_assert_eq!(w.summary(t).gets, model_gets(&samples, t));
            }
        }
    }
}
