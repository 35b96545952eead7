//! A drive of the cluster as this node reaches it: its own drive directly, another node's through the
//! object-drive protocol. One type, so that an erasure set may mix both.

use async_trait::async_trait;
use bytes::Bytes;
use mosaic_drive::{DriveSnapshot, DriveStore};
use mosaic_remote::{RemoteSnapshot, RemoteStaged, RemoteStore};
use mosaic_store::{
    AlignedBuf, ErrorKind, Geometry, NameEntry, ObjectInfo, Outcome, PriorityHold, Snapshot, Store, StoreError,
    StoreResult, Txn,
};

pub enum NodeDrive {
    Local(DriveStore),
    Remote(RemoteStore),
}

pub enum NodeStaged {
    Local(mosaic_engine::Staged),
    Remote(RemoteStaged),
}

pub enum NodeSnapshot {
    Local(DriveSnapshot),
    Remote(RemoteSnapshot),
}

impl NodeDrive {
    /// The drive as group `placement.pg`'s commands at shard position `slot` reach it: a remote drive's
    /// commands name the group's placement (its node refuses them once its map places the group
    /// otherwise) and carry capabilities for the group's collections at that position only; a local one
    /// is the same.
    pub fn for_group(&self, placement: mosaic_remote::wire::GroupPlacement, slot: usize) -> NodeDrive {
        match self {
            NodeDrive::Local(d) => NodeDrive::Local(d.clone()),
            NodeDrive::Remote(d) => {
                let scope = crate::pg_drive::prefix(placement.pg, slot);
                NodeDrive::Remote(d.for_group(placement, &scope))
            }
        }
    }
}

fn foreign_units(i: usize) -> StoreError {
    StoreError::new(ErrorKind::InvalidArgument, "units staged on another drive").in_op(i)
}

#[async_trait]
impl Store for NodeDrive {
    type Coll = u32;
    type Obj = u64;
    type Staged = NodeStaged;
    type Snapshot = NodeSnapshot;

    fn geometry(&self) -> Geometry {
        match self {
            NodeDrive::Local(d) => d.geometry(),
            NodeDrive::Remote(d) => d.geometry(),
        }
    }

    fn snapshot(&self) -> NodeSnapshot {
        match self {
            NodeDrive::Local(d) => NodeSnapshot::Local(d.snapshot()),
            NodeDrive::Remote(d) => NodeSnapshot::Remote(d.snapshot()),
        }
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(NodeStaged, AlignedBuf)> {
        Ok(match self {
            NodeDrive::Local(d) => {
                let (s, b) = d.stage(buf, len_bytes, hint).await?;
                (NodeStaged::Local(s), b)
            }
            NodeDrive::Remote(d) => {
                let (s, b) = d.stage(buf, len_bytes, hint).await?;
                (NodeStaged::Remote(s), b)
            }
        })
    }

    async fn commit(&self, txn: Txn<u32, NodeStaged>) -> StoreResult<Outcome> {
        let priority = txn.priority;
        match self {
            NodeDrive::Local(d) => {
                let ops = txn.ops.into_iter().enumerate().map(|(i, op)| {
                    op.try_map(Ok, |s| match s {
                        NodeStaged::Local(s) => Ok(s),
                        NodeStaged::Remote(_) => Err(foreign_units(i)),
                    })
                });
                d.commit(Txn { ops: ops.collect::<StoreResult<_>>()?, priority }).await
            }
            NodeDrive::Remote(d) => {
                let ops = txn.ops.into_iter().enumerate().map(|(i, op)| {
                    op.try_map(Ok, |s| match s {
                        NodeStaged::Remote(s) => Ok(s),
                        NodeStaged::Local(_) => Err(foreign_units(i)),
                    })
                });
                d.commit(Txn { ops: ops.collect::<StoreResult<_>>()?, priority }).await
            }
        }
    }

    fn hold_priority(&self) -> PriorityHold {
        match self {
            NodeDrive::Local(d) => d.hold_priority(),
            NodeDrive::Remote(d) => d.hold_priority(),
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            NodeDrive::Local(d) => d.is_ready(),
            NodeDrive::Remote(d) => d.is_ready(),
        }
    }

    async fn close(&self) -> StoreResult<()> {
        match self {
            NodeDrive::Local(d) => d.close().await,
            NodeDrive::Remote(d) => d.close().await,
        }
    }
}

/// Runs the same snapshot call on whichever kind of snapshot this is.
macro_rules! either {
    ($self:expr, $s:ident => $call:expr) => {
        match $self {
            NodeSnapshot::Local($s) => $call,
            NodeSnapshot::Remote($s) => $call,
        }
    };
}

#[async_trait]
impl Snapshot for NodeSnapshot {
    type Coll = u32;
    type Obj = u64;

    async fn collection(&self, name: &str) -> StoreResult<Option<u32>> {
        either!(self, s => s.collection(name).await)
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, u32)>> {
        either!(self, s => s.collections(prefix, limit).await)
    }

    async fn lookup(&self, coll: &u32, name: &[u8]) -> StoreResult<Option<ObjectInfo<u64>>> {
        either!(self, s => s.lookup(coll, name).await)
    }

    async fn attr(&self, obj: &u64, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        either!(self, s => s.attr(obj, key).await)
    }

    async fn attrs(&self, obj: &u64, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        either!(self, s => s.attrs(obj, start_after, limit).await)
    }

    async fn list_entries(
        &self,
        coll: &u32,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<u64>>> {
        either!(self, s => s.list_entries(coll, prefix, from, limit).await)
    }

    async fn stat_many(&self, objs: &[u64], attr_key: &[u8]) -> StoreResult<Vec<(ObjectInfo<u64>, Option<Vec<u8>>)>> {
        either!(self, s => s.stat_many(objs, attr_key).await)
    }

    async fn read(&self, obj: &u64, offset: u64, len: u64) -> StoreResult<Bytes> {
        either!(self, s => s.read(obj, offset, len).await)
    }

    async fn read_into(&self, obj: &u64, offset: u64, lane: mosaic_store::StripeLane) -> StoreResult<u64> {
        either!(self, s => s.read_into(obj, offset, lane).await)
    }

    fn prioritize(&self) {
        either!(self, s => s.prioritize())
    }
}
