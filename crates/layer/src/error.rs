//! Errors of the object layer, in storage terms; the frontend maps each to its S3 code.

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LayerError {
    #[error("the bucket does not exist")]
    NoSuchBucket,
    #[error("the bucket already exists")]
    BucketExists,
    #[error("the bucket is not empty")]
    BucketNotEmpty,
    #[error("invalid bucket name: {0}")]
    InvalidBucketName(String),
    #[error("the key does not exist")]
    NoSuchKey,
    #[error("invalid key: {0}")]
    InvalidKey(String),
    #[error("the key is longer than 1024 bytes")]
    KeyTooLong,
    #[error("user metadata is larger than 2 KiB")]
    MetadataTooLarge,
    #[error("the upload does not exist")]
    NoSuchUpload,
    #[error("a part is missing or its ETag does not match: {0}")]
    InvalidPart(String),
    #[error("parts are not in ascending order")]
    InvalidPartOrder,
    #[error("a part other than the last is smaller than 5 MiB")]
    EntityTooSmall,
    #[error("the object is larger than allowed")]
    EntityTooLarge,
    #[error("a precondition failed")]
    PreconditionFailed,
    #[error("the object changed while a conditional write was checked; fetch its ETag and retry")]
    ConditionalConflict,
    #[error("not modified")]
    NotModified,
    #[error("the range is not satisfiable")]
    InvalidRange,
    #[error("the write offset does not match the object size")]
    InvalidWriteOffset,
    #[error("the body does not match its digest: {0}")]
    BadDigest(String),
    #[error("the request body ended early or failed: {0}")]
    IncompleteBody(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("the drive is full")]
    StorageFull,
    #[error("the drive is read-only or unavailable: {0}")]
    Unavailable(String),
    /// Refused before anything was done because the store serving it is being replaced: the same call
    /// on the next store may succeed (a `Switch` makes it there).
    #[error("the store is being switched: {0}")]
    Switching(String),
    #[error("stored data is damaged: {0}")]
    Corrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("a conflicting operation is in progress")]
    Conflict,
    #[error("the version does not exist")]
    NoSuchVersion,
    /// The key's current version is a delete marker (GET/HEAD without a version id: 404), or the version
    /// named is one (405).
    #[error("the version is a delete marker")]
    DeleteMarker { version_id: Option<String>, named: bool },
    #[error("malformed request: {0}")]
    MalformedXml(String),
    #[error("the retention period is out of range")]
    InvalidRetentionPeriod,
    #[error("the version is locked: {0}")]
    ObjectLocked(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the bucket cannot do this in its state: {0}")]
    InvalidBucketState(String),
    #[error("invalid tag: {0}")]
    InvalidTag(String),
    #[error("the part number is past the object's last part")]
    InvalidPartNumber,
    #[error("the KMS key {0} does not exist")]
    KmsKeyNotFound(String),
}

pub type LayerResult<T> = Result<T, LayerError>;
