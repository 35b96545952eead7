//! Raft's log, vote and snapshots in RocksDB, and the state machine (the cluster map) they rebuild.
//!
//! Every write that Raft must not lose (log entries, the vote, the committed id, a snapshot) is written
//! with `sync` set: RocksDB's default write options leave the write in the OS page cache, so a vote given
//! and then lost in a power cut would let a node vote twice in one term. Each value is a frame (`frame`):
//! versioned and checksummed, refused when it is neither.
//!
//! The state machine lives in memory and is rebuilt at start from the last snapshot plus the committed
//! log (openraft applies the log again from the snapshot's end).

// openraft's StorageError is large and is the error type its traits require.
#![allow(clippy::result_large_err)]

use super::{Applied, Entry, LogId, Membership, NodeId, SnapshotMeta, TypeConfig, Vote};
use crate::frame::{self, Kind};
use crate::map::ClusterMap;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, RaftSnapshotBuilder, StorageError,
    StorageIOError,
};
use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{oneshot, watch};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

const CF_LOG: &str = "log";
const CF_META: &str = "meta";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";
const KEY_SNAPSHOT: &[u8] = b"snapshot";
/// Most log entries read at once (openraft asks in batches of `max_payload_entries`, far fewer).
const MAX_READ_ENTRIES: usize = 100_000;

fn io_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl ToString) -> StorageError<NodeId> {
    StorageIOError::new(subject, verb, AnyError::error(e.to_string())).into()
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

/// The open RocksDB of the Raft store; when the last handle goes, the database is closed and then
/// `closed` fires (so a node stopping in a process can say when its store may be opened again).
pub struct StoreDb {
    db: Option<DB>,
    closed: Option<oneshot::Sender<()>>,
}

impl std::ops::Deref for StoreDb {
    type Target = DB;
    fn deref(&self) -> &DB {
        self.db.as_ref().expect("open until dropped")
    }
}

impl Drop for StoreDb {
    fn drop(&mut self) {
        drop(self.db.take());
        if let Some(closed) = self.closed.take() {
            let _ = closed.send(());
        }
    }
}

/// Opens (or creates) the Raft store in `dir`; the receiver fires once it is closed again.
pub fn open(dir: &Path) -> Result<(Arc<StoreDb>, oneshot::Receiver<()>), String> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // A small store: the map and a bounded log.
    opts.set_max_open_files(64);
    opts.set_keep_log_file_num(4);
    let cfs = [CF_LOG, CF_META].map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db = DB::open_cf_descriptors(&opts, dir, cfs)
        .map_err(|e| format!("cannot open the cluster store in {}: {e}", dir.display()))?;
    let (closed, on_closed) = oneshot::channel();
    Ok((Arc::new(StoreDb { db: Some(db), closed: Some(closed) }), on_closed))
}

#[derive(Clone)]
pub struct LogStore {
    db: Arc<StoreDb>,
}

impl LogStore {
    pub fn new(db: Arc<StoreDb>) -> Self {
        LogStore { db }
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8], kind: Kind) -> StorageResult<Option<T>> {
        let cf = self.db.cf_handle(CF_META).expect("opened with its column families");
        let raw = self.db.get_cf(&cf, key).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
        raw.map(|raw| frame::decode(kind, &raw).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e)))
            .transpose()
    }

    fn put_meta<T: Serialize>(
        &self,
        key: &[u8],
        kind: Kind,
        value: &T,
        subject: ErrorSubject<NodeId>,
    ) -> StorageResult<()> {
        let cf = self.db.cf_handle(CF_META).expect("opened with its column families");
        let raw = frame::encode(kind, value).map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
        self.db.put_cf_opt(&cf, key, raw, &synced()).map_err(|e| io_error(subject, ErrorVerb::Write, e))
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId>> {
        let cf = self.db.cf_handle(CF_LOG).expect("opened with its column families");
        let Some(item) = self.db.iterator_cf(&cf, IteratorMode::End).next() else { return Ok(None) };
        let (_, raw) = item.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        let entry: Entry =
            frame::decode(Kind::RaftEntry, &raw).map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        Ok(Some(entry.log_id))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let cf = self.db.cf_handle(CF_LOG).expect("opened with its column families");
        let mut entries = Vec::new();
        for item in self.db.iterator_cf(&cf, IteratorMode::From(&start.to_be_bytes(), Direction::Forward)) {
            let (key, raw) = item.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            let index = u64::from_be_bytes(
                key.as_ref()
                    .try_into()
                    .map_err(|_| io_error(ErrorSubject::Logs, ErrorVerb::Read, "a log key that is not 8 bytes"))?,
            );
            if !range.contains(&index) || entries.len() >= MAX_READ_ENTRIES {
                break;
            }
            let entry: Entry =
                frame::decode(Kind::RaftEntry, &raw).map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            // A log entry is stored under its own index; anything else is a damaged log.
            assert_eq!(entry.log_id.index, index, "a log entry stored under another index");
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId> = self.get_meta(KEY_PURGED, Kind::RaftLogId)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        self.put_meta(KEY_VOTE, Kind::RaftVote, vote, ErrorSubject::Vote)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.get_meta(KEY_VOTE, Kind::RaftVote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        self.put_meta(KEY_COMMITTED, Kind::RaftLogId, &committed, ErrorSubject::Store)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED, Kind::RaftLogId)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let cf = self.db.cf_handle(CF_LOG).expect("opened with its column families");
        let mut batch = WriteBatch::default();
        for entry in entries {
            let raw = frame::encode(Kind::RaftEntry, &entry)
                .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Write, e))?;
            batch.put_cf(&cf, entry.log_id.index.to_be_bytes(), raw);
        }
        // One synced batch: the entries are durable (or none is) before Raft counts them.
        let result = self.db.write_opt(batch, &synced());
        let acknowledged = result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
        callback.log_io_completed(acknowledged);
        result.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn truncate(&mut self, log_id: LogId) -> StorageResult<()> {
        let cf = self.db.cf_handle(CF_LOG).expect("opened with its column families");
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(&cf, log_id.index.to_be_bytes(), u64::MAX.to_be_bytes());
        batch.delete_cf(&cf, u64::MAX.to_be_bytes());
        self.db.write_opt(batch, &synced()).map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        // The purge point first: a crash between the two leaves entries below it, which are never read.
        self.put_meta(KEY_PURGED, Kind::RaftLogId, &log_id, ErrorSubject::Logs)?;
        let cf = self.db.cf_handle(CF_LOG).expect("opened with its column families");
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(&cf, 0u64.to_be_bytes(), (log_id.index + 1).to_be_bytes());
        self.db.write_opt(batch, &synced()).map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}

/// A snapshot as stored: its meta and the map it holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    map: ClusterMap,
}

/// The cluster map as Raft applies it.
pub struct StateMachine {
    db: Arc<StoreDb>,
    map: ClusterMap,
    last_applied: Option<LogId>,
    membership: Membership,
    /// Every node's view of the map: updated after each applied batch.
    published: watch::Sender<Arc<ClusterMap>>,
    snapshots_built: u64,
}

impl StateMachine {
    /// The state machine as of the stored snapshot (the log is applied again on top by openraft).
    pub fn open(db: Arc<StoreDb>, published: watch::Sender<Arc<ClusterMap>>) -> Result<Self, String> {
        let mut sm = StateMachine {
            db,
            map: ClusterMap::empty(),
            last_applied: None,
            membership: Membership::default(),
            published,
            snapshots_built: 0,
        };
        if let Some(snapshot) = sm.stored_snapshot().map_err(|e| e.to_string())? {
            sm.install(snapshot);
        }
        Ok(sm)
    }

    fn stored_snapshot(&self) -> StorageResult<Option<StoredSnapshot>> {
        let cf = self.db.cf_handle(CF_META).expect("opened with its column families");
        let raw = self
            .db
            .get_cf(&cf, KEY_SNAPSHOT)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?;
        raw.map(|raw| {
            frame::decode(Kind::Snapshot, &raw).map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))
        })
        .transpose()
    }

    fn store_snapshot(db: &StoreDb, snapshot: &StoredSnapshot) -> StorageResult<Vec<u8>> {
        let subject = ErrorSubject::Snapshot(Some(snapshot.meta.signature()));
        let raw =
            frame::encode(Kind::Snapshot, snapshot).map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
        let cf = db.cf_handle(CF_META).expect("opened with its column families");
        db.put_cf_opt(&cf, KEY_SNAPSHOT, &raw, &synced()).map_err(|e| io_error(subject, ErrorVerb::Write, e))?;
        Ok(raw)
    }

    fn install(&mut self, snapshot: StoredSnapshot) {
        self.last_applied = snapshot.meta.last_log_id;
        self.membership = snapshot.meta.last_membership.clone();
        self.map = snapshot.map;
        self.published.send_replace(Arc::new(self.map.clone()));
    }
}

/// Builds a snapshot from a copy of the state taken when asked.
pub struct SnapshotBuilder {
    db: Arc<StoreDb>,
    snapshot: StoredSnapshot,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let raw = StateMachine::store_snapshot(&self.db, &self.snapshot)?;
        Ok(Snapshot { meta: self.snapshot.meta.clone(), snapshot: Box::new(Cursor::new(raw)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, Membership)> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Applied>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            debug_assert!(self.last_applied.is_none_or(|last| entry.log_id > last), "entries apply in order");
            self.last_applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Blank => Applied { result: Ok(self.map.epoch) },
                EntryPayload::Normal(change) => {
                    // A refused change is the same refusal on every manager: the map stays as it was.
                    Applied { result: self.map.apply(&change).map_err(|e| e.to_string()) }
                }
                EntryPayload::Membership(membership) => {
                    self.membership = Membership::new(Some(entry.log_id), membership);
                    Applied { result: Ok(self.map.epoch) }
                }
            };
            replies.push(reply);
        }
        if self.published.borrow().epoch != self.map.epoch {
            self.published.send_replace(Arc::new(self.map.clone()));
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        let snapshot_id = match self.last_applied {
            Some(last) => format!("{}-{}-{}", last.leader_id, last.index, self.snapshots_built),
            None => format!("--{}", self.snapshots_built),
        };
        let meta =
            SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id };
        SnapshotBuilder { db: self.db.clone(), snapshot: StoredSnapshot { meta, map: self.map.clone() } }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<Cursor<Vec<u8>>>) -> StorageResult<()> {
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let mut stored: StoredSnapshot = frame::decode(Kind::Snapshot, snapshot.get_ref())
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, e))?;
        // The meta Raft sends is the one that counts; the body's copy must agree on where it ends.
        if stored.meta.last_log_id != meta.last_log_id {
            return Err(io_error(subject, ErrorVerb::Read, "a snapshot whose body and meta disagree"));
        }
        stored.meta = meta.clone();
        Self::store_snapshot(&self.db, &stored)?;
        self.install(stored);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let Some(stored) = self.stored_snapshot()? else { return Ok(None) };
        let raw = frame::encode(Kind::Snapshot, &stored)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?;
        Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(raw)) }))
    }
}
