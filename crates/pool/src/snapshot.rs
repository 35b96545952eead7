//! Reading a pool: each object on its member, listings merged from every member's ordered names (each
//! member lists at most the page; the merge keeps the page's first entries), collections from the home
//! member's catalog with their handles on the others.

use crate::{Handle, PoolColl, PoolInner};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::join_all;
use mosaic_store::{NameEntry, ObjectInfo, Snapshot, Store, StoreResult};
use std::sync::Arc;

/// An object of a pool: the member it lives on and that member's handle, with the member's snapshot it was
/// found in when that is not the pool snapshot's own (a lookup during a move asks the member again).
pub struct PoolObj<O, Sn> {
    pub(crate) member: usize,
    pub(crate) obj: O,
    pub(crate) snap: Option<Arc<Sn>>,
}

impl<O: Clone, Sn> Clone for PoolObj<O, Sn> {
    fn clone(&self) -> Self {
        PoolObj { member: self.member, obj: self.obj.clone(), snap: self.snap.clone() }
    }
}

impl<O: std::fmt::Debug, Sn> std::fmt::Debug for PoolObj<O, Sn> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolObj").field("member", &self.member).field("obj", &self.obj).finish()
    }
}

/// An object of pool `S`.
pub(crate) type ObjOf<S> = PoolObj<<S as Store>::Obj, <S as Store>::Snapshot>;

/// A snapshot of every member (each consistent in itself; a pool has no instant across members, as no
/// transaction spans them).
pub struct PoolSnapshot<S: Store> {
    pub(crate) pool: Arc<PoolInner<S>>,
    pub(crate) snaps: Vec<S::Snapshot>,
}

impl<S: Store> PoolSnapshot<S> {
    pub(crate) fn new(pool: Arc<PoolInner<S>>) -> Self {
        let snaps = pool.members.iter().map(|m| m.snapshot()).collect();
        PoolSnapshot { pool, snaps }
    }

    /// The collection on every member, as the home member's catalog says (None: it has no such collection).
    pub(crate) async fn resolve(&self, name: &str) -> StoreResult<Option<PoolColl<S::Coll>>> {
        if let Some(c) = self.pool.cached(name) {
            return Ok(Some(c));
        }
        let Some(home) = self.snaps[0].collection(name).await? else { return Ok(None) };
        let others = join_all(self.snaps[1..].iter().map(|s| s.collection(name))).await;
        let mut members = vec![Handle::Present(home)];
        members.extend(others.into_iter().map(|r| match r {
            Ok(Some(c)) => Handle::Present(c),
            Ok(None) => Handle::Absent,
            Err(e) => Handle::Unreachable(e),
        }));
        let coll = PoolColl { name: name.into(), members: members.into() };
        if coll.members.iter().all(|h| !matches!(h, Handle::Unreachable(_))) {
            self.pool.remember(&coll);
        }
        Ok(Some(coll))
    }

    /// The handle of `coll` on `member`: None where the collection is not there yet (nothing of it is).
    fn handle(coll: &PoolColl<S::Coll>, member: usize) -> StoreResult<Option<&S::Coll>> {
        match &coll.members[member] {
            Handle::Present(c) => Ok(Some(c)),
            Handle::Absent => Ok(None),
            Handle::Unreachable(e) => Err(e.clone()),
        }
    }

    fn wrap(member: usize, info: ObjectInfo<S::Obj>, snap: Option<Arc<S::Snapshot>>) -> ObjectInfo<ObjOf<S>> {
        let ObjectInfo { obj, size_bytes, mtime_ns, high_priority } = info;
        ObjectInfo { obj: PoolObj { member, obj, snap }, size_bytes, mtime_ns, high_priority }
    }

    /// The member snapshot to read `obj` through.
    pub(crate) fn member_snap<'a>(&'a self, obj: &'a ObjOf<S>) -> &'a S::Snapshot {
        obj.snap.as_deref().unwrap_or(&self.snaps[obj.member])
    }

    /// `name` on `member`, through this snapshot's view of it.
    async fn lookup_on(
        &self,
        coll: &PoolColl<S::Coll>,
        member: usize,
        name: &[u8],
    ) -> StoreResult<Option<ObjectInfo<ObjOf<S>>>> {
        let Some(c) = Self::handle(coll, member)? else { return Ok(None) };
        Ok(self.snaps[member].lookup(c, name).await?.map(|info| Self::wrap(member, info, None)))
    }

    /// `name` on `member` through a fresh snapshot of it (the object keeps that snapshot).
    async fn lookup_fresh(
        &self,
        coll: &PoolColl<S::Coll>,
        member: usize,
        name: &[u8],
    ) -> StoreResult<Option<ObjectInfo<ObjOf<S>>>> {
        let snap = Arc::new(self.pool.members[member].snapshot());
        let c = match Self::handle(coll, member)? {
            Some(c) => c.clone(),
            None => match snap.collection(&coll.name).await? {
                Some(c) => c,
                None => return Ok(None),
            },
        };
        Ok(snap.lookup(&c, name).await?.map(|info| Self::wrap(member, info, Some(snap.clone()))))
    }
}

#[async_trait]
impl<S: Store> Snapshot for PoolSnapshot<S> {
    type Coll = PoolColl<S::Coll>;
    type Obj = ObjOf<S>;

    async fn collection(&self, name: &str) -> StoreResult<Option<Self::Coll>> {
        self.resolve(name).await
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, Self::Coll)>> {
        let mut out = Vec::new();
        for (name, _) in self.snaps[0].collections(prefix, limit).await? {
            if let Some(c) = self.resolve(&name).await? {
                out.push((name, c));
            }
        }
        Ok(out)
    }

    /// While the object's scope moves: its new member, else its old one, else its new one afresh (a move
    /// copies before it removes, so an object that left the old member between the first two asks is on
    /// the new one by the third).
    async fn lookup(&self, coll: &Self::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<Self::Obj>>> {
        let placed = self.pool.placement().place(&coll.name, name);
        let found = self.lookup_on(coll, placed.now, name).await?;
        let Some(before) = placed.before else { return Ok(found) };
        if found.is_some() {
            return Ok(found);
        }
        if let Some(info) = self.lookup_on(coll, before, name).await? {
            return Ok(Some(info));
        }
        self.lookup_fresh(coll, placed.now, name).await
    }

    async fn attr(&self, obj: &Self::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.member_snap(obj).attr(&obj.obj, key).await
    }

    async fn attrs(&self, obj: &Self::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.member_snap(obj).attrs(&obj.obj, start_after, limit).await
    }

    async fn list_entries(
        &self,
        coll: &Self::Coll,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<Self::Obj>>> {
        let lists = join_all(self.snaps.iter().enumerate().map(|(m, snap)| async move {
            match Self::handle(coll, m)? {
                Some(c) => snap.list_entries(c, prefix, from, limit).await,
                None => Ok(Vec::new()),
            }
        }))
        .await;
        let mut merged = Vec::new();
        for (member, list) in lists.into_iter().enumerate() {
            merged.extend(list?.into_iter().map(|e| NameEntry {
                name: e.name,
                obj: PoolObj { member, obj: e.obj, snap: None },
                tag: e.tag,
            }));
        }
        merged.sort_unstable_by(|a, b| a.name.cmp(&b.name).then(a.obj.member.cmp(&b.obj.member)));
        // A name lives on one member, but while its scope moves it is on two for a moment (copied, not yet
        // removed; the same version): the one on the member it moves to is kept. The first `limit` distinct
        // names are still exact: each member listed its first `limit`.
        if merged.windows(2).any(|w| w[0].name == w[1].name) {
            let placement = self.pool.placement();
            merged.dedup_by(|later, kept| {
                if later.name != kept.name {
                    return false;
                }
                if placement.place(&coll.name, &later.name).now == later.obj.member {
                    std::mem::swap(later, kept);
                }
                true
            });
        }
        merged.truncate(limit);
        debug_assert!(merged.windows(2).all(|w| w[0].name < w[1].name), "a name listed twice");
        Ok(merged)
    }

    async fn stat_many(
        &self,
        objs: &[Self::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<Self::Obj>, Option<Vec<u8>>)>> {
        // One batch per member, answers put back in the order asked.
        let mut by_member: Vec<Vec<(usize, S::Obj)>> = vec![Vec::new(); self.snaps.len()];
        let mut out: Vec<Option<(ObjectInfo<Self::Obj>, Option<Vec<u8>>)>> = vec![None; objs.len()];
        for (i, o) in objs.iter().enumerate() {
            match &o.snap {
                None => by_member[o.member].push((i, o.obj.clone())),
                // Found through a snapshot of its own: asked alone (rare: a lookup during a move).
                Some(snap) => {
                    let mut answer = snap.stat_many(std::slice::from_ref(&o.obj), attr_key).await?;
                    let (info, attr) = answer.pop().ok_or_else(|| {
                        mosaic_store::StoreError::internal(format!("member {} answered no stat", o.member))
                    })?;
                    out[i] = Some((Self::wrap(o.member, info, Some(snap.clone())), attr));
                }
            }
        }
        let batches = join_all(by_member.iter().enumerate().map(|(m, batch)| async move {
            if batch.is_empty() {
                return Ok(Vec::new());
            }
            let objs: Vec<S::Obj> = batch.iter().map(|(_, o)| o.clone()).collect();
            self.snaps[m].stat_many(&objs, attr_key).await
        }))
        .await;
        for (m, (batch, answers)) in by_member.iter().zip(batches).enumerate() {
            let answers = answers?;
            if answers.len() != batch.len() {
                return Err(mosaic_store::StoreError::internal(format!(
                    "member {m} answered {} of {} stats",
                    answers.len(),
                    batch.len()
                )));
            }
            for ((i, _), (info, attr)) in batch.iter().zip(answers) {
                out[*i] = Some((Self::wrap(m, info, None), attr));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    async fn read(&self, obj: &Self::Obj, offset: u64, len: u64) -> StoreResult<Bytes> {
        self.member_snap(obj).read(&obj.obj, offset, len).await
    }

    fn prioritize(&self) {
        for s in &self.snaps {
            s.prioritize();
        }
    }
}
