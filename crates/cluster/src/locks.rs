//! Object locks across nodes: a write holds its objects' locks on a majority of the cluster's nodes from
//! planning until its outcome is decided, so that two nodes never interleave their writes of one object on
//! its drives (a node's own locks order only its own writes). Like MinIO's dsync, with leases:
//!
//! - Every node keeps a `LockTable` of the locks it granted, each with a lease of `LOCK_LEASE`; a lock not
//!   released in time (its writer died) lapses by itself. A restarted node grants nothing for one lease
//!   (what it granted before it stopped may still be held).
//! - A `LockClient` asks the first member not marked down (the arbiter, so that writers of one key do not
//!   split the grants between them), then every other member not marked down at once, and holds the lock
//!   when more than half of the map's members that are not dead (`lock_servers`) granted it; otherwise it
//!   releases what it got and tries again after a random pause, up to `LockClientConfig::acquire_within`.
//!   Two writers of one object can never both hold a majority of the same members.
//! - A writer uses its locks only while `LockClient::USE_WITHIN` of their lease is left
//!   (`HeldLocks::holds`): a commit begun later could land after another writer took over.
//! - Calls carry the caller's view of the members (a digest); a node with another view grants nothing
//!   until the maps agree. Members change one node at a time (a join, a removal, a node declared dead), and
//!   any majority of the members before a change meets any majority after it, so two writers seeing
//!   consecutive maps still exclude each other.
//! - Calls to one node are batched: while a call is in flight, what arrives waits for the next, so a busy
//!   node sends one call per round trip instead of one per write.

use crate::map::{ClusterMap, NodeState};
use crate::placement::NodeId;
use crate::rpc::{self, Answer, Handler, RpcClient};
use bytes::Bytes;
use hyper::StatusCode;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

pub const PATH_LOCK: &str = "/lock/batch";
/// How long a granted lock holds without being released.
pub const LOCK_LEASE: Duration = Duration::from_secs(10);
/// Most locks a node holds granted at once; past it, it refuses more (a write retries).
pub const MAX_HELD_LOCKS: usize = 1 << 20;
/// Most keys one write locks (a multipart completion of 10,000 parts locks each part).
pub const MAX_KEYS_PER_LOCK: usize = 1 << 16;
/// Most grants and releases in one call to a node.
const MAX_BATCH: usize = 256;
/// Items waiting for their call to one node; more wait for room.
const QUEUE_DEPTH: usize = 4096;
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a round waits for the arbiter before it asks the others anyway (a node that stopped answering
/// is not marked down for seconds).
const ARBITER_WAIT: Duration = Duration::from_millis(200);
/// Longest pause between two tries of a lock another writer holds.
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// Who holds a lock: a node and a number it never gives twice while it runs (a random start, so a
/// restarted node does not reuse a holder of its former run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holder {
    pub node: NodeId,
    pub seq: u64,
}

/// One node's granted locks.
pub struct LockTable {
    held: Mutex<HashMap<u64, (Holder, Instant)>>,
    /// Grants start then (a restarted node waits out the leases it may have granted before).
    grants_from: Instant,
    max_held: usize,
}

/// Why a node did not grant a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Another writer holds one of the keys.
    Held,
    /// The node restarted less than a lease ago.
    Starting,
    /// The node holds `MAX_HELD_LOCKS`.
    Full,
    /// The caller's members differ from the node's.
    OtherView,
    /// The node did not answer.
    Unanswered,
}

impl LockTable {
    /// A table of a node that may have granted locks before (`restarted`): it grants none for a lease.
    pub fn new(restarted: bool) -> Self {
        Self::with_limit(restarted, MAX_HELD_LOCKS)
    }

    fn with_limit(restarted: bool, max_held: usize) -> Self {
        let now = Instant::now();
        LockTable {
            held: Mutex::new(HashMap::new()),
            grants_from: if restarted { now + LOCK_LEASE } else { now },
            max_held,
        }
    }

    /// Grants every key of `keys` to `holder`, or none of them. A key `holder` holds already is renewed.
    pub fn grant(&self, holder: Holder, keys: &[u64]) -> Result<(), Refusal> {
        let now = Instant::now();
        if now < self.grants_from {
            return Err(Refusal::Starting);
        }
        let mut held = self.held.lock();
        let taken = |k: &u64| held.get(k).is_some_and(|(h, until)| *h != holder && *until > now);
        if keys.iter().any(taken) {
            return Err(Refusal::Held);
        }
        if held.len() + keys.len() > self.max_held {
            held.retain(|_, (_, until)| *until > now);
            if held.len() + keys.len() > self.max_held {
                return Err(Refusal::Full);
            }
        }
        let until = now + LOCK_LEASE;
        for k in keys {
            held.insert(*k, (holder, until));
        }
        debug_assert!(keys.iter().all(|k| held.get(k).is_some_and(|(h, _)| *h == holder)));
        Ok(())
    }

    /// Releases the keys of `keys` that `holder` holds (others' are left alone).
    pub fn release(&self, holder: Holder, keys: &[u64]) {
        let mut held = self.held.lock();
        for k in keys {
            if held.get(k).is_some_and(|(h, _)| *h == holder) {
                held.remove(k);
            }
        }
    }

    /// Locks held (lapsed ones included until they are swept).
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The nodes whose majority a lock needs: every member the map has not declared dead, by id.
pub fn lock_servers(map: &ClusterMap) -> Vec<(NodeId, &str, NodeState)> {
    map.nodes
        .iter()
        .filter(|(_, n)| n.state != NodeState::Dead)
        .map(|(id, n)| (*id, n.address.as_str(), n.state))
        .collect()
}

/// A digest of the members (their ids): a call and its node must agree on it.
pub fn view_of(map: &ClusterMap) -> u64 {
    let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme);
    for (id, _, _) in lock_servers(map) {
        h.update(&id.to_be_bytes());
    }
    h.finalize()
}

#[derive(Debug, Serialize, Deserialize)]
struct LockCall {
    /// Each grant with the members its caller saw.
    grants: Vec<(Holder, u64, Vec<u64>)>,
    releases: Vec<(Holder, Vec<u64>)>,
}

impl LockCall {
    /// At most `MAX_BATCH` grants and releases, each of at most `MAX_KEYS_PER_LOCK` keys.
    fn within_limits(&self) -> bool {
        let mut keys = self.grants.iter().map(|(_, _, k)| k.len()).chain(self.releases.iter().map(|(_, k)| k.len()));
        self.grants.len() + self.releases.len() <= MAX_BATCH && keys.all(|n| n <= MAX_KEYS_PER_LOCK)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct LockAnswer {
    /// One per grant asked, in order.
    grants: Vec<Result<(), Refusal>>,
}

/// A node's side of the lock calls: its table, checked against its map.
pub struct LockServer {
    table: Arc<LockTable>,
    map: watch::Receiver<Arc<ClusterMap>>,
}

impl LockServer {
    pub fn new(table: Arc<LockTable>, map: watch::Receiver<Arc<ClusterMap>>) -> Arc<Self> {
        Arc::new(LockServer { table, map })
    }

    fn answer(&self, call: LockCall) -> LockAnswer {
        let view = view_of(&self.map.borrow());
        // Grants before releases: a grant and its release in one call came in that order.
        let grants = call
            .grants
            .iter()
            .map(|(holder, v, keys)| if *v == view { self.table.grant(*holder, keys) } else { Err(Refusal::OtherView) })
            .collect();
        for (holder, keys) in &call.releases {
            self.table.release(*holder, keys);
        }
        LockAnswer { grants }
    }
}

impl Handler for LockServer {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        Box::pin(async move {
            if path != PATH_LOCK {
                return Err((StatusCode::NOT_FOUND, format!("no lock call {path}")));
            }
            let call: LockCall = rpc::parse(&body)?;
            if !call.within_limits() {
                return Err((StatusCode::BAD_REQUEST, "a lock call over its limits".into()));
            }
            rpc::answer(&self.answer(call))
        })
    }
}

#[derive(Clone, Debug)]
pub struct LockClientConfig {
    /// How long a write waits for its locks before it gives up (503, the client retries).
    pub acquire_within: Duration,
}

impl Default for LockClientConfig {
    fn default() -> Self {
        // A writer that died holding a lock keeps it for a lease; waiting a little longer outlives it.
        LockClientConfig { acquire_within: LOCK_LEASE + Duration::from_secs(5) }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LockError {
    #[error("the object is being written through another node; try again")]
    Busy,
    #[error("a write locks at most {MAX_KEYS_PER_LOCK} objects")]
    TooMany,
    #[error("the cluster has no nodes")]
    NoMembers,
}

/// What waits for a call to one node.
enum Item {
    Grant(Holder, Arc<Vec<u64>>, u64, oneshot::Sender<Result<(), Refusal>>),
    Release(Holder, Arc<Vec<u64>>),
}

/// A node's side of taking locks: calls to every member, its own table called directly.
pub struct LockClient {
    me: NodeId,
    table: Arc<LockTable>,
    map: watch::Receiver<Arc<ClusterMap>>,
    rpc: RpcClient,
    cfg: LockClientConfig,
    next_seq: AtomicU64,
    /// One queue per member address, each drained by its own task.
    queues: Mutex<HashMap<String, mpsc::Sender<Item>>>,
}

impl LockClient {
    /// Locks are used for at most this much of their lease after they were asked for.
    pub const USE_WITHIN: Duration = Duration::from_secs(LOCK_LEASE.as_secs() / 2);

    pub fn new(
        me: NodeId,
        table: Arc<LockTable>,
        map: watch::Receiver<Arc<ClusterMap>>,
        rpc: RpcClient,
        cfg: LockClientConfig,
    ) -> Arc<Self> {
        Arc::new(LockClient {
            me,
            table,
            map,
            rpc,
            cfg,
            next_seq: AtomicU64::new(rand::random::<u64>() >> 1),
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// Takes `keys` on a majority of the members; they are released when the answer is dropped.
    pub async fn acquire(self: &Arc<Self>, mut keys: Vec<u64>) -> Result<HeldLocks, LockError> {
        keys.sort_unstable();
        keys.dedup();
        if keys.len() > MAX_KEYS_PER_LOCK {
            return Err(LockError::TooMany);
        }
        let keys = Arc::new(keys);
        let deadline = Instant::now() + self.cfg.acquire_within;
        let mut attempt = 0u32;
        loop {
            let holder = Holder { node: self.me, seq: self.next_seq.fetch_add(1, Ordering::Relaxed) };
            let asked_at = Instant::now();
            let (granted, asked) = self.try_once(holder, &keys).await?;
            if granted {
                return Ok(HeldLocks { client: self.clone(), holder, keys, asked, asked_at });
            }
            self.release(holder, &keys, &asked);
            if Instant::now() >= deadline {
                return Err(LockError::Busy);
            }
            let cap_ms = (1u64 << attempt.min(6)).min(MAX_BACKOFF.as_millis() as u64);
            let pause = Duration::from_micros(rand::random_range(0..=cap_ms * 1000));
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            attempt += 1;
        }
    }

    /// One round: asks the first member that is up (the arbiter), then, once it granted, every other
    /// member that is up, and waits until a majority granted or cannot any more. Returns whether it did,
    /// and the addresses asked (released later whatever they answered). Asking the arbiter first keeps
    /// writers of one key from splitting the members' grants between them (each holding its own node's,
    /// none a majority); the majority, not the arbiter, is what excludes them.
    async fn try_once(
        self: &Arc<Self>,
        holder: Holder,
        keys: &Arc<Vec<u64>>,
    ) -> Result<(bool, Vec<String>), LockError> {
        let map = self.map.borrow().clone();
        let servers = lock_servers(&map);
        if servers.is_empty() {
            return Err(LockError::NoMembers);
        }
        let view = view_of(&map);
        let need = servers.len() / 2 + 1;
        let up: Vec<(NodeId, &str)> =
            servers.iter().filter(|(_, _, state)| *state != NodeState::Down).map(|(id, a, _)| (*id, *a)).collect();
        let mut asked = Vec::new();
        let Some((&arbiter, rest)) = up.split_first() else { return Ok((false, asked)) };
        let mut granted = 0;
        let mut waiting = futures::stream::FuturesUnordered::new();
        match self.grant_at(arbiter, holder, keys, view, &mut asked).await {
            Arbiter::Granted => granted += 1,
            // Another writer holds the key: it is ahead; nothing else is asked.
            Arbiter::Held => return Ok((false, asked)),
            // It cannot arbitrate now (another view, restarting, unreachable): the majority alone decides.
            Arbiter::Refused => {}
            Arbiter::Late(rx) => waiting.push(rx),
        }
        for &(id, address) in rest {
            if id == self.me {
                granted += usize::from(self.table.grant(holder, keys).is_ok());
                continue;
            }
            let (tx, rx) = oneshot::channel();
            if self.send(address, Item::Grant(holder, keys.clone(), view, tx)).await {
                asked.push(address.to_string());
                waiting.push(rx);
            }
        }
        let mut left = waiting.len();
        use futures::StreamExt;
        while granted < need && granted + left >= need {
            let Some(answer) = waiting.next().await else { break };
            left -= 1;
            granted += usize::from(matches!(answer, Ok(Ok(()))));
        }
        Ok((granted >= need, asked))
    }

    /// Asks the arbiter for `keys`, waiting at most `ARBITER_WAIT` for its answer.
    async fn grant_at(
        &self,
        (id, address): (NodeId, &str),
        holder: Holder,
        keys: &Arc<Vec<u64>>,
        view: u64,
        asked: &mut Vec<String>,
    ) -> Arbiter {
        let answer = if id == self.me {
            self.table.grant(holder, keys)
        } else {
            let (tx, mut rx) = oneshot::channel();
            if !self.send(address, Item::Grant(holder, keys.clone(), view, tx)).await {
                return Arbiter::Refused;
            }
            asked.push(address.to_string());
            match tokio::time::timeout(ARBITER_WAIT, &mut rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(Refusal::Unanswered),
                Err(_) => return Arbiter::Late(rx),
            }
        };
        match answer {
            Ok(()) => Arbiter::Granted,
            Err(Refusal::Held) => Arbiter::Held,
            Err(_) => Arbiter::Refused,
        }
    }

    /// Queues `item` for the node at `address`; false when its queue is gone.
    async fn send(&self, address: &str, item: Item) -> bool {
        let queue = self.queue(address);
        queue.send(item).await.is_ok()
    }

    fn queue(&self, address: &str) -> mpsc::Sender<Item> {
        let mut queues = self.queues.lock();
        if let Some(q) = queues.get(address) {
            return q.clone();
        }
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(drain_queue(self.rpc.clone(), address.to_string(), rx));
        queues.insert(address.to_string(), tx.clone());
        tx
    }

    /// Releases `holder`'s keys here and on every node asked (without waiting: a release lost on the way
    /// lapses with its lease).
    fn release(&self, holder: Holder, keys: &Arc<Vec<u64>>, asked: &[String]) {
        self.table.release(holder, keys);
        for address in asked {
            if self.queue(address).try_send(Item::Release(holder, keys.clone())).is_err() {
                tracing::debug!(address, "a lock release waits for its lease");
            }
        }
    }
}

/// Sends the queued items for one node, a batch per call, one call at a time. Ends when the client is
/// dropped.
async fn drain_queue(rpc: RpcClient, address: String, mut rx: mpsc::Receiver<Item>) {
    let mut items = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut items, MAX_BATCH).await > 0 {
        let mut call = LockCall { grants: Vec::new(), releases: Vec::new() };
        let mut waiting = Vec::new();
        for item in items.drain(..) {
            match item {
                Item::Grant(holder, keys, view, tx) => {
                    call.grants.push((holder, view, keys.to_vec()));
                    waiting.push(tx);
                }
                Item::Release(holder, keys) => call.releases.push((holder, keys.to_vec())),
            }
        }
        let answer: Result<LockAnswer, _> = rpc.call(&address, PATH_LOCK, &call, CALL_TIMEOUT).await;
        let grants = match answer {
            Ok(a) if a.grants.len() == waiting.len() => a.grants,
            Ok(_) => vec![Err(Refusal::Unanswered); waiting.len()],
            Err(e) => {
                tracing::debug!(address, error = %e, "a lock call failed");
                vec![Err(Refusal::Unanswered); waiting.len()]
            }
        };
        for (tx, g) in waiting.into_iter().zip(grants) {
            let _ = tx.send(g);
        }
    }
}

/// The arbiter's answer to a round.
enum Arbiter {
    Granted,
    Held,
    Refused,
    /// Not within `ARBITER_WAIT`: its answer still counts when it comes.
    Late(oneshot::Receiver<Result<(), Refusal>>),
}

/// Locks held on a majority of the members until dropped.
pub struct HeldLocks {
    client: Arc<LockClient>,
    holder: Holder,
    keys: Arc<Vec<u64>>,
    asked: Vec<String>,
    asked_at: Instant,
}

impl HeldLocks {
    /// Whether enough of the lease is left to begin a commit under these locks.
    pub fn holds(&self) -> bool {
        self.asked_at.elapsed() < LockClient::USE_WITHIN
    }

    /// Extends the lease on a majority again (the same holder renews its own grants).
    pub async fn renew(&mut self) -> Result<(), LockError> {
        // A lease that ran out may have been taken and given back meanwhile: renewing it would hide that.
        if !self.holds() {
            return Err(LockError::Busy);
        }
        let asked_at = Instant::now();
        let (granted, asked) = self.client.try_once(self.holder, &self.keys).await?;
        for a in asked {
            if !self.asked.contains(&a) {
                self.asked.push(a);
            }
        }
        if !granted {
            return Err(LockError::Busy);
        }
        self.asked_at = asked_at;
        Ok(())
    }
}

impl Drop for HeldLocks {
    fn drop(&mut self) {
        self.client.release(self.holder, &self.keys, &self.asked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(node: NodeId, seq: u64) -> Holder {
        Holder { node, seq }
    }

    #[tokio::test(start_paused = true)]
    async fn a_table_grants_all_keys_or_none_and_leases_lapse() {
        let t = LockTable::new(false);
        assert_eq!(t.grant(h(1, 1), &[1, 2]), Ok(()));
        assert_eq!(t.grant(h(2, 1), &[3, 2]), Err(Refusal::Held));
        assert_eq!(t.len(), 2, "a refused grant takes nothing");
        assert_eq!(t.grant(h(1, 1), &[2, 3]), Ok(()), "a holder renews and extends its own");
        t.release(h(2, 1), &[1, 2, 3]);
        assert_eq!(t.len(), 3, "another holder releases nothing");
        t.release(h(1, 1), &[1]);
        assert_eq!(t.grant(h(2, 1), &[1]), Ok(()));
        tokio::time::advance(LOCK_LEASE - Duration::from_millis(1)).await;
        assert_eq!(t.grant(h(2, 2), &[2]), Err(Refusal::Held));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(t.grant(h(2, 2), &[2, 3]), Ok(()), "a lease not renewed lapses");
    }

    #[tokio::test]
    async fn a_node_refuses_a_lock_call_past_its_limits() {
        let (_tx, map) = watch::channel(Arc::new(ClusterMap::empty()));
        let server = LockServer::new(Arc::new(LockTable::new(false)), map);
        let call = |grants: usize, keys: usize| {
            let grants = (0..grants as u64).map(|seq| (h(1, seq), 0, vec![7; keys])).collect();
            crate::frame::encode(crate::frame::Kind::Rpc, &LockCall { grants, releases: Vec::new() }).unwrap()
        };
        let status = |body: Vec<u8>| {
            let server = server.clone();
            async move { server.handle(PATH_LOCK.into(), body.into()).await.err().map(|(s, _)| s) }
        };
        assert_eq!(status(call(MAX_BATCH, 1)).await, None, "at the limits");
        assert_eq!(status(call(1, MAX_KEYS_PER_LOCK)).await, None, "at the limits");
        assert_eq!(status(call(MAX_BATCH + 1, 1)).await, Some(StatusCode::BAD_REQUEST));
        assert_eq!(status(call(1, MAX_KEYS_PER_LOCK + 1)).await, Some(StatusCode::BAD_REQUEST));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_table_grants_nothing_for_a_lease() {
        let t = LockTable::new(true);
        assert_eq!(t.grant(h(1, 1), &[1]), Err(Refusal::Starting));
        tokio::time::advance(LOCK_LEASE).await;
        assert_eq!(t.grant(h(1, 1), &[1]), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_sweeps_lapsed_locks_then_refuses() {
        let t = LockTable::with_limit(false, 4);
        assert_eq!(t.grant(h(1, 1), &[1, 2, 3]), Ok(()));
        assert_eq!(t.grant(h(1, 2), &[4]), Ok(()), "at the limit");
        assert_eq!(t.grant(h(1, 3), &[5]), Err(Refusal::Full), "past the limit");
        tokio::time::advance(LOCK_LEASE).await;
        assert_eq!(t.grant(h(1, 3), &[5]), Ok(()), "lapsed locks make room");
        assert_eq!(t.len(), 1);
    }
}
