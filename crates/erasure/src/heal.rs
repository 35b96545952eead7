//! Heal: drives that lack an object's agreed version (they were down during a write, were replaced, or hold
//! a damaged shard) get it rebuilt from the others; drives that hold an object a quorum removed lose it.
//! Objects come from a queue (writes that missed a drive, degraded reads) and from a scanner that compares
//! the drives' name indexes (objects one drive lacks or holds differently; collections one drive lacks).
//! Heal runs in the background at a bounded rate, in the drives' background IO class, so foreground work
//! and prioritized objects go first (paper 003).

use crate::codec::codec_by_id;
use crate::layout::{ObjectLayout, SHARD_UNIT_BYTES, SetGeometry, stripes_covering};
use crate::read::{DriveState, Resolved, Verdict, decide, drive_states};
use crate::{LAYOUT_ATTR, SetColl, SetInner, SetSnapshot};
use futures::future::join_all;
use mosaic_store::{AlignedBuf, ErrorKind, Op, Priority, Snapshot, Store, StoreError, StoreResult, Txn};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Stripes rebuilt per step (bounds the memory of a heal: this many stripes of k + m shards, 1 MiB each).
const HEAL_STEP_STRIPES: u64 = 256;
/// Objects healed at once. Measured on one disk (docs/bench/2026-11-24-heal-parallel): four at once in
/// 4 MiB steps rebuilt slower (79 MiB/s against 106) and made the load's p99 four times longer during a
/// heal, so one.
const HEAL_PARALLEL: usize = 1;
/// Attributes copied per object (every object of this layer has a handful).
const HEAL_ATTRS_MAX: usize = 1024;
/// Names compared per scan step, per drive.
const SCAN_PAGE: usize = 1000;

/// Heal's progress, for `admin drives` and the metrics.
#[derive(Default)]
pub struct HealProgress {
    pub healed_objects: AtomicU64,
    pub healed_bytes: AtomicU64,
    pub failed_objects: AtomicU64,
    /// Names the scanner compared since the set was opened.
    pub scanned_objects: AtomicU64,
    /// Full scans finished.
    pub scans_completed: AtomicU64,
    /// Tail bytes lazy sync encoded into stripes, and the objects whose tails it encoded.
    pub encoded_bytes: AtomicU64,
    pub encoded_objects: AtomicU64,
}

/// What heal did to one object.
#[derive(Debug, PartialEq, Eq)]
pub enum Healed {
    /// Every drive already held it alike.
    Nothing,
    /// This many drives were rebuilt or cleared.
    Drives(usize),
}

/// Heals one object under its lock: rebuilds it on every drive that lacks its agreed version, or removes
/// it from drives that hold it when a quorum lacks it.
pub(crate) async fn heal_object<S: Store>(set: &Arc<SetInner<S>>, coll_name: &str, name: &[u8]) -> StoreResult<Healed> {
    let snap = SetSnapshot::new(set.clone());
    let Some(coll) = snap.collection(coll_name).await? else { return Ok(Healed::Nothing) };
    let coll = ensure_collection(set, coll).await;
    // Before the lock, so that a foreground request for this very object is not kept waiting by it.
    set.yield_to_foreground().await;
    let mut lock = crate::locks::Exclusive::take(set, std::iter::once((coll_name, name))).await?;
    let states = drive_states(set, &coll, name).await;
    let present: Vec<bool> = states.iter().map(|s| matches!(s, DriveState::Present { .. })).collect();
    let answered: Vec<bool> = states.iter().map(|s| !matches!(s, DriveState::Failed)).collect();
    // The version each drive holds: a drive left out of the decision may already hold the one decided.
    let held: Vec<Option<[u8; 16]>> = states
        .iter()
        .map(|s| match s {
            DriveState::Present { layout, .. } => Some(layout.write_id),
            _ => None,
        })
        .collect();
    let decided_by = set.cfg.decided_by;
    let states = match decided_by {
        Some(slots) => states
            .into_iter()
            .enumerate()
            .map(|(d, s)| if slots & 1 << d != 0 { s } else { DriveState::Failed })
            .collect(),
        None => states,
    };
    // Who loses a copy of an object decided absent: with `decided_by`, the drives it leaves out (filled, not
    // served); else every holder, unless this set must not remove.
    let removable = |d: usize| match decided_by {
        Some(slots) => slots & 1 << d == 0,
        None => set.cfg.heal_removes,
    };
    match decide(states, set.geometry().read_quorum(), set.geometry().write_quorum()) {
        Verdict::NoQuorum { .. } => Err(StoreError::unavailable("too few drives agree to heal the object now")),
        Verdict::Absent => {
            let mut n = 0;
            for d in (0..set.drives()).filter(|d| present[*d] && removable(*d)) {
                let (Some(store), Some(c)) = (set.member(d), coll.members[d].clone()) else { continue };
                lock.check_held()?;
                let txn =
                    Txn::new().with_priority(Priority::Background).op(Op::Remove { coll: c, name: name.to_vec() });
                store.commit(txn).await?;
                n += 1;
            }
            Ok(if n == 0 { Healed::Nothing } else { Healed::Drives(n) })
        }
        Verdict::Found(r) => {
            let stale: Vec<usize> = (0..set.drives())
                .filter(|d| r.holders[*d].is_none() && set.member(*d).is_some() && held[*d] != Some(r.layout.write_id))
                .collect();
            // Holders whose shard no longer reads back (damage found by a read) are rebuilt too. Rebuilding
            // a stale drive reads every holder's shard, which finds them; with none stale, every holder's
            // shard is read for it alone.
            let mut damaged = if stale.is_empty() { damaged_holders(&r).await } else { damaged_tails(&r).await };
            let mut n = 0;
            let skip = |d: usize| !answered[d] && set.member(d).is_none();
            for d in stale.into_iter().filter(|d| !skip(*d)) {
                rebuild_on(set, &coll, name, &r, d, &mut lock, &mut damaged).await?;
                n += 1;
            }
            damaged.sort_unstable();
            damaged.dedup();
            for d in damaged.into_iter().filter(|d| !skip(*d)) {
                rebuild_on(set, &coll, name, &r, d, &mut lock, &mut Vec::new()).await?;
                n += 1;
            }
            Ok(if n == 0 { Healed::Nothing } else { Healed::Drives(n) })
        }
    }
}

/// The collection with a handle on every present drive: drives that lack it get it.
pub(crate) async fn ensure_collection<S: Store>(set: &SetInner<S>, coll: SetColl<S::Coll>) -> SetColl<S::Coll> {
    let mut members: Vec<Option<S::Coll>> = coll.members.to_vec();
    for (d, m) in members.iter_mut().enumerate() {
        if m.is_some() {
            continue;
        }
        let Some(store) = set.member(d) else { continue };
        match store.commit(Txn::new().op(Op::CreateCollection { name: coll.name.to_string() })).await {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::CollectionExists => {}
            Err(e) => {
                tracing::debug!(drive = d, error = %e, "heal could not create a collection");
                continue;
            }
        }
        *m = store.snapshot().collection(&coll.name).await.ok().flatten();
    }
    SetColl { name: coll.name, members: members.into(), generation: coll.generation }
}

/// Holders whose shard of the object fails to read (checksums).
async fn damaged_holders<S: Store>(r: &Resolved<S>) -> Vec<usize> {
    let l = &r.layout;
    let checks = r.holders.iter().enumerate().map(|(d, h)| async move {
        let (snap, obj) = h.as_ref()?;
        let size = l.drive_object_bytes(d);
        let mut at = 0;
        while at < size {
            let n = (size - at).min(HEAL_STEP_STRIPES * SHARD_UNIT_BYTES);
            match snap.read(obj, at, n).await {
                Ok(b) if b.len() as u64 == n => at += n,
                _ => return Some(d),
            }
        }
        None
    });
    join_all(checks).await.into_iter().flatten().collect()
}

/// Holders of the object's tail whose tail fails to read (checksums).
async fn damaged_tails<S: Store>(r: &Resolved<S>) -> Vec<usize> {
    let l = &r.layout;
    let checks = r.holders.iter().enumerate().map(|(d, h)| async move {
        let (snap, obj) = h.as_ref()?;
        if !l.holds_tail(d) || l.tail_bytes() == 0 {
            return None;
        }
        match snap.read(obj, l.shard_bytes(), l.tail_bytes()).await {
            Ok(b) if b.len() as u64 == l.tail_bytes() => None,
            _ => Some(d),
        }
    });
    join_all(checks).await.into_iter().flatten().collect()
}

/// Writes the agreed version of an object on drive `d`: its shard (rebuilt from the others), its tail if
/// `d` holds it, every attribute, its listing tag and priority, in one drive transaction. Holders whose
/// shard fails to read meanwhile are added to `damaged`.
async fn rebuild_on<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    r: &Resolved<S>,
    d: usize,
    lock: &mut crate::locks::Exclusive,
    damaged: &mut Vec<usize>,
) -> StoreResult<()> {
    let (Some(store), Some(c)) = (set.member(d), coll.members[d].clone()) else {
        return Err(StoreError::unavailable(format!("drive {d} is missing")));
    };
    let l = r.layout;
    let g = SetGeometry { data: l.data as usize, parity: l.parity as usize };
    let shard = g.shard_on_drive(l.rotation as usize, d);
    let mut txn = Txn::new().with_priority(Priority::Background).op(Op::Reset { coll: c.clone(), name: name.to_vec() });
    let stripe = g.stripe_bytes();
    let offset_on_drive = |at: u64| at / g.data as u64;
    // A pipeline of two: step n's shard is written to the new drive while step n + 1's is read from the
    // others and rebuilt, so the new drive's writes and the sources' reads overlap (the drive being
    // rebuilt bounds the rate, not the sum of both).
    let mut at = 0u64;
    let mut rebuilt: Option<(u64, AlignedBuf)> = None;
    while at < l.encoded_bytes || rebuilt.is_some() {
        set.yield_to_foreground().await;
        // A large rebuild outlasts a lease: renewed step by step.
        lock.renew().await?;
        let next = (at < l.encoded_bytes).then(|| (at, (at + HEAL_STEP_STRIPES * stripe).min(l.encoded_bytes)));
        let to_stage = rebuilt.take();
        let read = async {
            match next {
                Some((from, to)) => rebuild_shard_range(r, &g, shard, from, to, damaged).await.map(Some),
                None => Ok(None),
            }
        };
        let write = async {
            let Some((from, bytes)) = to_stage else { return Ok(None) };
            let len = bytes.len();
            let (staged, _) = store.stage(bytes, len, name).await?;
            Ok::<_, StoreError>(Some((from, len, staged)))
        };
        let (read, write) = futures::join!(read, write);
        if let Some((from, len, staged)) = write? {
            txn.push(Op::WriteStaged { coll: c.clone(), name: name.to_vec(), offset: offset_on_drive(from), staged });
            set.progress.healed_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        if let (Some(bytes), Some((from, to))) = (read?, next) {
            debug_assert_eq!(bytes.len() as u64, offset_on_drive(to - from), "a step rebuilds its stripes' units");
            rebuilt = Some((from, bytes));
            at = to;
        }
    }
    debug_assert!(at == l.encoded_bytes && rebuilt.is_none(), "every step's shard is staged");
    if l.holds_tail(d) && l.tail_bytes() > 0 {
        let tail = read_tail_from(r, &l).await?;
        txn.push(Op::Write { coll: c.clone(), name: name.to_vec(), offset: l.shard_bytes(), data: tail });
    }
    let (snap, obj) = r.holders.iter().flatten().next().ok_or_else(|| StoreError::unavailable("no holder"))?;
    for (key, value) in snap.attrs(obj, b"", HEAL_ATTRS_MAX).await? {
        txn.push(Op::SetAttr { coll: c.clone(), name: name.to_vec(), key, value });
    }
    if let Some(tag) = tag_of(coll, r, name).await? {
        txn.push(Op::SetNameTag { coll: c.clone(), name: name.to_vec(), tag });
    }
    txn.push(Op::SetPriority { coll: c, name: name.to_vec(), high: r.high_priority });
    debug_assert!(txn.ops.iter().any(|op| matches!(op, Op::SetAttr { key, .. } if key == LAYOUT_ATTR)));
    lock.check_held()?;
    store.commit(txn).await?;
    Ok(())
}

/// Shard `shard` of encoded bytes [from, to) (whole stripes), rebuilt from the holders' shards. Every
/// other holder's shard is read (not just k): a heal that rebuilds a drive also checks every holder's
/// shard, and the holders whose read fails are added to `damaged` (drives).
async fn rebuild_shard_range<S: Store>(
    r: &Resolved<S>,
    g: &SetGeometry,
    shard: usize,
    from: u64,
    to: u64,
    damaged: &mut Vec<usize>,
) -> StoreResult<AlignedBuf> {
    let (s0, s1) = stripes_covering(g, from, to);
    let (at, len) = (s0 * SHARD_UNIT_BYTES, (s1 - s0) * SHARD_UNIT_BYTES);
    let rotation = r.layout.rotation as usize;
    // A shard's bytes, or whether a holder failed to read it (None: no drive holds this version).
    let read_shard = |j: usize| {
        let holder = r.holders[g.drive_of_shard(rotation, j)].as_ref();
        async move {
            let (snap, obj) = holder?;
            Some(match snap.read(obj, at, len).await {
                Ok(b) if b.len() as u64 == len => Ok(b),
                _ => Err(()),
            })
        }
    };
    let mut shards: Vec<Option<bytes::Bytes>> = vec![None; g.drives()];
    let others: Vec<usize> = (0..g.drives()).filter(|j| *j != shard).collect();
    for (&j, read) in others.iter().zip(join_all(others.iter().map(|&j| read_shard(j))).await) {
        match read {
            Some(Ok(b)) => shards[j] = Some(b),
            Some(Err(())) => damaged.push(g.drive_of_shard(rotation, j)),
            None => {}
        }
    }
    let codec = codec_by_id(r.layout.codec, g.data, g.parity)
        .ok_or_else(|| StoreError::corrupt(format!("an object's erasure code {} is unknown", r.layout.codec)))?;
    // Decoding is CPU work: off the async threads, which serve requests. The shards read are borrowed, and
    // the rebuilt one goes straight into the buffer staged on the drive.
    tokio::task::spawn_blocking(move || {
        let mut out = AlignedBuf::zeroed(len as usize);
        let refs: Vec<Option<&[u8]>> = shards.iter().map(|s| s.as_deref()).collect();
        codec
            .rebuild_one(&refs, shard, out.as_mut_slice())
            .map(|()| out)
            .map_err(|e| StoreError::unavailable(format!("cannot rebuild: {e}")))
    })
    .await
    .map_err(|e| StoreError::internal(format!("a decoding worker failed: {e}")))?
}

async fn read_tail_from<S: Store>(r: &Resolved<S>, l: &ObjectLayout) -> StoreResult<Vec<u8>> {
    for (d, h) in r.holders.iter().enumerate() {
        let Some((snap, obj)) = h else { continue };
        if !l.holds_tail(d) {
            continue;
        }
        if let Ok(b) = snap.read(obj, l.shard_bytes(), l.tail_bytes()).await
            && b.len() as u64 == l.tail_bytes()
        {
            return Ok(b.to_vec());
        }
    }
    Err(StoreError::unavailable("no drive holding the tail reads it"))
}

/// The listing tag of the agreed version, from a holder.
async fn tag_of<S: Store>(coll: &SetColl<S::Coll>, r: &Resolved<S>, name: &[u8]) -> StoreResult<Option<Vec<u8>>> {
    let mut last = None;
    for (d, h) in r.holders.iter().enumerate() {
        let (Some((snap, _)), Some(c)) = (h, &coll.members[d]) else { continue };
        match snap.list_entries(c, name, name, 1).await {
            Ok(list) => return Ok(list.into_iter().next().filter(|e| e.name == name).and_then(|e| e.tag)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::unavailable("no drive holding the object answered")))
}

/// Compares the drives' name indexes of every collection and queues for heal every object that some
/// drive lacks or holds differently, and gives drives the collections they lack. With `deep`, every shard
/// of every object is read back too (damage a healthy read never sees: parity). Returns the names seen.
pub(crate) async fn scan<S: Store>(set: &Arc<SetInner<S>>, deep: bool) -> StoreResult<u64> {
    let snap = SetSnapshot::new(set.clone());
    let mut seen = 0u64;
    for (name, coll) in snap.collections("", SCAN_COLLECTIONS_MAX).await? {
        debug_assert!(!name.starts_with(crate::INTERNAL_COLLECTION_PREFIX), "the set hides its drives' own");
        let coll = ensure_collection(set, coll).await;
        seen += scan_collection(set, &coll, deep).await?;
    }
    set.progress.scans_completed.fetch_add(1, Ordering::Relaxed);
    Ok(seen)
}

/// Collections a scan walks at most.
const SCAN_COLLECTIONS_MAX: usize = 1 << 20;

async fn scan_collection<S: Store>(set: &Arc<SetInner<S>>, coll: &SetColl<S::Coll>, deep: bool) -> StoreResult<u64> {
    let mut from: Vec<u8> = Vec::new();
    let mut seen = 0;
    loop {
        let members = set.members();
        let pages = join_all(members.iter().zip(coll.members.iter()).map(|(m, c)| {
            let from = &from;
            async move {
                match (m, c) {
                    (Some(store), Some(c)) => store.snapshot().list_entries(c, b"", from, SCAN_PAGE).await.ok(),
                    _ => None,
                }
            }
        }))
        .await;
        let horizon = pages
            .iter()
            .flatten()
            .filter(|p| p.len() == SCAN_PAGE)
            .filter_map(|p| p.last().map(|e| e.name.clone()))
            .min();
        let mut names: BTreeMap<Vec<u8>, Vec<Option<Vec<u8>>>> = BTreeMap::new();
        let answering = pages.iter().filter(|p| p.is_some()).count();
        for page in pages.into_iter().flatten() {
            for e in page {
                if horizon.as_ref().is_none_or(|h| e.name <= *h) {
                    names.entry(e.name).or_default().push(e.tag);
                }
            }
        }
        for (name, tags) in &names {
            seen += 1;
            let alike = tags.len() == set.drives() && tags.windows(2).all(|w| w[0] == w[1]);
            if !alike || answering < set.drives() || (deep && damaged(set, coll, name).await) {
                set.queue_heal(&coll.name, name);
            }
        }
        set.progress.scanned_objects.fetch_add(names.len() as u64, Ordering::Relaxed);
        match horizon {
            Some(h) => {
                from = h;
                from.push(0);
            }
            None => return Ok(seen),
        }
    }
}

/// Whether some holder of an object's agreed version fails to read its shard back.
async fn damaged<S: Store>(set: &SetInner<S>, coll: &SetColl<S::Coll>, name: &[u8]) -> bool {
    match crate::read::resolve_all(set, coll, name).await {
        Ok(Some(r)) => !damaged_holders(&r).await.is_empty(),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Heals queued objects, `HEAL_PARALLEL` at a time, until the queue is empty or `max` were tried; returns
/// how many were tried.
pub(crate) async fn heal_queued<S: Store>(set: &Arc<SetInner<S>>, max: usize) -> usize {
    use futures::StreamExt;
    let tried = std::sync::atomic::AtomicUsize::new(0);
    let next = std::iter::from_fn(|| {
        if tried.load(Ordering::Relaxed) >= max || set.check_alive().is_err() {
            return None;
        }
        let item = set.heal.lock().pop_first()?;
        tried.fetch_add(1, Ordering::Relaxed);
        Some(item)
    });
    futures::stream::iter(next)
        .map(|(coll, name)| async move { (heal_object(set, &coll, &name).await, coll) })
        .buffer_unordered(HEAL_PARALLEL)
        .for_each(|(result, coll)| {
            match result {
                Ok(Healed::Nothing) => {}
                Ok(Healed::Drives(_)) => {
                    set.progress.healed_objects.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(collection = %coll, error = %e, "heal of an object failed; it is found again by the scanner");
                    set.progress.failed_objects.fetch_add(1, Ordering::Relaxed);
                }
            }
            futures::future::ready(())
        })
        .await;
    tried.load(Ordering::Relaxed)
}
