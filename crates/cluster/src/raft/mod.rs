//! The cluster map replicated by Raft (openraft): managers vote and hold the log, other nodes follow as
//! learners and apply the same log, so every node holds the same map.
//!
//! - `store`: the log, vote and snapshots in RocksDB (synced), the map as the state machine.
//! - `network`: Raft's messages to other nodes over the cluster RPC (`rpc`).

pub mod network;
pub mod store;

use crate::map::Change;
use serde::{Deserialize, Serialize};

pub type NodeId = u64;

/// What applying one log entry gave: the new epoch (or an added drive's id), or why the change was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub result: Result<u64, String>,
}

openraft::declare_raft_types!(
    /// Raft's types for the cluster map.
    pub TypeConfig:
        D = Change,
        R = Applied,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Membership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

/// Raft's timing and log limits.
#[derive(Clone, Copy, Debug)]
pub struct RaftSettings {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Entries applied since the last snapshot that trigger the next one; as many are kept in the log
    /// past it (a node further behind is sent the snapshot).
    pub logs_per_snapshot: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        // Generous for a loaded two-core machine: a missed heartbeat under load must not start elections.
        RaftSettings {
            heartbeat_ms: 250,
            election_timeout_min_ms: 1500,
            election_timeout_max_ms: 3000,
            logs_per_snapshot: 1000,
        }
    }
}

pub fn config(settings: RaftSettings) -> Result<openraft::Config, String> {
    let config = openraft::Config {
        cluster_name: "mosaic".into(),
        heartbeat_interval: settings.heartbeat_ms,
        election_timeout_min: settings.election_timeout_min_ms,
        election_timeout_max: settings.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.logs_per_snapshot),
        max_in_snapshot_log_to_keep: settings.logs_per_snapshot,
        // The map of 2^20 groups is tens of MiB: sent in 1 MiB chunks (about 4 MiB each as a JSON call).
        snapshot_max_chunk_size: 1 << 20,
        max_payload_entries: 256,
        ..Default::default()
    };
    config.validate().map_err(|e| format!("Raft settings: {e}"))
}
