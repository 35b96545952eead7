//! The store of a cluster (issue 16): every placement group of the cluster map is an erasure set over the
//! drives the map gives it, each drive this node's own or another node's (reached by the object-drive
//! protocol), and the groups together are one pool: an object lives in the group its locator hashes to
//! (`mosaic_cluster::pg_of`, the pool's own placement hash), so any node composes the same store from the
//! same map and serves every object.
//!
//! - `node_drive`: a drive as this node reaches it, local or remote.
//! - `pg_drive`: one group's view of a shared drive (its own collections).
//! - `clear`: a group's old shards removed from a drive it moved off.

pub mod clear;
pub mod node_drive;
pub mod pg_drive;

pub use clear::{Cleared, clear_group};
pub use node_drive::{NodeDrive, NodeSnapshot, NodeStaged};
pub use pg_drive::PgDrive;

use mosaic_cluster::rpc::RpcClient;
use mosaic_cluster::{ClusterMap, DriveId, NodeId};
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry, Settle};
use mosaic_pool::Pool;
use mosaic_remote::RemoteStore;
use mosaic_store::{ErrorKind, StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::Arc;

/// How old an undecided write must be before a group's owner settles it at open: younger ones may still
/// be in flight on another node (clocks of the nodes are assumed within this of each other).
pub const SETTLE_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

/// The groups' sets as one store.
pub type ClusterStore = Pool<ErasureSet<PgDrive<NodeDrive>>>;

/// What the sets of a cluster are made with, beyond the map's geometry.
#[derive(Clone, Debug)]
pub struct ClusterStoreConfig {
    /// The set settings; the geometry is replaced by the map's.
    pub set: SetConfig,
}

/// A store as composed, and the drives that did not answer then (missing members of their sets until the
/// store is composed again).
pub struct Composed {
    pub store: ClusterStore,
    pub unreachable: Vec<DriveId>,
}

/// Composes the cluster's store as node `me` sees it: `local` are its own drives by id; the others are
/// reached with `client`. A drive that does not answer is a missing member of its sets (reads and writes
/// go on with k of n); one that stops answering later fails the calls made to it until it answers again.
pub async fn build(
    map: &ClusterMap,
    me: NodeId,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
    cfg: &ClusterStoreConfig,
) -> StoreResult<Composed> {
    if map.pgs.is_empty() {
        return Err(StoreError::unavailable(format!(
            "the cluster has no placement yet: a {}+{} set needs {} nodes with drives",
            map.data_shards,
            map.parity_shards,
            map.set_width()
        )));
    }
    let geometry = SetGeometry::new(map.data_shards as usize, map.parity_shards as usize)
        .map_err(|e| StoreError::new(ErrorKind::InvalidArgument, e.to_string()))?;
    let set_cfg = SetConfig { geometry, ..cfg.set.clone() };
    let drives = connect_drives(map, me, local, client).await;
    // Drives of nodes marked down or dead are left out on purpose (calls to them would wait for timeouts).
    let unreachable = map
        .drives
        .iter()
        .filter(|(id, d)| !drives.contains_key(id) && !node_is_down(map, d.node))
        .map(|(id, _)| *id)
        .collect();
    let mut sets = Vec::with_capacity(map.pgs.len());
    for (pg, entry) in map.pgs.iter().enumerate() {
        // While a group moves, its data is whole on the set it moves from: serve that one.
        let set = entry.served();
        let members = set
            .iter()
            .enumerate()
            .map(|(slot, d)| drives.get(d).map(|drive| Arc::new(PgDrive::new(drive.clone(), pg as u32, slot))))
            .collect();
        // Every node writes to every group; only the group's owner settles undo logs at open (writes old
        // enough not to be in flight elsewhere) and heals.
        let owner = owner_of(map, set) == Some(me);
        // While it moves, writes must also reach the drives its step keeps (fewer than k are kept only when
        // more than m drives of the set are gone, and then there is nothing to keep).
        let kept_drives = map.kept_slots(entry).filter(|kept| kept.count_ones() >= u32::from(map.data_shards));
        let cfg = SetConfig {
            kept_drives,
            settle_at_open: if owner { Settle::OlderThan(SETTLE_GRACE) } else { Settle::Never },
            heal_in_background: owner && set_cfg.heal_in_background,
            scan_interval: set_cfg.scan_interval.filter(|_| owner),
            ..set_cfg.clone()
        };
        sets.push(Arc::new(ErasureSet::open(cfg, members).await?));
    }
    Ok(Composed { store: Pool::new(sets)?, unreachable })
}

/// The node that owns a group's set: the node of its first drive whose node is in the map and not marked
/// down (a group whose first drive's node stopped or was removed is settled, healed and moved by the next).
pub fn owner_of(map: &ClusterMap, set: &[DriveId]) -> Option<NodeId> {
    set.iter().filter_map(|d| map.drives.get(d)).map(|d| d.node).find(|n| !node_is_down(map, *n))
}

/// Whether the map says a node stopped answering or is gone (its drives are missing members until it is
/// up again, or its groups are rebuilt elsewhere).
fn node_is_down(map: &ClusterMap, node: NodeId) -> bool {
    use mosaic_cluster::NodeState;
    map.nodes.get(&node).is_none_or(|n| matches!(n.state, NodeState::Down | NodeState::Dead))
}

/// Drive `id` of the map as node `me` reaches it (None: not on this node and its node does not answer).
pub async fn connect_drive(
    map: &ClusterMap,
    me: NodeId,
    id: DriveId,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
) -> Option<Arc<NodeDrive>> {
    let drive = map.drives.get(&id)?;
    if drive.node == me {
        return local.get(&id).map(|d| Arc::new(NodeDrive::Local(d.clone())));
    }
    let node = map.nodes.get(&drive.node)?;
    match RemoteStore::connect(client.clone(), &node.address, &drive.name).await {
        Ok(remote) => Some(Arc::new(NodeDrive::Remote(remote))),
        Err(e) => {
            tracing::warn!(drive = id, node = drive.node, error = %e, "a drive of the cluster does not answer");
            None
        }
    }
}

/// Every drive of the map this node can reach (not on a node marked down), by id.
async fn connect_drives(
    map: &ClusterMap,
    me: NodeId,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
) -> HashMap<DriveId, Arc<NodeDrive>> {
    let connects = map
        .drives
        .iter()
        .filter(|(_, d)| d.node == me || !node_is_down(map, d.node))
        .map(|(id, _)| async move { connect_drive(map, me, *id, local, client).await.map(|d| (*id, d)) });
    futures::future::join_all(connects).await.into_iter().flatten().collect()
}
