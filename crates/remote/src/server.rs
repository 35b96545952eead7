//! A node's drives served to other nodes: each request runs one command on one local drive. Snapshots
//! and staged units that a request opens stay on the server under an id until the client releases them,
//! or until they sit idle past a limit (a client that died must not pin a snapshot or staged space
//! forever); both tables are bounded. A server in a cluster checks each request's fence (`wire::Fence`)
//! against its own map first and refuses what a stale view of the cluster planned.

use crate::wire::{self, Answer, Command, Fence, Reply, Request, SnapshotId, StagedId};
use bytes::Bytes;
use hyper::StatusCode;
use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::rpc::{Answer as RpcAnswer, Handler, Parts};
use mosaic_store::{AlignedBuf, ErrorKind, Snapshot, Store, StoreError, StoreResult, Txn};
use parking_lot::Mutex;
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most snapshots open at once on one server.
pub const MAX_SNAPSHOTS: usize = 4096;
/// Most staged units held at once on one server.
pub const MAX_STAGED: usize = 4096;
/// A snapshot unused this long is dropped.
pub const SNAPSHOT_IDLE: Duration = Duration::from_secs(120);
/// Staged units not committed this long are dropped (their space goes back).
pub const STAGED_IDLE: Duration = Duration::from_secs(600);
/// Largest read answered at once (the client reads longer ranges in pieces).
pub const MAX_READ_BYTES: u64 = 8 << 20;
/// Most entries a listing or attribute read returns at once.
pub const MAX_LIST_ENTRIES: u64 = 10_000;

struct Sessions<S: Store> {
    next_id: u64,
    snapshots: HashMap<SnapshotId, (Arc<S::Snapshot>, Instant)>,
    staged: HashMap<StagedId, (S::Staged, Instant)>,
}

/// Decides whether a request's fence is current enough to be served (the cluster's rule, with its map).
pub type FenceCheck = Arc<dyn Fn(&Fence) -> StoreResult<()> + Send + Sync>;

/// Serves the drives of this node. Drives are stores whose collections and objects are numbered as the
/// engine numbers them.
pub struct DriveServer<S: Store<Coll = wire::Coll, Obj = wire::Obj>> {
    drives: HashMap<String, Arc<S>>,
    sessions: Mutex<Sessions<S>>,
    /// None: every request is served (a server outside a cluster map).
    fence: Option<FenceCheck>,
    /// Requests served (for metrics and tests).
    requests: AtomicU64,
}

fn limit(what: &str, max: usize) -> StoreError {
    StoreError::new(ErrorKind::Limit, format!("more than {max} {what} open on this node"))
}

impl<S: Store<Coll = wire::Coll, Obj = wire::Obj>> DriveServer<S> {
    /// Serves `drives`; with `fence`, only requests whose fence it accepts (a request without one is
    /// refused).
    pub fn new(drives: HashMap<String, Arc<S>>, fence: Option<FenceCheck>) -> Arc<Self> {
        let sessions = Sessions { next_id: 1, snapshots: HashMap::new(), staged: HashMap::new() };
        Arc::new(DriveServer { drives, sessions: Mutex::new(sessions), fence, requests: AtomicU64::new(0) })
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Whether `request` may be served: releases always may (they only give back what the caller held).
    fn admit(&self, request: &Request) -> StoreResult<()> {
        let Some(check) = &self.fence else { return Ok(()) };
        if matches!(request.command, Command::Release) {
            return Ok(());
        }
        let checked = match &request.fence {
            Some(fence) => check(fence),
            None => Err(StoreError::unavailable("a drive call that names no cluster map is refused here")),
        };
        if let Err(e) = &checked {
            metrics::counter!("mosaic_drive_calls_refused_total").increment(1);
            tracing::debug!(drive = %request.drive, error = %e, "a drive call refused");
        }
        checked
    }

    /// Snapshots and staged units held for clients (for metrics and tests).
    pub fn held(&self) -> (usize, usize) {
        let s = self.sessions.lock();
        (s.snapshots.len(), s.staged.len())
    }

    fn release(&self, snapshots: &[SnapshotId], staged: &[StagedId]) {
        let mut s = self.sessions.lock();
        for id in snapshots {
            s.snapshots.remove(id);
        }
        for id in staged {
            s.staged.remove(id);
        }
    }

    /// The snapshot `id` names, or a new one of `drive` when `id` is None (returned as opened).
    fn snapshot(&self, drive: &S, id: Option<SnapshotId>) -> StoreResult<(Arc<S::Snapshot>, Option<SnapshotId>)> {
        let now = Instant::now();
        let mut s = self.sessions.lock();
        if let Some(id) = id {
            let Some((snapshot, used)) = s.snapshots.get_mut(&id) else {
                return Err(StoreError::unavailable(format!("snapshot {id} is not open on this node (expired?)")));
            };
            *used = now;
            return Ok((snapshot.clone(), None));
        }
        if s.snapshots.len() >= MAX_SNAPSHOTS {
            s.snapshots.retain(|_, (_, used)| now.duration_since(*used) < SNAPSHOT_IDLE);
            if s.snapshots.len() >= MAX_SNAPSHOTS {
                return Err(limit("snapshots", MAX_SNAPSHOTS));
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        let snapshot = Arc::new(drive.snapshot());
        s.snapshots.insert(id, (snapshot.clone(), now));
        Ok((snapshot, Some(id)))
    }

    fn keep_staged(&self, staged: S::Staged) -> StoreResult<StagedId> {
        let now = Instant::now();
        let mut s = self.sessions.lock();
        if s.staged.len() >= MAX_STAGED {
            s.staged.retain(|_, (_, made)| now.duration_since(*made) < STAGED_IDLE);
            if s.staged.len() >= MAX_STAGED {
                return Err(limit("staged units", MAX_STAGED));
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        s.staged.insert(id, (staged, now));
        Ok(id)
    }

    /// The staged units a transaction names, taken out of the table (a transaction consumes them).
    fn take_staged(&self, txn: Txn<wire::Coll, StagedId>) -> StoreResult<Txn<wire::Coll, S::Staged>> {
        let mut s = self.sessions.lock();
        let mut ops = Vec::with_capacity(txn.ops.len());
        for (i, op) in txn.ops.into_iter().enumerate() {
            let op = op.try_map(Ok, |id| {
                s.staged.remove(&id).map(|(staged, _)| staged).ok_or_else(|| {
                    StoreError::new(ErrorKind::InvalidArgument, format!("staged units {id} are not held here")).in_op(i)
                })
            })?;
            ops.push(op);
        }
        Ok(Txn { ops, priority: txn.priority })
    }

    async fn run(&self, request: Request) -> Reply {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.release(&request.release_snapshots, &request.release_staged);
        if let Err(e) = self.admit(&request) {
            return Reply { opened: None, answer: Err(e) };
        }
        let Some(drive) = self.drives.get(&request.drive).cloned() else {
            let e = StoreError::unavailable(format!("no drive {} on this node", request.drive));
            return Reply { opened: None, answer: Err(e) };
        };
        let mut opened = None;
        let answer = self.command(&drive, request.command, &mut opened).await;
        if answer.is_err()
            && let Some(id) = opened.take()
        {
            // A read that failed keeps no snapshot the client would not know to release.
            self.release(&[id], &[]);
        }
        Reply { opened, answer }
    }

    async fn command(&self, drive: &S, command: Command, opened: &mut Option<SnapshotId>) -> StoreResult<Answer> {
        if let Some(id) = command.snapshot() {
            let (snapshot, new) = self.snapshot(drive, id)?;
            *opened = new;
            return read(&*snapshot, command).await;
        }
        match command {
            Command::Hello => Ok(Answer::Hello { geometry: drive.geometry(), ready: drive.is_ready() }),
            Command::Release => Ok(Answer::Done),
            Command::Stage { hint, data } => {
                let len_bytes = data.len();
                let unit = drive.geometry().unit_bytes as usize;
                if len_bytes == 0 || !len_bytes.is_multiple_of(unit) {
                    return Err(StoreError::new(ErrorKind::InvalidArgument, "staged bytes must be whole units"));
                }
                // The engine writes from aligned memory (O_DIRECT): one copy out of the request.
                let buf = AlignedBuf::copy_of(&data);
                drop(data);
                let (staged, _) = drive.stage(buf, len_bytes, &hint).await?;
                let id = self.keep_staged(staged)?;
                Ok(Answer::Staged { id, len_bytes: len_bytes as u64 })
            }
            Command::Commit { txn } => {
                let txn = self.take_staged(txn)?;
                Ok(Answer::Committed(drive.commit(txn).await?))
            }
            _ => unreachable!("reads are answered above"),
        }
    }
}

/// Most attributes sent with a lookup, and most bytes of them.
pub const PREFETCH_ATTRS: usize = 64;
pub const PREFETCH_ATTR_BYTES: usize = 64 << 10;
/// Objects up to this size are sent whole with their lookup.
pub const PREFETCH_DATA_BYTES: u64 = 64 << 10;

/// A found object with its attributes and, when small, its bytes (what a read asks next).
async fn prefetch<Sn: Snapshot<Coll = wire::Coll, Obj = wire::Obj>>(
    snapshot: &Sn,
    info: mosaic_store::ObjectInfo<wire::Obj>,
) -> StoreResult<wire::Found> {
    let attrs = snapshot.attrs(&info.obj, b"", PREFETCH_ATTRS + 1).await?;
    let attr_bytes: usize = attrs.iter().map(|(k, v)| k.len() + v.len()).sum();
    let attrs = (attrs.len() <= PREFETCH_ATTRS && attr_bytes <= PREFETCH_ATTR_BYTES)
        .then(|| attrs.into_iter().map(|(k, v)| (ByteBuf::from(k), ByteBuf::from(v))).collect());
    let data = if info.size_bytes <= PREFETCH_DATA_BYTES {
        let data = snapshot.read(&info.obj, 0, info.size_bytes).await?;
        Some(ByteBuf::from(Vec::from(data)))
    } else {
        None
    };
    Ok(wire::Found { info, attrs, data })
}

/// A read command on a snapshot.
async fn read<Sn: Snapshot<Coll = wire::Coll, Obj = wire::Obj>>(
    snapshot: &Sn,
    command: Command,
) -> StoreResult<Answer> {
    let bounded = |limit: u64| limit.min(MAX_LIST_ENTRIES) as usize;
    Ok(match command {
        Command::Collection { name, .. } => Answer::Collection(snapshot.collection(&name).await?),
        Command::Collections { prefix, limit, .. } => {
            Answer::Collections(snapshot.collections(&prefix, bounded(limit)).await?)
        }
        Command::Lookup { coll, name, .. } => match snapshot.lookup(&coll, &name).await? {
            Some(info) => Answer::Lookup(Some(prefetch(snapshot, info).await?)),
            None => Answer::Lookup(None),
        },
        Command::Attr { obj, key, .. } => Answer::Attr(snapshot.attr(&obj, &key).await?.map(ByteBuf::from)),
        Command::Attrs { obj, start_after, limit, .. } => {
            let attrs = snapshot.attrs(&obj, &start_after, bounded(limit)).await?;
            Answer::Attrs(attrs.into_iter().map(|(k, v)| (ByteBuf::from(k), ByteBuf::from(v))).collect())
        }
        Command::ListEntries { coll, prefix, from, limit, .. } => {
            Answer::Entries(snapshot.list_entries(&coll, &prefix, &from, bounded(limit)).await?)
        }
        Command::StatMany { objs, attr_key, .. } => {
            if objs.len() as u64 > MAX_LIST_ENTRIES {
                return Err(StoreError::new(ErrorKind::Limit, format!("more than {MAX_LIST_ENTRIES} objects at once")));
            }
            let stats = snapshot.stat_many(&objs, &attr_key).await?;
            Answer::Stats(stats.into_iter().map(|(i, a)| (i, a.map(ByteBuf::from))).collect())
        }
        Command::Read { obj, offset, len, .. } => {
            // The drive's buffer itself goes out as the reply's payload: no copy on this side.
            Answer::Data { bytes: snapshot.read(&obj, offset, len.min(MAX_READ_BYTES)).await? }
        }
        Command::Prioritize { .. } => {
            snapshot.prioritize();
            Answer::Done
        }
        Command::Hello | Command::Stage { .. } | Command::Commit { .. } | Command::Release => {
            unreachable!("not a snapshot read")
        }
    })
}

impl<S: Store<Coll = wire::Coll, Obj = wire::Obj>> Handler for DriveServer<S> {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = RpcAnswer> + Send>> {
        Box::pin(async move {
            if path != wire::PATH {
                return Err((StatusCode::NOT_FOUND, format!("no drive call {path}")));
            }
            let (mut request, payload): (Request, Bytes) =
                frame::decode_binary(Kind::Drive, &body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
            request.put_payload(payload).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
            let mut reply = self.run(request).await;
            let payload = reply.take_payload();
            let head = frame::encode_binary(Kind::Drive, &reply, &payload)
                .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            Ok(Parts::new(head, payload))
        })
    }
}
