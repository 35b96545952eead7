//! How long the process's set commits take, by how a moving group's step treats them (for the server's
//! metrics): a commit outside any armed step, one under the kept drives' rule, and one whose removals are
//! followed onto the step's new drives as well. What a move costs the requests of its groups is read from
//! these, beside the same load's commits elsewhere.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How a commit's group move treated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPath {
    /// No step armed: the set's drives at once.
    Plain,
    /// Under the kept drives' rule: the kept drives first, then the others.
    Armed,
    /// Armed, and its removals followed onto the step's new drives under the write's locks.
    ArmedFollowed,
}

impl CommitPath {
    pub const ALL: [CommitPath; 3] = [CommitPath::Plain, CommitPath::Armed, CommitPath::ArmedFollowed];

    pub fn label(self) -> &'static str {
        match self {
            CommitPath::Plain => "plain",
            CommitPath::Armed => "armed",
            CommitPath::ArmedFollowed => "armed_followed",
        }
    }
}

/// Thresholds of the slow-commit counts, in milliseconds.
pub const COMMIT_SLOW_MS: [u64; 3] = [10, 20, 40];

/// One path's commits: how many, their total time, how many took longer than each `COMMIT_SLOW_MS`.
#[derive(Default)]
pub struct PathTimes {
    pub commits: AtomicU64,
    pub total_us: AtomicU64,
    pub slower_than: [AtomicU64; COMMIT_SLOW_MS.len()],
}

static TIMES: [PathTimes; 3] = [const { PathTimes::new() }; 3];

impl PathTimes {
    const fn new() -> Self {
        PathTimes {
            commits: AtomicU64::new(0),
            total_us: AtomicU64::new(0),
            slower_than: [const { AtomicU64::new(0) }; COMMIT_SLOW_MS.len()],
        }
    }
}

/// The process's commit times on `path` since it started.
pub fn commit_times(path: CommitPath) -> &'static PathTimes {
    &TIMES[path as usize]
}

pub(crate) fn record(path: CommitPath, took: Duration) {
    let t = commit_times(path);
    t.commits.fetch_add(1, Relaxed);
    t.total_us.fetch_add(took.as_micros() as u64, Relaxed);
    for (limit_ms, n) in COMMIT_SLOW_MS.iter().zip(&t.slower_than) {
        if took > Duration::from_millis(*limit_ms) {
            n.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_counts_on_its_path_and_past_each_threshold_it_passed() {
        let t = commit_times(CommitPath::ArmedFollowed);
        let (before, slow_before) = (t.commits.load(Relaxed), t.slower_than.each_ref().map(|n| n.load(Relaxed)));
        record(CommitPath::ArmedFollowed, Duration::from_millis(25));
        assert_eq!(t.commits.load(Relaxed), before + 1);
        let slow: Vec<u64> = t.slower_than.iter().zip(slow_before).map(|(n, b)| n.load(Relaxed) - b).collect();
        assert_eq!(slow, [1, 1, 0], "past 10 and 20 ms, not past 40");
        assert!(t.total_us.load(Relaxed) >= 25_000);
    }
}
