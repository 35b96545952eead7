//! Foreground work in flight on a whole node (paper 003's QoS across the sets of a cluster): the reads
//! and writes its own sets serve for clients, and the drive commands its drive server runs for other
//! nodes' clients. Background work that reaches drives on several nodes (a cluster group's fill) waits
//! for a quiet moment in it between its steps, so that foreground work preempts it where it runs; a set's
//! own count (`mosaic-erasure`) sees only its own requests.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

tokio::task_local! {
    static FOREGROUND: ();
}

std::thread_local! {
    static THREAD_BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `work` as foreground work: what a client waits for (an S3 connection's requests). A set's reads
/// and writes made in this task count in the node's `ForegroundWork`, and a store that reaches drives
/// on other nodes tells their nodes so; everything else (heal, scans, fills, a node's own upkeep) is
/// background work there, whatever it is. A task spawned from it is not marked, unless it is spawned to do
/// a piece of the request (`carry_request`).
pub async fn in_foreground<F: Future>(work: F) -> F::Output {
    FOREGROUND.scope((), work).await
}

/// Whether the running task does foreground work (`in_foreground`).
pub fn is_foreground() -> bool {
    FOREGROUND.try_with(|_| ()).is_ok()
}

/// Runs `work` on this thread as background work or not (a drive's blocking thread, for the task it works
/// for: background when that task is not `in_foreground`); the thread's mark before is restored after,
/// even when `work` panics. A drive keeps nothing that background work reads among the segments it keeps
/// verified (heal and scans read a whole drive once and would push out what clients read again).
pub fn on_thread_as_background<R>(background: bool, work: impl FnOnce() -> R) -> R {
    crate::scoped::with_thread_value(&THREAD_BACKGROUND, background, work)
}

/// Whether this thread runs background work (`on_thread_as_background`); false outside every mark.
pub fn thread_is_background() -> bool {
    THREAD_BACKGROUND.with(|b| b.get())
}

/// Counts a node's foreground work in flight and remembers when it last began or ended.
#[derive(Debug)]
pub struct ForegroundWork {
    in_flight: AtomicU64,
    /// Foreground work begun since the count was made.
    begun: AtomicU64,
    /// When foreground work last began or ended, as nanoseconds since `epoch` (at least 1); 0: never.
    last_change_ns: AtomicU64,
    epoch: Instant,
}

impl Default for ForegroundWork {
    fn default() -> Self {
        ForegroundWork {
            in_flight: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            last_change_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl ForegroundWork {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn now_ns(&self) -> u64 {
        // A u64 of nanoseconds lasts 584 years of uptime; 0 is kept for "never".
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// Counts one piece of foreground work in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> ForegroundWorkGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.last_change_ns.fetch_max(self.now_ns(), Ordering::Relaxed);
        ForegroundWorkGuard(self.clone())
    }

    /// Foreground work begun since the count was made.
    pub fn begun(&self) -> u64 {
        self.begun.load(Ordering::Relaxed)
    }

    /// Foreground work in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether no foreground work is in flight and none began or ended for `quiet`: a moment in which
    /// background work does not take a share from a load that is merely between two requests.
    pub fn is_quiet(&self, quiet: Duration) -> bool {
        if self.in_flight() > 0 {
            return false;
        }
        match self.last_change_ns.load(Ordering::Relaxed) {
            0 => true,
            last => self.now_ns().saturating_sub(last) >= quiet.as_nanos() as u64,
        }
    }
}

/// One piece of foreground work in flight (see [`ForegroundWork::begin`]).
#[derive(Debug)]
pub struct ForegroundWorkGuard(Arc<ForegroundWork>);

impl Drop for ForegroundWorkGuard {
    fn drop(&mut self) {
        let before = self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "foreground work ended that had not begun");
        self.0.last_change_ns.fetch_max(self.0.now_ns(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn foreground_work_is_marked_only_inside_its_scope() {
        assert!(!is_foreground());
        assert!(in_foreground(async { is_foreground() }).await);
        assert!(!is_foreground());
        let spawned = in_foreground(async { tokio::spawn(async { is_foreground() }).await.unwrap() }).await;
        assert!(!spawned, "a task spawned from foreground work is not marked");
    }

    /// A thread's background mark holds inside its scope only, nested marks restore theirs, and a panic in
    /// the work restores it too.
    #[test]
    fn a_thread_s_background_mark_holds_inside_its_scope() {
        assert!(!thread_is_background());
        assert!(on_thread_as_background(true, thread_is_background));
        assert!(on_thread_as_background(true, || on_thread_as_background(false, || !thread_is_background())
            && thread_is_background()));
        let panicked = std::panic::catch_unwind(|| on_thread_as_background(true, || panic!("work failed")));
        assert!(panicked.is_err());
        assert!(!thread_is_background(), "restored after a panic");
    }

    #[test]
    fn work_in_flight_is_never_quiet_and_its_end_is_not_at_once() {
        let work = ForegroundWork::new();
        assert!(work.is_quiet(Duration::from_secs(3600)), "no work yet: quiet however long one asks");
        let (a, b) = (work.begin(), work.begin());
        assert_eq!((work.in_flight(), work.begun()), (2, 2));
        assert!(!work.is_quiet(Duration::ZERO));
        drop(a);
        assert!(!work.is_quiet(Duration::ZERO), "one still in flight");
        drop(b);
        assert_eq!(work.in_flight(), 0);
        assert!(work.is_quiet(Duration::ZERO));
        assert!(!work.is_quiet(Duration::from_secs(3600)), "work just ended: not quiet for an hour");
    }
}
