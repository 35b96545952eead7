//! Locks held across processes that write the same storage (a cluster's nodes): a store's own locks, and
//! the S3 layer's, order only the writers of one process.

use crate::StoreResult;
use std::future::Future;
use std::pin::Pin;

/// A boxed future that may move between threads.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Locks on keys (hashes of what is locked; each user hashes its own names) held by one writer among all
/// the processes that share them.
pub trait SharedLocks: Send + Sync + 'static {
    /// Holds `keys` until the answer is dropped; fails (unavailable) when they cannot be had in time.
    fn lock(&self, keys: Vec<u64>) -> BoxFuture<'_, StoreResult<Box<dyn HeldShared>>>;
}

/// Shared locks held.
pub trait HeldShared: Send + Sync {
    /// Whether a commit may still begin under them (their lease has time enough left).
    fn holds(&self) -> bool;
    /// Extends their lease (a long heal); fails when they are no longer certainly held.
    fn renew(&mut self) -> BoxFuture<'_, StoreResult<()>>;
}

impl std::fmt::Debug for dyn SharedLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedLocks")
    }
}
