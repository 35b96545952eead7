//! Transactions: the operations a store applies atomically and durably, in order. `C` is the store's
//! collection handle and `S` its staged data (see [`crate::Store`]).

/// Scheduling class of a transaction (paper 003's QoS): higher classes are committed first, and background
/// work takes a bounded share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Background,
    Foreground,
    ForegroundHigh,
}

#[derive(Debug)]
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
pub struct Outcome {
    /// Sizes of the objects after each `Append`, in op order.
    pub append_sizes: Vec<u64>,
}
