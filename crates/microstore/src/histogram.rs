//! A log-scale histogram with four buckets per power of two: a quantile it gives is at most 25% above the
//! true value and never below it, in 624 bytes whatever it counts.

/// Values at or above this are counted as this (sizes of 1 TiB and more, latencies of 12 days in µs).
pub const MAX_VALUE: u64 = (1 << 40) - 1;
const SUB_BUCKETS: usize = 4;
/// Buckets 0..4 hold 0..4 exactly; then four per power of two up to `MAX_VALUE`.
pub const BUCKETS: usize = SUB_BUCKETS * 39;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: Box<[u32; BUCKETS]>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: Box::new([0; BUCKETS]), total: 0 }
    }
}

/// The bucket of a value.
fn index(value: u64) -> usize {
    let v = value.min(MAX_VALUE);
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let octave = 63 - v.leading_zeros() as usize; // 2..=39
    let sub = ((v >> (octave - 2)) & 3) as usize;
    let i = SUB_BUCKETS * (octave - 1) + sub;
    debug_assert!(i < BUCKETS);
    i
}

/// The largest value bucket `i` holds.
fn upper(i: usize) -> u64 {
    debug_assert!(i < BUCKETS);
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let octave = i / SUB_BUCKETS + 1;
    let sub = (i % SUB_BUCKETS) as u64;
    ((SUB_BUCKETS as u64 + sub + 1) << (octave - 2)) - 1
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        let i = index(value);
        // A count saturates rather than wraps: a window slot never holds 4 billion requests of one bucket.
        self.counts[i] = self.counts[i].saturating_add(1);
        self.total += 1;
    }

    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.total = 0;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.total += other.total;
    }

    /// The value at quantile `q` (0..=1): the upper end of the bucket it falls in; None when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        // The rank of the sample asked for, 1-based: the p99 of 100 samples is the 99th.
        let rank = ((q * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(upper(i));
            }
        }
        Some(upper(BUCKETS - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for i in 0..BUCKETS {
            let u = upper(i);
            assert!(i == 0 || u > last, "bucket {i} ends at {u}, not past {last}");
            assert_eq!(index(u), i);
            assert_eq!(index(u + 1).min(BUCKETS - 1), (i + 1).min(BUCKETS - 1));
            last = u;
        }
        assert_eq!(upper(BUCKETS - 1), MAX_VALUE);
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn an_empty_histogram_has_no_quantile() {
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    proptest! {
        #[test]
        fn a_quantile_is_never_below_the_true_one_nor_25_percent_above(
            mut values in proptest::collection::vec(0u64..(1 << 36), 1..300),
            q in 0.0f64..=1.0,
        ) {
            let mut h = Histogram::default();
            for &v in &values {
                h.record(v);
            }
            values.sort_unstable();
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let truth = values[rank - 1];
            let got = h.quantile(q).unwrap();
            prop_assert!(got >= truth, "{got} < {truth}");
            prop_assert!(got as f64 <= truth as f64 * 1.25 + 1.0, "{got} far above {truth}");
        }

        #[test]
        fn merging_is_recording_both(a in proptest::collection::vec(any::<u64>(), 0..50), b in proptest::collection::vec(any::<u64>(), 0..50)) {
            let (mut ha, mut hb, mut both) = (Histogram::default(), Histogram::default(), Histogram::default());
            a.iter().for_each(|&v| { ha.record(v); both.record(v) });
            b.iter().for_each(|&v| { hb.record(v); both.record(v) });
            ha.merge(&hb);
            prop_assert_eq!(ha, both);
        }
    }
}
