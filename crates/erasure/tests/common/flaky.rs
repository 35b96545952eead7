//! A drive that fails chosen kinds of calls on demand, as a drive reached over the network does while its
//! node is away: for tests of what a set makes of answers that come and go.

use async_trait::async_trait;
use bytes::Bytes;
use mosaic_store::{
    AlignedBuf, Geometry, NameEntry, ObjectInfo, Outcome, PriorityHold, Snapshot, Store, StoreError, StoreResult, Txn,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Which calls fail now.
#[derive(Default)]
pub struct Faults {
    pub collections: AtomicBool,
    pub lookups: AtomicBool,
    /// Commits fail before they reach the drive.
    pub commits: AtomicBool,
    /// Commits that reached the drive.
    pub committed: AtomicU64,
}

impl Faults {
    fn check(flag: &AtomicBool, what: &str) -> StoreResult<()> {
        match flag.load(Ordering::SeqCst) {
            true => Err(StoreError::unavailable(format!("the drive failed a {what} (on purpose)"))),
            false => Ok(()),
        }
    }
}

pub struct Flaky<S> {
    pub inner: Arc<S>,
    pub faults: Arc<Faults>,
}

pub struct FlakySnapshot<S: Store> {
    inner: S::Snapshot,
    faults: Arc<Faults>,
}

#[async_trait]
impl<S: Store> Snapshot for FlakySnapshot<S> {
    type Coll = S::Coll;
    type Obj = S::Obj;

    async fn collection(&self, name: &str) -> StoreResult<Option<S::Coll>> {
        Faults::check(&self.faults.collections, "collection lookup")?;
        self.inner.collection(name).await
    }
    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, S::Coll)>> {
        Faults::check(&self.faults.collections, "collection listing")?;
        self.inner.collections(prefix, limit).await
    }
    async fn lookup(&self, coll: &S::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<S::Obj>>> {
        Faults::check(&self.faults.lookups, "lookup")?;
        self.inner.lookup(coll, name).await
    }
    async fn attr(&self, obj: &S::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.inner.attr(obj, key).await
    }
    async fn attrs(&self, obj: &S::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.attrs(obj, start_after, limit).await
    }
    async fn list_entries(
        &self,
        coll: &S::Coll,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<S::Obj>>> {
        self.inner.list_entries(coll, prefix, from, limit).await
    }
    async fn stat_many(
        &self,
        objs: &[S::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<S::Obj>, Option<Vec<u8>>)>> {
        self.inner.stat_many(objs, attr_key).await
    }
    async fn read(&self, obj: &S::Obj, offset: u64, len: u64) -> StoreResult<Bytes> {
        self.inner.read(obj, offset, len).await
    }
    fn prioritize(&self) {
        self.inner.prioritize()
    }
}

#[async_trait]
impl<S: Store> Store for Flaky<S> {
    type Coll = S::Coll;
    type Obj = S::Obj;
    type Staged = S::Staged;
    type Snapshot = FlakySnapshot<S>;

    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn snapshot(&self) -> FlakySnapshot<S> {
        FlakySnapshot { inner: self.inner.snapshot(), faults: self.faults.clone() }
    }
    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(S::Staged, AlignedBuf)> {
        self.inner.stage(buf, len_bytes, hint).await
    }
    async fn commit(&self, txn: Txn<S::Coll, S::Staged>) -> StoreResult<Outcome> {
        Faults::check(&self.faults.commits, "commit")?;
        self.faults.committed.fetch_add(1, Ordering::SeqCst);
        self.inner.commit(txn).await
    }
    fn hold_priority(&self) -> PriorityHold {
        self.inner.hold_priority()
    }
    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }
    async fn close(&self) -> StoreResult<()> {
        self.inner.close().await
    }
}
