//! Encryption at rest, below the S3 semantics and above nothing: how an encrypted stream is laid out, how
//! an object's key is sealed, and the master keys that seal it. No I/O and no async here; the layer
//! applies it to bodies as they stream.
//!
//! Key hierarchy (each object, even of the same key name, has a fresh random object key):
//!
//! ```text
//! master key (id n, 32 bytes, kept in the data directory or given in the config)
//!   -> key-encryption key (HMAC-SHA256 of the master with a label: SSE-S3, or SSE-KMS and the key id)
//! customer key (SSE-C, given with each request, never stored)
//!   -> key-encryption key (HMAC-SHA256 with the SSE-C label)
//! key-encryption key seals the object key (AES-256-GCM, random nonce)
//! object key + a random salt per stream (a simple PUT, or one multipart part) -> stream key
//! stream key encrypts the stream in packages
//! ```
//!
//! A stream is cut into packages of [`PACKAGE_PLAIN_BYTES`] plaintext (the last one shorter, an empty
//! stream one empty package); each is stored as its ciphertext followed by a 16-byte tag. The nonce of a
//! package is its index and whether it is the last, so packages cannot be reordered, dropped or cut off
//! without the tag failing; a stream key is used for one stream only, so no nonce repeats under a key.
//! A range of plaintext maps to whole packages, which is what ranged GETs read.

mod keys;
mod package;

pub use keys::{Key, MasterKeys, SEALED_KEY_BYTES, open_key, seal_key};
pub use package::{
    PACKAGE_PLAIN_BYTES, PACKAGE_STORED_BYTES, SALT_BYTES, StreamKey, TAG_BYTES, package_count, stored_len,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptError {
    /// A tag did not verify: the key is not the one the data was sealed with, or the data is damaged.
    #[error("authentication failed: wrong key or damaged data")]
    Authentication,
    #[error("unknown sealed key format version {0}")]
    UnknownVersion(u8),
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("no random numbers from the system")]
    Random,
}

pub type CryptResult<T> = Result<T, CryptError>;
