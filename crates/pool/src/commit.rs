//! Writing a pool. A transaction's objects live on one member (they share a locator, or the S3 layer
//! would not change them together), so it is that member's transaction, atomic and durable as the
//! member makes it. Three things need more:
//!
//! - A clone between objects of two members cannot share data: the source is read and written to the
//!   destination's member (staged whole units, the tail in the operation), with its attributes.
//! - Assertions on objects of a member the transaction does not change are checked first, in the
//!   snapshot that the clones of the transaction read (they guard what is read: the copy is of the version
//!   that held).
//! - Collections exist on every member, with the home member (0) as their catalog: a creation commits on
//!   the home member (with the transaction's other operations, which must live there too) and then on the
//!   others; a member that missed it gets it with its first write. A removal checks that every other
//!   member holds nothing in the collection, commits on the home member, then removes it from the others.
//!   Collection changes hold the pool's gate exclusively, object writes hold it shared.

use crate::scopes::Placement;
use crate::snapshot::PoolSnapshot;
use crate::{Handle, PoolColl, PoolInner, PoolStaged};
use mosaic_store::{AlignedBuf, ErrorKind, Op, Outcome, Snapshot, Store, StoreError, StoreResult, Txn};
use std::collections::HashMap;

type PoolOp<S> = Op<PoolColl<<S as Store>::Coll>, PoolStaged<<S as Store>::Staged>>;
pub(crate) type MemberOp<S> = Op<<S as Store>::Coll, <S as Store>::Staged>;

/// Bytes read per step when a clone between members copies data.
const COPY_CHUNK_BYTES: u64 = 32 << 20;
/// Attributes an object may have that a copy between members carries over (the drive allows fewer).
const MAX_COPIED_ATTRS: usize = 65_536;

fn invalid(why: String) -> StoreError {
    StoreError::new(ErrorKind::InvalidArgument, why)
}

/// Where an operation of a transaction applies.
enum Route {
    /// Changes objects of this member.
    Write(usize),
    /// Only checks an object of this member.
    Check(usize),
    /// Clones from one member into another: the data is copied.
    Copy { from: usize, to: usize },
    /// Creates or removes a collection.
    Catalog,
}

fn route<C, St>(op: &Op<PoolColl<C>, St>, placement: &Placement) -> StoreResult<Route> {
    let at = |coll: &PoolColl<C>, name: &[u8]| placement.place(&coll.name, name).now;
    Ok(match op {
        Op::CreateCollection { .. } | Op::RemoveCollection { .. } => Route::Catalog,
        Op::AssertAttr { coll, name, .. } | Op::AssertExists { coll, name } => Route::Check(at(coll, name)),
        Op::Clone { coll, from, to_coll, to } if at(coll, from) != at(to_coll, to) => {
            Route::Copy { from: at(coll, from), to: at(to_coll, to) }
        }
        Op::CloneRange { src_coll, src, dst_coll, dst, .. } if at(src_coll, src) != at(dst_coll, dst) => {
            Route::Copy { from: at(src_coll, src), to: at(dst_coll, dst) }
        }
        Op::Clone { to_coll: coll, to: name, .. } | Op::CloneRange { dst_coll: coll, dst: name, .. } => {
            Route::Write(at(coll, name))
        }
        Op::Rename { coll, from, to_coll, to } if at(coll, from) != at(to_coll, to) => {
            return Err(invalid(format!(
                "a rename between objects of two members ({} to {})",
                from.escape_ascii(),
                to.escape_ascii()
            )));
        }
        Op::Create { coll, name }
        | Op::Reset { coll, name }
        | Op::Write { coll, name, .. }
        | Op::WriteStaged { coll, name, .. }
        | Op::Append { coll, name, .. }
        | Op::Remove { coll, name }
        | Op::Rename { coll, from: name, .. }
        | Op::Truncate { coll, name, .. }
        | Op::SetAttr { coll, name, .. }
        | Op::RemoveAttr { coll, name, .. }
        | Op::SetNameTag { coll, name, .. }
        | Op::SetPriority { coll, name, .. } => Route::Write(at(coll, name)),
    })
}

pub(crate) async fn commit<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    txn: Txn<PoolColl<S::Coll>, PoolStaged<S::Staged>>,
) -> StoreResult<Outcome> {
    let catalog = txn.ops.iter().any(|op| matches!(op, Op::CreateCollection { .. } | Op::RemoveCollection { .. }));
    if catalog {
        let placement = pool.placement();
        let routes = txn.ops.iter().map(|op| route(op, &placement)).collect::<StoreResult<Vec<_>>>()?;
        return commit_catalog(pool, txn, &routes).await;
    }
    // The placement is read under the gate: a change of scopes waits for the writes that planned by the
    // one before.
    let _gate = pool.gate.read().await;
    let placement = pool.placement();
    let mut routes = txn.ops.iter().map(|op| route(op, &placement)).collect::<StoreResult<Vec<_>>>()?;
    let mut writers: Vec<usize> = routes
        .iter()
        .filter_map(|r| match r {
            Route::Write(m) | Route::Copy { to: m, .. } => Some(*m),
            _ => None,
        })
        .collect();
    writers.sort_unstable();
    writers.dedup();
    if writers.len() > 1 {
        return Err(invalid(format!("a transaction changes objects of members {writers:?}: their locators differ")));
    }
    // Units staged before a move began lie on the member their scope leaves: the transaction runs there.
    let relocated = relocation::<S>(&txn, &placement, writers.first().copied())?;
    if let Some(old) = relocated {
        let member = writers[0];
        writers = vec![old];
        let to_old = |m: usize| if m == member { old } else { m };
        routes = routes
            .into_iter()
            .map(|r| match r {
                Route::Write(m) => Route::Write(to_old(m)),
                Route::Check(m) => Route::Check(to_old(m)),
                Route::Copy { from, to } if from == to_old(to) => Route::Write(from),
                Route::Copy { from, to } => Route::Copy { from, to: to_old(to) },
                Route::Catalog => Route::Catalog,
            })
            .collect();
    }
    // Objects of moving scopes that the transaction names are moved to their new member first (back to the
    // old one for a relocated transaction), under their locks, which the transaction holds until it is
    // done (no move copies an older version over it).
    let moved = crate::moving::move_named(pool, &placement, &txn, relocated).await?;
    let committed = commit_on(pool, txn, routes, &writers).await;
    if committed.is_ok() {
        crate::moving::move_on(pool, &moved).await;
    }
    committed
}

/// The member a transaction's staged units lie on when it is not the one its objects now live on: the
/// member their scope leaves, as the units were staged before the move began (None: no such units). Units
/// staged anywhere else cannot be written (the placement changed twice meanwhile): the write is tried again.
fn relocation<S: Store>(
    txn: &Txn<PoolColl<S::Coll>, PoolStaged<S::Staged>>,
    placement: &Placement,
    member: Option<usize>,
) -> StoreResult<Option<usize>> {
    let Some(member) = member else { return Ok(None) };
    let staged: Vec<usize> = txn
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::WriteStaged { staged, .. } => Some(staged.member),
            _ => None,
        })
        .collect();
    let Some(&old) = staged.iter().find(|m| **m != member) else { return Ok(None) };
    let from_old = |(coll, name): (&PoolColl<S::Coll>, &[u8])| {
        let placed = placement.place(&coll.name, name);
        placed.now != member || placed.before == Some(old)
    };
    if staged.iter().all(|m| *m == old) && txn.ops.iter().flat_map(|op| op.named_objects()).all(from_old) {
        return Ok(Some(old));
    }
    Err(StoreError::unavailable(format!(
        "units staged on member {old} are written to objects of member {member}: the placement changed"
    )))
}

/// Commits a routed transaction on its one writing member (`writers`), checks on other members first.
async fn commit_on<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    txn: Txn<PoolColl<S::Coll>, PoolStaged<S::Staged>>,
    routes: Vec<Route>,
    writers: &[usize],
) -> StoreResult<Outcome> {
    let snap = PoolSnapshot::new(pool.clone());
    // Checks on members the transaction does not change, first.
    for (i, (op, r)) in txn.ops.iter().zip(&routes).enumerate() {
        if let Route::Check(m) = r
            && writers.first() != Some(m)
        {
            check(&snap, op).await.map_err(|e| e.in_op(i))?;
        }
    }
    let Some(&member) = writers.first() else { return Ok(Outcome::default()) };
    let priority = txn.priority;
    let mut out: Vec<(MemberOp<S>, usize)> = Vec::with_capacity(txn.ops.len());
    let mut handles = Handles::<S>::default();
    for (i, (op, r)) in txn.ops.into_iter().zip(routes).enumerate() {
        match r {
            Route::Check(m) if m != member => {}
            Route::Copy { from, to } => {
                for op in copy_ops(pool, &snap, &mut handles, op, from, to).await.map_err(|e| e.in_op(i))? {
                    out.push((op, i));
                }
            }
            _ => out.push((handles.member_op(pool, op, member).await.map_err(|e| e.in_op(i))?, i)),
        }
    }
    let index: Vec<usize> = out.iter().map(|(_, i)| *i).collect();
    let member_txn = Txn { ops: out.into_iter().map(|(op, _)| op).collect(), priority };
    pool.members[member].commit(member_txn).await.map_err(|e| match e.op_index {
        Some(j) if j < index.len() => StoreError { op_index: Some(index[j]), ..e },
        _ => e,
    })
}

/// Checks an `AssertAttr` or `AssertExists` in `snap`.
async fn check<S: Store>(snap: &PoolSnapshot<S>, op: &Op<PoolColl<S::Coll>, PoolStaged<S::Staged>>) -> StoreResult<()> {
    let failed = |what: &str, name: &[u8]| {
        Err(StoreError::new(ErrorKind::AssertionFailed, format!("{what} of {} does not hold", name.escape_ascii())))
    };
    match op {
        Op::AssertExists { coll, name } => match snap.lookup(coll, name).await? {
            Some(_) => Ok(()),
            None => failed("the existence", name),
        },
        Op::AssertAttr { coll, name, key, expected } => {
            let value = match snap.lookup(coll, name).await? {
                Some(info) => snap.attr(&info.obj, key).await?,
                None => None,
            };
            if &value == expected { Ok(()) } else { failed("an attribute", name) }
        }
        _ => Err(StoreError::internal(format!("{} is not a check", op.kind_name()))),
    }
}

/// Each collection's handle on the member written, created there when the member missed its creation.
struct Handles<S: Store> {
    by_name: HashMap<std::sync::Arc<str>, S::Coll>,
}

impl<S: Store> Default for Handles<S> {
    fn default() -> Self {
        Handles { by_name: HashMap::new() }
    }
}

impl<S: Store> Handles<S> {
    async fn get(
        &mut self,
        pool: &std::sync::Arc<PoolInner<S>>,
        coll: &PoolColl<S::Coll>,
        member: usize,
    ) -> StoreResult<S::Coll> {
        if let Some(c) = self.by_name.get(&coll.name) {
            return Ok(c.clone());
        }
        let c = match &coll.members[member] {
            Handle::Present(c) => c.clone(),
            Handle::Unreachable(e) => return Err(e.clone()),
            Handle::Absent => create_missed(pool, &coll.name, member).await?,
        };
        self.by_name.insert(coll.name.clone(), c.clone());
        Ok(c)
    }

    /// The operation with the member's handles and staged units.
    async fn member_op(
        &mut self,
        pool: &std::sync::Arc<PoolInner<S>>,
        op: PoolOp<S>,
        member: usize,
    ) -> StoreResult<MemberOp<S>> {
        macro_rules! h {
            ($c:expr) => {
                self.get(pool, &$c, member).await?
            };
        }
        Ok(match op {
            Op::Create { coll, name } => Op::Create { coll: h!(coll), name },
            Op::Reset { coll, name } => Op::Reset { coll: h!(coll), name },
            Op::Write { coll, name, offset, data } => Op::Write { coll: h!(coll), name, offset, data },
            Op::WriteStaged { coll, name, offset, staged } => {
                if staged.member != member {
                    // Staged by a placement that changed since (a scope moved): the write is tried again.
                    return Err(StoreError::unavailable(format!(
                        "units staged on member {} written to {} on member {member}: the placement changed",
                        staged.member,
                        name.escape_ascii()
                    )));
                }
                Op::WriteStaged { coll: h!(coll), name, offset, staged: staged.staged }
            }
            Op::Append { coll, name, data, expected_offset } => {
                Op::Append { coll: h!(coll), name, data, expected_offset }
            }
            Op::Remove { coll, name } => Op::Remove { coll: h!(coll), name },
            Op::Rename { coll, from, to_coll, to } => Op::Rename { coll: h!(coll), from, to_coll: h!(to_coll), to },
            Op::Truncate { coll, name, size_bytes } => Op::Truncate { coll: h!(coll), name, size_bytes },
            Op::Clone { coll, from, to_coll, to } => Op::Clone { coll: h!(coll), from, to_coll: h!(to_coll), to },
            Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => {
                Op::CloneRange { src_coll: h!(src_coll), src, src_offset, len, dst_coll: h!(dst_coll), dst, dst_offset }
            }
            Op::SetAttr { coll, name, key, value } => Op::SetAttr { coll: h!(coll), name, key, value },
            Op::RemoveAttr { coll, name, key } => Op::RemoveAttr { coll: h!(coll), name, key },
            Op::SetNameTag { coll, name, tag } => Op::SetNameTag { coll: h!(coll), name, tag },
            Op::SetPriority { coll, name, high } => Op::SetPriority { coll: h!(coll), name, high },
            Op::AssertAttr { coll, name, key, expected } => Op::AssertAttr { coll: h!(coll), name, key, expected },
            Op::AssertExists { coll, name } => Op::AssertExists { coll: h!(coll), name },
            Op::CreateCollection { .. } | Op::RemoveCollection { .. } => {
                return Err(StoreError::internal("a collection change outside the catalog path"));
            }
        })
    }
}

/// Creates collection `name` on `member`, which missed its creation (a crash or an unreachable member
/// then), after checking that the catalog still has it (the gate, held shared, keeps it there).
pub(crate) async fn create_missed<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    name: &str,
    member: usize,
) -> StoreResult<S::Coll> {
    if pool.members[0].snapshot().collection(name).await?.is_none() {
        return Err(StoreError::new(ErrorKind::CollectionNotFound, format!("collection {name}")));
    }
    let create = Txn::new().op(Op::CreateCollection { name: name.to_string() });
    match pool.members[member].commit(create).await {
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::CollectionExists => {}
        Err(e) => return Err(e),
    }
    pool.forget(name);
    pool.members[member].snapshot().collection(name).await?.ok_or_else(|| {
        StoreError::unavailable(format!("collection {name} was created on member {member} and is not there"))
    })
}

/// A clone from member `from` into member `to` as writes on `to`: the source's data (whole units staged,
/// the rest in `Write`s), and for a whole-object clone its attributes and priority.
async fn copy_ops<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    snap: &PoolSnapshot<S>,
    handles: &mut Handles<S>,
    op: PoolOp<S>,
    from: usize,
    to: usize,
) -> StoreResult<Vec<MemberOp<S>>> {
    debug_assert_ne!(from, to);
    let (src_coll, src, src_offset, len, dst_coll, dst, dst_offset, whole) = match op {
        Op::Clone { coll, from, to_coll, to } => (coll, from, 0, u64::MAX, to_coll, to, 0, true),
        Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => {
            (src_coll, src, src_offset, len, dst_coll, dst, dst_offset, false)
        }
        other => return Err(StoreError::internal(format!("{} is not a clone", other.kind_name()))),
    };
    let info = snap
        .lookup(&src_coll, &src)
        .await?
        .ok_or_else(|| StoreError::not_found(format!("object {}", src.escape_ascii())))?;
    debug_assert_eq!(info.obj.member, from);
    let len = if whole { info.size_bytes } else { len };
    if src_offset.checked_add(len).is_none_or(|end| end > info.size_bytes) {
        return Err(invalid(format!("a clone of bytes past the end of {}", src.escape_ascii())));
    }
    let coll = handles.get(pool, &dst_coll, to).await?;
    let source =
        Source { snap: snap.member_snap(&info.obj), obj: &info.obj.obj, high_priority: info.high_priority, name: &src };
    let target = Target { member: to, coll, name: dst, offset: dst_offset };
    copy_from_member(pool, source, src_offset, len, whole, target).await
}

/// An object read through a member's snapshot.
pub(crate) struct Source<'a, S: Store> {
    pub(crate) snap: &'a S::Snapshot,
    pub(crate) obj: &'a S::Obj,
    pub(crate) high_priority: bool,
    pub(crate) name: &'a [u8],
}

/// Where a copy goes: an object of a member, from an offset.
pub(crate) struct Target<S: Store> {
    pub(crate) member: usize,
    pub(crate) coll: S::Coll,
    pub(crate) name: Vec<u8>,
    pub(crate) offset: u64,
}

/// Bytes [src_offset, src_offset + len) of `source` as operations on `target`'s member: whole units staged
/// there, the rest in `Write`s; with `whole`, a reset first and the source's attributes and priority after.
pub(crate) async fn copy_from_member<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    source: Source<'_, S>,
    src_offset: u64,
    len: u64,
    whole: bool,
    target: Target<S>,
) -> StoreResult<Vec<MemberOp<S>>> {
    let Target { member: to, coll, name: dst, offset: dst_offset } = target;
    let mut ops = Vec::new();
    if whole {
        ops.push(Op::Reset { coll: coll.clone(), name: dst.clone() });
    }
    let g = pool.members[to].geometry();
    let chunk_bytes = (COPY_CHUNK_BYTES / g.unit_bytes).max(1) * g.unit_bytes;
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(chunk_bytes);
        let data = source.snap.read(source.obj, src_offset + pos, n).await?;
        if data.len() as u64 != n {
            return Err(StoreError::corrupt(format!("{} is shorter than its size", source.name.escape_ascii())));
        }
        let whole_units = (n / g.unit_bytes * g.unit_bytes) as usize;
        if whole_units > 0 {
            let buf = AlignedBuf::copy_of(&data[..whole_units]);
            let (staged, _) = pool.members[to].stage(buf, whole_units, mosaic_store::locator(&dst)).await?;
            ops.push(Op::WriteStaged { coll: coll.clone(), name: dst.clone(), offset: dst_offset + pos, staged });
        }
        let mut at = whole_units;
        while at < data.len() {
            let piece = (data.len() - at).min(g.max_op_data_bytes.max(1) as usize);
            let offset = dst_offset + pos + at as u64;
            ops.push(Op::Write { coll: coll.clone(), name: dst.clone(), offset, data: data[at..at + piece].to_vec() });
            at += piece;
        }
        pos += n;
    }
    if whole {
        let mut after = Vec::new();
        loop {
            let attrs = source.snap.attrs(source.obj, &after, 1024).await?;
            let Some((last, _)) = attrs.last() else { break };
            after = last.clone();
            for (key, value) in attrs {
                ops.push(Op::SetAttr { coll: coll.clone(), name: dst.clone(), key, value });
            }
            if ops.len() > MAX_COPIED_ATTRS {
                return Err(StoreError::new(ErrorKind::Limit, "too many attributes to copy"));
            }
        }
        if source.high_priority {
            ops.push(Op::SetPriority { coll, name: dst, high: true });
        }
    }
    Ok(ops)
}

/// A transaction that creates or removes collections: on the home member, under the gate held exclusively.
async fn commit_catalog<S: Store>(
    pool: &std::sync::Arc<PoolInner<S>>,
    txn: Txn<PoolColl<S::Coll>, PoolStaged<S::Staged>>,
    routes: &[Route],
) -> StoreResult<Outcome> {
    if let Some(i) = routes.iter().position(|r| matches!(r, Route::Write(m) | Route::Check(m) if *m != 0)) {
        return Err(
            invalid("a transaction that changes collections changes objects off the home member".into()).in_op(i)
        );
    }
    if routes.iter().any(|r| matches!(r, Route::Copy { .. })) {
        return Err(invalid("a transaction that changes collections copies between members".into()));
    }
    let _gate = pool.gate.write().await;
    let snap = PoolSnapshot::new(pool.clone());
    let mut created = Vec::new();
    let mut removed = Vec::new();
    for (i, op) in txn.ops.iter().enumerate() {
        match op {
            Op::CreateCollection { name } => created.push(name.clone()),
            Op::RemoveCollection { name } => {
                check_empty_elsewhere(&snap, name).await.map_err(|e| e.in_op(i))?;
                removed.push(name.clone());
            }
            _ => {}
        }
    }
    for name in created.iter().chain(&removed) {
        pool.forget(name);
    }
    let priority = txn.priority;
    let mut handles = Handles::<S>::default();
    let mut ops = Vec::with_capacity(txn.ops.len());
    for (i, op) in txn.ops.into_iter().enumerate() {
        ops.push(match op {
            Op::CreateCollection { name } => Op::CreateCollection { name },
            Op::RemoveCollection { name } => Op::RemoveCollection { name },
            op => handles.member_op(pool, op, 0).await.map_err(|e| e.in_op(i))?,
        });
    }
    let outcome = pool.members[0].commit(Txn { ops, priority }).await?;
    // The catalog has spoken; the other members follow (one that cannot now follows at its first write).
    for m in 1..pool.members.len() {
        for name in &created {
            match pool.members[m].commit(Txn::new().op(Op::CreateCollection { name: name.clone() })).await {
                Ok(_) => {}
                Err(e) if e.kind == ErrorKind::CollectionExists => {}
                Err(e) => {
                    tracing::warn!(member = m, collection = %name, error = %e, "a member missed a new collection")
                }
            }
        }
        for name in &removed {
            match pool.members[m].commit(Txn::new().op(Op::RemoveCollection { name: name.clone() })).await {
                Ok(_) => {}
                Err(e) if e.kind == ErrorKind::CollectionNotFound => {}
                Err(e) => {
                    tracing::warn!(member = m, collection = %name, error = %e, "an empty collection stays on a member")
                }
            }
        }
    }
    for name in created.iter().chain(&removed) {
        pool.forget(name);
    }
    Ok(outcome)
}

/// Fails with `CollectionNotEmpty` when a member other than home holds anything in collection `name`.
async fn check_empty_elsewhere<S: Store>(snap: &PoolSnapshot<S>, name: &str) -> StoreResult<()> {
    for (m, s) in snap.snaps.iter().enumerate().skip(1) {
        let Some(c) = s.collection(name).await? else { continue };
        if !s.list_entries(&c, b"", b"", 1).await?.is_empty() {
            return Err(StoreError::new(
                ErrorKind::CollectionNotEmpty,
                format!("collection {name} holds objects on member {m}"),
            ));
        }
    }
    Ok(())
}
