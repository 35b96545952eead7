//! One placement group's view of a drive at one shard position of the group's set. A drive holds shards
//! of many groups; each group's erasure set sees only its own collections on it, at the position the
//! drive has in the set: collection `c` of group 7 at position 2 is the drive's collection `pg00007.2/c`.
//! The position is part of the name because a shard is only valid at its position: a drive that leaves a
//! group and comes back at another position (placement changes while a group moves) finds nothing there
//! and is filled by heal, instead of serving its old position's shards as the new one's. Objects,
//! attributes and staged units are the drive's own (collections keep groups apart), and the drive belongs
//! to the node, so closing one group's view leaves the drive open.

use async_trait::async_trait;
use bytes::Bytes;
use mosaic_store::{
    AlignedBuf, Geometry, NameEntry, ObjectInfo, Op, Outcome, PriorityHold, Snapshot, Store, StoreResult, StripeLane,
    Txn,
};
use std::sync::Arc;

/// The drive collection that holds collection `name` of group `pg` at shard position `slot`.
pub fn collection_name(pg: u32, slot: usize, name: &str) -> String {
    format!("{}{name}", prefix(pg, slot))
}

/// The prefix of every drive collection of group `pg` at shard position `slot`: the scope of the
/// capabilities its commands carry.
pub fn prefix(pg: u32, slot: usize) -> String {
    format!("pg{pg:05}.{slot}/")
}

pub struct PgDrive<S: Store> {
    drive: Arc<S>,
    prefix: String,
}

impl<S: Store> PgDrive<S> {
    pub fn new(drive: Arc<S>, pg: u32, slot: usize) -> Self {
        PgDrive { drive, prefix: prefix(pg, slot) }
    }

    pub fn drive(&self) -> &Arc<S> {
        &self.drive
    }
}

#[async_trait]
impl<S: Store> Store for PgDrive<S> {
    type Coll = S::Coll;
    type Obj = S::Obj;
    type Staged = S::Staged;
    type Snapshot = PgSnapshot<S::Snapshot>;

    fn geometry(&self) -> Geometry {
        self.drive.geometry()
    }

    fn snapshot(&self) -> Self::Snapshot {
        PgSnapshot { inner: self.drive.snapshot(), prefix: self.prefix.clone() }
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(S::Staged, AlignedBuf)> {
        self.drive.stage(buf, len_bytes, hint).await
    }

    async fn commit(&self, mut txn: Txn<S::Coll, S::Staged>) -> StoreResult<Outcome> {
        for op in &mut txn.ops {
            if let Op::CreateCollection { name } | Op::RemoveCollection { name } = op {
                name.insert_str(0, &self.prefix);
            }
        }
        self.drive.commit(txn).await
    }

    fn hold_priority(&self) -> PriorityHold {
        self.drive.hold_priority()
    }

    fn is_ready(&self) -> bool {
        self.drive.is_ready()
    }

    async fn close(&self) -> StoreResult<()> {
        Ok(())
    }
}

pub struct PgSnapshot<Sn> {
    inner: Sn,
    prefix: String,
}

#[async_trait]
impl<Sn: Snapshot> Snapshot for PgSnapshot<Sn> {
    type Coll = Sn::Coll;
    type Obj = Sn::Obj;

    async fn collection(&self, name: &str) -> StoreResult<Option<Sn::Coll>> {
        self.inner.collection(&format!("{}{name}", self.prefix)).await
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, Sn::Coll)>> {
        let found = self.inner.collections(&format!("{}{prefix}", self.prefix), limit).await?;
        Ok(found
            .into_iter()
            .map(|(name, c)| {
                debug_assert!(name.starts_with(&self.prefix));
                (name[self.prefix.len()..].to_string(), c)
            })
            .collect())
    }

    async fn lookup(&self, coll: &Sn::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<Sn::Obj>>> {
        self.inner.lookup(coll, name).await
    }

    async fn attr(&self, obj: &Sn::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.inner.attr(obj, key).await
    }

    async fn attrs(&self, obj: &Sn::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.attrs(obj, start_after, limit).await
    }

    async fn list_entries(
        &self,
        coll: &Sn::Coll,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<Sn::Obj>>> {
        self.inner.list_entries(coll, prefix, from, limit).await
    }

    async fn stat_many(
        &self,
        objs: &[Sn::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<Sn::Obj>, Option<Vec<u8>>)>> {
        self.inner.stat_many(objs, attr_key).await
    }

    async fn read(&self, obj: &Sn::Obj, offset: u64, len: u64) -> StoreResult<Bytes> {
        self.inner.read(obj, offset, len).await
    }

    async fn read_into(&self, obj: &Sn::Obj, offset: u64, lane: StripeLane) -> StoreResult<u64> {
        self.inner.read_into(obj, offset, lane).await
    }

    fn prioritize(&self) {
        self.inner.prioritize()
    }
}
