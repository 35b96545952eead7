//! The Mosaic engine: one object drive in user space (DESIGN.md section 3; papers 000, 001 and 003).
//!
//! It owns one data device and its metadata database. Objects live in collections; every change is a
//! [`Transaction`] applied atomically and durably by [`Engine::submit`], group-committed with one device
//! flush and one WAL sync per batch. Whole blocks are written copy-on-write to fresh blocks; pieces inside
//! a block go to the fragment log in the KV store with no read, and lazy sync merges them in the
//! background. Every block carries a crc32c checked on every read.
//!
//! The engine knows nothing of S3, HTTP, buckets or users: names are bytes, attributes are bytes.

mod aligned;
mod alloc;
mod checksum;
mod device;
mod engine;
mod error;
mod keys;
mod kv;
mod meta_cache;
mod overlay;
mod page_cache;
mod plan;
mod qos;
mod reader;
mod scrubber;
mod stats;
mod superblock;
mod txn;
mod uring;
mod verify;

pub use aligned::{AlignedBuf, IO_ALIGN_BYTES};
pub use alloc::LARGE_RUN_BLOCKS;
pub use checksum::crc32c;
pub use device::{CrashMode, Device, FileDevice, IoEngine, SimDevice, VolatileCacheDevice};
pub use engine::{BLOCK_SIZE_BYTES, BlockMapSize, Engine, EngineConfig, MAX_OBJECT_BYTES, WriteMode};
pub use error::{EngineError, Result};
pub use keys::{CollectionId, MAX_RUN_BLOCKS, Nid, prefix_end};
pub use plan::{MAX_ATTR_KEY_BYTES, MAX_ATTR_VALUE_BYTES, MAX_NAME_BYTES, MAX_NAME_TAG_BYTES};
pub use qos::PriorityGuard;
pub use reader::{NameEntry, ObjectInfo, Reader};
pub use scrubber::ScrubStatus;
pub use stats::EngineStats;
pub use superblock::{FORMAT_VERSION, Superblock};
pub use txn::{Op, Outcome, Priority, Staged, Transaction};
pub use verify::{CheckReport, ScrubReport};

/// The decoders of every on-disk record, for the fuzz targets in `fuzz/`. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::keys::{
        BlockEntry, BlockRun, Onode, decode_frag, decode_name_entry, encode_frag, encode_name_entry,
    };
    pub use crate::superblock::Superblock;
}
