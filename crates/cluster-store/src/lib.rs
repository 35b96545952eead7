//! The store of a cluster (issue 16): every placement group of the cluster map is an erasure set over the
//! drives the map gives it, each drive this node's own or another node's (reached by the object-drive
//! protocol), and the groups together are one pool: an object lives in the group its locator hashes to
//! (`mosaic_cluster::pg_of`, the pool's own placement hash), so any node composes the same store from the
//! same map and serves every object.
//!
//! - `node_drive`: a drive as this node reaches it, local or remote.
//! - `pg_drive`: one group's view of a shared drive (its own collections).
//! - `clear`: a group's old shards removed from a drive it moved off.
//! - `fence`: drive commands planned from a stale map refused by the drive's node.
//! - `step`: a moving group's next set, filled by the rebalancer, and removals followed onto it.

pub mod clear;
pub mod fence;
pub mod node_drive;
pub mod pg_drive;
pub mod step;

pub use clear::{Cleared, clear_group};
pub use fence::{drive_guard, fence_check, fence_of, group_placement};
pub use node_drive::{NodeDrive, NodeSnapshot, NodeStaged};
pub use pg_drive::PgDrive;
pub use step::{
    Fence, FollowCount, FollowCounts, FollowReport, FollowTally, Step, StepFollower, StepSet, arm_step, fill,
    fill_following, nodes_unfollowed, open_step_set,
};

use futures::future::BoxFuture;
use mosaic_cluster::locks::{HeldLocks, LockClient, LockError};
use mosaic_cluster::rpc::RpcClient;
use mosaic_cluster::{ClusterMap, DriveId, NodeId};
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, HeldShared, SetConfig, SetGeometry, Settle, SharedLocks};
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
    /// This node's writes to moving groups, armed and counted for the rebalancers (`arm_step`,
    /// `fill_following`).
    pub follows: Arc<FollowTally>,
}

/// A store as composed, and the drives that did not answer then (missing members of their sets until the
/// store is composed again).
pub struct Composed {
    pub store: ClusterStore,
    pub unreachable: Vec<DriveId>,
    /// The groups whose sets were opened anew; the others' were taken over from the previous store.
    pub opened: Vec<usize>,
}

/// The store a node composed from an earlier map: a new composition takes over each group's set whose
/// composition is the same (`GroupKey`) and that has every drive, instead of opening it again (a move's
/// step changes one group; opening all of them on every node at every step cost the foreground its CPU).
pub struct Previous<'a> {
    pub map: &'a ClusterMap,
    pub store: &'a ClusterStore,
}

/// Everything a group's set is opened from: its served drives (with each one's node, name, address and
/// node state), the slots its step keeps, its step, and whether this node owns it.
#[derive(PartialEq, Eq)]
struct GroupKey<'a> {
    drives: Vec<(DriveId, Option<DrivePlace<'a>>)>,
    kept: Option<u16>,
    step: Option<Step>,
    /// Whether every node of the step's drives is up (a follower does not ask drives of nodes marked down,
    /// so a change opens the set and its follower anew).
    step_up: bool,
    owner: bool,
}

/// Where a drive is: its node, its name there, the node's address and state.
type DrivePlace<'a> = (NodeId, &'a str, &'a str, mosaic_cluster::NodeState);

fn group_key<'a>(map: &'a ClusterMap, pg: usize, me: NodeId) -> GroupKey<'a> {
    let entry = &map.pgs[pg];
    let drives = entry
        .served()
        .iter()
        .map(|id| {
            let place = map
                .drives
                .get(id)
                .and_then(|d| map.nodes.get(&d.node).map(|n| (d.node, d.name.as_str(), n.address.as_str(), n.state)));
            (*id, place)
        })
        .collect();
    let step = Step::of(map, pg);
    GroupKey {
        drives,
        kept: kept_drives(map, entry),
        step_up: step.as_ref().is_some_and(|s| step_is_up(map, s)),
        step,
        owner: owner_of(map, entry.served()) == Some(me),
    }
}

/// The slots a moving group's writes must reach (`SetConfig::kept_drives`): fewer than k are kept only when
/// more than m drives of the set are gone, and then there is nothing to keep.
fn kept_drives(map: &ClusterMap, entry: &mosaic_cluster::PgEntry) -> Option<u16> {
    map.kept_slots(entry).filter(|kept| kept.count_ones() >= u32::from(map.data_shards))
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
    previous: Option<Previous<'_>>,
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
    // With k = m a write made after a step's last fill round is on only k drives of the set the step
    // serves (the kept ones), so the k drives a lookup's fast path asks may all miss it.
    let set_cfg = SetConfig { geometry, read_fast_path: geometry.data > geometry.parity, ..cfg.set.clone() };
    let previous = previous.filter(|p| {
        p.map.pgs.len() == map.pgs.len()
            && (p.map.data_shards, p.map.parity_shards) == (map.data_shards, map.parity_shards)
    });
    let taken_over: Vec<Option<Arc<ErasureSet<PgDrive<NodeDrive>>>>> = (0..map.pgs.len())
        .map(|pg| {
            let prev = previous.as_ref()?;
            let set = &prev.store.members()[pg];
            let whole = set.members().iter().all(Option::is_some);
            (whole && group_key(prev.map, pg, me) == group_key(map, pg, me)).then(|| set.clone())
        })
        .collect();
    // Only the drives of the sets opened anew are connected.
    let needed: std::collections::BTreeSet<DriveId> = (0..map.pgs.len())
        .filter(|pg| taken_over[*pg].is_none())
        .flat_map(|pg| map.pgs[pg].served().iter().copied())
        .collect();
    let drives = connect_drives(map, me, local, client, &needed).await;
    // Drives of nodes marked down or dead are left out on purpose (calls to them would wait for timeouts).
    let unreachable = needed
        .iter()
        .filter(|id| !drives.contains_key(id) && map.drives.get(id).is_some_and(|d| !node_is_down(map, d.node)))
        .copied()
        .collect();
    let mut sets = Vec::with_capacity(map.pgs.len());
    let mut opened = Vec::new();
    // What the removal followers of moving groups reach their next sets with (made once, if any moves).
    let mut follow_map: Option<Arc<ClusterMap>> = None;
    let mut follow_local: Option<Arc<HashMap<DriveId, DriveStore>>> = None;
    for (pg, (entry, taken)) in map.pgs.iter().zip(taken_over).enumerate() {
        if let Some(set) = taken {
            sets.push(set);
            continue;
        }
        // While a group moves, its data is whole on the set it moves from: serve that one.
        let set = entry.served();
        let placement = group_placement(map, pg);
        let members = set
            .iter()
            .enumerate()
            .map(|(slot, d)| {
                let drive = Arc::new(drives.get(d)?.for_group(placement.clone(), slot));
                Some(Arc::new(PgDrive::new(drive, pg as u32, slot)))
            })
            .collect();
        // Every node writes to every group; only the group's owner settles undo logs at open (writes old
        // enough not to be in flight elsewhere) and heals.
        let owner = owner_of(map, set) == Some(me);
        // Once a moving group's step is armed (`FollowTally::arm`), its writes are under the kept drives'
        // rule and its removals are followed onto its next set (`step`) when the step keeps k drives: onto
        // the new drives that answer, counted when some do not. When it keeps none (a node of the set is
        // down), they are counted, and the step starts again.
        let kept = kept_drives(map, entry);
        let removal_follower = Step::of(map, pg).map(|step| {
            let map = follow_map.get_or_insert_with(|| Arc::new(map.clone())).clone();
            let local = follow_local.get_or_insert_with(|| Arc::new(local.clone())).clone();
            let tally = cfg.follows.clone();
            let follower = StepFollower::new(map, me, step, local, client.clone(), set_cfg.clone(), tally);
            let follower = if kept.is_some() { follower } else { follower.counting_only() };
            Arc::new(follower) as Arc<dyn mosaic_erasure::RemovalFollower>
        });
        let cfg = SetConfig {
            kept_drives: kept,
            removal_follower,
            settle_at_open: if owner { Settle::OlderThan(SETTLE_GRACE) } else { Settle::Never },
            heal_in_background: owner && set_cfg.heal_in_background,
            scan_interval: set_cfg.scan_interval.filter(|_| owner),
            ..set_cfg.clone()
        };
        sets.push(Arc::new(ErasureSet::open(cfg, members).await?));
        opened.push(pg);
    }
    let store = Pool::new(sets)?;
    // The groups taken over keep the collection handles the previous store found on them.
    if let Some(p) = previous {
        store.take_collections_from(p.store).await;
    }
    Ok(Composed { store, unreachable, opened })
}

/// The cluster's object locks (`mosaic_cluster::locks`) as the shared locks of the groups' sets: every
/// node writes to every group, and its sets' own locks order only its own writes.
pub struct NodeLocks(pub Arc<LockClient>);

impl SharedLocks for NodeLocks {
    fn lock(&self, keys: Vec<u64>) -> BoxFuture<'_, StoreResult<Box<dyn HeldShared>>> {
        Box::pin(async move {
            let held = self.0.acquire(keys).await.map_err(lock_error)?;
            Ok(Box::new(NodeHeld(held)) as Box<dyn HeldShared>)
        })
    }
}

struct NodeHeld(HeldLocks);

impl HeldShared for NodeHeld {
    fn holds(&self) -> bool {
        self.0.holds()
    }

    fn renew(&mut self) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async move { self.0.renew().await.map_err(lock_error) })
    }
}

fn lock_error(e: LockError) -> StoreError {
    match e {
        LockError::TooMany => StoreError::new(ErrorKind::InvalidArgument, e.to_string()),
        LockError::Busy | LockError::NoMembers => StoreError::unavailable(e.to_string()),
    }
}

/// The node that owns a group's set: the node of its first drive whose node is in the map and not marked
/// down (a group whose first drive's node stopped or was removed is settled, healed and moved by the next).
pub fn owner_of(map: &ClusterMap, set: &[DriveId]) -> Option<NodeId> {
    set.iter().filter_map(|d| map.drives.get(d)).map(|d| d.node).find(|n| !node_is_down(map, *n))
}

/// Whether every drive of `step` is on a node that is up (a node marked down would only make every
/// followed removal wait for its timeout; the fill waits for it anyway).
fn step_is_up(map: &ClusterMap, step: &Step) -> bool {
    step.target.iter().all(|id| map.drives.get(id).is_some_and(|d| !node_is_down(map, d.node)))
}

/// Whether the map says a node stopped answering or is gone (its drives are missing members until it is
/// up again, or its groups are rebuilt elsewhere).
fn node_is_down(map: &ClusterMap, node: NodeId) -> bool {
    use mosaic_cluster::NodeState;
    map.nodes.get(&node).is_none_or(|n| matches!(n.state, NodeState::Down | NodeState::Dead))
}

/// Drive `id` of the map as node `me` reaches it (None: not on this node and its node does not answer).
/// Its commands carry `map`'s fence (`NodeDrive::for_group` adds a group's placement).
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
    match RemoteStore::connect(client.clone(), &node.address, &drive.name, Some(fence_of(map, me))).await {
        Ok(remote) => Some(Arc::new(NodeDrive::Remote(remote))),
        Err(e) => {
            tracing::warn!(drive = id, node = drive.node, error = %e, "a drive of the cluster does not answer");
            None
        }
    }
}

/// The drives `ids` of the map that this node can reach (not on a node marked down), by id.
async fn connect_drives(
    map: &ClusterMap,
    me: NodeId,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
    ids: &std::collections::BTreeSet<DriveId>,
) -> HashMap<DriveId, Arc<NodeDrive>> {
    let connects = map
        .drives
        .iter()
        .filter(|(id, _)| ids.contains(id))
        .filter(|(_, d)| d.node == me || !node_is_down(map, d.node))
        .map(|(id, _)| async move { connect_drive(map, me, *id, local, client).await.map(|d| (*id, d)) });
    futures::future::join_all(connects).await.into_iter().flatten().collect()
}
