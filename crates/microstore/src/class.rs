//! The workload classes of paper 002 (COSBench workloads A-D: small or large objects, mostly read or
//! mostly written) and the classifier that assigns them with hysteresis, so a bucket near a boundary or with
//! a noisy mix keeps its class instead of flapping between microstores.

use crate::window::Summary;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// A: small objects, mostly read (web hosting).
    SmallRead,
    /// B: small objects, mostly written (online games).
    SmallWrite,
    /// C: large objects, mostly read (video sharing).
    LargeRead,
    /// D: large objects, mostly written (backup).
    LargeWrite,
    /// Small objects, neither mostly read nor mostly written.
    SmallMixed,
    /// Large objects, neither mostly read nor mostly written.
    LargeMixed,
}

impl Class {
    pub const ALL: [Class; 6] = [
        Class::SmallRead,
        Class::SmallWrite,
        Class::LargeRead,
        Class::LargeWrite,
        Class::SmallMixed,
        Class::LargeMixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::SmallRead => "small-read",
            Class::SmallWrite => "small-write",
            Class::LargeRead => "large-read",
            Class::LargeWrite => "large-write",
            Class::SmallMixed => "small-mixed",
            Class::LargeMixed => "large-mixed",
        }
    }

    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }

    pub fn is_small(self) -> bool {
        matches!(self, Class::SmallRead | Class::SmallWrite | Class::SmallMixed)
    }

    fn mix(self) -> Mix {
        match self {
            Class::SmallRead | Class::LargeRead => Mix::Read,
            Class::SmallWrite | Class::LargeWrite => Mix::Write,
            Class::SmallMixed | Class::LargeMixed => Mix::Mixed,
        }
    }

    fn of(small: bool, mix: Mix) -> Class {
        match (small, mix) {
            (true, Mix::Read) => Class::SmallRead,
            (true, Mix::Write) => Class::SmallWrite,
            (true, Mix::Mixed) => Class::SmallMixed,
            (false, Mix::Read) => Class::LargeRead,
            (false, Mix::Write) => Class::LargeWrite,
            (false, Mix::Mixed) => Class::LargeMixed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mix {
    Read,
    Write,
    Mixed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassifyConfig {
    /// Objects whose median size is at most this are small...
    pub small_max_size_bytes: u64,
    /// ...and at least this, large; between the two a bucket keeps the size class it has (new: the nearer).
    pub large_min_size_bytes: u64,
    /// A mix is mostly read (written) when GETs (PUTs) are at least this share of GETs, PUTs and DELETEs...
    pub heavy_share_min: f64,
    /// ...and stays so until the share falls below `heavy_share_min - share_band`.
    pub share_band: f64,
    /// Fewer data requests than this in a window say nothing about a bucket.
    pub min_requests: u64,
    /// A bucket changes class after this many evaluations in a row all found the same other class.
    pub hold_evaluations: u32,
}

impl Default for ClassifyConfig {
    fn default() -> Self {
        ClassifyConfig {
            small_max_size_bytes: 256 << 10,
            large_min_size_bytes: 1 << 20,
            heavy_share_min: 0.6,
            share_band: 0.1,
            min_requests: 20,
            hold_evaluations: 3,
        }
    }
}

/// Most evaluations a class change may wait for.
pub const MAX_HOLD_EVALUATIONS: u32 = 1_000;

impl ClassifyConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.small_max_size_bytes == 0 || self.small_max_size_bytes > self.large_min_size_bytes {
            return Err(format!(
                "small_max_size ({}) is above 0 and at most large_min_size ({})",
                self.small_max_size_bytes, self.large_min_size_bytes
            ));
        }
        if !(0.5..=1.0).contains(&self.heavy_share_min) {
            return Err(format!("heavy_share_min is 0.5 to 1, not {}", self.heavy_share_min));
        }
        if !(0.0..=0.5).contains(&self.share_band) || self.heavy_share_min - self.share_band < 0.0 {
            return Err(format!("share_band is 0 to 0.5 and below heavy_share_min, not {}", self.share_band));
        }
        if self.min_requests == 0 {
            return Err("min_requests is at least 1".into());
        }
        if self.hold_evaluations == 0 || self.hold_evaluations > MAX_HOLD_EVALUATIONS {
            return Err(format!("hold_evaluations is 1 to {MAX_HOLD_EVALUATIONS}, not {}", self.hold_evaluations));
        }
        Ok(())
    }

    /// The class a window's summary suggests for a bucket whose class is `current`; None when the window
    /// holds too little to say.
    pub fn candidate(&self, summary: &Summary, current: Option<Class>) -> Option<Class> {
        let data = summary.gets + summary.puts + summary.deletes;
        if data < self.min_requests {
            return None;
        }
        let size = summary.size_bytes_p50.unwrap_or(0);
        let small = if size <= self.small_max_size_bytes {
            true
        } else if size >= self.large_min_size_bytes {
            false
        } else if let Some(c) = current {
            c.is_small()
        } else {
            // Nearer on a log scale: below the geometric mean of the two bounds.
            (size as f64) * (size as f64) < self.small_max_size_bytes as f64 * self.large_min_size_bytes as f64
        };
        let (get, put) = (summary.get_share()?, summary.put_share()?);
        let kept = current.map(Class::mix);
        let stays = |share: f64, mix: Mix| kept == Some(mix) && share >= self.heavy_share_min - self.share_band;
        let mix = if get >= self.heavy_share_min || stays(get, Mix::Read) {
            Mix::Read
        } else if put >= self.heavy_share_min || stays(put, Mix::Write) {
            Mix::Write
        } else {
            Mix::Mixed
        };
        Some(Class::of(small, mix))
    }
}

/// One bucket's class over time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Classifier {
    current: Option<Class>,
    /// Another class seen in the last evaluations in a row, and how many.
    pending: Option<(Class, u32)>,
}

impl Classifier {
    pub fn class(&self) -> Option<Class> {
        self.current
    }

    /// One evaluation; returns the new class when it changed. A first class is taken at once (a bucket with
    /// none is served by the default microstore until then); a change waits `hold_evaluations` in a row.
    pub fn evaluate(&mut self, config: &ClassifyConfig, summary: &Summary) -> Option<Class> {
        let Some(seen) = config.candidate(summary, self.current) else {
            // Too little traffic: neither evidence for a change nor against it.
            return None;
        };
        if self.current.is_none() || self.current == Some(seen) {
            self.pending = None;
            let changed = self.current.is_none();
            self.current = Some(seen);
            return changed.then_some(seen);
        }
        let count = match self.pending {
            Some((c, n)) if c == seen => n + 1,
            _ => 1,
        };
        if count >= config.hold_evaluations {
            self.current = Some(seen);
            self.pending = None;
            return Some(seen);
        }
        self.pending = Some((seen, count));
        debug_assert!(self.current != Some(seen));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{OpKind, Sample, Window, WindowConfig};
    use proptest::prelude::*;

    /// A summary of `n` requests of sizes `size` with the given GET/PUT/DELETE percentages.
    fn summary(n: u64, size: u64, get_pct: u64, put_pct: u64) -> Summary {
        let mut w = Window::new(WindowConfig { slot_ms: 1_000, slots: 10 });
        for i in 0..n {
            let r = i * 100 / n;
            let op = if r < get_pct {
                OpKind::Get
            } else if r < get_pct + put_pct {
                OpKind::Put
            } else {
                OpKind::Delete
            };
            w.record(0, Sample { op, size_bytes: if op == OpKind::Delete { 0 } else { size }, latency_us: 100 });
        }
        w.summary(999)
    }

    #[test]
    fn the_cosbench_workloads_get_their_classes() {
        let c = ClassifyConfig::default();
        assert_eq!(c.candidate(&summary(200, 64 << 10, 90, 5), None), Some(Class::SmallRead));
        assert_eq!(c.candidate(&summary(200, 64 << 10, 5, 90), None), Some(Class::SmallWrite));
        assert_eq!(c.candidate(&summary(200, 64 << 20, 90, 5), None), Some(Class::LargeRead));
        assert_eq!(c.candidate(&summary(200, 64 << 20, 5, 90), None), Some(Class::LargeWrite));
        assert_eq!(c.candidate(&summary(200, 4 << 10, 50, 50), None), Some(Class::SmallMixed));
        assert_eq!(c.candidate(&summary(200, 16 << 20, 45, 45), None), Some(Class::LargeMixed));
    }

    #[test]
    fn too_few_requests_say_nothing() {
        let c = ClassifyConfig::default();
        assert_eq!(c.candidate(&summary(c.min_requests - 1, 1 << 10, 100, 0), None), None);
        assert!(c.candidate(&summary(c.min_requests, 1 << 10, 100, 0), None).is_some());
    }

    #[test]
    fn between_the_size_bounds_a_bucket_keeps_its_size_class() {
        let c = ClassifyConfig::default();
        let middle = summary(100, 600 << 10, 90, 5);
        assert_eq!(c.candidate(&middle, Some(Class::LargeRead)), Some(Class::LargeRead));
        assert_eq!(c.candidate(&middle, Some(Class::SmallWrite)), Some(Class::SmallRead));
        // New: 600 KiB is above the geometric mean of 256 KiB and 1 MiB (512 KiB).
        assert_eq!(c.candidate(&middle, None), Some(Class::LargeRead));
    }

    #[test]
    fn a_mix_inside_the_band_keeps_its_kind() {
        let c = ClassifyConfig::default();
        let s = summary(100, 1 << 10, 55, 40);
        assert_eq!(c.candidate(&s, Some(Class::SmallRead)), Some(Class::SmallRead));
        assert_eq!(c.candidate(&s, None), Some(Class::SmallMixed));
        let s = summary(100, 1 << 10, 45, 50);
        assert_eq!(c.candidate(&s, Some(Class::SmallRead)), Some(Class::SmallMixed));
    }

    #[test]
    fn a_changed_workload_is_reclassified_after_the_hold() {
        let c = ClassifyConfig::default();
        let mut k = Classifier::default();
        assert_eq!(k.evaluate(&c, &summary(100, 1 << 10, 90, 5)), Some(Class::SmallRead));
        let large = summary(100, 32 << 20, 5, 90);
        for _ in 1..c.hold_evaluations {
            assert_eq!(k.evaluate(&c, &large), None);
            assert_eq!(k.class(), Some(Class::SmallRead));
        }
        assert_eq!(k.evaluate(&c, &large), Some(Class::LargeWrite));
    }

    #[test]
    fn configs_out_of_bounds_are_refused() {
        assert!(ClassifyConfig::default().validate().is_ok());
        let bad = [
            ClassifyConfig { small_max_size_bytes: 2 << 20, ..Default::default() },
            ClassifyConfig { heavy_share_min: 0.4, ..Default::default() },
            ClassifyConfig { share_band: 0.7, ..Default::default() },
            ClassifyConfig { min_requests: 0, ..Default::default() },
            ClassifyConfig { hold_evaluations: 0, ..Default::default() },
            ClassifyConfig { hold_evaluations: MAX_HOLD_EVALUATIONS + 1, ..Default::default() },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
    }

    proptest! {
        /// A noisy mix (each evaluation's window drawn around 50/50 and sizes around the bounds) changes
        /// class at most once per `hold_evaluations` evaluations.
        #[test]
        fn a_noisy_mix_does_not_flap(seed in proptest::collection::vec((35u64..65, 100u64..2_000), 30..60)) {
            let c = ClassifyConfig::default();
            let mut k = Classifier::default();
            let mut changes = vec![];
            for (i, (get_pct, size_kib)) in seed.into_iter().enumerate() {
                if k.evaluate(&c, &summary(100, size_kib << 10, get_pct, 100 - get_pct)).is_some() {
                    changes.push(i);
                }
            }
            for pair in changes.windows(2).skip(1) {
                prop_assert!(pair[1] - pair[0] >= c.hold_evaluations as usize, "changes at {changes:?}");
            }
        }
    }
}
