//! Reading a pool: each object on its member, listings merged from every member's ordered names (each
//! member lists at most the page; the merge keeps the page's first entries), collections from the home
//! member's catalog with their handles on the others.

use crate::{Handle, PoolColl, PoolInner, member_of};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::join_all;
use mosaic_store::{NameEntry, ObjectInfo, Snapshot, Store, StoreResult, locator};
use std::sync::Arc;

/// An object of a pool: the member it lives on and that member's handle.
#[derive(Clone, Debug)]
pub struct PoolObj<O> {
    pub(crate) member: usize,
    pub(crate) obj: O,
}

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

    fn wrap(member: usize, info: ObjectInfo<S::Obj>) -> ObjectInfo<PoolObj<S::Obj>> {
        let ObjectInfo { obj, size_bytes, mtime_ns, high_priority } = info;
        ObjectInfo { obj: PoolObj { member, obj }, size_bytes, mtime_ns, high_priority }
    }
}

#[async_trait]
impl<S: Store> Snapshot for PoolSnapshot<S> {
    type Coll = PoolColl<S::Coll>;
    type Obj = PoolObj<S::Obj>;

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

    async fn lookup(&self, coll: &Self::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<Self::Obj>>> {
        let member = member_of(locator(name), self.snaps.len());
        let Some(c) = Self::handle(coll, member)? else { return Ok(None) };
        Ok(self.snaps[member].lookup(c, name).await?.map(|info| Self::wrap(member, info)))
    }

    async fn attr(&self, obj: &Self::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.snaps[obj.member].attr(&obj.obj, key).await
    }

    async fn attrs(&self, obj: &Self::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.snaps[obj.member].attrs(&obj.obj, start_after, limit).await
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
                obj: PoolObj { member, obj: e.obj },
                tag: e.tag,
            }));
        }
        // A name lives on one member only, so the merge has no duplicates to settle.
        merged.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        merged.truncate(limit);
        debug_assert!(merged.windows(2).all(|w| w[0].name < w[1].name), "a name listed by two members");
        Ok(merged)
    }

    async fn stat_many(
        &self,
        objs: &[Self::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<Self::Obj>, Option<Vec<u8>>)>> {
        // One batch per member, answers put back in the order asked.
        let mut by_member: Vec<Vec<(usize, S::Obj)>> = vec![Vec::new(); self.snaps.len()];
        for (i, o) in objs.iter().enumerate() {
            by_member[o.member].push((i, o.obj.clone()));
        }
        let batches = join_all(by_member.iter().enumerate().map(|(m, batch)| async move {
            if batch.is_empty() {
                return Ok(Vec::new());
            }
            let objs: Vec<S::Obj> = batch.iter().map(|(_, o)| o.clone()).collect();
            self.snaps[m].stat_many(&objs, attr_key).await
        }))
        .await;
        let mut out: Vec<Option<(ObjectInfo<Self::Obj>, Option<Vec<u8>>)>> = vec![None; objs.len()];
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
                out[*i] = Some((Self::wrap(m, info), attr));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    async fn read(&self, obj: &Self::Obj, offset: u64, len: u64) -> StoreResult<Bytes> {
        self.snaps[obj.member].read(&obj.obj, offset, len).await
    }

    fn prioritize(&self) {
        for s in &self.snaps {
            s.prioritize();
        }
    }
}
