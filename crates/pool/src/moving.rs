//! Objects of a moving scope taken to their new member: a write moves the objects it names first
//! (`move_named`, under their locks, which it holds until it commits), and `Pool::move_objects` moves the
//! rest in the background, a bounded batch per call, walking the members the scopes leave.
//!
//! A move copies the object to its new member (data, attributes, priority and listing tag) in one
//! transaction there, then removes it from the old one. So an object is always on one of them, and on both
//! only as the same version (readers then keep the new member's); a crash between the two leaves a copy
//! that the next move of the name finds and only removes the old one. No write goes to the old member once
//! the scope moves, so the old member holds nothing newer than the new one.

use crate::commit::{Source, Target, copy_from_member, create_missed};
use crate::scopes::Placement;
use crate::{Pool, PoolColl, PoolInner, PoolStaged};
use mosaic_store::{Op, Priority, Snapshot, Store, StoreResult, Txn};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Locks over the names of moving scopes (hashed).
const LOCK_STRIPES: usize = 1024;
/// Names a background walk lists at once.
const WALK_PAGE_ENTRIES: usize = 256;
/// Walks a pool remembers where to go on from (one per moving scope and member it leaves).
const MAX_CURSORS: usize = 65_536;

/// Collections a walk of the moving home lists on a member at most (a drive holds at most 2^20).
const HOME_WALK_COLLECTIONS: usize = 1 << 20;

/// A background walk on a member it leaves (`Walk`, owned).
type WalkKey = (String, Option<Vec<u8>>, usize);

/// What the pool keeps for moves: the names' locks and where background walks stopped.
pub(crate) struct Moving {
    locks: Vec<Arc<Mutex<()>>>,
    /// Per (collection, prefix, member left): the name the walk goes on from.
    cursors: parking_lot::Mutex<HashMap<WalkKey, Vec<u8>>>,
}

impl Default for Moving {
    fn default() -> Self {
        Moving { locks: (0..LOCK_STRIPES).map(|_| Arc::new(Mutex::new(()))).collect(), cursors: Default::default() }
    }
}

impl Moving {
    /// The locks of `names` (collection, name), taken in one order so that two holders never wait on each
    /// other.
    async fn lock(&self, names: &[(&str, &[u8])]) -> Vec<OwnedMutexGuard<()>> {
        let mut stripes: Vec<usize> = names.iter().map(|(c, n)| stripe_of(c, n)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut held = Vec::with_capacity(stripes.len());
        for s in stripes {
            held.push(self.locks[s].clone().lock_owned().await);
        }
        held
    }

    pub(crate) fn forget_cursors(&self) {
        self.cursors.lock().clear();
    }

    fn cursor(&self, key: &WalkKey) -> Option<Vec<u8>> {
        self.cursors.lock().get(key).cloned()
    }

    fn set_cursor(&self, key: WalkKey, at: Vec<u8>) {
        let mut cursors = self.cursors.lock();
        if cursors.len() >= MAX_CURSORS && !cursors.contains_key(&key) {
            // Walks start over from their prefix: slower, never wrong.
            cursors.clear();
        }
        cursors.insert(key, at);
    }
}

fn stripe_of(coll: &str, name: &[u8]) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    coll.hash(&mut h);
    name.hash(&mut h);
    (h.finish() % LOCK_STRIPES as u64) as usize
}

/// The locks of the objects a transaction names in moving scopes, and what is to move after it commits.
pub(crate) struct Held {
    _locks: Vec<OwnedMutexGuard<()>>,
    /// A relocated transaction's objects, to move on to their new member once it committed: (collection,
    /// name, the member it ran on, the new member).
    then: Vec<(String, Vec<u8>, usize, usize)>,
}

/// Moves the objects of moving scopes that `txn` names to their new member, and returns their locks, for
/// the transaction to hold until it is done. A transaction `relocated` to the member its objects' scope
/// leaves (its units were staged there before the move began) takes them back there instead, to run where
/// it was planned; `move_on` then moves them on.
pub(crate) async fn move_named<S: Store>(
    pool: &Arc<PoolInner<S>>,
    placement: &Placement,
    txn: &Txn<PoolColl<S::Coll>, PoolStaged<S::Staged>>,
    relocated: Option<usize>,
) -> StoreResult<Held> {
    let mut held = Held { _locks: Vec::new(), then: Vec::new() };
    if !placement.any_moving() {
        return Ok(held);
    }
    let mut moving = Vec::new();
    for op in &txn.ops {
        for (coll, name) in op.named_objects() {
            let coll = &*coll.name;
            let placed = placement.place(coll, name);
            if let Some(before) = placed.before {
                moving.push((coll, name, before, placed.now));
            }
        }
    }
    if moving.is_empty() {
        return Ok(held);
    }
    let names: Vec<(&str, &[u8])> = moving.iter().map(|(c, n, _, _)| (*c, *n)).collect();
    held._locks = pool.moving.lock(&names).await;
    for (coll, name, before, now) in moving {
        if relocated == Some(before) {
            move_one(pool, coll, name, now, before, None).await?;
            held.then.push((coll.to_string(), name.to_vec(), before, now));
        } else {
            move_one(pool, coll, name, before, now, None).await?;
        }
    }
    Ok(held)
}

/// After a relocated transaction committed: its objects move on to their new member. A failure leaves them
/// where the transaction put them (the only copy, so reads find them; the background walk moves them).
pub(crate) async fn move_on<S: Store>(pool: &Arc<PoolInner<S>>, held: &Held) {
    for (coll, name, from, to) in &held.then {
        if let Err(e) = move_one(pool, coll, name, *from, *to, None).await {
            tracing::warn!(collection = %coll, name = %name.escape_ascii(), error = %e, "an object written where its scope left stays there for now");
        }
    }
}

/// Moves object `name` of collection `coll` from member `from` to member `to` (nothing when `from` does not
/// hold it; only the removal when `to` holds it already: a move that a crash cut short). The caller holds
/// the name's lock. The bytes copied.
async fn move_one<S: Store>(
    pool: &Arc<PoolInner<S>>,
    coll: &str,
    name: &[u8],
    from: usize,
    to: usize,
    priority: Option<Priority>,
) -> StoreResult<u64> {
    debug_assert_ne!(from, to);
    let src = pool.members[from].snapshot();
    let Some(src_coll) = src.collection(coll).await? else { return Ok(0) };
    let Some(info) = src.lookup(&src_coll, name).await? else { return Ok(0) };
    let dst = pool.members[to].snapshot();
    let dst_coll = match dst.collection(coll).await? {
        Some(c) => c,
        None => create_missed(pool, coll, to).await?,
    };
    let mut copied = 0;
    if dst.lookup(&dst_coll, name).await?.is_none() {
        let tag =
            src.list_entries(&src_coll, name, name, 1).await?.into_iter().find(|e| e.name == name).and_then(|e| e.tag);
        let source = Source::<S> { snap: &src, obj: &info.obj, high_priority: info.high_priority, name };
        let target = Target::<S> { member: to, coll: dst_coll.clone(), name: name.to_vec(), offset: 0 };
        let mut ops = copy_from_member(pool, source, 0, info.size_bytes, true, target).await?;
        if let Some(tag) = tag {
            ops.push(Op::SetNameTag { coll: dst_coll, name: name.to_vec(), tag });
        }
        pool.members[to].commit(Txn { ops, priority }).await?;
        copied = info.size_bytes;
    }
    let remove = Txn { ops: vec![Op::Remove { coll: src_coll, name: name.to_vec() }], priority };
    pool.members[from].commit(remove).await?;
    Ok(copied)
}

/// What a call of `Pool::move_objects` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveReport {
    pub objects: u64,
    pub bytes: u64,
    /// Moving scopes (collection, prefix) that the members they leave hold nothing of any more: their
    /// moves are done, and they may be set without `moving_from`.
    pub settled: Vec<(String, Vec<u8>)>,
    /// The home moves, and the members it leaves hold nothing of it any more: it may be set without
    /// `moving_from`.
    pub home_settled: bool,
}

impl<S: Store> Pool<S> {
    /// Moves at most `max_objects` objects of moving scopes to their new members, at the background
    /// priority, going on where the last call stopped.
    pub async fn move_objects(&self, max_objects: u64) -> StoreResult<MoveReport> {
        let pool = &self.inner;
        let placement = pool.placement();
        let mut report = MoveReport::default();
        // Units staged by an earlier placement may still be written where a scope leaves (the write runs
        // there, then moves on): no move ends while any are in flight.
        let earlier_in_flight = pool.previous.lock().iter().any(|p| p.strong_count() > 0);
        for scope in placement.scopes().iter().filter(|s| s.moving_from.is_some()) {
            let mut settled = !earlier_in_flight;
            for &m in scope.moving_from.iter().flatten() {
                let walk = Walk { coll: &scope.coll, scope_prefix: Some(&scope.prefix) };
                settled &= walk_member(pool, &placement, walk, m, max_objects, &mut report).await?;
            }
            if settled {
                report.settled.push((scope.coll.clone(), scope.prefix.clone()));
            }
        }
        if let Some(from) = placement.home().moving_from {
            let mut settled = !earlier_in_flight;
            for m in from {
                settled &= walk_home(pool, &placement, m, max_objects, &mut report).await?;
            }
            report.home_settled = settled;
        }
        Ok(report)
    }
}

/// Moves what member `m` holds of every collection elsewhere when its placement says so (the objects of
/// the moving home, and of any moving scope found there): true once every walk went to the end.
async fn walk_home<S: Store>(
    pool: &Arc<PoolInner<S>>,
    placement: &Arc<Placement>,
    m: usize,
    max_objects: u64,
    report: &mut MoveReport,
) -> StoreResult<bool> {
    let colls = pool.members[m].snapshot().collections("", HOME_WALK_COLLECTIONS).await?;
    for (coll, _) in &colls {
        let walk = Walk { coll, scope_prefix: None };
        if !walk_member(pool, placement, walk, m, max_objects, report).await? {
            return Ok(false);
        }
    }
    Ok(colls.len() < HOME_WALK_COLLECTIONS)
}

/// What a walk goes over: a moving scope's names (its collection, Some(prefix)), or, while the home
/// moves, one collection's names (None).
#[derive(Clone, Copy)]
struct Walk<'a> {
    coll: &'a str,
    scope_prefix: Option<&'a [u8]>,
}

/// Moves what member `m` holds of `walk` elsewhere, from where the last walk stopped: true once it walked
/// to the end, false when it stopped at the batch's limit or the scopes changed.
async fn walk_member<S: Store>(
    pool: &Arc<PoolInner<S>>,
    placement: &Arc<Placement>,
    walk: Walk<'_>,
    m: usize,
    max_objects: u64,
    report: &mut MoveReport,
) -> StoreResult<bool> {
    let key = (walk.coll.to_string(), walk.scope_prefix.map(<[u8]>::to_vec), m);
    let prefix = walk.scope_prefix.unwrap_or_default();
    loop {
        let from = pool.moving.cursor(&key).unwrap_or_else(|| prefix.to_vec());
        let snap = pool.members[m].snapshot();
        let Some(c) = snap.collection(walk.coll).await? else { return Ok(true) };
        let page = snap.list_entries(&c, prefix, &from, WALK_PAGE_ENTRIES).await?;
        for e in &page {
            let now = placement.place(walk.coll, &e.name).now;
            if now != m {
                if report.objects >= max_objects {
                    return Ok(false);
                }
                // Under the gate, as a write: no collection is removed and no scope changes meanwhile.
                let _gate = pool.gate.read().await;
                if !Arc::ptr_eq(&pool.placement(), placement) {
                    return Ok(false);
                }
                let _held = pool.moving.lock(&[(walk.coll, &e.name)]).await;
                report.bytes += move_one(pool, walk.coll, &e.name, m, now, Some(Priority::Background)).await?;
                report.objects += 1;
            }
            let mut next = e.name.clone();
            next.push(0);
            pool.moving.set_cursor(key.clone(), next);
        }
        if page.len() < WALK_PAGE_ENTRIES {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_kept_up_to_their_limit_and_start_over_past_it() {
        let moving = Moving::default();
        let key = |i: usize| (format!("c{i}"), Some(Vec::new()), 0);
        for i in 0..MAX_CURSORS {
            moving.set_cursor(key(i), b"at".to_vec());
        }
        moving.set_cursor(key(0), b"later".to_vec());
        assert_eq!(moving.cursors.lock().len(), MAX_CURSORS, "a walk's cursor moves on at the limit");
        assert_eq!(moving.cursor(&key(0)).as_deref(), Some(&b"later"[..]));
        moving.set_cursor(key(MAX_CURSORS), b"new".to_vec());
        assert_eq!(moving.cursors.lock().len(), 1, "past it every walk starts over");
        assert_eq!((moving.cursor(&key(1)), moving.cursor(&key(MAX_CURSORS))), (None, Some(b"new".to_vec())));
    }
}
