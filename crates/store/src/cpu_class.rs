//! CPU classes (paper 002's microstores, with paper 003's QoS carried to the cores): a microstore that is
//! judged on throughput (large objects) beside one judged on latency runs its requests' heavy CPU work
//! (hashing a body, erasure coding, a drive's calls) on threads of a lower CPU priority (a higher nice).
//! While the cores are contended the kernel then runs the latency class's work first, and the bulk class
//! takes what is left; alone, the bulk class has every core.
//!
//! Measured on this 2-core machine (docs/bench/2026-12-07-bulk-cpu.md): the small-object tenant's
//! latency is spent waiting for the cores (MD5 of the large tenant's bodies was a third of the server's
//! CPU), not for the disk: the kernel's idle IO class for the large tenant changed nothing measurable.
//!
//! The bulk threads are a runtime of their own, started at the bulk nice and never changed back: lowering
//! a thread's nice again needs a privilege a server may not have (RLIMIT_NICE), so a thread is never moved
//! between classes. Which shares are bulk is node-wide: set by the microstores' planner. A bulk request
//! runs whole on the runtime's async threads (`run_in_class`: its body's hashing, copies into staging
//! buffers, its S3 logic), and its blocking work (erasure coding, drive calls) on the runtime's blocking
//! threads (`spawn_blocking_in`), so its work needs no hop per piece to leave the latency class's threads.
//!
//! Background work (heal, scans, lazy encoding, a cluster's fills: whatever no client waits for, that is
//! not `in_foreground`) runs its blocking work (drive calls, decoding) on the same low-priority threads
//! (`set_background_cpu_class`, on by default): paper 003's foreground-preempts-background carried from the
//! drives' IO (the kernel's idle IO class) to the cores.

use crate::io_share::{MAX_SHARES, ShareId};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

/// Highest nice a bulk thread may have (the kernel's lowest priority).
pub const MAX_BULK_NICE: i32 = 19;

/// Most blocking threads of the bulk class at once; work past it waits for a thread.
pub const BULK_THREADS_MAX: usize = 128;

/// Most async threads of the bulk class (one per core up to it).
const BULK_ASYNC_THREADS_MAX: usize = 64;

std::thread_local! {
    static ON_BULK_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

static BULK_SHARES: RwLock<BTreeSet<ShareId>> = RwLock::new(BTreeSet::new());
/// Whether any share is bulk (the fast path of every call while none is).
static ANY_BULK: AtomicBool = AtomicBool::new(false);
static BULK_NICE: AtomicI32 = AtomicI32::new(10);
static BULK_POOL: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
/// Work run on bulk threads since the process started.
static BULK_TASKS: AtomicU64 = AtomicU64::new(0);
/// Connections served on the bulk class's runtime since the process started (`bulk_runtime`).
static BULK_CONNECTIONS: AtomicU64 = AtomicU64::new(0);
/// Whether background work's blocking work runs in the bulk class (`set_background_cpu_class`).
static BACKGROUND_IN_BULK: AtomicBool = AtomicBool::new(true);

/// The nice of the bulk class's threads (1 to `MAX_BULK_NICE`); takes effect only before the first bulk
/// work (the threads keep the nice they started with). Err: out of range.
pub fn set_bulk_nice(nice: i32) -> Result<(), String> {
    if !(1..=MAX_BULK_NICE).contains(&nice) {
        return Err(format!("the bulk nice is 1 to {MAX_BULK_NICE}, not {nice}"));
    }
    BULK_NICE.store(nice, Ordering::Relaxed);
    Ok(())
}

/// The shares whose heavy CPU work runs in the bulk class: exactly these from now on (at most
/// `MAX_SHARES`; more are refused, and the set stays as it was).
pub fn set_bulk_shares(shares: impl IntoIterator<Item = ShareId>) -> Result<(), String> {
    let new: BTreeSet<ShareId> = shares.into_iter().collect();
    if new.len() > MAX_SHARES {
        return Err(format!("at most {MAX_SHARES} bulk shares, not {}", new.len()));
    }
    let mut set = BULK_SHARES.write().unwrap_or_else(|e| e.into_inner());
    ANY_BULK.store(!new.is_empty(), Ordering::Release);
    *set = new;
    Ok(())
}

/// Whether any share's heavy CPU work runs in the bulk class.
pub fn any_bulk() -> bool {
    ANY_BULK.load(Ordering::Acquire)
}

/// Whether `share`'s heavy CPU work runs in the bulk class.
pub fn is_bulk(share: ShareId) -> bool {
    ANY_BULK.load(Ordering::Acquire) && BULK_SHARES.read().unwrap_or_else(|e| e.into_inner()).contains(&share)
}

/// Whether background work's blocking work (that of tasks not `in_foreground`) runs on the bulk class's
/// threads, at the bulk nice (`true`, the default), or at the default priority beside clients' work
/// (`false`: the configuration's `background_cpu_class = false`, and the ablation).
pub fn set_background_cpu_class(on: bool) {
    BACKGROUND_IN_BULK.store(on, Ordering::Relaxed);
}

/// Runs blocking `work` for the running task, in `share`'s CPU class: on a bulk thread when the share is
/// bulk, or when the task does background work (not `in_foreground`) and the background class is on (and
/// the pool could start); else on the running runtime's blocking pool, as `tokio::task::spawn_blocking`.
pub fn spawn_blocking_in<R: Send + 'static>(
    share: ShareId,
    work: impl FnOnce() -> R + Send + 'static,
) -> tokio::task::JoinHandle<R> {
    let background = BACKGROUND_IN_BULK.load(Ordering::Relaxed) && !crate::is_foreground();
    match (is_bulk(share) || background).then(bulk_pool).flatten() {
        Some(pool) => {
            BULK_TASKS.fetch_add(1, Ordering::Relaxed);
            pool.spawn_blocking(work)
        }
        None => tokio::task::spawn_blocking(work),
    }
}

/// Whether this thread is one of the bulk class's (its work already runs at the bulk nice).
pub fn on_bulk_thread() -> bool {
    ON_BULK_THREAD.with(|b| b.get())
}

/// Runs a request's `work` in its CPU class, in `share` and as foreground work if the caller is: on the
/// bulk class's async threads when the share is bulk (and the class could start), else on the caller's
/// task. A caller on a bulk thread already (a connection served whole in the bulk class, `bulk_runtime`)
/// runs bulk work on its own task and hands other work to `home`, the runtime the connection came from, so
/// that a latency class's request never runs at the bulk nice. Dropping the returned future (a client
/// gone) stops the work, as it would on the caller's task. Err: the work panicked on another runtime.
pub async fn run_in_class<F>(
    share: ShareId,
    home: Option<&tokio::runtime::Handle>,
    work: F,
) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let bulk = is_bulk(share);
    if on_bulk_thread() {
        if bulk {
            BULK_TASKS.fetch_add(1, Ordering::Relaxed);
            return Ok(crate::with_io_share(share, work).await);
        }
        if let Some(home) = home {
            return spawn_carried(home, share, work).await;
        }
    }
    let Some(pool) = bulk.then(bulk_pool).flatten() else {
        // On the caller's task, which keeps its own foreground mark: only the share is set.
        return Ok(crate::with_io_share(share, work).await);
    };
    BULK_TASKS.fetch_add(1, Ordering::Relaxed);
    spawn_carried(pool.handle(), share, work).await
}

/// Runs `work` as a task on `runtime`, carrying the caller's foreground mark and `share` (a spawned task
/// starts unmarked); aborted when the returned future is dropped.
async fn spawn_carried<F>(runtime: &tokio::runtime::Handle, share: ShareId, work: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let work = crate::io_share::carry_request_as(crate::is_foreground(), share, work);
    AbortOnDrop(runtime.spawn(work)).await
}

/// The bulk class's runtime when `share` is bulk (and the class could start): a connection whose first
/// request is the share's is served whole there, so that its socket IO, its bodies' hashing and its S3
/// logic run at the bulk nice with no hand-over between runtimes per request or per body chunk (measured:
/// docs/bench/2026-12-07-bulk-connections.md).
pub fn bulk_runtime(share: ShareId) -> Option<tokio::runtime::Handle> {
    let runtime = is_bulk(share).then(bulk_pool).flatten()?;
    BULK_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    Some(runtime.handle().clone())
}

/// Connections handed to the bulk class's runtime since the process started.
pub fn bulk_connections_total() -> u64 {
    BULK_CONNECTIONS.load(Ordering::Relaxed)
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<R>(tokio::task::JoinHandle<R>);

impl<R> Future for AbortOnDrop<R> {
    type Output = Result<R, String>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|r| r.map_err(|e| format!("a bulk task failed: {e}")))
    }
}

impl<R> Drop for AbortOnDrop<R> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Pieces of work run on bulk threads since the process started.
pub fn bulk_tasks_total() -> u64 {
    BULK_TASKS.load(Ordering::Relaxed)
}

/// The bulk class's pool, started at the first bulk work (None: it could not start; the work then runs
/// in the common pool, at the default priority).
fn bulk_pool() -> Option<&'static tokio::runtime::Runtime> {
    BULK_POOL
        .get_or_init(|| {
            let nice = BULK_NICE.load(Ordering::Relaxed);
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let built = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores.clamp(1, BULK_ASYNC_THREADS_MAX))
                .max_blocking_threads(BULK_THREADS_MAX)
                .thread_name("mosaic-bulk")
                .enable_all()
                .on_thread_start(move || {
                    ON_BULK_THREAD.with(|b| b.set(true));
                    set_this_thread_nice(nice)
                })
                .build();
            match built {
                Ok(rt) => Some(rt),
                Err(e) => {
                    tracing::warn!(error = %e, "the bulk CPU class could not start: bulk work runs at the default priority");
                    None
                }
            }
        })
        .as_ref()
}

/// Raises this thread's nice to `nice` (always allowed: it only lowers the thread's priority). A kernel
/// that refuses leaves it as it was (the class is a hint).
fn set_this_thread_nice(nice: i32) {
    // SAFETY: plain system calls with integer arguments; gettid cannot fail.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "a bulk thread keeps the default priority");
    }
}

/// This thread's nice (for tests).
#[cfg(test)]
fn this_thread_nice() -> i32 {
    // SAFETY: as above. getpriority's -1 is also a nice; errno is not consulted (the call cannot fail for
    // the calling thread).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bulk shares' work and background work run on bulk threads at the bulk nice, clients' work of
    /// other shares at the default; the set is replaced whole and bounded. (One test: the classes are
    /// process-wide.)
    #[tokio::test]
    async fn a_bulk_share_s_work_runs_at_the_bulk_nice_and_others_at_the_default() {
        let default = this_thread_nice();
        let probe = || (this_thread_nice(), std::thread::current().name().map(str::to_string));
        // A client's work, in the foreground (the task is marked before the call: the class is chosen there).
        let client = |share| crate::in_foreground(async move { spawn_blocking_in(share, this_thread_nice).await });
        set_background_cpu_class(false);
        assert_eq!(spawn_blocking_in(7, probe).await.unwrap().0, default, "no share is bulk, no background class");
        assert!(set_bulk_nice(0).is_err() && set_bulk_nice(MAX_BULK_NICE + 1).is_err());
        set_bulk_nice(MAX_BULK_NICE).unwrap();
        assert_eq!(client(7).await.unwrap(), default, "no share is bulk");
        set_background_cpu_class(true);
        let before = bulk_tasks_total();
        let (nice, name) = spawn_blocking_in(7, probe).await.unwrap();
        assert_eq!((nice, name.as_deref()), (MAX_BULK_NICE, Some("mosaic-bulk")), "background work: bulk");
        assert_eq!(bulk_tasks_total(), before + 1, "counted");
        assert_eq!(client(7).await.unwrap(), default, "a client's work of a share that is not bulk");
        set_bulk_shares([7, 9]).unwrap();
        assert!(is_bulk(7) && is_bulk(9) && !is_bulk(8));
        let (nice, name) = crate::in_foreground(async { spawn_blocking_in(7, probe).await }).await.unwrap();
        assert_eq!(bulk_tasks_total(), before + 2, "counted");
        assert_eq!(nice, MAX_BULK_NICE);
        assert_eq!(name.as_deref(), Some("mosaic-bulk"));
        assert_eq!(client(8).await.unwrap(), default, "not bulk: the default");
        // A bulk share's request runs whole on a bulk thread, in its share, foreground if its caller is.
        let marks = || async { (on_bulk_thread(), this_thread_nice(), crate::io_share(), crate::is_foreground()) };
        let seen = crate::in_foreground(run_in_class(7, None, marks())).await.unwrap();
        assert_eq!(seen, (true, MAX_BULK_NICE, 7, true));
        assert_eq!(run_in_class(7, None, marks()).await.unwrap(), (true, MAX_BULK_NICE, 7, false));
        assert_eq!(run_in_class(8, None, marks()).await.unwrap(), (false, default, 8, false), "not bulk: here");
        assert!(!on_bulk_thread(), "the caller's thread is not a bulk one");
        // A connection served whole on the bulk runtime: its bulk requests run on its own task (no hop),
        // another share's go home, to the default priority, and stay here only without a home.
        let connections = bulk_connections_total();
        let bulk_rt = bulk_runtime(7).expect("7 is bulk");
        assert!(bulk_runtime(8).is_none(), "8 is not bulk");
        assert_eq!(bulk_connections_total(), connections + 1);
        let home = tokio::runtime::Handle::current();
        let marks = || async { (on_bulk_thread(), this_thread_nice(), crate::io_share(), crate::is_foreground()) };
        let on_connection = bulk_rt.spawn(crate::in_foreground(async move {
            let own = run_in_class(7, Some(&home), async move { (tokio::task::try_id(), marks().await) });
            let (task, own) = own.await.unwrap();
            let here = tokio::task::try_id();
            let other = run_in_class(8, Some(&home), marks()).await.unwrap();
            let homeless = run_in_class(8, None, marks()).await.unwrap();
            (task == here, own, other, homeless)
        }));
        let (same_task, own, other, homeless) = on_connection.await.unwrap();
        assert!(same_task, "a bulk request on a bulk connection runs on its task");
        assert_eq!(own, (true, MAX_BULK_NICE, 7, true));
        assert_eq!(other, (false, default, 8, true), "another share's request runs at home, foreground");
        assert_eq!(homeless, (true, MAX_BULK_NICE, 8, true), "without a home it stays");
        assert!(run_in_class(7, None, async { panic!("a request's bug") }).await.is_err(), "a panic is an error");
        // Dropped (a client gone): the work stops.
        let (held, gone) = tokio::sync::oneshot::channel::<()>();
        let (begun, has_begun) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(run_in_class(7, None, async move {
            let _held = held;
            let _ = begun.send(());
            std::future::pending::<()>().await
        }));
        has_begun.await.unwrap();
        running.abort();
        assert!(gone.await.is_err(), "the work was dropped with its request");
        // Many at once: each on a bulk thread, none lost past the pool's bound.
        let many: Vec<_> = (0..BULK_THREADS_MAX + 10).map(|_| spawn_blocking_in(9, this_thread_nice)).collect();
        for h in many {
            assert_eq!(h.await.unwrap(), MAX_BULK_NICE);
        }
        set_bulk_shares([8]).unwrap();
        assert!(!is_bulk(7) && is_bulk(8), "replaced whole");
        assert!(set_bulk_shares(0..=MAX_SHARES as u32).is_err(), "past the bound");
        assert!(is_bulk(8), "a refused set leaves it as it was");
        set_bulk_shares([]).unwrap();
        assert!(!is_bulk(8));
        assert_eq!(this_thread_nice(), default, "the caller's thread is never changed");
    }
}
