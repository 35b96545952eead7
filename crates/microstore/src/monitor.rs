//! The workload monitor: every bucket's window and class. Recording costs one hash and one short lock of
//! one of 16 shards; the number of buckets watched is bounded, the one seen least recently making room.

use crate::class::{Class, Classifier, ClassifyConfig};
use crate::window::{Sample, Summary, Window, WindowConfig};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

const SHARDS: usize = 16;
/// Most buckets a monitor may be configured to watch (each holds a window of about 1.3 KiB per slot).
pub const MAX_BUCKETS: usize = 100_000;

#[derive(Clone, Debug, PartialEq)]
pub struct MonitorConfig {
    pub window: WindowConfig,
    pub classify: ClassifyConfig,
    pub max_buckets: usize,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig { window: WindowConfig::default(), classify: ClassifyConfig::default(), max_buckets: 1_024 }
    }
}

impl MonitorConfig {
    pub fn validate(&self) -> Result<(), String> {
        self.window.validate()?;
        self.classify.validate()?;
        if self.max_buckets < SHARDS || self.max_buckets > MAX_BUCKETS {
            return Err(format!("max_buckets is {SHARDS} to {MAX_BUCKETS}, not {}", self.max_buckets));
        }
        Ok(())
    }
}

struct Watched {
    window: Window,
    classifier: Classifier,
    last_seen_ms: u64,
}

/// A bucket as the monitor sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketStatus {
    pub bucket: String,
    pub class: Option<Class>,
    /// The class the current window alone suggests (None: too little traffic).
    pub suggests: Option<Class>,
    pub requests_per_s: f64,
    pub bytes_per_s: f64,
    pub summary: Summary,
}

pub struct Monitor {
    config: MonitorConfig,
    shards: Vec<Mutex<HashMap<String, Watched>>>,
    /// Fixed keys: the same bucket falls in the same shard in every run (tests are deterministic).
    hasher: BuildHasherDefault<DefaultHasher>,
}

impl Monitor {
    pub fn new(config: MonitorConfig) -> Result<Monitor, String> {
        config.validate()?;
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        Ok(Monitor { config, shards, hasher: BuildHasherDefault::default() })
    }

    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    fn shard(&self, bucket: &str) -> &Mutex<HashMap<String, Watched>> {
        &self.shards[(self.hasher.hash_one(bucket) % SHARDS as u64) as usize]
    }

    pub fn record(&self, bucket: &str, now_ms: u64, sample: Sample) {
        let per_shard = self.config.max_buckets / SHARDS;
        let mut shard = self.shard(bucket).lock();
        if let Some(w) = shard.get_mut(bucket) {
            w.window.record(now_ms, sample);
            w.last_seen_ms = w.last_seen_ms.max(now_ms);
            return;
        }
        if shard.len() >= per_shard {
            // Bounded: a scan of one full shard, only when a new bucket arrives at the limit.
            let oldest = shard.iter().min_by_key(|(name, w)| (w.last_seen_ms, name.as_str())).map(|(n, _)| n.clone());
            if let Some(name) = oldest {
                shard.remove(&name);
            }
        }
        let mut window = Window::new(self.config.window);
        window.record(now_ms, sample);
        shard.insert(bucket.to_string(), Watched { window, classifier: Classifier::default(), last_seen_ms: now_ms });
        debug_assert!(shard.len() <= per_shard);
    }

    /// Forgets a bucket (deleted).
    pub fn forget(&self, bucket: &str) {
        self.shard(bucket).lock().remove(bucket);
    }

    /// One evaluation of every bucket (the server runs one per window slot); the buckets whose class
    /// changed, by name.
    pub fn evaluate(&self, now_ms: u64) -> Vec<(String, Class)> {
        let mut changed = vec![];
        for shard in &self.shards {
            for (name, w) in shard.lock().iter_mut() {
                let summary = w.window.summary(now_ms);
                if let Some(c) = w.classifier.evaluate(&self.config.classify, &summary) {
                    changed.push((name.clone(), c));
                }
            }
        }
        changed.sort();
        changed
    }

    pub fn class_of(&self, bucket: &str) -> Option<Class> {
        self.shard(bucket).lock().get(bucket).and_then(|w| w.classifier.class())
    }

    /// Every watched bucket, by name.
    pub fn status(&self, now_ms: u64) -> Vec<BucketStatus> {
        let mut all = vec![];
        for shard in &self.shards {
            for (name, w) in shard.lock().iter() {
                let summary = w.window.summary(now_ms);
                let class = w.classifier.class();
                all.push(BucketStatus {
                    bucket: name.clone(),
                    class,
                    suggests: self.config.classify.candidate(&summary, class),
                    requests_per_s: summary.requests_per_s(),
                    bytes_per_s: summary.bytes_per_s(),
                    summary,
                });
            }
        }
        all.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        all
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::OpKind;

    fn config() -> MonitorConfig {
        MonitorConfig {
            window: WindowConfig { slot_ms: 1_000, slots: 5 },
            classify: ClassifyConfig { min_requests: 10, hold_evaluations: 2, ..Default::default() },
            max_buckets: SHARDS,
        }
    }

    fn put(size_bytes: u64) -> Sample {
        Sample { op: OpKind::Put, size_bytes, latency_us: 500 }
    }

    fn get(size_bytes: u64) -> Sample {
        Sample { op: OpKind::Get, size_bytes, latency_us: 500 }
    }

    #[test]
    fn synthetic_streams_of_each_class_are_classified() {
        let m = Monitor::new(MonitorConfig { max_buckets: 4 * SHARDS, ..config() }).unwrap();
        let streams: [(&str, u64, u64, Class); 4] = [
            ("a", 16 << 10, 90, Class::SmallRead),
            ("b", 16 << 10, 5, Class::SmallWrite),
            ("c", 64 << 20, 90, Class::LargeRead),
            ("d", 64 << 20, 5, Class::LargeWrite),
        ];
        for i in 0..100u64 {
            for (bucket, size, get_pct, _) in streams {
                m.record(bucket, i * 10, if i % 100 < get_pct { get(size) } else { put(size) });
            }
        }
        let changed = m.evaluate(999);
        let want: Vec<_> = streams.iter().map(|(b, _, _, c)| (b.to_string(), *c)).collect();
        assert_eq!(changed, want);
        assert_eq!(
            m.status(999).iter().map(|s| s.class).collect::<Vec<_>>(),
            want.iter().map(|w| Some(w.1)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_bucket_that_changes_workload_is_reclassified_after_the_window() {
        let m = Monitor::new(config()).unwrap();
        let mut t = 0;
        let mut run = |m: &Monitor, sample: Sample, slots: u64| {
            let mut changes = vec![];
            for _ in 0..slots {
                for _ in 0..20 {
                    m.record("x", t, sample);
                    t += 50;
                }
                changes.extend(m.evaluate(t - 1));
            }
            changes
        };
        assert_eq!(run(&m, get(4 << 10), 5), vec![("x".to_string(), Class::SmallRead)]);
        // The window still holds small GETs for a while; once PUTs of 8 MiB dominate its median and mix,
        // the change waits two evaluations.
        let changes = run(&m, put(8 << 20), 5);
        assert_eq!(changes, vec![("x".to_string(), Class::LargeWrite)]);
        assert_eq!(m.class_of("x"), Some(Class::LargeWrite));
    }

    #[test]
    fn the_bucket_seen_least_recently_makes_room_at_the_limit() {
        let m = Monitor::new(config()).unwrap();
        for i in 0..200u64 {
            m.record(&format!("b{i}"), i, get(1));
        }
        assert!(m.len() <= SHARDS, "{} buckets watched", m.len());
        assert!(m.status(200).iter().any(|s| s.bucket == "b199"));
        m.forget("b199");
        assert!(!m.status(200).iter().any(|s| s.bucket == "b199"));
    }

    #[test]
    fn a_config_out_of_bounds_is_refused() {
        assert!(Monitor::new(MonitorConfig { max_buckets: SHARDS - 1, ..config() }).is_err());
        assert!(Monitor::new(MonitorConfig { max_buckets: MAX_BUCKETS + 1, ..config() }).is_err());
        assert!(Monitor::new(MonitorConfig { max_buckets: MAX_BUCKETS, ..config() }).is_ok());
    }
}
