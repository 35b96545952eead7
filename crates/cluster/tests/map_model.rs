//! The cluster map under random changes, checked against what a map must be after any history: sets of
//! distinct nodes on active drives of live nodes, a group's old set kept exactly while it moves, nothing
//! moved that did not have to, refused changes leaving the map as it was, the same history giving the same
//! map, and the map surviving its on-disk frame.

use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::{Change, ClusterMap, DriveState, FailureDomain, MapError, NodeState, PgEntry};
use proptest::prelude::*;
use std::collections::BTreeSet;

const PG_COUNT: u32 = 64;

#[derive(Clone, Debug)]
enum Op {
    AddNode { drives: u8, weight: u32 },
    AddDrive { node: u8, weight: u32 },
    Weight { drive: u8, weight: u32 },
    FailDrive { drive: u8 },
    NodeState { node: u8, state: u8 },
    Remove { node: u8, dead: bool },
    MoveDone { pg: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..4, 1u32..300).prop_map(|(drives, weight)| Op::AddNode { drives, weight }),
        1 => (any::<u8>(), 1u32..300).prop_map(|(node, weight)| Op::AddDrive { node, weight }),
        1 => (any::<u8>(), 0u32..300).prop_map(|(drive, weight)| Op::Weight { drive, weight }),
        1 => any::<u8>().prop_map(|drive| Op::FailDrive { drive }),
        1 => (any::<u8>(), 0u8..4).prop_map(|(node, state)| Op::NodeState { node, state }),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(node, dead)| Op::Remove { node, dead }),
        2 => (0..PG_COUNT).prop_map(|pg| Op::MoveDone { pg }),
    ]
}

fn pick<T: Copy>(items: &[T], i: u8) -> Option<T> {
    (!items.is_empty()).then(|| items[i as usize % items.len()])
}

/// The change an op stands for in `map` (ops name nodes and drives by position, so that most are valid).
fn change_of(map: &ClusterMap, next_node: &mut u64, op: &Op) -> Option<Change> {
    let nodes: Vec<u64> = map.nodes.keys().copied().collect();
    let drives: Vec<u32> = map.drives.keys().copied().collect();
    Some(match op {
        Op::AddNode { drives, weight } => {
            let node = *next_node;
            *next_node += 1;
            let mut v = vec![Change::AddNode {
                node,
                address: format!("127.0.0.1:{}", 9100 + node),
                s3_address: format!("127.0.0.1:{}", 9000 + node),
                zone: format!("z{}", node % 3),
            }];
            v.extend((0..*drives).map(|d| Change::AddDrive { node, name: format!("d{d}"), weight: *weight }));
            Change::Batch(v)
        }
        Op::AddDrive { node, weight } => {
            let node = pick(&nodes, *node)?;
            Change::AddDrive { node, name: format!("x{}", map.next_drive_id), weight: *weight }
        }
        Op::Weight { drive, weight } => Change::SetDriveWeight { drive: pick(&drives, *drive)?, weight: *weight },
        Op::FailDrive { drive } => Change::SetDriveState { drive: pick(&drives, *drive)?, state: DriveState::Failed },
        Op::NodeState { node, state } => {
            let state = [NodeState::Up, NodeState::Down, NodeState::Draining, NodeState::Up][*state as usize];
            Change::SetNodeState { node: pick(&nodes, *node)?, state }
        }
        Op::Remove { node, dead } => Change::RemoveNode { node: pick(&nodes, *node)?, dead: *dead },
        Op::MoveDone { pg } => Change::MoveDone { pg: *pg, set: map.step_target(map.pgs.get(*pg as usize)?) },
    })
}

fn check(before: &ClusterMap, after: &ClusterMap, change: &Change) {
    // The placement epoch moves exactly when some group is served from other drives or its step keeps
    // other slots.
    if before.served_placement() != after.served_placement() {
        assert_eq!(after.placement_epoch, after.epoch);
    } else {
        assert_eq!(after.placement_epoch, before.placement_epoch);
    }
    let width = after.set_width();
    if after.pgs.is_empty() {
        return;
    }
    assert_eq!(after.pgs.len(), PG_COUNT as usize);
    for (i, pg) in after.pgs.iter().enumerate() {
        assert_eq!(pg.set.len(), width);
        let nodes: BTreeSet<u64> = pg.set.iter().map(|d| after.drives[d].node).collect();
        assert_eq!(nodes.len(), width, "group {i} has two shards on one node: {:?}", pg.set);
        for d in &pg.set {
            let drive = &after.drives[d];
            assert_eq!(drive.state, DriveState::Active);
            assert!(matches!(after.nodes[&drive.node].state, NodeState::Up | NodeState::Down));
        }
        let old = before.pgs.get(i);
        check_serving(after, pg);
        if let (Some(old), Change::MoveDone { pg: moved, set }) = (old, change)
            && *moved as usize == i
        {
            // A step done: the data is whole on the set that was served.
            assert_eq!(set, &before.step_target(old));
            assert_eq!(pg.from.as_ref().unwrap_or(&pg.set), set);
            continue;
        }
        match (&pg.from, old) {
            // A group that starts moving remembers exactly the set its data is on.
            (Some(from), Some(old)) if old.from.is_none() => assert_eq!(from, &old.set),
            // A group that was moving still reads from the oldest whole set (unless the move finished).
            (Some(from), Some(old)) => assert_eq!(Some(from), old.from.as_ref()),
            (None, Some(old)) if old.set != pg.set => {
                // Not moving although its set changed: only when it moved back to where its data is whole.
                assert_eq!(old.from.as_ref(), Some(&pg.set));
            }
            _ => {}
        }
        if let (Some(old), Change::MoveDone { .. }) = (old, change) {
            assert_eq!(old.set, pg.set, "a finished move changes no set");
        }
    }
}

/// A moving group is served from its old set with at most `parity` live drives swapped for new ones
/// (k old shards of every object stay readable), each swapped position taking the new set's drive.
fn check_serving(map: &ClusterMap, pg: &PgEntry) {
    let serving = map.step_target(pg);
    let Some(from) = &pg.from else {
        assert_eq!(serving, pg.set);
        return;
    };
    assert_ne!(&serving, from, "a moving group's serving set moves");
    let mut swapped_live = 0;
    for i in 0..serving.len() {
        assert!(serving[i] == from[i] || serving[i] == pg.set[i]);
        if serving[i] != from[i] && map.drives.contains_key(&from[i]) {
            swapped_live += 1;
        }
        assert!(serving[i] == pg.set[i] || map.drives.contains_key(&from[i]), "a gone drive is swapped first");
    }
    assert!(swapped_live <= map.parity_shards as usize);
    // The slots the step keeps are exactly those it does not swap; while no more than m drives of the set
    // are gone, at least k of them (writes acknowledged on them survive the step).
    let down = from.iter().any(|d| {
        map.drives.get(d).is_some_and(|d| matches!(map.nodes[&d.node].state, NodeState::Down | NodeState::Dead))
    });
    let Some(kept) = map.kept_slots(pg) else {
        assert!(down, "a moving group keeps slots unless a node of its served set is down");
        return;
    };
    assert!(!down);
    for i in 0..serving.len() {
        assert_eq!(kept & (1 << i) != 0, serving[i] == from[i]);
    }
    let gone = from.iter().filter(|d| !map.drives.contains_key(d)).count();
    if gone <= map.parity_shards as usize {
        assert!(kept.count_ones() as usize >= map.data_shards as usize, "{kept:#b}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn any_history_keeps_the_map_sound(ops in proptest::collection::vec(op(), 1..40), zones in any::<bool>()) {
        let domain = if zones { FailureDomain::Zone } else { FailureDomain::Node };
        let bootstrap = Change::Bootstrap {
            cluster_id: "model".into(), data_shards: 2, parity_shards: 1, pg_count: PG_COUNT, failure_domain: domain, placement: mosaic_cluster::placement::PLACEMENT_LATEST,
        };
        let mut map = ClusterMap::empty();
        prop_assert_eq!(map.apply(&Change::AddNode {
            node: 0, address: "a".into(), s3_address: "b".into(), zone: "z".into()
        }), Err(MapError::NotBootstrapped));
        map.apply(&bootstrap).unwrap();
        prop_assert_eq!(map.apply(&bootstrap), Err(MapError::AlreadyBootstrapped));
        let mut replica = map.clone();
        let mut next_node = 0;
        for op in &ops {
            let Some(change) = change_of(&map, &mut next_node, op) else { continue };
            let before = map.clone();
            let epoch = map.epoch;
            let result = map.apply(&change);
            // The same change on a replica with the same history gives the same outcome and the same map.
            prop_assert_eq!(&replica.apply(&change), &result);
            prop_assert_eq!(&replica, &map);
            // A step is not done while a node of the group's served set is down (its writes need only
            // their quorum then, not the kept drives).
            if let Change::MoveDone { pg, .. } = &change
                && before.pgs.get(*pg as usize).is_some_and(|e| e.from.is_some() && before.kept_slots(e).is_none())
            {
                prop_assert_eq!(&result, &Err(MapError::StaleMove { pg: *pg }));
            }
            match result {
                Ok(_) => {
                    prop_assert_eq!(map.epoch, epoch + 1);
                    check(&before, &map, &change);
                }
                Err(e) => {
                    prop_assert_eq!(&map, &before, "refused ({}) but changed", e);
                    if let (Change::RemoveNode { dead: false, .. }, MapError::NotDrained(..)) = (&change, &e) {
                        prop_assert!(!map.pgs.is_empty());
                    }
                }
            }
        }
        let raw = frame::encode(Kind::Map, &map).unwrap();
        let back: ClusterMap = frame::decode(Kind::Map, &raw).unwrap();
        prop_assert_eq!(back, map);
    }
}

/// A map of 2+1 groups, bootstrapped, with no nodes yet.
fn bootstrapped() -> ClusterMap {
    let mut map = ClusterMap::empty();
    map.apply(&Change::Bootstrap {
        cluster_id: "c".into(),
        data_shards: 2,
        parity_shards: 1,
        pg_count: PG_COUNT,
        failure_domain: FailureDomain::Node,
        placement: mosaic_cluster::placement::PLACEMENT_LATEST,
    })
    .unwrap();
    map
}

/// Adds node `node` with one drive of weight 100.
fn add_node(map: &mut ClusterMap, node: u64) {
    let address = format!("127.0.0.1:{}", 9100 + node);
    let s3_address = format!("127.0.0.1:{}", 9000 + node);
    map.apply(&Change::Batch(vec![
        Change::AddNode { node, address, s3_address, zone: "z".into() },
        Change::AddDrive { node, name: "d0".into(), weight: 100 },
    ]))
    .unwrap();
}

fn finish_moves(map: &mut ClusterMap) {
    for pg in 0..PG_COUNT {
        // Each step swaps at least one drive: a set of `width` is reached in that many steps at most.
        for _ in 0..map.set_width() {
            if map.pgs[pg as usize].from.is_some() {
                let set = map.step_target(&map.pgs[pg as usize]);
                map.apply(&Change::MoveDone { pg, set }).unwrap();
            }
        }
    }
    assert!(map.pgs.iter().all(|pg| pg.from.is_none()));
}

#[test]
fn a_node_is_removed_only_when_drained_or_dead() {
    let mut map = bootstrapped();
    for node in 0..4u64 {
        add_node(&mut map, node);
    }
    // Node 3 joined after the first set was placed: its groups move there; finish those moves.
    finish_moves(&mut map);
    assert!(map.groups_on_node(3) > 0);
    assert!(matches!(map.apply(&Change::RemoveNode { node: 3, dead: false }), Err(MapError::NotDrained(3, _))));
    // Draining moves every group off it; the move is done group by group; then it may go.
    map.apply(&Change::SetNodeState { node: 3, state: NodeState::Draining }).unwrap();
    let moving: Vec<u32> = (0..PG_COUNT).filter(|&pg| map.pgs[pg as usize].from.is_some()).collect();
    assert!(!moving.is_empty());
    assert!(matches!(map.apply(&Change::RemoveNode { node: 3, dead: false }), Err(MapError::NotDrained(3, _))));
    for pg in moving {
        let set = map.pgs[pg as usize].set.clone();
        // A finished move is reported on its own, never inside a batch.
        let batched = Change::Batch(vec![Change::MoveDone { pg, set: set.clone() }]);
        assert!(matches!(map.apply(&batched), Err(MapError::Invalid(_))));
        assert_eq!(map.apply(&Change::MoveDone { pg, set: vec![99, 98, 97] }), Err(MapError::StaleMove { pg }));
        map.apply(&Change::MoveDone { pg, set }).unwrap();
    }
    map.apply(&Change::RemoveNode { node: 3, dead: false }).unwrap();
    // Too few nodes left for a 3-wide set: draining another is refused, nothing changes.
    let before = map.clone();
    assert!(matches!(
        map.apply(&Change::SetNodeState { node: 0, state: NodeState::Draining }),
        Err(MapError::Placement(_))
    ));
    assert_eq!(map, before);
    // A dead node goes at once; its groups keep their old set to rebuild from.
    add_node(&mut map, 7);
    let held = map.groups_on_node(0);
    map.apply(&Change::RemoveNode { node: 0, dead: true }).unwrap();
    assert!(!map.nodes.contains_key(&0));
    assert!(map.pgs.iter().filter(|pg| pg.from.is_some()).count() >= held.min(1));
}

#[test]
fn a_move_of_several_drives_goes_in_steps_of_parity() {
    let mut map = bootstrapped();
    for node in 0..3 {
        add_node(&mut map, node);
    }
    let before = map.clone();
    for node in 3..6 {
        add_node(&mut map, node);
    }
    // Every group leaves all three old nodes: three drives each, one per step.
    for node in 0..3 {
        map.apply(&Change::SetNodeState { node, state: NodeState::Draining }).unwrap();
    }
    for pg in 0..PG_COUNT {
        let entry = map.pgs[pg as usize].clone();
        assert_eq!(entry.from.as_ref(), Some(&before.pgs[pg as usize].set));
        let mut steps = 0;
        while map.pgs[pg as usize].from.is_some() {
            let serving = map.step_target(&map.pgs[pg as usize]);
            let from = map.pgs[pg as usize].from.clone().unwrap();
            assert_eq!(serving.iter().zip(&from).filter(|(a, b)| a != b).count(), 1, "one drive per step");
            let placement_epoch = map.placement_epoch;
            map.apply(&Change::MoveDone { pg, set: serving.clone() }).unwrap();
            // Every step changes where the group is served.
            assert!(map.placement_epoch > placement_epoch);
            // The step reported twice is stale.
            if map.pgs[pg as usize].from.is_some() {
                assert_eq!(map.apply(&Change::MoveDone { pg, set: serving }), Err(MapError::StaleMove { pg }));
            }
            steps += 1;
        }
        assert_eq!(steps, 3);
        assert_eq!(map.pgs[pg as usize].set, entry.set);
    }
    for node in 0..3 {
        map.apply(&Change::RemoveNode { node, dead: false }).unwrap();
    }
    assert_eq!(map.nodes.len(), 3);
}

/// A step reported under the write fence the rebalancer read is applied; once a node raised the fence
/// (it started, or a seal of its lapsed) the same report is refused and the map is unchanged.
#[test]
fn a_step_reported_under_an_older_write_fence_is_refused() {
    let mut map = bootstrapped();
    for node in 0..3 {
        add_node(&mut map, node);
    }
    add_node(&mut map, 3);
    let pg = (0..PG_COUNT).find(|&pg| map.pgs[pg as usize].from.is_some()).expect("a group moves to node 3");
    let set = map.step_target(&map.pgs[pg as usize]);
    let counted = map.write_fence;
    let placement_epoch = map.placement_epoch;
    map.apply(&Change::FenceWrites { node: 1 }).unwrap();
    assert_eq!(map.write_fence, counted + 1);
    assert_eq!(map.placement_epoch, placement_epoch, "a fence places nothing");
    let before = map.clone();
    let report = Change::MoveDoneFenced { pg, set: set.clone(), write_fence: counted };
    assert_eq!(map.apply(&report), Err(MapError::Fenced { counted, now: counted + 1 }));
    assert_eq!(map, before, "a refused report changes nothing");
    assert!(matches!(map.apply(&Change::FenceWrites { node: 42 }), Err(MapError::NoNode(42))));
    let batched = Change::Batch(vec![Change::MoveDoneFenced { pg, set: set.clone(), write_fence: counted + 1 }]);
    assert!(matches!(map.apply(&batched), Err(MapError::Invalid(_))), "reported on its own");
    // Under the fence as it is now, the step is done.
    map.apply(&Change::MoveDoneFenced { pg, set: set.clone(), write_fence: counted + 1 }).unwrap();
    assert!(map.placement_epoch > placement_epoch);
    assert_ne!(map.pgs[pg as usize].from, before.pgs[pg as usize].from, "served from the step's set now");
}

#[test]
fn removed_nodes_are_remembered_up_to_the_limit_and_may_not_come_back() {
    use mosaic_cluster::map::MAX_REMOVED_REMEMBERED;
    let mut map = bootstrapped();
    for node in 0..3 {
        add_node(&mut map, node);
    }
    let first = 1000u64;
    let count = MAX_REMOVED_REMEMBERED as u64 + 1;
    for node in first..first + count {
        add_node(&mut map, node);
        map.apply(&Change::RemoveNode { node, dead: true }).unwrap();
    }
    assert_eq!(map.removed.len(), MAX_REMOVED_REMEMBERED, "bounded");
    assert!(!map.removed.contains(&first), "the oldest is forgotten first");
    let again = |node: u64| Change::AddNode {
        node,
        address: "127.0.0.1:1".into(),
        s3_address: "127.0.0.1:2".into(),
        zone: "z".into(),
    };
    assert!(matches!(map.apply(&again(first + count - 1)), Err(MapError::Invalid(_))), "a removed id is refused");
    map.apply(&again(first)).unwrap();
}

/// A shared setting changes only from the version it was planned from: of two changes planned from one
/// version the second is refused (neither is lost silently), nothing placed moves, and the limits hold.
#[test]
fn shared_settings_change_from_the_version_they_were_planned_from() {
    let mut map = bootstrapped();
    for node in 0..3 {
        add_node(&mut map, node);
    }
    finish_moves(&mut map);
    let placed = (map.pgs.clone(), map.placement_epoch);
    let set = |name: &str, value: &str, version| Change::SetShared { name: name.into(), value: value.into(), version };

    assert!(map.apply(&set("keys", "a", 2)).is_err(), "version 2 of a setting never set");
    map.apply(&set("keys", "a", 1)).unwrap();
    let epoch = map.epoch;
    assert!(map.apply(&set("keys", "b", 1)).is_err(), "planned from the version before");
    assert_eq!((map.epoch, map.shared["keys"].value.as_str()), (epoch, "a"), "a refused change changes nothing");
    map.apply(&set("keys", "b", 2)).unwrap();
    assert_eq!((map.shared["keys"].version, map.shared["keys"].value.as_str()), (2, "b"));
    assert_eq!((map.pgs.clone(), map.placement_epoch), placed, "a setting moves nothing");

    let big = "x".repeat(mosaic_cluster::map::MAX_SHARED_VALUE_BYTES);
    map.apply(&set("big", &big, 1)).unwrap();
    assert!(map.apply(&set("big", &format!("{big}x"), 2)).is_err(), "past the value limit");
    assert!(map.apply(&set("", "v", 1)).is_err(), "a setting needs a name");
    for i in map.shared.len()..mosaic_cluster::map::MAX_SHARED_SETTINGS {
        map.apply(&set(&format!("s{i}"), "v", 1)).unwrap();
    }
    assert!(map.apply(&set("one-more", "v", 1)).is_err(), "past the count limit");
    map.apply(&set("keys", "c", 3)).unwrap();

    // The settings travel with the map, and a map without them (an older one) reads as having none.
    let raw = frame::encode(Kind::Map, &map).unwrap();
    assert_eq!(frame::decode::<ClusterMap>(Kind::Map, &raw).unwrap(), map);
    let mut plain = map.clone();
    plain.shared.clear();
    let json = serde_json::to_string(&plain).unwrap();
    assert!(!json.contains("shared"), "an empty set of settings is not written");
}

/// A node's addresses change in place: nothing placed moves, and an address another node has is refused
/// (two nodes named by one address could each make a quorum with it).
#[test]
fn a_node_changes_its_addresses_without_moving_anything() {
    let mut map = bootstrapped();
    for node in 0..3 {
        add_node(&mut map, node);
    }
    finish_moves(&mut map);
    let placed = (map.pgs.clone(), map.placement_epoch);
    let to = |node, address: &str| Change::SetNodeAddress { node, address: address.into(), s3_address: "s3:1".into() };
    let taken = map.nodes[&2].address.clone();
    let before = map.clone();
    assert!(map.apply(&to(1, &taken)).is_err(), "node 2's address");
    assert!(map.apply(&to(9, "new:1")).is_err(), "no node 9");
    assert!(map.apply(&to(1, "")).is_err(), "an empty address");
    assert_eq!(map, before, "a refused change changes nothing");
    map.apply(&to(1, "new:1")).unwrap();
    assert_eq!((map.nodes[&1].address.as_str(), map.nodes[&1].s3_address.as_str()), ("new:1", "s3:1"));
    assert_eq!(map.epoch, before.epoch + 1);
    assert_eq!((map.pgs.clone(), map.placement_epoch), placed, "an address moves nothing");
    map.apply(&to(1, "new:1")).unwrap();
}
