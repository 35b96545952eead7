//! Reading a set: every lookup asks all drives for the object's layout and takes the version that the most
//! drives hold, if at least a read quorum holds it (paper 004: metadata reads scale with the drives). Data
//! comes from the k data shards when their drives hold that version and read cleanly (no decoding), else
//! from any k shards, rebuilt; the tail comes from one of its holders. Listing merges the drives' ordered
//! name iterators and shows a name only when a quorum of drives holds it.

use crate::codec::codec_by_id;
use crate::layout::{ObjectLayout, SHARD_UNIT_BYTES, join_shards, stripes_covering};
use crate::{LAYOUT_ATTR, SetColl, SetInner};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::join_all;
use mosaic_store::{ErrorKind, NameEntry, ObjectInfo, Snapshot, Store, StoreError, StoreResult, StripedBuffer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// What one drive holds of an object.
pub(crate) enum DriveState<S: Store> {
    /// The drive is missing or did not answer.
    Failed,
    Absent,
    /// A version, with the drive's snapshot and handle to read it.
    Present {
        layout: ObjectLayout,
        snap: Arc<S::Snapshot>,
        obj: S::Obj,
        info: ObjectInfo<S::Obj>,
    },
}

/// A drive's snapshot and its handle to an object in it.
pub(crate) type Holder<S> = (Arc<<S as Store>::Snapshot>, <S as Store>::Obj);

/// An object as a quorum of the set's drives holds it.
pub(crate) struct Resolved<S: Store> {
    pub(crate) layout: ObjectLayout,
    /// The drives holding the agreed version (by slot), among those asked.
    pub(crate) holders: Vec<Option<Holder<S>>>,
    /// The drives that were asked (a bit per slot): all of them, or only the k of the fast path.
    pub(crate) asked: u16,
    pub(crate) mtime_ns: u64,
    pub(crate) high_priority: bool,
}

/// What a lookup concluded from the drives.
pub(crate) enum Verdict<S: Store> {
    Found(Resolved<S>),
    Absent,
    /// Too few drives answered alike: neither a version nor absence has a quorum.
    NoQuorum {
        answered: usize,
        agreeing: usize,
    },
}

/// Decides an object's version from what each drive holds: the version held by the most drives, if a read
/// quorum holds it; absent if a read quorum lacks the object, or if no version seen can be an acknowledged
/// one (below).
pub(crate) fn decide<S: Store>(states: Vec<DriveState<S>>, read_quorum: usize, write_quorum: usize) -> Verdict<S> {
    let answered = states.iter().filter(|s| !matches!(s, DriveState::Failed)).count();
    let failed = states.len() - answered;
    let absent = states.iter().filter(|s| matches!(s, DriveState::Absent)).count();
    let mut counts: BTreeMap<[u8; 16], usize> = BTreeMap::new();
    for s in &states {
        if let DriveState::Present { layout, .. } = s {
            *counts.entry(layout.write_id).or_default() += 1;
        }
    }
    // The most held version; among equals, the newest (a tie is only seen between writes that a crash
    // left undecided, which recovery settles before serving).
    let best = states
        .iter()
        .filter_map(|s| match s {
            DriveState::Present { layout, .. } => Some((counts[&layout.write_id], layout.mtime_ns, layout.write_id)),
            _ => None,
        })
        .max();
    match best {
        Some((n, _, id)) if n >= read_quorum && n >= absent => {
            let mut holders = Vec::with_capacity(states.len());
            let (mut layout, mut mtime_ns, mut high_priority) = (None, 0, false);
            for s in states {
                match s {
                    DriveState::Present { layout: l, snap, obj, info } if l.write_id == id => {
                        (layout, mtime_ns, high_priority) = (Some(l), l.mtime_ns, info.high_priority);
                        holders.push(Some((snap, obj)));
                    }
                    _ => holders.push(None),
                }
            }
            let layout = layout.expect("the best version has holders");
            let asked = (1u16 << holders.len()).wrapping_sub(1);
            Verdict::Found(Resolved { layout, holders, asked, mtime_ns, high_priority })
        }
        _ if absent >= read_quorum => Verdict::Absent,
        // An acknowledged version reached a write quorum, and only a later acknowledged write or delete
        // takes it off those drives (an unacknowledged one is undone), so a current acknowledged version is
        // on at least `write_quorum - failed` of the drives that answered. When fewer failed than a write
        // quorum and every version seen is held by fewer than that, none is current: they are what drives
        // that missed a delete (or hold an undone write's remains) still keep, and the object is absent.
        // Without this, a stale drive among only k survivors would leave the read with no quorum. Only
        // one version may be seen: two or more below a quorum are writes racing from several nodes (each
        // node's key locks serialize only its own), where the last acknowledged one may be among them;
        // calling the object absent then would be a stale read (found by the cluster's history check).
        _ if failed < write_quorum && counts.len() <= 1 && counts.values().all(|n| n + failed < write_quorum) => {
            Verdict::Absent
        }
        best => Verdict::NoQuorum { answered, agreeing: best.map_or(absent, |b| b.0.max(absent)) },
    }
}

/// What drive `i` holds of `name` in `coll`, through a fresh snapshot of it.
pub(crate) async fn drive_state<S: Store>(
    set: &SetInner<S>,
    i: usize,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> DriveState<S> {
    let Some(store) = set.member(i) else { return DriveState::Failed };
    drive_state_in(Arc::new(store.snapshot()), i, coll, name).await
}

/// What drive `i` holds of `name` in `coll`, through its snapshot `snap`.
async fn drive_state_in<S: Store>(
    snap: Arc<S::Snapshot>,
    i: usize,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> DriveState<S> {
    // A handle missing from `coll` says only that the drive did not give one when `coll` was looked up:
    // it may have failed then and answer now. It is asked again, so that a drive that is up is never
    // counted absent (with another drive down, that would leave a read without its quorum).
    let asked_again;
    let c = match &coll.members[i] {
        Some(c) => c,
        None => match snap.collection(&coll.name).await {
            Ok(Some(c)) => {
                asked_again = c;
                &asked_again
            }
            Ok(None) => return DriveState::Absent,
            Err(e) => {
                tracing::debug!(drive = i, error = %e, "a drive failed a collection lookup");
                return DriveState::Failed;
            }
        },
    };
    let info = match snap.lookup(c, name).await {
        Ok(Some(info)) => info,
        Ok(None) => return DriveState::Absent,
        Err(e) => {
            tracing::debug!(drive = i, error = %e, "a drive failed a lookup");
            return DriveState::Failed;
        }
    };
    match snap.attr(&info.obj, LAYOUT_ATTR).await {
        Ok(Some(raw)) => match ObjectLayout::decode(&raw) {
            Ok(layout) => DriveState::Present { layout, obj: info.obj.clone(), snap, info },
            Err(e) => {
                tracing::warn!(drive = i, error = %e, "an object's layout is damaged on a drive");
                DriveState::Failed
            }
        },
        // An object without a layout is one a drive holds partly (it cannot be read as a version).
        Ok(None) => DriveState::Failed,
        Err(_) => DriveState::Failed,
    }
}

/// Every drive's state of an object, asked at once.
pub(crate) async fn drive_states<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> Vec<DriveState<S>> {
    join_all((0..set.drives()).map(|i| drive_state(set, i, coll, name))).await
}

/// Looks an object up under its read lock, so that no write is halfway through its drives.
///
/// Fast path: the k drives that hold the name's data shards are asked first; when all k answer alike (one
/// version, or absent), that is the answer, because any write quorum shares a drive with any k drives
/// (k + write quorum > k + m), so no newer acknowledged version can hide on the drives not asked. Else, or
/// when the version is placed otherwise (a clone keeps its source's placement), the others are asked too
/// and the quorum decides. Not when the set's settings say so (`SetConfig::read_fast_path`).
pub(crate) async fn resolve<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> StoreResult<Option<Resolved<S>>> {
    resolve_asking(set, coll, name, false).await
}

/// `resolve` for a set of one drive, through the snapshot a store's snapshot keeps of it: one drive
/// transaction is a whole write, so no lock is taken and the drive's answer is the set's.
async fn resolve_one_drive<S: Store>(
    set: &SetInner<S>,
    drive: Option<&Arc<S::Snapshot>>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> StoreResult<Option<Resolved<S>>> {
    debug_assert_eq!(set.drives(), 1);
    let state = match drive {
        Some(snap) => drive_state_in(snap.clone(), 0, coll, name).await,
        None => DriveState::Failed,
    };
    let g = set.geometry();
    verdict_to_result(set, coll, name, decide(vec![state], g.read_quorum(), g.write_quorum()))
}

/// Like `resolve`, asking every drive (heal and the deep scan look at every holder).
pub(crate) async fn resolve_all<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
) -> StoreResult<Option<Resolved<S>>> {
    resolve_asking(set, coll, name, true).await
}

async fn resolve_asking<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    all: bool,
) -> StoreResult<Option<Resolved<S>>> {
    let _shared = set.locks.read(&coll.name, name).await;
    let g = *set.geometry();
    let n = set.drives();
    let mut states: Vec<Option<DriveState<S>>> = (0..n).map(|_| None).collect();
    if !all && set.cfg.read_fast_path && g.read_quorum() < n {
        let rotation = g.rotation_for(name);
        let first: Vec<usize> = (0..g.data).map(|j| g.drive_of_shard(rotation, j)).collect();
        let answers = join_all(first.iter().map(|&d| drive_state(set, d, coll, name))).await;
        for (d, a) in first.iter().zip(answers) {
            states[*d] = Some(a);
        }
        if let Some(found) = unanimous(&mut states, rotation) {
            return Ok(found);
        }
    }
    let rest = join_all(
        (0..n).filter(|d| states[*d].is_none()).map(|d| async move { (d, drive_state(set, d, coll, name).await) }),
    )
    .await;
    for (d, a) in rest {
        states[d] = Some(a);
    }
    let states: Vec<DriveState<S>> = states.into_iter().map(|s| s.expect("every drive asked")).collect();
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(coll = %coll.name, name = %name.escape_ascii(), drives = %describe(&states), "drives disagree");
    }
    verdict_to_result(set, coll, name, decide(states, g.read_quorum(), g.write_quorum()))
}

/// What each drive holds, for a log line: `-` failed, `0` absent, else the version's write id (short).
fn describe<S: Store>(states: &[DriveState<S>]) -> String {
    let each = states.iter().map(|s| match s {
        DriveState::Failed => "-".to_string(),
        DriveState::Absent => "0".to_string(),
        DriveState::Present { layout, .. } => format!("{:02x}{:02x}", layout.write_id[14], layout.write_id[15]),
    });
    each.collect::<Vec<_>>().join(" ")
}

/// The fast path's answer when every drive asked holds the same version, placed by the name's rotation (or
/// every one lacks the object); None to ask the others.
fn unanimous<S: Store>(states: &mut [Option<DriveState<S>>], rotation: usize) -> Option<Option<Resolved<S>>> {
    let asked: Vec<&DriveState<S>> = states.iter().flatten().collect();
    if asked.iter().all(|s| matches!(s, DriveState::Absent)) {
        return Some(None);
    }
    let first = match asked.first()? {
        DriveState::Present { layout, .. } => *layout,
        _ => return None,
    };
    let alike =
        asked.iter().all(|s| matches!(s, DriveState::Present { layout, .. } if layout.write_id == first.write_id));
    if !alike || (first.encoded_bytes > 0 && first.rotation as usize != rotation) {
        return None;
    }
    let mut holders = Vec::with_capacity(states.len());
    let (mut asked_mask, mut high_priority) = (0u16, false);
    for (d, s) in states.iter_mut().enumerate() {
        match s.take() {
            Some(DriveState::Present { snap, obj, info, .. }) => {
                asked_mask |= 1 << d;
                high_priority |= info.high_priority;
                holders.push(Some((snap, obj)));
            }
            _ => holders.push(None),
        }
    }
    Some(Some(Resolved { layout: first, holders, asked: asked_mask, mtime_ns: first.mtime_ns, high_priority }))
}

pub(crate) fn verdict_to_result<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    verdict: Verdict<S>,
) -> StoreResult<Option<Resolved<S>>> {
    match verdict {
        Verdict::Found(r) => {
            if r.holders.iter().filter(|h| h.is_some()).count() < r.asked.count_ones() as usize {
                set.queue_heal(&coll.name, name);
            }
            Ok(Some(r))
        }
        Verdict::Absent => Ok(None),
        Verdict::NoQuorum { answered, agreeing } => Err(StoreError::unavailable(format!(
            "{answered} of {} drives answered and at most {agreeing} agree on object {}; {} are needed",
            set.drives(),
            name.escape_ascii(),
            set.geometry().read_quorum()
        ))),
    }
}

/// A snapshot of a set: every lookup reads the drives afresh under the object's lock, and the handle it
/// returns keeps the drives' snapshots of that version, so the object's reads are consistent. A store's
/// snapshot of a set of one drive is that drive's snapshot (`of_store`).
pub struct SetSnapshot<S: Store> {
    set: Arc<SetInner<S>>,
    prioritized: AtomicBool,
    /// A set of one drive, as a store's snapshot: that drive's snapshot, taken at first use and kept, so
    /// the set's snapshot is the drive's own (one drive transaction is a whole write: no lock, no quorum).
    /// None: every lookup asks the drives afresh under the object's lock.
    one_drive: Option<OnceLock<Option<Arc<S::Snapshot>>>>,
}

impl<S: Store> SetSnapshot<S> {
    /// A view that asks the drives afresh at every lookup (the set's own work: writes, heal, recovery).
    pub(crate) fn new(set: Arc<SetInner<S>>) -> Self {
        SetSnapshot { set, prioritized: AtomicBool::new(false), one_drive: None }
    }

    /// The store's snapshot: a set of one drive reads through one snapshot of its drive.
    pub(crate) fn of_store(set: Arc<SetInner<S>>) -> Self {
        let one_drive = (set.drives() == 1).then(OnceLock::new);
        SetSnapshot { set, prioritized: AtomicBool::new(false), one_drive }
    }

    /// The kept snapshot of a set of one drive (Some(None): its drive is missing); None for other views.
    fn one_drive(&self) -> Option<Option<&Arc<S::Snapshot>>> {
        let kept = self.one_drive.as_ref()?;
        Some(kept.get_or_init(|| self.set.member(0).map(|store| Arc::new(store.snapshot()))).as_ref())
    }
}

/// An object of a set: found by a lookup (resolved) or named by a listing (resolved when first used).
pub struct SetObj<S: Store> {
    coll: SetColl<S::Coll>,
    name: Arc<[u8]>,
    resolved: Arc<tokio::sync::OnceCell<Arc<Resolved<S>>>>,
}

impl<S: Store> Clone for SetObj<S> {
    fn clone(&self) -> Self {
        SetObj { coll: self.coll.clone(), name: self.name.clone(), resolved: self.resolved.clone() }
    }
}

impl<S: Store> SetObj<S> {
    async fn get(&self, set: &SetInner<S>) -> StoreResult<Arc<Resolved<S>>> {
        self.resolved
            .get_or_try_init(|| async {
                match resolve(set, &self.coll, &self.name).await? {
                    Some(r) => Ok(Arc::new(r)),
                    None => Err(StoreError::not_found(format!("object {}", self.name.escape_ascii()))),
                }
            })
            .await
            .cloned()
    }
}

fn info_of<S: Store>(obj: SetObj<S>, r: &Resolved<S>) -> ObjectInfo<SetObj<S>> {
    ObjectInfo { obj, size_bytes: r.layout.size_bytes, mtime_ns: r.mtime_ns, high_priority: r.high_priority }
}

#[async_trait]
impl<S: Store> Snapshot for SetSnapshot<S> {
    type Coll = SetColl<S::Coll>;
    type Obj = SetObj<S>;

    async fn collection(&self, name: &str) -> StoreResult<Option<SetColl<S::Coll>>> {
        let set = &self.set;
        let generation = set.generation.load(Ordering::SeqCst);
        if let Some(drive) = self.one_drive() {
            let drive = drive.ok_or_else(|| StoreError::unavailable("missing drive"))?;
            let Some(c) = drive.collection(name).await? else { return Ok(None) };
            return Ok(Some(SetColl { name: name.into(), members: Arc::new([Some(c)]), generation }));
        }
        let members = set.members();
        let found = join_all(members.iter().map(|m| async move {
            match m {
                Some(store) => store.snapshot().collection(name).await,
                None => Err(StoreError::unavailable("missing drive")),
            }
        }))
        .await;
        let present = found.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
        let absent = found.iter().filter(|r| matches!(r, Ok(None))).count();
        if present < found.len() && tracing::enabled!(tracing::Level::DEBUG) {
            let each = found.iter().map(|r| match r {
                Ok(Some(_)) => "1".to_string(),
                Ok(None) => "0".to_string(),
                Err(e) => format!("-({e})"),
            });
            tracing::debug!(coll = name, drives = %each.collect::<Vec<_>>().join(" "), "not every drive has the collection");
        }
        let quorum = set.geometry().read_quorum();
        if present >= quorum && present >= absent {
            let members: Vec<Option<S::Coll>> = found.into_iter().map(|r| r.ok().flatten()).collect();
            return Ok(Some(SetColl { name: name.into(), members: members.into(), generation }));
        }
        if absent >= quorum {
            return Ok(None);
        }
        Err(StoreError::unavailable(format!(
            "{} of {} drives answered about collection {name}; {quorum} must agree",
            present + absent,
            set.drives()
        )))
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, SetColl<S::Coll>)>> {
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for m in self.set.members().iter().flatten() {
            if let Ok(list) = m.snapshot().collections(prefix, limit).await {
                for (n, _) in list {
                    *names.entry(n).or_default() += 1;
                }
            }
        }
        let mut out = Vec::new();
        for (name, n) in names {
            // The drives' own collections (the undo log) are not the set's: no caller may list, walk or
            // move their objects as the set's.
            if name.starts_with(crate::INTERNAL_COLLECTION_PREFIX) || n < self.set.geometry().read_quorum() {
                continue;
            }
            if out.len() >= limit {
                break;
            }
            if let Some(c) = self.collection(&name).await? {
                out.push((name, c));
            }
        }
        Ok(out)
    }

    async fn lookup(&self, coll: &SetColl<S::Coll>, name: &[u8]) -> StoreResult<Option<ObjectInfo<SetObj<S>>>> {
        let coll = &self.set.current(coll).await?;
        let resolved = match self.one_drive() {
            Some(drive) => resolve_one_drive(&self.set, drive, coll, name).await?,
            None => resolve(&self.set, coll, name).await?,
        };
        let Some(r) = resolved else { return Ok(None) };
        if self.prioritized.load(Ordering::Relaxed) || r.high_priority {
            prioritize(&r);
        }
        let r = Arc::new(r);
        let obj = SetObj {
            coll: coll.clone(),
            name: name.into(),
            resolved: Arc::new(tokio::sync::OnceCell::new_with(Some(r.clone()))),
        };
        Ok(Some(info_of(obj, &r)))
    }

    async fn attr(&self, obj: &SetObj<S>, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        let r = obj.get(&self.set).await?;
        let mut last = None;
        for (snap, o) in r.holders.iter().flatten() {
            match snap.attr(o, key).await {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holds the object")))
    }

    /// The caller's attributes: the set's own (the layout) are not among them, as no caller may set them.
    async fn attrs(&self, obj: &SetObj<S>, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let r = obj.get(&self.set).await?;
        let mut last = None;
        for (snap, o) in r.holders.iter().flatten() {
            // One more than asked, in case the layout is among them.
            match snap.attrs(o, start_after, limit.saturating_add(1)).await {
                Ok(mut v) => {
                    v.retain(|(k, _)| k.as_slice() != LAYOUT_ATTR);
                    v.truncate(limit);
                    return Ok(v);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holds the object")))
    }

    async fn list_entries(
        &self,
        coll: &SetColl<S::Coll>,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<SetObj<S>>>> {
        let coll = &self.set.current(coll).await?;
        list_entries(&self.set, coll, prefix, from, limit).await
    }

    async fn stat_many(
        &self,
        objs: &[SetObj<S>],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<SetObj<S>>, Option<Vec<u8>>)>> {
        let mut out = Vec::with_capacity(objs.len());
        for o in objs {
            let r = o.get(&self.set).await?;
            let value = self.attr(o, attr_key).await?;
            out.push((info_of(o.clone(), &r), value));
        }
        Ok(out)
    }

    async fn read(&self, obj: &SetObj<S>, offset: u64, len: u64) -> StoreResult<Bytes> {
        let _foreground = self.set.foreground();
        let r = obj.get(&self.set).await?;
        read_range(&self.set, &obj.coll, &obj.name, &r, offset, len).await
    }

    /// Objects looked up from now on have their drives' reads prioritized (a high-priority object's are
    /// already, from its lookup).
    fn prioritize(&self) {
        self.prioritized.store(true, Ordering::Relaxed);
    }
}

fn prioritize<S: Store>(r: &Resolved<S>) {
    for (snap, _) in r.holders.iter().flatten() {
        snap.prioritize();
    }
}

/// Bytes [offset, offset + len) of a resolved object, clipped to its size.
pub(crate) async fn read_range<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    r: &Resolved<S>,
    offset: u64,
    len: u64,
) -> StoreResult<Bytes> {
    let l = &r.layout;
    let end = offset.saturating_add(len).min(l.size_bytes);
    if offset >= end {
        return Ok(Bytes::new());
    }
    if l.data == 1
        && let Some(b) = read_whole_copy(r, offset, end).await
    {
        return Ok(b);
    }
    let encoded_end = end.min(l.encoded_bytes);
    if l.data > 1
        && offset < encoded_end
        && let Some(b) = read_striped(r, offset, end).await?
    {
        return Ok(b);
    }
    let mut out = Vec::with_capacity((end - offset) as usize);
    if offset < encoded_end {
        read_encoded(set, coll, name, r, offset, encoded_end - offset, &mut out).await?;
    }
    if end > l.encoded_bytes {
        let from = offset.max(l.encoded_bytes);
        read_tail(r, from, end - from, &mut out).await?;
    }
    debug_assert_eq!(out.len() as u64, end - offset);
    Ok(Bytes::from(out))
}

/// With one data shard, a drive that holds both the shard and the tail holds the object's bytes as they
/// are: the range in one read, without copying (None when no such holder reads it: the general path).
async fn read_whole_copy<S: Store>(r: &Resolved<S>, offset: u64, end: u64) -> Option<Bytes> {
    let l = &r.layout;
    let rotation = l.rotation as usize;
    let g = crate::layout::SetGeometry { data: 1, parity: l.parity as usize };
    for (d, h) in r.holders.iter().enumerate() {
        let Some((snap, obj)) = h else { continue };
        let has_shard = l.encoded_bytes == 0 || g.shard_on_drive(rotation, d) == 0;
        let has_tail = l.tail_bytes() == 0 || l.holds_tail(d);
        if !(has_shard && has_tail) {
            continue;
        }
        match snap.read(obj, offset, end - offset).await {
            Ok(b) if b.len() as u64 == end - offset => return Some(b),
            _ => return None,
        }
    }
    None
}

/// With k > 1 data shards whose drives all hold the object: bytes [offset, end) (encoded bytes from
/// `offset`, then the tail) with the k shard reads written straight into their places in one buffer
/// (`StripedBuffer`: shard j's units are every k-th piece of the stripes), so the shards are never joined
/// by a copy. None when a data shard's drive is missing or a shard read fails or comes back short: the
/// general path then reads again, rebuilds from parity and queues the object for heal.
async fn read_striped<S: Store>(r: &Resolved<S>, offset: u64, end: u64) -> StoreResult<Option<Bytes>> {
    let l = &r.layout;
    let g = crate::layout::SetGeometry { data: l.data as usize, parity: l.parity as usize };
    let encoded_end = end.min(l.encoded_bytes);
    debug_assert!(g.data > 1 && offset < encoded_end && encoded_end <= end);
    let rotation = l.rotation as usize;
    let holders: Option<Vec<Holder<S>>> =
        (0..g.data).map(|j| r.holders.get(g.drive_of_shard(rotation, j)).cloned().flatten()).collect();
    let Some(holders) = holders else { return Ok(None) };
    let (s0, s1) = stripes_covering(&g, offset, encoded_end);
    let unit = SHARD_UNIT_BYTES;
    let tail_bytes = end - encoded_end;
    let (buf, lanes) = StripedBuffer::new(g.data, unit as usize, (s1 - s0) as usize, tail_bytes as usize);
    let lane_bytes = (s1 - s0) * unit;
    let reads = join_all(holders.iter().zip(lanes).map(|((snap, obj), lane)| snap.read_into(obj, s0 * unit, lane)));
    if !reads.await.iter().all(|n| matches!(n, Ok(n) if *n == lane_bytes)) {
        return Ok(None);
    }
    let Some(mut bytes) = buf.into_vec() else { return Ok(None) };
    let skip = (offset - s0 * g.stripe_bytes()) as usize;
    bytes.truncate(skip + (encoded_end - offset) as usize);
    if tail_bytes > 0 {
        read_tail(r, encoded_end, tail_bytes, &mut bytes).await?;
    }
    debug_assert_eq!((bytes.len() - skip) as u64, end - offset);
    Ok(Some(Bytes::from(bytes).slice(skip..)))
}

/// Tail bytes [from, from + len), appended to `out`, from the first holder that reads them.
async fn read_tail<S: Store>(r: &Resolved<S>, from: u64, len: u64, out: &mut Vec<u8>) -> StoreResult<()> {
    let l = &r.layout;
    let at = l.shard_bytes() + (from - l.encoded_bytes);
    let mut last = None;
    for (i, h) in r.holders.iter().enumerate() {
        let Some((snap, obj)) = h else { continue };
        if !l.holds_tail(i) {
            continue;
        }
        match snap.read(obj, at, len).await {
            Ok(b) if b.len() as u64 == len => {
                out.extend_from_slice(&b);
                return Ok(());
            }
            Ok(b) => last = Some(StoreError::corrupt(format!("a tail read {} of {len} bytes", b.len()))),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holding the object's tail answered")))
}

/// Encoded bytes [offset, offset + n), appended to `out`: the covering stripes of the k data shards, or of
/// any k shards rebuilt when a data shard is missing, unreadable or damaged.
async fn read_encoded<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    r: &Resolved<S>,
    offset: u64,
    n: u64,
    out: &mut Vec<u8>,
) -> StoreResult<()> {
    let l = &r.layout;
    let g = crate::layout::SetGeometry { data: l.data as usize, parity: l.parity as usize };
    let (s0, s1) = stripes_covering(&g, offset, offset + n);
    let unit = SHARD_UNIT_BYTES;
    let (at, len) = (s0 * unit, (s1 - s0) * unit);
    let rotation = l.rotation as usize;
    // A shard read: its bytes, or whether it is damaged (a checksum failed) rather than unavailable.
    // Read into a buffer of its own (`read_into`: never mapped, and the decoder takes it as it is).
    let read_from = |holder: Option<Holder<S>>| async move {
        let Some((snap, obj)) = holder else { return Err(false) };
        let (buf, mut lanes) = StripedBuffer::new(1, len as usize, 1, 0);
        let lane = lanes.pop().expect("a buffer of one lane");
        match snap.read_into(&obj, at, lane).await {
            Ok(n) if n == len => buf.into_vec().ok_or(true),
            Ok(_) => Err(true),
            Err(e) => Err(e.kind == ErrorKind::Corrupt),
        }
    };
    let holder_of = |j: usize| r.holders.get(g.drive_of_shard(rotation, j)).cloned().flatten();
    let k = g.data;
    let mut reads: Vec<Result<Vec<u8>, bool>> = join_all((0..k).map(|j| read_from(holder_of(j)))).await;
    if reads.iter().all(Result::is_ok) {
        let data: Vec<&[u8]> = reads.iter().map(|b| b.as_ref().map(|b| &b[..]).unwrap_or_default()).collect();
        join_shards(&data, (offset - s0 * k as u64 * unit) as usize, n as usize, out);
        return Ok(());
    }
    set.counters.degraded_reads.fetch_add(1, Ordering::Relaxed);
    set.queue_heal(&coll.name, name);
    // The parity shards' drives, asked now if the fast path did not (the same version, by write id).
    let parity = join_all((k..g.drives()).map(|j| async move {
        let d = g.drive_of_shard(rotation, j);
        match holder_of(j) {
            Some(h) => Some(h),
            None if r.asked & (1 << d) == 0 => match drive_state(set, d, coll, name).await {
                DriveState::Present { layout, snap, obj, .. } if layout.write_id == l.write_id => Some((snap, obj)),
                _ => None,
            },
            None => None,
        }
    }))
    .await;
    reads.extend(join_all(parity.into_iter().map(read_from)).await);
    let damaged = reads.iter().any(|r| r == &Err(true));
    let mut shards: Vec<Option<Vec<u8>>> = reads.into_iter().map(Result::ok).collect();
    let codec = codec_by_id(l.codec, k, g.parity).ok_or_else(|| {
        StoreError::new(
            ErrorKind::Corrupt,
            format!("object {} uses erasure code {} which this build does not know", name.escape_ascii(), l.codec),
        )
    })?;
    // Too few shards: damage (checksums) is reported as damage, absent drives as unavailability.
    codec.reconstruct_data(&mut shards).map_err(|e| {
        let kind = if damaged { ErrorKind::Corrupt } else { ErrorKind::Unavailable };
        StoreError::new(kind, format!("object {} cannot be rebuilt: {e}", name.escape_ascii()))
    })?;
    let data: Vec<&[u8]> = shards[..k].iter().map(|s| s.as_deref().expect("whole after rebuilding")).collect();
    join_shards(&data, (offset - s0 * k as u64 * unit) as usize, n as usize, out);
    Ok(())
}

/// Names in `coll` under `prefix` from `from` on, that a read quorum of drives holds, at most `limit`: the
/// drives' ordered name iterators merged, each step bounded by the first drive to fill its page.
async fn list_entries<S: Store>(
    set: &Arc<SetInner<S>>,
    coll: &SetColl<S::Coll>,
    prefix: &[u8],
    from: &[u8],
    limit: usize,
) -> StoreResult<Vec<NameEntry<SetObj<S>>>> {
    let quorum = set.geometry().read_quorum();
    let mut out = Vec::with_capacity(limit.min(LIST_PREALLOC_ENTRIES));
    let mut from = from.to_vec();
    // The tags the drives hold for one name (reused: a page is thousands of names).
    let mut tags: Vec<Option<Vec<u8>>> = Vec::with_capacity(set.drives());
    // Each step moves past at least one drive's whole page; names that too few drives hold (a stale drive's)
    // are skipped, at most LIST_STEPS_MAX pages of them.
    for _ in 0..LIST_STEPS_MAX {
        let want = limit - out.len() + 1;
        let members = set.members();
        let pages = join_all(members.iter().zip(coll.members.iter()).map(|(m, c)| {
            let from = &from;
            async move {
                match (m, c) {
                    (Some(store), Some(c)) => store.snapshot().list_entries(c, prefix, from, want).await.ok(),
                    _ => None,
                }
            }
        }))
        .await;
        let answered = pages.iter().filter(|p| p.is_some()).count();
        if answered < quorum {
            return Err(StoreError::unavailable(format!(
                "{answered} of {} drives listed {}; {quorum} are needed",
                set.drives(),
                coll.name
            )));
        }
        // Names past the end of a full page may be missing from it: stop there.
        let horizon: Option<Vec<u8>> =
            pages.iter().flatten().filter(|p| p.len() == want).filter_map(|p| p.last().map(|e| e.name.clone())).min();
        // The drives' pages merged in name order: each page with the position of its next name.
        let mut cursors: Vec<(Vec<NameEntry<S::Obj>>, usize)> = pages.into_iter().flatten().map(|p| (p, 0)).collect();
        while let Some(first) = next_name(&cursors, horizon.as_deref()) {
            let (name, tag) = {
                let (page, at) = &mut cursors[first];
                let e = &mut page[*at];
                *at += 1;
                (std::mem::take(&mut e.name), e.tag.take())
            };
            tags.clear();
            tags.push(tag);
            for (i, (page, at)) in cursors.iter_mut().enumerate() {
                if i != first
                    && let Some(e) = page.get_mut(*at)
                    && e.name == name
                {
                    tags.push(e.tag.take());
                    *at += 1;
                }
            }
            if tags.len() < quorum {
                continue;
            }
            let tag = most_common(&mut tags);
            let obj = SetObj {
                coll: coll.clone(),
                name: name.as_slice().into(),
                resolved: Arc::new(tokio::sync::OnceCell::new()),
            };
            out.push(NameEntry { name, obj, tag });
            if out.len() == limit {
                return Ok(out);
            }
        }
        debug_assert!(out.windows(2).all(|w| w[0].name < w[1].name), "a listing is in name order");
        match horizon {
            Some(h) => {
                from = h;
                from.push(0);
            }
            None => return Ok(out),
        }
    }
    Err(StoreError::unavailable(format!(
        "the drives disagree on too many names of {} (more than {LIST_STEPS_MAX} pages): heal must run first",
        coll.name
    )))
}

/// A listing reserves room for at most this many entries up front (a page asks for about 1,000).
const LIST_PREALLOC_ENTRIES: usize = 1024;

/// Pages a listing step walks past at most for names that too few drives hold.
const LIST_STEPS_MAX: usize = 10_000;

/// The page whose next name comes first, among names up to `horizon` (None: every page is merged).
fn next_name<O>(cursors: &[(Vec<NameEntry<O>>, usize)], horizon: Option<&[u8]>) -> Option<usize> {
    let mut first: Option<(usize, &[u8])> = None;
    for (i, (page, at)) in cursors.iter().enumerate() {
        let Some(e) = page.get(*at) else { continue };
        if horizon.is_some_and(|h| e.name.as_slice() > h) {
            continue;
        }
        if first.is_none_or(|(_, name)| e.name.as_slice() < name) {
            first = Some((i, &e.name));
        }
    }
    first.map(|(i, _)| i)
}

/// The value most drives hold (drives holding a stale version are the minority); between values held
/// equally often, the greatest. Takes it out of `values`.
fn most_common(values: &mut [Option<Vec<u8>>]) -> Option<Vec<u8>> {
    debug_assert!(!values.is_empty());
    // The common case: every drive holds the same.
    if values.iter().all(|v| *v == values[0]) {
        return values.first_mut().and_then(Option::take);
    }
    let count = |v: &Option<Vec<u8>>| values.iter().filter(|w| *w == v).count();
    let best =
        (0..values.len()).max_by(|&a, &b| count(&values[a]).cmp(&count(&values[b])).then(values[a].cmp(&values[b])));
    best.and_then(|i| values[i].take())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, tag: &str) -> NameEntry<()> {
        NameEntry { name: name.as_bytes().to_vec(), obj: (), tag: Some(tag.as_bytes().to_vec()) }
    }

    #[test]
    fn most_common_takes_the_majority_and_breaks_ties_by_the_greatest() {
        let t = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(most_common(&mut [t("a"), t("a"), t("a")]), t("a"));
        assert_eq!(most_common(&mut [t("b"), t("a"), t("a")]), t("a"));
        assert_eq!(most_common(&mut [None, None, t("a")]), None);
        assert_eq!(most_common(&mut [t("a"), t("b")]), t("b"));
        assert_eq!(most_common(&mut [t("b"), t("a")]), t("b"));
        assert_eq!(most_common(&mut [None]), None);
    }

    #[test]
    fn next_name_is_the_smallest_head_within_the_horizon() {
        let cursors = vec![
            (vec![entry("a", "1"), entry("c", "1")], 1),
            (vec![entry("b", "2"), entry("d", "2")], 0),
            (vec![], 0),
            (vec![entry("z", "3")], 1),
        ];
        assert_eq!(next_name(&cursors, None), Some(1));
        assert_eq!(next_name(&cursors, Some(b"b")), Some(1));
        assert_eq!(next_name(&cursors, Some(b"a")), None);
        let done: Vec<(Vec<NameEntry<()>>, usize)> = vec![(vec![entry("a", "1")], 1)];
        assert_eq!(next_name(&done, None), None);
    }
}
