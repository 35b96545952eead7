//! Per-object locks of a set: a write holds its objects' locks exclusively from planning until its outcome
//! is decided (committed on a quorum, or undone), and a lookup holds the object's lock shared while it reads
//! the drives' versions, so no reader ever sees a write halfway through its drives. Locks are striped: an
//! object maps to one of a fixed number of locks by a hash of its collection and name. When other processes
//! write the same drives (a cluster's nodes), a write then takes the set's `SharedLocks` too.

use crate::{HeldShared, SetInner, shared_lock_key};
use mosaic_store::{Store, StoreError, StoreResult};
use std::sync::Arc;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Locks of one set. Two objects may share a lock; that only serializes them.
pub(crate) const LOCK_STRIPES: usize = 1024;

pub(crate) struct ObjectLocks {
    stripes: Vec<Arc<RwLock<()>>>,
}

impl Default for ObjectLocks {
    fn default() -> Self {
        ObjectLocks { stripes: (0..LOCK_STRIPES).map(|_| Arc::new(RwLock::new(()))).collect() }
    }
}

/// Held locks of a write.
pub(crate) struct WriteLocks {
    _held: Vec<OwnedRwLockWriteGuard<()>>,
}

/// A write's locks: the set's own, then the shared ones when other processes write the same drives.
pub(crate) struct Exclusive {
    _own: WriteLocks,
    shared: Option<Box<dyn HeldShared>>,
}

impl Exclusive {
    /// Takes the locks of `objects` for a write of `set`.
    pub(crate) async fn take<'a, S: Store>(
        set: &SetInner<S>,
        objects: impl Iterator<Item = (&'a str, &'a [u8])> + Clone,
    ) -> StoreResult<Exclusive> {
        let own = set.locks.write(objects.clone()).await;
        let shared = match &set.cfg.shared_locks {
            Some(locks) => {
                let keys: Vec<u64> = objects.map(|(c, n)| shared_lock_key(c, n)).collect();
                // A transaction of collections only (a bucket made or removed) changes no object to lock.
                if keys.is_empty() { None } else { Some(locks.lock(keys).await?) }
            }
            None => None,
        };
        Ok(Exclusive { _own: own, shared })
    }

    /// Extends the shared locks' lease.
    pub(crate) async fn renew(&mut self) -> StoreResult<()> {
        match &mut self.shared {
            Some(s) => s.renew().await,
            None => Ok(()),
        }
    }

    /// Fails when the shared locks' lease is too short now to begin a commit under them.
    pub(crate) fn check_held(&self) -> StoreResult<()> {
        match &self.shared {
            Some(s) if !s.holds() => {
                Err(StoreError::unavailable("the write took too long to commit under its locks; try again"))
            }
            _ => Ok(()),
        }
    }
}

impl ObjectLocks {
    pub(crate) fn stripe(coll: &str, name: &[u8]) -> usize {
        let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        h.update(coll.as_bytes());
        h.update(&[0]);
        h.update(name);
        h.finalize() as usize % LOCK_STRIPES
    }

    pub(crate) async fn read(&self, coll: &str, name: &[u8]) -> OwnedRwLockReadGuard<()> {
        self.stripes[Self::stripe(coll, name)].clone().read_owned().await
    }

    /// Locks every stripe of `objects` exclusively, in stripe order (so two writes never wait on each
    /// other in a cycle).
    pub(crate) async fn write<'a>(&self, objects: impl Iterator<Item = (&'a str, &'a [u8])>) -> WriteLocks {
        let mut stripes: Vec<usize> = objects.map(|(c, n)| Self::stripe(c, n)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut held = Vec::with_capacity(stripes.len());
        for s in stripes {
            held.push(self.stripes[s].clone().write_owned().await);
        }
        WriteLocks { _held: held }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_exclude_readers_and_share_stripes_safely() {
        let locks = ObjectLocks::default();
        let a = ("b/x", &b"k1"[..]);
        let w = locks.write([a, a].into_iter()).await;
        let pending = tokio::time::timeout(std::time::Duration::from_millis(20), locks.read(a.0, a.1)).await;
        assert!(pending.is_err(), "a reader waits for the write");
        drop(w);
        let _r1 = locks.read(a.0, a.1).await;
        let _r2 = locks.read(a.0, a.1).await;
        assert_ne!(ObjectLocks::stripe("b/x", b"k1"), ObjectLocks::stripe("b/y", b"k1"));
    }
}
