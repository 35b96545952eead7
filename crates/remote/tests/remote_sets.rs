//! Erasure sets whose drives are on other nodes (each node a drive server on loopback, reached through the
//! object-drive protocol): the semantics suite holds exactly as on local drives; a node that goes away is
//! a missing drive (reads and writes go on with k of n), not a hang or a crash; a client without the
//! cluster secret is refused; snapshots and staged units are not left behind on the servers.

use futures::StreamExt;
use mosaic_cluster::rpc::{self, RpcClient, Secret};
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, ScheduledDevice, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_layer::testing::{body, pattern, run_suite};
use mosaic_layer::{LayerError, ObjectLayer, Precondition, PutOptions, S3Semantics, SemanticsConfig};
use mosaic_remote::{DriveServer, RemoteStore};
use mosaic_store::{ErrorKind, ForegroundWork, Op, Snapshot, Store, Txn};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const DRIVE_BYTES: u64 = 128 << 20;
/// The IO share of the tests' client requests.
const SHARE: mosaic_store::ShareId = 7;

/// One node serving one simulated drive.
struct Node {
    address: String,
    server: Arc<DriveServer<DriveStore>>,
    /// What the server counts as the node's foreground work.
    foreground: Arc<ForegroundWork>,
    /// The node's IO shares (its drive schedules by them; share `SHARE` is known).
    shares: Arc<mosaic_store::IoShares>,
    stop: Option<oneshot::Sender<()>>,
    /// The RPC server, which ends (its connections aborted) once told to stop.
    rpc: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(secret: &Secret) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config =
            EngineConfig { kv_write_buffer_bytes: 4 << 20, kv_block_cache_bytes: 8 << 20, ..Default::default() };
        let shares = mosaic_store::IoShares::new(8 << 20, 1);
        shares.set_weight(SHARE, 100).unwrap();
        shares.set_active(true);
        let device = Arc::new(ScheduledDevice::new(Arc::new(SimDevice::new(DRIVE_BYTES)), shares.clone()));
        let engine = Engine::format(dir.path(), device, config).unwrap();
        let foreground = ForegroundWork::new();
        let drives = HashMap::from([("d0".to_string(), Arc::new(DriveStore::new(engine)))]);
        let server = DriveServer::new(drives, None, Some(foreground.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let rpc = tokio::spawn(rpc::serve(listener, secret.clone(), None, server.clone(), async {
            let _ = stopped.await;
        }));
        Node { address, server, foreground, shares, stop: Some(stop), rpc: Some(rpc), _dir: dir }
    }

    /// Stops the node's server and waits until it has: a call after this finds no one answering (a
    /// pooled connection to it is aborted, not served once more).
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rpc) = self.rpc.take() {
            rpc.await.expect("the server ends cleanly");
        }
    }
}

fn set_config(k: usize, m: usize) -> SetConfig {
    SetConfig::new(SetGeometry::new(k, m).unwrap())
}

/// A k+m set over k+m nodes, with the nodes.
async fn remote_set(k: usize, m: usize, secret: &Secret) -> (ErasureSet<RemoteStore>, Vec<Node>) {
    let mut nodes = Vec::new();
    let mut members = Vec::new();
    let client = RpcClient::new(secret.clone(), None).unwrap();
    for _ in 0..k + m {
        let node = Node::start(secret).await;
        members.push(Some(Arc::new(RemoteStore::connect(client.clone(), &node.address, "d0", None).await.unwrap())));
        nodes.push(node);
    }
    (ErasureSet::open(set_config(k, m), members).await.unwrap(), nodes)
}

async fn suite(k: usize, m: usize) {
    let secret = Secret::generate();
    let rt = tokio::runtime::Handle::current();
    let mut all_nodes = Vec::new();
    run_suite(|| {
        let (set, nodes) = tokio::task::block_in_place(|| rt.block_on(remote_set(k, m, &secret)));
        all_nodes.push(nodes);
        Arc::new(set)
    })
    .await;
    for mut node in all_nodes.into_iter().flatten() {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_semantics_suite_holds_on_remote_drives_as_a_1_plus_0_set() {
    suite(1, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_semantics_suite_holds_on_a_2_plus_1_set_over_three_nodes() {
    suite(2, 1).await;
}

async fn get_all<L: ObjectLayer>(l: &L, key: &str) -> Result<Vec<u8>, LayerError> {
    let mut got = l.get_object("bkt", key, None, None, None, &Precondition::default()).await?;
    let mut out = Vec::new();
    while let Some(chunk) = got.body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_goes_away_is_a_missing_drive() {
    let secret = Secret::generate();
    let (set, mut nodes) = remote_set(2, 1, &secret).await;
    let layer = S3Semantics::open(Arc::new(set), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let data = pattern(1, 300_000);
    layer.put_object("bkt", "before", body(&data, 65_536), PutOptions::default()).await.unwrap();

    // One of three nodes stops: reads and writes go on with two (k = 2).
    nodes[2].stop().await;
    assert_eq!(get_all(&layer, "before").await.unwrap(), data);
    layer.put_object("bkt", "after", body(&data, 65_536), PutOptions::default()).await.unwrap();
    assert_eq!(get_all(&layer, "after").await.unwrap(), data);

    // A second one stops: past m, a clear unavailable error, no hang and no wrong bytes.
    nodes[1].stop().await;
    let e = get_all(&layer, "before").await.expect_err("two of three drives gone");
    assert!(matches!(e, LayerError::Unavailable(_)), "{e:?}");
    let e = layer.put_object("bkt", "refused", body(&data, 65_536), PutOptions::default()).await.err();
    assert!(matches!(e, Some(LayerError::Unavailable(_))), "{e:?}");
}

/// A small GET asks each drive twice, the bucket's record and the object, each once: a lookup brings the
/// attributes and the bytes along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_get_is_one_request_per_drive() {
    let secret = Secret::generate();
    let (set, nodes) = remote_set(1, 0, &secret).await;
    let layer = S3Semantics::open(Arc::new(set), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    for (key, len) in [("small", 4096usize), ("inline", 100), ("large", 300_000)] {
        let data = pattern(len as u64, len);
        layer.put_object("bkt", key, body(&data, 65_536), PutOptions::default()).await.unwrap();
        let before = nodes[0].server.requests();
        assert_eq!(get_all(&layer, key).await.unwrap(), data);
        let asked = nodes[0].server.requests() - before;
        if len <= 64 << 10 {
            assert_eq!(asked, 2, "{key}: a GET of {len} bytes took {asked} requests");
        } else {
            assert!(asked >= 3, "{key}: larger objects are read after their lookup ({asked})");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_secret_is_refused_and_nothing_is_left_behind() {
    let secret = Secret::generate();
    let node = Node::start(&secret).await;
    let stranger = RpcClient::new(Secret::generate(), None).unwrap();
    let e = RemoteStore::connect(stranger, &node.address, "d0", None).await.err().expect("refused");
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.message.contains("401"), "{e}");
    let client = RpcClient::new(secret.clone(), None).unwrap();
    let e = RemoteStore::connect(client.clone(), &node.address, "nope", None).await.err().expect("no such drive");
    assert!(e.message.contains("no drive nope"), "{e}");

    // Reads open snapshots and staging holds units; dropping them releases both with later requests.
    let drive = RemoteStore::connect(client, &node.address, "d0", None).await.unwrap();
    drive.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    for _ in 0..10 {
        let snapshot = drive.snapshot();
        assert!(snapshot.collection("c").await.unwrap().is_some());
        let unit = drive.geometry().unit_bytes as usize;
        let (staged, _) = drive.stage(mosaic_store::AlignedBuf::zeroed(unit), unit, b"o").await.unwrap();
        drop(staged);
    }
    assert!(node.server.held().0 >= 1);
    drive.close().await.unwrap();
    assert_eq!(node.server.held(), (0, 0), "every snapshot and staged unit was released");

    // A transaction naming staged units the server does not hold fails cleanly, naming the operation.
    let coll = drive.snapshot().collection("c").await.unwrap().unwrap();
    let unit = drive.geometry().unit_bytes as usize;
    let (staged, _) = drive.stage(mosaic_store::AlignedBuf::zeroed(unit), unit, b"o").await.unwrap();
    drive.commit(Txn::new().op(Op::WriteStaged { coll, name: b"o".to_vec(), offset: 0, staged })).await.unwrap();
    let snapshot = drive.snapshot();
    let info = snapshot.lookup(&coll, b"o").await.unwrap().unwrap();
    assert_eq!(info.size_bytes, unit as u64);
    assert_eq!(snapshot.read(&info.obj, 0, 1 << 30).await.unwrap().len(), unit);
}

/// A drive's node counts as its foreground work only the commands made for a client
/// (`mosaic_store::in_foreground`, as the S3 server runs its connections): a set's scans, heal and every
/// other upkeep are background work there, whatever they are, so the node's own background work (a
/// cluster group's fill) does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_clients_commands_count_as_the_drive_nodes_foreground_work() {
    let secret = Secret::generate();
    let (set, nodes) = remote_set(2, 1, &secret).await;
    let set = Arc::new(set);
    let layer = S3Semantics::open(set.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let begun = |nodes: &[Node]| nodes.iter().map(|n| n.foreground.begun()).collect::<Vec<_>>();
    assert_eq!(begun(&nodes), vec![0; 3], "opening and creating a bucket from no client's request");
    let data = pattern(7, 300_000);
    let put = layer.put_object("bkt", "k", body(&data, 64 << 10), PutOptions::default());
    mosaic_store::in_foreground(put).await.unwrap();
    let before = begun(&nodes);
    assert!(before.iter().all(|&b| b > 0), "a client's write counted on every node: {before:?}");
    assert!(nodes.iter().all(|n| n.foreground.in_flight() == 0));
    assert!(set.scan().await.unwrap() > 0, "the scan saw the object");
    assert!(set.scan_deep().await.unwrap() > 0, "the deep scan read its shards back");
    assert_eq!(begun(&nodes), before, "scans are background work");
    assert_eq!(mosaic_store::in_foreground(get_all(&layer, "k")).await.unwrap(), data);
    let after = begun(&nodes);
    assert!(after.iter().zip(&before).any(|(a, b)| a > b), "a client's read counted: {after:?}");
}

/// A command runs on the drive's node in the IO share of the request it was made for (the caller's
/// microstore's, named on the wire): the bytes a client's PUT stages and its GET reads are counted in that
/// share on every node; a set's scans run unshared there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_runs_in_the_callers_io_share_on_the_drives_node() {
    let secret = Secret::generate();
    let (set, nodes) = remote_set(2, 1, &secret).await;
    let set = Arc::new(set);
    let layer = S3Semantics::open(set.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let served =
        |nodes: &[Node], share| nodes.iter().map(|n| n.shares.stats(share).unwrap().served_bytes).collect::<Vec<_>>();
    assert_eq!(served(&nodes, SHARE), vec![0; 3]);
    let data = pattern(9, 1 << 20);
    let put = layer.put_object("bkt", "k", body(&data, 64 << 10), PutOptions::default());
    mosaic_store::with_io_share(SHARE, put).await.unwrap();
    let after_put = served(&nodes, SHARE);
    assert!(after_put.iter().all(|&b| b >= 512 << 10), "each node staged its shard in the share: {after_put:?}");
    let unshared = served(&nodes, mosaic_store::UNSHARED);
    assert!(set.scan_deep().await.unwrap() > 0, "the deep scan read the shards back");
    assert_eq!(served(&nodes, SHARE), after_put, "a scan is no request's");
    assert!(served(&nodes, mosaic_store::UNSHARED).iter().zip(&unshared).any(|(a, b)| a > b), "it ran unshared");
    assert_eq!(mosaic_store::with_io_share(SHARE, get_all(&layer, "k")).await.unwrap(), data);
    let after_get = served(&nodes, SHARE);
    assert!(after_get.iter().zip(&after_put).any(|(a, b)| a > b), "the GET read in the share: {after_get:?}");
}

/// A lane of `pieces` pieces of `piece_bytes`, read at `offset` through `snap`: the bytes read, and the
/// lane's bytes when the read filled it.
async fn read_lane<S: Snapshot>(snap: &S, obj: &S::Obj, offset: u64, piece_bytes: usize) -> (u64, Option<Vec<u8>>) {
    let (buf, mut lanes) = mosaic_store::StripedBuffer::new(1, piece_bytes, 4, 0);
    let lane = lanes.pop().unwrap();
    let got = snap.read_into(obj, offset, lane).await.unwrap();
    (got, buf.into_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_into_a_lane_from_a_remote_drive_is_its_read_in_parts_of_any_size() {
    let secret = Secret::generate();
    let mut node = Node::start(&secret).await;
    let client = RpcClient::new(secret.clone(), None).unwrap();
    let store = RemoteStore::connect(client, &node.address, "d0", None).await.unwrap();
    store.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let coll = store.snapshot().collection("c").await.unwrap().unwrap();
    // Longer than two of the server's reads, so a lane's read comes in parts that end inside a piece.
    let max_read = mosaic_remote::server::MAX_READ_BYTES as usize;
    let len = 2 * max_read + 12_345;
    let data = pattern(11, len);
    store.commit(Txn::new().op(Op::Write { coll, name: b"o".to_vec(), offset: 0, data: data.clone() })).await.unwrap();

    let snap = store.snapshot();
    let obj = snap.lookup(&coll, b"o").await.unwrap().unwrap().obj;
    let piece_bytes = 3 << 20;
    let lane_bytes = 4 * piece_bytes;
    for offset in [0, 4096, 777] {
        let (got, filled) = read_lane(&snap, &obj, offset as u64, piece_bytes).await;
        assert_eq!(got, lane_bytes as u64, "at {offset}");
        assert_eq!(filled.as_deref(), Some(&data[offset..offset + lane_bytes]), "at {offset}");
    }
    // At the end of the object: shorter, and the lane is not handed back as filled.
    let (got, filled) = read_lane(&snap, &obj, (len - 5_000_000) as u64, piece_bytes).await;
    assert_eq!((got, filled), (5_000_000, None));
    // A snapshot's first read opens it (and is read whole, then copied): the same bytes.
    let fresh = store.snapshot();
    let (got, filled) = read_lane(&fresh, &obj, 8192, piece_bytes).await;
    assert_eq!(got, lane_bytes as u64);
    assert_eq!(filled.as_deref(), Some(&data[8192..8192 + lane_bytes]));
    drop((snap, fresh));
    node.stop().await;
}
