//! The object-drive protocol (paper 003, issue 16): nodes exchange the engine's operations (snapshot
//! reads, staging, transactions) as commands, so that an erasure set's drives may be on other nodes.
//!
//! - `wire`: the commands and answers.
//! - `server`: a node's drives served to others (snapshots and staged units held for clients, bounded).
//! - `client`: a drive on another node as a `mosaic_store::Store`.
//!
//! Requests are authenticated by the cluster secret (`mosaic_cluster::rpc`).

pub mod client;
pub mod server;
pub mod wire;

pub use client::{RemoteSnapshot, RemoteStaged, RemoteStore};
pub use server::DriveServer;
