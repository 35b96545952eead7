//! A guarded drive server (a cluster node's) serves a command only under a capability signed with the
//! cluster's key, in force, for its drive and its operations, and only within the capability's scope:
//! collections named by name or by id, objects by the snapshot that found them, staged units by the scope
//! they were staged under. Everything else is refused as unavailable, and nothing outside the scope is
//! read or changed.

use bytes::Bytes;
use mosaic_cluster::capability::{CapabilityKey, LIFETIME_MS, Ops, now_unix_ms};
use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::rpc::{self, Parts, RpcClient, Secret};
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_remote::server::{FenceCheck, Guard};
use mosaic_remote::wire::{self, Answer, Command, Fence, GroupPlacement, Reply, Request};
use mosaic_remote::{DriveServer, RemoteStore};
use mosaic_store::{AlignedBuf, ErrorKind, Op, Snapshot, Store, StoreError, Txn};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const DRIVE_BYTES: u64 = 128 << 20;
/// Larger than what a lookup sends along, so that reads of it reach the server.
const BIG_BYTES: usize = 96 << 10;

struct Node {
    address: String,
    client: RpcClient,
    key: CapabilityKey,
    _dir: tempfile::TempDir,
}

async fn guarded_node() -> Node {
    let secret = Secret::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig { kv_write_buffer_bytes: 4 << 20, kv_block_cache_bytes: 8 << 20, ..Default::default() };
    let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(DRIVE_BYTES)), config).unwrap();
    // Every fence passes: what is checked here is the capability.
    let fence: FenceCheck = Arc::new(|_: &Fence| Ok(()));
    let guard = Guard { fence, capabilities: CapabilityKey::of(&secret) };
    let server =
        DriveServer::new(HashMap::from([("d0".to_string(), Arc::new(DriveStore::new(engine)))]), Some(guard), None);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(rpc::serve(listener, secret.clone(), None, server, std::future::pending()));
    let client = RpcClient::new(secret.clone(), None).unwrap();
    Node { address, client, key: CapabilityKey::of(&secret), _dir: dir }
}

fn fence() -> Fence {
    Fence { node: 1, epoch: 1, placement_epoch: 1, group: None }
}

fn placement() -> GroupPlacement {
    GroupPlacement { pg: 7, served: vec![0], kept: None }
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, StoreError>, why: &str) {
    let e = result.expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(e.message.contains("refused") && e.message.contains(why), "{e}");
}

/// One request as sent by hand: `request` with `capability`, to the node.
async fn call(node: &Node, command: Command, capability: Option<mosaic_cluster::capability::Capability>) -> Reply {
    let mut request = Request {
        drive: "d0".into(),
        fence: Some(fence()),
        capability,
        foreground: false,
        io_share: mosaic_store::UNSHARED,
        release_snapshots: Vec::new(),
        release_staged: Vec::new(),
        command,
    };
    let payload = request.take_payload();
    let head = frame::encode_binary(Kind::Drive, &request, &payload).unwrap();
    let raw = node.client.call_raw(&node.address, wire::PATH, Parts::new(head, payload), Duration::from_secs(10));
    let (mut reply, payload): (Reply, Bytes) = frame::decode_binary(Kind::Drive, &raw.await.unwrap()).unwrap();
    reply.put_payload(payload).unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_without_a_valid_capability_for_its_drive_and_operation_is_refused() {
    let node = guarded_node().await;
    let now = now_unix_ms();
    let hello = || Command::Hello;
    assert!(call(&node, hello(), Some(node.key.issue(1, "d0", "", Ops::CONNECT, now))).await.answer.is_ok());

    assert_refused(call(&node, hello(), None).await.answer, "no capability");
    let foreign = CapabilityKey::of(&Secret::generate()).issue(1, "d0", "", Ops::CONNECT, now);
    assert_refused(call(&node, hello(), Some(foreign)).await.answer, "signature fails");
    let expired = node.key.issue(1, "d0", "", Ops::CONNECT, now - 4 * LIFETIME_MS);
    assert_refused(call(&node, hello(), Some(expired)).await.answer, "expired");
    let other_drive = node.key.issue(1, "d1", "", Ops::CONNECT, now);
    assert_refused(call(&node, hello(), Some(other_drive)).await.answer, "for drive d1");
    let mut widened = node.key.issue(1, "d0", "", Ops::CONNECT, now);
    widened.ops = Ops::SET.union(Ops::CONNECT);
    let read = || Command::Collections { snapshot: None, prefix: String::new(), limit: 10 };
    assert_refused(call(&node, read(), Some(widened)).await.answer, "signature fails");

    // Each operation needs its own bit.
    let connect_only = node.key.issue(1, "d0", "", Ops::CONNECT, now);
    assert_refused(call(&node, read(), Some(connect_only)).await.answer, "allows");
    let read_only = node.key.issue(1, "d0", "", Ops::READ, now);
    assert!(call(&node, read(), Some(read_only.clone())).await.answer.is_ok());
    assert_refused(call(&node, hello(), Some(read_only.clone())).await.answer, "allows");
    let create = Command::Commit { txn: Txn::new().op(Op::CreateCollection { name: "a/c".into() }) };
    assert_refused(call(&node, create, Some(read_only)).await.answer, "allows");
    let stage = Command::Stage { hint: Default::default(), data: Bytes::from(vec![0u8; 4096]) };
    let commit_only = node.key.issue(1, "d0", "", Ops::COMMIT, now);
    assert_refused(call(&node, stage, Some(commit_only)).await.answer, "allows");

    // Releases need none: they only give back what the caller held.
    assert!(call(&node, Command::Release, None).await.answer.is_ok());
}

/// A collection with one object of `BIG_BYTES`, made through `store`; the object's id as `store` sees it.
async fn collection_with_object(store: &RemoteStore, name: &str) -> (u32, u64) {
    let txn = Txn::new().op(Op::CreateCollection { name: name.into() });
    store.commit(txn).await.unwrap();
    let coll = store.snapshot().collection(name).await.unwrap().unwrap();
    let data = vec![7u8; BIG_BYTES];
    store.commit(Txn::new().op(Op::Write { coll, name: b"o".to_vec(), offset: 0, data })).await.unwrap();
    let obj = store.snapshot().lookup(&coll, b"o").await.unwrap().unwrap().obj;
    (coll, obj)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_reaches_only_its_own_collections_objects_and_staged_units() {
    let node = guarded_node().await;
    let drive = RemoteStore::connect(node.client.clone(), &node.address, "d0", Some(fence())).await.unwrap();
    // The connection's own capability allows nothing but connecting.
    assert_refused(drive.snapshot().collections("", 10).await, "allows");
    let a = drive.for_group(placement(), "a/");
    let b = drive.for_group(placement(), "b/");
    let (a_coll, _) = collection_with_object(&a, "a/c").await;
    let (b_coll, b_obj) = collection_with_object(&b, "b/c").await;

    // Collections by name and by id, in reads and in transactions.
    assert_refused(a.snapshot().collection("b/c").await, "outside scope");
    assert_refused(a.snapshot().collections("", 10).await, "outside scope");
    assert_eq!(a.snapshot().collections("a/", 10).await.unwrap(), vec![("a/c".to_string(), a_coll)]);
    assert_refused(a.snapshot().lookup(&b_coll, b"o").await, "outside scope");
    assert_refused(a.snapshot().list_entries(&b_coll, b"", b"", 10).await, "outside scope");
    let write = |coll| Txn::new().op(Op::Write { coll, name: b"x".to_vec(), offset: 0, data: vec![1] });
    assert_refused(a.commit(write(b_coll)).await, "outside scope");
    let remove = Txn::new()
        .op(Op::Remove { coll: a_coll, name: b"o".to_vec() })
        .op(Op::Remove { coll: b_coll, name: b"o".to_vec() });
    assert_refused(a.commit(remove).await, "outside scope");
    assert_refused(a.commit(Txn::new().op(Op::RemoveCollection { name: "b/c".into() })).await, "outside scope");
    assert_refused(a.commit(Txn::new().op(Op::CreateCollection { name: "b/d".into() })).await, "outside scope");
    let clone = Op::Clone { coll: a_coll, from: b"o".to_vec(), to_coll: b_coll, to: b"o2".to_vec() };
    assert_refused(a.commit(Txn::new().op(clone)).await, "outside scope");

    // Objects by id: only those a read of the same snapshot found.
    assert_refused(a.snapshot().read(&b_obj, 0, 10).await, "not found by a read");
    assert_refused(a.snapshot().attrs(&b_obj, b"", 10).await, "not found by a read");
    assert_refused(a.snapshot().stat_many(&[b_obj], b"").await, "not found by a read");
    let snapshot = a.snapshot();
    let found = snapshot.lookup(&a_coll, b"o").await.unwrap().unwrap();
    assert_eq!(snapshot.read(&found.obj, 0, BIG_BYTES as u64).await.unwrap().len(), BIG_BYTES);
    assert_refused(snapshot.read(&b_obj, 0, 10).await, "not found by a read");
    let listed = a.snapshot();
    let entries = listed.list_entries(&a_coll, b"", b"", 10).await.unwrap();
    assert_eq!(listed.stat_many(&[entries[0].obj], b"").await.unwrap()[0].0.size_bytes, BIG_BYTES as u64);

    // Staged units: committed only under the scope they were staged with.
    let unit = drive.geometry().unit_bytes as usize;
    let (staged, _) = b.stage(AlignedBuf::zeroed(unit), unit, b"o").await.unwrap();
    let op = Op::WriteStaged { coll: a_coll, name: b"s".to_vec(), offset: 0, staged };
    assert_refused(a.commit(Txn::new().op(op)).await, "staged for scope");

    // Nothing outside the scope changed; inside it, everything a group does works.
    let b_now = b.snapshot();
    let still = b_now.lookup(&b_coll, b"o").await.unwrap().expect("b's object stays");
    assert_eq!(b_now.read(&still.obj, 0, BIG_BYTES as u64).await.unwrap(), vec![7u8; BIG_BYTES]);
    assert!(b.snapshot().lookup(&b_coll, b"x").await.unwrap().is_none());
    assert!(b.snapshot().collection("b/d").await.unwrap().is_none());
    let (staged, _) = a.stage(AlignedBuf::zeroed(unit), unit, b"s").await.unwrap();
    let op = Op::WriteStaged { coll: a_coll, name: b"s".to_vec(), offset: 0, staged };
    a.commit(Txn::new().op(op)).await.unwrap();
    a.commit(write(a_coll)).await.unwrap();
    assert_eq!(a.snapshot().list_entries(&a_coll, b"", b"", 10).await.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_serves_only_the_scope_it_was_opened_with() {
    let node = guarded_node().await;
    let drive = RemoteStore::connect(node.client.clone(), &node.address, "d0", Some(fence())).await.unwrap();
    collection_with_object(&drive.for_group(placement(), "a/"), "a/c").await;
    let now = now_unix_ms();
    let a = node.key.issue(1, "d0", "a/", Ops::READ, now);
    let open = call(&node, Command::Collection { snapshot: None, name: "a/c".into() }, Some(a.clone())).await;
    let Ok(Answer::Collection(Some(coll))) = open.answer else { panic!("{:?}", open.answer) };
    let id = open.opened.expect("a snapshot opened");
    let lookup = |snapshot| Command::Lookup { snapshot, coll, name: serde_bytes::ByteBuf::from(b"o".to_vec()) };
    assert!(call(&node, lookup(Some(id)), Some(a)).await.answer.is_ok());
    // A wider capability does not take over a narrower one's snapshot.
    let wide = node.key.issue(1, "d0", "", Ops::READ, now);
    assert_refused(call(&node, lookup(Some(id)), Some(wide.clone())).await.answer, "was opened for scope");
    // The same lookup in a snapshot of its own is served.
    assert!(call(&node, lookup(None), Some(wide)).await.answer.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_finds_at_most_its_limit_of_objects() {
    use mosaic_remote::server::{MAX_LIST_ENTRIES, MAX_SNAPSHOT_OBJECTS};
    let node = guarded_node().await;
    let drive = RemoteStore::connect(node.client.clone(), &node.address, "d0", Some(fence())).await.unwrap();
    let a = drive.for_group(placement(), "a/");
    a.commit(Txn::new().op(Op::CreateCollection { name: "a/c".into() })).await.unwrap();
    let coll = a.snapshot().collection("a/c").await.unwrap().unwrap();
    let objects = MAX_SNAPSHOT_OBJECTS + MAX_LIST_ENTRIES as usize;
    for batch in 0..objects / 1000 {
        let mut txn = Txn::new();
        for i in 0..1000 {
            txn = txn.op(Op::Create { coll, name: format!("o{:06}", batch * 1000 + i).into_bytes() });
        }
        a.commit(txn).await.unwrap();
    }
    // Pages of one snapshot: the page that would take it past the limit is refused, the ones before not.
    let snapshot = a.snapshot();
    let mut from = Vec::new();
    let mut found = 0;
    let refused = loop {
        match snapshot.list_entries(&coll, b"", &from, MAX_LIST_ENTRIES as usize).await {
            Ok(page) => {
                found += page.len();
                from = page.last().expect("more objects than the limit").name.clone();
                from.push(0);
            }
            Err(e) => break e,
        }
    };
    assert_eq!(refused.kind, ErrorKind::Limit, "{refused}");
    assert!(found <= MAX_SNAPSHOT_OBJECTS && found + MAX_LIST_ENTRIES as usize > MAX_SNAPSHOT_OBJECTS, "{found}");
    // A new snapshot reads on.
    assert_eq!(a.snapshot().list_entries(&coll, b"", &from, 10).await.unwrap().len(), 10);
}
