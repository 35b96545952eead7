//! Clearing a placement group off a drive it left: after a move is done, the drives the group no longer
//! uses at a position still hold that position's old shards (whole collections `pgNNNNN.S/...`). They are removed in the background
//! class, in bounded transactions, so that foreground work on the drive goes first.

use crate::pg_drive::PgDrive;
use mosaic_store::{ErrorKind, Op, Priority, Snapshot, Store, StoreResult, Txn};
use std::sync::Arc;

/// Names removed per transaction.
const CLEAR_BATCH: usize = 256;
/// Collections of one group cleared at most (a group has one per bucket, plus the set's own).
const MAX_GROUP_COLLECTIONS: usize = 1 << 20;

/// What clearing a group off a drive removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleared {
    pub collections: u64,
    pub objects: u64,
}

/// Removes every collection of group `pg` at shard position `slot` from `drive`, with everything in it.
/// `still_away` is asked
/// before each transaction: when it says no (the group came back to this drive in a newer map), clearing
/// stops where it is (heal refills what is gone).
pub async fn clear_group<S: Store>(
    drive: Arc<S>,
    pg: u32,
    slot: usize,
    still_away: impl Fn() -> bool,
) -> StoreResult<Cleared> {
    let view = PgDrive::new(drive, pg, slot);
    let mut cleared = Cleared::default();
    let collections = view.snapshot().collections("", MAX_GROUP_COLLECTIONS).await?;
    for (name, coll) in collections {
        loop {
            let page = view.snapshot().list_entries(&coll, b"", b"", CLEAR_BATCH).await?;
            if page.is_empty() {
                break;
            }
            debug_assert!(page.len() <= CLEAR_BATCH);
            if !still_away() {
                return Ok(cleared);
            }
            let mut txn = Txn::new().with_priority(Priority::Background);
            for e in &page {
                txn = txn.op(Op::Remove { coll: coll.clone(), name: e.name.clone() });
            }
            view.commit(txn).await?;
            cleared.objects += page.len() as u64;
        }
        if !still_away() {
            return Ok(cleared);
        }
        let txn = Txn::new().with_priority(Priority::Background).op(Op::RemoveCollection { name: name.clone() });
        match view.commit(txn).await {
            Ok(_) => cleared.collections += 1,
            // Removed meanwhile by another clearing of the same group.
            Err(e) if e.kind == ErrorKind::NotFound || e.kind == ErrorKind::CollectionNotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(cleared)
}
