//! IO shares (paper 002's microstores, issue 17): the device IO of a node's drives is divided among
//! microstores by weight. A request runs in its microstore's share (`with_io_share`, set where the request
//! is admitted); a drive's blocking thread carries the share of the request it works for
//! (`on_thread_with_share`); a drive's IO scheduler (`mosaic-engine`) reads it there and, while the device
//! is contended, serves each share in proportion to its weight. Work no microstore asked for (background
//! upkeep, data moves, heal, commands from other nodes) runs in the unshared share, with its own weight.
//!
//! This table is node-wide: the weights the resource manager sets, and what each share was served.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Names a share; the resource manager gives each microstore one.
pub type ShareId = u32;

/// The share of work no microstore asked for.
pub const UNSHARED: ShareId = 0;

/// The share of a drive's own commit pipeline: its IO never waits its turn, since every share's commits
/// wait on it (were it queued behind a busy share, every microstore would wait for that one).
pub const PIPELINE: ShareId = u32::MAX;

/// Most shares a node keeps (a microstore each, plus the unshared one).
pub const MAX_SHARES: usize = 1_024;

/// Largest weight of a share (so that virtual-time arithmetic cannot overflow).
pub const MAX_WEIGHT: u32 = 1 << 20;

tokio::task_local! {
    static TASK_SHARE: ShareId;
}

thread_local! {
    static THREAD_SHARE: Cell<ShareId> = const { Cell::new(UNSHARED) };
}

/// The share of the microstore named `name`: the same on every node (a cluster's nodes schedule the
/// commands they run for each other's requests by it), never `UNSHARED`. FNV-1a of the name; two names
/// of one node that hash alike are the caller's to tell apart (`mosaic-microstore` leaves the second
/// unshared). Never `PIPELINE` either.
pub fn share_id_of(name: &str) -> ShareId {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    match h {
        UNSHARED => 1,
        PIPELINE => PIPELINE - 1,
        h => h,
    }
}

/// Runs `work` in `share`: the drive IO it causes is counted and scheduled there. A task spawned from it
/// is not in the share unless it is run with `with_io_share` again.
pub async fn with_io_share<F: Future>(share: ShareId, work: F) -> F::Output {
    TASK_SHARE.scope(share, work).await
}

/// Runs `work` as part of the running task's request: foreground work if the task is (`in_foreground`), in
/// its IO share. For a task spawned to do a piece of a request (a PUT's staging), which would otherwise
/// run as no request's.
pub fn carry_request<F: Future>(work: F) -> impl Future<Output = F::Output> {
    carry_request_as(crate::is_foreground(), io_share(), work)
}

/// Runs `work` in `share`, as foreground work when `foreground`.
pub(crate) async fn carry_request_as<F: Future>(foreground: bool, share: ShareId, work: F) -> F::Output {
    let work = with_io_share(share, work);
    if foreground { crate::in_foreground(work).await } else { work.await }
}

/// Runs a synchronous step of a task (a poll of a response body) in `share`.
pub fn with_io_share_sync<R>(share: ShareId, step: impl FnOnce() -> R) -> R {
    TASK_SHARE.sync_scope(share, step)
}

/// The share of the running task (`UNSHARED` outside every `with_io_share`).
pub fn io_share() -> ShareId {
    TASK_SHARE.try_with(|s| *s).unwrap_or(UNSHARED)
}

/// Runs `work` on this thread in `share` (a drive's blocking thread, for the request it works for); the
/// thread's share before is restored after, even when `work` panics.
pub fn on_thread_with_share<R>(share: ShareId, work: impl FnOnce() -> R) -> R {
    crate::scoped::with_thread_value(&THREAD_SHARE, share, work)
}

/// The share this thread works in (`UNSHARED` outside every `on_thread_with_share`).
pub fn thread_io_share() -> ShareId {
    THREAD_SHARE.with(|s| s.get())
}

/// One share's weight and what it was served.
#[derive(Debug)]
pub struct ShareEntry {
    weight: AtomicU32,
    served_bytes: AtomicU64,
    served_ios: AtomicU64,
    /// IOs that waited their turn behind other IO of the device.
    waited_ios: AtomicU64,
    wait_us: AtomicU64,
}

impl ShareEntry {
    fn new(weight: u32) -> ShareEntry {
        ShareEntry {
            weight: AtomicU32::new(weight),
            served_bytes: AtomicU64::new(0),
            served_ios: AtomicU64::new(0),
            waited_ios: AtomicU64::new(0),
            wait_us: AtomicU64::new(0),
        }
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Counts one IO served in the share, and how long it waited for its turn (None: it did not).
    pub fn record(&self, bytes: u64, waited_us: Option<u64>) {
        self.served_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.served_ios.fetch_add(1, Ordering::Relaxed);
        if let Some(us) = waited_us {
            self.waited_ios.fetch_add(1, Ordering::Relaxed);
            self.wait_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> ShareStats {
        ShareStats {
            weight: self.weight(),
            served_bytes: self.served_bytes.load(Ordering::Relaxed),
            served_ios: self.served_ios.load(Ordering::Relaxed),
            waited_ios: self.waited_ios.load(Ordering::Relaxed),
            wait_us: self.wait_us.load(Ordering::Relaxed),
        }
    }
}

/// A share's weight and its counters since the node started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareStats {
    pub weight: u32,
    pub served_bytes: u64,
    pub served_ios: u64,
    pub waited_ios: u64,
    pub wait_us: u64,
}

/// The node's shares: their weights and counters, and whether drives schedule by them at all.
#[derive(Debug)]
pub struct IoShares {
    /// Off (one microstore, or shares turned off): drives pass IO straight through.
    active: AtomicBool,
    /// Device bytes a drive lets be in flight before IO waits its turn.
    in_flight_max_bytes: u64,
    shares: RwLock<HashMap<ShareId, Arc<ShareEntry>>>,
}

impl IoShares {
    /// A table holding the unshared share at `unshared_weight`; inactive until told otherwise.
    pub fn new(in_flight_max_bytes: u64, unshared_weight: u32) -> Arc<IoShares> {
        assert!(in_flight_max_bytes > 0, "a drive lets some IO be in flight");
        let shares = HashMap::from([(UNSHARED, Arc::new(ShareEntry::new(unshared_weight.clamp(1, MAX_WEIGHT))))]);
        Arc::new(IoShares { active: AtomicBool::new(false), in_flight_max_bytes, shares: RwLock::new(shares) })
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    pub fn set_active(&self, active: bool) {
        self.active.store(active, Ordering::Release);
    }

    pub fn in_flight_max_bytes(&self) -> u64 {
        self.in_flight_max_bytes
    }

    /// Sets a share's weight (1 to `MAX_WEIGHT`), adding the share when it is new. Err: the table is full.
    pub fn set_weight(&self, share: ShareId, weight: u32) -> Result<(), String> {
        let weight = weight.clamp(1, MAX_WEIGHT);
        let mut shares = self.shares.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = shares.get(&share) {
            e.weight.store(weight, Ordering::Relaxed);
            return Ok(());
        }
        if shares.len() >= MAX_SHARES {
            return Err(format!("a node keeps at most {MAX_SHARES} IO shares"));
        }
        shares.insert(share, Arc::new(ShareEntry::new(weight)));
        Ok(())
    }

    /// Forgets a share (its IO after this counts in the unshared one). The unshared share stays.
    pub fn remove(&self, share: ShareId) {
        if share != UNSHARED {
            self.shares.write().unwrap_or_else(|e| e.into_inner()).remove(&share);
        }
    }

    /// The share's entry; a share the table does not know is served as the unshared one.
    pub fn entry(&self, share: ShareId) -> Arc<ShareEntry> {
        self.resolve(share).1
    }

    /// The share IO of `share` is served as (itself, or the unshared one when the table does not know it:
    /// an id from another node's request is not trusted to name a share) and its entry.
    pub fn resolve(&self, share: ShareId) -> (ShareId, Arc<ShareEntry>) {
        let shares = self.shares.read().unwrap_or_else(|e| e.into_inner());
        match shares.get(&share) {
            Some(e) => (share, e.clone()),
            None => (UNSHARED, shares.get(&UNSHARED).expect("the unshared share is always kept").clone()),
        }
    }

    pub fn stats(&self, share: ShareId) -> Option<ShareStats> {
        self.shares.read().unwrap_or_else(|e| e.into_inner()).get(&share).map(|e| e.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_share_is_the_task_s_inside_its_scope_and_the_thread_s_inside_its_own() {
        assert_eq!(io_share(), UNSHARED);
        assert_eq!(with_io_share(7, async { io_share() }).await, 7);
        assert_eq!(with_io_share_sync(9, io_share), 9);
        let spawned = with_io_share(7, async { tokio::spawn(async { io_share() }).await.unwrap() }).await;
        assert_eq!(spawned, UNSHARED, "a spawned task is not in the share");
        let probe = || async { (io_share(), crate::is_foreground()) };
        let carried =
            crate::in_foreground(with_io_share(7, async { tokio::spawn(carry_request(probe())).await.unwrap() })).await;
        assert_eq!(carried, (7, true), "carried into a spawned task: the share and the foreground mark");
        let carried = with_io_share(8, async { tokio::spawn(carry_request(probe())).await.unwrap() }).await;
        assert_eq!(carried, (8, false), "not foreground where the request was not");
        assert_eq!(on_thread_with_share(5, thread_io_share), 5);
        assert_eq!(thread_io_share(), UNSHARED, "restored");
        let panicked = std::panic::catch_unwind(|| on_thread_with_share(5, || panic!("work failed")));
        assert!(panicked.is_err());
        assert_eq!(thread_io_share(), UNSHARED, "restored after a panic");
    }

    #[test]
    fn a_name_s_share_is_stable_and_never_the_unshared_one() {
        // Pinned: nodes of different builds must agree.
        assert_eq!(share_id_of("default"), 0x933b_5bde);
        assert_eq!(share_id_of(""), 0x811c_9dc5);
        assert_ne!(share_id_of("small"), share_id_of("large"));
        assert!((0..10_000).map(|i| share_id_of(&format!("m{i}"))).all(|id| id != UNSHARED && id != PIPELINE));
    }

    #[test]
    fn weights_are_bounded_unknown_shares_count_as_unshared_and_the_table_is_bounded() {
        let t = IoShares::new(1 << 20, 10);
        assert!(!t.is_active());
        t.set_weight(3, 0).unwrap();
        assert_eq!(t.entry(3).weight(), 1, "at least 1");
        t.set_weight(3, u32::MAX).unwrap();
        assert_eq!(t.entry(3).weight(), MAX_WEIGHT);
        assert_eq!(t.entry(4).weight(), 10, "an unknown share is served as the unshared one");
        assert_eq!(t.resolve(4).0, UNSHARED);
        assert_eq!(t.resolve(3).0, 3);
        t.entry(4).record(4096, Some(3));
        assert_eq!(t.stats(UNSHARED).unwrap().served_bytes, 4096);
        assert_eq!(t.stats(UNSHARED).unwrap().waited_ios, 1);
        t.remove(3);
        t.remove(UNSHARED);
        assert!(t.stats(3).is_none());
        assert!(t.stats(UNSHARED).is_some(), "the unshared share stays");
        for s in 1..MAX_SHARES as u32 {
            t.set_weight(s, 1).unwrap();
        }
        assert!(t.set_weight(MAX_SHARES as u32, 1).is_err(), "past the limit");
        t.set_weight(1, 2).unwrap();
        assert_eq!(t.entry(1).weight(), 2, "a known share's weight changes at the limit");
    }
}
