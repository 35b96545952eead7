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

/// Stripes rebuilt per step (bounds the memory of a heal: this many stripes of k + m shards, 1 MiB each,
/// for each step in flight).
const HEAL_STEP_STRIPES: u64 = 256;
/// Steps of one object's rebuild read and decoded at once while the set and its node are quiet
/// (`SetInner::heal_may_deepen`; one otherwise): the reads of five 1 MiB shards and the decoding of one
/// step leave a core idle on their own.
const HEAL_STEPS_IN_FLIGHT: usize = 3;
/// Writes of one object's rebuilt steps to the new drive in flight at once while the set and its node are
/// quiet (one otherwise). Measured (docs/bench/2026-12-03-heal-depth.md): 3 steps read and 2 written at
/// once rebuilt 1.19x faster than one of each; 4 writes did no better than 2.
const HEAL_STAGES_IN_FLIGHT: usize = 2;
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
    /// The most steps of one rebuild read at once since the set was opened (at most
    /// `HEAL_STEPS_IN_FLIGHT`; one while foreground work keeps the set or its node busy).
    pub steps_read_at_once_max: AtomicU64,
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
    heal_locked(set, &coll, name, &mut lock, Urgency::Background).await
}

/// Who waits for a heal: the background's heal, or a foreground write that needs the object whole first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// Yields to foreground work step by step, and commits at background priority.
    Background,
    /// Runs for a foreground write holding the object's lock: no yield (the write counts as foreground
    /// work itself, so it would wait on itself), committed at foreground priority.
    Foreground,
}

impl Urgency {
    fn priority(self) -> Priority {
        match self {
            Urgency::Background => Priority::Background,
            Urgency::Foreground => Priority::Foreground,
        }
    }
}

/// `heal_object`'s work, under the object's `lock` (held by the caller), on the collection's handles `coll`
/// (every present drive has one: `ensure_collection`).
pub(crate) async fn heal_locked<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    lock: &mut crate::locks::Exclusive,
    urgency: Urgency,
) -> StoreResult<Healed> {
    let states = drive_states(set, coll, name).await;
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
                let txn = Txn::new().with_priority(urgency.priority()).op(Op::Remove { coll: c, name: name.to_vec() });
                store.commit(txn).await?;
                n += 1;
            }
            Ok(if n == 0 { Healed::Nothing } else { Healed::Drives(n) })
        }
        Verdict::Found(r) => {
            let stale: Vec<usize> = (0..set.drives())
                .filter(|d| r.holders[*d].is_none() && set.member(*d).is_some() && held[*d] != Some(r.layout.write_id))
                .collect();
            // Holders whose shard no longer reads back (damage found by a read) are rebuilt too. With none
            // stale, every holder's shard is read for it alone. Rebuilding a stale drive reads k holders'
            // shards and finds damage among them; a damaged holder it did not read stays so until its next
            // read or the deep scan queues the object again, when nothing is stale (a drive replacement
            // would otherwise read every shard a fifth more than it needs, on a 4+2 set).
            let mut damaged = if stale.is_empty() { damaged_holders(&r).await } else { damaged_tails(&r).await };
            let mut n = 0;
            let skip = |d: usize| !answered[d] && set.member(d).is_none();
            for d in stale.into_iter().filter(|d| !skip(*d)) {
                rebuild_on(set, coll, name, &r, d, lock, urgency, &mut damaged).await?;
                n += 1;
            }
            damaged.sort_unstable();
            damaged.dedup();
            for d in damaged.into_iter().filter(|d| !skip(*d)) {
                rebuild_on(set, coll, name, &r, d, lock, urgency, &mut Vec::new()).await?;
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
#[allow(clippy::too_many_arguments)]
async fn rebuild_on<S: Store>(
    set: &SetInner<S>,
    coll: &SetColl<S::Coll>,
    name: &[u8],
    r: &Resolved<S>,
    d: usize,
    lock: &mut crate::locks::Exclusive,
    urgency: Urgency,
    damaged: &mut Vec<usize>,
) -> StoreResult<()> {
    let (Some(store), Some(c)) = (set.member(d), coll.members[d].clone()) else {
        return Err(StoreError::unavailable(format!("drive {d} is missing")));
    };
    let l = r.layout;
    let g = SetGeometry { data: l.data as usize, parity: l.parity as usize };
    let shard = g.shard_on_drive(l.rotation as usize, d);
    let mut txn = Txn::new().with_priority(urgency.priority()).op(Op::Reset { coll: c.clone(), name: name.to_vec() });
    let step_bytes = HEAL_STEP_STRIPES * g.stripe_bytes();
    let offset_on_drive = |at: u64| at / g.data as u64;
    // A pipeline: the steps' shards are read from the others and rebuilt while earlier steps are written
    // to the new drive, several of each at once while the set and its node are quiet (one of each
    // otherwise, so foreground work still preempts heal step by step, and a load whose requests merely
    // leave the set idle between them does not meet heal's bursts). Buffers the drive hands back after
    // staging are reused: no allocation or zeroing per step.
    let mut at = 0u64;
    let mut reading = futures::stream::FuturesOrdered::new();
    let mut staging = futures::stream::FuturesOrdered::new();
    let mut ready: Option<Step> = None;
    let mut spare: Vec<AlignedBuf> = Vec::with_capacity(HEAL_STEPS_IN_FLIGHT + HEAL_STAGES_IN_FLIGHT);
    let mut staged_to = 0u64;
    let store = &store;
    loop {
        while at < l.encoded_bytes
            && ready.is_none()
            && (reading.is_empty() || (reading.len() < HEAL_STEPS_IN_FLIGHT && set.heal_may_deepen()))
        {
            if urgency == Urgency::Background {
                set.yield_to_foreground().await;
            }
            // A large rebuild outlasts a lease: renewed step by step.
            lock.renew().await?;
            let to = (at + step_bytes).min(l.encoded_bytes);
            reading.push_back(rebuild_shard_range(r, &g, shard, at, to, spare.pop()));
            debug_assert!(reading.len() <= HEAL_STEPS_IN_FLIGHT);
            set.progress.steps_read_at_once_max.fetch_max(reading.len() as u64, Ordering::Relaxed);
            at = to;
        }
        if (staging.is_empty() || (staging.len() < HEAL_STAGES_IN_FLIGHT && set.heal_may_deepen()))
            && let Some(step) = ready.take()
        {
            staging.push_back(async move {
                let (staged, back) = store.stage(step.buf, step.len, name).await?;
                Ok::<_, StoreError>((step.from, step.len, staged, back))
            });
        }
        if reading.is_empty() && staging.is_empty() && ready.is_none() {
            break;
        }
        use futures::StreamExt;
        tokio::select! {
            biased;
            Some(staged) = staging.next(), if !staging.is_empty() => {
                let (from, len, staged, back) = staged?;
                debug_assert_eq!(offset_on_drive(from), staged_to, "steps are staged in order");
                txn.push(Op::WriteStaged { coll: c.clone(), name: name.to_vec(), offset: offset_on_drive(from), staged });
                set.progress.healed_bytes.fetch_add(len as u64, Ordering::Relaxed);
                staged_to += len as u64;
                spare.push(back);
            }
            Some(step) = reading.next(), if !reading.is_empty() && ready.is_none() => {
                let step = step?;
                debug_assert_eq!(step.len as u64, offset_on_drive(step.to - step.from), "a step rebuilds its stripes' units");
                damaged.extend_from_slice(&step.damaged);
                ready = Some(step);
            }
            else => break,
        }
    }
    debug_assert!(at == l.encoded_bytes && ready.is_none() && reading.is_empty(), "every step's shard is staged");
    assert_eq!(staged_to, offset_on_drive(l.encoded_bytes), "the rebuilt shard is whole");
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

/// One step of a rebuild: shard bytes of the encoded range [from, to), in the first `len` bytes of `buf`,
/// and the holders whose shard failed to read.
struct Step {
    from: u64,
    to: u64,
    len: usize,
    buf: AlignedBuf,
    damaged: Vec<usize>,
}

/// Shard `shard` of encoded bytes [from, to) (whole stripes), rebuilt from k of the holders' shards into
/// `reuse` when it is long enough (any content: every byte is written), else into a new buffer. The
/// sources are the first k holders in shard order (the data shards first: a parity shard is then encoded
/// again, not decoded); a source whose read fails comes back in `Step::damaged` (drives) and the next
/// holder is read in its place. Reading only k (not every other holder) spares a fifth of a 4+2 rebuild's
/// reads and checksum passes; damage on a holder not read is found by its next read or the deep scan,
/// which queue the object again.
async fn rebuild_shard_range<S: Store>(
    r: &Resolved<S>,
    g: &SetGeometry,
    shard: usize,
    from: u64,
    to: u64,
    reuse: Option<AlignedBuf>,
) -> StoreResult<Step> {
    let (s0, s1) = stripes_covering(g, from, to);
    let (at, len) = (s0 * SHARD_UNIT_BYTES, (s1 - s0) * SHARD_UNIT_BYTES);
    let rotation = r.layout.rotation as usize;
    // A shard's bytes, read into a buffer of its own through the page cache (`read_into`: never mapped,
    // so no page faults and no unmapping per step, and checked in place while the copy is in the CPU's
    // cache), or Err when the read fails or comes back short.
    let read_shard = |j: usize| {
        let holder = r.holders[g.drive_of_shard(rotation, j)].as_ref();
        async move {
            let (snap, obj) = holder.ok_or(())?;
            let (buf, mut lanes) = mosaic_store::StripedBuffer::new(1, len as usize, 1, 0);
            let lane = lanes.pop().ok_or(())?;
            match snap.read_into(obj, at, lane).await {
                Ok(n) if n == len => buf.into_vec().ok_or(()),
                _ => Err(()),
            }
        }
    };
    let mut shards: Vec<Option<Vec<u8>>> = vec![None; g.drives()];
    let mut damaged = Vec::new();
    let mut sources = (0..g.drives()).filter(|j| *j != shard && r.holders[g.drive_of_shard(rotation, *j)].is_some());
    let mut have = 0;
    // At most k + m - 1 reads in all: each round reads as many as are still missing, from holders not tried.
    while have < g.data {
        let round: Vec<usize> = sources.by_ref().take(g.data - have).collect();
        if round.is_empty() {
            break;
        }
        for (&j, read) in round.iter().zip(join_all(round.iter().map(|&j| read_shard(j))).await) {
            match read {
                Ok(b) => {
                    shards[j] = Some(b);
                    have += 1;
                }
                Err(()) => damaged.push(g.drive_of_shard(rotation, j)),
            }
        }
    }
    debug_assert!(have <= g.data && shards[shard].is_none(), "k sources at most, never the shard rebuilt");
    let codec = codec_by_id(r.layout.codec, g.data, g.parity)
        .ok_or_else(|| StoreError::corrupt(format!("an object's erasure code {} is unknown", r.layout.codec)))?;
    let len = len as usize;
    let mut buf = reuse.filter(|b| b.len() >= len).unwrap_or_else(|| AlignedBuf::zeroed(len));
    // Decoding is CPU work: off the async threads, which serve requests, and in the background's CPU class
    // unless a client's write waits for it. The shards read are borrowed, and the rebuilt one goes
    // straight into the buffer staged on the drive.
    let buf = mosaic_store::spawn_blocking_in(mosaic_store::io_share(), move || {
        let refs: Vec<Option<&[u8]>> = shards.iter().map(|s| s.as_deref()).collect();
        codec
            .rebuild_one(&refs, shard, &mut buf.as_mut_slice()[..len])
            .map(|()| buf)
            .map_err(|e| StoreError::unavailable(format!("cannot rebuild: {e}")))
    })
    .await
    .map_err(|e| StoreError::internal(format!("a decoding worker failed: {e}")))??;
    Ok(Step { from, to, len, buf, damaged })
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
