//! The cluster map: nodes, their drives, and the erasure set of every placement group, versioned by an
//! epoch that every accepted change raises. The map changes only by `ClusterMap::apply`, which is
//! deterministic (Raft applies the same changes in the same order on every manager, and every one of them
//! arrives at the same map) and refuses a change that is not valid, leaving the map as it was.
//!
//! A group whose set changes keeps the set its data is whole on (`from`), and is served from it, until
//! the rebalancer reports it moved (`Change::MoveDone`). A move goes in steps (`ClusterMap::step_target`):
//! `from` with at most `parity` of its drives swapped for the new set's, so that every step's set shares
//! k drives with the one before (what the rebalancer could not copy before the switch is rebuilt from
//! them); each step is reported done and served from then on.
//!
//! A step's report names the map's write fence as the rebalancer read it before its last count
//! (`Change::MoveDoneFenced`), and is refused once the fence moved: a node raises it (`Change::FenceWrites`)
//! before it writes to a moving group after a start, or after a seal of a step's last count lapsed, so a
//! write the rebalancer's count cannot have seen never ends a step.

use crate::placement::{
    Candidate, DriveId, FailureDomain, NodeId, PLACEMENT_BALANCED, PLACEMENT_LATEST, PLACEMENT_RENDEZVOUS,
    PlacementError, assign_positions, place_all, place_balanced,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most nodes a cluster has.
pub const MAX_NODES: usize = 1024;
/// Most drives a node has.
pub const MAX_DRIVES_PER_NODE: usize = 64;
/// Most drives in one erasure set.
pub const MAX_SET_DRIVES: usize = 16;
/// Most placement groups (fixed when the cluster is made).
pub const MAX_PG_COUNT: u32 = 1 << 20;
/// Most changes in one batch.
pub const MAX_BATCH: usize = 4096;
/// Longest address, zone or drive name.
pub const MAX_NAME_BYTES: usize = 256;
/// Removed nodes remembered (their Raft membership is retired, and they may not come back under the same
/// id); the oldest are forgotten first, long after they were retired.
pub const MAX_REMOVED_REMEMBERED: usize = 1024;
/// Most shared settings a map holds (`Change::SetShared`).
pub const MAX_SHARED_SETTINGS: usize = 16;
/// Largest value of one shared setting.
pub const MAX_SHARED_VALUE_BYTES: usize = 1 << 20;
/// In the refusal of a shared setting's change planned from another version (the caller plans again).
pub const SHARED_VERSION_REFUSED: &str = "was planned from another version";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Answers; holds and receives shards.
    Up,
    /// Stopped answering: keeps its shards in the map (reads and writes go on with k of n; heal catches it
    /// up when it returns).
    Down,
    /// Everything is being moved off it; it receives nothing new.
    Draining,
    /// Declared gone for good: its shards are rebuilt on the others.
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveState {
    Active,
    /// Failed for good; its shards are rebuilt elsewhere.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// Where other nodes reach it (the cluster port).
    pub address: String,
    /// Where clients reach its S3 service.
    pub s3_address: String,
    pub zone: String,
    pub state: NodeState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveEntry {
    pub node: NodeId,
    /// The drive's name on its node (unique there).
    pub name: String,
    /// Relative capacity (for example GiB); a share of groups in proportion.
    pub weight: u32,
    pub state: DriveState,
}

/// One placement group's erasure set: drive of shard `i` at `set[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgEntry {
    pub set: Vec<DriveId>,
    /// The set whose data is whole while a move is under way.
    pub from: Option<Vec<DriveId>>,
    /// The epochs of the group's last two changes of placement (its served set or the slots its step
    /// keeps), latest first; 0 when there was none. A drive command planned before the earlier one is two
    /// changes behind and refused (`mosaic_cluster_store::fence`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changed_at: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changed_before: u64,
}

fn placement_rendezvous() -> u32 {
    PLACEMENT_RENDEZVOUS
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl PgEntry {
    /// Notes a change of the group's placement made at `epoch`.
    fn stamp_change(&mut self, epoch: u64) {
        debug_assert!(epoch > self.changed_at);
        self.changed_before = self.changed_at;
        self.changed_at = epoch;
    }

    /// The set the group is read and written on now: the one its data is whole on.
    pub fn served(&self) -> &[DriveId] {
        self.from.as_deref().unwrap_or(&self.set)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub cluster_id: String,
    pub epoch: u64,
    pub data_shards: u8,
    pub parity_shards: u8,
    pub pg_count: u32,
    pub failure_domain: FailureDomain,
    /// How sets are computed (`placement::PLACEMENT_*`), fixed at bootstrap; maps made before it was
    /// recorded are version 1.
    #[serde(default = "placement_rendezvous")]
    pub placement: u32,
    pub nodes: BTreeMap<NodeId, NodeEntry>,
    pub drives: BTreeMap<DriveId, DriveEntry>,
    pub next_drive_id: DriveId,
    /// Empty until the cluster has enough failure domains for one set, then `pg_count` entries.
    pub pgs: Vec<PgEntry>,
    /// The epoch at which some group's served set or the slots its step keeps last changed (a move begun or
    /// a step done, a node removed): the rebalancer waits until every node serves it before it fills a step.
    #[serde(default)]
    pub placement_epoch: u64,
    /// Set by `admin cluster rebalance pause`: groups keep serving where they are; no move starts.
    #[serde(default)]
    pub moves_paused: bool,
    /// Nodes removed, oldest first (at most `MAX_REMOVED_REMEMBERED`): the leader takes them out of Raft.
    #[serde(default)]
    pub removed: Vec<NodeId>,
    /// Settings every node serves with alike (the binary's, such as its access keys), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shared: BTreeMap<String, SharedSetting>,
    /// Raised by `Change::FenceWrites`: a step reported done under an older fence is refused.
    #[serde(default)]
    pub write_fence: u64,
}

/// A shared setting's value and its version: 1 when first set, one more at each change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSetting {
    pub version: u64,
    pub value: String,
}

/// A change to the map, as proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Bootstrap {
        cluster_id: String,
        data_shards: u8,
        parity_shards: u8,
        pg_count: u32,
        failure_domain: FailureDomain,
        /// The placement version (`placement::PLACEMENT_LATEST` for a new cluster); a change logged
        /// before it was recorded is version 1.
        #[serde(default = "placement_rendezvous")]
        placement: u32,
    },
    AddNode {
        node: NodeId,
        address: String,
        s3_address: String,
        zone: String,
    },
    AddDrive {
        node: NodeId,
        name: String,
        weight: u32,
    },
    SetDriveWeight {
        drive: DriveId,
        weight: u32,
    },
    SetDriveState {
        drive: DriveId,
        state: DriveState,
    },
    SetNodeState {
        node: NodeId,
        state: NodeState,
    },
    /// Refused unless the node is drained (no group names its drives) or `dead`.
    RemoveNode {
        node: NodeId,
        dead: bool,
    },
    /// The rebalancer made group `pg`'s data whole on `set`, the target of the group's next step: the
    /// move is done if that is the group's set, else it goes on from `set`. Served from `set` from now on.
    MoveDone {
        pg: u32,
        set: Vec<DriveId>,
    },
    /// `MoveDone`, refused unless the map's write fence is still `write_fence` (the one the rebalancer read
    /// before its last count of the nodes' writes): a node that wrote to the group unseen since raised it.
    /// A variant of its own, so that a build that does not know the condition refuses the entry rather
    /// than applying it without the condition.
    MoveDoneFenced {
        pg: u32,
        set: Vec<DriveId>,
        write_fence: u64,
    },
    /// Node `node` is about to write to moving groups outside any count a rebalancer took (it started,
    /// or a seal of its lapsed): the write fence goes up, and every step reported under the old one is
    /// refused. Places nothing.
    FenceWrites {
        node: NodeId,
    },
    /// Stops (or lets go on) the rebalancer's moves.
    PauseMoves {
        paused: bool,
    },
    /// Sets shared setting `name` to `value` as its version `version`, which must be one more than the
    /// map's (1 for a setting not set yet): of two nodes changing it at once from the same version, the
    /// second is refused and tries again from the newer value, so neither change is lost.
    SetShared {
        name: String,
        value: String,
        version: u64,
    },
    /// Several changes as one (one epoch, one placement), such as a node with its drives.
    Batch(Vec<Change>),
    /// A node restarted on other addresses (its cluster port, its S3 port). Refused when another node
    /// has the cluster address: two nodes named by one address could each make a quorum with it.
    SetNodeAddress {
        node: NodeId,
        address: String,
        s3_address: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MapError {
    #[error("the cluster is already bootstrapped")]
    AlreadyBootstrapped,
    #[error("the cluster is not bootstrapped")]
    NotBootstrapped,
    #[error("{0}")]
    Invalid(String),
    #[error("no node {0}")]
    NoNode(NodeId),
    #[error("no drive {0}")]
    NoDrive(DriveId),
    #[error("node {0} still holds shards of {1} placement groups: drain it first (or remove it as dead)")]
    NotDrained(NodeId, usize),
    #[error("group {pg} is not served from that set (its placement changed since): the move is stale")]
    StaleMove { pg: u32 },
    #[error("the write fence is {now}, not {counted}: a node wrote unseen since the step's count")]
    Fenced { counted: u64, now: u64 },
    #[error(transparent)]
    Placement(#[from] PlacementError),
}

fn check_name(what: &str, name: &str) -> Result<(), MapError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(|c| c.is_control()) {
        return Err(MapError::Invalid(format!("{what} must be 1 to {MAX_NAME_BYTES} printable bytes")));
    }
    Ok(())
}

impl ClusterMap {
    /// The map before bootstrap: epoch 0, nothing in it.
    pub fn empty() -> Self {
        ClusterMap {
            cluster_id: String::new(),
            epoch: 0,
            data_shards: 0,
            parity_shards: 0,
            pg_count: 0,
            failure_domain: FailureDomain::Node,
            placement: PLACEMENT_LATEST,
            nodes: BTreeMap::new(),
            drives: BTreeMap::new(),
            next_drive_id: 0,
            pgs: Vec::new(),
            placement_epoch: 0,
            moves_paused: false,
            removed: Vec::new(),
            shared: BTreeMap::new(),
            write_fence: 0,
        }
    }

    pub fn set_width(&self) -> usize {
        self.data_shards as usize + self.parity_shards as usize
    }

    pub fn is_bootstrapped(&self) -> bool {
        self.epoch > 0
    }

    /// Applies `change`: on success the epoch is one higher and the returned value is the new epoch (or
    /// the id of an added drive); on error the map is unchanged.
    pub fn apply(&mut self, change: &Change) -> Result<u64, MapError> {
        if let Change::MoveDone { pg, set } = change {
            // The rebalancer reports one per group: checked first, then changed in place (a copy of a map of
            // 2^20 groups per report would cost more than the move).
            return self.finish_move(*pg, set);
        }
        if let Change::MoveDoneFenced { pg, set, write_fence } = change {
            if !self.is_bootstrapped() {
                return Err(MapError::NotBootstrapped);
            }
            if *write_fence != self.write_fence {
                return Err(MapError::Fenced { counted: *write_fence, now: self.write_fence });
            }
            return self.finish_move(*pg, set);
        }
        let mut next = self.clone();
        let result = match change {
            Change::Batch(changes) => {
                if changes.len() > MAX_BATCH {
                    return Err(MapError::Invalid(format!("a batch has at most {MAX_BATCH} changes")));
                }
                for c in changes {
                    if matches!(c, Change::Batch(_)) {
                        return Err(MapError::Invalid("a batch inside a batch".into()));
                    }
                    next.apply_one(c)?;
                }
                self.epoch + 1
            }
            c => next.apply_one(c)?,
        };
        // A shared setting, a node's address or a write fence changes nothing placed.
        let placing = !matches!(
            change,
            Change::MoveDone { .. }
                | Change::MoveDoneFenced { .. }
                | Change::FenceWrites { .. }
                | Change::Bootstrap { .. }
                | Change::SetShared { .. }
                | Change::SetNodeAddress { .. }
        );
        if placing {
            next.place()?;
        }
        next.epoch += 1;
        if next.note_placement_changes(self) {
            next.placement_epoch = next.epoch;
        }
        next.check_invariants();
        *self = next;
        Ok(result)
    }

    fn apply_one(&mut self, change: &Change) -> Result<u64, MapError> {
        if !self.is_bootstrapped() && !matches!(change, Change::Bootstrap { .. }) {
            return Err(MapError::NotBootstrapped);
        }
        match change {
            Change::Batch(_) => Err(MapError::Invalid("a batch inside a batch".into())),
            Change::Bootstrap { cluster_id, data_shards, parity_shards, pg_count, failure_domain, placement } => {
                if self.is_bootstrapped() {
                    return Err(MapError::AlreadyBootstrapped);
                }
                if !(PLACEMENT_RENDEZVOUS..=PLACEMENT_BALANCED).contains(placement) {
                    return Err(MapError::Invalid(format!(
                        "placement version {placement} is not known to this build (1 to {PLACEMENT_LATEST})"
                    )));
                }
                check_name("a cluster id", cluster_id)?;
                let width = *data_shards as usize + *parity_shards as usize;
                if *data_shards == 0 || width > MAX_SET_DRIVES {
                    return Err(MapError::Invalid(format!(
                        "a set needs 1 or more data shards and at most {MAX_SET_DRIVES} drives"
                    )));
                }
                if *pg_count == 0 || *pg_count > MAX_PG_COUNT {
                    return Err(MapError::Invalid(format!("placement groups must be 1 to {MAX_PG_COUNT}")));
                }
                self.cluster_id = cluster_id.clone();
                self.data_shards = *data_shards;
                self.parity_shards = *parity_shards;
                self.pg_count = *pg_count;
                self.failure_domain = *failure_domain;
                self.placement = *placement;
                Ok(self.epoch + 1)
            }
            Change::AddNode { node, address, s3_address, zone } => {
                if self.nodes.contains_key(node) {
                    return Err(MapError::Invalid(format!("node {node} is already in the cluster")));
                }
                if self.removed.contains(node) {
                    return Err(MapError::Invalid(format!(
                        "node {node} was removed from the cluster: a node joins again with a new data directory"
                    )));
                }
                if self.nodes.len() >= MAX_NODES {
                    return Err(MapError::Invalid(format!("a cluster has at most {MAX_NODES} nodes")));
                }
                check_name("a node address", address)?;
                check_name("an S3 address", s3_address)?;
                check_name("a zone", zone)?;
                let entry = NodeEntry {
                    address: address.clone(),
                    s3_address: s3_address.clone(),
                    zone: zone.clone(),
                    state: NodeState::Up,
                };
                self.nodes.insert(*node, entry);
                Ok(self.epoch + 1)
            }
            Change::AddDrive { node, name, weight } => {
                self.nodes.get(node).ok_or(MapError::NoNode(*node))?;
                check_name("a drive name", name)?;
                let on_node = self.drives.values().filter(|d| d.node == *node);
                if on_node.clone().any(|d| &d.name == name) {
                    return Err(MapError::Invalid(format!("node {node} already has a drive {name}")));
                }
                if on_node.count() >= MAX_DRIVES_PER_NODE {
                    return Err(MapError::Invalid(format!("a node has at most {MAX_DRIVES_PER_NODE} drives")));
                }
                if *weight == 0 {
                    return Err(MapError::Invalid("a drive's weight must be positive".into()));
                }
                let id = self.next_drive_id;
                self.next_drive_id = id.checked_add(1).ok_or(MapError::Invalid("drive ids ran out".into()))?;
                let entry = DriveEntry { node: *node, name: name.clone(), weight: *weight, state: DriveState::Active };
                self.drives.insert(id, entry);
                Ok(id as u64)
            }
            Change::SetDriveWeight { drive, weight } => {
                if *weight == 0 {
                    return Err(MapError::Invalid("a drive's weight must be positive".into()));
                }
                self.drives.get_mut(drive).ok_or(MapError::NoDrive(*drive))?.weight = *weight;
                Ok(self.epoch + 1)
            }
            Change::SetDriveState { drive, state } => {
                self.drives.get_mut(drive).ok_or(MapError::NoDrive(*drive))?.state = *state;
                Ok(self.epoch + 1)
            }
            Change::SetNodeState { node, state } => {
                self.nodes.get_mut(node).ok_or(MapError::NoNode(*node))?.state = *state;
                Ok(self.epoch + 1)
            }
            Change::RemoveNode { node, dead } => {
                self.nodes.get(node).ok_or(MapError::NoNode(*node))?;
                if !*dead {
                    let holding = self.groups_on_node(*node);
                    if holding > 0 {
                        return Err(MapError::NotDrained(*node, holding));
                    }
                }
                // A dead node's groups keep their old set as `from` (read with its shards as erasures) until
                // the rebalancer has rebuilt them on their new set.
                for d in self.drives_of(*node) {
                    self.drives.remove(&d);
                }
                self.nodes.remove(node);
                if self.removed.len() >= MAX_REMOVED_REMEMBERED {
                    self.removed.remove(0);
                }
                self.removed.push(*node);
                Ok(self.epoch + 1)
            }
            Change::PauseMoves { paused } => {
                self.moves_paused = *paused;
                Ok(self.epoch + 1)
            }
            Change::SetShared { name, value, version } => {
                check_name("a shared setting's name", name)?;
                if value.len() > MAX_SHARED_VALUE_BYTES {
                    return Err(MapError::Invalid(format!(
                        "a shared setting holds at most {MAX_SHARED_VALUE_BYTES} bytes"
                    )));
                }
                let current = self.shared.get(name).map_or(0, |s| s.version);
                if *version != current + 1 {
                    return Err(MapError::Invalid(format!(
                        "shared setting {name} is at version {current}: a change to version {version} \
                         {SHARED_VERSION_REFUSED}"
                    )));
                }
                if current == 0 && self.shared.len() >= MAX_SHARED_SETTINGS {
                    return Err(MapError::Invalid(format!("at most {MAX_SHARED_SETTINGS} shared settings")));
                }
                self.shared.insert(name.clone(), SharedSetting { version: *version, value: value.clone() });
                Ok(self.epoch + 1)
            }
            Change::SetNodeAddress { node, address, s3_address } => {
                check_name("a node address", address)?;
                check_name("an S3 address", s3_address)?;
                if let Some((other, _)) = self.nodes.iter().find(|(id, n)| *id != node && n.address == *address) {
                    return Err(MapError::Invalid(format!("node {other} is at {address}")));
                }
                let entry = self.nodes.get_mut(node).ok_or(MapError::NoNode(*node))?;
                entry.address.clone_from(address);
                entry.s3_address.clone_from(s3_address);
                Ok(self.epoch + 1)
            }
            Change::MoveDone { .. } | Change::MoveDoneFenced { .. } => {
                Err(MapError::Invalid("a finished move is reported on its own".into()))
            }
            Change::FenceWrites { node } => {
                if !self.nodes.contains_key(node) {
                    return Err(MapError::NoNode(*node));
                }
                self.write_fence += 1;
                Ok(self.epoch + 1)
            }
        }
    }

    /// Group `pg`'s data is whole on `reached`, the target of its next step: the move is done if that is
    /// its set, else it goes on from there.
    fn finish_move(&mut self, pg: u32, reached: &[DriveId]) -> Result<u64, MapError> {
        if !self.is_bootstrapped() {
            return Err(MapError::NotBootstrapped);
        }
        let entry = self.pgs.get(pg as usize).ok_or(MapError::Invalid(format!("no group {pg}")))?;
        // Only the step being served: a later change of placement makes the report stale, and so does a
        // node of the served set marked down since (writes of the group went to a quorum without the kept
        // drives' rule meanwhile: `kept_slots`).
        if entry.from.is_none() || self.step_target(entry) != reached || self.kept_slots(entry).is_none() {
            return Err(MapError::StaleMove { pg });
        }
        let entry = &mut self.pgs[pg as usize];
        entry.from = if entry.set == reached { None } else { Some(reached.to_vec()) };
        self.epoch += 1;
        self.placement_epoch = self.epoch;
        self.pgs[pg as usize].stamp_change(self.epoch);
        debug_assert!(self.pgs[pg as usize].from.as_ref().is_none_or(|f| f != &self.pgs[pg as usize].set));
        Ok(self.epoch)
    }

    /// Stamps this map's epoch on every group whose placement differs from its placement in `before` (the
    /// map this one was made from); returns whether any did.
    fn note_placement_changes(&mut self, before: &ClusterMap) -> bool {
        if before.pgs.len() != self.pgs.len() {
            // The groups were made (placement begins): nothing was planned with them before.
            return !self.pgs.is_empty();
        }
        let changed: Vec<usize> = (0..self.pgs.len())
            .filter(|pg| {
                let (a, b) = (&before.pgs[*pg], &self.pgs[*pg]);
                a.served() != b.served() || before.kept_slots(a) != self.kept_slots(b)
            })
            .collect();
        for pg in &changed {
            self.pgs[*pg].stamp_change(self.epoch);
        }
        debug_assert_eq!(!changed.is_empty(), self.served_placement() != before.served_placement());
        !changed.is_empty()
    }

    /// Every group's served set.
    pub fn served_sets(&self) -> Vec<&[DriveId]> {
        self.pgs.iter().map(PgEntry::served).collect()
    }

    /// What every node must serve before a group's step is filled: each group's served set and, while it
    /// moves, the slots its step keeps (writes must reach them: `SetConfig::kept_drives`).
    pub fn served_placement(&self) -> Vec<(&[DriveId], Option<u16>)> {
        self.pgs.iter().map(|e| (e.served(), self.kept_slots(e))).collect()
    }

    /// The slots of group `entry`'s served set that its next step keeps (a bit per slot), or None when it
    /// does not move. A write acknowledged on enough of them keeps k shards where the group is served
    /// after the step, whatever happens to the drives the step leaves. Also None while a drive of the
    /// served set is on a node marked down: the step waits for the node (its report is refused, and the
    /// set is healed whole before the next fill), so the group's writes need only their quorum meanwhile
    /// and a node failure during a move stops no write.
    pub fn kept_slots(&self, entry: &PgEntry) -> Option<u16> {
        let from = entry.from.as_ref()?;
        if from.iter().any(|d| self.drive_is_on_a_down_node(*d)) {
            return None;
        }
        let target = self.step_target(entry);
        debug_assert!(from.len() <= 16 && from.len() == target.len());
        Some(from.iter().zip(&target).enumerate().filter(|(_, (a, b))| a == b).fold(0, |mask, (i, _)| mask | 1 << i))
    }

    /// The set group `entry`'s next step moves to: its set when it is not moving, else the set it moves
    /// from with each position whose drive left the map and up to `parity` more (less those gone) taken
    /// from the new set. The old drives kept hold k shards of every object the group had, so what the
    /// rebalancer could not copy before the step is served is rebuilt from them. Positions whose new
    /// drive's node is not in the old set yet go first (two shards on one node would weaken the set).
    pub fn step_target(&self, entry: &PgEntry) -> Vec<DriveId> {
        let Some(from) = &entry.from else { return entry.set.clone() };
        debug_assert_eq!(from.len(), entry.set.len());
        let differing: Vec<usize> = (0..from.len()).filter(|i| from[*i] != entry.set[*i]).collect();
        let gone = |i: &usize| !self.drives.contains_key(&from[*i]);
        let gone_count = differing.iter().filter(|i| gone(i)).count();
        let mut budget = (self.parity_shards as usize).max(1).saturating_sub(gone_count);
        let node_of = |d: &DriveId| self.drives.get(d).map(|e| e.node);
        let from_nodes: Vec<Option<NodeId>> = from.iter().map(node_of).collect();
        let mut live: Vec<usize> = differing.iter().copied().filter(|i| !gone(i)).collect();
        live.sort_by_key(|i| from_nodes.contains(&node_of(&entry.set[*i])));
        let mut serving = from.clone();
        for i in differing.iter().filter(|i| gone(i)) {
            serving[*i] = entry.set[*i];
        }
        for i in live {
            if budget == 0 {
                break;
            }
            serving[i] = entry.set[i];
            budget -= 1;
        }
        debug_assert!(serving != *from || differing.is_empty(), "every step moves");
        serving
    }

    /// Whether drive `id` is in the map on a node marked down or dead.
    fn drive_is_on_a_down_node(&self, id: DriveId) -> bool {
        self.drives.get(&id).is_some_and(|d| {
            self.nodes.get(&d.node).is_none_or(|n| matches!(n.state, NodeState::Down | NodeState::Dead))
        })
    }

    /// The drives of `node`.
    pub fn drives_of(&self, node: NodeId) -> Vec<DriveId> {
        self.drives.iter().filter(|(_, d)| d.node == node).map(|(id, _)| *id).collect()
    }

    /// How many groups name one of `node`'s drives in their set or in the set they move from.
    pub fn groups_on_node(&self, node: NodeId) -> usize {
        let drives = self.drives_of(node);
        self.pgs.iter().filter(|pg| pg.set.iter().chain(pg.from.iter().flatten()).any(|d| drives.contains(d))).count()
    }

    /// Nodes and drives that may hold shards: active drives of nodes up or down (a node that is down keeps
    /// its groups: heal, not placement, handles a short absence).
    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n.state, NodeState::Up | NodeState::Down))
            .map(|(id, n)| Candidate {
                node: *id,
                zone: &n.zone,
                drives: self
                    .drives
                    .iter()
                    .filter(|(_, d)| d.node == *id && d.state == DriveState::Active)
                    .map(|(did, d)| (*did, d.weight))
                    .collect(),
            })
            .collect()
    }

    /// Recomputes every group's set. Before the first full set exists it is not an error to lack domains.
    fn place(&mut self) -> Result<(), MapError> {
        let width = self.set_width();
        let candidates = self.candidates();
        let previous: Vec<Vec<DriveId>> = self.pgs.iter().map(|pg| pg.set.clone()).collect();
        let placed = match self.placement {
            PLACEMENT_RENDEZVOUS => place_all(self.pg_count, width, &candidates, self.failure_domain),
            PLACEMENT_BALANCED => place_balanced(self.pg_count, width, &candidates, self.failure_domain, &previous),
            v => return Err(MapError::Invalid(format!("placement version {v} is not known to this build"))),
        };
        drop(previous);
        let sets = match placed {
            Ok(sets) => sets,
            Err(e) if self.pgs.is_empty() => {
                tracing::debug!(error = %e, "not placing groups yet");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        drop(candidates);
        if self.pgs.is_empty() {
            self.pgs =
                sets.into_iter().map(|set| PgEntry { set, from: None, changed_at: 0, changed_before: 0 }).collect();
            return Ok(());
        }
        let drives = &self.drives;
        let node_of = |d: DriveId| drives.get(&d).map(|e| e.node);
        for (entry, chosen) in self.pgs.iter_mut().zip(sets) {
            let set = assign_positions(&entry.set, &chosen, node_of);
            if set == entry.set {
                continue;
            }
            // Moving back to where the data is whole ends the move; otherwise the oldest whole set stays.
            let from = entry.from.take().unwrap_or_else(|| entry.set.clone());
            entry.from = if from == set { None } else { Some(from) };
            entry.set = set;
        }
        Ok(())
    }

    /// Invariants every applied map holds; a map that breaks one would misplace data.
    fn check_invariants(&self) {
        assert!(self.pgs.is_empty() || self.pgs.len() == self.pg_count as usize);
        for pg in &self.pgs {
            assert_eq!(pg.set.len(), self.set_width());
            assert!(pg.from.as_ref().is_none_or(|f| f.len() == self.set_width()));
        }
        debug_assert!(self.drives.values().all(|d| self.nodes.contains_key(&d.node)));
        debug_assert!(self.pgs.iter().all(|pg| pg.set.iter().all(|d| self.drives.contains_key(d))));
    }
}
