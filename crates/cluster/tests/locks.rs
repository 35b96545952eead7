//! Object locks across nodes (`mosaic_cluster::locks`) between real lock servers on loopback (in one
//! process, each with its own RPC server on an ephemeral port): writers on three nodes never hold one key
//! at once, locks are taken while a minority of the nodes is gone and refused while a majority is, and a
//! node that sees other members grants nothing.

use mosaic_cluster::locks::{LockClient, LockClientConfig, LockError, LockServer, LockTable};
use mosaic_cluster::rpc::{self, RpcClient, Secret};
use mosaic_cluster::{ClusterMap, NodeEntry, NodeState};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

struct Member {
    client: Arc<LockClient>,
    map: watch::Sender<Arc<ClusterMap>>,
    stop: Option<oneshot::Sender<()>>,
    /// The member's RPC server, which ends (its connections aborted) once told to stop.
    server: Option<JoinHandle<()>>,
    /// A member that takes connections and never answers keeps its listener here.
    _silent: Option<TcpListener>,
}

/// `n` members, each serving its table and taking locks through all of them.
async fn members(n: u64, acquire_within: Duration) -> Vec<Member> {
    members_with_silent(n, acquire_within, None).await
}

/// `members`, with member `silent` (by index) accepting connections and answering none.
async fn members_with_silent(n: u64, acquire_within: Duration, silent: Option<usize>) -> Vec<Member> {
    let secret = Secret::generate();
    let mut listeners = Vec::new();
    let mut map = ClusterMap::empty();
    for id in 1..=n {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let entry = NodeEntry { address, s3_address: String::new(), zone: "z".into(), state: NodeState::Up };
        map.nodes.insert(id, entry);
        listeners.push(listener);
    }
    let map = Arc::new(map);
    let mut out = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let (tx, rx) = watch::channel(map.clone());
        let table = Arc::new(LockTable::new(false));
        let server = LockServer::new(table.clone(), rx.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (silent, server) = if silent == Some(i) {
            (Some(listener), None)
        } else {
            let server = tokio::spawn(rpc::serve(listener, secret.clone(), None, server, async {
                let _ = stopped.await;
            }));
            (None, Some(server))
        };
        let rpc = RpcClient::new(secret.clone(), None).unwrap();
        let client = LockClient::new(i as u64 + 1, table, rx, rpc, LockClientConfig { acquire_within });
        out.push(Member { client, map: tx, stop: Some(stop), server, _silent: silent });
    }
    out
}

impl Member {
    /// Stops the member's server and waits until it has: a call after this finds no one answering (a
    /// pooled connection to it is aborted, not served once more).
    async fn stop(&mut self) {
        let _ = self.stop.take().expect("a member is stopped once").send(());
        self.server.take().expect("a serving member").await.expect("the server ends cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_three_nodes_never_hold_one_key_at_once() {
    const TASKS_PER_NODE: usize = 8;
    const ROUNDS: usize = 25;
    let nodes = members(3, Duration::from_secs(30)).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for node in &nodes {
        for t in 0..TASKS_PER_NODE {
            let (client, inside, entered) = (node.client.clone(), inside.clone(), entered.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    // Every task locks key 7; some lock another key beside it.
                    let keys = if (t + r) % 3 == 0 { vec![7, 1000 + t as u64] } else { vec![7] };
                    let held = client.acquire(keys).await.expect("a lock is had within the wait");
                    assert!(held.holds());
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two writers hold key 7");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    entered.fetch_add(1, Ordering::SeqCst);
                    drop(held);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(entered.load(Ordering::SeqCst), 3 * TASKS_PER_NODE * ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_had_without_a_minority_and_refused_without_a_majority() {
    let mut nodes = members(3, Duration::from_millis(300)).await;
    // Keys held by one node are refused to another until released.
    let held = nodes[0].client.acquire(vec![1, 2]).await.unwrap();
    assert_eq!(nodes[1].client.acquire(vec![2]).await.err(), Some(LockError::Busy));
    drop(held);
    let again = async {
        loop {
            // The release travels without being waited for.
            if let Ok(h) = nodes[1].client.acquire(vec![2]).await {
                return h;
            }
        }
    };
    drop(tokio::time::timeout(Duration::from_secs(10), again).await.expect("released"));

    // One node of three stops answering: the two others grant.
    nodes[2].stop().await;
    for n in &nodes[..2] {
        drop(n.client.acquire(vec![3]).await.expect("a majority answers"));
    }
    // Two stop: nothing is granted.
    nodes[1].stop().await;
    assert_eq!(nodes[0].client.acquire(vec![4]).await.err(), Some(LockError::Busy));
    // Marked down in the map, they still count as members: no majority.
    nodes[0].map.send_modify(|m| {
        let m = Arc::make_mut(m);
        for id in [2, 3] {
            m.nodes.get_mut(&id).unwrap().state = NodeState::Down;
        }
    });
    assert_eq!(nodes[0].client.acquire(vec![4]).await.err(), Some(LockError::Busy));
    // Declared dead, they are members no more: the one node left is the majority.
    nodes[0].map.send_modify(|m| {
        let m = Arc::make_mut(m);
        for id in [2, 3] {
            m.nodes.get_mut(&id).unwrap().state = NodeState::Dead;
        }
    });
    drop(nodes[0].client.acquire(vec![4]).await.expect("the only member grants"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_sees_other_members_grants_nothing() {
    let nodes = members(3, Duration::from_millis(300)).await;
    // Node 1 sees a fourth member the others do not know: they refuse it, and alone it is no majority.
    nodes[0].map.send_modify(|m| {
        let entry = NodeEntry {
            address: "127.0.0.1:9".into(),
            s3_address: String::new(),
            zone: "z".into(),
            state: NodeState::Down,
        };
        Arc::make_mut(m).nodes.insert(4, entry);
    });
    assert_eq!(nodes[0].client.acquire(vec![1]).await.err(), Some(LockError::Busy));
    drop(nodes[1].client.acquire(vec![1]).await.expect("the two that agree are a majority of three"));
    let too_many: Vec<u64> = (0..=mosaic_cluster::locks::MAX_KEYS_PER_LOCK as u64).collect();
    assert_eq!(nodes[1].client.acquire(too_many).await.err(), Some(LockError::TooMany));
    let at_limit: Vec<u64> = (0..mosaic_cluster::locks::MAX_KEYS_PER_LOCK as u64).collect();
    drop(nodes[1].client.acquire(at_limit).await.expect("a write may lock up to the limit"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arbiter_that_does_not_answer_stops_no_lock() {
    // Member 1 (the arbiter: the first one up) takes connections and answers nothing, and the map does
    // not say it is down yet.
    let nodes = members_with_silent(3, Duration::from_secs(1), Some(0)).await;
    let held = nodes[1].client.acquire(vec![1]).await.expect("the two others are a majority");
    assert!(held.holds());
    assert_eq!(nodes[2].client.acquire(vec![1]).await.err(), Some(LockError::Busy), "still exclusive");
    drop(held);
}
