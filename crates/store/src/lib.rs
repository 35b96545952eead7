//! The storage interface Mosaic's S3 semantics are written against (DESIGN.md section 2; paper 003's
//! object interface): exactly what the semantics need from storage, and nothing of how it is stored.
//!
//! - a read [`Snapshot`]: collections, name lookup, attributes, ordered name iteration with listing tags,
//!   batched stat and ranged reads, all of one consistent state;
//! - staging of whole aligned units ([`Store::stage`]): a block on one drive, a stripe on an erasure set
//!   ([`Geometry::unit_bytes`]), written before the transaction that references them;
//! - [`Store::commit`] of a [`Txn`]: operations applied atomically and durably, or not at all; a failure
//!   names the operation that failed ([`StoreError::op_index`]).
//!
//! One drive implements it (`mosaic-drive`); an erasure set of drives, a pool of sets and a cluster
//! implement it too, so nothing of S3 is written twice.
//!
//! Placement: a store that spreads objects over groups of devices (a pool of erasure sets, a cluster)
//! places each object by its [`locator`], not by its collection: the name's bytes after its last NUL byte,
//! or the whole name when it has none (the locator key of Ceph's RADOS). Objects that a transaction must
//! change together, or that are cloned into one another without moving data, share a locator (a multipart
//! upload's record and parts carry the key of the object they become). An empty locator names the store's
//! home group, where it also keeps its catalog of collections: a transaction that creates or removes a
//! collection changes only objects with an empty locator besides. This crate depends on no storage engine (as TiKV's engine_traits does
//! not depend on RocksDB): a store built on something else implements the same traits.

mod aligned;
mod cpu_class;
mod error;
mod foreground;
mod io_share;
mod scoped;
mod shared_locks;
mod striped;
mod txn;

pub use aligned::{AlignedBuf, IO_ALIGN_BYTES, assert_io_aligned};
pub use cpu_class::{
    BULK_THREADS_MAX, MAX_BULK_NICE, any_bulk, bulk_connections_total, bulk_runtime, bulk_tasks_total, is_bulk,
    on_bulk_thread, run_in_class, set_background_cpu_class, set_bulk_nice, set_bulk_shares, spawn_blocking_in,
};
pub use error::{ErrorKind, StoreError, StoreResult};
pub use foreground::{
    ForegroundWork, ForegroundWorkGuard, in_foreground, is_foreground, on_thread_as_background, thread_is_background,
};
pub use io_share::{
    IoShares, MAX_SHARES, MAX_WEIGHT, PIPELINE, ShareEntry, ShareId, ShareStats, UNSHARED, carry_request, io_share,
    on_thread_with_share, share_id_of, thread_io_share, with_io_share, with_io_share_sync,
};
pub use shared_locks::{BoxFuture, HeldShared, SharedLocks};
pub use striped::{STRIPED_LANES_MAX, StripeLane, StripedBuffer, copy_into_pieces, copy_into_pieces_at};
pub use txn::{Op, Outcome, Priority, Txn};

use async_trait::async_trait;
use bytes::Bytes;

/// The bytes an object is placed by: the name after its last NUL byte, or the whole name (see the crate's
/// documentation). S3 keys hold no NUL, so a key is its own locator.
pub fn locator(name: &[u8]) -> &[u8] {
    match name.iter().rposition(|&b| b == 0) {
        Some(i) => &name[i + 1..],
        None => name,
    }
}

/// The name without its locator: the bytes before its last NUL byte, or the whole name.
pub fn without_locator(name: &[u8]) -> &[u8] {
    match name.iter().rposition(|&b| b == 0) {
        Some(i) => &name[..i],
        None => name,
    }
}

/// `name` placed by `locator`: the name, a NUL byte, and the locator.
pub fn with_locator(name: &[u8], locator: &[u8]) -> Vec<u8> {
    debug_assert!(!locator.contains(&0), "a locator holds no NUL byte");
    let mut out = Vec::with_capacity(name.len() + 1 + locator.len());
    out.extend_from_slice(name);
    out.push(0);
    out.extend_from_slice(locator);
    debug_assert_eq!(self::locator(&out), locator);
    out
}

/// The units a store works in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Geometry {
    /// Staged data, `WriteStaged` offsets and `CloneRange` offsets are multiples of this.
    pub unit_bytes: u64,
    /// Largest data carried in one `Write` or `Append` operation; larger writes are staged.
    pub max_op_data_bytes: u64,
    /// Objects up to this size are cheapest written in the operation itself (no staging).
    pub inline_max_bytes: u64,
}

/// An object as a lookup finds it. `O` is the store's handle to it, valid within the snapshot that
/// returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ObjectInfo<O> {
    pub obj: O,
    pub size_bytes: u64,
    pub mtime_ns: u64,
    pub high_priority: bool,
}

/// One entry of a collection's name index.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NameEntry<O> {
    pub name: Vec<u8>,
    pub obj: O,
    /// What `Op::SetNameTag` last stored for the object, if anything.
    pub tag: Option<Vec<u8>>,
}

/// A consistent read view: every method sees the same committed state, whatever commits meanwhile.
#[async_trait]
pub trait Snapshot: Send + Sync + 'static {
    type Coll: Clone + Send + Sync + 'static;
    type Obj: Clone + Send + Sync + 'static;

    async fn collection(&self, name: &str) -> StoreResult<Option<Self::Coll>>;
    /// Collections whose name starts with `prefix`, by name, at most `limit`.
    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, Self::Coll)>>;
    async fn lookup(&self, coll: &Self::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<Self::Obj>>>;
    async fn attr(&self, obj: &Self::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>>;
    /// The object's attributes with keys greater than `start_after`, in key order, at most `limit`.
    async fn attrs(&self, obj: &Self::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Names under `prefix` from `from` on (inclusive), in order, at most `limit`, with their listing tags.
    /// Costs one seek plus the entries returned, whatever the collection's size.
    async fn list_entries(
        &self,
        coll: &Self::Coll,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<Self::Obj>>>;
    /// Facts and one attribute of many objects, in the order given, in one batch.
    async fn stat_many(
        &self,
        objs: &[Self::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<Self::Obj>, Option<Vec<u8>>)>>;
    /// Up to `len` bytes at `offset`, every byte verified against its checksum; shorter at the end.
    async fn read(&self, obj: &Self::Obj, offset: u64, len: u64) -> StoreResult<Bytes>;
    /// `read` of the lane's length at `offset`, written into the lane's pieces (and the lane marked
    /// filled when the read covers it): the bytes read, shorter at the end. A store that reads from a
    /// page cache writes straight into the pieces; the default reads, then copies.
    async fn read_into(&self, obj: &Self::Obj, offset: u64, lane: StripeLane) -> StoreResult<u64> {
        let bytes = self.read(obj, offset, lane.len_bytes() as u64).await?;
        Ok(lane.fill_from(&bytes) as u64)
    }
    /// Marks the work done through this snapshot as prioritized (it serves a high-priority object) until
    /// the snapshot is dropped: background work yields to it.
    fn prioritize(&self);
}

/// A snapshot that names its collections by id (a drive's): what a drive's server resolves the collections
/// a command names with, to check them against the command's capability.
pub trait CollectionNames: Snapshot {
    /// The name of collection `coll` in this snapshot, if it has one.
    fn collection_name(&self, coll: &Self::Coll) -> StoreResult<Option<String>>;
}

/// Held while prioritized work is in flight; dropping it ends the hold.
pub type PriorityHold = Box<dyn Send + Sync>;

/// A store: snapshots to read, staging and atomic transactions to write.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A collection, as the store names it internally.
    type Coll: Clone + Send + Sync + std::fmt::Debug + 'static;
    /// An object within a snapshot.
    type Obj: Clone + Send + Sync + 'static;
    /// Units written by `stage` and not yet referenced; dropping them gives their space back.
    type Staged: Send + Sync + 'static;
    type Snapshot: Snapshot<Coll = Self::Coll, Obj = Self::Obj>;

    fn geometry(&self) -> Geometry;
    /// A consistent view of everything committed so far.
    fn snapshot(&self) -> Self::Snapshot;
    /// Writes the first `len_bytes` of `buf` (a multiple of `unit_bytes`) to fresh space for a later
    /// `Op::WriteStaged`; returns the buffer for reuse. `hint` names the object the units are for (paper
    /// 003's attributes as hints): a store that spreads objects over devices places them by it, so every
    /// unit of one object (its parts included) lands alike.
    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(Self::Staged, AlignedBuf)>;
    /// `stage` for object `name` of collection `coll`: a store that places a collection's objects on some
    /// of its devices only (a pool's scopes, a microstore's sets) places the units by both; the others,
    /// and the devices, by the hint alone.
    async fn stage_in(
        &self,
        coll: &Self::Coll,
        name: &[u8],
        buf: AlignedBuf,
        len_bytes: usize,
        hint: &[u8],
    ) -> StoreResult<(Self::Staged, AlignedBuf)> {
        let _ = (coll, name);
        self.stage(buf, len_bytes, hint).await
    }
    /// Applies a transaction atomically; returns once it is durable (on a write quorum, where the store
    /// has one).
    async fn commit(&self, txn: Txn<Self::Coll, Self::Staged>) -> StoreResult<Outcome>;
    /// Holds background work back while a prioritized request is in flight (paper 003).
    fn hold_priority(&self) -> PriorityHold;
    /// Whether the store can take writes.
    fn is_ready(&self) -> bool;
    /// Finishes queued work and closes the store.
    async fn close(&self) -> StoreResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locator_is_what_follows_the_last_nul_or_the_whole_name() {
        assert_eq!(locator(b"photos/cat.jpg"), b"photos/cat.jpg");
        assert_eq!(locator(b"b/upload/00001\0photos/cat.jpg"), b"photos/cat.jpg");
        assert_eq!(locator(b"bucket/b\0"), b"");
        assert_eq!(locator(b"a\0b\0c"), b"c");
        assert_eq!(with_locator(b"b/u", b"k"), b"b/u\0k");
        assert_eq!(locator(&with_locator(b"bucket/b", b"")), b"");
        assert_eq!(without_locator(&with_locator(b"b/u/00001", b"k")), b"b/u/00001");
        assert_eq!(without_locator(b"photos/cat.jpg"), b"photos/cat.jpg");
    }
}
