//! The server as a node of a cluster (`--cluster-address`): its Raft node and cluster port, the drives it
//! serves to other nodes, joining, and the S3 layer composed from the cluster map.
//!
//! A node's life: a new node either waits for `mosaic admin cluster init` (the first node: the secret is
//! made there and the map bootstrapped with this node and its drives) or joins through a member with the
//! secret (`--join`, MOSAIC_CLUSTER_SECRET): the member admits it to Raft and hands it the files every node
//! must share (root credentials, SSE master keys, access keys), then the node adds itself and its drives to
//! the map. The secret is recorded in `cluster/node` last, so a node that has it is a member and rejoins
//! from its Raft store at the next start. S3 is served through a [`Switch`]: each map with placement is
//! composed into a store (one erasure set per placement group over local and remote drives) and switched
//! in; until the first, requests are refused as unavailable.
//!
//! Moves (a node added, drained or removed, a weight changed): a moving group is served from the set its
//! data is whole on until a step is done. The group's owner (the node of that set's first drive) waits
//! until every node serves the current placement (a node says so once no call is left on the stores it
//! replaced), arms the step on every node (from then on the group's writes must also reach the drives the
//! step keeps, `ClusterMap::kept_slots`, and follow their removals onto its new drives; the writes begun
//! before end first), heals the served set whole (what a write before the arming left short on the kept
//! drives is rebuilt there), fills the step's set
//! (`ClusterMap::step_target`: at most `parity` drives swapped) through a set of its own that only
//! rebuilds, reports the step done through Raft (every node serves the new set from then on, and what
//! was written meanwhile is rebuilt on its new drives from the k it shares with the old), and clears the
//! group off the drives it left.

use crate::config::ClusterConfig;
use crate::datadir;
use bytes::Bytes;
use hyper::StatusCode;
use mosaic::datadir_format::{self as format, ClusterNodeFile};
use mosaic_cluster::locks::{LockClient, LockServer, LockTable};
use mosaic_cluster::rpc::{self, Answer, Handler, Router, RpcClient, Secret};
use mosaic_cluster::{
    Change, ClusterError, ClusterMap, ClusterNode, DriveId, FailureDomain, NodeConfig, NodeState, SharedSetting,
};
use mosaic_cluster_store::{ClusterStore, ClusterStoreConfig, drive_guard};
use mosaic_drive::DriveStore;
use mosaic_layer::{ObjectLayer, S3Semantics, SemanticsConfig, Switch};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// This binary's own node-to-node calls: the files a joining node takes from a member, and what a node
/// serves (its placement epoch and its moves).
const PATH_SHARED: &str = "/node/shared";
const PATH_SERVING: &str = "/node/serving";
/// A member asks a waiting node to join through it (`admin cluster add-node`).
const PATH_INVITE: &str = "/node/invite";
/// A rebalancer arms a step on a node and takes its removal count of the step's group (`ArmStep`).
const PATH_FOLLOWS: &str = "/node/follows";
/// How long an invited node may take to join (admitted to Raft, the shared files taken, added to the map).
const INVITE_TIMEOUT: Duration = Duration::from_secs(60);
/// The data directory's files every node of a cluster holds alike.
const SHARED_FILES: [&str; 3] = ["credentials", "sse-keys", "keys"];
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a node waits to see itself in the map after the leader said it is in already.
const SEE_SELF_WAIT: Duration = Duration::from_secs(15);
/// Tries, and the pause between them, of a restarted member to have the cluster reach it at a new address.
const RELOCATE_TRIES: u32 = 60;
const RELOCATE_RETRY: Duration = Duration::from_secs(2);
/// Pause before composing the store again after a failure (a drive's node not answering yet).
const COMPOSE_RETRY: Duration = Duration::from_secs(1);
/// Pause before composing again a store that some drives were missing from.
const COMPOSE_INCOMPLETE_RETRY: Duration = Duration::from_secs(3);
/// How often a node looks whether the calls on a store it replaced have ended, and when it says they last.
const DRAIN_POLL: Duration = Duration::from_millis(5);
const DRAIN_WARN_AFTER: Duration = Duration::from_secs(30);
/// How stale a node's view of a bucket's settings may be (another node may change them).
const BUCKET_STATE_TTL: Duration = Duration::from_secs(1);
/// A node that answers the leader's probes for this long is marked down: its drives are left out of every
/// node's store (no call waits on it) until it answers again.
const DOWN_AFTER: Duration = Duration::from_secs(5);
/// Rounds of heal per group that `admin heal` runs before it leaves the rest to the background.
const MAX_HEAL_ROUNDS: usize = 64;
/// Heal rounds a step of a move runs on the set served before it fills the next one (each compares the
/// group's drives and rebuilds what differs) before it tries again later.
const MAX_MOVE_ROUNDS: usize = 16;
/// Objects rebuilt per heal call of a move.
const MOVE_HEAL_STEP: usize = 1024;
/// How long the owner of a moving group waits for every node to serve its placement before it retries.
const PLACEMENT_WAIT: Duration = Duration::from_secs(30);
const PLACEMENT_POLL: Duration = Duration::from_millis(100);
/// Pause before a move that failed (a drive missing, a node behind) is tried again.
const MOVE_RETRY: Duration = Duration::from_secs(2);
/// How soon a write fence that could not be raised is tried again.
const FENCE_RETRY: Duration = Duration::from_secs(1);
const SERVING_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Weight of a drive: its capacity in GiB (at least 1).
const WEIGHT_UNIT_BYTES: u64 = 1 << 30;

/// Most placement groups: each is a member of the node's pool of sets.
pub const MAX_PLACEMENT_GROUPS: u32 = mosaic_pool::MAX_MEMBERS as u32;
/// Placement groups of a new cluster unless `init` says otherwise.
pub const DEFAULT_PLACEMENT_GROUPS: u32 = 64;

/// How a new cluster is made (`mosaic admin cluster init`).
#[derive(Clone, Debug)]
pub struct InitRequest {
    pub data_shards: u8,
    pub parity_shards: u8,
    pub pg_count: u32,
    pub failure_domain: FailureDomain,
}

/// The store this node serves, the map it was composed from, and the groups this node owns in it (it
/// settles, heals and moves those).
#[derive(Clone)]
struct Served {
    map: Arc<ClusterMap>,
    store: Arc<ClusterStore>,
    owned: Vec<usize>,
    /// The groups whose sets this composition opened (the others' were taken over from the one before).
    opened: Vec<usize>,
}

/// What this node's rebalancer did since it started.
#[derive(Default)]
struct MoveStats {
    groups_moved: AtomicU64,
    bytes_moved: AtomicU64,
    objects_cleared: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// When it first found a group of its own to move.
    first_move: Mutex<Option<Instant>>,
}

/// A node's answer to `PATH_SERVING`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ServingReport {
    placement_epoch: u64,
    groups_moved: u64,
    bytes_moved: u64,
    objects_cleared: u64,
    moving_for_ms: u64,
    last_error: Option<String>,
    /// The version of each shared setting this node applied.
    shared_applied: BTreeMap<String, u64>,
}

/// A step a rebalancer is about to fill: the node follows the group's removals onto its drives from now on
/// (`mosaic_cluster_store::FollowTally::arm`) and answers its count of the group. With `seal`, the step's
/// last count: the node also refuses the group's removals under the step until it serves the step's end
/// (`FollowTally::seal`).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ArmStep {
    pg: u32,
    target: Vec<mosaic_cluster::DriveId>,
    #[serde(default)]
    seal: bool,
}

impl ArmStep {
    /// Refuses a group or a set that `map` cannot have: the tally keeps a step per group it is asked for,
    /// so an unchecked call could grow it without bound.
    fn check(&self, map: &ClusterMap) -> Result<(), String> {
        if self.pg as usize >= map.pgs.len() || self.target.len() > mosaic_erasure::MAX_SET_DRIVES {
            return Err(format!("no step of group {} over {} drives here", self.pg, self.target.len()));
        }
        Ok(())
    }
}

/// Whether a node starting its cluster port was a member before (it restarts) or becomes one now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Membership {
    Restarted,
    New,
}

/// A node's Raft and the client it calls other nodes with, once it has the secret.
struct Running {
    node: Arc<ClusterNode>,
    client: RpcClient,
    /// Object locks on a majority of the nodes, taken by every write of the groups' sets.
    locks: Arc<LockClient>,
}

pub struct Cluster {
    cfg: ClusterConfig,
    data_dir: PathBuf,
    /// Where other nodes reach this node (the bound address unless one is advertised).
    advertise: String,
    s3_address: String,
    node_file: Mutex<ClusterNodeFile>,
    /// This node's drives by name (the drive's directory) and their weights.
    drives: Vec<(String, DriveStore, u32)>,
    /// Bound at start (the port is taken and known), served once the secret is known.
    listener: Mutex<Option<TcpListener>>,
    /// The root credentials and SSE master keys this node serves with, as their files write them (set by
    /// the server before it serves; the keys again whenever they change).
    shared_state: Mutex<Option<(String, String)>>,
    /// TLS on the cluster port and in calls to other nodes, when configured.
    tls: Option<rpc::Tls>,
    running: tokio::sync::OnceCell<Running>,
    /// Serializes init and join.
    changing: tokio::sync::Mutex<()>,
    set_cfg: mosaic_erasure::SetConfig,
    /// Set when the server has its SSE keys; the map is followed from then on.
    layer_cfg: OnceLock<SemanticsConfig>,
    following: AtomicBool,
    served: Mutex<Option<Served>>,
    /// The placement epoch of the store served, once no call is left on the stores it replaced (the
    /// rebalancer waits until every node serves its own).
    placement_epoch: AtomicU64,
    /// The last switch-over's report of its placement epoch (each waits for the one before).
    draining: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Wakes the rebalancer when a new store is served.
    served_changed: tokio::sync::Notify,
    moves: MoveStats,
    /// This node's removals from moving groups and the steps armed, which the rebalancers ask for (`PATH_FOLLOWS`).
    follows: Arc<mosaic_cluster_store::FollowTally>,
    /// What this node does with the map's shared settings (`on_shared`).
    shared_followers: Mutex<Vec<SharedFollower>>,
    pub switch: Arc<Switch>,
    stop: watch::Receiver<bool>,
}

/// Applies a value of a shared setting on this node.
pub type SharedApply = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

struct SharedFollower {
    name: &'static str,
    /// The version last applied (0: none yet).
    applied: u64,
    apply: SharedApply,
}

impl Cluster {
    /// Binds the cluster port and reads (or makes) the node's identity. `drives`: this node's drives by
    /// directory.
    pub async fn open(
        cfg: ClusterConfig,
        data_dir: PathBuf,
        drives: Vec<(String, DriveStore)>,
        s3_address: String,
        set_cfg: mosaic_erasure::SetConfig,
        tls: Option<rpc::Tls>,
        stop: watch::Receiver<bool>,
    ) -> Result<Arc<Cluster>, String> {
        let listener = TcpListener::bind(cfg.address)
            .await
            .map_err(|e| format!("cannot listen on the cluster address {}: {e}", cfg.address))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        let advertise =
            if cfg.advertise == cfg.address.to_string() { bound.to_string() } else { cfg.advertise.clone() };
        let node_file = datadir::cluster_node(&data_dir)?;
        if let (Some(stored), Some(given)) = (&node_file.secret, &cfg.secret)
            && !stored.eq_ignore_ascii_case(given)
        {
            return Err("MOSAIC_CLUSTER_SECRET differs from the secret of the cluster this node is in".into());
        }
        let drives = drives
            .into_iter()
            .map(|(name, d)| {
                let weight = (d.engine().space_usage().capacity_bytes / WEIGHT_UNIT_BYTES).clamp(1, u32::MAX as u64);
                (name, d, weight as u32)
            })
            .collect();
        Ok(Arc::new(Cluster {
            cfg,
            data_dir,
            advertise,
            s3_address,
            node_file: Mutex::new(node_file),
            drives,
            listener: Mutex::new(Some(listener)),
            shared_state: Mutex::new(None),
            tls,
            running: tokio::sync::OnceCell::new(),
            changing: tokio::sync::Mutex::new(()),
            // One count of the node's foreground work: its sets' requests for clients and the drive commands
            // it serves for other nodes' clients, which its fills and heals wait for.
            set_cfg: mosaic_erasure::SetConfig {
                node_foreground: Some(mosaic_store::ForegroundWork::new()),
                ..set_cfg
            },
            layer_cfg: OnceLock::new(),
            following: AtomicBool::new(false),
            served: Mutex::new(None),
            placement_epoch: AtomicU64::new(0),
            draining: Mutex::new(None),
            served_changed: tokio::sync::Notify::new(),
            moves: MoveStats::default(),
            follows: mosaic_cluster_store::FollowTally::new(),
            shared_followers: Mutex::new(Vec::new()),
            switch: Arc::new(Switch::new(
                "this node is not in a cluster yet: run `mosaic admin cluster init` on the first node, or start it with --join",
            )),
            stop,
        }))
    }

    /// The store this node serves now, one set per placement group (None before it serves).
    pub fn served_store(&self) -> Option<Arc<ClusterStore>> {
        self.served.lock().as_ref().map(|s| s.store.clone())
    }

    /// Where other nodes reach this node.
    pub fn address(&self) -> &str {
        &self.advertise
    }

    pub fn node_id(&self) -> u64 {
        self.node_file.lock().node
    }

    /// Before the server serves: a member rejoins from its Raft store; a node started with --join joins
    /// (and takes the shared files before the server reads them); a new node waits for init.
    pub async fn prepare(self: &Arc<Self>) -> Result<(), String> {
        let stored = self.node_file.lock().secret.clone();
        if let Some(secret) = stored {
            if self.cfg.join.is_some() {
                tracing::info!("this node is in a cluster already; --join is ignored");
            }
            self.start(Secret::parse(&secret)?, Membership::Restarted).await?;
            tokio::spawn(self.clone().follow_own_address());
            return Ok(());
        }
        let Some(peer) = self.cfg.join.clone() else {
            if let Some(secret) = self.cfg.secret.as_deref() {
                // With the secret it can be called: a member may invite it (`admin cluster add-node`).
                self.start(Secret::parse(secret)?, Membership::New).await?;
                tracing::info!(
                    "this node is in no cluster: `mosaic admin cluster add-node {}` on a member adds it, \
                     `mosaic admin cluster init` makes one here",
                    self.advertise
                );
                return Ok(());
            }
            tracing::info!("this node is in no cluster: `mosaic admin cluster init` makes one here");
            return Ok(());
        };
        let secret = self.cfg.secret.as_deref().ok_or(
            "joining a cluster needs its secret in MOSAIC_CLUSTER_SECRET (printed by `mosaic admin cluster init`)",
        )?;
        self.join(&peer, Secret::parse(secret)?).await
    }

    /// A member restarted on other addresses has the cluster reach it there: the Raft membership (so the
    /// leader sends it the log) and then the map (so nodes call its drives there, and clients find its S3
    /// port). Tried again while no member takes it (they may be restarting too), a bounded number of times.
    async fn follow_own_address(self: Arc<Self>) {
        let Some(running) = self.running.get() else { return };
        let me = self.node_id();
        for attempt in 1..=RELOCATE_TRIES {
            let relocated = match running.node.relocate().await {
                Ok(changed) => self.record_own_address(running, me).await.map(|mapped| changed || mapped),
                Err(e) => Err(e.to_string()),
            };
            match relocated {
                Ok(true) => {
                    tracing::info!(node = me, address = %self.advertise, s3 = %self.s3_address, "this node's addresses changed in the cluster");
                    return;
                }
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "the cluster does not reach this node at its address yet")
                }
            }
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(RELOCATE_RETRY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        tracing::error!(
            address = %self.advertise,
            "no member took this node's new address: it takes no part in the cluster until it is restarted \
             (on its old address, or once the other members answer)"
        );
    }

    /// Puts this node's addresses in the map once its map names other ones; whether it changed them.
    async fn record_own_address(&self, running: &Running, me: u64) -> Result<bool, String> {
        // The map this node replays may be older than the leader's: wait until it has seen this node.
        let mut maps = running.node.watch_map();
        let map: Arc<ClusterMap> =
            match tokio::time::timeout(SEE_SELF_WAIT, maps.wait_for(|m| m.nodes.contains_key(&me))).await {
                Ok(Ok(map)) => map.clone(),
                _ => return Err("this node does not see itself in the cluster map".into()),
            };
        let entry = &map.nodes[&me];
        if entry.address == self.advertise && entry.s3_address == self.s3_address {
            return Ok(false);
        }
        let change =
            Change::SetNodeAddress { node: me, address: self.advertise.clone(), s3_address: self.s3_address.clone() };
        running.node.propose(change).await.map_err(|e| format!("recording this node's addresses: {e}"))?;
        Ok(true)
    }

    /// From now on the map is followed: every map with placement becomes the layer S3 is served from.
    pub fn serve(self: &Arc<Self>, layer_cfg: SemanticsConfig) {
        let layer_cfg = SemanticsConfig { bucket_state_ttl: Some(BUCKET_STATE_TTL), ..layer_cfg };
        let _ = self.layer_cfg.set(layer_cfg);
        self.follow_once();
    }

    /// Starts following the map once both Raft runs and the server serves.
    fn follow_once(self: &Arc<Self>) {
        if self.layer_cfg.get().is_some() && self.running.get().is_some() && !self.following.swap(true, SeqCst) {
            tokio::spawn(self.clone().follow_map());
            tokio::spawn(self.clone().rebalance());
            tokio::spawn(self.clone().raise_write_fences());
        }
    }

    /// Raises the map's write fence (`Change::FenceWrites`) once at start and again whenever a write met a
    /// lapsed seal, and lets this node write to moving groups once the fence is committed and applied
    /// here (`FollowTally::fenced`): a step counted before it can no longer be reported done.
    async fn raise_write_fences(self: Arc<Self>) {
        let mut stop = self.stop.clone();
        let Some(running) = self.running.get() else { return };
        let mut maps = running.node.watch_map();
        loop {
            let asked_at = Instant::now();
            let wait = match self.raise_write_fence(running).await {
                Ok(placement_epoch) => {
                    self.follows.fenced(mosaic_cluster_store::Fence { placement_epoch, asked_at });
                    tracing::debug!(placement_epoch, "raised the write fence");
                    None
                }
                Err(e) => {
                    tracing::info!(error = %e, "the write fence could not be raised yet: writes to moving groups wait");
                    Some(FENCE_RETRY)
                }
            };
            // A fence refused (this node is not in the map yet, no leader) is tried again at the next map
            // or after `FENCE_RETRY`.
            tokio::select! {
                _ = self.follows.fence_wanted(), if wait.is_none() => {}
                _ = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {}
                changed = maps.changed(), if wait.is_some() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One `Change::FenceWrites`, committed and applied here: the placement epoch of the map it made.
    async fn raise_write_fence(&self, running: &Running) -> Result<u64, String> {
        let epoch =
            running.node.propose(Change::FenceWrites { node: self.node_id() }).await.map_err(|e| e.to_string())?;
        let map = running.node.wait_for_epoch(epoch, PLACEMENT_WAIT).await.map_err(|e| e.to_string())?;
        Ok(map.placement_epoch)
    }

    /// Starts Raft and the cluster port with `secret` (once).
    async fn start(self: &Arc<Self>, secret: Secret, membership: Membership) -> Result<&Running, String> {
        self.running
            .get_or_try_init(|| async {
                let id = self.node_id();
                let client = RpcClient::new(secret.clone(), self.tls.as_ref())?;
                let config = NodeConfig {
                    id,
                    dir: self.data_dir.join(datadir::CLUSTER_DIR).join("raft"),
                    address: self.advertise.clone(),
                    client: client.clone(),
                    raft: Default::default(),
                    down_after: Some(DOWN_AFTER),
                };
                let node = ClusterNode::start(config).await?;
                // A member that restarts may have granted locks its writers still hold: it grants none
                // for a lease.
                let table = Arc::new(LockTable::new(membership == Membership::Restarted));
                let locks = LockClient::new(id, table.clone(), node.watch_map(), client.clone(), Default::default());
                let served = self.drives.iter().map(|(name, d, _)| (name.clone(), Arc::new(d.clone()))).collect();
                let router = Router::new()
                    .route("/cluster/", node.clone())
                    .route("/raft/", node.clone())
                    .route(
                        "/drive/",
                        mosaic_remote::DriveServer::new(
                            served,
                            Some(drive_guard(node.watch_map(), &secret)),
                            self.set_cfg.node_foreground.clone(),
                        ),
                    )
                    .route("/lock/", LockServer::new(table, node.watch_map()))
                    .route("/node/", Arc::new(NodeCalls { dir: self.data_dir.clone(), cluster: Arc::downgrade(self) }));
                let listener = self.listener.lock().take().ok_or("the cluster port is gone")?;
                let mut stop = self.stop.clone();
                tokio::spawn(rpc::serve(listener, secret, self.tls.clone(), Arc::new(router), async move {
                    let _ = stop.wait_for(|s| *s).await;
                }));
                tracing::info!(node = id, address = %self.advertise, "cluster node started");
                Ok::<_, String>(Running { node, client, locks })
            })
            .await?;
        // Started after the server began serving (init): follow the map from now.
        self.follow_once();
        Ok(self.running.get().expect("just started"))
    }

    /// Joins the cluster of the member at `peer`.
    async fn join(self: &Arc<Self>, peer: &str, secret: Secret) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let running = self.start(secret.clone(), Membership::New).await?;
        running.node.join(peer).await.map_err(|e| format!("joining the cluster at {peer}: {e}"))?;
        let files: BTreeMap<String, String> = running
            .client
            .call(peer, PATH_SHARED, &(), CALL_TIMEOUT)
            .await
            .map_err(|e| format!("taking the shared files from {peer}: {e}"))?;
        self.take_shared_files(&files)?;
        self.add_self(running).await?;
        self.record_secret(&secret)?;
        tracing::info!(node = self.node_id(), peer, "joined the cluster");
        Ok(())
    }

    /// Records what this node serves with (its root credentials and SSE master keys).
    pub fn set_shared_state(&self, creds: &datadir::Credentials, master: &mosaic_crypt::MasterKeys) {
        let state = (format::encode_credentials(creds), format::encode_master_keys(master));
        *self.shared_state.lock() = Some(state);
    }

    /// Records the SSE master keys this node serves from now on (the cluster's, as it applied them).
    pub fn set_shared_sse(&self, master: &mosaic_crypt::MasterKeys) {
        if let Some((_, sse)) = self.shared_state.lock().as_mut() {
            *sse = format::encode_master_keys(master);
        }
    }

    /// What every node must serve with alike, as the shared files write it: the root credentials and SSE
    /// master keys in effect (given ones included) and the access keys.
    fn effective_shared(&self) -> Result<BTreeMap<String, String>, String> {
        let (creds, sse) = self.shared_state.lock().clone().ok_or("this node is not serving yet")?;
        let mut out =
            BTreeMap::from([("credentials".to_string(), creds.clone()), ("sse-keys".to_string(), sse.clone())]);
        let keys = self.data_dir.join("keys");
        if keys.exists() {
            out.insert("keys".to_string(), datadir::read_small_file(&keys)?);
        }
        Ok(out)
    }

    /// Asks the node waiting at `address` (started with the cluster's secret and no --join) to join the
    /// cluster through this member; returns its node id once it is in the map.
    pub async fn add_node(&self, address: &str) -> Result<u64, String> {
        let map = self.running_map()?;
        if map.nodes.values().any(|n| n.address == address) {
            return Err(format!("{address} is a member already"));
        }
        let running = self.running.get().ok_or("this node is in no cluster")?;
        let invite = Invite { peer: self.advertise.clone(), shared: self.effective_shared()? };
        let joined: Joined = running
            .client
            .call(address, PATH_INVITE, &invite, INVITE_TIMEOUT)
            .await
            .map_err(|e| format!("inviting {address}: {e}"))?;
        debug_assert!(joined.node != self.node_id(), "a node does not invite itself");
        Ok(joined.node)
    }

    /// Joins through `peer` when a member invites this node; refused once it is in a cluster.
    async fn accept_invite(self: &Arc<Self>, peer: &str, shared: &BTreeMap<String, String>) -> Result<u64, String> {
        if self.node_file.lock().secret.is_some() {
            return Err("this node is in a cluster already".into());
        }
        // This node serves with what it read at its start: joining with other credentials or keys would
        // serve S3 with them (and seal objects with another master key) until it restarts.
        if self.effective_shared()? != *shared {
            return Err("this node's root credentials, SSE master keys or access keys differ from the cluster's: \
                 start it with --join PEER instead (it takes the cluster's before it serves), or give every node \
                 the same MOSAIC_ACCESS_KEY, MOSAIC_SECRET_KEY and sse_master_key"
                .into());
        }
        let secret = self.cfg.secret.as_deref().ok_or("this node was started without the cluster secret")?;
        self.join(peer, Secret::parse(secret)?).await?;
        Ok(self.node_id())
    }

    /// Makes a new cluster with this node as its first member; returns the secret other nodes join with.
    pub async fn init(self: &Arc<Self>, request: InitRequest) -> Result<Secret, String> {
        let _changing = self.changing.lock().await;
        if let Ok(map) = self.running_map()
            && map.nodes.contains_key(&self.node_id())
        {
            return Err(format!("this node is in cluster {} already", map.cluster_id));
        }
        // A node whose init was cut short keeps the secret it recorded; else the one it was given
        // (MOSAIC_CLUSTER_SECRET, as a deployment that starts every node with it does), else a new one.
        let stored = self.node_file.lock().secret.clone();
        let secret = match stored.or_else(|| self.cfg.secret.clone()) {
            Some(s) => Secret::parse(&s)?,
            None => Secret::generate(),
        };
        // Recorded first: a crash after Raft was initialized must not leave a node that cannot start it.
        self.record_secret(&secret)?;
        let running = self.start(secret.clone(), Membership::New).await?;
        if running.node.status().managers.is_empty() {
            running.node.initialize().await.map_err(|e| format!("initializing the cluster: {e}"))?;
        }
        if !running.node.map().is_bootstrapped() {
            let bootstrap = Change::Bootstrap {
                cluster_id: hex::encode(rand::random::<[u8; 8]>()),
                data_shards: request.data_shards,
                parity_shards: request.parity_shards,
                pg_count: request.pg_count,
                failure_domain: request.failure_domain,
                placement: mosaic_cluster::placement::PLACEMENT_LATEST,
            };
            running.node.propose(bootstrap).await.map_err(|e| format!("making the cluster map: {e}"))?;
        }
        self.add_self(running).await?;
        tracing::info!(node = self.node_id(), "made a new cluster");
        Ok(secret)
    }

    /// Adds this node and its drives to the map (one change), unless it is there already.
    async fn add_self(&self, running: &Running) -> Result<(), String> {
        let me = self.node_id();
        if running.node.map().nodes.contains_key(&me) {
            return Ok(());
        }
        let mut changes = vec![Change::AddNode {
            node: me,
            address: self.advertise.clone(),
            s3_address: self.s3_address.clone(),
            zone: self.cfg.zone.clone(),
        }];
        for (name, _, weight) in &self.drives {
            changes.push(Change::AddDrive { node: me, name: name.clone(), weight: *weight });
        }
        match running.node.propose(Change::Batch(changes)).await {
            Ok(epoch) => {
                running.node.wait_for_epoch(epoch, SEE_SELF_WAIT).await.map_err(|e| e.to_string())?;
                Ok(())
            }
            // Added by an attempt that did not hear back (a restart mid-join): it shows in the map soon.
            Err(ClusterError::Refused(e)) if e.contains("already in the cluster") => {
                let mut maps = running.node.watch_map();
                let seen = tokio::time::timeout(SEE_SELF_WAIT, maps.wait_for(|m| m.nodes.contains_key(&me))).await;
                match seen {
                    Ok(Ok(_)) => Ok(()),
                    _ => Err(format!("the cluster says node {me} is in it, but this node does not see it: {e}")),
                }
            }
            Err(e) => Err(format!("adding this node to the cluster map: {e}")),
        }
    }

    fn record_secret(&self, secret: &Secret) -> Result<(), String> {
        let mut file = self.node_file.lock();
        let next = ClusterNodeFile { node: file.node, secret: Some(secret.to_hex()) };
        datadir::record_cluster_node(&self.data_dir, &next)?;
        *file = next;
        Ok(())
    }

    /// Writes the files a member handed over, each checked first.
    fn take_shared_files(&self, files: &BTreeMap<String, String>) -> Result<(), String> {
        for name in SHARED_FILES {
            let Some(text) = files.get(name) else { continue };
            let checked = match name {
                "credentials" => format::parse_credentials(text).map(|_| ()),
                "sse-keys" => format::parse_master_keys(text).map(|_| ()),
                _ => format::parse_keys(text).map(|_| ()),
            };
            checked.map_err(|e| format!("the cluster's {name} file: {e}"))?;
            datadir::write_synced(&self.data_dir.join(name), text, 0o600)?;
        }
        Ok(())
    }

    fn running_map(&self) -> Result<Arc<ClusterMap>, String> {
        Ok(self.running.get().ok_or("this node is in no cluster")?.node.map())
    }

    /// This node's view: its Raft role and the map, for `mosaic admin cluster status`.
    pub async fn status(&self) -> serde_json::Value {
        let Some(running) = self.running.get() else {
            return serde_json::json!({
                "node": self.node_id(),
                "address": self.advertise,
                "role": "none",
                "state": "not in a cluster: run `mosaic admin cluster init` here, or start with --join",
            });
        };
        let status = running.node.status();
        let map = running.node.map();
        let serving = self.switch.current().is_ok();
        let nodes: Vec<serde_json::Value> = map
            .nodes
            .iter()
            .map(|(id, n)| {
                let drives: Vec<serde_json::Value> = map
                    .drives_of(*id)
                    .iter()
                    .map(|d| {
                        let e = &map.drives[d];
                        serde_json::json!({ "id": d, "name": e.name, "weight": e.weight, "state": e.state })
                    })
                    .collect();
                serde_json::json!({
                    "id": id,
                    "address": n.address,
                    "s3_address": n.s3_address,
                    "zone": n.zone,
                    "state": n.state,
                    "drives": drives,
                    "groups": map.groups_on_node(*id),
                    "manager": status.managers.contains(id),
                })
            })
            .collect();
        let moving = map.pgs.iter().filter(|p| p.from.is_some()).count();
        let rebalance = self.rebalance_status(&map, running, moving).await;
        serde_json::json!({
            "node": self.node_id(),
            "address": self.advertise,
            "role": status.role,
            "leader": status.leader,
            "term": status.term,
            "cluster_id": map.cluster_id,
            "epoch": map.epoch,
            "erasure": format!("{}+{}", map.data_shards, map.parity_shards),
            "placement_groups": map.pg_count,
            "groups_placed": map.pgs.len(),
            "groups_moving": moving,
            "placement_epoch": map.placement_epoch,
            "write_fence": map.write_fence,
            "rebalance": rebalance,
            "serving": serving,
            // This node's calls that a step's switch refused and that were made again on the next store.
            "switch_calls_made_again": self.switch.made_again_total(),
            "nodes": nodes,
        })
    }

    /// The moves of every node that answers, summed, with an estimate of the time left at their rate.
    async fn rebalance_status(&self, map: &ClusterMap, running: &Running, moving: usize) -> serde_json::Value {
        let calls = map
            .nodes
            .iter()
            .filter(|(_, n)| n.state != NodeState::Dead)
            .map(|(id, n)| async move { self.report_of(running, *id, &n.address).await.ok() });
        let reports: Vec<Option<ServingReport>> = futures::future::join_all(calls).await;
        let answered: Vec<&ServingReport> = reports.iter().flatten().collect();
        let moved: u64 = answered.iter().map(|r| r.groups_moved).sum();
        let longest_ms = answered.iter().map(|r| r.moving_for_ms).max().unwrap_or(0);
        // Groups per second over the longest any node has been moving: a rough rate, enough for an ETA.
        let eta_s = (moving > 0 && moved > 0 && longest_ms > 0)
            .then(|| (moving as f64 / (moved as f64 * 1000.0 / longest_ms as f64)).ceil() as u64);
        serde_json::json!({
            "paused": map.moves_paused,
            "groups_moving": moving,
            "groups_moved": moved,
            "bytes_moved": answered.iter().map(|r| r.bytes_moved).sum::<u64>(),
            "objects_cleared": answered.iter().map(|r| r.objects_cleared).sum::<u64>(),
            "eta_s": eta_s,
            "nodes_behind": answered.iter().filter(|r| r.placement_epoch < map.placement_epoch).count(),
            "nodes_not_answering": reports.iter().filter(|r| r.is_none()).count(),
            "errors": answered.iter().filter_map(|r| r.last_error.clone()).collect::<Vec<_>>(),
        })
    }

    /// Composes the store of every new map with placement and serves S3 from it, until the server stops.
    async fn follow_map(self: Arc<Self>) {
        let Some(running) = self.running.get() else { return };
        let mut maps = running.node.watch_map();
        let mut stop = self.stop.clone();
        let mut built: Option<Arc<ClusterMap>> = None;
        // Composed again while drives were missing at the last composition (a node not up yet).
        let mut incomplete = false;
        loop {
            let map = maps.borrow_and_update().clone();
            // Applying a setting saves it (a synced file): on a blocking thread, not a runtime worker.
            let (node, settings) = (self.clone(), map.clone());
            let _ = tokio::task::spawn_blocking(move || node.apply_shared(&settings)).await;
            let mut retry = false;
            if !map.pgs.is_empty() && (incomplete || built.as_ref().is_none_or(|b| !same_placement(b, &map))) {
                match self.compose(&map, running).await {
                    Ok((layer, unreachable)) => {
                        let replaced = self.switch.set(layer);
                        self.report_when_drained(replaced, map.placement_epoch);
                        // What changed while this node composed its previous store (a node was down, a
                        // node crashed mid-write) is found by comparing the drives of the groups it owns.
                        tokio::spawn(self.clone().scan_owned(false));
                        tracing::info!(
                            epoch = map.epoch,
                            groups = map.pgs.len(),
                            unreachable_drives = unreachable,
                            down_nodes = map.nodes.values().filter(|n| n.state == NodeState::Down).count(),
                            "serving the cluster map"
                        );
                        incomplete = unreachable > 0;
                        retry = incomplete;
                        built = Some(map);
                    }
                    Err(e) => {
                        tracing::warn!(epoch = map.epoch, error = %e, "cannot compose the cluster's store yet");
                        retry = true;
                    }
                }
            }
            let pause = if incomplete { COMPOSE_INCOMPLETE_RETRY } else { COMPOSE_RETRY };
            tokio::select! {
                changed = maps.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(pause), if retry => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Reports `placement_epoch` as served (to this node's rebalancer, and to the others' through
    /// `/node/serving`) once no call is left on the layer `replaced`, nor on any replaced before it: a write
    /// that began on an older store may land without the drives a step keeps, and a step filled before it
    /// lands could lose it. A long upload delays the report and the moves that wait for it, never a request.
    fn report_when_drained(self: &Arc<Self>, replaced: Option<Arc<dyn ObjectLayer>>, placement_epoch: u64) {
        let mut draining = self.draining.lock();
        let previous = draining.take();
        let node = Arc::downgrade(self);
        let mut stop = self.stop.clone();
        *draining = Some(tokio::spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            if let Some(replaced) = replaced {
                let started = Instant::now();
                let mut warned = false;
                // The switch gave its own reference away: every other one is a call in flight.
                while Arc::strong_count(&replaced) > 1 {
                    if !warned && started.elapsed() >= DRAIN_WARN_AFTER {
                        tracing::warn!(placement_epoch, "calls on a replaced store are still in flight; moves wait");
                        warned = true;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(DRAIN_POLL) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }
            if let Some(node) = node.upgrade() {
                node.placement_epoch.fetch_max(placement_epoch, SeqCst);
                node.served_changed.notify_one();
            }
        }));
    }

    /// The S3 layer over the store `map` gives this node, and how many drives did not answer.
    async fn compose(&self, map: &ClusterMap, running: &Running) -> Result<(Arc<dyn ObjectLayer>, usize), String> {
        let me = self.node_id();
        let shared_locks = shared_locks(running);
        let cfg = ClusterStoreConfig {
            set: mosaic_erasure::SetConfig { shared_locks: Some(shared_locks.clone()), ..self.set_cfg.clone() },
            follows: self.follows.clone(),
        };
        let served = self.served.lock().clone();
        let previous = served.as_ref().map(|s| mosaic_cluster_store::Previous { map: &s.map, store: &s.store });
        let composed = mosaic_cluster_store::build(map, me, &self.local_drives(map), &running.client, &cfg, previous)
            .await
            .map_err(|e| e.to_string())?;
        drop(served);
        let layer_cfg = self.layer_cfg.get().ok_or("the server is not serving yet")?.clone();
        let layer_cfg = SemanticsConfig { shared_locks: Some(shared_locks), ..layer_cfg };
        let store = Arc::new(composed.store);
        let layer = S3Semantics::open(store.clone(), layer_cfg).await.map_err(|e| e.to_string())?;
        let owned = (0..map.pgs.len())
            .filter(|pg| {
                let entry = &map.pgs[*pg];
                mosaic_cluster_store::owner_of(map, entry.served()) == Some(me)
            })
            .collect();
        *self.served.lock() = Some(Served { map: Arc::new(map.clone()), store, owned, opened: composed.opened });
        Ok((Arc::new(layer), composed.unreachable.len()))
    }

    /// This node's drives by their id in `map`.
    fn local_drives(&self, map: &ClusterMap) -> HashMap<DriveId, DriveStore> {
        let me = self.node_id();
        map.drives
            .iter()
            .filter(|(_, d)| d.node == me)
            .filter_map(|(id, d)| {
                self.drives.iter().find(|(name, ..)| *name == d.name).map(|(_, s, _)| (*id, s.clone()))
            })
            .collect()
    }

    /// Compares the drives of every group this node owns (`all`), or of those whose sets the last
    /// composition opened (a set taken over was scanned when it was opened, and queues what its own writes
    /// miss), and queues what one lacks for heal (which runs in the background on the owner). Returns the
    /// objects scanned and the scans that failed.
    async fn scan_owned(self: Arc<Self>, all: bool) -> (u64, Vec<String>) {
        let Some(Served { store, owned, opened, .. }) = self.served.lock().clone() else { return (0, Vec::new()) };
        let (mut scanned, mut failed) = (0, Vec::new());
        for pg in owned.into_iter().filter(|pg| all || opened.contains(pg)) {
            match store.members()[pg].scan().await {
                Ok(n) => scanned += n,
                Err(e) => failed.push(format!("group {pg}: {e}")),
            }
        }
        if !failed.is_empty() {
            tracing::warn!(failed = failed.len(), first = %failed[0], "scans of owned placement groups failed");
        }
        (scanned, failed)
    }

    /// `mosaic admin heal` on a cluster node: scans the groups it owns and heals what they lack now.
    pub async fn heal(self: &Arc<Self>) -> serde_json::Value {
        const HEAL_STEP: usize = 1024;
        let (scanned, failed) = self.clone().scan_owned(true).await;
        let Some(Served { store, owned, .. }) = self.served.lock().clone() else {
            return serde_json::json!({ "error": "this node serves no cluster map yet" });
        };
        let mut tried = 0;
        for pg in &owned {
            let set = &store.members()[*pg];
            // Bounded: each round heals what is queued; what fails stays queued for the background.
            for _ in 0..MAX_HEAL_ROUNDS {
                if set.heal_backlog() == 0 {
                    break;
                }
                tried += set.heal_now(HEAL_STEP).await;
            }
        }
        let left: usize = owned.iter().map(|pg| store.members()[*pg].heal_backlog()).sum();
        serde_json::json!({
            "groups_owned": owned.len(),
            "objects_scanned": scanned,
            "objects_tried": tried,
            "objects_left": left,
            "scan_errors": failed,
        })
    }

    /// Proposes an operator's change of the map (drain, remove, weight, pause); returns the new epoch.
    pub async fn change(&self, change: Change) -> Result<u64, String> {
        let running = self.running.get().ok_or("this node is in no cluster")?;
        running.node.propose(change).await.map_err(|e| e.to_string())
    }

    /// Whether this node is in a cluster (initialized or joined), so that the map's settings apply.
    pub fn runs(&self) -> bool {
        self.running.get().is_some()
    }

    /// The map's shared setting `name` as this node's copy of the map has it.
    pub fn shared(&self, name: &str) -> Option<SharedSetting> {
        self.running.get()?.node.map().shared.get(name).cloned()
    }

    /// Sets the map's shared setting `name` to `value` as `version`, one more than the map's: refused when
    /// another node changed it first (the caller plans again from the newer value).
    pub async fn set_shared(&self, name: &str, value: String, version: u64) -> Result<(), String> {
        self.change(Change::SetShared { name: name.to_string(), value, version }).await.map(|_| ())
    }

    /// Has `apply` called with the value of the map's shared setting `name` now, if it has one, and with
    /// each newer value (every node applies what any node set).
    pub fn on_shared(&self, name: &'static str, apply: SharedApply) {
        self.shared_followers.lock().push(SharedFollower { name, applied: 0, apply });
        if let Some(running) = self.running.get() {
            self.apply_shared(&running.node.map());
        }
    }

    /// Hands each follower its setting's value in `map` if it did not apply that version yet. One that fails
    /// is logged and tried again with the next map.
    fn apply_shared(&self, map: &ClusterMap) {
        for f in self.shared_followers.lock().iter_mut() {
            let Some(setting) = map.shared.get(f.name).filter(|s| s.version > f.applied) else { continue };
            match (f.apply)(&setting.value) {
                Ok(()) => {
                    f.applied = setting.version;
                    tracing::info!(
                        setting = f.name,
                        version = setting.version,
                        "applied a shared setting of the cluster"
                    );
                }
                Err(e) => tracing::warn!(setting = f.name, version = setting.version, error = %e, "a shared setting"),
            }
        }
    }

    /// What this node serves and its rebalancer did, as other nodes ask it.
    fn serving_report(&self) -> ServingReport {
        let m = &self.moves;
        ServingReport {
            placement_epoch: self.placement_epoch.load(SeqCst),
            groups_moved: m.groups_moved.load(Relaxed),
            bytes_moved: m.bytes_moved.load(Relaxed),
            objects_cleared: m.objects_cleared.load(Relaxed),
            moving_for_ms: m.first_move.lock().map(|t| t.elapsed().as_millis() as u64).unwrap_or(0),
            last_error: m.last_error.lock().clone(),
            shared_applied: self.shared_followers.lock().iter().map(|f| (f.name.to_string(), f.applied)).collect(),
        }
    }

    /// Arms a rebalancer's step on this node (`PATH_FOLLOWS`): refused for a group or a set the map cannot
    /// have (the tally keeps a step per group it is asked for).
    fn arm_step(&self, arm: &ArmStep) -> Result<mosaic_cluster_store::FollowCount, String> {
        let running = self.running.get().ok_or("this node is in no cluster")?;
        arm.check(&running.node.map())?;
        Ok(self.tally_step(arm))
    }

    fn tally_step(&self, arm: &ArmStep) -> mosaic_cluster_store::FollowCount {
        match arm.seal {
            true => self.follows.seal(arm.pg, &arm.target),
            false => self.follows.arm(arm.pg, &arm.target),
        }
    }

    /// What node `id` (at `address`) serves and its rebalancer did: this node's own report, or its answer.
    async fn report_of(&self, running: &Running, id: u64, address: &str) -> Result<ServingReport, String> {
        if id == self.node_id() {
            return Ok(self.serving_report());
        }
        running.client.call(address, PATH_SERVING, &(), SERVING_CALL_TIMEOUT).await.map_err(|e| e.to_string())
    }

    /// Waits until every node the map counts as up (or draining) applied version `version` of the shared
    /// setting `name`, at most `timeout`: what a change that others must know before this node acts on it
    /// waits for (a rotated SSE key seals only once every node can open what it seals).
    pub async fn wait_for_shared(&self, name: &str, version: u64, timeout: Duration) -> Result<(), String> {
        let running = self.running.get().ok_or("this node is in no cluster")?;
        let what = format!("apply version {version} of the cluster's {name}");
        self.wait_for_every_node(running, timeout, &what, |r| {
            r.shared_applied.get(name).copied().unwrap_or(0) >= version
        })
        .await
    }

    /// Waits until every node the map counts as up (or draining), this one too, reports what `done` asks,
    /// at most `timeout` (polling every `PLACEMENT_POLL`); the error names the nodes that did not `what`.
    async fn wait_for_every_node(
        &self,
        running: &Running,
        timeout: Duration,
        what: &str,
        done: impl Fn(&ServingReport) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let map = running.node.map();
            let mut behind = Vec::new();
            for (id, n) in map.nodes.iter().filter(|(_, n)| matches!(n.state, NodeState::Up | NodeState::Draining)) {
                if !matches!(self.report_of(running, *id, &n.address).await, Ok(r) if done(&r)) {
                    behind.push(format!("node {id} at {}", n.address));
                }
            }
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("{} did not {what}", behind.join(", ")));
            }
            tokio::time::sleep(PLACEMENT_POLL).await;
        }
    }

    /// Moves the groups this node owns whose placement changed, one step at a time, until the server
    /// stops. Woken by every new store and every change of the map (a pause lifted changes no store); a
    /// step that fails is tried again after `MOVE_RETRY`.
    async fn rebalance(self: Arc<Self>) {
        let mut stop = self.stop.clone();
        let Some(running) = self.running.get() else { return };
        let mut maps = running.node.watch_map();
        loop {
            let retry = match self.move_owned_groups().await {
                Ok(()) => {
                    *self.moves.last_error.lock() = None;
                    false
                }
                Err(e) => {
                    tracing::info!(error = %e, "a move of placement groups waits");
                    metrics::counter!("mosaic_rebalance_failures_total").increment(1);
                    *self.moves.last_error.lock() = Some(e);
                    true
                }
            };
            tokio::select! {
                _ = self.served_changed.notified() => {}
                changed = maps.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(MOVE_RETRY), if retry => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One pass over the moving groups this node owns in the store it serves, until a step changes where
    /// some group is served (the next store is composed then, and the rebalancer woken).
    async fn move_owned_groups(&self) -> Result<(), String> {
        let Some(served) = self.served.lock().clone() else { return Ok(()) };
        let running = self.running.get().ok_or("this node is in no cluster")?;
        let map = &served.map;
        let moving: Vec<usize> = served.owned.iter().copied().filter(|pg| map.pgs[*pg].from.is_some()).collect();
        metrics::gauge!("mosaic_rebalance_groups_moving")
            .set(map.pgs.iter().filter(|p| p.from.is_some()).count() as f64);
        // Paused or not as the map says now (a pause changes no store, so the served map may be older).
        if moving.is_empty() || running.node.map().moves_paused {
            return Ok(());
        }
        self.moves.first_move.lock().get_or_insert_with(Instant::now);
        self.wait_for_placement(map, running).await?;
        for pg in moving {
            let now = running.node.map();
            if self.placement_epoch.load(SeqCst) != map.placement_epoch || now.placement_epoch != map.placement_epoch {
                return Ok(()); // a newer placement is (about to be) served: the next pass takes it
            }
            // Done since this store was composed (a step that was the last changes no serving set).
            if now.pgs.get(pg).is_none_or(|e| e.from.is_none()) {
                continue;
            }
            self.move_step(&served, pg, running).await.map_err(|e| format!("group {pg}: {e}"))?;
        }
        Ok(())
    }

    /// Waits until every node that answers serves `map`'s placement (or a newer one): from then on every
    /// write of a moving group is acknowledged only once the drives its step keeps hold it, so what the
    /// step's fill misses is rebuilt on the new drives from those after the step.
    async fn wait_for_placement(&self, map: &ClusterMap, running: &Running) -> Result<(), String> {
        let me = self.node_id();
        let others: Vec<(u64, &str)> = map
            .nodes
            .iter()
            .filter(|(id, n)| **id != me && matches!(n.state, NodeState::Up | NodeState::Draining))
            .map(|(id, n)| (*id, n.address.as_str()))
            .collect();
        let deadline = Instant::now() + PLACEMENT_WAIT;
        for (id, addr) in others {
            loop {
                // A node marked down or removed meanwhile is not waited for; a newer placement ends the
                // wait (the caller sees it and starts over from the newer store).
                let now = running.node.map();
                let gone = now.nodes.get(&id).is_none_or(|n| !matches!(n.state, NodeState::Up | NodeState::Draining));
                if gone || now.placement_epoch != map.placement_epoch {
                    break;
                }
                let report: Result<ServingReport, _> =
                    running.client.call(addr, PATH_SERVING, &(), SERVING_CALL_TIMEOUT).await;
                match report {
                    Ok(r) if r.placement_epoch >= map.placement_epoch => break,
                    _ if Instant::now() >= deadline => {
                        return Err(format!("node {addr} does not serve placement epoch {} yet", map.placement_epoch));
                    }
                    _ => tokio::time::sleep(PLACEMENT_POLL).await,
                }
            }
        }
        Ok(())
    }

    /// One step of group `pg`'s move: the served set healed whole, the step's set filled from it, the
    /// step reported done, the group cleared off the drives it left.
    async fn move_step(&self, served: &Served, pg: usize, running: &Running) -> Result<(), String> {
        let map = &served.map;
        let entry = &map.pgs[pg];
        let from = entry.from.clone().ok_or("not moving")?;
        let target = map.step_target(entry);
        // Every object whole on the set served, so that the k drives it shares with the target hold it.
        // Drives that left the map (a node removed as dead) are missing for good: what the others lack is
        // rebuilt on them, and the step replaces the missing ones first.
        let whole = &served.store.members()[pg];
        let missing: Vec<usize> = (0..from.len()).filter(|i| whole.members()[*i].is_none()).collect();
        if missing.iter().any(|i| map.drives.contains_key(&from[*i])) {
            return Err("a drive of its set does not answer".into());
        }
        let step = mosaic_cluster_store::Step::of(map, pg).ok_or("not moving")?;
        debug_assert_eq!(step.target, target);
        let mut ask = || self.follow_counts(&step, running, false);
        // From the arming on, every node's writes of the group are under the kept drives' rule and follow
        // their removals; the writes begun before it end first, and the heal then rebuilds what they left
        // short on the kept drives. While the step waited, its group's writes cost no more than others.
        let armed = mosaic_cluster_store::arm_step(&mut ask).await.map_err(|e| format!("arming its step: {e}"))?;
        heal_until_alike(whole, !missing.is_empty()).await.map_err(|e| format!("healing its set: {e}"))?;
        // The drives the step keeps took every write and delete of the group: the fill decides from them.
        let filling = self.open_target(map, &step, running).await?;
        // At most the node's move rate; a fill during which some node did not follow a removal onto the new
        // drives, or wrote unarmed, does not end the step (it starts again). Its last count seals the step
        // on every node; the report names the write fence read before it, so a node that restarted or
        // whose seal lapsed since (and may have written unseen) makes the map refuse the report.
        let rate = self.cfg.move_bytes_per_s;
        let write_fence = running.node.map().write_fence;
        let seal = || self.follow_counts(&step, running, true);
        let bytes = mosaic_cluster_store::fill_following(&filling, rate, armed, seal).await;
        self.moves.bytes_moved.fetch_add(bytes.as_ref().copied().unwrap_or(0), Relaxed);
        drop(filling);
        let done = match bytes {
            Ok(bytes) => {
                metrics::counter!("mosaic_rebalance_bytes_total").increment(bytes);
                self.abort_if_asked_before_report(pg);
                let report = Change::MoveDoneFenced { pg: pg as u32, set: target.clone(), write_fence };
                running.node.propose(report).await.map(|epoch| (epoch, bytes)).map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("filling its next set: {e}")),
        };
        let (epoch, bytes) = match done {
            Ok(done) => done,
            Err(e) => {
                // The step starts again: its seals are lifted now rather than at their lease (best effort).
                let _ = self.follow_counts(&step, running, false).await;
                return Err(e);
            }
        };
        self.moves.groups_moved.fetch_add(1, Relaxed);
        metrics::counter!("mosaic_rebalance_groups_moved_total").increment(1);
        tracing::info!(pg, bytes, done = entry.set == target, "placement group moved a step");
        // A write planned one change behind still goes to the drives the step left (the fence serves it on
        // purpose), and clearing under it fails it there: with k = m that fails the write (a 503). The
        // clearing waits until every node serves the placement the step made and its calls on older stores
        // are done; past the wait it clears anyway (a lagging node's write may fail, never be lost).
        let served_everywhere = self.wait_until_served(epoch, running).await;
        if let Err(e) = &served_everywhere {
            tracing::warn!(pg, error = %e, "clearing the drives a step left before every node serves the step");
        }
        for (slot, drive) in from.iter().enumerate().filter(|(i, d)| target[*i] != **d) {
            self.clear_left_drive(pg as u32, slot, *drive, running).await;
        }
        // A write made between the fill's last round and the moment every node served the step is on the
        // kept drives only: fewer shards than the set keeps (with k = m, k of 2k). The next step's start
        // heals the set served; after the last step there is none, so the set the move made is healed now.
        if let (Ok(placement), true) = (served_everywhere, entry.set == target) {
            self.heal_moved(pg, placement).await;
        }
        Ok(())
    }

    /// Testing only (`--fault-abort-before-move-report`): ends the process with no drain and no close, as
    /// a kill -9 would, between a step's last count (its seals held on every node) and its report, when
    /// this node is the one to remove the file (once among the nodes given the same path).
    fn abort_if_asked_before_report(&self, pg: usize) {
        let Some(path) = &self.cfg.abort_before_move_report else { return };
        if std::fs::remove_file(path).is_ok() {
            tracing::error!(pg, node = %self.advertise, "aborting before a step's report, as the fault flag asks");
            std::process::abort();
        }
    }

    /// Heals group `pg`'s set as this node serves it once it serves placement epoch `placement` (the
    /// set a move made); a failure is logged (the owner's background heal and scans go on).
    async fn heal_moved(&self, pg: usize, placement: u64) {
        let Some(served) = self.served.lock().clone() else { return };
        if served.map.placement_epoch < placement {
            return;
        }
        let Some(set) = served.store.members().get(pg).cloned() else { return };
        match heal_until_alike(&set, false).await {
            Ok(()) => tracing::debug!(pg, "healed the set a move made"),
            Err(e) => tracing::warn!(pg, error = %e, "healing the set a move made"),
        }
    }

    /// `step` armed (sealed too, with `seal`) on every node that is up (or draining), this one too, and
    /// their removal counts of its group: an error when one does not answer (the step tries again later; a
    /// node marked down is not asked).
    async fn follow_counts(
        &self,
        step: &mosaic_cluster_store::Step,
        running: &Running,
        seal: bool,
    ) -> Result<mosaic_cluster_store::FollowCounts, String> {
        let map = running.node.map();
        let arm = ArmStep { pg: step.pg as u32, target: step.target.clone(), seal };
        let asked = map.nodes.iter().filter(|(_, n)| matches!(n.state, NodeState::Up | NodeState::Draining));
        let calls = asked.map(|(id, n)| {
            let arm = &arm;
            async move {
                if *id == self.node_id() {
                    return Ok((*id, self.tally_step(arm)));
                }
                let count = running.client.call(&n.address, PATH_FOLLOWS, arm, SERVING_CALL_TIMEOUT).await;
                count.map(|c| (*id, c)).map_err(|e| format!("node {id}: {e}"))
            }
        });
        futures::future::join_all(calls).await.into_iter().collect()
    }

    /// Waits (at most `PLACEMENT_WAIT` in all) until every node that is up serves the placement of the map
    /// of `epoch` or a newer one, its calls on older stores done (`report_when_drained`); that placement's
    /// epoch.
    async fn wait_until_served(&self, epoch: u64, running: &Running) -> Result<u64, String> {
        let deadline = Instant::now() + PLACEMENT_WAIT;
        let map = running.node.wait_for_epoch(epoch, PLACEMENT_WAIT).await.map_err(|e| e.to_string())?;
        let placement = map.placement_epoch;
        let what = format!("serve placement epoch {placement}");
        let left = deadline.saturating_duration_since(Instant::now());
        self.wait_for_every_node(running, left, &what, |r| r.placement_epoch >= placement).await?;
        Ok(placement)
    }

    /// Group `pg`'s next set, only for filling it (`mosaic_cluster_store::open_step_set`).
    async fn open_target(
        &self,
        map: &ClusterMap,
        step: &mosaic_cluster_store::Step,
        running: &Running,
    ) -> Result<mosaic_cluster_store::StepSet, String> {
        let local = self.local_drives(map);
        // A write racing the fill is kept by the step's kept drives (`kept_drives`) and a removal is followed
        // onto the next set by the node that made it (`StepFollower`, under the write's locks). The fill
        // copies each object under the cluster's object locks too: without them a copy decided before a
        // delete could land after the delete's follow found nothing to remove, and with k = m it would bring
        // the object back once the step is served.
        let cfg = mosaic_erasure::SetConfig { shared_locks: Some(shared_locks(running)), ..self.set_cfg.clone() };
        mosaic_cluster_store::open_step_set(map, self.node_id(), step, &local, &running.client, cfg).await
    }

    /// Removes group `pg`'s old shards at position `slot` from `drive`, which the group left there. Stops
    /// when a newer map puts the drive back at that position (in the set served, the set moved to or the
    /// next step's); a drive that does not answer keeps the shards (space, never data: nothing reads them).
    async fn clear_left_drive(&self, pg: u32, slot: usize, drive: DriveId, running: &Running) {
        // The map the step's report made (or a newer one): the drive's node refuses the clearing's commands
        // once its map places the group otherwise.
        let map = running.node.map();
        let local = self.local_drives(&map);
        let Some(store) =
            mosaic_cluster_store::connect_drive(&map, self.node_id(), drive, &local, &running.client).await
        else {
            return;
        };
        let store = Arc::new(store.for_group(mosaic_cluster_store::group_placement(&map, pg as usize), slot));
        let node = running.node.clone();
        let still_away = move || {
            let now = node.map();
            now.pgs.get(pg as usize).is_none_or(|e| {
                [e.served(), &e.set, &now.step_target(e)].iter().all(|set| set.get(slot) != Some(&drive))
            })
        };
        match mosaic_cluster_store::clear_group(store, pg, slot, still_away).await {
            Ok(c) => {
                self.moves.objects_cleared.fetch_add(c.objects, Relaxed);
                tracing::debug!(pg, drive, objects = c.objects, "cleared a group off a drive it left");
            }
            Err(e) => tracing::warn!(pg, drive, error = %e, "clearing a group off a drive it left failed"),
        }
    }

    /// Stops Raft (the cluster port stops with the server's stop signal).
    pub async fn shutdown(&self) {
        if let Some(running) = self.running.get() {
            running.node.shutdown().await;
        }
    }
}

/// The cluster's object locks as a set's shared locks (`SetConfig::shared_locks`).
fn shared_locks(running: &Running) -> Arc<dyn mosaic_erasure::SharedLocks> {
    Arc::new(mosaic_cluster_store::NodeLocks(running.locks.clone()))
}

/// Heals `set` until a comparison of its drives finds nothing to rebuild (at most `MAX_MOVE_ROUNDS`).
/// With drives `missing` for good, every comparison finds them lacking everything: one round rebuilds what
/// the others lack, and that is all there is to do.
async fn heal_until_alike<S: mosaic_store::Store>(
    set: &mosaic_erasure::ErasureSet<S>,
    missing: bool,
) -> Result<(), String> {
    let failed_before = set.heal_progress().failed_objects.load(Relaxed);
    for _ in 0..MAX_MOVE_ROUNDS {
        set.scan().await.map_err(|e| e.to_string())?;
        if set.heal_backlog() == 0 {
            return Ok(());
        }
        while set.heal_backlog() > 0 && set.heal_now(MOVE_HEAL_STEP).await > 0 {}
        if set.heal_progress().failed_objects.load(Relaxed) > failed_before {
            return Err("some objects could not be rebuilt".into());
        }
        if missing {
            return Ok(());
        }
    }
    Err(format!("its drives still differ after {MAX_MOVE_ROUNDS} rounds of heal"))
}

/// Whether two maps compose the same store: the same groups on the same drives at the same addresses of
/// nodes in the same states.
fn same_placement(a: &ClusterMap, b: &ClusterMap) -> bool {
    let addresses =
        |m: &ClusterMap| m.nodes.iter().map(|(id, n)| (*id, n.address.clone(), n.state)).collect::<Vec<_>>();
    a.pgs == b.pgs
        && a.drives == b.drives
        && addresses(a) == addresses(b)
        && (a.data_shards, a.parity_shards) == (b.data_shards, b.parity_shards)
}

/// A member's invitation to join the cluster through it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Invite {
    /// The member's cluster address.
    peer: String,
    /// What the member serves with (`Cluster::effective_shared`): the invited node must serve with the same.
    shared: BTreeMap<String, String>,
}

/// An invited node's answer once it joined.
#[derive(serde::Serialize, serde::Deserialize)]
struct Joined {
    node: u64,
}

/// Answers this binary's node-to-node calls (only a node with the secret can call): the shared files a
/// joining node takes, and what this node serves.
struct NodeCalls {
    dir: PathBuf,
    cluster: Weak<Cluster>,
}

impl Handler for NodeCalls {
    fn handle(self: Arc<Self>, path: String, body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        Box::pin(async move {
            if path == PATH_SERVING {
                let cluster = self.cluster.upgrade().ok_or((StatusCode::SERVICE_UNAVAILABLE, "stopping".into()))?;
                return rpc::answer(&cluster.serving_report());
            }
            if path == PATH_FOLLOWS {
                let arm: ArmStep = rpc::parse(&body)?;
                let cluster = self.cluster.upgrade().ok_or((StatusCode::SERVICE_UNAVAILABLE, "stopping".into()))?;
                return rpc::answer(&cluster.arm_step(&arm).map_err(|e| (StatusCode::BAD_REQUEST, e))?);
            }
            if path == PATH_INVITE {
                let invite: Invite = rpc::parse(&body)?;
                let cluster = self.cluster.upgrade().ok_or((StatusCode::SERVICE_UNAVAILABLE, "stopping".into()))?;
                let joined = cluster.accept_invite(&invite.peer, &invite.shared).await;
                let node = joined.map_err(|e| (StatusCode::CONFLICT, e))?;
                return rpc::answer(&Joined { node });
            }
            if path != PATH_SHARED {
                return Err((StatusCode::NOT_FOUND, format!("no node call {path}")));
            }
            let mut files = BTreeMap::new();
            for name in SHARED_FILES {
                let p = self.dir.join(name);
                if p.exists() {
                    let text = datadir::read_small_file(&p).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
                    files.insert(name.to_string(), text);
                }
            }
            rpc::answer(&files)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_armed_only_for_a_group_and_a_set_the_map_can_have() {
        let mut map = ClusterMap::empty();
        map.apply(&Change::Bootstrap {
            cluster_id: "test".into(),
            data_shards: 2,
            parity_shards: 1,
            pg_count: 8,
            failure_domain: FailureDomain::Node,
            placement: mosaic_cluster::placement::PLACEMENT_LATEST,
        })
        .unwrap();
        for node in 0..3 {
            let address = format!("127.0.0.1:{}", 1 + node);
            let s3_address = address.clone();
            let add = Change::AddNode { node, address, s3_address, zone: "z".into() };
            let drive = Change::AddDrive { node, name: "d0".into(), weight: 100 };
            map.apply(&Change::Batch(vec![add, drive])).unwrap();
        }
        assert_eq!(map.pgs.len(), 8);
        let arm =
            |pg: u32, drives: usize| ArmStep { pg, target: (0..drives as DriveId).collect(), seal: false }.check(&map);
        assert_eq!(arm(7, 3), Ok(()), "the last group");
        assert!(arm(8, 3).is_err(), "one group past the map's");
        assert!(arm(u32::MAX, 3).is_err());
        assert_eq!(arm(0, mosaic_erasure::MAX_SET_DRIVES), Ok(()), "the widest set");
        assert!(arm(0, mosaic_erasure::MAX_SET_DRIVES + 1).is_err(), "one drive past it");
    }
}
