//! Erasure-coded sets of drives as one store (paper 004; DESIGN.md section 5).
//!
//! An [`ErasureSet`] is k + m member stores (drives) behind the same `Store` traits: objects are cut into
//! stripes of k data shards plus m parity shards (Reed-Solomon), one shard per drive, and the object's
//! metadata (its layout, the S3 layer's attributes and listing tag) is written on every drive, so there is
//! no metadata server: a lookup asks the drives and takes the version a quorum agrees on. One drive is the
//! 1+0 set of the same code.
//!
//! - `layout`: the set's geometry and the per-object layout record (stripes, rotation, tail, version).
//! - `codec`: the erasure codes behind a trait; each object names its code.
//! - `read`: snapshots, quorum lookups, degraded reads (any k shards), quorum listing.
//! - `write`: a logical transaction as one transaction per drive, committed on a write quorum or undone.
//! - `undo`: the undo log each drive keeps for a write until its outcome is known, and recovery from it.
//! - `locks`: per-object locks that keep readers from seeing a write halfway.

mod codec;
mod layout;
mod locks;
mod read;
mod undo;
mod write;

pub use codec::{CODEC_NONE, CODEC_REED_SOLOMON, Codec, CodecId, codec_by_id, codec_for};
pub use layout::{MAX_SET_DRIVES, ObjectLayout, SHARD_UNIT_BYTES, SetGeometry};
pub use read::{SetObj, SetSnapshot};

use async_trait::async_trait;
use mosaic_store::{AlignedBuf, ErrorKind, Geometry, Outcome, PriorityHold, Store, StoreError, StoreResult, Txn};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The attribute every drive keeps with an object: its `ObjectLayout`.
pub const LAYOUT_ATTR: &[u8] = b"ec.layout";
/// Objects waiting for heal that a set remembers (more are found again by the scanner).
pub const HEAL_QUEUE_MAX: usize = 100_000;

#[derive(Clone, Debug)]
pub struct SetConfig {
    pub geometry: SetGeometry,
    /// Objects up to this size are kept whole on every drive (no encoding).
    pub inline_max_bytes: u64,
    /// Largest data in one write or append operation.
    pub max_op_data_bytes: u64,
}

/// A collection of the set: its name and its handle on each drive (None where the drive lacks it).
#[derive(Clone, Debug)]
pub struct SetColl<C> {
    pub(crate) name: Arc<str>,
    pub(crate) members: Arc<[Option<C>]>,
}

/// Stripes staged on the drives of a set: one shard per drive (None where staging failed).
pub struct SetStaged<St> {
    pub(crate) rotation: usize,
    pub(crate) len_bytes: u64,
    pub(crate) shards: Vec<Option<St>>,
}

/// What a set counts (exported by the server as metrics).
#[derive(Default)]
pub struct SetCounters {
    /// Reads that rebuilt data from parity because a shard was missing or damaged.
    pub degraded_reads: AtomicU64,
    /// Writes that did not reach every drive (the rest was queued for heal).
    pub partial_writes: AtomicU64,
    /// Writes refused or undone because fewer than a write quorum of drives committed them.
    pub failed_writes: AtomicU64,
    /// Objects queued for heal since the set was opened.
    pub heal_queued: AtomicU64,
}

/// An erasure-coded set of drives. Cheap to clone.
pub struct ErasureSet<S: Store> {
    pub(crate) inner: Arc<SetInner<S>>,
}

impl<S: Store> Clone for ErasureSet<S> {
    fn clone(&self) -> Self {
        ErasureSet { inner: self.inner.clone() }
    }
}

pub(crate) struct SetInner<S: Store> {
    pub(crate) cfg: SetConfig,
    /// The drives, by slot; None for a drive that is missing.
    pub(crate) members: Vec<Option<Arc<S>>>,
    /// Each drive's undo-log collection (None where the drive is missing).
    pub(crate) undo_colls: Vec<Option<S::Coll>>,
    pub(crate) locks: locks::ObjectLocks,
    pub(crate) heal: Mutex<BTreeSet<(String, Vec<u8>)>>,
    pub(crate) counters: SetCounters,
    /// Undo entries of committed writes waiting for removal, per drive.
    pub(crate) cleanup: Mutex<Vec<Vec<Vec<u8>>>>,
    /// Wakes the cleaner.
    pub(crate) cleanup_wake: tokio::sync::Notify,
}

impl<S: Store> SetInner<S> {
    pub(crate) fn geometry(&self) -> &SetGeometry {
        &self.cfg.geometry
    }

    /// Remembers an object whose drives disagree or miss shards (bounded: the scanner finds the rest).
    pub(crate) fn queue_heal(&self, coll: &str, name: &[u8]) {
        let mut q = self.heal.lock();
        if q.len() < HEAL_QUEUE_MAX && q.insert((coll.to_string(), name.to_vec())) {
            self.counters.heal_queued.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S: Store> ErasureSet<S> {
    /// Opens a set over its drives (by slot, None for a missing one): prepares each drive's undo log and
    /// settles writes that a crash left undecided (recovery), before anything is served.
    pub async fn open(cfg: SetConfig, members: Vec<Option<Arc<S>>>) -> StoreResult<Self> {
        let g = cfg.geometry;
        if members.len() != g.drives() {
            return Err(StoreError::new(
                ErrorKind::InvalidArgument,
                format!("a {}+{} set has {} drives, not {}", g.data, g.parity, g.drives(), members.len()),
            ));
        }
        let undo_colls = undo::prepare(&members).await?;
        let drives = members.len();
        let inner = SetInner {
            cfg,
            members,
            undo_colls,
            locks: Default::default(),
            heal: Mutex::new(BTreeSet::new()),
            counters: Default::default(),
            cleanup: Mutex::new(vec![Vec::new(); drives]),
            cleanup_wake: tokio::sync::Notify::new(),
        };
        let set = ErasureSet { inner: Arc::new(inner) };
        undo::recover(&set.inner).await?;
        tokio::spawn(cleaner(Arc::downgrade(&set.inner)));
        Ok(set)
    }

    pub fn geometry(&self) -> SetGeometry {
        self.inner.cfg.geometry
    }

    pub fn counters(&self) -> &SetCounters {
        &self.inner.counters
    }

    /// The drives, by slot.
    pub fn members(&self) -> &[Option<Arc<S>>] {
        &self.inner.members
    }

    /// Objects waiting for heal.
    pub fn heal_backlog(&self) -> usize {
        self.inner.heal.lock().len()
    }

    /// Whether enough drives are ready to take writes.
    fn ready_drives(&self) -> usize {
        self.inner.members.iter().flatten().filter(|m| m.is_ready()).count()
    }
}

/// Removes the undo entries of committed writes in batches, in the background, until the set is dropped.
async fn cleaner<S: Store>(set: std::sync::Weak<SetInner<S>>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(20);
    loop {
        let Some(s) = set.upgrade() else { return };
        let left = undo::clean_some(&s).await;
        if left == 0 {
            // Woken by new work, or after a tick to notice that the set is gone.
            let _ = tokio::time::timeout(TICK, s.cleanup_wake.notified()).await;
        }
    }
}

#[async_trait]
impl<S: Store> Store for ErasureSet<S> {
    type Coll = SetColl<S::Coll>;
    type Obj = SetObj<S>;
    type Staged = SetStaged<S::Staged>;
    type Snapshot = SetSnapshot<S>;

    fn geometry(&self) -> Geometry {
        Geometry {
            unit_bytes: self.inner.cfg.geometry.stripe_bytes(),
            max_op_data_bytes: self.inner.cfg.max_op_data_bytes,
            inline_max_bytes: self.inner.cfg.inline_max_bytes,
        }
    }

    fn snapshot(&self) -> SetSnapshot<S> {
        SetSnapshot::new(self.inner.clone())
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(Self::Staged, AlignedBuf)> {
        write::stage(&self.inner, buf, len_bytes, hint).await
    }

    async fn commit(&self, txn: Txn<Self::Coll, Self::Staged>) -> StoreResult<Outcome> {
        write::commit(&self.inner, txn).await
    }

    fn hold_priority(&self) -> PriorityHold {
        let holds: Vec<PriorityHold> = self.inner.members.iter().flatten().map(|m| m.hold_priority()).collect();
        Box::new(holds)
    }

    fn is_ready(&self) -> bool {
        self.ready_drives() >= self.inner.cfg.geometry.write_quorum()
    }

    async fn close(&self) -> StoreResult<()> {
        undo::flush_cleanup(&self.inner).await;
        let closes = self.inner.members.iter().flatten().map(|m| m.close());
        let results = futures::future::join_all(closes).await;
        results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
    }
}
