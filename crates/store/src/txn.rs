//! Transactions: the operations a store applies atomically and durably, in order. `C` is the store's
//! collection handle and `S` its staged data (see [`crate::Store`]).

/// Scheduling class of a transaction (paper 003's QoS): higher classes are committed first, and background
/// work takes a bounded share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Priority {
    Background,
    Foreground,
    ForegroundHigh,
}

#[derive(Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Op<C, S> {
    /// Creates a collection; fails with `CollectionExists` if the name is taken.
    CreateCollection {
        name: String,
    },
    /// Removes an empty collection.
    RemoveCollection {
        name: String,
    },
    /// Creates an empty object; fails with `AlreadyExists` if the name is taken.
    Create {
        coll: C,
        name: Vec<u8>,
    },
    /// Removes the object if it exists and creates an empty one in its place.
    Reset {
        coll: C,
        name: Vec<u8>,
    },
    /// Writes bytes at an offset (at most `Geometry::max_op_data_bytes`), creating the object if needed.
    Write {
        coll: C,
        name: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// References staged units at an offset that is a multiple of `Geometry::unit_bytes`, creating the
    /// object if needed.
    WriteStaged {
        coll: C,
        name: Vec<u8>,
        offset: u64,
        staged: S,
    },
    /// Appends at the end; with `expected_offset`, fails with `OffsetMismatch` unless it equals the size.
    Append {
        coll: C,
        name: Vec<u8>,
        data: Vec<u8>,
        expected_offset: Option<u64>,
    },
    /// Removes an object; `NotFound` if it does not exist.
    Remove {
        coll: C,
        name: Vec<u8>,
    },
    /// Renames an object, replacing any object at the destination (attributes and name tag move with it).
    /// An erasure set renames within one collection, before any other change to the source or the
    /// destination in the transaction, and the destination takes no change after it (a clone may read it).
    Rename {
        coll: C,
        from: Vec<u8>,
        to_coll: C,
        to: Vec<u8>,
    },
    /// Sets an object's size: bytes past it are dropped, bytes gained read as zeros.
    Truncate {
        coll: C,
        name: Vec<u8>,
        size_bytes: u64,
    },
    /// Clones a whole object (data shared, copy-on-write), replacing the destination.
    Clone {
        coll: C,
        from: Vec<u8>,
        to_coll: C,
        to: Vec<u8>,
    },
    /// Shares `len` bytes of `src` at `dst_offset` in `dst`. Offsets are multiples of `unit_bytes`; a
    /// length that is not is allowed only when it reaches the end of `src` and of `dst`.
    CloneRange {
        src_coll: C,
        src: Vec<u8>,
        src_offset: u64,
        len: u64,
        dst_coll: C,
        dst: Vec<u8>,
        dst_offset: u64,
    },
    SetAttr {
        coll: C,
        name: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveAttr {
        coll: C,
        name: Vec<u8>,
        key: Vec<u8>,
    },
    /// Sets the listing tag of the object's name entry: bytes the caller owns, returned with the name by
    /// `Snapshot::list_entries`, dropped with the name.
    SetNameTag {
        coll: C,
        name: Vec<u8>,
        tag: Vec<u8>,
    },
    /// Marks an object high-priority: its reads and writes run in the foreground-high class.
    SetPriority {
        coll: C,
        name: Vec<u8>,
        high: bool,
    },
    /// Fails the transaction with `AssertionFailed` unless the attribute equals `expected` (None: the
    /// object or the attribute must not exist). Makes conditional writes atomic.
    AssertAttr {
        coll: C,
        name: Vec<u8>,
        key: Vec<u8>,
        expected: Option<Vec<u8>>,
    },
    /// Fails the transaction with `AssertionFailed` unless the object exists.
    AssertExists {
        coll: C,
        name: Vec<u8>,
    },
}

impl<C, S> Op<C, S> {
    /// The same operation with its collections and staged units translated (as a store that forwards
    /// operations to another store names them there); the first translation that fails is the error.
    pub fn try_map<C2, S2, E>(
        self,
        mut coll: impl FnMut(C) -> Result<C2, E>,
        staged: impl FnOnce(S) -> Result<S2, E>,
    ) -> Result<Op<C2, S2>, E> {
        Ok(match self {
            Op::CreateCollection { name } => Op::CreateCollection { name },
            Op::RemoveCollection { name } => Op::RemoveCollection { name },
            Op::Create { coll: c, name } => Op::Create { coll: coll(c)?, name },
            Op::Reset { coll: c, name } => Op::Reset { coll: coll(c)?, name },
            Op::Write { coll: c, name, offset, data } => Op::Write { coll: coll(c)?, name, offset, data },
            Op::WriteStaged { coll: c, name, offset, staged: st } => {
                Op::WriteStaged { coll: coll(c)?, name, offset, staged: staged(st)? }
            }
            Op::Append { coll: c, name, data, expected_offset } => {
                Op::Append { coll: coll(c)?, name, data, expected_offset }
            }
            Op::Remove { coll: c, name } => Op::Remove { coll: coll(c)?, name },
            Op::Rename { coll: c, from, to_coll, to } => {
                Op::Rename { coll: coll(c)?, from, to_coll: coll(to_coll)?, to }
            }
            Op::Truncate { coll: c, name, size_bytes } => Op::Truncate { coll: coll(c)?, name, size_bytes },
            Op::Clone { coll: c, from, to_coll, to } => Op::Clone { coll: coll(c)?, from, to_coll: coll(to_coll)?, to },
            Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => Op::CloneRange {
                src_coll: coll(src_coll)?,
                src,
                src_offset,
                len,
                dst_coll: coll(dst_coll)?,
                dst,
                dst_offset,
            },
            Op::SetAttr { coll: c, name, key, value } => Op::SetAttr { coll: coll(c)?, name, key, value },
            Op::RemoveAttr { coll: c, name, key } => Op::RemoveAttr { coll: coll(c)?, name, key },
            Op::SetNameTag { coll: c, name, tag } => Op::SetNameTag { coll: coll(c)?, name, tag },
            Op::SetPriority { coll: c, name, high } => Op::SetPriority { coll: coll(c)?, name, high },
            Op::AssertAttr { coll: c, name, key, expected } => Op::AssertAttr { coll: coll(c)?, name, key, expected },
            Op::AssertExists { coll: c, name } => Op::AssertExists { coll: coll(c)?, name },
        })
    }

    /// The objects the operation names, with their collections: both of a rename or a clone (source
    /// first), none of a collection change.
    pub fn named_objects(&self) -> Vec<(&C, &[u8])> {
        match self {
            Op::CreateCollection { .. } | Op::RemoveCollection { .. } => Vec::new(),
            Op::Create { coll, name }
            | Op::Reset { coll, name }
            | Op::Write { coll, name, .. }
            | Op::WriteStaged { coll, name, .. }
            | Op::Append { coll, name, .. }
            | Op::Remove { coll, name }
            | Op::Truncate { coll, name, .. }
            | Op::SetAttr { coll, name, .. }
            | Op::RemoveAttr { coll, name, .. }
            | Op::SetNameTag { coll, name, .. }
            | Op::SetPriority { coll, name, .. }
            | Op::AssertAttr { coll, name, .. }
            | Op::AssertExists { coll, name } => vec![(coll, name.as_slice())],
            Op::Rename { coll, from, to_coll, to } | Op::Clone { coll, from, to_coll, to } => {
                vec![(coll, from.as_slice()), (to_coll, to.as_slice())]
            }
            Op::CloneRange { src_coll, src, dst_coll, dst, .. } => {
                vec![(src_coll, src.as_slice()), (dst_coll, dst.as_slice())]
            }
        }
    }

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
            Op::Remove { .. } => "remove",
            Op::Rename { .. } => "rename",
            Op::Truncate { .. } => "truncate",
            Op::Clone { .. } => "clone",
            Op::CloneRange { .. } => "clone-range",
            Op::SetAttr { .. } => "set-attr",
            Op::RemoveAttr { .. } => "remove-attr",
            Op::SetNameTag { .. } => "set-name-tag",
            Op::SetPriority { .. } => "set-priority",
            Op::AssertAttr { .. } => "assert-attr",
            Op::AssertExists { .. } => "assert-exists",
        }
    }
}

/// Operations applied atomically: all of them or none.
#[derive(Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Txn<C, S> {
    pub ops: Vec<Op<C, S>>,
    /// None: foreground, or foreground-high when the transaction marks an object high-priority.
    pub priority: Option<Priority>,
}

impl<C, S> Default for Txn<C, S> {
    fn default() -> Self {
        Txn { ops: Vec::new(), priority: None }
    }
}

impl<C, S> Txn<C, S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an operation; returns its index (what an error of this operation carries).
    pub fn push(&mut self, op: Op<C, S>) -> usize {
        self.ops.push(op);
        self.ops.len() - 1
    }

    pub fn op(mut self, op: Op<C, S>) -> Self {
        self.ops.push(op);
        self
    }

    pub fn with_priority(mut self, p: Priority) -> Self {
        self.priority = Some(p);
        self
    }
}

/// What a committed transaction reports back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Outcome {
    /// Sizes of the objects after each `Append`, in op order.
    pub append_sizes: Vec<u64>,
}
