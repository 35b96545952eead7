//! Engine errors. Operating conditions (full device, missing object) are values a caller can act on;
//! corruption and IO failure are reported with enough context to find the damaged object.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("device IO failed: {0}")]
    Io(#[from] io::Error),
    #[error("metadata store failed: {0}")]
    Kv(String),
    #[error("no space left on the data device ({needed_blocks} blocks needed, {free_blocks} free)")]
    NoSpace { needed_blocks: u64, free_blocks: u64 },
    #[error("object not found")]
    NotFound,
    #[error("object already exists")]
    AlreadyExists,
    #[error("collection not found: {0}")]
    CollectionNotFound(String),
    #[error("collection already exists: {0}")]
    CollectionExists(String),
    #[error("collection is not empty: {0}")]
    CollectionNotEmpty(String),
    #[error("append offset {expected} does not match the object size {actual}")]
    OffsetMismatch { expected: u64, actual: u64 },
    #[error("a transaction's assertion did not hold")]
    AssertionFailed,
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("checksum mismatch in object {object} at logical block {block} (physical block {physical})")]
    Checksum { object: String, block: u64, physical: u64 },
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    #[error("the drive is read-only after an earlier failure: {0}")]
    ReadOnly(String),
    #[error("the data directory is not a Mosaic drive: {0}")]
    NotADrive(String),
    #[error("unsupported format version {found} (this build reads {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// Operation `index` (of kind `op`) of a transaction failed; nothing of the transaction was applied.
    #[error("operation {index} ({op}): {source}")]
    Op { index: usize, op: &'static str, source: Box<EngineError> },
}

impl EngineError {
    /// `e`, attributed to operation `index` of its transaction.
    pub(crate) fn in_op(index: usize, op: &'static str, e: EngineError) -> EngineError {
        match e {
            already @ EngineError::Op { .. } => already,
            e => EngineError::Op { index, op, source: Box::new(e) },
        }
    }

    /// The error itself, without the operation it happened in.
    pub fn cause(&self) -> &EngineError {
        match self {
            EngineError::Op { source, .. } => source,
            e => e,
        }
    }

    /// The index of the operation that failed, for an error of a transaction's operation.
    pub fn op_index(&self) -> Option<usize> {
        match self {
            EngineError::Op { index, .. } => Some(*index),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl From<rocksdb::Error> for EngineError {
    fn from(e: rocksdb::Error) -> Self {
        EngineError::Kv(e.into_string())
    }
}
