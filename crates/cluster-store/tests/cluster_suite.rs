//! The store of a three-node cluster (in one process: each node a drive server with two simulated drives on
//! loopback, placement groups as 2+1 sets on three distinct nodes): the semantics suite holds as on one
//! drive; what one node writes, every other node reads and lists; writes of one key through two nodes at
//! once both land, one after the other (the cluster's object locks, each node serving its lock table beside
//! its drives); objects live in the group the map's hash names.

use futures::StreamExt;
use mosaic_cluster::locks::{LockClient, LockServer, LockTable};
use mosaic_cluster::rpc::{self, Router, RpcClient, Secret};
use mosaic_cluster::{Change, ClusterMap, DriveId, FailureDomain, NodeId, pg_of};
use mosaic_cluster_store::{
    ClusterStore, ClusterStoreConfig, FollowCounts, FollowTally, NodeLocks, build, drive_guard,
};
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{SetConfig, SetGeometry, SharedLocks};
use mosaic_layer::testing::{body, pattern, run_suite};
use mosaic_layer::{
    LayerError, ListQuery, ObjectLayer, Precondition, PutOptions, S3Semantics, SemanticsConfig, Switch, VersionQuery,
    Versioning,
};
use mosaic_remote::DriveServer;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

const NODES: u64 = 3;
const DRIVES_PER_NODE: usize = 2;
const DRIVE_BYTES: u64 = 128 << 20;
const PG_COUNT: u32 = 8;

struct Cluster {
    map: ClusterMap,
    /// Per node: its drives by id.
    local: Vec<HashMap<DriveId, DriveStore>>,
    client: RpcClient,
    /// Every drive's simulated device, by id (to fail one).
    devices: HashMap<DriveId, SimDevice>,
    stops: Vec<oneshot::Sender<()>>,
    /// Per node: its lock table (served beside its drives).
    tables: Vec<Arc<LockTable>>,
    maps: watch::Sender<Arc<ClusterMap>>,
    /// Per node: its removals from moving groups, counted.
    follows: Vec<Arc<FollowTally>>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn start() -> Cluster {
        let secret = Secret::generate();
        let mut map = ClusterMap::empty();
        map.apply(&Change::Bootstrap {
            cluster_id: "test".into(),
            data_shards: 2,
            parity_shards: 1,
            pg_count: PG_COUNT,
            failure_domain: FailureDomain::Node,
            placement: mosaic_cluster::placement::PLACEMENT_LATEST,
        })
        .unwrap();
        let (mut local, mut stops, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut listeners, mut tables) = (Vec::new(), Vec::new());
        let mut devices = HashMap::new();
        for node in 0..NODES {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let mut changes = vec![Change::AddNode {
                node,
                address: address.clone(),
                s3_address: "127.0.0.1:1".into(),
                zone: "z".into(),
            }];
            let mut served = HashMap::new();
            let mut drives = HashMap::new();
            for d in 0..DRIVES_PER_NODE {
                let dir = tempfile::tempdir().unwrap();
                let config = EngineConfig {
                    kv_write_buffer_bytes: 4 << 20,
                    kv_block_cache_bytes: 8 << 20,
                    ..Default::default()
                };
                let device = SimDevice::new(DRIVE_BYTES);
                let engine = Engine::format(dir.path(), Arc::new(device.clone()), config).unwrap();
                let drive = DriveStore::new(engine);
                let name = format!("d{d}");
                served.insert(name.clone(), Arc::new(drive.clone()));
                // Ids come in the order drives are added: node by node, drive by drive.
                let id = (node as usize * DRIVES_PER_NODE + d) as DriveId;
                drives.insert(id, drive);
                devices.insert(id, device);
                changes.push(Change::AddDrive { node, name, weight: 100 });
                dirs.push(dir);
            }
            map.apply(&Change::Batch(changes)).unwrap();
            listeners.push((listener, served));
            local.push(drives);
        }
        // Served once the map names every node (a lock server checks callers against its map).
        let (maps, map_rx) = watch::channel(Arc::new(map.clone()));
        for (listener, served) in listeners {
            let table = Arc::new(LockTable::new(false));
            let router = Router::new()
                .route("/drive/", DriveServer::new(served, Some(drive_guard(map_rx.clone(), &secret)), None))
                .route("/lock/", LockServer::new(table.clone(), map_rx.clone()));
            let (stop, stopped) = oneshot::channel::<()>();
            tokio::spawn(rpc::serve(listener, secret.clone(), None, Arc::new(router), async {
                let _ = stopped.await;
            }));
            stops.push(stop);
            tables.push(table);
        }
        for (node, drives) in local.iter().enumerate() {
            for id in drives.keys() {
                assert_eq!(map.drives[id].node, node as NodeId);
            }
        }
        assert_eq!(map.pgs.len(), PG_COUNT as usize);
        let client = RpcClient::new(secret, None).unwrap();
        // Each node's start fenced, as a node's Raft does before it writes to moving groups.
        let fenced = |t: Arc<FollowTally>| {
            t.fenced(mosaic_cluster_store::Fence { placement_epoch: 0, asked_at: std::time::Instant::now() });
            t
        };
        let follows = (0..NODES).map(|_| fenced(FollowTally::new())).collect();
        Cluster { map, local, client, devices, stops, tables, maps, follows, _dirs: dirs }
    }

    /// The cluster's store as node `me` composes it.
    async fn store(&self, me: NodeId) -> ClusterStore {
        self.store_from(&self.map, me).await
    }

    /// The store node `me` composes from `map`.
    async fn store_from(&self, map: &ClusterMap, me: NodeId) -> ClusterStore {
        // The geometry is the map's; the rest are the defaults, with the cluster's object locks.
        let set = SetConfig { shared_locks: Some(self.locks(me)), ..SetConfig::new(SetGeometry::new(1, 0).unwrap()) };
        let cfg = ClusterStoreConfig { set, follows: self.follows[me as usize].clone() };
        build(map, me, &self.local[me as usize], &self.client, &cfg, None).await.unwrap().store
    }

    /// Every node's removal count of `step`'s group, the step armed on each (as the rebalancer asks).
    fn follow_counts(&self, step: &mosaic_cluster_store::Step) -> FollowCounts {
        let arm = |t: &Arc<FollowTally>| t.arm(step.pg as u32, &step.target);
        self.follows.iter().enumerate().map(|(node, t)| (node as NodeId, arm(t))).collect()
    }

    /// `follow_counts`, the step sealed on each (the step's last count).
    fn seal_counts(&self, step: &mosaic_cluster_store::Step) -> FollowCounts {
        let seal = |t: &Arc<FollowTally>| t.seal(step.pg as u32, &step.target);
        self.follows.iter().enumerate().map(|(node, t)| (node as NodeId, seal(t))).collect()
    }

    /// Node `me`'s side of the cluster's object locks.
    fn locks(&self, me: NodeId) -> Arc<dyn SharedLocks> {
        let table = self.tables[me as usize].clone();
        let client = LockClient::new(me, table, self.maps.subscribe(), self.client.clone(), Default::default());
        Arc::new(NodeLocks(client))
    }

    /// Node `me`'s S3 layer, as a cluster node opens it.
    async fn layer(&self, me: NodeId) -> S3Semantics<ClusterStore> {
        let cfg = SemanticsConfig { shared_locks: Some(self.locks(me)), ..Default::default() };
        S3Semantics::open(Arc::new(self.store(me).await), cfg).await.unwrap()
    }

    fn stop(self) {
        for stop in self.stops {
            let _ = stop.send(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_semantics_suite_holds_on_a_three_node_cluster() {
    let rt = tokio::runtime::Handle::current();
    let mut clusters = Vec::new();
    run_suite(|| {
        let cluster = tokio::task::block_in_place(|| rt.block_on(Cluster::start()));
        let store = tokio::task::block_in_place(|| rt.block_on(cluster.store(0)));
        clusters.push(cluster);
        Arc::new(store)
    })
    .await;
    for c in clusters {
        c.stop();
    }
    // Every command the suite sent stayed within its capability (a refused one would pass for a drive
    // that is away, which the sets tolerate).
    assert_eq!(mosaic_remote::server::capability_refusals(), 0);
}

async fn get_all<L: ObjectLayer>(l: &L, key: &str) -> Vec<u8> {
    get_version(l, key, None).await
}

/// The bytes of a version of `key` in bucket "bkt" (None: the current one).
async fn get_version<L: ObjectLayer>(l: &L, key: &str, version_id: Option<&str>) -> Vec<u8> {
    let mut got = l.get_object("bkt", key, version_id, None, None, &Precondition::default()).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = got.body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_reads_and_lists_what_one_node_wrote() {
    let cluster = Cluster::start().await;
    let mut layers = Vec::new();
    for me in 0..NODES {
        layers.push(cluster.layer(me).await);
    }
    layers[0].create_bucket("bkt", None).await.unwrap();
    let mut keys = Vec::new();
    for i in 0..40u64 {
        let key = format!("k{i:03}");
        let len = [0usize, 100, 20_000, 300_000][i as usize % 4];
        let writer = &layers[i as usize % NODES as usize];
        writer.put_object("bkt", &key, body(&pattern(i, len), 65_536), PutOptions::default()).await.unwrap();
        keys.push((key, pattern(i, len)));
    }
    for layer in &layers {
        for (key, data) in &keys {
            assert_eq!(&get_all(layer, key).await, data, "{key}");
        }
        let listed = layer.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
        let names: Vec<&str> = listed.objects.iter().map(|o| o.key.as_str()).collect();
        let want: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, want);
    }
    // An overwrite on one node is what every node reads next (no stale read), a delete on another is gone
    // everywhere.
    let (key, _) = &keys[5];
    layers[2].put_object("bkt", key, body(&pattern(99, 50_000), 65_536), PutOptions::default()).await.unwrap();
    for layer in &layers {
        assert_eq!(get_all(layer, key).await, pattern(99, 50_000));
    }
    layers[1].delete_object("bkt", key, None).await.unwrap();
    for layer in &layers {
        let e = layer.get_object("bkt", key, None, None, None, &Precondition::default()).await.err();
        assert_eq!(e, Some(LayerError::NoSuchKey));
    }

    // Two nodes write one key at once: both land, one after the other, and afterwards every node reads the
    // same whole object, one of the two.
    for round in 0..10u64 {
        let key = format!("race{round}");
        let (a, b) = (pattern(1000 + round, 30_000), pattern(2000 + round, 40_000));
        let (ra, rb) = tokio::join!(
            layers[0].put_object("bkt", &key, body(&a, 65_536), PutOptions::default()),
            layers[1].put_object("bkt", &key, body(&b, 65_536), PutOptions::default()),
        );
        assert!(ra.is_ok() && rb.is_ok(), "round {round}: {ra:?} {rb:?}");
        let seen = get_all(&layers[2], &key).await;
        assert!(seen == a || seen == b, "round {round}: a torn object of {} bytes", seen.len());
        for layer in &layers {
            assert_eq!(get_all(layer, &key).await, seen);
        }
    }
    cluster.stop();
}

/// Two nodes write one key of a versioned bucket at once: both writes land as versions of their own (the
/// layer makes a new version under the key's shared lock, so neither reads a current version the other is
/// replacing), and every node lists both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn versions_written_through_two_nodes_at_once_are_all_kept() {
    const ROUNDS: u64 = 10;
    let cluster = Cluster::start().await;
    let mut layers = Vec::new();
    for me in 0..NODES {
        layers.push(cluster.layer(me).await);
    }
    layers[0].create_bucket("bkt", None).await.unwrap();
    layers[0].put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    let mut last = Vec::new();
    for round in 0..ROUNDS {
        let (a, b) = (pattern(round, 3_000), pattern(100 + round, 50_000));
        let (ra, rb) = tokio::join!(
            layers[1].put_object("bkt", "v", body(&a, 65_536), PutOptions::default()),
            layers[2].put_object("bkt", "v", body(&b, 65_536), PutOptions::default()),
        );
        let (ma, mb) = (ra.unwrap(), rb.unwrap());
        assert_ne!(ma.version_id, mb.version_id);
        last = vec![a, b];
    }
    let current = get_all(&layers[0], "v").await;
    assert!(last.contains(&current), "the current version is one of the last round's");
    for layer in &layers {
        let q = VersionQuery { max_keys: 1000, ..Default::default() };
        let page = layer.list_object_versions("bkt", &q).await.unwrap();
        assert_eq!(page.versions.len() as u64, 2 * ROUNDS, "every version is kept");
        assert_eq!(get_all(layer, "v").await, current, "every node reads the same current version");
    }
    cluster.stop();
}

/// While a group's step is armed on a node (its fill is under way), the node's store acknowledges the
/// group's writes only once the drives the step keeps hold them (`ClusterMap::kept_slots`): with one of
/// those drives failed, a write that a quorum of the served set would take is refused, while a group whose
/// served set has that drive and does not keep it (a step leaving it, or no move) takes its write from the
/// same drives. Before the arming (the move waits its turn) the group's writes need only their quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moving_group_refuses_a_write_its_step_would_not_keep() {
    let mut cluster = Cluster::start().await;
    // A fourth node makes some groups move (its drives never answer: only the map matters here).
    let (address, zone) = ("127.0.0.1:1".to_string(), "z".to_string());
    let mut changes = vec![Change::AddNode { node: NODES, address: address.clone(), s3_address: address, zone }];
    changes.extend((0..2).map(|d| Change::AddDrive { node: NODES, name: format!("d{d}"), weight: 100 }));
    cluster.map.apply(&Change::Batch(changes)).unwrap();
    let map = &cluster.map;
    // A drive that one moving group keeps and another group serves without keeping it.
    let kept_by = |pg: usize, drive: DriveId| {
        let entry = &map.pgs[pg];
        let slot = entry.served().iter().position(|d| *d == drive);
        slot.map(|s| map.kept_slots(entry).is_some_and(|kept| kept & (1 << s) != 0))
    };
    let groups = 0..map.pgs.len();
    let (drive, keeping, other) = map
        .drives
        .keys()
        .find_map(|d| {
            let keeping = groups.clone().find(|pg| kept_by(*pg, *d) == Some(true))?;
            let other = groups.clone().find(|pg| kept_by(*pg, *d) == Some(false))?;
            Some((*d, keeping, other))
        })
        .expect("the fourth node's placement moves some groups");
    let key_in = |pg: usize| {
        (0..10_000).map(|i| format!("k{i}")).find(|k| pg_of(k.as_bytes(), PG_COUNT) as usize == pg).unwrap()
    };
    let layer = S3Semantics::open(Arc::new(cluster.store(0).await), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let put = |key: String| {
        let layer = &layer;
        async move { layer.put_object("bkt", &key, body(&pattern(1, 20_000), 65_536), PutOptions::default()).await }
    };
    put(key_in(keeping)).await.unwrap();
    cluster.devices[&drive].set_failing(true);
    put(key_in(keeping)).await.unwrap_or_else(|e| panic!("group {keeping}, not armed: {e:?}"));
    let step = mosaic_cluster_store::Step::of(map, keeping).unwrap();
    cluster.follows[0].arm(keeping as u32, &step.target);
    let refused = put(key_in(keeping)).await;
    assert!(matches!(refused, Err(LayerError::Unavailable(_))), "group {keeping}: {refused:?}");
    put(key_in(other)).await.unwrap_or_else(|e| panic!("group {other}: {e:?}"));
    // Once the drive's node is marked down, the group's step waits for it (its report is refused) and
    // its writes need only their quorum: a node failure during a move stops no write.
    let node = cluster.map.drives[&drive].node;
    cluster.map.apply(&Change::SetNodeState { node, state: mosaic_cluster::NodeState::Down }).unwrap();
    assert_eq!(cluster.map.kept_slots(&cluster.map.pgs[keeping]), None);
    let layer = S3Semantics::open(Arc::new(cluster.store(0).await), SemanticsConfig::default()).await.unwrap();
    let data = pattern(2, 20_000);
    layer.put_object("bkt", &key_in(keeping), body(&data, 65_536), PutOptions::default()).await.unwrap();
    assert_eq!(get_all(&layer, &key_in(keeping)).await, data);
    cluster.stop();
}

/// Drive 0 made to weigh almost nothing, so that groups on it move to the other drive of its node: the
/// step of one that keeps k drives, the slot its new drive takes, and a key of that group.
fn a_moving_group(cluster: &mut Cluster) -> (mosaic_cluster_store::Step, usize, String) {
    cluster.map.apply(&Change::SetDriveWeight { drive: 0, weight: 1 }).unwrap();
    let map = &cluster.map;
    let step = (0..map.pgs.len())
        .filter_map(|pg| mosaic_cluster_store::Step::of(map, pg))
        .find(|s| s.kept.count_ones() >= map.data_shards as u32)
        .expect("a group moves off drive 0");
    let new_slot = (0..step.target.len()).find(|s| step.kept & (1 << s) == 0).unwrap();
    let key = (0..10_000).map(|i| format!("k{i}")).find(|k| pg_of(k.as_bytes(), PG_COUNT) as usize == step.pg).unwrap();
    (step, new_slot, key)
}

/// `a_moving_group` with its key written in bucket `bkt` (through node 0, whose layer is returned), and the
/// step's set opened for filling as the rebalancer opens it.
async fn a_moving_group_with_its_key(
    cluster: &mut Cluster,
) -> (mosaic_cluster_store::Step, usize, String, S3Semantics<ClusterStore>, mosaic_cluster_store::StepSet) {
    let (step, new_slot, key) = a_moving_group(cluster);
    let writer = cluster.layer(0).await;
    writer.create_bucket("bkt", None).await.unwrap();
    writer.put_object("bkt", &key, body(&pattern(3, 40_000), 65_536), PutOptions::default()).await.unwrap();
    let base = SetConfig::new(SetGeometry::new(1, 0).unwrap());
    let filling = mosaic_cluster_store::open_step_set(&cluster.map, 0, &step, &cluster.local[0], &cluster.client, base)
        .await
        .unwrap();
    (step, new_slot, key, writer, filling)
}

/// A removal from a moving group is followed onto the drives its step fills (`StepFollower`) once the
/// step is armed: the fill copied an object onto the step's new drive, another node deletes it through the
/// set served, and the copy is gone from the new drive too (else, with k = m, it would tie with the kept
/// drives once the step is served and the object would come back). A key written again afterwards is left
/// for the fill. Before the arming the removal is not followed, and the fill that arms takes the copy off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_in_a_moving_group_reaches_the_drives_its_step_fills() {
    use mosaic_cluster_store::StepSet;
    use mosaic_store::{Snapshot, Store};
    let mut cluster = Cluster::start().await;
    // The rebalancer's fill copies the key onto the new drive.
    let (step, new_slot, key, writer, filling) = a_moving_group_with_its_key(&mut cluster).await;
    let fill = |set: &StepSet| {
        let set = set.clone();
        async move { mosaic_cluster_store::fill(&set, 0).await.unwrap() }
    };
    let on_new_drive = |set: &StepSet| {
        let drive = set.members()[new_slot].clone().unwrap();
        async move {
            let snap = drive.snapshot();
            let Some(c) = snap.collection("b/bkt").await.unwrap() else { return 0 };
            snap.list_entries(&c, b"", b"", 100).await.unwrap().len()
        }
    };
    fill(&filling).await;
    assert_eq!(on_new_drive(&filling).await, 1, "the fill copied the object");
    // Not armed yet (a copy an earlier attempt left): the delete is not followed, the armed fill decides.
    let deleter = cluster.layer(1).await;
    deleter.delete_object("bkt", &key, None).await.unwrap();
    assert_eq!(on_new_drive(&filling).await, 1, "not followed before the arming");
    let ask = || async { Ok(cluster.follow_counts(&step)) };
    let armed = mosaic_cluster_store::arm_step(ask).await.unwrap();
    mosaic_cluster_store::fill_following(&filling, 0, armed, ask).await.unwrap();
    assert_eq!(on_new_drive(&filling).await, 0, "the armed fill took the copy off");
    writer.put_object("bkt", &key, body(&pattern(3, 40_000), 65_536), PutOptions::default()).await.unwrap();
    fill(&filling).await;
    assert_eq!(on_new_drive(&filling).await, 1, "the fill copied the object again");

    // Armed: another node deletes it, and its store takes the copy off the new drive.
    deleter.delete_object("bkt", &key, None).await.unwrap();
    assert_eq!(on_new_drive(&filling).await, 0, "the removal was followed");
    // Written again, the kept drives hold it and the fill copies it again.
    writer.put_object("bkt", &key, body(&pattern(4, 40_000), 65_536), PutOptions::default()).await.unwrap();
    fill(&filling).await;
    assert_eq!(on_new_drive(&filling).await, 1);
    cluster.stop();
}

/// A removal that does not reach the drive a moving group's step fills (the deleting node cannot reach the
/// drive's node) is counted on the deleting node, and the fill during which it was counted does not end the
/// step: the step starts again, and its next fill takes the copy off the new drive (else, with k = m, it
/// would tie with the kept drives once the step is served, and the deleted object would come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_not_followed_during_a_fill_makes_the_step_start_again() {
    use mosaic_store::{Snapshot, Store};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let mut cluster = Cluster::start().await;
    let (step, new_slot, key, _writer, filling) = a_moving_group_with_its_key(&mut cluster).await;
    let on_new_drive = || {
        let drive = filling.members()[new_slot].clone().unwrap();
        async move {
            let snap = drive.snapshot();
            let Some(c) = snap.collection("b/bkt").await.unwrap() else { return 0 };
            snap.list_entries(&c, b"", b"", 100).await.unwrap().len()
        }
    };
    // Node 1 reaches the new drive's node at an address where nothing answers; the drives the step keeps
    // are on the other nodes, so its delete takes a quorum.
    let new_node = cluster.map.drives[&step.target[new_slot]].node;
    assert_ne!(new_node, 1);
    let mut cut_off = cluster.map.clone();
    cut_off.nodes.get_mut(&new_node).unwrap().address = "127.0.0.1:1".into();
    let deleter =
        S3Semantics::open(Arc::new(cluster.store_from(&cut_off, 1).await), SemanticsConfig::default()).await.unwrap();
    // The delete comes while the fill ends: after it copied the object, before the counts that end it.
    let asked = AtomicUsize::new(0);
    let ask = || {
        let (n, cluster, deleter, key, step) = (asked.fetch_add(1, SeqCst), &cluster, &deleter, &key, &step);
        async move {
            if n == 1 {
                deleter.delete_object("bkt", key, None).await.map_err(|e| e.to_string())?;
            }
            Ok(cluster.follow_counts(step))
        }
    };
    let armed = mosaic_cluster_store::arm_step(ask).await.unwrap();
    let ended = mosaic_cluster_store::fill_following(&filling, 0, armed, ask).await;
    assert!(ended.as_ref().is_err_and(|e| e.contains("starts again")), "{ended:?}");
    assert_eq!(cluster.follows[1].report().count(step.pg as u32).not_followed, 1);
    assert_eq!(on_new_drive().await, 1, "the copy stayed on the new drive");
    // The step again: its fill finds the object gone from the kept drives.
    let ask = || async { Ok(cluster.follow_counts(&step)) };
    let armed = mosaic_cluster_store::arm_step(ask).await.unwrap();
    mosaic_cluster_store::fill_following(&filling, 0, armed, ask).await.unwrap();
    assert_eq!(on_new_drive().await, 0, "the fill took the copy off");
    cluster.stop();
}

/// A moving group with a key written in it (through the layer returned) whose step was armed and filled,
/// its last count sealing it on every node.
async fn a_sealed_step(cluster: &mut Cluster) -> (mosaic_cluster_store::Step, String, S3Semantics<ClusterStore>) {
    let (step, _, key, writer, filling) = a_moving_group_with_its_key(cluster).await;
    let ask = || async { Ok(cluster.follow_counts(&step)) };
    let seal = || async { Ok(cluster.seal_counts(&step)) };
    let armed = mosaic_cluster_store::arm_step(ask).await.unwrap();
    mosaic_cluster_store::fill_following(&filling, 0, armed, seal).await.unwrap();
    (step, key, writer)
}

/// The step's last count seals it (`fill_following` sealing on every node): the group's removals under
/// the step are refused on every node (`Switching`, nothing committed), so none slips in between the count
/// and the switch; writes that remove nothing and reads go on. A node serves S3 through a `Switch`, where
/// a refused removal waits for the store of the step served and is made there: the client sees neither
/// the seal nor an error. A removal refused past `SWITCH_WAIT` with no newer store is refused (a 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_sealed_by_its_last_count_refuses_its_removals_until_it_is_served() {
    let mut cluster = Cluster::start().await;
    let (step, key, writer) = a_sealed_step(&mut cluster).await;
    let deleter = cluster.layer(1).await;
    let refused = deleter.delete_object("bkt", &key, None).await;
    assert!(matches!(refused, Err(LayerError::Switching(_))), "sealed: {refused:?}");
    writer.put_object("bkt", &key, body(&pattern(5, 40_000), 65_536), PutOptions::default()).await.unwrap();
    assert_eq!(get_all(&deleter, &key).await, pattern(5, 40_000), "reads and writes go on");
    drop(writer);

    // Through a switch, the delete waits for the next store.
    let switch = Arc::new(Switch::new("no store yet"));
    switch.set(Arc::new(deleter));
    let deleting = tokio::spawn({
        let (switch, key) = (switch.clone(), key.clone());
        async move { switch.delete_object("bkt", &key, None).await }
    });
    while switch.waiting() == 0 {
        assert!(!deleting.is_finished(), "the delete waits for the next store: {:?}", deleting.await);
        tokio::task::yield_now().await;
    }
    assert_eq!(get_all(&*switch, &key).await, pattern(5, 40_000), "not deleted while it waits");
    // The step served: the write is read there, and the waiting delete is made there.
    let target = cluster.map.step_target(&cluster.map.pgs[step.pg]);
    cluster.map.apply(&Change::MoveDone { pg: step.pg as u32, set: target }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    let served = Arc::new(cluster.layer(1).await);
    assert_eq!(get_all(&*served, &key).await, pattern(5, 40_000));
    switch.set(served.clone());
    deleting.await.unwrap().expect("made on the store of the step served");
    assert_eq!(switch.made_again_total(), 1);
    let gone = served.get_object("bkt", &key, None, None, None, &Precondition::default()).await;
    assert!(matches!(gone, Err(LayerError::NoSuchKey)), "deleted: {:?}", gone.map(|g| g.meta));
    cluster.stop();
}

/// With no newer store within `SWITCH_WAIT`, a removal a sealed step refuses is refused to the client
/// (a 503 it retries), and the object stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_a_sealed_step_refuses_waits_a_bounded_time_for_the_next_store() {
    let mut cluster = Cluster::start().await;
    let (_, key, _) = a_sealed_step(&mut cluster).await;
    let switch = Switch::new("no store yet");
    switch.set(Arc::new(cluster.layer(1).await));
    let started = std::time::Instant::now();
    let refused = switch.delete_object("bkt", &key, None).await;
    assert!(matches!(refused, Err(LayerError::Switching(_))), "sealed: {refused:?}");
    assert!(started.elapsed() >= mosaic_layer::SWITCH_WAIT, "it waited for the next store first");
    assert_eq!(switch.made_again_total(), 1, "once, on the same store, when the wait ended");
    assert_eq!(get_all(&switch, &key).await, pattern(3, 40_000), "nothing was deleted");
    cluster.stop();
}

/// A versioned overwrite renames the key's current version to its noncurrent name and makes the key anew
/// in one transaction: it removes no name (the key stays, as in any overwrite), so a step sealed by its
/// last count takes it on every node (before, it was refused like a delete, and its body, already read,
/// could not be sent again on the next store). Deleting the older version does remove a name: refused
/// while sealed. Both versions read back once the step is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sealed_step_takes_a_versioned_overwrite() {
    let mut cluster = Cluster::start().await;
    let (step, key, writer) = a_sealed_step(&mut cluster).await;
    writer.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    let other = cluster.layer(1).await;
    let newer = body(&pattern(11, 40_000), 65_536);
    other.put_object("bkt", &key, newer, PutOptions::default()).await.expect("an overwrite removes no name");
    let query = VersionQuery { prefix: key.clone(), max_keys: 10, ..Default::default() };
    let versions = other.list_object_versions("bkt", &query).await.unwrap().versions;
    assert_eq!(versions.len(), 2, "{versions:?}");
    let refused = other.delete_object("bkt", &key, Some("null")).await;
    assert!(matches!(refused, Err(LayerError::Switching(_))), "a version deleted is a removal: {refused:?}");
    drop((writer, other));

    let target = cluster.map.step_target(&cluster.map.pgs[step.pg]);
    cluster.map.apply(&Change::MoveDone { pg: step.pg as u32, set: target }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    let served = cluster.layer(1).await;
    assert_eq!(get_all(&served, &key).await, pattern(11, 40_000));
    assert_eq!(get_version(&served, &key, Some("null")).await, pattern(3, 40_000), "the older version kept");
    served.delete_object("bkt", &key, Some("null")).await.expect("served: removals go on");
    assert_eq!(served.list_object_versions("bkt", &query).await.unwrap().versions.len(), 1);
    cluster.stop();
}

/// A write made while its group's move waits its turn is not under the kept drives' rule: with a kept
/// drive out of reach, the drive the step leaves and the other kept one acknowledge it, and once the step
/// is armed the same write is refused. The rebalancer arms the step, heals the set served whole and only
/// then fills from the kept drives (`arm_step`, `fill_following`), so such a write is whole on the kept
/// drives before the fill decides from them, and it reads back once the step is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_made_before_its_step_is_armed_is_whole_on_the_kept_drives_before_the_fill() {
    let mut cluster = Cluster::start().await;
    let (step, _, key, _, filling) = a_moving_group_with_its_key(&mut cluster).await;
    // One node reaches a kept drive's node at an address where nothing answers.
    let kept_slot = (0..step.target.len()).find(|s| step.kept & (1 << s) != 0).unwrap();
    let kept_node = cluster.map.drives[&step.target[kept_slot]].node;
    let writer = (0..NODES).find(|n| *n != kept_node).unwrap();
    let mut cut_off = cluster.map.clone();
    cut_off.nodes.get_mut(&kept_node).unwrap().address = "127.0.0.1:1".into();
    let short = S3Semantics::open(Arc::new(cluster.store_from(&cut_off, writer).await), SemanticsConfig::default())
        .await
        .unwrap();
    let data = pattern(7, 40_000);
    short.put_object("bkt", &key, body(&data, 65_536), PutOptions::default()).await.expect("not armed: a quorum");
    cluster.follows[writer as usize].arm(step.pg as u32, &step.target);
    let refused = short.put_object("bkt", &key, body(&pattern(8, 40_000), 65_536), PutOptions::default()).await;
    assert!(matches!(refused, Err(LayerError::Unavailable(_))), "armed: {refused:?}");
    drop(short);

    // The rebalancer's order: arm on every node, heal the set served whole, fill.
    let ask = || async { Ok(cluster.follow_counts(&step)) };
    let armed = mosaic_cluster_store::arm_step(ask).await.unwrap();
    let store = cluster.store(0).await;
    let served = store.members()[step.pg].clone();
    served.scan().await.unwrap();
    assert!(served.heal_backlog() > 0, "the write is short on a kept drive");
    while served.heal_backlog() > 0 && served.heal_now(100).await > 0 {}
    mosaic_cluster_store::fill_following(&filling, 0, armed, ask).await.unwrap();
    drop((store, filling));
    let target = cluster.map.step_target(&cluster.map.pgs[step.pg]);
    cluster.map.apply(&Change::MoveDone { pg: step.pg as u32, set: target }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    assert_eq!(get_all(&cluster.layer(kept_node).await, &key).await, data, "read where the step is served");
    cluster.stop();
}

/// While a node of a moving group's set is marked down, the step keeps no drives (the group's writes need
/// only their quorum), so a removal is not followed but counted: the fill under way cannot end the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removal_while_a_node_of_a_moving_group_is_down_is_counted() {
    let mut cluster = Cluster::start().await;
    let (step, _, key) = a_moving_group(&mut cluster);
    let writer = cluster.layer(0).await;
    writer.create_bucket("bkt", None).await.unwrap();
    writer.put_object("bkt", &key, body(&pattern(5, 40_000), 65_536), PutOptions::default()).await.unwrap();
    let mut down = cluster.map.clone();
    let node = down.drives[&down.pgs[step.pg].served()[0]].node;
    down.apply(&Change::SetNodeState { node, state: mosaic_cluster::NodeState::Down }).unwrap();
    assert_eq!(down.kept_slots(&down.pgs[step.pg]), None);
    let other = (0..NODES).find(|n| *n != node).unwrap();
    let deleter =
        S3Semantics::open(Arc::new(cluster.store_from(&down, other).await), SemanticsConfig::default()).await.unwrap();
    let before = cluster.follow_counts(&step);
    deleter.delete_object("bkt", &key, None).await.unwrap();
    let after = cluster.follow_counts(&step);
    assert_eq!(mosaic_cluster_store::nodes_unfollowed(&before, &after), [other]);
    // Every write of the group counts (a delete may make several), and each ended.
    assert!(after[&other].begun > before[&other].begun, "begun: {:?}", after[&other]);
    assert_eq!(after[&other].oldest_under_way, None, "ended");
    cluster.stop();
}

/// A store composed from an older map is refused by the drives' nodes where the newer map changed what it
/// planned with (issue 16: a request carrying an older epoch is never served from a stale placement): a
/// moving group's reads and writes, and every command of a node the newer map marks down. What the newer
/// map did not change is served, and a store composed from the newer map is served everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_planned_from_an_older_map_are_refused_where_it_changed() {
    let mut cluster = Cluster::start().await;
    let key_in = |pg: usize| {
        (0..10_000).map(|i| format!("k{i}")).find(|k| pg_of(k.as_bytes(), PG_COUNT) as usize == pg).unwrap()
    };
    let data = pattern(3, 20_000);
    let old = S3Semantics::open(Arc::new(cluster.store(0).await), SemanticsConfig::default()).await.unwrap();
    old.create_bucket("bkt", None).await.unwrap();
    for pg in 0..PG_COUNT as usize {
        old.put_object("bkt", &key_in(pg), body(&data, 65_536), PutOptions::default()).await.unwrap();
    }
    // A fourth node (its drives never answer: only the map matters): some groups start moving.
    let (address, zone) = ("127.0.0.1:1".to_string(), "z".to_string());
    let mut changes = vec![Change::AddNode { node: NODES, address: address.clone(), s3_address: address, zone }];
    changes.extend((0..2).map(|d| Change::AddDrive { node: NODES, name: format!("d{d}"), weight: 100 }));
    cluster.map.apply(&Change::Batch(changes)).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    let (moving, still): (Vec<usize>, Vec<usize>) =
        (0..PG_COUNT as usize).partition(|pg| cluster.map.pgs[*pg].from.is_some());
    assert!(!moving.is_empty() && !still.is_empty(), "{moving:?}");
    // One change behind is served (the rebalancer's protocol keeps what such writes make).
    for pg in 0..PG_COUNT as usize {
        assert_eq!(get_all(&old, &key_in(pg)).await, data, "group {pg}");
    }
    // A step of every moving group done: the store of the first map is two changes behind on them.
    let one_behind = S3Semantics::open(Arc::new(cluster.store(0).await), SemanticsConfig::default()).await.unwrap();
    for pg in &moving {
        let target = cluster.map.step_target(&cluster.map.pgs[*pg]);
        cluster.map.apply(&Change::MoveDone { pg: *pg as u32, set: target }).unwrap();
    }
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    for pg in &moving {
        let got = old.get_object("bkt", &key_in(*pg), None, None, None, &Precondition::default()).await;
        assert!(matches!(got, Err(LayerError::Unavailable(_))), "group {pg}: {:?}", got.err());
        let put = old.put_object("bkt", &key_in(*pg), body(&pattern(4, 100), 65_536), PutOptions::default()).await;
        assert!(matches!(put, Err(LayerError::Unavailable(_))), "group {pg}: {put:?}");
    }
    for pg in &still {
        assert_eq!(get_all(&old, &key_in(*pg)).await, data, "group {pg}");
    }
    // Composed from the map one step behind, or the newest: served everywhere (nothing refused was written).
    let new = S3Semantics::open(Arc::new(cluster.store(0).await), SemanticsConfig::default()).await.unwrap();
    for pg in 0..PG_COUNT as usize {
        assert_eq!(get_all(&one_behind, &key_in(pg)).await, data, "group {pg}");
        assert_eq!(get_all(&new, &key_in(pg)).await, data, "group {pg}");
    }
    // Node 0 marked down: the others refuse what it planned before, even where no placement changed.
    let down = mosaic_cluster::NodeState::Down;
    cluster.map.apply(&Change::SetNodeState { node: 0, state: down }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    let got = new.get_object("bkt", &key_in(still[0]), None, None, None, &Precondition::default()).await;
    assert!(matches!(got, Err(LayerError::Unavailable(_))), "{:?}", got.err());
    // Marked up again (no placement changed for that group): its commands are served once more.
    cluster.map.apply(&Change::SetNodeState { node: 0, state: mosaic_cluster::NodeState::Up }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();
    assert_eq!(get_all(&new, &key_in(still[0])).await, data);
    cluster.stop();
}

/// A composition takes over the sets of the groups whose composition did not change (same served drives
/// on the same nodes and addresses in the same states, same kept slots, same owner) and opens the others:
/// a step of a move reopens one group on every node, not all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_map_reopens_only_the_groups_it_changes() {
    use mosaic_cluster_store::{Composed, Previous};
    async fn compose(c: &Cluster, map: &ClusterMap, previous: Option<(&ClusterMap, &ClusterStore)>) -> Composed {
        let cfg =
            ClusterStoreConfig { set: SetConfig::new(SetGeometry::new(1, 0).unwrap()), follows: c.follows[0].clone() };
        let previous = previous.map(|(map, store)| Previous { map, store });
        build(map, 0, &c.local[0], &c.client, &cfg, previous).await.unwrap()
    }
    let mut cluster = Cluster::start().await;
    let all: Vec<usize> = (0..PG_COUNT as usize).collect();
    let first = compose(&cluster, &cluster.map, None).await;
    assert_eq!(first.opened, all);
    let same = compose(&cluster, &cluster.map, Some((&cluster.map, &first.store))).await;
    assert!(same.opened.is_empty());
    for (a, b) in first.store.members().iter().zip(same.store.members()) {
        assert!(Arc::ptr_eq(a, b));
    }
    // A fourth node: the groups that move now keep slots (their writes change), the others stay as they are.
    let before = cluster.map.clone();
    let (address, zone) = ("127.0.0.1:1".to_string(), "z".to_string());
    let mut changes = vec![Change::AddNode { node: NODES, address: address.clone(), s3_address: address, zone }];
    changes.extend((0..2).map(|d| Change::AddDrive { node: NODES, name: format!("d{d}"), weight: 100 }));
    cluster.map.apply(&Change::Batch(changes)).unwrap();
    let moving: Vec<usize> = all.iter().copied().filter(|pg| cluster.map.pgs[*pg].from.is_some()).collect();
    assert!(!moving.is_empty() && moving.len() < all.len(), "{moving:?}");
    let grown = compose(&cluster, &cluster.map, Some((&before, &same.store))).await;
    assert_eq!(grown.opened, moving);
    // A node marked down: every group with a drive on it is opened again (without that drive).
    let down = cluster.map.clone();
    cluster.map.apply(&Change::SetNodeState { node: 2, state: mosaic_cluster::NodeState::Down }).unwrap();
    let on_node_2: Vec<usize> = all
        .iter()
        .copied()
        .filter(|pg| cluster.map.pgs[*pg].served().iter().any(|d| cluster.map.drives[d].node == 2))
        .collect();
    let after_down = compose(&cluster, &cluster.map, Some((&down, &grown.store))).await;
    assert_eq!(after_down.opened, on_node_2);
    // Sets missing a drive are never taken over: the next composition tries the drive again.
    let again = compose(&cluster, &cluster.map, Some((&cluster.map, &after_down.store))).await;
    assert_eq!(again.opened, on_node_2);
    cluster.stop();
}

/// The pool places an object on the member its locator hashes to, and the map calls that member the
/// object's placement group: the two hashes are one, or a cluster would look for objects in the wrong group.
#[test]
fn the_pool_places_objects_in_the_maps_group() {
    for i in 0..10_000u32 {
        let locator = format!("bucket-{}\0key/{i}", i % 7);
        for count in [1u32, 8, 64, 256] {
            assert_eq!(
                mosaic_pool::member_of(locator.as_bytes(), count as usize) as u32,
                pg_of(locator.as_bytes(), count)
            );
        }
    }
}

/// A bucket deleted while one of its groups moves, after the fill made its collection on the group's new
/// drive: the deletion does not reach that drive (the collection stays there, empty), and once the move
/// is done the bucket is made again, written, read and listed as if it were new.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_deleted_while_its_group_moves_is_made_again_after_the_move() {
    let mut cluster = Cluster::start().await;
    let (step, _, key, _, filling) = a_moving_group_with_its_key(&mut cluster).await;
    filling.scan().await.unwrap();
    while filling.heal_now(100).await > 0 {}

    let deleter = cluster.layer(1).await;
    deleter.delete_object("bkt", &key, None).await.unwrap();
    deleter.delete_bucket("bkt").await.unwrap();
    let target = cluster.map.step_target(&cluster.map.pgs[step.pg]);
    cluster.map.apply(&Change::MoveDone { pg: step.pg as u32, set: target }).unwrap();
    cluster.maps.send(Arc::new(cluster.map.clone())).unwrap();

    let after = cluster.layer(2).await;
    let gone = after.head_object("bkt", &key, None, &Precondition::default()).await;
    assert!(matches!(gone, Err(LayerError::NoSuchBucket)), "{gone:?}");
    after.create_bucket("bkt", None).await.unwrap();
    after.put_object("bkt", &key, body(&pattern(5, 40_000), 65_536), PutOptions::default()).await.unwrap();
    assert_eq!(get_all(&after, &key).await, pattern(5, 40_000));
    let listed = after.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    assert_eq!(listed.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), [key.as_str()]);
    cluster.stop();
}
