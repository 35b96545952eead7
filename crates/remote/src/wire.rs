//! The object-drive protocol's messages: a request names a drive and carries one command (paper 003's
//! commands: snapshot reads, staging, transactions), plus the snapshots and staged units the client let
//! go of since its last request (released in passing, not by calls of their own). Bodies are bincode in
//! a `Kind::Drive` frame (versioned, checksummed); the bulk bytes of staging and of a read travel as the
//! frame's payload, after the bincode, so neither side copies them into or out of the encoding.

use bytes::Bytes;
use mosaic_cluster::capability::{Capability, Ops};
use mosaic_store::{Geometry, NameEntry, ObjectInfo, Outcome, StoreError, Txn};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// The path drive requests are posted to.
pub const PATH: &str = "/drive/call";

/// A server-side snapshot, named by the server.
pub type SnapshotId = u64;
/// Units staged on the server and not yet committed, named by the server.
pub type StagedId = u64;
/// A collection as the drive names it.
pub type Coll = u32;
/// An object as the drive names it within a snapshot.
pub type Obj = u64;

#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub drive: String,
    /// The caller's view of the cluster, for the drive's node to refuse a stale one (`DriveServer`'s
    /// fence); None from callers outside a cluster map (tests, benchmarks), which a fenced server refuses.
    pub fence: Option<Fence>,
    /// What the command may reach on the drive, signed by the cluster (paper 003); None from callers
    /// outside a cluster, which a guarded server refuses.
    pub capability: Option<Capability>,
    /// Work a client waits for (`mosaic_store::in_foreground`): the drive's node counts it as foreground
    /// work, which its own background work waits for (`mosaic_store::ForegroundWork`).
    pub foreground: bool,
    /// The IO share the command runs in on the drive's node (`mosaic_store::io_share`: the caller's
    /// microstore's, the same id on every node; `UNSHARED` for work of none).
    pub io_share: mosaic_store::ShareId,
    pub release_snapshots: Vec<SnapshotId>,
    pub release_staged: Vec<StagedId>,
    pub command: Command,
}

/// What a caller's request was planned from: its node, the epochs of the map it composed its store from,
/// and, for a placement group's command, that group's placement as the caller's map has it. A drive's node
/// whose map is newer refuses a request from a node it marks down or does not know, and one whose group
/// placement differs from its own: the caller would read or write a set the group no longer uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub node: u64,
    pub epoch: u64,
    pub placement_epoch: u64,
    pub group: Option<GroupPlacement>,
}

/// One placement group as a map places it: the set it is served from and, while it moves, the slots the
/// step keeps (both change the drives a write must reach).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlacement {
    pub pg: u32,
    pub served: Vec<u32>,
    pub kept: Option<u16>,
}

/// A read within a snapshot: `None` opens a new one on the server (its id comes back with the answer).
#[derive(Debug, Serialize, Deserialize)]
pub enum Command {
    Hello,
    Collection {
        snapshot: Option<SnapshotId>,
        name: String,
    },
    Collections {
        snapshot: Option<SnapshotId>,
        prefix: String,
        limit: u64,
    },
    Lookup {
        snapshot: Option<SnapshotId>,
        coll: Coll,
        name: ByteBuf,
    },
    Attr {
        snapshot: Option<SnapshotId>,
        obj: Obj,
        key: ByteBuf,
    },
    Attrs {
        snapshot: Option<SnapshotId>,
        obj: Obj,
        start_after: ByteBuf,
        limit: u64,
    },
    ListEntries {
        snapshot: Option<SnapshotId>,
        coll: Coll,
        prefix: ByteBuf,
        from: ByteBuf,
        limit: u64,
    },
    StatMany {
        snapshot: Option<SnapshotId>,
        objs: Vec<Obj>,
        attr_key: ByteBuf,
    },
    Read {
        snapshot: Option<SnapshotId>,
        obj: Obj,
        offset: u64,
        len: u64,
    },
    Prioritize {
        snapshot: Option<SnapshotId>,
    },
    /// Units to stage: the request's payload (`data` is filled from it and never encoded).
    Stage {
        hint: ByteBuf,
        #[serde(skip)]
        data: Bytes,
    },
    Commit {
        txn: Txn<Coll, StagedId>,
    },
    Release,
}

impl Command {
    /// The operations a capability must allow for this command (None: a release, always served).
    pub fn ops(&self) -> Option<Ops> {
        Some(match self {
            Command::Hello => Ops::CONNECT,
            Command::Stage { .. } => Ops::STAGE,
            Command::Commit { .. } => Ops::COMMIT,
            Command::Release => return None,
            _ => Ops::READ,
        })
    }

    /// The snapshot a read names (`Some(None)`: a read that opens one), or None for other commands.
    pub fn snapshot(&self) -> Option<Option<SnapshotId>> {
        match self {
            Command::Collection { snapshot, .. }
            | Command::Collections { snapshot, .. }
            | Command::Lookup { snapshot, .. }
            | Command::Attr { snapshot, .. }
            | Command::Attrs { snapshot, .. }
            | Command::ListEntries { snapshot, .. }
            | Command::StatMany { snapshot, .. }
            | Command::Read { snapshot, .. }
            | Command::Prioritize { snapshot } => Some(*snapshot),
            Command::Hello | Command::Stage { .. } | Command::Commit { .. } | Command::Release => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Answer {
    Hello {
        geometry: Geometry,
        ready: bool,
    },
    Collection(Option<Coll>),
    Collections(Vec<(String, Coll)>),
    Lookup(Option<Found>),
    Attr(Option<ByteBuf>),
    Attrs(Vec<(ByteBuf, ByteBuf)>),
    Entries(Vec<NameEntry<Obj>>),
    Stats(Vec<(ObjectInfo<Obj>, Option<ByteBuf>)>),
    /// A read's bytes: the reply's payload (`bytes` is filled from it and never encoded).
    Data {
        #[serde(skip)]
        bytes: Bytes,
    },
    Staged {
        id: StagedId,
        len_bytes: u64,
    },
    Committed(Outcome),
    Done,
}

/// An object a lookup found, with what a read of it asks next when that is small: all its attributes,
/// and its bytes when it is small (one request instead of one per store call).
#[derive(Debug, Serialize, Deserialize)]
pub struct Found {
    pub info: ObjectInfo<Obj>,
    /// Every attribute, when they fit the prefetch limit; None when they do not.
    pub attrs: Option<Vec<(ByteBuf, ByteBuf)>>,
    /// The whole object, when it fits the prefetch limit.
    pub data: Option<ByteBuf>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    /// The snapshot a read opened.
    pub opened: Option<SnapshotId>,
    pub answer: Result<Answer, StoreError>,
}

impl Request {
    /// The bytes that travel as the request's payload (taken out of the command).
    pub fn take_payload(&mut self) -> Bytes {
        match &mut self.command {
            Command::Stage { data, .. } => std::mem::take(data),
            _ => Bytes::new(),
        }
    }

    /// Puts a received payload back where the command takes it; a payload the command does not take is
    /// refused.
    pub fn put_payload(&mut self, payload: Bytes) -> Result<(), String> {
        match &mut self.command {
            Command::Stage { data, .. } => *data = payload,
            _ if payload.is_empty() => {}
            _ => return Err(format!("a drive request with {} bytes its command does not take", payload.len())),
        }
        Ok(())
    }
}

impl Reply {
    /// The bytes that travel as the reply's payload (taken out of the answer).
    pub fn take_payload(&mut self) -> Bytes {
        match &mut self.answer {
            Ok(Answer::Data { bytes }) => std::mem::take(bytes),
            _ => Bytes::new(),
        }
    }

    /// Puts a received payload back where the answer takes it; a payload the answer does not take is
    /// refused.
    pub fn put_payload(&mut self, payload: Bytes) -> Result<(), String> {
        match &mut self.answer {
            Ok(Answer::Data { bytes }) => *bytes = payload,
            _ if payload.is_empty() => {}
            _ => return Err(format!("a drive reply with {} bytes its answer does not take", payload.len())),
        }
        Ok(())
    }
}
