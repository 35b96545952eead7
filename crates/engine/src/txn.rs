//! Transactions: an ordered list of operations applied atomically and durably by `Engine::submit`.

use crate::alloc::{Allocator, Extent};
use crate::keys::{CollectionId, Nid};
use parking_lot::Mutex;
use std::sync::Arc;

pub use crate::qos::Priority;

/// Whole blocks already written to fresh device blocks by `Engine::stage`, not yet referenced by any
/// metadata. Committing a `WriteStaged` op references them; dropping the transaction frees them. Either
/// way they are released exactly once (`released` is set once, by the commit that references them).
pub struct Staged {
    pub(crate) extents: Vec<Extent>,
    pub(crate) crcs: Vec<u32>,
    pub(crate) len_bytes: u64,
    /// True once the blocks belong to committed metadata or went back to the allocator.
    pub(crate) released: bool,
    pub(crate) alloc: Arc<Mutex<Allocator>>,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged").field("extents", &self.extents).field("len_bytes", &self.len_bytes).finish()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Never referenced by durable metadata: the blocks can be reused at once.
        if !self.released {
            let mut a = self.alloc.lock();
            for e in &self.extents {
                a.release(*e);
            }
        }
    }
}

impl Staged {
    pub(crate) fn new(extents: Vec<Extent>, crcs: Vec<u32>, len_bytes: u64, alloc: Arc<Mutex<Allocator>>) -> Self {
        debug_assert_eq!(extents.iter().map(|e| e.len).sum::<u64>() * crate::superblock::BLOCK_SIZE_BYTES, len_bytes);
        debug_assert_eq!(crcs.len() as u64, len_bytes / crate::superblock::BLOCK_SIZE_BYTES);
        Staged { extents, crcs, len_bytes, released: false, alloc }
    }

    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// The blocks now belong to committed metadata: dropping this gives nothing back.
    pub(crate) fn mark_referenced(&mut self) {
        assert!(!self.released, "staged blocks are released exactly once");
        self.released = true;
    }
}

#[derive(Debug)]
pub enum Op {
    CreateCollection {
        name: String,
    },
    RemoveCollection {
        name: String,
    },
    /// Creates an empty object; fails with AlreadyExists if the name is taken.
    Create {
        coll: CollectionId,
        name: Vec<u8>,
    },
    /// Removes the object if it exists and creates an empty one in its place.
    Reset {
        coll: CollectionId,
        name: Vec<u8>,
    },
    /// Writes bytes at an offset, creating the object if needed.
    Write {
        coll: CollectionId,
        name: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// References staged whole blocks at a block-aligned offset, creating the object if needed.
    WriteStaged {
        coll: CollectionId,
        name: Vec<u8>,
        offset: u64,
        staged: Staged,
    },
    /// Appends at the end; with `expected_offset`, fails with OffsetMismatch unless it equals the size.
    Append {
        coll: CollectionId,
        name: Vec<u8>,
        data: Vec<u8>,
        expected_offset: Option<u64>,
    },
    Truncate {
        coll: CollectionId,
        name: Vec<u8>,
        size_bytes: u64,
    },
    /// Removes an object; NotFound if it does not exist.
    Remove {
        coll: CollectionId,
        name: Vec<u8>,
    },
    /// Renames, replacing any object at the destination.
    Rename {
        coll: CollectionId,
        from: Vec<u8>,
        to_coll: CollectionId,
        to: Vec<u8>,
    },
    /// Clones the whole object (data blocks shared, copy-on-write), replacing the destination.
    Clone {
        coll: CollectionId,
        from: Vec<u8>,
        to_coll: CollectionId,
        to: Vec<u8>,
    },
    /// Shares `len` bytes of `src` at `dst_offset` in `dst`. Offsets must be block-aligned; a length that is
    /// not a multiple of the block size is allowed only when it reaches the end of `src`.
    CloneRange {
        src_coll: CollectionId,
        src: Vec<u8>,
        src_offset: u64,
        len: u64,
        dst_coll: CollectionId,
        dst: Vec<u8>,
        dst_offset: u64,
    },
    SetAttr {
        coll: CollectionId,
        name: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveAttr {
        coll: CollectionId,
        name: Vec<u8>,
        key: Vec<u8>,
    },
    OmapSet {
        coll: CollectionId,
        name: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    OmapRemove {
        coll: CollectionId,
        name: Vec<u8>,
        key: Vec<u8>,
    },
    /// Sets the listing tag of an object's name entry (at most `MAX_NAME_TAG_BYTES`): bytes the caller owns,
    /// returned by `Reader::list_entries` with the name. The engine keeps it across renames and drops it
    /// with the name (remove, reset); the caller keeps it current when the object changes.
    SetNameTag {
        coll: CollectionId,
        name: Vec<u8>,
        tag: Vec<u8>,
    },
    /// Marks an object high-priority: its reads and writes run in the ForegroundHigh class.
    SetPriority {
        coll: CollectionId,
        name: Vec<u8>,
        high: bool,
    },
    /// Fails the transaction with AssertionFailed unless the attribute equals `expected` (None: the object
    /// or the attribute must not exist). Makes conditional writes atomic.
    AssertAttr {
        coll: CollectionId,
        name: Vec<u8>,
        key: Vec<u8>,
        expected: Option<Vec<u8>>,
    },
    /// Fails the transaction with AssertionFailed unless the object exists.
    AssertExists {
        coll: CollectionId,
        name: Vec<u8>,
    },
    /// Lazy sync: merges one block's fragments into a fresh block (in the committer).
    MergeBlock {
        nid: Nid,
        lblock: u64,
    },
    /// Lazy sync, prepared outside the committer: blocks merged from a snapshot and already written to
    /// `staged` (block i of `blocks` is the i-th staged block). Each is installed only if its base block
    /// and fragments are still those it was merged from; otherwise its staged block is freed.
    InstallMerged {
        staged: Staged,
        blocks: Vec<MergedBlock>,
    },
}

impl Op {
    /// The operation's name, for errors and logs.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::CreateCollection { .. } => "create-collection",
            Op::RemoveCollection { .. } => "remove-collection",
            Op::Create { .. } => "create",
            Op::Reset { .. } => "reset",
            Op::Write { .. } => "write",
            Op::WriteStaged { .. } => "write-staged",
            Op::Append { .. } => "append",
            Op::Truncate { .. } => "truncate",
            Op::Remove { .. } => "remove",
            Op::Rename { .. } => "rename",
            Op::Clone { .. } => "clone",
            Op::CloneRange { .. } => "clone-range",
            Op::SetAttr { .. } => "set-attr",
            Op::RemoveAttr { .. } => "remove-attr",
            Op::OmapSet { .. } => "omap-set",
            Op::OmapRemove { .. } => "omap-remove",
            Op::SetNameTag { .. } => "set-name-tag",
            Op::SetPriority { .. } => "set-priority",
            Op::AssertAttr { .. } => "assert-attr",
            Op::AssertExists { .. } => "assert-exists",
            Op::MergeBlock { .. } => "merge-block",
            Op::InstallMerged { .. } => "install-merged",
        }
    }
}

/// One block merged by lazy sync from a snapshot (see `Op::InstallMerged`).
#[derive(Debug)]
pub struct MergedBlock {
    pub(crate) nid: Nid,
    pub(crate) lblock: u64,
    pub(crate) crc32c: u32,
    pub(crate) expected_base: Option<u64>,
    pub(crate) frag_keys: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
pub struct Transaction {
    pub ops: Vec<Op>,
    pub priority: Option<Priority>,
}

impl Transaction {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_priority(mut self, p: Priority) -> Self {
        self.priority = Some(p);
        self
    }

    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }

    pub fn op(mut self, op: Op) -> Self {
        self.ops.push(op);
        self
    }

    /// Whether the transaction references blocks written before it was submitted (which the commit
    /// pipeline must flush to the device before the batch that references them).
    pub(crate) fn has_staged_data(&self) -> bool {
        self.ops.iter().any(|op| matches!(op, Op::WriteStaged { .. } | Op::InstallMerged { .. }))
    }
}

/// What a committed transaction reports back.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Ids of collections created by the transaction, in op order.
    pub created_collections: Vec<CollectionId>,
    /// Size of each object after the last op that touched it, in op order of the appends.
    pub append_sizes: Vec<u64>,
}
