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

use crate::config::ClusterConfig;
use crate::datadir;
use bytes::Bytes;
use hyper::StatusCode;
use mosaic::datadir_format::{self as format, ClusterNodeFile};
use mosaic_cluster::rpc::{self, Answer, Handler, Router, RpcClient, Secret};
use mosaic_cluster::{Change, ClusterError, ClusterMap, ClusterNode, DriveId, FailureDomain, NodeConfig, NodeState};
use mosaic_cluster_store::{ClusterStore, ClusterStoreConfig};
use mosaic_drive::DriveStore;
use mosaic_layer::{ObjectLayer, S3Semantics, SemanticsConfig, Switch};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// This binary's own node-to-node call: the files a joining node takes from a member.
const PATH_SHARED: &str = "/node/shared";
/// The data directory's files every node of a cluster holds alike.
const SHARED_FILES: [&str; 3] = ["credentials", "sse-keys", "keys"];
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a node waits to see itself in the map after the leader said it is in already.
const SEE_SELF_WAIT: Duration = Duration::from_secs(15);
/// Pause before composing the store again after a failure (a drive's node not answering yet).
const COMPOSE_RETRY: Duration = Duration::from_secs(1);
/// Pause before composing again a store that some drives were missing from.
const COMPOSE_INCOMPLETE_RETRY: Duration = Duration::from_secs(3);
/// How stale a node's view of a bucket's settings may be (another node may change them).
const BUCKET_STATE_TTL: Duration = Duration::from_secs(1);
/// A node that answers the leader's probes for this long is marked down: its drives are left out of every
/// node's store (no call waits on it) until it answers again.
const DOWN_AFTER: Duration = Duration::from_secs(5);
/// Rounds of heal per group that `admin heal` runs before it leaves the rest to the background.
const MAX_HEAL_ROUNDS: usize = 64;
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

/// A node's Raft and the client it calls other nodes with, once it has the secret.
struct Running {
    node: Arc<ClusterNode>,
    client: RpcClient,
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
    running: tokio::sync::OnceCell<Running>,
    /// Serializes init and join.
    changing: tokio::sync::Mutex<()>,
    set_cfg: mosaic_erasure::SetConfig,
    /// Set when the server has its SSE keys; the map is followed from then on.
    layer_cfg: OnceLock<SemanticsConfig>,
    following: AtomicBool,
    /// The store served now, and the groups this node owns in it (it settles and heals those).
    composed: Mutex<Option<(Arc<ClusterStore>, Vec<usize>)>>,
    pub switch: Arc<Switch>,
    stop: watch::Receiver<bool>,
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
            running: tokio::sync::OnceCell::new(),
            changing: tokio::sync::Mutex::new(()),
            set_cfg,
            layer_cfg: OnceLock::new(),
            following: AtomicBool::new(false),
            composed: Mutex::new(None),
            switch: Arc::new(Switch::new(
                "this node is not in a cluster yet: run `mosaic admin cluster init` on the first node, or start it with --join",
            )),
            stop,
        }))
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
            self.start(Secret::parse(&secret)?).await?;
            return Ok(());
        }
        let Some(peer) = self.cfg.join.clone() else {
            tracing::info!("this node is in no cluster: `mosaic admin cluster init` makes one here");
            return Ok(());
        };
        let secret = self.cfg.secret.as_deref().ok_or(
            "joining a cluster needs its secret in MOSAIC_CLUSTER_SECRET (printed by `mosaic admin cluster init`)",
        )?;
        self.join(&peer, Secret::parse(secret)?).await
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
        }
    }

    /// Starts Raft and the cluster port with `secret` (once).
    async fn start(self: &Arc<Self>, secret: Secret) -> Result<&Running, String> {
        self.running
            .get_or_try_init(|| async {
                let id = self.node_id();
                let config = NodeConfig {
                    id,
                    dir: self.data_dir.join(datadir::CLUSTER_DIR).join("raft"),
                    address: self.advertise.clone(),
                    secret: secret.clone(),
                    raft: Default::default(),
                    down_after: Some(DOWN_AFTER),
                };
                let node = ClusterNode::start(config).await?;
                let client = RpcClient::new(secret.clone())?;
                let served = self.drives.iter().map(|(name, d, _)| (name.clone(), Arc::new(d.clone()))).collect();
                let router = Router::new()
                    .route("/cluster/", node.clone())
                    .route("/raft/", node.clone())
                    .route("/drive/", mosaic_remote::DriveServer::new(served))
                    .route("/node/", Arc::new(SharedFiles { dir: self.data_dir.clone() }));
                let listener = self.listener.lock().take().ok_or("the cluster port is gone")?;
                let mut stop = self.stop.clone();
                tokio::spawn(rpc::serve(listener, secret, Arc::new(router), async move {
                    let _ = stop.wait_for(|s| *s).await;
                }));
                tracing::info!(node = id, address = %self.advertise, "cluster node started");
                Ok::<_, String>(Running { node, client })
            })
            .await?;
        // Started after the server began serving (init): follow the map from now.
        self.follow_once();
        Ok(self.running.get().expect("just started"))
    }

    /// Joins the cluster of the member at `peer`.
    async fn join(self: &Arc<Self>, peer: &str, secret: Secret) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let running = self.start(secret.clone()).await?;
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
        let running = self.start(secret.clone()).await?;
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
                let drives = map.drives_of(*id);
                serde_json::json!({
                    "id": id,
                    "address": n.address,
                    "s3_address": n.s3_address,
                    "zone": n.zone,
                    "state": n.state,
                    "drives": drives.len(),
                    "groups": map.groups_on_node(*id),
                    "manager": status.managers.contains(id),
                })
            })
            .collect();
        let moving = map.pgs.iter().filter(|p| p.from.is_some()).count();
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
            "serving": serving,
            "nodes": nodes,
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
            let mut retry = false;
            if !map.pgs.is_empty() && (incomplete || built.as_ref().is_none_or(|b| !same_placement(b, &map))) {
                match self.compose(&map, running).await {
                    Ok((layer, unreachable)) => {
                        self.switch.set(layer);
                        // What changed while this node composed its previous store (a node was down, a
                        // node crashed mid-write) is found by comparing the drives of the groups it owns.
                        tokio::spawn(self.clone().scan_owned());
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

    /// The S3 layer over the store `map` gives this node, and how many drives did not answer.
    async fn compose(&self, map: &ClusterMap, running: &Running) -> Result<(Arc<dyn ObjectLayer>, usize), String> {
        let me = self.node_id();
        let local: HashMap<DriveId, DriveStore> = map
            .drives
            .iter()
            .filter(|(_, d)| d.node == me)
            .filter_map(|(id, d)| {
                self.drives.iter().find(|(name, ..)| *name == d.name).map(|(_, s, _)| (*id, s.clone()))
            })
            .collect();
        let cfg = ClusterStoreConfig { set: self.set_cfg.clone() };
        let composed =
            mosaic_cluster_store::build(map, me, &local, &running.client, &cfg).await.map_err(|e| e.to_string())?;
        let layer_cfg = self.layer_cfg.get().ok_or("the server is not serving yet")?.clone();
        let store = Arc::new(composed.store);
        let layer = S3Semantics::open(store.clone(), layer_cfg).await.map_err(|e| e.to_string())?;
        let owned = (0..map.pgs.len())
            .filter(|pg| {
                let entry = &map.pgs[*pg];
                mosaic_cluster_store::owner_of(map, entry.from.as_ref().unwrap_or(&entry.set)) == Some(me)
            })
            .collect();
        *self.composed.lock() = Some((store, owned));
        Ok((Arc::new(layer), composed.unreachable.len()))
    }

    /// Compares the drives of every group this node owns and queues what one lacks for heal (which runs in
    /// the background on the owner). Returns the objects scanned and the scans that failed.
    async fn scan_owned(self: Arc<Self>) -> (u64, Vec<String>) {
        let Some((store, owned)) = self.composed.lock().clone() else { return (0, Vec::new()) };
        let (mut scanned, mut failed) = (0, Vec::new());
        for pg in owned {
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
        let (scanned, failed) = self.clone().scan_owned().await;
        let Some((store, owned)) = self.composed.lock().clone() else {
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

    /// Stops Raft (the cluster port stops with the server's stop signal).
    pub async fn shutdown(&self) {
        if let Some(running) = self.running.get() {
            running.node.shutdown().await;
        }
    }
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

/// Answers a joining node's request for the shared files (only a node with the secret can call).
struct SharedFiles {
    dir: PathBuf,
}

impl Handler for SharedFiles {
    fn handle(self: Arc<Self>, path: String, _body: Bytes) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        Box::pin(async move {
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
