//! The cluster (issue 16, DESIGN.md section 6): which nodes and drives there are and which erasure set each
//! placement group lives on, agreed by Raft among the managers.
//!
//! - `frame`: the versioned, checksummed envelope of everything written to disk or sent between nodes.
//! - `placement`: objects to placement groups, groups to drives (weighted rendezvous, straw2).
//! - `map`: the cluster map and its deterministic changes.
//! - `raft`: the map replicated by Raft (openraft), its log and snapshots in RocksDB.
//! - `rpc`: authenticated calls between nodes.
//! - `capability`: the signed tokens that authorize each drive command (paper 003).
//! - `locks`: object locks held on a majority of the nodes, so that two nodes never write one object at once.
//! - `node`: one node of the cluster: joining, proposing changes, its copy of the map.

pub mod capability;
pub mod frame;
pub mod locks;
pub mod map;
pub mod node;
pub mod placement;
pub mod raft;
pub mod rpc;

pub use map::{Change, ClusterMap, DriveEntry, DriveState, MapError, NodeEntry, NodeState, PgEntry, SharedSetting};
pub use node::{ClusterError, ClusterNode, NodeConfig, Status};
pub use placement::{DriveId, FailureDomain, NodeId, pg_of};
