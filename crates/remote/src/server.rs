//! A node's drives served to other nodes: each request runs one command on one local drive. Snapshots
//! and staged units that a request opens stay on the server under an id until the client releases them,
//! or until they sit idle past a limit (a client that died must not pin a snapshot or staged space
//! forever); both tables are bounded. A server in a cluster (a guarded one) checks each request's fence
//! (`wire::Fence`) against its own map first and refuses what a stale view of the cluster planned, then
//! its capability (paper 003): signed by the cluster, in force, for this drive and the command's
//! operations; every collection the command names, by name or by id, must lie in the capability's scope,
//! and every object it names by id must be one that a read in the same snapshot, under the same scope,
//! found. Staged units are committed only under the scope they were staged with.

use crate::wire::{self, Answer, Command, Fence, Reply, Request, SnapshotId, StagedId};
use bytes::Bytes;
use hyper::StatusCode;
use mosaic_cluster::capability::{self, Capability, CapabilityKey};
use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::rpc::{Answer as RpcAnswer, Handler, Parts};
use mosaic_store::{
    AlignedBuf, CollectionNames, ErrorKind, ForegroundWork, Op, Snapshot, Store, StoreError, StoreResult, Txn,
};
use parking_lot::Mutex;
use serde_bytes::ByteBuf;
use std::collections::{HashMap, HashSet};
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
/// Most objects one snapshot's reads may find under a capability (what later reads by id may name).
pub const MAX_SNAPSHOT_OBJECTS: usize = 65_536;

/// A snapshot held for a client: under a capability, the scope it was opened with and the objects its
/// reads found (the only ones a later read in it may name by id).
struct HeldSnapshot<Sn> {
    snapshot: Arc<Sn>,
    used: Instant,
    scope: Option<String>,
    found: HashSet<wire::Obj>,
}

struct Sessions<S: Store> {
    next_id: u64,
    snapshots: HashMap<SnapshotId, HeldSnapshot<S::Snapshot>>,
    /// Units with the time they were staged and, under a capability, the scope they were staged with.
    staged: HashMap<StagedId, (S::Staged, Instant, Option<String>)>,
}

/// A transaction as the drive takes it.
type DriveTxn<S> = Txn<wire::Coll, <S as Store>::Staged>;

/// Decides whether a request's fence is current enough to be served (the cluster's rule, with its map).
pub type FenceCheck = Arc<dyn Fn(&Fence) -> StoreResult<()> + Send + Sync>;

/// What a server in a cluster checks each request against: its fence and its capability.
pub struct Guard {
    pub fence: FenceCheck,
    pub capabilities: CapabilityKey,
}

/// Commands refused for their capability, by every server of this process (for tests; the metric is
/// `mosaic_drive_capabilities_refused_total`).
static CAPABILITY_REFUSALS: AtomicU64 = AtomicU64::new(0);

/// Commands refused for their capability so far, by every drive server of this process.
pub fn capability_refusals() -> u64 {
    CAPABILITY_REFUSALS.load(Ordering::Relaxed)
}

fn refused(why: impl std::fmt::Display) -> StoreError {
    metrics::counter!("mosaic_drive_capabilities_refused_total").increment(1);
    CAPABILITY_REFUSALS.fetch_add(1, Ordering::Relaxed);
    // Never in a healthy cluster: a node's bug, another cluster's node, or a forged command.
    tracing::warn!(%why, "a drive command refused for its capability");
    // Unavailable: to the caller's erasure set the drive cannot serve this command, as if it were
    // away (never an error of the client's request).
    StoreError::unavailable(format!("drive command refused: {why}"))
}

/// Whether `capability` (None: an unguarded server) reaches the drive's collection `name`.
fn check_covers(capability: Option<&Capability>, name: &str) -> StoreResult<()> {
    match capability {
        Some(c) if !c.covers(name) => Err(refused(format!("collection {name:?} lies outside scope {:?}", c.scope))),
        _ => Ok(()),
    }
}

/// Whether `capability` reaches collection `coll`, named by id, as `snapshot` names it. A collection the
/// snapshot does not have reaches nothing (the command finds nothing there).
fn check_coll<Sn: CollectionNames<Coll = wire::Coll>>(
    capability: Option<&Capability>,
    snapshot: &Sn,
    coll: wire::Coll,
) -> StoreResult<()> {
    if capability.is_none() {
        return Ok(());
    }
    match snapshot.collection_name(&coll)? {
        Some(name) => check_covers(capability, &name),
        None => Ok(()),
    }
}

/// Serves the drives of this node. Drives are stores whose collections and objects are numbered as the
/// engine numbers them.
pub struct DriveServer<S: Store<Coll = wire::Coll, Obj = wire::Obj>> {
    drives: HashMap<String, Arc<S>>,
    sessions: Mutex<Sessions<S>>,
    /// None: every request is served (a server outside a cluster map).
    guard: Option<Guard>,
    /// Requests served (for metrics and tests).
    requests: AtomicU64,
    /// The node's foreground work, in which every request marked foreground counts while it runs.
    foreground: Option<Arc<ForegroundWork>>,
}

fn limit(what: &str, max: usize) -> StoreError {
    StoreError::new(ErrorKind::Limit, format!("more than {max} {what} open on this node"))
}

impl<S: Store<Coll = wire::Coll, Obj = wire::Obj>> DriveServer<S>
where
    S::Snapshot: CollectionNames,
{
    /// Serves `drives`; with `guard`, only requests whose fence and capability it accepts (a request
    /// without them is refused); with `foreground`, counting the requests marked foreground in it.
    pub fn new(
        drives: HashMap<String, Arc<S>>,
        guard: Option<Guard>,
        foreground: Option<Arc<ForegroundWork>>,
    ) -> Arc<Self> {
        let sessions = Sessions { next_id: 1, snapshots: HashMap::new(), staged: HashMap::new() };
        let requests = AtomicU64::new(0);
        Arc::new(DriveServer { drives, sessions: Mutex::new(sessions), guard, requests, foreground })
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Whether `request` may be served, and the capability its command is checked against (None on an
    /// unguarded server): releases always may (they only give back what the caller held).
    fn admit(&self, request: &mut Request) -> StoreResult<Option<Capability>> {
        let Some(guard) = &self.guard else { return Ok(None) };
        let Some(ops) = request.command.ops() else { return Ok(None) };
        let checked = match &request.fence {
            Some(fence) => (guard.fence)(fence),
            None => Err(StoreError::unavailable("a drive call that names no cluster map is refused here")),
        };
        if let Err(e) = &checked {
            metrics::counter!("mosaic_drive_calls_refused_total").increment(1);
            tracing::debug!(drive = %request.drive, error = %e, "a drive call refused");
        }
        checked?;
        let capability = request.capability.take().ok_or_else(|| refused("no capability"))?;
        if let Err(e) = guard.capabilities.verify(&capability, &request.drive, capability::now_unix_ms()) {
            return Err(refused(format!("{e} (issued by node {})", capability.issuer)));
        }
        if !capability.allows(ops) {
            return Err(refused(format!("its capability allows {:?}, not {ops:?}", capability.ops)));
        }
        Ok(Some(capability))
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

    /// The snapshot `id` names, or a new one of `drive` when `id` is None (returned as opened). Under a
    /// capability, a held snapshot serves only the scope it was opened with.
    fn snapshot(
        &self,
        drive: &S,
        id: Option<SnapshotId>,
        capability: Option<&Capability>,
    ) -> StoreResult<(Arc<S::Snapshot>, SnapshotId, bool)> {
        let now = Instant::now();
        let scope = capability.map(|c| c.scope.clone());
        let mut s = self.sessions.lock();
        if let Some(id) = id {
            let Some(held) = s.snapshots.get_mut(&id) else {
                return Err(StoreError::unavailable(format!("snapshot {id} is not open on this node (expired?)")));
            };
            if held.scope.is_some() && held.scope != scope {
                return Err(refused(format!("snapshot {id} was opened for scope {:?}, not {scope:?}", held.scope)));
            }
            held.used = now;
            return Ok((held.snapshot.clone(), id, false));
        }
        if s.snapshots.len() >= MAX_SNAPSHOTS {
            s.snapshots.retain(|_, held| now.duration_since(held.used) < SNAPSHOT_IDLE);
            if s.snapshots.len() >= MAX_SNAPSHOTS {
                return Err(limit("snapshots", MAX_SNAPSHOTS));
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        let snapshot = Arc::new(drive.snapshot());
        s.snapshots.insert(id, HeldSnapshot { snapshot: snapshot.clone(), used: now, scope, found: HashSet::new() });
        Ok((snapshot, id, true))
    }

    /// Whether the objects a read names by id were found by reads in snapshot `id` (under a capability).
    fn check_found(&self, id: SnapshotId, command: &Command) -> StoreResult<()> {
        let objs = match command {
            Command::Attr { obj, .. } | Command::Attrs { obj, .. } | Command::Read { obj, .. } => {
                std::slice::from_ref(obj)
            }
            Command::StatMany { objs, .. } => objs.as_slice(),
            _ => return Ok(()),
        };
        let s = self.sessions.lock();
        let held = s.snapshots.get(&id).ok_or_else(|| StoreError::unavailable(format!("snapshot {id} expired")))?;
        match objs.iter().find(|o| !held.found.contains(o)) {
            Some(obj) => Err(refused(format!("object {obj} was not found by a read in snapshot {id}"))),
            None => Ok(()),
        }
    }

    /// Records the objects `answer` found in snapshot `id`, for later reads by id (under a capability).
    fn record_found(&self, id: SnapshotId, answer: &Answer) -> StoreResult<()> {
        let found: Vec<wire::Obj> = match answer {
            Answer::Lookup(Some(f)) => vec![f.info.obj],
            Answer::Entries(entries) => entries.iter().map(|e| e.obj).collect(),
            _ => return Ok(()),
        };
        let mut s = self.sessions.lock();
        let held = s.snapshots.get_mut(&id).ok_or_else(|| StoreError::unavailable(format!("snapshot {id} expired")))?;
        if held.found.len() + found.len() > MAX_SNAPSHOT_OBJECTS {
            return Err(StoreError::new(
                ErrorKind::Limit,
                format!("more than {MAX_SNAPSHOT_OBJECTS} objects found in one snapshot; read in a new one"),
            ));
        }
        held.found.extend(found);
        debug_assert!(held.found.len() <= MAX_SNAPSHOT_OBJECTS);
        Ok(())
    }

    fn keep_staged(&self, staged: S::Staged, scope: Option<String>) -> StoreResult<StagedId> {
        let now = Instant::now();
        let mut s = self.sessions.lock();
        if s.staged.len() >= MAX_STAGED {
            s.staged.retain(|_, (_, made, _)| now.duration_since(*made) < STAGED_IDLE);
            if s.staged.len() >= MAX_STAGED {
                return Err(limit("staged units", MAX_STAGED));
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        s.staged.insert(id, (staged, now, scope));
        Ok(id)
    }

    /// The staged units a transaction names, taken out of the table (a transaction consumes them), and
    /// the collections it names by id. Under a capability, only units staged under its scope are taken.
    fn take_staged(
        &self,
        txn: Txn<wire::Coll, StagedId>,
        capability: Option<&Capability>,
    ) -> StoreResult<(DriveTxn<S>, Vec<wire::Coll>)> {
        let scope = capability.map(|c| &c.scope);
        let mut s = self.sessions.lock();
        let mut ops = Vec::with_capacity(txn.ops.len());
        let mut colls = Vec::new();
        for (i, op) in txn.ops.into_iter().enumerate() {
            if let Op::CreateCollection { name } | Op::RemoveCollection { name } = &op {
                check_covers(capability, name).map_err(|e| e.in_op(i))?;
            }
            let note = |c: wire::Coll| {
                colls.push(c);
                Ok(c)
            };
            let op = op.try_map(note, |id| {
                let held = s.staged.get(&id).ok_or_else(|| {
                    StoreError::new(ErrorKind::InvalidArgument, format!("staged units {id} are not held here")).in_op(i)
                })?;
                if scope.is_some() && held.2.as_ref() != scope {
                    return Err(refused(format!("staged units {id} were staged for scope {:?}", held.2)).in_op(i));
                }
                let (staged, _, _) = s.staged.remove(&id).expect("held: looked up above");
                Ok(staged)
            })?;
            ops.push(op);
        }
        Ok((Txn { ops, priority: txn.priority }, colls))
    }

    async fn run(&self, mut request: Request) -> Reply {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let _foreground = self.foreground.as_ref().filter(|_| request.foreground).map(|f| f.begin());
        self.release(&request.release_snapshots, &request.release_staged);
        let capability = match self.admit(&mut request) {
            Ok(c) => c,
            Err(e) => return Reply { opened: None, answer: Err(e) },
        };
        let Some(drive) = self.drives.get(&request.drive).cloned() else {
            let e = StoreError::unavailable(format!("no drive {} on this node", request.drive));
            return Reply { opened: None, answer: Err(e) };
        };
        let mut opened = None;
        // In the caller's IO share: this node's drives schedule the command as its microstore's.
        let work = self.command(&drive, request.command, capability.as_ref(), &mut opened);
        let work = mosaic_store::with_io_share(request.io_share, work);
        // A client's command runs as foreground work here too (the drive keeps what it reads verified).
        let answer = if request.foreground { mosaic_store::in_foreground(work).await } else { work.await };
        if answer.is_err()
            && let Some(id) = opened.take()
        {
            // A read that failed keeps no snapshot the client would not know to release.
            self.release(&[id], &[]);
        }
        Reply { opened, answer }
    }

    async fn command(
        &self,
        drive: &S,
        command: Command,
        capability: Option<&Capability>,
        opened: &mut Option<SnapshotId>,
    ) -> StoreResult<Answer> {
        if let Some(id) = command.snapshot() {
            let (snapshot, id, new) = self.snapshot(drive, id, capability)?;
            if new {
                *opened = Some(id);
            }
            if capability.is_none() {
                return read(&*snapshot, command).await;
            }
            check_read(capability, &*snapshot, &command)?;
            self.check_found(id, &command)?;
            let answer = read(&*snapshot, command).await?;
            self.record_found(id, &answer)?;
            return Ok(answer);
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
                let id = self.keep_staged(staged, capability.map(|c| c.scope.clone()))?;
                Ok(Answer::Staged { id, len_bytes: len_bytes as u64 })
            }
            Command::Commit { txn } => {
                let (txn, colls) = self.take_staged(txn, capability)?;
                if capability.is_some() {
                    // Collections as they are now: the transaction applies to the latest state.
                    let now = drive.snapshot();
                    for coll in colls {
                        check_coll(capability, &now, coll)?;
                    }
                }
                Ok(Answer::Committed(drive.commit(txn).await?))
            }
            _ => unreachable!("reads are answered above"),
        }
    }
}

/// Whether the collections a snapshot read names lie in `capability`'s scope.
fn check_read<Sn: CollectionNames<Coll = wire::Coll>>(
    capability: Option<&Capability>,
    snapshot: &Sn,
    command: &Command,
) -> StoreResult<()> {
    match command {
        Command::Collection { name, .. } => check_covers(capability, name),
        Command::Collections { prefix, .. } => check_covers(capability, prefix),
        Command::Lookup { coll, .. } | Command::ListEntries { coll, .. } => check_coll(capability, snapshot, *coll),
        _ => Ok(()),
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

impl<S: Store<Coll = wire::Coll, Obj = wire::Obj>> Handler for DriveServer<S>
where
    S::Snapshot: CollectionNames,
{
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
