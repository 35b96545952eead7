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
//! - `locks`: per-object locks that keep readers from seeing a write halfway, and the shared locks that
//!   keep other processes' writes out.

mod codec;
mod commit_times;
mod heal;
mod layout;
mod locks;
mod read;
mod undo;
mod write;

pub use codec::{
    CODEC_NONE, CODEC_REED_SOLOMON, CODEC_REED_SOLOMON_GF8, Codec, CodecId, codec_by_id, codec_for, gf8_supported,
};
pub use commit_times::{COMMIT_SLOW_MS, CommitPath, PathTimes, commit_times};
pub use heal::{HealProgress, Healed};
pub use layout::{MAX_SET_DRIVES, ObjectLayout, SHARD_UNIT_BYTES, SetGeometry};
pub use mosaic_store::{HeldShared, SharedLocks};
pub use read::{SetObj, SetSnapshot};

use async_trait::async_trait;
use mosaic_store::{AlignedBuf, ErrorKind, Geometry, Op, Outcome, PriorityHold, Store, StoreError, StoreResult, Txn};
use parking_lot::{Mutex, RwLock};
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
    /// Objects up to this size are written in the operation itself (`Geometry::inline_max_bytes`): kept
    /// whole, not encoded, on m + 1 drives.
    pub inline_max_bytes: u64,
    /// Largest data in one write or append operation.
    pub max_op_data_bytes: u64,
    /// Heal queued objects in the background (tests turn it off to heal by hand).
    pub heal_in_background: bool,
    /// Most bytes per second background heal rebuilds (0: no limit), so that a rebuild leaves the drives to
    /// foreground work.
    pub heal_bytes_per_s: u64,
    /// How often the background scanner compares the drives (None: only when a drive is attached or an
    /// operator asks).
    pub scan_interval: Option<std::time::Duration>,
    /// Lazy sync of tails: once appends leave at least this many bytes (and a whole stripe) in an object's
    /// tail, its whole stripes are encoded in the background. 0 encodes them on the request path instead,
    /// in the append that fills a stripe (the read-modify-write ablation, for benchmarks).
    pub lazy_encode_min_bytes: u64,
    /// Which writes the drives' undo logs hold that open settles (recovery).
    pub settle_at_open: Settle,
    /// Heal removes an object from the drives that hold it when a quorum lacks it. A set that sees only
    /// part of where its data is (a cluster group's next set, filled before it is served) must not: what
    /// it lacks may be whole elsewhere, so it only rebuilds.
    pub heal_removes: bool,
    /// While a cluster group moves a step (issue 16): the slots (a bit each) whose drives the step keeps.
    /// A write must then also commit on `min(write quorum, their count)` of them, so that after the step
    /// (when the drives it leaves are gone) every acknowledged write still has at least k shards where
    /// the group is served. With a `removal_follower` the rule holds only for the writes it arms (its
    /// step's fill is under way: before it, the fill first waits for the writes begun unarmed to end and
    /// heals the set served); the background encoding of tails is always under it. None: no such rule.
    pub kept_drives: Option<u16>,
    /// While this set fills a cluster group's next set (issue 16): the slots whose drives the step keeps.
    /// They took every write and delete of the group (`kept_drives`), the others are new drives being
    /// filled and not served yet, so heal decides each object from the kept drives alone: what they lack
    /// is removed from the new ones (a copy the fill made before a delete), what they hold is rebuilt there.
    /// Deciding from all drives instead lets the copies outvote the delete when k = m, and heal would then
    /// put the deleted object back on the kept drives. None: every drive counts.
    pub decided_by: Option<u16>,
    /// Lookups ask the k drives of the name's data shards first and take their answer when they agree
    /// (`read::resolve`): sound when every acknowledged write is on more than m drives of the set. A
    /// cluster group with k = m breaks that after a step: a write made after the fill's last round is on
    /// the k kept drives only, and the k new drives may hold an older copy or none, so the k asked can
    /// agree on a stale answer. False: every lookup asks every drive and the quorum decides.
    pub read_fast_path: bool,
    /// Locks a write also takes when other processes write the same drives (a cluster's nodes): the set's
    /// own locks order only its own writes. None: this set is the drives' only writer.
    pub shared_locks: Option<Arc<dyn SharedLocks>>,
    /// Told of every name a committed write took away (a removal, a rename's source), after the write is
    /// decided and its locks are let go. While a cluster group moves a step, a copy of the object on the
    /// drives the step fills goes with it (`mosaic_cluster_store`). None: nobody is told.
    pub removal_follower: Option<Arc<dyn RemovalFollower>>,
    /// The foreground work of the whole node this set runs on (a cluster node's): the set's reads and
    /// writes for clients (`mosaic_store::in_foreground`) count in it, and its heal waits for a quiet
    /// moment in it (once per `NODE_YIELD_EVERY_BYTES`) as well as in its own. A cluster group's fill
    /// reaches drives that the node's other sets and other nodes' clients keep busy, which the set's own
    /// count does not see. None: only the set's own work counts.
    pub node_foreground: Option<Arc<mosaic_store::ForegroundWork>>,
    /// The code new objects are written with (None: `codec_for`'s default, Reed-Solomon over GF(2^8) where
    /// the CPU runs it). An object keeps the code it was first encoded with; stripes of another code are
    /// not joined to it.
    pub codec: Option<CodecId>,
    /// The largest object a write rebuilds on the drives that miss its version before it renames it or
    /// changes it in place, when its holders are too few for the write (with k = m, one drive that missed
    /// it): the client waits for that rebuild. A larger one is queued for heal and the write refused until
    /// heal reached it.
    pub rebuild_on_write_max_bytes: u64,
}

/// What `SetConfig::removal_follower` is told. A failure does not fail the write (it is decided and
/// durable): it is logged and counted (`SetCounters::removals_not_followed`).
pub trait RemovalFollower: Send + Sync + 'static {
    /// Called before every write of the set is committed; it also decides whether the write is under the
    /// kept drives' rule (`SetConfig::kept_drives`, only while armed: `WriteBegun::armed`). Its guard is
    /// dropped once the write ended: every name it took away followed or failed to be, or the write
    /// failed. A follower whose failures someone must not miss counts the writes under way with it: a
    /// removal not followed yet has not failed yet either, and whoever arms the follower waits for the
    /// writes begun unarmed to end (they committed without the rule and without following). An error
    /// refuses the write before anything of it is committed (the step is being switched).
    /// `removes`: the write takes names away (only such a write may be refused while a step switches).
    fn begin(&self, removes: bool) -> futures::future::BoxFuture<'_, StoreResult<WriteBegun>>;
    /// Follows the removal of `name`. It runs while the write still holds the name's locks (the set's own
    /// and `SetConfig::shared_locks`, begun within their use window), so it must not take those locks
    /// itself, and should end within the length of that window, else their lease may lapse meanwhile.
    fn removed<'a>(&'a self, coll: &'a str, name: &'a [u8]) -> futures::future::BoxFuture<'a, StoreResult<()>>;
}

/// What `RemovalFollower::begin` answers for one write.
pub struct WriteBegun {
    /// Dropped once the write ended (its removals followed or failed to be, or the write failed).
    pub under_way: Box<dyn std::any::Any + Send>,
    /// Whether the write is under the kept drives' rule and its removals are followed
    /// (`RemovalFollower::removed`), under its locks. Unarmed, it commits as any write of a set that does
    /// not move.
    pub armed: bool,
}

/// Collections of this prefix on the drives are the set's own (its undo log): the set does not list them.
pub(crate) const INTERNAL_COLLECTION_PREFIX: &str = ".ec-";

/// Removals not followed are logged at most once per `LOG_EVERY` in the process: while a node of a
/// moving group's set is down every removal from the group fails to be followed, and the count is in
/// `SetCounters::removals_not_followed` anyway.
static NOT_FOLLOWED_LOG: LogPace = LogPace::new(std::time::Duration::from_secs(10));

/// Lets a repeated log line through at most once per `every`, and counts the lines held back.
struct LogPace {
    every: std::time::Duration,
    /// When the last line went through (ms since `start`), or u64::MAX before the first.
    last_ms: AtomicU64,
    held_back: AtomicU64,
    start: std::sync::OnceLock<std::time::Instant>,
}

impl LogPace {
    const fn new(every: std::time::Duration) -> Self {
        LogPace {
            every,
            last_ms: AtomicU64::new(u64::MAX),
            held_back: AtomicU64::new(0),
            start: std::sync::OnceLock::new(),
        }
    }

    /// Some(lines held back since the last one) when this line may go through.
    fn allow(&self) -> Option<u64> {
        self.allow_at(self.start.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64)
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX || now_ms.saturating_sub(last) >= self.every.as_millis() as u64;
        if due && self.last_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl std::fmt::Debug for dyn RemovalFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemovalFollower")
    }
}

/// The shared-lock key of an object: a hash of its collection and name. A write and a heal of a set take
/// the keys of the objects they change after the set's own locks (`SetConfig::shared_locks`) and hold
/// them until the outcome is decided, so that writes of one object from two processes never interleave
/// on its drives.
pub(crate) fn shared_lock_key(coll: &str, name: &[u8]) -> u64 {
    let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme);
    h.update(coll.as_bytes());
    h.update(&[0]);
    h.update(name);
    h.finalize()
}

impl SetConfig {
    /// A set of `geometry` with the settings tests, benchmarks and tools start from: objects up to 16 KiB
    /// inline, 64 MiB per operation, no background heal or scans, lazy sync at its default, every
    /// undecided write settled at open.
    pub fn new(geometry: SetGeometry) -> Self {
        SetConfig {
            geometry,
            inline_max_bytes: 16 * 1024,
            max_op_data_bytes: 64 << 20,
            heal_in_background: false,
            heal_bytes_per_s: 0,
            scan_interval: None,
            lazy_encode_min_bytes: LAZY_ENCODE_MIN_BYTES,
            settle_at_open: Settle::All,
            heal_removes: true,
            kept_drives: None,
            decided_by: None,
            read_fast_path: true,
            shared_locks: None,
            removal_follower: None,
            node_foreground: None,
            codec: None,
            rebuild_on_write_max_bytes: REBUILD_ON_WRITE_MAX_BYTES,
        }
    }

    /// The code new objects are written with.
    pub fn write_codec(&self) -> CodecId {
        self.codec.unwrap_or_else(|| codec_for(self.geometry.data, self.geometry.parity).id())
    }

    /// Drives a write under the kept drives' rule `kept` (a bit per slot; None: no rule) must commit on
    /// among them: as many as a write quorum, or all of them when fewer are kept.
    pub fn kept_quorum(&self, kept: Option<u16>) -> usize {
        kept.map_or(0, |kept| (kept.count_ones() as usize).min(self.geometry.write_quorum()))
    }

    /// Whether a write that committed on `committed` (a bit per slot) is durable: a write quorum, and the
    /// kept drives' share under the rule `kept`.
    pub fn write_is_durable(&self, committed: u16, kept: Option<u16>) -> bool {
        let on_kept = kept.map_or(0, |kept| (committed & kept).count_ones() as usize);
        committed.count_ones() as usize >= self.geometry.write_quorum() && on_kept >= self.kept_quorum(kept)
    }
}

/// Which undecided writes a set settles at open. Exactly one set instance over a group of drives may
/// settle: a single node's set settles all (nothing else writes to its drives); in a cluster, where every
/// node writes to every group, only the group's owner settles, and only writes older than a grace period
/// (a younger one may still be in flight on another node: undoing it under its writer could leave an
/// acknowledged write below its quorum); the other nodes settle none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    All,
    OlderThan(std::time::Duration),
    Never,
}

/// Tail bytes an object gathers before lazy sync encodes its whole stripes, by default: large enough that
/// the encoding writes long runs, small enough that the tail's m + 1 copies stay cheap.
pub const LAZY_ENCODE_MIN_BYTES: u64 = 1 << 20;
/// `SetConfig::rebuild_on_write_max_bytes`'s default: at a rebuild's rate here (about 100 MiB/s) the client
/// waits a few seconds at most, well within an SDK's read timeout.
pub const REBUILD_ON_WRITE_MAX_BYTES: u64 = 256 << 20;

/// A collection of the set: its name and its handle on each drive (None where the drive lacks it).
#[derive(Clone, Debug)]
pub struct SetColl<C> {
    pub(crate) name: Arc<str>,
    pub(crate) members: Arc<[Option<C>]>,
    /// The set's drive generation when the handles were taken: a handle from before a drive was attached
    /// or detached is looked up again where it is used (`SetInner::current`).
    pub(crate) generation: u64,
}

/// Stripes staged on the drives of a set: one shard per drive (None where staging failed).
pub struct SetStaged<St> {
    pub(crate) rotation: usize,
    /// The code the stripes' parity was made with: they join only an object of the same code.
    pub(crate) codec: CodecId,
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
    /// Writes a restart left undecided, settled when the set opened: kept, or put back.
    pub writes_kept_at_open: AtomicU64,
    pub writes_undone_at_open: AtomicU64,
    /// Writes a restart left undecided that the drives which did not answer could still hold at a write
    /// quorum: neither kept nor put back, until a settling sees those drives.
    pub writes_left_undecided_at_open: AtomicU64,
    /// Names taken away whose `SetConfig::removal_follower` failed.
    pub removals_not_followed: AtomicU64,
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

/// One drive's place in a set: the drive (None while it is missing) and its undo-log collection. A slot
/// changes when a drive is replaced or comes back.
pub(crate) struct Slot<S: Store> {
    /// The drive and its incarnation (`undo::DriveLog::incarnation`), under one lock so that a write
    /// records the incarnation of the very drive it sends its transaction to.
    store: RwLock<Option<(Arc<S>, u64)>>,
    undo: RwLock<Option<S::Coll>>,
}

pub(crate) struct SetInner<S: Store> {
    pub(crate) cfg: SetConfig,
    slots: Vec<Slot<S>>,
    pub(crate) locks: locks::ObjectLocks,
    pub(crate) heal: Mutex<BTreeSet<(String, Vec<u8>)>>,
    pub(crate) counters: SetCounters,
    /// Undo entries of committed writes waiting for removal, per drive.
    pub(crate) cleanup: Mutex<Vec<Vec<Vec<u8>>>>,
    /// Wakes the cleaner.
    pub(crate) cleanup_wake: tokio::sync::Notify,
    pub(crate) progress: HealProgress,
    /// Wakes the heal worker.
    pub(crate) heal_wake: tokio::sync::Notify,
    /// Crash tests: the commit (counted from 1) after whose drive transactions the set stops as if the
    /// process died; 0 when not armed.
    crash_after_commits: AtomicU64,
    dead: std::sync::atomic::AtomicBool,
    /// Bumped whenever a drive is attached or detached (collection handles taken before are stale).
    pub(crate) generation: AtomicU64,
    /// Foreground reads and writes in flight: heal yields to them (paper 003).
    foreground_in_flight: AtomicU64,
    /// Heal's rebuilt bytes (`HealProgress::healed_bytes`) when it last waited for the node's foreground
    /// work.
    node_yielded_at_bytes: AtomicU64,
    /// Objects whose tails lazy sync should encode.
    pub(crate) encode: Mutex<BTreeSet<(String, Vec<u8>)>>,
    /// Wakes the encoder.
    pub(crate) encode_wake: tokio::sync::Notify,
}

/// Counts a foreground read or write as in flight until dropped, in the set and on its node.
pub(crate) struct ForegroundGuard<'a> {
    set: &'a AtomicU64,
    _node: Option<mosaic_store::ForegroundWorkGuard>,
}

impl Drop for ForegroundGuard<'_> {
    fn drop(&mut self) {
        let before = self.set.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "a foreground guard dropped twice");
    }
}

/// Longest a heal step waits for foreground work to pause: under a load that never pauses, heal still
/// moves, at a small share of the drives.
pub const HEAL_YIELD_MAX: std::time::Duration = std::time::Duration::from_millis(50);
/// How long the node's foreground work must have been idle for a heal step to run before
/// `HEAL_YIELD_MAX`: a load of back-to-back requests has gaps shorter than this between them.
const NODE_QUIET: std::time::Duration = std::time::Duration::from_millis(5);
/// Bytes heal rebuilds between two waits for the node's foreground work: a wait per object would hold
/// small objects back 50 ms each; a wait per this many bytes bounds heal under a load that never
/// pauses to about this much per `HEAL_YIELD_MAX` on each node.
pub const NODE_YIELD_EVERY_BYTES: u64 = 1 << 20;

impl<S: Store> SetInner<S> {
    pub(crate) fn geometry(&self) -> &SetGeometry {
        &self.cfg.geometry
    }

    /// Drives in the set (slots, present or not).
    pub(crate) fn drives(&self) -> usize {
        self.slots.len()
    }

    /// The drive in slot `d`, if present.
    pub(crate) fn member(&self, d: usize) -> Option<Arc<S>> {
        self.slots[d].store.read().as_ref().map(|(store, _)| store.clone())
    }

    /// The drive in slot `d` with its incarnation (0: unknown), if present.
    pub(crate) fn member_incarnation(&self, d: usize) -> Option<(Arc<S>, u64)> {
        self.slots[d].store.read().clone()
    }

    /// The incarnation of slot `d`'s drive: 0 when the slot is empty or the drive has none.
    pub(crate) fn incarnation(&self, d: usize) -> u64 {
        self.slots[d].store.read().as_ref().map_or(0, |(_, incarnation)| *incarnation)
    }

    /// The drives by slot, as they are now.
    pub(crate) fn members(&self) -> Vec<Option<Arc<S>>> {
        (0..self.drives()).map(|d| self.member(d)).collect()
    }

    /// Slot `d`'s undo-log collection, if its drive is present and has one.
    pub(crate) fn undo_coll(&self, d: usize) -> Option<S::Coll> {
        self.slots[d].undo.read().clone()
    }

    /// Refuses work once a simulated crash stopped the set.
    pub(crate) fn check_alive(&self) -> StoreResult<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the set stopped (a simulated crash)"));
        }
        Ok(())
    }

    /// Stops the set here if a crash test armed it for this commit.
    pub(crate) fn maybe_die(&self) -> StoreResult<()> {
        let left = self.crash_after_commits.load(Ordering::SeqCst);
        if left == 1 {
            self.dead.store(true, Ordering::SeqCst);
        }
        if left > 0 {
            self.crash_after_commits.store(left - 1, Ordering::SeqCst);
        }
        self.check_alive()
    }

    /// Puts a drive (back) in slot `d`.
    pub(crate) fn set_member(&self, d: usize, store: Option<Arc<S>>, log: undo::DriveLog<S::Coll>) {
        *self.slots[d].store.write() = store.map(|s| (s, log.incarnation));
        *self.slots[d].undo.write() = log.undo;
        // Queued removals named the old drive's entries (a drive put in is settled by recovery).
        self.cleanup.lock()[d].clear();
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// `coll` with handles on the drives the set has now: itself, or looked up again when drives were
    /// attached or detached since it was taken, or when it lacks a handle on a drive the set has (that
    /// drive may have failed the first lookup and answer now: a write must not skip it for good).
    pub(crate) async fn current(self: &Arc<Self>, coll: &SetColl<S::Coll>) -> StoreResult<SetColl<S::Coll>> {
        let lacking = coll.members.iter().enumerate().any(|(d, c)| c.is_none() && self.member(d).is_some());
        if coll.generation == self.generation.load(Ordering::SeqCst) && !lacking {
            return Ok(coll.clone());
        }
        use mosaic_store::Snapshot as _;
        let snap = SetSnapshot::new(self.clone());
        snap.collection(&coll.name).await?.ok_or_else(|| StoreError::not_found(format!("collection {}", coll.name)))
    }

    /// Marks a foreground read or write in flight for as long as the guard lives.
    pub(crate) fn foreground(&self) -> ForegroundGuard<'_> {
        self.foreground_in_flight.fetch_add(1, Ordering::Relaxed);
        // Only what a client waits for counts on the node (a set's own count takes every read and write).
        let node = self.cfg.node_foreground.as_ref().filter(|_| mosaic_store::is_foreground()).map(|n| n.begin());
        ForegroundGuard { set: &self.foreground_in_flight, _node: node }
    }

    /// Whether foreground work keeps background work waiting: a read or write of this set in flight, or,
    /// once heal rebuilt `NODE_YIELD_EVERY_BYTES` since it last waited for it, the node's foreground work
    /// not quiet.
    fn foreground_busy(&self, node_due: bool) -> bool {
        self.foreground_in_flight.load(Ordering::Relaxed) > 0
            || (node_due && self.cfg.node_foreground.as_ref().is_some_and(|n| !n.is_quiet(NODE_QUIET)))
    }

    /// Whether heal may keep more than one step of a rebuild in flight: no read or write of the set in
    /// flight and, on a node that counts its foreground work, none for `NODE_QUIET`. The set alone goes
    /// idle between a load's requests: deepening there let heal rebuild up to three steps per
    /// `HEAL_YIELD_MAX` under a load that never pauses, where `NODE_YIELD_EVERY_BYTES` means about one.
    pub(crate) fn heal_may_deepen(&self) -> bool {
        !self.foreground_busy(true)
    }

    /// Waits (at most `HEAL_YIELD_MAX`) until no foreground read or write is in flight (nor, on a node
    /// that counts its foreground work, any for `NODE_QUIET` once heal rebuilt `NODE_YIELD_EVERY_BYTES`
    /// since it last waited for the node): background work calls it between steps, so foreground work
    /// preempts it.
    pub(crate) async fn yield_to_foreground(&self) {
        let healed = self.progress.healed_bytes.load(Ordering::Relaxed);
        let waited_at = self.node_yielded_at_bytes.load(Ordering::Relaxed);
        let node_due = healed.saturating_sub(waited_at) >= NODE_YIELD_EVERY_BYTES;
        let until = tokio::time::Instant::now() + HEAL_YIELD_MAX;
        while self.foreground_busy(node_due) && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        if node_due {
            self.node_yielded_at_bytes.fetch_max(healed, Ordering::Relaxed);
        }
    }

    /// Remembers an object whose tail holds whole stripes to encode (bounded: a later append queues it
    /// again).
    pub(crate) fn queue_encode(&self, coll: &str, name: &[u8]) {
        let mut q = self.encode.lock();
        if q.len() < HEAL_QUEUE_MAX && q.insert((coll.to_string(), name.to_vec())) && q.len() == 1 {
            self.encode_wake.notify_one();
        }
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
        if let Some(kept) = [cfg.kept_drives, cfg.decided_by]
            .into_iter()
            .flatten()
            .find(|kept| kept & !g.all_drives() != 0 || (kept.count_ones() as usize) < g.read_quorum())
        {
            return Err(StoreError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a {}+{} set keeps at least {} of its drives in a step, not {kept:#b}",
                    g.data, g.parity, g.data
                ),
            ));
        }
        let logs = undo::prepare(&members).await;
        let drives = members.len();
        let slots = members
            .into_iter()
            .zip(logs)
            .map(|(store, log)| Slot {
                store: RwLock::new(store.map(|s| (s, log.incarnation))),
                undo: RwLock::new(log.undo),
            })
            .collect();
        let inner = SetInner {
            cfg,
            slots,
            locks: Default::default(),
            heal: Mutex::new(BTreeSet::new()),
            counters: Default::default(),
            cleanup: Mutex::new(vec![Vec::new(); drives]),
            cleanup_wake: tokio::sync::Notify::new(),
            progress: HealProgress::default(),
            heal_wake: tokio::sync::Notify::new(),
            crash_after_commits: AtomicU64::new(0),
            dead: Default::default(),
            generation: AtomicU64::new(0),
            foreground_in_flight: AtomicU64::new(0),
            node_yielded_at_bytes: AtomicU64::new(0),
            encode: Mutex::new(BTreeSet::new()),
            encode_wake: tokio::sync::Notify::new(),
        };
        let set = ErasureSet { inner: Arc::new(inner) };
        if set.inner.cfg.settle_at_open != Settle::Never {
            undo::recover(&set.inner).await?;
        }
        tokio::spawn(cleaner(Arc::downgrade(&set.inner)));
        if set.inner.cfg.heal_in_background {
            tokio::spawn(healer(Arc::downgrade(&set.inner)));
            tokio::spawn(encoder(Arc::downgrade(&set.inner)));
        }
        Ok(set)
    }

    pub fn geometry(&self) -> SetGeometry {
        self.inner.cfg.geometry
    }

    pub fn counters(&self) -> &SetCounters {
        &self.inner.counters
    }

    /// The drives, by slot.
    pub fn members(&self) -> Vec<Option<Arc<S>>> {
        self.inner.members()
    }

    /// Objects waiting for heal.
    pub fn heal_backlog(&self) -> usize {
        self.inner.heal.lock().len()
    }

    pub fn heal_progress(&self) -> &HealProgress {
        &self.inner.progress
    }

    /// Heals queued objects now, at most `max`; returns how many were tried.
    pub async fn heal_now(&self, max: usize) -> usize {
        heal::heal_queued(&self.inner, max).await
    }

    /// Tails waiting for lazy sync.
    pub fn encode_backlog(&self) -> usize {
        self.inner.encode.lock().len()
    }

    /// Encodes queued tails now, at most `max` objects; returns how many were tried.
    pub async fn encode_tails_now(&self, max: usize) -> usize {
        encode_queued(&self.inner, max).await
    }

    /// Heals one object now.
    pub async fn heal_object(&self, coll: &str, name: &[u8]) -> StoreResult<Healed> {
        heal::heal_object(&self.inner, coll, name).await
    }

    /// Compares every drive's names and queues what differs for heal; returns the names compared.
    pub async fn scan(&self) -> StoreResult<u64> {
        let seen = heal::scan(&self.inner, false).await?;
        self.inner.heal_wake.notify_one();
        Ok(seen)
    }

    /// Like `scan`, and reads every shard of every object back (a scrub of the set): damaged shards that
    /// no read has needed yet (parity) are queued for heal too.
    pub async fn scan_deep(&self) -> StoreResult<u64> {
        let seen = heal::scan(&self.inner, true).await?;
        self.inner.heal_wake.notify_one();
        Ok(seen)
    }

    /// Puts a drive in slot `slot`: a replacement (newly formatted) or a drive that came back. Its undo log
    /// is settled, and a scan queues everything it lacks for heal.
    pub async fn attach_drive(&self, slot: usize, store: Arc<S>) -> StoreResult<()> {
        if slot >= self.inner.drives() {
            return Err(StoreError::new(ErrorKind::InvalidArgument, format!("the set has no slot {slot}")));
        }
        let log = undo::prepare_one(&store, self.inner.drives()).await;
        self.inner.set_member(slot, Some(store), log);
        undo::recover(&self.inner).await?;
        self.scan().await.map(|_| ())
    }

    /// Crash tests: after the drive transactions of the `commits`-th commit from now, the set stops as if
    /// the process died there (no undo, no cleanup; every later call fails). 0 disarms.
    #[doc(hidden)]
    pub fn arm_crash_after_commits(&self, commits: u64) {
        self.inner.crash_after_commits.store(commits, Ordering::SeqCst);
    }

    /// Takes the drive out of slot `slot` (it failed or is being replaced): the set works without it.
    pub fn detach_drive(&self, slot: usize) {
        if slot < self.inner.drives() {
            self.inner.set_member(slot, None, undo::DriveLog::default());
        }
    }

    /// Whether enough drives are ready to take writes.
    fn ready_drives(&self) -> usize {
        self.inner.members().iter().flatten().filter(|m| m.is_ready()).count()
    }
}

/// Removes the undo entries of committed writes in batches, in the background, until the set is dropped.
async fn cleaner<S: Store>(set: std::sync::Weak<SetInner<S>>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(50);
    loop {
        let Some(s) = set.upgrade() else { return };
        let left = undo::clean_some(&s).await;
        if left == 0 {
            // Woken when a drive's queue fills a batch, else after a tick (which also notices that the set
            // is gone): writes in between take entries with them.
            let _ = tokio::time::timeout(TICK, s.cleanup_wake.notified()).await;
        }
    }
}

/// Heals queued objects in the background until the set is dropped, at most `heal_bytes_per_s` on average,
/// and scans the drives every `scan_interval`.
async fn healer<S: Store>(set: std::sync::Weak<SetInner<S>>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(500);
    const STEP_OBJECTS: usize = 64;
    let mut last_scan = tokio::time::Instant::now();
    loop {
        let Some(s) = set.upgrade() else { return };
        if let Some(every) = s.cfg.scan_interval
            && last_scan.elapsed() >= every
        {
            last_scan = tokio::time::Instant::now();
            if let Err(e) = heal::scan(&s, false).await {
                tracing::debug!(error = %e, "a background scan stopped early");
            }
        }
        let before = s.progress.healed_bytes.load(Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let tried = heal::heal_queued(&s, STEP_OBJECTS).await;
        let rate = s.cfg.heal_bytes_per_s;
        let healed = s.progress.healed_bytes.load(Ordering::Relaxed) - before;
        drop(s);
        if rate > 0 && healed > 0 {
            // Pace to the rate: the step's bytes take at least bytes / rate seconds.
            let due = std::time::Duration::from_secs_f64(healed as f64 / rate as f64);
            tokio::time::sleep_until(started + due).await;
        }
        if tried == 0 {
            let Some(s) = set.upgrade() else { return };
            let _ = tokio::time::timeout(TICK, s.heal_wake.notified()).await;
        }
    }
}

/// Encodes up to `max` queued tails, each after foreground work pauses; returns how many were tried.
async fn encode_queued<S: Store>(set: &Arc<SetInner<S>>, max: usize) -> usize {
    let mut tried = 0;
    while tried < max {
        let Some((coll, name)) = set.encode.lock().pop_first() else { break };
        tried += 1;
        set.yield_to_foreground().await;
        match write::encode_tail_now(set, &coll, &name).await {
            Ok(0) => {}
            Ok(_) => {
                set.progress.encoded_objects.fetch_add(1, Ordering::Relaxed);
            }
            // The next append queues it again; heal settles drives that missed the encoding.
            Err(e) => tracing::debug!(error = %e, "lazy sync of a tail failed"),
        }
    }
    tried
}

/// Encodes queued tails in the background (lazy sync) until the set is dropped.
async fn encoder<S: Store>(set: std::sync::Weak<SetInner<S>>) {
    const TICK: std::time::Duration = std::time::Duration::from_millis(500);
    const STEP_OBJECTS: usize = 16;
    loop {
        let Some(s) = set.upgrade() else { return };
        if encode_queued(&s, STEP_OBJECTS).await == 0 {
            let _ = tokio::time::timeout(TICK, s.encode_wake.notified()).await;
        }
    }
}

/// The names a transaction takes away, which a moving group's removals follower must follow: those it
/// removes, and the sources of its renames that no later operation makes again as a whole object. A
/// versioned overwrite renames the key's current version to a noncurrent name and makes the key anew: the
/// key keeps a name on the drives that take the write, as in any overwrite, so a copy of its older bytes
/// elsewhere loses to the newer version and cannot bring a removed name back.
fn removed_names<C, St>(ops: &[Op<SetColl<C>, St>]) -> Vec<(Arc<str>, Vec<u8>)> {
    let made_again = |later: &[Op<SetColl<C>, St>], coll: &Arc<str>, name: &[u8]| {
        later.iter().any(|op| match op {
            Op::Create { coll: c, name: n } | Op::Reset { coll: c, name: n } => c.name == *coll && n == name,
            Op::Rename { to_coll: c, to: n, .. } | Op::Clone { to_coll: c, to: n, .. } => c.name == *coll && n == name,
            _ => false,
        })
    };
    ops.iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Remove { coll, name } => Some((coll.name.clone(), name.clone())),
            Op::Rename { coll, from, .. } if !made_again(&ops[i + 1..], &coll.name, from) => {
                Some((coll.name.clone(), from.clone()))
            }
            _ => None,
        })
        .collect()
}

impl<S: Store> ErasureSet<S> {
    /// Commits `txn` under its group's step (when the set has a removal follower) and says how the step
    /// treated it.
    async fn commit_following(
        &self,
        txn: Txn<SetColl<S::Coll>, SetStaged<S::Staged>>,
    ) -> (CommitPath, StoreResult<Outcome>) {
        let kept = self.inner.cfg.kept_drives;
        let Some(follower) = self.inner.cfg.removal_follower.clone() else {
            return (CommitPath::Plain, write::commit(&self.inner, txn, kept).await);
        };
        let removed = removed_names(&txn.ops);
        // Begun before anything is decided, so that an arming counts it among the writes under way.
        let begun = match follower.begin(!removed.is_empty()).await {
            Ok(begun) => begun,
            Err(e) => return (CommitPath::Plain, Err(e)),
        };
        let kept = kept.filter(|_| begun.armed);
        let path = if begun.armed { CommitPath::Armed } else { CommitPath::Plain };
        if removed.is_empty() || !begun.armed {
            return (path, write::commit(&self.inner, txn, kept).await);
        }
        (CommitPath::ArmedFollowed, self.commit_and_follow(txn, kept, removed, follower).await)
    }

    /// Commits an armed `txn` that removes `removed`, and follows each removal onto the step's new drives.
    async fn commit_and_follow(
        &self,
        txn: Txn<SetColl<S::Coll>, SetStaged<S::Staged>>,
        kept: Option<u16>,
        removed: Vec<(Arc<str>, Vec<u8>)>,
        follower: Arc<dyn RemovalFollower>,
    ) -> StoreResult<Outcome> {
        // The removals are followed under the write's locks: a heal of these names (on another node, over
        // the set a step made) or a step's fill copying them cannot act between the commit and its follow,
        // when the drives the step keeps lack a name the new ones may still hold. A follow begins within
        // the locks' use window and ends within its length (`FOLLOW_TIMEOUT`), inside their lease. So the
        // locks are renewed before each follow but the last: a renewal gives a next follow its window,
        // and the last has none after it (a renewal fails once the window passed, so it could not help).
        let (outcome, mut locks) = write::commit_locked(&self.inner, txn, kept).await?;
        let follows = removed.len();
        for (n, (coll, name)) in removed.into_iter().enumerate() {
            let renewed = if n + 1 < follows { locks.renew().await } else { locks.check_held() };
            if let Err(e) = renewed {
                tracing::debug!(error = %e, "a removal is followed outside its locks' use window");
            }
            if let Err(e) = follower.removed(&coll, &name).await {
                self.inner.counters.removals_not_followed.fetch_add(1, Ordering::Relaxed);
                if let Some(since_last) = NOT_FOLLOWED_LOG.allow() {
                    tracing::warn!(coll = %coll, name = %name.escape_ascii(), error = %e, not_logged_before = since_last,
                        "a removal was not followed");
                }
            }
        }
        Ok(outcome)
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
        SetSnapshot::of_store(self.inner.clone())
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(Self::Staged, AlignedBuf)> {
        write::stage(&self.inner, buf, len_bytes, hint).await
    }

    async fn commit(&self, txn: Txn<Self::Coll, Self::Staged>) -> StoreResult<Outcome> {
        let began = std::time::Instant::now();
        let (path, outcome) = self.commit_following(txn).await;
        commit_times::record(path, began.elapsed());
        outcome
    }

    fn hold_priority(&self) -> PriorityHold {
        let holds: Vec<PriorityHold> = self.inner.members().iter().flatten().map(|m| m.hold_priority()).collect();
        Box::new(holds)
    }

    fn is_ready(&self) -> bool {
        self.ready_drives() >= self.inner.cfg.geometry.write_quorum()
    }

    async fn close(&self) -> StoreResult<()> {
        undo::flush_cleanup(&self.inner).await;
        let members = self.inner.members();
        let closes = members.iter().flatten().map(|m| m.close());
        let results = futures::future::join_all(closes).await;
        results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_whose_source_the_transaction_makes_again_removes_no_name() {
        let coll = |name: &str| SetColl::<()> { name: name.into(), members: Arc::from(Vec::new()), generation: 0 };
        let (b, other) = (coll("b"), coll("other"));
        let rename = |from: &str, to: &str| Op::<SetColl<()>, ()>::Rename {
            coll: b.clone(),
            from: from.into(),
            to_coll: b.clone(),
            to: to.into(),
        };
        let names = |ops: Vec<Op<SetColl<()>, ()>>| -> Vec<Vec<u8>> {
            removed_names(&ops).into_iter().map(|(c, n)| [c.as_bytes(), b":", &n].concat()).collect()
        };
        // A versioned overwrite: the current version kept under its noncurrent name, the key made anew.
        let overwrite = vec![rename("k", "k-v1"), Op::Reset { coll: b.clone(), name: "k".into() }];
        assert!(names(overwrite).is_empty());
        let cloned_back = vec![
            rename("k", "k-v1"),
            Op::Clone { coll: b.clone(), from: "x".into(), to_coll: b.clone(), to: "k".into() },
        ];
        assert!(names(cloned_back).is_empty());
        // A version promoted in a removed one's place takes its own name away.
        assert_eq!(names(vec![rename("k-v1", "k")]), vec![b"b:k-v1".to_vec()]);
        assert_eq!(
            names(vec![Op::Reset { coll: b.clone(), name: "k".into() }, rename("k", "j")]),
            vec![b"b:k".to_vec()]
        );
        let elsewhere = vec![rename("k", "k-v1"), Op::Reset { coll: other.clone(), name: "k".into() }];
        assert_eq!(names(elsewhere), vec![b"b:k".to_vec()], "made again in another collection");
        let another = vec![rename("k", "k-v1"), Op::Create { coll: b.clone(), name: "j".into() }];
        assert_eq!(names(another), vec![b"b:k".to_vec()]);
        assert_eq!(names(vec![Op::Remove { coll: b.clone(), name: "k".into() }]), vec![b"b:k".to_vec()]);
    }

    #[test]
    fn the_undo_log_is_one_of_the_sets_own_collections() {
        assert!(undo::UNDO_COLLECTION.starts_with(INTERNAL_COLLECTION_PREFIX));
    }

    #[test]
    fn a_paced_log_line_goes_through_once_per_period_and_counts_the_rest() {
        let pace = LogPace::new(std::time::Duration::from_secs(10));
        assert_eq!(pace.allow_at(5_000), Some(0), "the first goes through");
        assert_eq!((pace.allow_at(5_001), pace.allow_at(14_999)), (None, None), "within the period, held back");
        assert_eq!(pace.allow_at(15_000), Some(2), "due again: says how many were held back");
        assert_eq!(pace.allow_at(15_000), None);
        assert_eq!(pace.allow_at(u64::MAX - 1), Some(1));
        let always = LogPace::new(std::time::Duration::ZERO);
        assert_eq!((always.allow(), always.allow()), (Some(0), Some(0)));
    }
}
