//! The undo log: until a write's outcome is known, every drive that applied it keeps, in the same drive
//! transaction, what it needs to put each touched object back (the old object itself, renamed aside; the
//! name an object was renamed to; or the old size and attributes of an object changed in place). When a
//! write quorum committed, the entries are removed in the background (batched); when fewer did, the drives
//! that applied it are put back at once. A crash can leave entries behind: at open, each write they name
//! is settled by the drives' state: if a write quorum holds what the write left, it stands (the entries
//! go), else every drive that holds it is put back, newest write first. An acknowledged write always
//! stands; an unacknowledged one is wholly there or wholly absent.
//!
//! Each entry names the drives the write was sent to, by their incarnations: a random id each drive keeps
//! in the set's `.ec-member` collection, drawn when the set first prepares it. A drive put in a slot since
//! (a replacement, or a cluster group's new drive after a step) was never sent the write: its lack of the
//! write says nothing of whether the drive it replaced took it.

use crate::read::{DriveState, drive_state};
use crate::{SetColl, SetInner};
use mosaic_store::{ErrorKind, Op, Snapshot, Store, StoreError, StoreResult, Txn};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Each drive's collection of undo entries (one object per entry, named write id + entry index).
pub(crate) const UNDO_COLLECTION: &str = ".ec-undo";
/// The attribute holding an entry.
pub(crate) const UNDO_ATTR: &[u8] = b"ec.undo";
/// Version 2 adds the incarnations of the drives the write was sent to; version 1 entries are still read.
const UNDO_VERSION: u8 = 2;
/// Each drive's collection holding its incarnation (one object).
pub(crate) const MEMBER_COLLECTION: &str = ".ec-member";
const INCARNATION_OBJECT: &[u8] = b"incarnation";
const INCARNATION_ATTR: &[u8] = b"ec.incarnation";
const INCARNATION_VERSION: u8 = 1;
/// Largest encoded entry (it is one attribute).
pub(crate) const UNDO_ENTRY_MAX_BYTES: usize = 60 << 10;
/// Most entries recovery reads from one drive at open (cleanup keeps the log short).
const RECOVERY_ENTRIES_MAX: usize = 1 << 20;
/// Entries removed per drive transaction by the cleaner.
const CLEANUP_BATCH: usize = 1024;

/// How to put one object back on one drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum UndoAction {
    /// The old object was renamed to this entry's own object: rename it back.
    Restore,
    /// The object did not exist on the drive before the write: remove it.
    RemoveCreated,
    /// The old object was cloned to this entry's own object before bytes of it were overwritten: rename
    /// it back, with the listing tag it had (a clone takes none).
    RestoreCopy { tag: Option<Vec<u8>> },
    /// The object was changed in place: set back its size, attributes, listing tag and priority.
    Revert { old_size: u64, attrs: Vec<(Vec<u8>, Option<Vec<u8>>)>, tag: Option<Vec<u8>>, priority: bool },
    /// The old object was renamed to `from` (same collection): rename it back over whatever the write left
    /// at this name, if `from` still holds that object (its layout's write id is `from_target`). Applied
    /// before the drive's other entries of the write, since one of them may put back an object that was
    /// at `from` before.
    RenameBack { from: Vec<u8>, from_target: [u8; 16] },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UndoEntry {
    pub(crate) coll: String,
    pub(crate) name: Vec<u8>,
    /// What the write left the object as: its layout's write id, or None when it removed it.
    pub(crate) target: Option<[u8; 16]>,
    pub(crate) action: UndoAction,
    /// By slot, the incarnation of the drive the write was sent to (0: none, or a drive without one). None
    /// in a version 1 entry.
    pub(crate) sent_to: Option<Vec<u64>>,
}

/// A drive's entries of one write: (entry object, entry).
type DriveEntries = Vec<(Vec<u8>, UndoEntry)>;

/// The name of entry `index` of write `write_id`.
pub(crate) fn entry_name(write_id: &[u8; 16], index: u32) -> Vec<u8> {
    let mut n = write_id.to_vec();
    n.extend_from_slice(&index.to_be_bytes());
    n
}

fn put_bytes(v: &mut Vec<u8>, b: &[u8]) {
    v.extend_from_slice(&(b.len() as u32).to_be_bytes());
    v.extend_from_slice(b);
}

fn put_opt(v: &mut Vec<u8>, b: &Option<Vec<u8>>) {
    match b {
        Some(b) => {
            v.push(1);
            put_bytes(v, b);
        }
        None => v.push(0),
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("an undo entry ends early".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn opt(&mut self) -> Result<Option<Vec<u8>>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.bytes().map(Some),
            x => Err(format!("an undo entry has a bad flag {x}")),
        }
    }
}

impl UndoEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![UNDO_VERSION];
        put_bytes(&mut v, self.coll.as_bytes());
        put_bytes(&mut v, &self.name);
        put_opt(&mut v, &self.target.map(|t| t.to_vec()));
        match &self.action {
            UndoAction::Restore => v.push(0),
            UndoAction::RemoveCreated => v.push(1),
            UndoAction::RestoreCopy { tag } => {
                v.push(3);
                put_opt(&mut v, tag);
            }
            UndoAction::RenameBack { from, from_target } => {
                v.push(4);
                put_bytes(&mut v, from);
                v.extend_from_slice(from_target);
            }
            UndoAction::Revert { old_size, attrs, tag, priority } => {
                v.push(2);
                v.extend_from_slice(&old_size.to_be_bytes());
                put_opt(&mut v, tag);
                v.push(u8::from(*priority));
                v.extend_from_slice(&(attrs.len() as u32).to_be_bytes());
                for (k, val) in attrs {
                    put_bytes(&mut v, k);
                    put_opt(&mut v, val);
                }
            }
        }
        let sent_to = self.sent_to.as_deref().unwrap_or_default();
        debug_assert!(self.sent_to.is_some(), "new entries name the drives their write was sent to");
        debug_assert!(sent_to.len() <= crate::MAX_SET_DRIVES, "a set has at most {} drives", crate::MAX_SET_DRIVES);
        v.push(sent_to.len() as u8);
        for incarnation in sent_to {
            v.extend_from_slice(&incarnation.to_be_bytes());
        }
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v) as u32;
        v.extend_from_slice(&crc.to_be_bytes());
        debug_assert_eq!(Self::decode(&v).as_ref(), Ok(self), "an undo entry decodes back before it is written");
        v
    }

    pub(crate) fn decode(raw: &[u8]) -> Result<Self, String> {
        if raw.len() < 5 {
            return Err("a short undo entry".into());
        }
        let (body, crc) = raw.split_at(raw.len() - 4);
        if crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
            != u32::from_be_bytes(crc.try_into().expect("4 bytes"))
        {
            return Err("an undo entry fails its checksum".into());
        }
        let mut c = Cursor(body);
        let version = c.u8()?;
        if !(1..=UNDO_VERSION).contains(&version) {
            return Err(format!("an undo entry of an unknown version {version}"));
        }
        let coll = String::from_utf8(c.bytes()?).map_err(|_| "an undo entry's collection is not UTF-8")?;
        let name = c.bytes()?;
        let target = match c.opt()? {
            Some(t) => Some(t.try_into().map_err(|_| "an undo entry's target is not a write id")?),
            None => None,
        };
        let action = match c.u8()? {
            0 => UndoAction::Restore,
            1 => UndoAction::RemoveCreated,
            3 => UndoAction::RestoreCopy { tag: c.opt()? },
            4 => {
                let from = c.bytes()?;
                let from_target = c.take(16)?.try_into().expect("16 bytes");
                UndoAction::RenameBack { from, from_target }
            }
            2 => {
                let old_size = c.u64()?;
                let tag = c.opt()?;
                let priority = c.u8()? != 0;
                let n = c.u32()? as usize;
                if n > 1 << 16 {
                    return Err("an undo entry with too many attributes".into());
                }
                let mut attrs = Vec::with_capacity(n);
                for _ in 0..n {
                    attrs.push((c.bytes()?, c.opt()?));
                }
                UndoAction::Revert { old_size, attrs, tag, priority }
            }
            x => return Err(format!("an undo entry of kind {x}")),
        };
        let sent_to = if version >= 2 {
            let n = c.u8()? as usize;
            if n > crate::MAX_SET_DRIVES {
                return Err(format!("an undo entry names {n} drives"));
            }
            Some((0..n).map(|_| c.u64()).collect::<Result<Vec<u64>, String>>()?)
        } else {
            None
        };
        if !c.0.is_empty() {
            return Err("an undo entry with trailing bytes".into());
        }
        Ok(UndoEntry { coll, name, target, action, sent_to })
    }
}

/// A drive's part in the set's undo log: its undo-log collection (None: it cannot take logged writes)
/// and its incarnation (0: none, for a drive of a one-drive set, which keeps no log, or one that could
/// not record it).
#[derive(Clone, Debug)]
pub(crate) struct DriveLog<C> {
    pub(crate) undo: Option<C>,
    pub(crate) incarnation: u64,
}

impl<C> Default for DriveLog<C> {
    fn default() -> Self {
        DriveLog { undo: None, incarnation: 0 }
    }
}

/// Makes sure every present drive has its undo-log collection and its incarnation (the drives at once).
pub(crate) async fn prepare<S: Store>(members: &[Option<Arc<S>>]) -> Vec<DriveLog<S::Coll>> {
    futures::future::join_all(members.iter().map(|m| async move {
        match m {
            Some(store) => prepare_one(store, members.len()).await,
            None => DriveLog::default(),
        }
    }))
    .await
}

/// `prepare` for one drive of a set of `drives`.
pub(crate) async fn prepare_one<S: Store>(store: &Arc<S>, drives: usize) -> DriveLog<S::Coll> {
    let undo = match ensure_collection(store, UNDO_COLLECTION).await {
        Ok(Some(c)) => Some(c),
        Ok(None) => {
            tracing::warn!("a drive cannot take writes; it joins the set read-only");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "a drive did not answer; it joins the set as failed");
            None
        }
    };
    // A one-drive set logs nothing, so nothing needs to tell its drives apart.
    let incarnation = if drives > 1 && undo.is_some() {
        incarnation(store).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "a drive's incarnation cannot be read or recorded; its writes name none");
            0
        })
    } else {
        0
    };
    DriveLog { undo, incarnation }
}

/// The collection `name` on the drive, created if missing (None: the drive cannot create it).
async fn ensure_collection<S: Store>(store: &Arc<S>, name: &str) -> StoreResult<Option<S::Coll>> {
    if let Some(c) = store.snapshot().collection(name).await? {
        return Ok(Some(c));
    }
    match store.commit(Txn::new().op(Op::CreateCollection { name: name.into() })).await {
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::CollectionExists => {}
        Err(e) => {
            tracing::debug!(error = %e, collection = name, "a drive cannot create a collection");
            return Ok(None);
        }
    }
    store.snapshot().collection(name).await
}

/// The drive's incarnation, drawn and recorded the first time (another process preparing the same drive
/// at once may record first: then its id is the one read back).
async fn incarnation<S: Store>(store: &Arc<S>) -> StoreResult<u64> {
    let Some(coll) = ensure_collection(store, MEMBER_COLLECTION).await? else {
        return Err(StoreError::unavailable("the drive cannot take the member collection"));
    };
    for _ in 0..2 {
        let snap = store.snapshot();
        if let Some(info) = snap.lookup(&coll, INCARNATION_OBJECT).await? {
            let raw = snap.attr(&info.obj, INCARNATION_ATTR).await?.unwrap_or_default();
            return decode_incarnation(&raw).map_err(|e| StoreError::new(ErrorKind::Corrupt, e));
        }
        let drawn = rand::random::<u64>().max(1);
        let txn = Txn::new().op(Op::Create { coll: coll.clone(), name: INCARNATION_OBJECT.to_vec() }).op(Op::SetAttr {
            coll: coll.clone(),
            name: INCARNATION_OBJECT.to_vec(),
            key: INCARNATION_ATTR.to_vec(),
            value: encode_incarnation(drawn),
        });
        match store.commit(txn).await {
            Ok(_) => return Ok(drawn),
            Err(e) if e.kind == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable("the drive's incarnation was recorded and then went"))
}

fn encode_incarnation(incarnation: u64) -> Vec<u8> {
    assert!(incarnation != 0, "0 names no incarnation");
    let mut v = vec![INCARNATION_VERSION];
    v.extend_from_slice(&incarnation.to_be_bytes());
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v) as u32;
    v.extend_from_slice(&crc.to_be_bytes());
    v
}

fn decode_incarnation(raw: &[u8]) -> Result<u64, String> {
    let [version, id @ .., c0, c1, c2, c3] = raw else { return Err("a short incarnation record".into()) };
    if crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &raw[..raw.len() - 4]) as u32
        != u32::from_be_bytes([*c0, *c1, *c2, *c3])
    {
        return Err("an incarnation record fails its checksum".into());
    }
    if *version != INCARNATION_VERSION {
        return Err(format!("an incarnation record of an unknown version {version}"));
    }
    let id: [u8; 8] = id.try_into().map_err(|_| "an incarnation record of a wrong length")?;
    match u64::from_be_bytes(id) {
        0 => Err("an incarnation record of id 0".into()),
        id => Ok(id),
    }
}

/// The ops that put one object back on a drive, given its entry (whose own object is `entry_obj`).
/// `exists`: whether the object is on the drive; for a rename back, whether the name it was renamed to
/// still holds it as the write left it.
pub(crate) fn undo_ops<C: Clone, St>(
    coll: &C,
    undo_coll: &C,
    entry_obj: &[u8],
    e: &UndoEntry,
    exists: bool,
) -> Vec<Op<C, St>> {
    let name = e.name.clone();
    let remove_entry = Op::Remove { coll: undo_coll.clone(), name: entry_obj.to_vec() };
    match &e.action {
        UndoAction::Restore => vec![
            Op::Rename { coll: undo_coll.clone(), from: entry_obj.to_vec(), to_coll: coll.clone(), to: name.clone() },
            Op::RemoveAttr { coll: coll.clone(), name, key: UNDO_ATTR.to_vec() },
        ],
        UndoAction::RestoreCopy { tag } => {
            let mut ops = vec![
                Op::Rename {
                    coll: undo_coll.clone(),
                    from: entry_obj.to_vec(),
                    to_coll: coll.clone(),
                    to: name.clone(),
                },
                Op::RemoveAttr { coll: coll.clone(), name: name.clone(), key: UNDO_ATTR.to_vec() },
            ];
            if let Some(t) = tag {
                ops.push(Op::SetNameTag { coll: coll.clone(), name, tag: t.clone() });
            }
            ops
        }
        UndoAction::RenameBack { from, .. } if exists => {
            vec![Op::Rename { coll: coll.clone(), from: from.clone(), to_coll: coll.clone(), to: name }, remove_entry]
        }
        UndoAction::RenameBack { from, .. } => {
            // A later write that stood changed or removed it: that write decided its fate.
            tracing::warn!(from = %from.escape_ascii(), "a renamed object is not where its write left it; not renamed back");
            vec![remove_entry]
        }
        UndoAction::RemoveCreated if exists => vec![Op::Remove { coll: coll.clone(), name }, remove_entry],
        UndoAction::RemoveCreated => vec![remove_entry],
        UndoAction::Revert { old_size, attrs, tag, priority } => {
            let mut ops = vec![Op::Truncate { coll: coll.clone(), name: name.clone(), size_bytes: *old_size }];
            for (k, v) in attrs {
                ops.push(match v {
                    Some(v) => Op::SetAttr { coll: coll.clone(), name: name.clone(), key: k.clone(), value: v.clone() },
                    None => Op::RemoveAttr { coll: coll.clone(), name: name.clone(), key: k.clone() },
                });
            }
            if let Some(t) = tag {
                ops.push(Op::SetNameTag { coll: coll.clone(), name: name.clone(), tag: t.clone() });
            }
            ops.push(Op::SetPriority { coll: coll.clone(), name, high: *priority });
            ops.push(remove_entry);
            ops
        }
    }
}

/// Whether object `e` is, on drive `d`, in the state the write left it (so that undoing it is right).
async fn in_target_state<S: Store>(
    set: &SetInner<S>,
    d: usize,
    coll: &SetColl<S::Coll>,
    e: &UndoEntry,
) -> Option<bool> {
    match drive_state(set, d, coll, &e.name).await {
        DriveState::Failed => None,
        DriveState::Absent => Some(e.target.is_none()),
        DriveState::Present { layout, .. } => Some(e.target == Some(layout.write_id)),
    }
}

/// Puts a drive's objects back as the write found them (its entries, in any order) and drops the entries.
pub(crate) async fn undo_on_drive<S: Store>(
    set: &SetInner<S>,
    d: usize,
    entries: &[(Vec<u8>, UndoEntry)],
) -> StoreResult<()> {
    let (Some(store), Some(undo_coll)) = (set.member(d), set.undo_coll(d)) else {
        return Err(StoreError::unavailable(format!("drive {d} is missing")));
    };
    let snap = store.snapshot();
    let mut txn: Txn<S::Coll, S::Staged> = Txn::new();
    // Renames back come first: another entry of the same write may put back what was at a rename's
    // destination before it.
    let is_rename = |e: &UndoEntry| matches!(e.action, UndoAction::RenameBack { .. });
    let ordered = entries.iter().filter(|(_, e)| is_rename(e)).chain(entries.iter().filter(|(_, e)| !is_rename(e)));
    for (entry_obj, e) in ordered {
        match snap.collection(&e.coll).await? {
            Some(c) => {
                let exists = match &e.action {
                    UndoAction::RenameBack { from, from_target } => holds_write(&snap, &c, from, from_target).await?,
                    _ => snap.lookup(&c, &e.name).await?.is_some(),
                };
                // Only what the write left is put back: in a cluster another node's write of the same
                // name (its key locks are its own) may have replaced it since, and was perhaps
                // acknowledged; it decided the object's fate, and the entry only goes.
                let replaced = !matches!(e.action, UndoAction::RenameBack { .. })
                    && !e.coll.is_empty()
                    && !holds_target(&snap, &c, &e.name, e.target).await?;
                if replaced {
                    tracing::debug!(name = %e.name.escape_ascii(), "a failed write's object was replaced since; not put back");
                    txn.ops.push(Op::Remove { coll: undo_coll.clone(), name: entry_obj.clone() });
                } else {
                    txn.ops.extend(undo_ops(&c, &undo_coll, entry_obj, e, exists));
                }
            }
            // The collection went (it was only ever on this drive): nothing to put back.
            None => txn.ops.push(Op::Remove { coll: undo_coll.clone(), name: entry_obj.clone() }),
        }
    }
    store.commit(txn).await.map(|_| ())
}

/// Whether the drive holds object `name` as a write left it: with the layout of write `target`, or absent
/// when the write removed it.
async fn holds_target<Sn: Snapshot>(
    snap: &Sn,
    coll: &Sn::Coll,
    name: &[u8],
    target: Option<[u8; 16]>,
) -> StoreResult<bool> {
    match target {
        Some(write_id) => holds_write(snap, coll, name, &write_id).await,
        None => Ok(snap.lookup(coll, name).await?.is_none()),
    }
}

/// Whether object `name` is on the drive with the layout write `write_id` left.
async fn holds_write<Sn: Snapshot>(snap: &Sn, coll: &Sn::Coll, name: &[u8], write_id: &[u8; 16]) -> StoreResult<bool> {
    let Some(info) = snap.lookup(coll, name).await? else { return Ok(false) };
    let raw = snap.attr(&info.obj, crate::LAYOUT_ATTR).await?;
    Ok(raw.and_then(|r| crate::layout::ObjectLayout::decode(&r).ok()).is_some_and(|l| l.write_id == *write_id))
}

/// Queues the removal of a committed write's entries on the drives that applied it.
pub(crate) fn queue_cleanup<S: Store>(set: &SetInner<S>, entries: Vec<(usize, Vec<u8>)>) {
    let mut pending = set.cleanup.lock();
    for (d, name) in entries {
        pending[d].push(name);
    }
    // Under load most entries leave with a later write to their drive (`take_for_write`); the cleaner is
    // woken early only when a drive's queue fills a batch, else it comes by on its tick.
    if pending.iter().any(|p| p.len() >= CLEANUP_BATCH) {
        set.cleanup_wake.notify_one();
    }
}

/// Entries removed by a write's own drive transaction, at most this many (no extra sync for cleanup).
const CLEANUP_PER_WRITE: usize = 128;

/// Takes up to `CLEANUP_PER_WRITE` of drive `d`'s queued entries for a write about to commit there: the
/// removals of `(undo collection, names)`; `requeue` gives them back if that commit fails.
pub(crate) fn take_for_write<S: Store>(set: &SetInner<S>, d: usize) -> Option<(S::Coll, Vec<Vec<u8>>)> {
    let coll = set.undo_coll(d)?;
    let mut pending = set.cleanup.lock();
    let q = &mut pending[d];
    if q.is_empty() {
        return None;
    }
    let n = q.len().min(CLEANUP_PER_WRITE);
    let names: Vec<Vec<u8>> = q.drain(q.len() - n..).collect();
    Some((coll, names))
}

/// Puts back entries a failed drive transaction did not remove.
pub(crate) fn requeue<S: Store>(set: &SetInner<S>, d: usize, names: Vec<Vec<u8>>) {
    set.cleanup.lock()[d].extend(names);
}

/// Removes queued entries, at most `CLEANUP_BATCH` per drive; returns how many remain queued.
pub(crate) async fn clean_some<S: Store>(set: &SetInner<S>) -> usize {
    if set.check_alive().is_err() {
        return 0;
    }
    let batches: Vec<Vec<Vec<u8>>> = {
        let mut pending = set.cleanup.lock();
        pending.iter_mut().map(|p| p.drain(..p.len().min(CLEANUP_BATCH)).collect()).collect()
    };
    let work = batches.into_iter().enumerate().filter(|(_, b)| !b.is_empty()).map(|(d, batch)| async move {
        let (Some(store), Some(coll)) = (set.member(d), set.undo_coll(d)) else { return };
        let ops = batch.into_iter().flat_map(|name| removal(set, &coll, name)).collect();
        let result = store.commit(Txn { ops, priority: Some(mosaic_store::Priority::Background) }).await;
        // A drive that fails here keeps its entries: recovery removes them at the next open.
        if let Err(e) = result {
            tracing::debug!(drive = d, error = %e, "undo-log cleanup failed");
        }
    });
    futures::future::join_all(work).await;
    set.cleanup.lock().iter().map(Vec::len).sum()
}

/// The operations that remove a settled write's entry `name` from a drive's undo log. A set that does not
/// settle at open shares its drives with one that does (a cluster's group owner), which may have removed
/// the entry already: there the removal holds whether or not the entry is still there (a reset makes it
/// exist first), so that it cannot fail the transaction it rides in.
pub(crate) fn removal<S: Store>(set: &SetInner<S>, coll: &S::Coll, name: Vec<u8>) -> Vec<Op<S::Coll, S::Staged>> {
    if set.cfg.settle_at_open == crate::Settle::All {
        vec![Op::Remove { coll: coll.clone(), name }]
    } else {
        vec![Op::Reset { coll: coll.clone(), name: name.clone() }, Op::Remove { coll: coll.clone(), name }]
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Removes every queued entry (at close).
pub(crate) async fn flush_cleanup<S: Store>(set: &SetInner<S>) {
    for _ in 0..RECOVERY_ENTRIES_MAX / CLEANUP_BATCH {
        if clean_some(set).await == 0 {
            return;
        }
    }
}

/// Every entry a drive holds, by write id.
async fn drive_entries<S: Store>(set: &SetInner<S>, d: usize) -> StoreResult<Vec<(Vec<u8>, UndoEntry)>> {
    let (Some(store), Some(coll)) = (set.member(d), set.undo_coll(d)) else { return Ok(Vec::new()) };
    let snap = store.snapshot();
    let mut out = Vec::new();
    let mut from = Vec::new();
    loop {
        let page = snap.list_entries(&coll, b"", &from, 1000).await?;
        let Some(last) = page.last() else { break };
        from = last.name.clone();
        from.push(0);
        let full = page.len() == 1000;
        for e in page {
            let raw = snap.attr(&e.obj, UNDO_ATTR).await?;
            match raw.as_deref().map(UndoEntry::decode) {
                Some(Ok(entry)) => out.push((e.name, entry)),
                // An entry written without its value, or damaged: nothing to put back from it.
                other => {
                    tracing::warn!(drive = d, problem = ?other.map(|r| r.err()), "an undo entry cannot be read; dropped");
                    out.push((
                        e.name,
                        UndoEntry {
                            coll: String::new(),
                            name: Vec::new(),
                            target: None,
                            action: UndoAction::RemoveCreated,
                            sent_to: None,
                        },
                    ));
                }
            }
        }
        if out.len() > RECOVERY_ENTRIES_MAX {
            return Err(StoreError::new(
                ErrorKind::Limit,
                format!("drive {d} holds more than {RECOVERY_ENTRIES_MAX} undo entries"),
            ));
        }
        if !full {
            break;
        }
    }
    Ok(out)
}

/// Settles every write that a crash left undecided (see the module comment).
pub(crate) async fn recover<S: Store>(set: &Arc<SetInner<S>>) -> StoreResult<()> {
    // write id -> drive -> entries
    let mut writes: BTreeMap<[u8; 16], BTreeMap<usize, DriveEntries>> = BTreeMap::new();
    // Writes that began after this are left alone (they may be in flight elsewhere); ids start with the
    // time they began, in nanoseconds.
    let newest_ns = match set.cfg.settle_at_open {
        crate::Settle::All => u64::MAX,
        crate::Settle::OlderThan(grace) => now_ns().saturating_sub(grace.as_nanos() as u64),
        crate::Settle::Never => return Ok(()),
    };
    for d in 0..set.drives() {
        for (obj, entry) in drive_entries(set, d).await? {
            let id: [u8; 16] = obj.get(..16).and_then(|p| p.try_into().ok()).unwrap_or_default();
            if u64::from_be_bytes(id[..8].try_into().expect("8 bytes")) > newest_ns {
                continue;
            }
            writes.entry(id).or_default().entry(d).or_default().push((obj, entry));
        }
    }
    if writes.is_empty() {
        return Ok(());
    }
    tracing::info!(writes = writes.len(), "settling writes that a restart left undecided");
    let quorum = set.geometry().write_quorum();
    let snap = crate::read::SetSnapshot::new(set.clone());
    // Newest first (write ids sort in the order writes began): undoing a newer write of a name brings back
    // what an older one left, which is then judged on what the drives hold after that. Oldest first, an
    // acknowledged write would be undone on the drives where a newer one failed, and the name lost.
    for (_, drives) in writes.into_iter().rev() {
        // The write stands if, for every object it touched, a write quorum holds what it left. It may have
        // been acknowledged if the drives that did not answer, and the drives it was sent to that were
        // replaced since, could make up that quorum: then, while the drives here and those that may come
        // back hold k of it, it is left for a later settling (a drive that comes back is settled when it
        // is put in; heal rebuilds the write on a replacement), since undoing it on the drives that hold
        // it could take an acknowledged write below k shards for good.
        let mut stands = true;
        let mut may_stand = true;
        let objects: BTreeMap<(String, Vec<u8>), UndoEntry> = drives
            .values()
            .flatten()
            .filter(|(_, e)| !e.coll.is_empty())
            .map(|(_, e)| ((e.coll.clone(), e.name.clone()), e.clone()))
            .collect();
        for e in objects.values() {
            let Some(coll) = snap.collection(&e.coll).await.ok().flatten() else { continue };
            let witnesses = Witnesses::count(set, &coll, e).await;
            stands &= witnesses.held >= quorum;
            may_stand &= witnesses.may_have_been_acknowledged(quorum) && witnesses.recoverable(set.geometry().data);
        }
        if !stands && may_stand {
            set.counters.writes_left_undecided_at_open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("a write a restart left undecided stays so until the drives that did not answer do");
            continue;
        }
        let counter = if stands { &set.counters.writes_kept_at_open } else { &set.counters.writes_undone_at_open };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (d, entries) in drives {
            let result = if stands {
                let names = entries.into_iter().map(|(n, _)| n).collect();
                remove_entries(set, d, names).await
            } else {
                let mut to_undo = Vec::new();
                let mut to_drop = Vec::new();
                for (n, e) in entries {
                    let coll = if e.coll.is_empty() { None } else { snap.collection(&e.coll).await.ok().flatten() };
                    match coll {
                        Some(c) if in_target_state(set, d, &c, &e).await == Some(true) => to_undo.push((n, e)),
                        _ => to_drop.push(n),
                    }
                }
                match undo_on_drive(set, d, &to_undo).await {
                    Ok(()) => remove_entries(set, d, to_drop).await,
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = result {
                tracing::warn!(drive = d, error = %e, "a drive could not settle an undecided write; it stays for the next open");
            }
        }
    }
    Ok(())
}

/// What a set's drives say of one object of an undecided write.
#[derive(Debug, Default, PartialEq, Eq)]
struct Witnesses {
    /// Drives that hold what the write left.
    held: usize,
    /// Drives that did not answer (they may come back holding it).
    unknown: usize,
    /// Slots whose drive the write was sent to was replaced since (that drive may have taken it, and will
    /// not answer again); their drive now lacks it.
    replaced: usize,
}

impl Witnesses {
    async fn count<S: Store>(set: &SetInner<S>, coll: &SetColl<S::Coll>, e: &UndoEntry) -> Witnesses {
        let mut w = Witnesses::default();
        for d in 0..set.drives() {
            match in_target_state(set, d, coll, e).await {
                Some(true) => w.held += 1,
                Some(false) if was_replaced(e, d, set.incarnation(d)) => w.replaced += 1,
                Some(false) => {}
                None => w.unknown += 1,
            }
        }
        debug_assert!(w.held + w.unknown + w.replaced <= set.drives());
        w
    }

    /// Whether a write quorum may have taken the write.
    fn may_have_been_acknowledged(&self, quorum: usize) -> bool {
        self.held + self.unknown + self.replaced >= quorum
    }

    /// Whether the write can still be read once the drives that did not answer come back: where a slot's
    /// drive was replaced, its shard is gone for good, and a write left with fewer than k shards is lost
    /// whatever settling does (undoing it puts back what it replaced). Without replacements, any write
    /// that may have been acknowledged is.
    fn recoverable(&self, k: usize) -> bool {
        self.replaced == 0 || self.held + self.unknown >= k
    }
}

/// Whether slot `d` holds another drive than the one entry `e`'s write was sent to (whose incarnation it
/// names): a drive that was never sent the write cannot say it failed. A slot the write named no drive
/// for, or an entry that names none (version 1), counts as the same drive.
fn was_replaced(e: &UndoEntry, d: usize, incarnation_now: u64) -> bool {
    let sent = e.sent_to.as_ref().and_then(|s| s.get(d)).copied().unwrap_or(0);
    sent != 0 && sent != incarnation_now
}

async fn remove_entries<S: Store>(set: &SetInner<S>, d: usize, names: Vec<Vec<u8>>) -> StoreResult<()> {
    let (Some(store), Some(coll)) = (set.member(d), set.undo_coll(d)) else { return Ok(()) };
    if names.is_empty() {
        return Ok(());
    }
    let ops = names.into_iter().map(|name| Op::Remove { coll: coll.clone(), name }).collect();
    store.commit(Txn { ops, priority: None }).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_refuse_damage() {
        let entries = [
            UndoEntry {
                coll: "b/x".into(),
                name: b"k".to_vec(),
                target: Some([3; 16]),
                action: UndoAction::Restore,
                sent_to: Some(vec![7, 0, u64::MAX]),
            },
            UndoEntry {
                coll: "mpu".into(),
                name: vec![0, 255],
                target: None,
                action: UndoAction::RemoveCreated,
                sent_to: Some(vec![1; crate::MAX_SET_DRIVES]),
            },
            UndoEntry {
                coll: "b/z".into(),
                name: b"appended".to_vec(),
                target: Some([4; 16]),
                action: UndoAction::RestoreCopy { tag: Some(b"listing tag".to_vec()) },
                sent_to: Some(vec![]),
            },
            UndoEntry {
                coll: "b/z".into(),
                name: b"u".to_vec(),
                target: None,
                action: UndoAction::RestoreCopy { tag: None },
                sent_to: Some(vec![3, 4]),
            },
            UndoEntry {
                coll: "b/v".into(),
                name: b"key".to_vec(),
                target: Some([5; 16]),
                action: UndoAction::RenameBack { from: b"key\0v1\0key".to_vec(), from_target: [6; 16] },
                sent_to: Some(vec![5, 6, 7, 8]),
            },
            UndoEntry {
                coll: "b/y".into(),
                name: b"log".to_vec(),
                target: Some([9; 16]),
                action: UndoAction::Revert {
                    old_size: 12_345,
                    attrs: vec![(b"s3.meta".to_vec(), Some(b"{}".to_vec())), (b"s3.tags".to_vec(), None)],
                    tag: Some(b"t".to_vec()),
                    priority: true,
                },
                sent_to: Some(vec![9; 6]),
            },
        ];
        for e in entries {
            let raw = e.encode();
            assert_eq!(UndoEntry::decode(&raw), Ok(e));
            let mut bad = raw.clone();
            bad[3] ^= 1;
            assert!(UndoEntry::decode(&bad).is_err());
            assert!(UndoEntry::decode(&raw[..raw.len() - 1]).is_err());
        }
        assert_eq!(entry_name(&[1; 16], 7)[16..], [0, 0, 0, 7]);
    }

    /// Seals `body` as an entry is sealed (its crc32c at the end).
    fn sealed(mut body: Vec<u8>) -> Vec<u8> {
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &body) as u32;
        body.extend_from_slice(&crc.to_be_bytes());
        body
    }

    /// Entries written before the drives were named (version 1) are still read, naming none; a version
    /// past the known ones, and a count of drives past a set's, are refused.
    #[test]
    fn version_one_entries_are_read_and_unknown_versions_refused() {
        let e = UndoEntry {
            coll: "b/x".into(),
            name: b"k".to_vec(),
            target: Some([3; 16]),
            action: UndoAction::Restore,
            sent_to: Some(vec![1, 2]),
        };
        let raw = e.encode();
        let body = &raw[..raw.len() - 4];
        // Version 1: the same fields without the drive count and incarnations (1 + 2 * 8 bytes).
        let mut v1 = body[..body.len() - 17].to_vec();
        v1[0] = 1;
        assert_eq!(UndoEntry::decode(&sealed(v1)), Ok(UndoEntry { sent_to: None, ..e.clone() }));
        let mut v3 = body.to_vec();
        v3[0] = UNDO_VERSION + 1;
        assert!(UndoEntry::decode(&sealed(v3)).unwrap_err().contains("unknown version"));
        let mut too_many = body[..body.len() - 17].to_vec();
        too_many.push(crate::MAX_SET_DRIVES as u8 + 1);
        too_many.extend(std::iter::repeat_n(1u8, 8 * (crate::MAX_SET_DRIVES + 1)));
        assert!(UndoEntry::decode(&sealed(too_many)).unwrap_err().contains("names 17 drives"));
    }

    #[test]
    fn incarnations_round_trip_and_refuse_damage() {
        for id in [1, 0x0102_0304_0506_0708, u64::MAX] {
            let raw = encode_incarnation(id);
            assert_eq!(decode_incarnation(&raw), Ok(id));
            for i in 0..raw.len() {
                let mut bad = raw.clone();
                bad[i] ^= 0x10;
                assert!(decode_incarnation(&bad).is_err(), "byte {i} flipped");
            }
            assert!(decode_incarnation(&raw[..raw.len() - 1]).is_err());
        }
        let mut next = encode_incarnation(5);
        next[0] = INCARNATION_VERSION + 1;
        let next = sealed(next[..9].to_vec());
        assert!(decode_incarnation(&next).unwrap_err().contains("unknown version"));
        assert!(decode_incarnation(&sealed([[INCARNATION_VERSION].as_slice(), &[0; 8]].concat())).is_err(), "id 0");
    }

    #[test]
    fn a_slot_counts_as_replaced_only_when_it_holds_another_drive_than_the_write_named() {
        let e = |sent_to: Option<Vec<u64>>| UndoEntry {
            coll: "c".into(),
            name: b"k".to_vec(),
            target: Some([1; 16]),
            action: UndoAction::RemoveCreated,
            sent_to,
        };
        let named = e(Some(vec![11, 0, 13]));
        assert!(!was_replaced(&named, 0, 11), "the same drive");
        assert!(was_replaced(&named, 0, 99), "another drive");
        assert!(was_replaced(&named, 0, 0), "a drive without an incarnation");
        assert!(!was_replaced(&named, 1, 42), "the write named no drive there");
        assert!(!was_replaced(&named, 5, 42), "past the slots named");
        assert!(!was_replaced(&e(None), 0, 42), "a version 1 entry names none");
    }

    #[test]
    fn a_write_with_replaced_drives_is_kept_while_k_of_it_may_be_read() {
        let w = |held, unknown, replaced| Witnesses { held, unknown, replaced };
        // 2+2, quorum 3: two hold it, one slot replaced: may have been acknowledged, and k hold it.
        assert!(w(2, 0, 1).may_have_been_acknowledged(3) && w(2, 0, 1).recoverable(2));
        // Without the replaced slot it is judged as before: two of four cannot be a quorum.
        assert!(!w(2, 0, 0).may_have_been_acknowledged(3));
        // 2+1, quorum 2: one holds it, the other drive it reached was replaced: lost whatever is done.
        assert!(w(1, 0, 1).may_have_been_acknowledged(2) && !w(1, 0, 1).recoverable(2));
        // A drive that may come back counts toward k.
        assert!(w(1, 1, 1).recoverable(2));
        // Nothing replaced: recoverable is not asked of it (as before the drives were named).
        assert!(w(0, 3, 0).recoverable(4));
    }
}
