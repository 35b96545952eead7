//! Errors of a store, in storage terms. A failed transaction says which of its operations failed, so
//! that its user maps the error by what that operation meant (an `AssertExists` on an upload record that
//! fails is "no such upload"), never by guessing from the error alone.

/// What went wrong, as a caller can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ErrorKind {
    /// The object an operation names does not exist.
    NotFound,
    /// `Create` of a name that is taken.
    AlreadyExists,
    CollectionNotFound,
    CollectionExists,
    CollectionNotEmpty,
    /// An `AssertAttr` or `AssertExists` did not hold.
    AssertionFailed,
    /// An `Append` whose expected offset is not the object's size.
    OffsetMismatch,
    /// No room for the data.
    NoSpace,
    /// The store cannot serve this now: a drive is read-only or gone, too few drives answer, shutting down.
    Unavailable,
    /// Stored data or metadata failed its checksum or cannot be decoded.
    Corrupt,
    /// A size or count limit was exceeded.
    Limit,
    /// The request itself is invalid (misaligned staging, a reserved name).
    InvalidArgument,
    /// A bug or an unexpected failure below.
    Internal,
    /// The store is being replaced by a newer one that must make this write (a cluster group's step is
    /// switched): nothing of the transaction was done, and the same call through the newer store may be
    /// made.
    /// Last, so that the kinds before keep their numbers on the wire (the drive protocol encodes a kind
    /// by its position); never sent between nodes: only the node that writes refuses with it.
    Switching,
}

/// A store error: its kind, the index of the failed operation in its transaction (when one failed), and a
/// message for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StoreError {
    pub kind: ErrorKind,
    pub op_index: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op_index {
            Some(i) => write!(f, "operation {i}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl StoreError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        StoreError { kind, op_index: None, message: message.into() }
    }

    /// The same error, attributed to operation `index` of its transaction.
    pub fn in_op(mut self, index: usize) -> Self {
        self.op_index = Some(index);
        self
    }

    /// Whether operation `index` failed with `kind`.
    pub fn is_op(&self, index: usize, kind: ErrorKind) -> bool {
        self.op_index == Some(index) && self.kind == kind
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_its_operation() {
        let e = StoreError::not_found("no object b/k").in_op(3);
        assert_eq!(e.to_string(), "operation 3: no object b/k");
        assert!(e.is_op(3, ErrorKind::NotFound));
        assert!(!e.is_op(2, ErrorKind::NotFound) && !e.is_op(3, ErrorKind::Corrupt));
        assert_eq!(StoreError::corrupt("x").to_string(), "x");
    }
}
