//! Opening the RocksDB index with Mosaic's column families and options.

use crate::error::{EngineError, Result};
use crate::keys::ALL_CFS;
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, DB, Options};
use std::path::Path;

pub fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| EngineError::Corrupt(format!("column family {name} is missing")))
}

pub struct KvOptions {
    pub block_cache_bytes: usize,
    pub write_buffer_bytes: usize,
    /// The node's shared block cache and memtable budget, when several drives share them.
    pub memory: Option<KvMemory>,
}

/// The memory of the KV stores of all drives of a node together: one block cache and one memtable budget
/// that every drive's database draws from, so that adding drives does not multiply the node's memory (a
/// busy drive gets more of it than an idle one).
#[derive(Clone)]
pub struct KvMemory {
    cache: rocksdb::Cache,
    write_buffers: rocksdb::WriteBufferManager,
    budget_bytes: usize,
}

impl KvMemory {
    /// A block cache of `block_cache_bytes` and memtables of at most `write_buffer_bytes` in all.
    pub fn new(block_cache_bytes: usize, write_buffer_bytes: usize) -> Self {
        KvMemory {
            cache: rocksdb::Cache::new_lru_cache(block_cache_bytes),
            // Writers stall (rather than the budget being exceeded) while flushes catch up.
            write_buffers: rocksdb::WriteBufferManager::new_write_buffer_manager(write_buffer_bytes, true),
            budget_bytes: block_cache_bytes + write_buffer_bytes,
        }
    }

    /// The block cache and memtable bytes together.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }
}

impl std::fmt::Debug for KvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvMemory").field("budget_bytes", &self.budget_bytes).finish()
    }
}

pub fn db_options(create: bool) -> Options {
    let mut o = Options::default();
    o.create_if_missing(create);
    o.create_missing_column_families(create);
    o.enable_statistics();
    o.set_max_background_jobs(2);
    o.set_bytes_per_sync(1 << 20);
    o.set_keep_log_file_num(4);
    o.set_max_total_wal_size(256 << 20);
    // All memtables together: bounds the KV store's write memory whatever the number of column families.
    o.set_db_write_buffer_size(DB_WRITE_BUFFER_TOTAL_BYTES);
    o
}

/// Memtable memory of all column families together (RocksDB flushes the largest one at this bound).
pub const DB_WRITE_BUFFER_TOTAL_BYTES: usize = 96 << 20;

pub fn open(path: &Path, create: bool, kv: &KvOptions) -> Result<(DB, Options)> {
    let mut opts = db_options(create);
    let cache = match &kv.memory {
        Some(m) => {
            opts.set_write_buffer_manager(&m.write_buffers);
            m.cache.clone()
        }
        None => rocksdb::Cache::new_lru_cache(kv.block_cache_bytes),
    };
    let cfs = ALL_CFS.iter().map(|name| {
        let mut c = Options::default();
        let mut bbo = rocksdb::BlockBasedOptions::default();
        bbo.set_block_cache(&cache);
        bbo.set_bloom_filter(10.0, false);
        c.set_block_based_table_factory(&bbo);
        c.set_write_buffer_size(kv.write_buffer_bytes);
        c.set_compression_type(rocksdb::DBCompressionType::Lz4);
        if *name == crate::keys::CF_FRAGS {
            // Fragment data goes to blob files when the memtable is flushed and is not rewritten by
            // compaction (only its small keys are): the fragment log costs one WAL write plus one flush.
            // Blob GC stays off: it relocates live fragments of the oldest files on every compaction
            // (measured: +0.9x write amplification on 1 GiB of 2 KiB appends). Lazy sync deletes fragments
            // roughly in write order, so whole blob files become garbage and are dropped without copying.
            c.set_enable_blob_files(true);
            c.set_min_blob_size(512);
            c.set_enable_blob_gc(false);
        }
        ColumnFamilyDescriptor::new(*name, c)
    });
    // The default column family (unused) gets the same write buffer as the others: RocksDB preallocates each
    // new WAL by the largest write buffer of any family (1.1x it), and the 64 MiB of a default left to the
    // rocksdb crate made that 70 MiB per open. On tmpfs (where the test suites keep their databases)
    // fallocate takes and zeroes those pages at once and close frees them: two thirds of the CPU of the
    // erasure crash test.
    let mut default = Options::default();
    default.set_write_buffer_size(kv.write_buffer_bytes);
    let cfs = cfs.chain(std::iter::once(ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, default)));
    let db = DB::open_cf_descriptors(&opts, path, cfs)?;
    Ok((db, opts))
}
