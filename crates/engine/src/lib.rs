//! The Mosaic engine: one object drive in user space (DESIGN.md section 3; papers 000, 001 and 003).
//!
//! It owns one data device and its metadata database. Objects live in collections; every change is a
//! [`Transaction`] applied atomically and durably by [`Engine::submit`], group-committed with one device
//! flush and one WAL sync per batch. Whole blocks are written copy-on-write to fresh blocks; pieces inside
//! a block go to the fragment log in the KV store with no read, and lazy sync merges them in the
//! background. Every block carries a crc32c checked on every read.
//!
//! The engine knows nothing of S3, HTTP, buckets or users: names are bytes, attributes are bytes.
//!
//! Its modules form a one-way stack; each uses only the layers below it (`tests::layers` checks this):
//!
//! 0. `error`, `checksum`
//! 1. leaves: `stats` (counters), `qos` (classes, the prioritized-work gate), `superblock`, `keys`
//!    (record encodings), `config`
//! 2. devices: `uring`, `device`, `mapped` (page-cache ranges pinned and mapped for large reads)
//! 3. block IO with checksum verification: `blockio`, `verified` (large reads kept verified and pinned)
//! 4. state: `kv`, `overlay`, `meta_cache`, `page_cache`, `alloc`, `space`, `frag_index`, `core`,
//!    `blockmap` (one object's runs, read the same way from a snapshot or a planning view), and
//!    `txn` (operations; staged blocks go back to the allocator when dropped)
//! 5. planning and reading: `plan`, `reader`
//! 6. the commit pipeline and lazy sync (`commit`), verification (`verify`), the background scrub
//!    (`scrubber`)
//! 7. the facade: `engine`

mod alloc;
mod blockio;
mod blockmap;
mod checksum;
mod commit;
mod config;
mod core;
mod device;
mod engine;
mod error;
mod frag_index;
mod ioprio;
pub use ioprio::{set_background_io_idle, with_thread_ioprio};
mod keys;
mod kv;
pub use kv::KvMemory;
mod mapped;
pub use mapped::{PINNED_MAX_BYTES, PINNED_MAX_RANGES, pinned_bytes};
mod meta_cache;
mod overlay;
mod page_cache;
mod plan;
mod qos;
mod reader;
mod scrubber;
mod shares;
mod space;
mod stats;
mod superblock;
mod txn;
mod uring;
mod verified;
mod verify;

pub use alloc::LARGE_RUN_BLOCKS;
pub use checksum::crc32c;
pub use commit::MAX_TXN_OPS;
pub use config::{EngineConfig, WriteMode};
pub use device::{
    CrashMode, Device, DeviceFault, FaultSwitch, FaultyDevice, FileDevice, IoEngine, SimDevice, VolatileCacheDevice,
};
pub use engine::{BlockMapSize, Engine, SpaceUsage};
pub use error::{EngineError, Result};
pub use keys::{
    CollectionId, MAX_ATTRS_PER_OBJECT, MAX_COLLECTIONS, MAX_FRAGS_PER_BLOCK, MAX_OBJECT_BYTES, MAX_RUN_BLOCKS, Nid,
    prefix_end,
};
pub use mosaic_store::{AlignedBuf, IO_ALIGN_BYTES};
pub use plan::{MAX_ATTR_KEY_BYTES, MAX_ATTR_VALUE_BYTES, MAX_NAME_BYTES, MAX_NAME_TAG_BYTES};
pub use qos::{PerClass, Priority, PriorityGuard};
pub use reader::{NameEntry, ObjectInfo, Reader};
pub use scrubber::ScrubStatus;
pub use shares::ScheduledDevice;
pub use stats::EngineStats;
pub use superblock::{BLOCK_SIZE_BYTES, FORMAT_VERSION, Superblock};
pub use txn::{Op, Outcome, Staged, Transaction};
pub use verify::{CheckReport, ScrubReport};

/// The decoders of every on-disk record, for the fuzz targets in `fuzz/`. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::keys::{
        BlockEntry, BlockRun, Onode, decode_frag, decode_name_entry, encode_frag, encode_name_entry,
    };
    pub use crate::superblock::Superblock;
}

#[cfg(test)]
mod tests {
    /// The layer of each module (see the crate documentation). A module may use modules of its own layer
    /// only where `SAME_LAYER_USES` allows it.
    const LAYERS: &[(&str, u8)] = &[
        ("error", 0),
        ("checksum", 0),
        ("stats", 1),
        ("qos", 1),
        ("superblock", 1),
        ("keys", 1),
        ("config", 1),
        ("uring", 2),
        ("ioprio", 2),
        ("device", 2),
        ("mapped", 2),
        ("blockio", 3),
        ("verified", 3),
        ("shares", 3),
        ("kv", 4),
        ("overlay", 4),
        ("meta_cache", 4),
        ("page_cache", 4),
        ("alloc", 4),
        ("space", 4),
        ("frag_index", 4),
        ("txn", 4),
        ("core", 4),
        ("blockmap", 4),
        ("plan", 5),
        ("reader", 5),
        ("commit", 6),
        ("verify", 6),
        ("scrubber", 6),
        ("engine", 7),
    ];
    /// Uses within a layer: (user, used).
    const SAME_LAYER_USES: &[(&str, &str)] = &[
        ("stats", "qos"),
        ("keys", "superblock"),
        ("keys", "checksum"),
        ("superblock", "checksum"),
        ("config", "superblock"),
        ("device", "uring"),
        ("uring", "ioprio"),
        ("device", "mapped"),
        ("blockio", "verified"),
        ("overlay", "meta_cache"),
        ("overlay", "kv"),
        ("overlay", "keys"),
        ("meta_cache", "keys"),
        ("space", "alloc"),
        ("core", "meta_cache"),
        ("core", "page_cache"),
        ("txn", "alloc"),
        ("blockmap", "keys"),
    ];

    fn layer(m: &str) -> u8 {
        LAYERS.iter().find(|(n, _)| *n == m).unwrap_or_else(|| panic!("module {m} has no layer")).1
    }

    /// The engine is a one-way stack: device -> block IO -> state -> planning and reading -> commit
    /// pipeline -> facade. Each module's `crate::` references name only lower layers.
    #[test]
    fn layers() {
        // The package's directory as cargo gives it to the test run, not as it was at build time: a test
        // binary built from another checkout of this tree into a shared target directory is reused.
        let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
        let src = std::path::Path::new(&root).join("src");
        let mut checked = 0;
        for (module, own) in LAYERS {
            let text = std::fs::read_to_string(src.join(format!("{module}.rs"))).expect("module source");
            for (i, _) in text.match_indices("crate::") {
                let used: String =
                    text[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if used.is_empty() || !LAYERS.iter().any(|(n, _)| *n == used) || used == *module {
                    continue;
                }
                let ok = layer(&used) < *own
                    || (layer(&used) == *own && SAME_LAYER_USES.contains(&(*module, used.as_str())));
                assert!(ok, "{module} (layer {own}) uses {used} (layer {})", layer(&used));
                checked += 1;
            }
        }
        assert!(checked > 50, "the check saw the modules' uses ({checked})");
        let listed: std::collections::BTreeSet<&str> = LAYERS.iter().map(|(n, _)| *n).collect();
        for entry in std::fs::read_dir(&src).expect("src") {
            let name = entry.expect("entry").file_name().into_string().expect("utf-8");
            let module = name.trim_end_matches(".rs");
            assert!(module == "lib" || listed.contains(module), "module {module} has no layer");
        }
    }
}
