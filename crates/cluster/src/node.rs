//! One node of the cluster: its Raft (manager or learner), its copy of the map, and the calls other nodes
//! make to it. Managers (1, 3 or 5 of them: an odd number, so a majority survives as many failures as an
//! even one would) vote and hold the log; other nodes follow as learners. Every node applies the same log,
//! so every node holds the map, and a change proposed anywhere is forwarded to the leader.

use crate::map::{Change, ClusterMap, NodeState};
use crate::raft::network::{Network, PATH_APPEND, PATH_SNAPSHOT, PATH_VOTE};
use crate::raft::{self, NodeId, Raft, RaftSettings};
use crate::rpc::{self, Answer, Handler, RpcClient};
use bytes::Bytes;
use hyper::StatusCode;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

pub const PATH_PROPOSE: &str = "/cluster/propose";
pub const PATH_JOIN: &str = "/cluster/join";
pub const PATH_STATUS: &str = "/cluster/status";
/// A member restarted on another address asks the leader to reach it there.
pub const PATH_RELOCATE: &str = "/cluster/relocate";
/// Most managers (Raft voters).
pub const MAX_MANAGERS: usize = 5;
/// Tries a forwarded change or join makes while the leader changes.
const MAX_FORWARDS: usize = 8;
/// How long a proposal waits for a leader (an election on a loaded machine takes a few seconds).
const LEADER_WAIT: Duration = Duration::from_secs(15);
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a leader probes the other nodes, and how long it waits for each answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause before a membership change is asked again while another is in flight.
const MEMBERSHIP_RETRY: Duration = Duration::from_millis(50);
/// How long a stopping node waits for Raft's tasks to let go of its store.
const STORE_CLOSE_WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    /// Where the Raft store lives.
    pub dir: PathBuf,
    /// Where other nodes reach this one.
    pub address: String,
    /// How this node calls the others (signed with the cluster secret, over TLS when configured).
    pub client: RpcClient,
    pub raft: RaftSettings,
    /// While this node leads: a node that answers no probe for this long is marked down in the map, and
    /// up again at its first answer. None: nodes are not probed.
    pub down_after: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The change is not valid for the map (the map is unchanged).
    #[error("refused: {0}")]
    Refused(String),
    /// No leader could be found or reached in time: the change may or may not have been made.
    #[error("no leader: {0}")]
    NoLeader(String),
    #[error("{0}")]
    Failed(String),
}

/// A node's view of the cluster, for `admin cluster status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub id: NodeId,
    pub role: String,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub managers: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    pub last_applied_index: Option<u64>,
    pub epoch: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct JoinRequest {
    id: NodeId,
    address: String,
}

pub struct ClusterNode {
    id: NodeId,
    address: String,
    raft: Raft,
    client: RpcClient,
    map: watch::Receiver<Arc<ClusterMap>>,
    /// Fires when the Raft store has been closed after `shutdown`.
    closed: parking_lot::Mutex<Option<oneshot::Receiver<()>>>,
}

impl ClusterNode {
    /// Opens the node's Raft store (made when missing) and starts its Raft. A node that was in a cluster
    /// rejoins it from what it stored; a new one waits to be initialized or joined.
    pub async fn start(config: NodeConfig) -> Result<Arc<Self>, String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| format!("{}: {e}", config.dir.display()))?;
        let (db, closed) = raft::store::open(&config.dir)?;
        let (published, map) = watch::channel(Arc::new(ClusterMap::empty()));
        let state_machine = raft::store::StateMachine::open(db.clone(), published)?;
        let log = raft::store::LogStore::new(db);
        let client = config.client;
        let network = Network { client: client.clone() };
        let raft = Raft::new(config.id, Arc::new(raft::config(config.raft)?), network, log, state_machine)
            .await
            .map_err(|e| format!("starting Raft: {e}"))?;
        let closed = parking_lot::Mutex::new(Some(closed));
        let node = Arc::new(ClusterNode { id: config.id, address: config.address, raft, client, map, closed });
        if let Some(down_after) = config.down_after {
            tokio::spawn(probe_nodes(Arc::downgrade(&node), down_after));
        }
        Ok(node)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The map as this node last applied it.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.borrow().clone()
    }

    /// Follows the map as this node applies changes.
    pub fn watch_map(&self) -> watch::Receiver<Arc<ClusterMap>> {
        self.map.clone()
    }

    /// Waits until this node has applied the map of `epoch` or a later one.
    pub async fn wait_for_epoch(&self, epoch: u64, timeout: Duration) -> Result<Arc<ClusterMap>, ClusterError> {
        let mut map = self.map.clone();
        let waited = tokio::time::timeout(timeout, map.wait_for(|m| m.epoch >= epoch)).await;
        match waited {
            Ok(Ok(m)) => Ok(m.clone()),
            Ok(Err(_)) => Err(ClusterError::Failed("the node stopped".into())),
            Err(_) => Err(ClusterError::NoLeader(format!("epoch {epoch} not reached in {timeout:?}"))),
        }
    }

    /// Makes this node the first manager of a new cluster. Refused on a node that is already in one.
    pub async fn initialize(&self) -> Result<(), ClusterError> {
        let members = BTreeMap::from([(self.id, BasicNode { addr: self.address.clone() })]);
        self.raft.initialize(members).await.map_err(|e| ClusterError::Refused(e.to_string()))?;
        self.wait_for_leader_other_than(None, tokio::time::Instant::now() + LEADER_WAIT).await?;
        Ok(())
    }

    /// Joins the cluster that the node at `peer` is in: the leader adds this node as a learner (it
    /// receives the log) and makes it a manager while there are fewer than three (then five).
    pub async fn join(&self, peer: &str) -> Result<(), ClusterError> {
        let request = JoinRequest { id: self.id, address: self.address.clone() };
        let answer: Result<(), String> = self
            .client
            .call(peer, PATH_JOIN, &request, CALL_TIMEOUT)
            .await
            .map_err(|e| ClusterError::NoLeader(e.to_string()))?;
        answer.map_err(ClusterError::Refused)
    }

    /// After a restart on another cluster address: has the leader change this node's address in the Raft
    /// membership (where the log is sent) to the one it serves on. The leader does not send to the new
    /// address yet, so this node may not know it: it asks every other member in turn, each forwards to the
    /// leader. Returns whether the address changed (false: it was this one already).
    pub async fn relocate(&self) -> Result<bool, ClusterError> {
        // A member's stored membership names it: wait until Raft loaded it (just after a start it has not).
        let loaded = self
            .raft
            .wait(Some(LEADER_WAIT))
            .metrics(|m| m.membership_config.membership().get_node(&self.id).is_some(), "this node's membership")
            .await
            .map_err(|e| ClusterError::Failed(format!("this node is not in its stored membership: {e}")))?;
        let membership = loaded.membership_config.membership().clone();
        let known = membership.get_node(&self.id).expect("waited for");
        if known.addr == self.address {
            self.raft.runtime_config().elect(true);
            return Ok(false);
        }
        let request = JoinRequest { id: self.id, address: self.address.clone() };
        if membership.nodes().all(|(id, _)| *id == self.id) {
            // Alone: it leads itself, and changes its own address.
            self.raft.runtime_config().elect(true);
            self.wait_for_leader_other_than(None, tokio::time::Instant::now() + LEADER_WAIT).await?;
            self.set_address(&request).await?;
            return Ok(true);
        }
        // Until the leader sends to this address this node hears no leader: campaigning would only raise
        // its term, and each higher term unseats the leader that is about to reach it (no pre-vote here).
        self.raft.runtime_config().elect(false);
        let mut last = String::from("no other member");
        for (id, node) in membership.nodes().filter(|(id, _)| **id != self.id) {
            match self.client.call::<_, Result<(), String>>(&node.addr, PATH_RELOCATE, &request, CALL_TIMEOUT).await {
                Ok(Ok(())) => {
                    self.raft.runtime_config().elect(true);
                    return Ok(true);
                }
                Ok(Err(e)) => last = format!("node {id}: {e}"),
                Err(e) => last = format!("node {id}: {e}"),
            }
        }
        Err(ClusterError::NoLeader(format!("no member took this node's new address {}: {last}", self.address)))
    }

    /// On the leader (forwarded there): once the new address answers as the node that asks, the
    /// membership names it there. An address that answers as another node is refused: two nodes named
    /// by one address could each make a quorum with it.
    async fn set_address(&self, request: &JoinRequest) -> Result<(), ClusterError> {
        let answering: Status = self
            .client
            .call(&request.address, PATH_STATUS, &(), CALL_TIMEOUT)
            .await
            .map_err(|e| ClusterError::Refused(format!("{} does not answer: {e}", request.address)))?;
        if answering.id != request.id {
            return Err(ClusterError::Refused(format!(
                "{} answers as node {}, not node {}",
                request.address, answering.id, request.id
            )));
        }
        let answer: Result<(), String> = self
            .through_leader(PATH_RELOCATE, request, |node| async move {
                let nodes = BTreeMap::from([(request.id, BasicNode { addr: request.address.clone() })]);
                retry_in_progress(|| node.raft.change_membership(ChangeMembers::SetNodes(nodes.clone()), false))
                    .await
                    .map(|_| Ok(()))
            })
            .await?;
        answer.map_err(ClusterError::Refused)?;
        tracing::info!(node = request.id, address = %request.address, "a member's address changed");
        Ok(())
    }

    /// Proposes `change` through Raft (forwarded to the leader when this node is not it) and waits until
    /// it is committed and applied: the new epoch (or an added drive's id), or the map's refusal.
    pub async fn propose(&self, change: Change) -> Result<u64, ClusterError> {
        let change = &change;
        self.through_leader(PATH_PROPOSE, change, |node| async move {
            node.raft.client_write(change.clone()).await.map(|r| r.data.result)
        })
        .await?
        .map_err(ClusterError::Refused)
    }

    /// Runs `write` on this node if it leads, or calls `path` with `request` on the leader; while the
    /// leader changes (it stopped, an election runs) it waits for the next one, up to `LEADER_WAIT`.
    async fn through_leader<'a, Q, A, F, Fut>(&'a self, path: &str, request: &Q, write: F) -> Result<A, ClusterError>
    where
        Q: Serialize,
        A: serde::de::DeserializeOwned,
        F: Fn(&'a Self) -> Fut,
        Fut: Future<Output = Result<A, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>>,
    {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut last_error = String::new();
        for _ in 0..MAX_FORWARDS {
            let error = match write(self).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            let Some(forward) = error.forward_to_leader() else {
                return Err(ClusterError::Failed(error.to_string()));
            };
            // The leader as the refusal names it, else as this node last heard (a learner's refusal may name
            // none); its address as the refusal gives it, else as the membership does.
            let metrics = self.raft.metrics().borrow().clone();
            let leader = forward.leader_id.or(metrics.current_leader).filter(|id| *id != self.id);
            let address = forward.leader_node.as_ref().map(|n| n.addr.clone()).or_else(|| {
                leader.and_then(|id| metrics.membership_config.membership().get_node(&id).map(|n| n.addr.clone()))
            });
            match (leader, address) {
                (Some(id), Some(addr)) => match self.client.call(&addr, path, request, CALL_TIMEOUT).await {
                    Ok(answer) => return Ok(answer),
                    Err(e) => {
                        // That leader is gone or no longer leads: wait for another one.
                        tracing::debug!(error = %e, leader = id, "forwarding to the leader");
                        last_error = e.to_string();
                        self.wait_for_leader_other_than(Some(id), deadline).await?;
                    }
                },
                _ => {
                    // No leader known, or not its address yet: wait until this node hears of one.
                    last_error = error.to_string();
                    self.wait_for_leader_other_than(None, deadline).await?;
                }
            }
        }
        Err(ClusterError::NoLeader(format!("no leader took the call after {MAX_FORWARDS} tries: {last_error}")))
    }

    /// Waits until this node knows a leader other than `not` (any leader when `not` is None): itself, or
    /// one whose address its membership holds.
    async fn wait_for_leader_other_than(
        &self,
        not: Option<NodeId>,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, ClusterError> {
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        let metrics = self
            .raft
            .wait(Some(timeout))
            .metrics(
                |m| {
                    m.current_leader.is_some_and(|leader| {
                        Some(leader) != not
                            && (leader == self.id || m.membership_config.membership().get_node(&leader).is_some())
                    })
                },
                "a new leader",
            )
            .await
            .map_err(|e| ClusterError::NoLeader(e.to_string()))?;
        Ok(metrics.current_leader.expect("waited for a leader"))
    }

    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "manager",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "stopped",
        };
        Status {
            id: self.id,
            role: role.into(),
            leader: m.current_leader,
            term: m.current_term,
            managers: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            last_applied_index: m.last_applied.map(|l| l.index),
            epoch: self.map().epoch,
        }
    }

    /// Asks the node at `addr` for its status.
    pub async fn status_of(&self, addr: &str) -> Result<Status, ClusterError> {
        self.status_within(addr, CALL_TIMEOUT).await
    }

    async fn status_within(&self, addr: &str, timeout: Duration) -> Result<Status, ClusterError> {
        self.client.call(addr, PATH_STATUS, &(), timeout).await.map_err(|e| ClusterError::Failed(e.to_string()))
    }

    fn leads(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader
    }

    fn stopped(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Shutdown
    }

    /// One probe of every other node that is up or down; returns the state changes the answers call for.
    /// `last_answer`: when each node last answered (a node first probed counts as having just answered, so
    /// a new leader gives every node the full time).
    async fn probe_once(
        &self,
        last_answer: &mut BTreeMap<NodeId, tokio::time::Instant>,
        down_after: Duration,
    ) -> Vec<Change> {
        let map = self.map();
        let probed: Vec<(NodeId, &crate::NodeEntry)> = map
            .nodes
            .iter()
            .filter(|(id, n)| **id != self.id && matches!(n.state, NodeState::Up | NodeState::Down))
            .map(|(id, n)| (*id, n))
            .collect();
        let probes = probed.iter().map(|(_, n)| self.status_within(&n.address, PROBE_TIMEOUT));
        let answers = futures::future::join_all(probes).await;
        let now = tokio::time::Instant::now();
        last_answer.retain(|id, _| map.nodes.contains_key(id));
        let mut changes = Vec::new();
        for ((id, n), answer) in probed.iter().zip(answers) {
            let last = last_answer.entry(*id).or_insert(now);
            if answer.is_ok() {
                *last = now;
            }
            let state = match (n.state, answer.is_ok()) {
                (NodeState::Up, false) if now.duration_since(*last) >= down_after => NodeState::Down,
                (NodeState::Down, true) => NodeState::Up,
                _ => continue,
            };
            tracing::info!(node = id, address = %n.address, ?state, "node state changed by the leader's probes");
            changes.push(Change::SetNodeState { node: *id, state });
        }
        changes
    }

    /// On the leader: takes the nodes the map removed out of Raft (managers and learners), then promotes
    /// learners until there are 1, 3 or 5 managers again.
    async fn retire_removed(&self) {
        let map = self.map();
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let gone = |id: &NodeId| map.removed.contains(id);
        let voters: BTreeSet<NodeId> = membership.voter_ids().filter(gone).collect();
        let learners: BTreeSet<NodeId> = membership.learner_ids().filter(gone).collect();
        if voters.is_empty() && learners.is_empty() {
            return;
        }
        tracing::info!(?voters, ?learners, "taking removed nodes out of Raft");
        if !voters.is_empty()
            && let Err(e) = self.raft.change_membership(ChangeMembers::RemoveVoters(voters), false).await
        {
            tracing::warn!(error = %e, "taking removed managers out of Raft");
            return;
        }
        if !learners.is_empty()
            && let Err(e) = self.raft.change_membership(ChangeMembers::RemoveNodes(learners), false).await
        {
            tracing::warn!(error = %e, "taking removed learners out of Raft");
            return;
        }
        if let Err(e) = self.promote_managers().await {
            tracing::warn!(error = %e, "promoting managers after a removal");
        }
    }

    /// Stops Raft and waits (a bounded time) until its store is closed; the store stays for the next start.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "stopping Raft");
        }
        let closed = self.closed.lock().take();
        if let Some(closed) = closed
            && tokio::time::timeout(STORE_CLOSE_WAIT, closed).await.is_err()
        {
            tracing::warn!("the cluster store was not closed within {STORE_CLOSE_WAIT:?} of stopping Raft");
        }
    }

    /// Adds a joining node as a learner (on the leader, forwarded there when this node is not it), then
    /// makes learners managers while there are fewer than the target.
    async fn admit(&self, request: JoinRequest) -> Result<(), ClusterError> {
        let request = &request;
        let answer: Result<(), String> = self
            .through_leader(PATH_JOIN, request, |node| async move {
                let node_info = BasicNode { addr: request.address.clone() };
                retry_in_progress(|| node.raft.add_learner(request.id, node_info.clone(), true)).await.map(|_| Ok(()))
            })
            .await?;
        answer.map_err(ClusterError::Refused)?;
        // Added here, on the leader: promotion follows on the same node (a forwarded join promoted there).
        if self.raft.metrics().borrow().current_leader == Some(self.id) {
            self.promote_managers().await?;
        }
        Ok(())
    }

    /// Makes learners managers until there are 1, 3 or 5 managers (the largest odd number the nodes allow).
    async fn promote_managers(&self) -> Result<(), ClusterError> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let learners: Vec<NodeId> = membership.learner_ids().collect();
        let all = voters.len() + learners.len();
        let target = [5, 3, 1].into_iter().find(|&t| t <= all.min(MAX_MANAGERS)).unwrap_or(1);
        if voters.len() >= target {
            return Ok(());
        }
        let added: BTreeSet<NodeId> = learners.into_iter().take(target - voters.len()).collect();
        retry_in_progress(|| self.raft.change_membership(ChangeMembers::AddVoterIds(added.clone()), true))
            .await
            .map_err(|e| ClusterError::Failed(e.to_string()))?;
        Ok(())
    }

    async fn route(self: Arc<Self>, path: String, body: Bytes) -> Answer {
        match path.as_str() {
            PATH_APPEND => rpc::answer(&self.raft.append_entries(rpc::parse(&body)?).await),
            PATH_VOTE => rpc::answer(&self.raft.vote(rpc::parse(&body)?).await),
            PATH_SNAPSHOT => rpc::answer(&self.raft.install_snapshot(rpc::parse(&body)?).await),
            PATH_PROPOSE => {
                let change: Change = rpc::parse(&body)?;
                match self.raft.client_write(change).await {
                    Ok(response) => rpc::answer(&response.data.result),
                    // Not the leader (any more): the caller looks for it again.
                    Err(e) => Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
                }
            }
            PATH_JOIN => {
                let request: JoinRequest = rpc::parse(&body)?;
                let result = self.admit(request).await.map_err(|e| e.to_string());
                rpc::answer(&result)
            }
            PATH_STATUS => rpc::answer(&self.status()),
            PATH_RELOCATE => {
                let request: JoinRequest = rpc::parse(&body)?;
                let result = self.set_address(&request).await.map_err(|e| e.to_string());
                rpc::answer(&result)
            }
            _ => Err((StatusCode::NOT_FOUND, format!("no cluster call {path}"))),
        }
    }
}

/// Runs a membership change again while another one is in flight (nodes joining at once each ask for one;
/// Raft takes one at a time), for at most `LEADER_WAIT`.
async fn retry_in_progress<A, F, Fut>(change: F) -> Result<A, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<A, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>>,
{
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    loop {
        match change().await {
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(_))))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(MEMBERSHIP_RETRY).await;
            }
            result => return result,
        }
    }
}

/// While the node leads, probes the other nodes every `PROBE_EVERY` and marks them down or up in the map.
/// Ends when the node is dropped or stopped.
async fn probe_nodes(node: std::sync::Weak<ClusterNode>, down_after: Duration) {
    let mut last_answer = BTreeMap::new();
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(node) = node.upgrade() else { return };
        if node.stopped() {
            return;
        }
        if !node.leads() {
            last_answer.clear();
            continue;
        }
        node.retire_removed().await;
        let changes = node.probe_once(&mut last_answer, down_after).await;
        if changes.is_empty() || !node.leads() {
            continue;
        }
        if let Err(e) = node.raft.client_write(Change::Batch(changes)).await {
            tracing::warn!(error = %e, "marking nodes down or up");
        }
    }
}

impl Handler for ClusterNode {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        Box::pin(self.route(path, body))
    }
}
