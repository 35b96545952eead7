//! One drive as a store: the traits of `mosaic-store` implemented on one engine. A collection is an engine
//! collection, an object an engine object, staged units are whole blocks, and a transaction is one engine
//! transaction, so every store operation is atomic and durable exactly as the engine makes it.
//!
//! Blocking engine work (commits, staging, data reads) runs on the runtime's blocking threads; metadata
//! reads (lookups, attributes, listings) come from the snapshot directly: they hit the engine's caches or
//! one RocksDB read.

use async_trait::async_trait;
use bytes::Bytes;
use mosaic_engine::{CollectionId, Engine, EngineError, Nid, Reader, Staged, Transaction};
use mosaic_store::{
    AlignedBuf, ErrorKind, Geometry, NameEntry, ObjectInfo, Op, Outcome, PriorityHold, Snapshot, Store, StoreError,
    StoreResult, StripeLane, Txn,
};
use std::sync::Arc;

/// The longest read answered on the caller's (async) thread when memory holds it: copying 64 KiB from the
/// page cache takes a few microseconds, about what a blocking-thread hop costs; longer reads hop.
pub const RESIDENT_READ_MAX_BYTES: u64 = 64 << 10;

/// One engine drive as a store.
#[derive(Clone)]
pub struct DriveStore {
    engine: Engine,
}

impl DriveStore {
    pub fn new(engine: Engine) -> Self {
        DriveStore { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// An engine error as a store error: the kind a caller acts on, and the operation that failed.
pub fn store_error(e: EngineError) -> StoreError {
    let op = e.op_index();
    let kind = match e.cause() {
        EngineError::NotFound => ErrorKind::NotFound,
        EngineError::AlreadyExists => ErrorKind::AlreadyExists,
        EngineError::CollectionNotFound(_) => ErrorKind::CollectionNotFound,
        EngineError::CollectionExists(_) => ErrorKind::CollectionExists,
        EngineError::CollectionNotEmpty(_) => ErrorKind::CollectionNotEmpty,
        EngineError::AssertionFailed => ErrorKind::AssertionFailed,
        EngineError::OffsetMismatch { .. } => ErrorKind::OffsetMismatch,
        EngineError::NoSpace { .. } => ErrorKind::NoSpace,
        EngineError::ReadOnly(_) | EngineError::ShuttingDown | EngineError::Io(_) => ErrorKind::Unavailable,
        EngineError::Checksum { .. } | EngineError::Corrupt(_) => ErrorKind::Corrupt,
        EngineError::Limit(_) => ErrorKind::Limit,
        EngineError::InvalidArgument(_) => ErrorKind::InvalidArgument,
        EngineError::Kv(_)
        | EngineError::NotADrive(_)
        | EngineError::UnsupportedVersion { .. }
        | EngineError::Op { .. } => ErrorKind::Internal,
    };
    StoreError { kind, op_index: op, message: e.cause().to_string() }
}

/// Runs engine work on a blocking thread, in the IO share of the task that asks for it and marked as
/// background work unless that task is a client's (`mosaic_store::in_foreground`): background work's
/// device IO then goes in the kernel's idle class (`mosaic_engine::with_thread_ioprio`). A bulk share's
/// work runs on a thread of the bulk CPU class (`mosaic_store::spawn_blocking_in`).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, EngineError> + Send + 'static) -> StoreResult<T> {
    let (share, background) = (mosaic_store::io_share(), !mosaic_store::is_foreground());
    let work = move || {
        mosaic_store::on_thread_with_share(share, || {
            mosaic_store::on_thread_as_background(background, || mosaic_engine::with_thread_ioprio(f))
        })
    };
    match mosaic_store::spawn_blocking_in(share, work).await {
        Ok(r) => r.map_err(store_error),
        Err(e) => Err(StoreError::internal(format!("a drive worker failed: {e}"))),
    }
}

/// A store operation as the engine's.
fn engine_op(op: Op<CollectionId, Staged>) -> mosaic_engine::Op {
    use mosaic_engine::Op as E;
    match op {
        Op::CreateCollection { name } => E::CreateCollection { name },
        Op::RemoveCollection { name } => E::RemoveCollection { name },
        Op::Create { coll, name } => E::Create { coll, name },
        Op::Reset { coll, name } => E::Reset { coll, name },
        Op::Write { coll, name, offset, data } => E::Write { coll, name, offset, data },
        Op::WriteStaged { coll, name, offset, staged } => E::WriteStaged { coll, name, offset, staged },
        Op::Append { coll, name, data, expected_offset } => E::Append { coll, name, data, expected_offset },
        Op::Remove { coll, name } => E::Remove { coll, name },
        Op::Rename { coll, from, to_coll, to } => E::Rename { coll, from, to_coll, to },
        Op::Truncate { coll, name, size_bytes } => E::Truncate { coll, name, size_bytes },
        Op::Clone { coll, from, to_coll, to } => E::Clone { coll, from, to_coll, to },
        Op::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset } => {
            E::CloneRange { src_coll, src, src_offset, len, dst_coll, dst, dst_offset }
        }
        Op::SetAttr { coll, name, key, value } => E::SetAttr { coll, name, key, value },
        Op::RemoveAttr { coll, name, key } => E::RemoveAttr { coll, name, key },
        Op::SetNameTag { coll, name, tag } => E::SetNameTag { coll, name, tag },
        Op::SetPriority { coll, name, high } => E::SetPriority { coll, name, high },
        Op::AssertAttr { coll, name, key, expected } => E::AssertAttr { coll, name, key, expected },
        Op::AssertExists { coll, name } => E::AssertExists { coll, name },
    }
}

fn engine_priority(p: mosaic_store::Priority) -> mosaic_engine::Priority {
    match p {
        mosaic_store::Priority::Background => mosaic_engine::Priority::Background,
        mosaic_store::Priority::Foreground => mosaic_engine::Priority::Foreground,
        mosaic_store::Priority::ForegroundHigh => mosaic_engine::Priority::ForegroundHigh,
    }
}

fn object_info(i: mosaic_engine::ObjectInfo) -> ObjectInfo<Nid> {
    ObjectInfo { obj: i.nid, size_bytes: i.size_bytes, mtime_ns: i.mtime_ns, high_priority: i.high_priority }
}

#[async_trait]
impl Store for DriveStore {
    type Coll = CollectionId;
    type Obj = Nid;
    type Staged = Staged;
    type Snapshot = DriveSnapshot;

    fn geometry(&self) -> Geometry {
        let cfg = self.engine.config();
        Geometry {
            unit_bytes: self.engine.block_size_bytes(),
            max_op_data_bytes: cfg.max_op_data_bytes as u64,
            inline_max_bytes: cfg.inline_max_bytes,
        }
    }

    fn snapshot(&self) -> DriveSnapshot {
        DriveSnapshot { reader: Arc::new(self.engine.reader()) }
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, _hint: &[u8]) -> StoreResult<(Staged, AlignedBuf)> {
        if len_bytes == 0 || len_bytes > buf.len() {
            return Err(StoreError::new(ErrorKind::InvalidArgument, "staged bytes must lie in the buffer"));
        }
        let engine = self.engine.clone();
        blocking(move || {
            let staged = engine.stage(&buf.as_slice()[..len_bytes], true)?;
            Ok((staged, buf))
        })
        .await
    }

    async fn commit(&self, txn: Txn<CollectionId, Staged>) -> StoreResult<Outcome> {
        let mut t = Transaction::new();
        t.ops = txn.ops.into_iter().map(engine_op).collect();
        t.priority = txn.priority.map(engine_priority);
        let engine = self.engine.clone();
        let out = blocking(move || engine.submit(t)).await?;
        Ok(Outcome { append_sizes: out.append_sizes })
    }

    fn hold_priority(&self) -> PriorityHold {
        Box::new(self.engine.priority_guard())
    }

    fn is_ready(&self) -> bool {
        self.engine.is_healthy()
    }

    async fn close(&self) -> StoreResult<()> {
        let engine = self.engine.clone();
        blocking(move || engine.close()).await
    }
}

/// A drive snapshot: one engine reader (a RocksDB snapshot plus a pinned commit epoch).
pub struct DriveSnapshot {
    reader: Arc<Reader>,
}

impl mosaic_store::CollectionNames for DriveSnapshot {
    fn collection_name(&self, coll: &CollectionId) -> StoreResult<Option<String>> {
        self.reader.collection_name(*coll).map_err(store_error)
    }
}

#[async_trait]
impl Snapshot for DriveSnapshot {
    type Coll = CollectionId;
    type Obj = Nid;

    async fn collection(&self, name: &str) -> StoreResult<Option<CollectionId>> {
        self.reader.collection(name).map_err(store_error)
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, CollectionId)>> {
        self.reader.collections(prefix, limit).map_err(store_error)
    }

    async fn lookup(&self, coll: &CollectionId, name: &[u8]) -> StoreResult<Option<ObjectInfo<Nid>>> {
        Ok(self.reader.lookup(*coll, name).map_err(store_error)?.map(object_info))
    }

    async fn attr(&self, obj: &Nid, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.reader.attr(*obj, key).map_err(store_error)
    }

    async fn attrs(&self, obj: &Nid, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.reader.attrs(*obj, start_after, limit).map_err(store_error)
    }

    async fn list_entries(
        &self,
        coll: &CollectionId,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<Nid>>> {
        let entries = self.reader.list_entries(*coll, prefix, from, limit).map_err(store_error)?;
        Ok(entries.into_iter().map(|e| NameEntry { name: e.name, obj: e.nid, tag: e.tag }).collect())
    }

    async fn stat_many(&self, objs: &[Nid], attr_key: &[u8]) -> StoreResult<Vec<(ObjectInfo<Nid>, Option<Vec<u8>>)>> {
        let stats = self.reader.stat_many(objs, attr_key).map_err(store_error)?;
        Ok(stats.into_iter().map(|(i, a)| (object_info(i), a)).collect())
    }

    async fn read(&self, obj: &Nid, offset: u64, len: u64) -> StoreResult<Bytes> {
        let (reader, nid) = (self.reader.clone(), *obj);
        // A small read that memory holds is answered here: a hop to a blocking thread and back costs more
        // than the read (two thread wake-ups per GET, measured for issue 14).
        if let Some(bytes) =
            reader.read_bytes_resident(nid, offset, len, RESIDENT_READ_MAX_BYTES).map_err(store_error)?
        {
            return Ok(bytes);
        }
        blocking(move || reader.read_bytes(nid, offset, len)).await
    }

    async fn read_into(&self, obj: &Nid, offset: u64, mut lane: StripeLane) -> StoreResult<u64> {
        let (reader, nid) = (self.reader.clone(), *obj);
        blocking(move || {
            let n = reader.read_into(nid, offset, &mut lane.pieces_mut())?;
            if n == lane.len_bytes() as u64 {
                // SAFETY: a full `read_into` wrote every byte of every piece.
                unsafe { lane.set_filled() };
            }
            Ok(n)
        })
        .await
    }

    fn prioritize(&self) {
        self.reader.prioritize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_engine::{EngineConfig, SimDevice};

    fn drive() -> (tempfile::TempDir, DriveStore) {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(64 << 20)), EngineConfig::default()).unwrap();
        (dir, DriveStore::new(engine))
    }

    /// A failed operation reaches the store's user with its kind and its index in the transaction.
    #[tokio::test]
    async fn errors_name_the_failed_operation() {
        let (_dir, store) = drive();
        store.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
        let coll = store.snapshot().collection("c").await.unwrap().unwrap();
        let txn = Txn::new()
            .op(Op::Write { coll, name: b"a".to_vec(), offset: 0, data: b"x".to_vec() })
            .op(Op::AssertExists { coll, name: b"missing".to_vec() });
        let e = store.commit(txn).await.unwrap_err();
        assert!(e.is_op(1, ErrorKind::AssertionFailed), "{e:?}");
        assert_eq!(store.snapshot().lookup(&coll, b"a").await.unwrap(), None, "nothing of it was applied");
        let e = store.commit(Txn::new().op(Op::Remove { coll, name: b"a".to_vec() })).await.unwrap_err();
        assert!(e.is_op(0, ErrorKind::NotFound), "{e:?}");
        store.close().await.unwrap();
    }

    /// A large read for a client (`in_foreground`) keeps its segment verified; the same read as background
    /// work (heal, scans) keeps nothing, so a drive read whole once does not push out what clients read.
    #[tokio::test]
    async fn only_a_client_s_large_read_is_kept_verified() {
        let dir = tempfile::tempdir().unwrap();
        let dev = mosaic_engine::FileDevice::create(&dir.path().join("data"), 64 << 20).unwrap();
        let engine = Engine::format(&dir.path().join("kv"), Arc::new(dev), EngineConfig::default()).unwrap();
        let store = DriveStore::new(engine);
        store.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
        let coll = store.snapshot().collection("c").await.unwrap().unwrap();
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 241) as u8).collect();
        let write = Op::Write { coll, name: b"big".to_vec(), offset: 0, data: data.clone() };
        store.commit(Txn::new().op(write)).await.unwrap();
        let read = || async {
            let snap = store.snapshot();
            let obj = snap.lookup(&coll, b"big").await.unwrap().unwrap().obj;
            snap.read(&obj, 0, data.len() as u64).await.unwrap()
        };
        assert_eq!(read().await, data);
        let s = store.engine().stats();
        assert!(s.mapped_bytes_read >= data.len() as u64, "served in place: {s:?}");
        assert_eq!(s.verified_cache_bytes, 0, "a background read keeps nothing");
        assert_eq!(mosaic_store::in_foreground(read()).await, data);
        assert_eq!(store.engine().stats().verified_cache_bytes, data.len() as u64, "a client's read keeps it");
        assert_eq!(mosaic_store::in_foreground(read()).await, data);
        assert_eq!(store.engine().stats().verified_bytes_read, data.len() as u64, "and the next one uses it");
        store.close().await.unwrap();
    }

    /// Staging takes whole blocks of the buffer only.
    #[tokio::test]
    async fn staging_checks_its_bounds() {
        let (_dir, store) = drive();
        let e = store.stage(AlignedBuf::zeroed(4096), 8192, b"o").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = store.stage(AlignedBuf::zeroed(8192), 100, b"o").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        let (staged, buf) = store.stage(AlignedBuf::zeroed(8192), 4096, b"o").await.unwrap();
        assert_eq!((staged.len_bytes(), buf.len()), (4096, 8192));
        store.close().await.unwrap();
    }
}
