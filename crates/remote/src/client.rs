//! A drive on another node as a store: every store method is one request to the node's drive server.
//! A snapshot is opened on the server by its first read (no call of its own) and released in passing
//! by a later request; staged units are consumed by the commit that names them, or released in passing
//! when dropped unused. In a cluster every command carries the caller's fence and a capability this
//! node issues for what the command reaches (`Caller`).

use crate::wire::{self, Answer, Command, Fence, GroupPlacement, Reply, Request, SnapshotId, StagedId};
use async_trait::async_trait;
use bytes::Bytes;
use mosaic_cluster::capability::{self, Capability, CapabilityKey, Ops};
use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::rpc::{Parts, RpcClient, RpcError};
use mosaic_store::{
    AlignedBuf, ErrorKind, Geometry, NameEntry, ObjectInfo, Outcome, PriorityHold, Snapshot, Store, StoreError,
    StoreResult, StripeLane, Txn,
};
use parking_lot::Mutex;
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long one drive command may take before the drive counts as not answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Releases queued before they are sent on their own rather than waiting for the next request.
const MAX_QUEUED_RELEASES: usize = 256;

/// Ids the client let go of, sent with its next request.
#[derive(Default)]
struct Releases {
    snapshots: Vec<SnapshotId>,
    staged: Vec<StagedId>,
}

struct Remote {
    client: RpcClient,
    addr: String,
    drive: String,
    releases: Mutex<Releases>,
    ready: AtomicBool,
}

impl Remote {
    fn unavailable(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::unavailable(format!("drive {} on {}: {e}", self.drive, self.addr))
    }

    async fn send(&self, command: Command, caller: Option<&Caller>) -> StoreResult<(Option<SnapshotId>, Answer)> {
        let body = self.request(command, caller)?;
        let raw = self.client.call_raw(&self.addr, wire::PATH, body, CALL_TIMEOUT).await.map_err(|e| self.failed(e))?;
        self.ready.store(true, Ordering::Relaxed);
        let (mut reply, payload): (Reply, Bytes) =
            frame::decode_binary(Kind::Drive, &raw).map_err(|e| self.unavailable(e))?;
        reply.put_payload(payload).map_err(|e| self.unavailable(e))?;
        Ok((reply.opened, reply.answer?))
    }

    /// A read on an open snapshot whose answer's bytes are written into `pieces` from byte `at` as they
    /// arrive (one copy, out of the received parts), not gathered first: the bytes read. The frame's
    /// checksum is checked once all came, so on an error the pieces hold nothing to be used.
    async fn read_into_pieces(
        &self,
        command: Command,
        caller: Option<&Caller>,
        pieces: &mut [&mut [std::mem::MaybeUninit<u8>]],
        at: usize,
    ) -> StoreResult<u64> {
        debug_assert!(matches!(command, Command::Read { snapshot: Some(_), .. }), "a read on an open snapshot");
        let room = pieces.iter().map(|p| p.len()).sum::<usize>().saturating_sub(at);
        let body = self.request(command, caller)?;
        let mut answer =
            self.client.call_streamed(&self.addr, wire::PATH, body, CALL_TIMEOUT).await.map_err(|e| self.failed(e))?;
        self.ready.store(true, Ordering::Relaxed);
        let mut frame = frame::BinaryReceiver::new(Kind::Drive);
        let mut written = 0usize;
        while let Some(part) = answer.next_part().await.map_err(|e| self.failed(e))? {
            let payload = frame.feed(&part).map_err(|e| self.unavailable(e))?;
            if payload.len() > room - written {
                return Err(StoreError::corrupt(format!("a drive answered more than the {room} bytes asked")));
            }
            let copied = mosaic_store::copy_into_pieces_at(payload, pieces, at + written);
            debug_assert_eq!(copied, payload.len(), "the pieces have room for what was checked above");
            written += copied;
        }
        let reply: Reply = frame.finish().map_err(|e| self.unavailable(e))?;
        debug_assert!(reply.opened.is_none(), "a read on an open snapshot opens none");
        match reply.answer? {
            Answer::Data { bytes } if bytes.is_empty() => Ok(written as u64),
            other => Err(unexpected(&other)),
        }
    }

    /// A request's body: the command with the caller's fence and capability and the queued releases.
    fn request(&self, command: Command, caller: Option<&Caller>) -> StoreResult<Parts> {
        let (release_snapshots, release_staged) = {
            let mut r = self.releases.lock();
            (std::mem::take(&mut r.snapshots), std::mem::take(&mut r.staged))
        };
        let fence = caller.map(|c| c.fence.clone());
        let capability = caller.map(|c| c.capability());
        let foreground = mosaic_store::is_foreground();
        let io_share = mosaic_store::io_share();
        let drive = self.drive.clone();
        let mut request =
            Request { drive, fence, capability, foreground, io_share, release_snapshots, release_staged, command };
        let payload = request.take_payload();
        let head = frame::encode_binary(Kind::Drive, &request, &payload).map_err(|e| self.unavailable(e))?;
        Ok(Parts::new(head, payload))
    }

    /// A call that failed: the drive is not ready when its node did not answer. What was to be released
    /// with it is released by the server's idle limit instead.
    fn failed(&self, e: RpcError) -> StoreError {
        if matches!(e, RpcError::Unreachable { .. }) {
            self.ready.store(false, Ordering::Relaxed);
        }
        self.unavailable(e)
    }

    /// Queues releases; past the limit they go at once, in a request of their own.
    fn release(self: &Arc<Self>, snapshot: Option<SnapshotId>, staged: Option<StagedId>) {
        let flush = {
            let mut r = self.releases.lock();
            r.snapshots.extend(snapshot);
            r.staged.extend(staged);
            r.snapshots.len() + r.staged.len() >= MAX_QUEUED_RELEASES
        };
        if flush && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let remote = self.clone();
            runtime.spawn(async move {
                if let Err(e) = remote.send(Command::Release, None).await {
                    tracing::debug!(error = %e, "releasing on a remote drive");
                }
            });
        }
    }
}

/// Who sends a drive's commands in a cluster: the fence of the map they are planned from and the
/// capability they carry, issued by this node for the drive's collections under `scope` and renewed
/// before it expires.
struct Caller {
    fence: Fence,
    key: CapabilityKey,
    drive: String,
    scope: String,
    ops: Ops,
    current: Mutex<Capability>,
}

impl Caller {
    fn new(fence: Fence, key: CapabilityKey, drive: &str, scope: &str, ops: Ops) -> Self {
        let current = key.issue(fence.node, drive, scope, ops, capability::now_unix_ms());
        let (drive, scope) = (drive.to_string(), scope.to_string());
        Caller { fence, key, drive, scope, ops, current: Mutex::new(current) }
    }

    /// The capability to send now: a new one once half the last one's life is gone, so that one sent
    /// never expires on the way.
    fn capability(&self) -> Capability {
        let now = capability::now_unix_ms();
        let mut current = self.current.lock();
        if current.expires_unix_ms.saturating_sub(now) < capability::LIFETIME_MS / 2 {
            *current = self.key.issue(self.fence.node, &self.drive, &self.scope, self.ops, now);
        }
        debug_assert!(current.expires_unix_ms >= now);
        current.clone()
    }
}

fn unexpected(answer: &Answer) -> StoreError {
    StoreError::internal(format!("a drive answered {answer:?} to another command"))
}

/// A drive on another node. Cheap to clone.
#[derive(Clone)]
pub struct RemoteStore {
    remote: Arc<Remote>,
    geometry: Geometry,
    /// Sent with every command (the caller's view of the cluster and what it may reach).
    caller: Option<Arc<Caller>>,
}

impl RemoteStore {
    /// Connects to drive `drive` served at `addr`: asks for its geometry (the drive must answer). `fence`
    /// goes with every command, with a capability signed with `client`'s cluster key that allows only
    /// connecting until `for_group` names what the commands reach; a server in a cluster refuses commands
    /// without them.
    pub async fn connect(client: RpcClient, addr: &str, drive: &str, fence: Option<Fence>) -> StoreResult<Self> {
        let caller = fence.map(|f| Arc::new(Caller::new(f, client.capability_key(), drive, "", Ops::CONNECT)));
        let remote = Arc::new(Remote {
            client,
            addr: addr.to_string(),
            drive: drive.to_string(),
            releases: Mutex::new(Releases::default()),
            ready: AtomicBool::new(false),
        });
        let (_, answer) = remote.send(Command::Hello, caller.as_deref()).await?;
        let Answer::Hello { geometry, ready } = answer else { return Err(unexpected(&answer)) };
        remote.ready.store(ready, Ordering::Relaxed);
        Ok(RemoteStore { remote, geometry, caller })
    }

    /// The same drive as one placement group's commands reach it: they name the group's placement as the
    /// caller's map has it (the drive's node refuses them once its map places the group otherwise), and
    /// carry capabilities for everything a set does on the drive's collections under `scope` (the group's
    /// shard position on the drive), and nothing else.
    pub fn for_group(&self, group: GroupPlacement, scope: &str) -> RemoteStore {
        let caller = self.caller.as_deref().map(|c| {
            let fence = Fence { group: Some(group), ..c.fence.clone() };
            Arc::new(Caller::new(fence, c.key.clone(), &self.remote.drive, scope, Ops::SET))
        });
        RemoteStore { caller, ..self.clone() }
    }

    fn caller(&self) -> Option<&Caller> {
        self.caller.as_deref()
    }
}

/// Staged units held on the remote drive.
pub struct RemoteStaged {
    remote: Arc<Remote>,
    id: Option<StagedId>,
    len_bytes: u64,
}

impl RemoteStaged {
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
}

impl Drop for RemoteStaged {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.remote.release(None, Some(id));
        }
    }
}

#[async_trait]
impl Store for RemoteStore {
    type Coll = wire::Coll;
    type Obj = wire::Obj;
    type Staged = RemoteStaged;
    type Snapshot = RemoteSnapshot;

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn snapshot(&self) -> RemoteSnapshot {
        RemoteSnapshot {
            remote: self.remote.clone(),
            caller: self.caller.clone(),
            id: tokio::sync::OnceCell::new(),
            prefetched: Mutex::default(),
        }
    }

    async fn stage(&self, buf: AlignedBuf, len_bytes: usize, hint: &[u8]) -> StoreResult<(RemoteStaged, AlignedBuf)> {
        if len_bytes == 0 || len_bytes > buf.len() {
            return Err(StoreError::new(ErrorKind::InvalidArgument, "staged bytes must lie in the buffer"));
        }
        // One copy: the buffer goes back to the caller, the copy travels as the request's payload.
        let data = Bytes::copy_from_slice(&buf.as_slice()[..len_bytes]);
        let command = Command::Stage { hint: ByteBuf::from(hint), data };
        let (_, answer) = self.remote.send(command, self.caller()).await?;
        let Answer::Staged { id, len_bytes: got } = answer else { return Err(unexpected(&answer)) };
        let staged = RemoteStaged { remote: self.remote.clone(), id: Some(id), len_bytes: got };
        if got != len_bytes as u64 {
            return Err(StoreError::internal(format!("a drive staged {got} bytes of {len_bytes}")));
        }
        Ok((staged, buf))
    }

    async fn commit(&self, txn: Txn<wire::Coll, RemoteStaged>) -> StoreResult<Outcome> {
        let mut ops = Vec::with_capacity(txn.ops.len());
        for (i, op) in txn.ops.into_iter().enumerate() {
            ops.push(op.try_map(Ok, |mut staged: RemoteStaged| {
                // Handed to the transaction: the server consumes the units, nothing to release.
                staged.id.take().ok_or_else(|| StoreError::internal("staged units used twice").in_op(i))
            })?);
        }
        let commit = Command::Commit { txn: Txn { ops, priority: txn.priority } };
        let (_, answer) = self.remote.send(commit, self.caller()).await?;
        let Answer::Committed(outcome) = answer else { return Err(unexpected(&answer)) };
        Ok(outcome)
    }

    fn hold_priority(&self) -> PriorityHold {
        // Held on the caller's side only: background work on the remote node does not yet see it.
        Box::new(())
    }

    fn is_ready(&self) -> bool {
        self.remote.ready.load(Ordering::Relaxed)
    }

    async fn close(&self) -> StoreResult<()> {
        // The drive belongs to its node; closing here only sends what is queued for release.
        self.remote.send(Command::Release, None).await.map(|_| ())
    }
}

/// A snapshot of a remote drive, opened on the server by its first read.
pub struct RemoteSnapshot {
    remote: Arc<Remote>,
    caller: Option<Arc<Caller>>,
    id: tokio::sync::OnceCell<SnapshotId>,
    /// What lookups brought along, by object: served here, as the snapshot is one view (bounded).
    prefetched: Mutex<HashMap<wire::Obj, Prefetched>>,
}

/// Objects whose prefetched attributes and bytes a snapshot keeps.
const MAX_PREFETCHED: usize = 64;

struct Prefetched {
    attrs: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    data: Option<Bytes>,
}

impl Drop for RemoteSnapshot {
    fn drop(&mut self) {
        if let Some(id) = self.id.get() {
            self.remote.release(Some(*id), None);
        }
    }
}

impl RemoteSnapshot {
    /// Sends a read: the first one opens the snapshot (its answer is kept), later ones name it.
    async fn ask(&self, command: impl Fn(Option<SnapshotId>) -> Command) -> StoreResult<Answer> {
        let mut first = None;
        let id = self
            .id
            .get_or_try_init(|| async {
                let (opened, answer) = self.remote.send(command(None), self.caller.as_deref()).await?;
                let id = opened.ok_or_else(|| StoreError::internal("a drive opened no snapshot for a read"))?;
                first = Some(answer);
                Ok::<_, StoreError>(id)
            })
            .await?;
        if let Some(answer) = first {
            return Ok(answer);
        }
        let (opened, answer) = self.remote.send(command(Some(*id)), self.caller.as_deref()).await?;
        debug_assert!(opened.is_none(), "a read on an open snapshot opens none");
        Ok(answer)
    }
}

fn bytes(b: ByteBuf) -> Vec<u8> {
    b.into_vec()
}

#[async_trait]
impl Snapshot for RemoteSnapshot {
    type Coll = wire::Coll;
    type Obj = wire::Obj;

    async fn collection(&self, name: &str) -> StoreResult<Option<wire::Coll>> {
        match self.ask(|snapshot| Command::Collection { snapshot, name: name.to_string() }).await? {
            Answer::Collection(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    async fn collections(&self, prefix: &str, limit: usize) -> StoreResult<Vec<(String, wire::Coll)>> {
        let limit = limit as u64;
        match self.ask(|snapshot| Command::Collections { snapshot, prefix: prefix.to_string(), limit }).await? {
            Answer::Collections(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    async fn lookup(&self, coll: &wire::Coll, name: &[u8]) -> StoreResult<Option<ObjectInfo<wire::Obj>>> {
        let coll = *coll;
        let found = match self.ask(|snapshot| Command::Lookup { snapshot, coll, name: ByteBuf::from(name) }).await? {
            Answer::Lookup(found) => found,
            other => return Err(unexpected(&other)),
        };
        let Some(found) = found else { return Ok(None) };
        if found.data.as_ref().is_some_and(|d| d.len() as u64 != found.info.size_bytes) {
            return Err(StoreError::corrupt("a drive sent an object whose length is not its size"));
        }
        let mut prefetched = self.prefetched.lock();
        if prefetched.len() < MAX_PREFETCHED {
            let attrs = found.attrs.map(|a| a.into_iter().map(|(k, v)| (bytes(k), bytes(v))).collect());
            let data = found.data.map(|d| Bytes::from(d.into_vec()));
            prefetched.insert(found.info.obj, Prefetched { attrs, data });
        }
        Ok(Some(found.info))
    }

    async fn attr(&self, obj: &wire::Obj, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        if let Some(Prefetched { attrs: Some(attrs), .. }) = self.prefetched.lock().get(obj) {
            return Ok(attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()));
        }
        let obj = *obj;
        match self.ask(|snapshot| Command::Attr { snapshot, obj, key: ByteBuf::from(key) }).await? {
            Answer::Attr(value) => Ok(value.map(bytes)),
            other => Err(unexpected(&other)),
        }
    }

    async fn attrs(&self, obj: &wire::Obj, start_after: &[u8], limit: usize) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        if let Some(Prefetched { attrs: Some(attrs), .. }) = self.prefetched.lock().get(obj) {
            // Attributes come in key order, as the drive lists them.
            return Ok(attrs.iter().filter(|(k, _)| k.as_slice() > start_after).take(limit).cloned().collect());
        }
        let (obj, limit) = (*obj, limit as u64);
        let command = |snapshot| Command::Attrs { snapshot, obj, start_after: ByteBuf::from(start_after), limit };
        match self.ask(command).await? {
            Answer::Attrs(attrs) => Ok(attrs.into_iter().map(|(k, v)| (bytes(k), bytes(v))).collect()),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_entries(
        &self,
        coll: &wire::Coll,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> StoreResult<Vec<NameEntry<wire::Obj>>> {
        let (coll, limit) = (*coll, limit as u64);
        let command = |snapshot| Command::ListEntries {
            snapshot,
            coll,
            prefix: ByteBuf::from(prefix),
            from: ByteBuf::from(from),
            limit,
        };
        match self.ask(command).await? {
            Answer::Entries(entries) => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    async fn stat_many(
        &self,
        objs: &[wire::Obj],
        attr_key: &[u8],
    ) -> StoreResult<Vec<(ObjectInfo<wire::Obj>, Option<Vec<u8>>)>> {
        let mut out = Vec::with_capacity(objs.len());
        for chunk in objs.chunks(crate::server::MAX_LIST_ENTRIES as usize) {
            let command =
                |snapshot| Command::StatMany { snapshot, objs: chunk.to_vec(), attr_key: ByteBuf::from(attr_key) };
            match self.ask(command).await? {
                Answer::Stats(stats) => out.extend(stats.into_iter().map(|(i, a)| (i, a.map(bytes)))),
                other => return Err(unexpected(&other)),
            }
        }
        Ok(out)
    }

    async fn read(&self, obj: &wire::Obj, offset: u64, len: u64) -> StoreResult<Bytes> {
        if let Some(Prefetched { data: Some(data), .. }) = self.prefetched.lock().get(obj) {
            let start = offset.min(data.len() as u64) as usize;
            let end = offset.saturating_add(len).min(data.len() as u64) as usize;
            return Ok(data.slice(start..end));
        }
        let obj = *obj;
        let mut out: Vec<u8> = Vec::new();
        // Longer ranges come in pieces; a piece shorter than asked is the end of the object.
        while (out.len() as u64) < len {
            let at = offset.saturating_add(out.len() as u64);
            let want = (len - out.len() as u64).min(crate::server::MAX_READ_BYTES);
            let piece = match self.ask(|snapshot| Command::Read { snapshot, obj, offset: at, len: want }).await? {
                Answer::Data { bytes } => bytes,
                other => return Err(unexpected(&other)),
            };
            if piece.len() as u64 > want {
                return Err(StoreError::corrupt(format!("a drive answered {} bytes to a read of {want}", piece.len())));
            }
            let short = (piece.len() as u64) < want;
            if out.is_empty() && (short || want == len) {
                // The reply's own buffer: not copied on this side either.
                return Ok(piece);
            }
            out.extend_from_slice(&piece);
            if short {
                break;
            }
        }
        Ok(Bytes::from(out))
    }

    async fn read_into(&self, obj: &wire::Obj, offset: u64, mut lane: StripeLane) -> StoreResult<u64> {
        let id = self.id.get().copied();
        let prefetched = self.prefetched.lock().get(obj).is_some_and(|p| p.data.is_some());
        let Some(id) = id.filter(|_| !prefetched) else {
            // A read that opens the snapshot, or of bytes a lookup brought: read, then copy.
            let bytes = self.read(obj, offset, lane.len_bytes() as u64).await?;
            return Ok(lane.fill_from(&bytes) as u64);
        };
        let obj = *obj;
        let len = lane.len_bytes() as u64;
        let mut done = 0u64;
        let mut pieces = lane.pieces_mut();
        // Longer ranges come in pieces; a piece shorter than asked is the end of the object.
        while done < len {
            let want = (len - done).min(crate::server::MAX_READ_BYTES);
            let command = Command::Read { snapshot: Some(id), obj, offset: offset.saturating_add(done), len: want };
            let got = self.remote.read_into_pieces(command, self.caller.as_deref(), &mut pieces, done as usize).await?;
            if got > want {
                return Err(StoreError::corrupt(format!("a drive answered {got} bytes to a read of {want}")));
            }
            done += got;
            if got < want {
                break;
            }
        }
        drop(pieces);
        debug_assert!(done <= len);
        if done == len {
            // SAFETY: every byte of the lane's pieces was written above, by reads whose frames checked.
            unsafe { lane.set_filled() };
        }
        Ok(done)
    }

    fn prioritize(&self) {
        // Sent on its own (the caller does not wait); a snapshot not opened yet has nothing to mark.
        let remote = self.remote.clone();
        let caller = self.caller.clone();
        let id = self.id.get().copied();
        if let (Some(id), Ok(runtime)) = (id, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                let _ = remote.send(Command::Prioritize { snapshot: Some(id) }, caller.as_deref()).await;
            });
        }
    }
}
