//! Shared report helpers: latency summaries and process memory.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Latency {
    pub latency_us_p50: u64,
    pub latency_us_p90: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
}

pub fn latency(h: &Histogram<u64>) -> Latency {
    Latency {
        latency_us_p50: h.value_at_quantile(0.50),
        latency_us_p90: h.value_at_quantile(0.90),
        latency_us_p99: h.value_at_quantile(0.99),
        latency_us_p999: h.value_at_quantile(0.999),
        latency_us_max: h.max(),
    }
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub fn rss_bytes_max() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// A text table: one row per (name, value).
pub fn table(rows: &[(&str, String)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<w$}  {v}\n")).collect()
}
