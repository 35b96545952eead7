//! A microstore's request workers: a bound on the requests it serves at once (the load redirector admits a
//! request into its bucket's microstore's pool, or makes it wait there), resizable while requests run.
//! Waiting is bounded in count and in time: past either the request is refused (S3's SlowDown), never hung.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::histogram::Histogram;
use crate::pacer::Pacer;

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// As many requests wait as the pool allows.
    QueueFull,
    /// It waited the longest a request may wait.
    TimedOut,
}

/// What a pool's requests did since the last round.
#[derive(Clone, Debug, Default)]
pub struct RoundStats {
    pub requests: u64,
    pub bytes: u64,
    pub latency_us: Histogram,
    /// Sum of the time requests held a worker.
    pub busy_us: u64,
    /// Requests that had to wait for a worker (more workers would have served them sooner).
    pub waited: u64,
}

pub struct WorkerPool {
    semaphore: Arc<Semaphore>,
    /// Workers the pool is meant to have; the semaphore catches up as held permits come back.
    workers: AtomicU32,
    /// Permits still to be forgotten as they come back (a shrink while they were held).
    debt: AtomicU32,
    waiting: AtomicU32,
    max_waiting: u32,
    max_wait: Duration,
    in_use: AtomicU32,
    refused: AtomicU64,
    round: Mutex<RoundStats>,
    pacer: Arc<Pacer>,
}

/// A request admitted into a pool: holds one worker until dropped.
pub struct Admission {
    pool: Arc<WorkerPool>,
    permit: Option<OwnedSemaphorePermit>,
    /// The IO share the request runs in (its microstore's).
    io_share: mosaic_store::ShareId,
}

impl WorkerPool {
    pub fn new(workers: u32, max_waiting: u32, max_wait: Duration) -> Arc<WorkerPool> {
        assert!(workers > 0, "a pool has at least one worker");
        Arc::new(WorkerPool {
            semaphore: Arc::new(Semaphore::new(workers as usize)),
            workers: AtomicU32::new(workers),
            debt: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            max_waiting,
            max_wait,
            in_use: AtomicU32::new(0),
            refused: AtomicU64::new(0),
            round: Mutex::new(RoundStats::default()),
            pacer: Arc::new(Pacer::default()),
        })
    }

    pub fn workers(&self) -> u32 {
        self.workers.load(Ordering::Acquire)
    }

    pub fn in_use(&self) -> u32 {
        self.in_use.load(Ordering::Acquire)
    }

    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Acquire)
    }

    /// Sets the number of workers: more at once; fewer as soon as that many are idle (those held now are
    /// forgotten as they come back). Calls are serialized by the caller (the round task).
    pub fn resize(&self, workers: u32) {
        assert!(workers > 0, "a pool has at least one worker");
        let now = self.workers.swap(workers, Ordering::AcqRel);
        if workers > now {
            let mut add = workers - now;
            // Cancel debt first: permits still out need not be forgotten any more.
            while add > 0 {
                let debt = self.debt.load(Ordering::Acquire);
                if debt == 0 {
                    break;
                }
                let cancel = debt.min(add);
                if self.debt.compare_exchange(debt, debt - cancel, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    add -= cancel;
                }
            }
            self.semaphore.add_permits(add as usize);
        } else if workers < now {
            let cut = now - workers;
            let forgotten = self.semaphore.forget_permits(cut as usize) as u32;
            self.debt.fetch_add(cut - forgotten, Ordering::AcqRel);
        }
    }

    /// Waits for a worker (bounded in count and in time).
    pub async fn admit(self: &Arc<Self>) -> Result<Admission, Refused> {
        if let Ok(permit) = self.semaphore.clone().try_acquire_owned() {
            return Ok(self.admitted(permit));
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::QueueFull);
        }
        self.round.lock().waited += 1;
        let got = tokio::time::timeout(self.max_wait, self.semaphore.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match got {
            Ok(Ok(permit)) => Ok(self.admitted(permit)),
            // The semaphore is never closed; a timeout is the only way out.
            _ => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Refused::TimedOut)
            }
        }
    }

    fn admitted(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Admission {
        self.in_use.fetch_add(1, Ordering::AcqRel);
        Admission { pool: self.clone(), permit: Some(permit), io_share: mosaic_store::UNSHARED }
    }

    /// The pace of the pool's object bytes (unlimited unless the resource manager capped it).
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    /// The stats since the last call.
    pub fn take_round(&self) -> RoundStats {
        std::mem::take(&mut *self.round.lock())
    }
}

impl Admission {
    /// The admission running in `share`.
    pub fn in_io_share(mut self, share: mosaic_store::ShareId) -> Admission {
        self.io_share = share;
        self
    }

    /// The IO share the request runs in.
    pub fn io_share(&self) -> mosaic_store::ShareId {
        self.io_share
    }

    /// The pacer its bodies must follow, when its microstore's bandwidth is capped now.
    pub fn pacer(&self) -> Option<Arc<Pacer>> {
        self.pool.pacer.rate_bytes_per_s().map(|_| self.pool.pacer.clone())
    }

    /// Counts the request in its pool's round (call once, when it is done).
    pub fn finish(&self, bytes: u64, latency_us: u64) {
        let mut r = self.pool.round.lock();
        r.requests += 1;
        r.bytes = r.bytes.saturating_add(bytes);
        r.latency_us.record(latency_us);
        r.busy_us = r.busy_us.saturating_add(latency_us);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.pool.in_use.fetch_sub(1, Ordering::AcqRel);
        let Some(permit) = self.permit.take() else { return };
        // Pay a shrink's debt with this permit rather than give it back.
        let mut debt = self.pool.debt.load(Ordering::Acquire);
        while debt > 0 {
            match self.pool.debt.compare_exchange(debt, debt - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    permit.forget();
                    return;
                }
                Err(d) => debt = d,
            }
        }
        drop(permit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(workers: u32, max_waiting: u32) -> Arc<WorkerPool> {
        WorkerPool::new(workers, max_waiting, Duration::from_secs(3_600))
    }

    #[tokio::test]
    async fn a_pool_admits_as_many_as_it_has_workers_then_queues_then_refuses() {
        let p = pool(2, 1);
        let a = p.admit().await.unwrap();
        let _b = p.admit().await.unwrap();
        assert_eq!(p.in_use(), 2);
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { p2.admit().await.map(|_| ()) });
        while p.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(p.admit().await.err(), Some(Refused::QueueFull));
        assert_eq!(p.refused(), 1);
        drop(a);
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_bounded_in_time() {
        let p = WorkerPool::new(1, 10, Duration::from_millis(50));
        let _a = p.admit().await.unwrap();
        assert_eq!(p.admit().await.err(), Some(Refused::TimedOut));
    }

    #[tokio::test]
    async fn a_shrink_takes_effect_as_held_workers_come_back_and_a_grow_cancels_it() {
        let p = pool(3, 10);
        let held: Vec<_> = [p.admit().await.unwrap(), p.admit().await.unwrap()].into();
        p.resize(1);
        // One idle permit is forgotten at once; the two held are one too many.
        assert_eq!(p.semaphore.available_permits(), 0);
        drop(held);
        assert_eq!(p.semaphore.available_permits(), 1);
        let _a = p.admit().await.unwrap();
        assert!(p.semaphore.clone().try_acquire_owned().is_err());
        let b = p.clone();
        drop(_a);
        let held: Vec<_> = [b.admit().await.unwrap()].into();
        p.resize(4);
        assert_eq!(p.semaphore.available_permits(), 3);
        p.resize(2);
        drop(held);
        assert_eq!(p.semaphore.available_permits(), 2);
        p.resize(3);
        assert_eq!(p.semaphore.available_permits(), 3);
        assert_eq!(p.workers(), 3);
    }

    #[tokio::test]
    async fn finished_requests_are_counted_in_the_round() {
        let p = pool(1, 1);
        let a = p.admit().await.unwrap();
        a.finish(100, 2_000);
        drop(a);
        let r = p.take_round();
        assert_eq!((r.requests, r.bytes, r.busy_us), (1, 100, 2_000));
        assert_eq!(p.take_round().requests, 0);
    }
}
