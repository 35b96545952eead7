//! The cluster's rule for drive commands planned from a stale view (issue 16: a request carrying an older
//! epoch is refused, never served from a stale placement). Every remote drive command carries the caller's
//! fence (`mosaic_remote::wire::Fence`); the drive's node checks it against its own map. Refused, when the
//! drive's node knows a newer map than the caller:
//! - a command from a node that map marks down or dead, or does not have: the rebalancer does not wait for
//!   such a node to serve a new placement before it fills a step, so what it writes could miss the step;
//! - a placement group's command planned before the group's last two changes of placement (served set,
//!   slots the step keeps; `PgEntry::changed_at`, `changed_before`), or whose placement differs from the
//!   map's otherwise: it reads or writes a set the group is no longer served from. One change behind is
//!   served on purpose: a node that is up serves each new
//!   placement within moments, and the rebalancer fills no step until every node that is up serves the
//!   placement before it (and its calls on the older store are done), so writes planned one change
//!   behind are kept by the step's kept drives; refusing them would fail the foreground at every step.
//!
//! A refusal is `Unavailable` (503 to S3 clients, which retry) and says both epochs.

use mosaic_cluster::capability::CapabilityKey;
use mosaic_cluster::rpc::Secret;
use mosaic_cluster::{ClusterMap, NodeId, NodeState};
use mosaic_remote::server::{FenceCheck, Guard};
use mosaic_remote::wire::{Fence, GroupPlacement};
use mosaic_store::{StoreError, StoreResult};
use std::sync::Arc;
use tokio::sync::watch;

/// The fence of node `me`'s commands planned from `map` (no group yet: `group_placement` adds it).
pub fn fence_of(map: &ClusterMap, me: NodeId) -> Fence {
    Fence { node: me, epoch: map.epoch, placement_epoch: map.placement_epoch, group: None }
}

/// Group `pg`'s placement as `map` has it.
pub fn group_placement(map: &ClusterMap, pg: usize) -> GroupPlacement {
    debug_assert!(pg < map.pgs.len(), "group {pg} of {}", map.pgs.len());
    let entry = &map.pgs[pg];
    GroupPlacement { pg: pg as u32, served: entry.served().to_vec(), kept: map.kept_slots(entry) }
}

/// Whether a command fenced with `fence` may be served by a node whose map is `map`.
pub fn check(map: &ClusterMap, fence: &Fence) -> StoreResult<()> {
    // A caller with a newer map knows more than this node does: nothing here can judge it stale.
    if fence.epoch >= map.epoch {
        return Ok(());
    }
    let stale = |why: String| {
        StoreError::unavailable(format!(
            "stale cluster map: {why} (the caller planned at epoch {}, this node serves epoch {}); retry once \
             the caller follows the newer map",
            fence.epoch, map.epoch
        ))
    };
    match map.nodes.get(&fence.node).map(|n| n.state) {
        Some(NodeState::Up | NodeState::Draining) => {}
        Some(state) => return Err(stale(format!("node {} is marked {state:?}", fence.node))),
        None => return Err(stale(format!("node {} is not in the cluster", fence.node))),
    }
    let Some(group) = &fence.group else { return Ok(()) };
    let Some(entry) = map.pgs.get(group.pg as usize) else {
        return Err(stale(format!("no placement group {}", group.pg)));
    };
    // Planned after the change before the last: the placement it has is the one the last change replaced.
    let one_behind = fence.placement_epoch >= entry.changed_before && fence.placement_epoch < entry.changed_at;
    // The group's placement now, however old the plan (a set taken over keeps the fence it was opened with).
    let (served, kept) = (entry.served(), map.kept_slots(entry));
    if one_behind || (group.served == served && group.kept == kept) {
        return Ok(());
    }
    Err(stale(format!(
        "placement group {} is served from drives {served:?} (kept slots {kept:?}) since epoch {}, not {:?} \
         (kept {:?})",
        group.pg, entry.changed_at, group.served, group.kept
    )))
}

/// The fence check of a node whose map is the latest `maps` holds.
pub fn fence_check(maps: watch::Receiver<Arc<ClusterMap>>) -> FenceCheck {
    Arc::new(move |fence: &Fence| check(&maps.borrow(), fence))
}

/// What the drive server of a node whose map is the latest `maps` holds checks each command against: its
/// fence, and its capability, signed with the key of the cluster whose secret is `secret`.
pub fn drive_guard(maps: watch::Receiver<Arc<ClusterMap>>, secret: &Secret) -> Guard {
    Guard { fence: fence_check(maps), capabilities: CapabilityKey::of(secret) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_cluster::{Change, FailureDomain};

    fn map_of(nodes: u64) -> ClusterMap {
        let mut map = ClusterMap::empty();
        let bootstrap = Change::Bootstrap {
            cluster_id: "t".into(),
            data_shards: 2,
            parity_shards: 1,
            pg_count: 16,
            failure_domain: FailureDomain::Node,
            placement: mosaic_cluster::placement::PLACEMENT_LATEST,
        };
        map.apply(&bootstrap).unwrap();
        for node in 0..nodes {
            add_node(&mut map, node);
        }
        map
    }

    fn add_node(map: &mut ClusterMap, node: u64) {
        let address = format!("127.0.0.1:{}", 1000 + node);
        let changes = vec![
            Change::AddNode { node, address: address.clone(), s3_address: address, zone: "z".into() },
            Change::AddDrive { node, name: "d0".into(), weight: 100 },
        ];
        map.apply(&Change::Batch(changes)).unwrap();
    }

    /// `before` with a fourth node added and the first step of one of the groups that move done: the map,
    /// the map between the two, and that group.
    fn a_step_done(before: &ClusterMap) -> (ClusterMap, ClusterMap, usize) {
        let mut between = before.clone();
        add_node(&mut between, 3);
        let moved = (0..16).find(|pg| between.pgs[*pg].from.is_some()).expect("a group moves");
        let mut map = between.clone();
        let target = map.step_target(&map.pgs[moved]);
        map.apply(&Change::MoveDone { pg: moved as u32, set: target }).unwrap();
        (map, between, moved)
    }

    fn group_fence(map: &ClusterMap, me: NodeId, pg: usize) -> Fence {
        Fence { group: Some(group_placement(map, pg)), ..fence_of(map, me) }
    }

    #[test]
    fn the_same_map_and_a_newer_one_are_served() {
        let map = map_of(3);
        assert!(check(&map, &group_fence(&map, 0, 5)).is_ok());
        let mut newer = map.clone();
        add_node(&mut newer, 3);
        // This node is behind the caller: served, whatever the caller's placement.
        assert!(check(&map, &group_fence(&newer, 3, 5)).is_ok());
    }

    #[test]
    fn a_changed_group_and_a_node_marked_down_are_refused() {
        let old = map_of(3);
        // Its first step done: the old map is two changes behind on the group.
        let (mut map, _, moved) = a_step_done(&old);
        let kept =
            (0..16).find(|pg| map.pgs[*pg].from.is_none() && map.pgs[*pg].changed_at == 0).expect("a group stays");
        let e = check(&map, &group_fence(&old, 0, moved)).unwrap_err();
        assert_eq!(e.kind, mosaic_store::ErrorKind::Unavailable);
        assert!(e.message.contains("stale cluster map"), "{e}");
        assert!(check(&map, &group_fence(&old, 0, kept)).is_ok());
        // Commands of no group (connecting) from an older map of a node that is up are served.
        assert!(check(&map, &fence_of(&old, 0)).is_ok());
        map.apply(&Change::SetNodeState { node: 0, state: NodeState::Down }).unwrap();
        assert!(check(&map, &fence_of(&old, 0)).is_err());
        assert_eq!(map.pgs[kept], old.pgs[kept]);
        assert!(check(&map, &group_fence(&old, 1, kept)).is_ok(), "node 1 is up and the group did not change");
        assert!(check(&map, &fence_of(&old, 9)).is_err(), "a node the map does not have");
    }

    #[test]
    fn a_group_one_change_behind_is_served_and_two_are_refused() {
        let older = map_of(3);
        let (map, old, moved) = a_step_done(&older);
        assert_eq!((map.pgs[moved].changed_before, map.pgs[moved].changed_at), (old.epoch, map.epoch));
        assert!(check(&map, &group_fence(&old, 0, moved)).is_ok(), "one step behind");
        let e = check(&map, &group_fence(&older, 0, moved)).unwrap_err();
        assert!(e.message.contains("placement group"), "{e}");
        // A placement the map never gave the group is refused whatever its epoch.
        let mut forged = group_fence(&map, 0, moved);
        forged.epoch -= 1;
        forged.group.as_mut().unwrap().served.reverse();
        assert!(check(&map, &forged).is_err());
    }
}
