//! Where measurements go: one HDR latency histogram per operation, byte and error counts, and live
//! counters sampled once a second for the progress line and the throughput timeline. Errors are kept by
//! class (timeout, HTTP status and S3 code, wrong body, transport), never dropped.

use super::plan::OpKind;
use crate::report::{Latency, latency};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Latencies from 1 us to 1 hour at 3 significant digits.
const LATENCY_MAX_US: u64 = 3_600_000_000;

pub fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts; a failure here is a programming error.
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("valid histogram bounds")
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorClass {
    Timeout,
    Http(u16, String),
    /// The body read back is not what was written.
    Verify,
    Transport,
}

impl ErrorClass {
    pub fn label(&self) -> String {
        match self {
            ErrorClass::Timeout => "timeout".into(),
            ErrorClass::Http(s, c) if c.is_empty() => format!("http_{s}"),
            ErrorClass::Http(s, c) => format!("http_{s}_{c}"),
            ErrorClass::Verify => "verify".into(),
            ErrorClass::Transport => "transport".into(),
        }
    }
}

struct OpStats {
    hist: Histogram<u64>,
    ok: u64,
    bytes: u64,
    errors: BTreeMap<String, u64>,
}

/// Collects one run (or one tenant of a run).
pub struct Recorder {
    ops: Mutex<BTreeMap<OpKind, OpStats>>,
    first_error: Mutex<Option<String>>,
    measure_from: Instant,
    /// Live totals (measured operations only) for progress and the timeline.
    pub live_ops: AtomicU64,
    pub live_bytes: AtomicU64,
    pub live_errors: AtomicU64,
    last_end: Mutex<Instant>,
}

impl Recorder {
    pub fn new(measure_from: Instant) -> Recorder {
        Recorder {
            ops: Mutex::new(BTreeMap::new()),
            first_error: Mutex::new(None),
            measure_from,
            live_ops: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            live_errors: AtomicU64::new(0),
            last_end: Mutex::new(measure_from),
        }
    }

    /// Records one finished operation; operations started during warm-up are not counted.
    pub fn record(&self, kind: OpKind, started: Instant, result: &Result<u64, (ErrorClass, String)>) {
        if started < self.measure_from {
            return;
        }
        let now = Instant::now();
        let us = now.duration_since(started).as_micros().clamp(1, LATENCY_MAX_US as u128) as u64;
        {
            let mut ops = self.ops.lock();
            let s = ops.entry(kind).or_insert_with(|| OpStats {
                hist: new_histogram(),
                ok: 0,
                bytes: 0,
                errors: BTreeMap::new(),
            });
            match result {
                Ok(bytes) => {
                    s.hist.saturating_record(us);
                    s.ok += 1;
                    s.bytes += bytes;
                }
                Err((class, _)) => *s.errors.entry(class.label()).or_insert(0) += 1,
            }
        }
        match result {
            Ok(bytes) => {
                self.live_ops.fetch_add(1, Ordering::Relaxed);
                self.live_bytes.fetch_add(*bytes, Ordering::Relaxed);
            }
            Err((class, msg)) => {
                self.live_errors.fetch_add(1, Ordering::Relaxed);
                let mut first = self.first_error.lock();
                if first.is_none() {
                    *first = Some(format!("{} {}: {msg}", kind.name(), class.label()));
                }
            }
        }
        let mut last = self.last_end.lock();
        if now > *last {
            *last = now;
        }
    }

    /// Seconds from the end of warm-up to the last recorded completion.
    pub fn measured(&self) -> Duration {
        self.last_end.lock().duration_since(self.measure_from)
    }

    pub fn first_error(&self) -> Option<String> {
        self.first_error.lock().clone()
    }

    /// Per-operation results over `seconds`.
    pub fn summarize(&self, seconds: f64) -> BTreeMap<String, OpResult> {
        let ops = self.ops.lock();
        ops.iter()
            .map(|(k, s)| {
                let secs = seconds.max(1e-9);
                let errors: u64 = s.errors.values().sum();
                (
                    k.name().to_string(),
                    OpResult {
                        ops: s.ok,
                        errors,
                        error_classes: s.errors.clone(),
                        bytes: s.bytes,
                        ops_per_s: s.ok as f64 / secs,
                        mib_per_s: s.bytes as f64 / secs / (1024.0 * 1024.0),
                        latency: latency(&s.hist),
                        latency_cdf_us: cdf(&s.hist),
                    },
                )
            })
            .collect()
    }

    /// The raw histogram of one operation (priority workload deadlines).
    pub fn count_over(&self, kind: OpKind, limit_us: u64) -> u64 {
        let ops = self.ops.lock();
        ops.get(&kind).map_or(0, |s| s.hist.count_between(limit_us + 1, LATENCY_MAX_US))
    }
}

#[derive(Serialize, Clone, Debug, Default, serde::Deserialize)]
pub struct OpResult {
    pub ops: u64,
    pub errors: u64,
    pub error_classes: BTreeMap<String, u64>,
    pub bytes: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    #[serde(flatten)]
    pub latency: Latency,
    /// (latency in us, fraction of operations at or below it), for the CDF plot.
    pub latency_cdf_us: Vec<(u64, f64)>,
}

/// Points of the latency CDF: every percent, then the tail.
fn cdf(h: &Histogram<u64>) -> Vec<(u64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut qs: Vec<f64> = (1..100).map(|p| p as f64 / 100.0).collect();
    qs.extend([0.995, 0.999, 0.9999, 1.0]);
    qs.into_iter().map(|q| (h.value_at_quantile(q), q)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_is_excluded_and_errors_are_kept() {
        let start = Instant::now();
        let r = Recorder::new(start + Duration::from_secs(3600));
        r.record(OpKind::Get, start, &Ok(10));
        assert!(r.summarize(1.0).is_empty());
        let r = Recorder::new(start);
        r.record(OpKind::Get, start, &Ok(10));
        r.record(OpKind::Get, start, &Err((ErrorClass::Verify, "bad".into())));
        r.record(OpKind::Get, start, &Err((ErrorClass::Http(503, "SlowDown".into()), "busy".into())));
        r.record(OpKind::Put, start, &Err((ErrorClass::Timeout, "slow".into())));
        let s = r.summarize(1.0);
        assert_eq!(s["GET"].ops, 1);
        assert_eq!(s["GET"].errors, 2);
        assert_eq!(s["GET"].error_classes["verify"], 1);
        assert_eq!(s["GET"].error_classes["http_503_SlowDown"], 1);
        assert_eq!(s["PUT"].error_classes["timeout"], 1);
        assert_eq!(r.first_error().as_deref(), Some("GET verify: bad"));
    }
}
