//! The cluster map replicated by Raft among real nodes on loopback (in one process, each with its own RPC
//! server on an ephemeral port): forming, changes proposed on any node, a leader that stops, a node that
//! restarts from its store, a late joiner that catches up from a snapshot, and a node without the secret.

use mosaic_cluster::raft::RaftSettings;
use mosaic_cluster::rpc::{self, RpcClient, Secret};
use mosaic_cluster::{Change, ClusterError, ClusterNode, FailureDomain, NodeConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(30);

fn settings() -> RaftSettings {
    // Snapshots every few entries, so that logs are purged and a late node is sent a snapshot.
    RaftSettings {
        heartbeat_ms: 100,
        election_timeout_min_ms: 800,
        election_timeout_max_ms: 1600,
        logs_per_snapshot: 5,
    }
}

struct Running {
    node: Arc<ClusterNode>,
    address: String,
    dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start(id: u64, dir: &Path, secret: &Secret, listener: Option<TcpListener>) -> Running {
        let listener = match listener {
            Some(l) => l,
            None => TcpListener::bind("127.0.0.1:0").await.unwrap(),
        };
        let address = listener.local_addr().unwrap().to_string();
        let config = NodeConfig {
            id,
            dir: dir.to_path_buf(),
            address: address.clone(),
            client: RpcClient::new(secret.clone(), None).unwrap(),
            raft: settings(),
            down_after: None,
        };
        let node = ClusterNode::start(config).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(rpc::serve(listener, secret.clone(), None, node.clone(), async {
            let _ = stopped.await;
        }));
        Running { node, address, dir: dir.to_path_buf(), stop: Some(stop), server }
    }

    /// Stops the node as a crash would look to the others: its Raft and its server go away.
    async fn stop(mut self) -> (PathBuf, String) {
        self.node.shutdown().await;
        let _ = self.stop.take().unwrap().send(());
        let _ = self.server.await;
        (self.dir, self.address)
    }
}

fn bootstrap() -> Change {
    Change::Bootstrap {
        cluster_id: "test".into(),
        data_shards: 2,
        parity_shards: 1,
        pg_count: 64,
        failure_domain: FailureDomain::Node,
        placement: mosaic_cluster::placement::PLACEMENT_LATEST,
    }
}

fn add_node(node: u64) -> Change {
    Change::Batch(vec![
        Change::AddNode {
            node,
            address: format!("127.0.0.1:{}", 9100 + node),
            s3_address: format!("127.0.0.1:{}", 9000 + node),
            zone: "z".into(),
        },
        Change::AddDrive { node, name: "d0".into(), weight: 100 },
    ])
}

async fn agree(nodes: &[&Running], epoch: u64) {
    for r in nodes {
        r.node.wait_for_epoch(epoch, WAIT).await.unwrap();
    }
    let first = nodes[0].node.map();
    for r in nodes {
        assert_eq!(*r.node.map(), *first, "node {} holds another map at epoch {epoch}", r.node.id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn managers_agree_survive_a_leader_and_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = Secret::generate();
    let a = Running::start(1, &tmp.path().join("a"), &secret, None).await;
    a.node.initialize().await.unwrap();
    // A second initialize on a node already in a cluster is refused.
    assert!(matches!(a.node.initialize().await, Err(ClusterError::Refused(_))));
    let mut epoch = a.node.propose(bootstrap()).await.unwrap();
    assert_eq!(epoch, 1);

    let b = Running::start(2, &tmp.path().join("b"), &secret, None).await;
    let c = Running::start(3, &tmp.path().join("c"), &secret, None).await;
    b.node.join(&a.address).await.unwrap();
    // Joining through a node that is not the leader works as well (forwarded).
    c.node.join(&b.address).await.unwrap();
    let status = a.node.status();
    assert_eq!(status.managers.len(), 3, "{status:?}");
    assert!(status.learners.is_empty());

    // Changes proposed on any node; every node applies them; refusals are the map's and change nothing.
    for (i, r) in [&a, &b, &c].iter().enumerate() {
        epoch = r.node.propose(add_node(i as u64 + 1)).await.unwrap();
    }
    let refused = c.node.propose(add_node(1)).await;
    assert!(matches!(&refused, Err(ClusterError::Refused(m)) if m.contains("already")), "{refused:?}");
    agree(&[&a, &b, &c], epoch).await;
    assert_eq!(a.node.map().pgs.len(), 64, "three nodes of one drive place a 2+1 set");

    // The leader stops: the other two elect a leader and go on.
    let leader = a.node.status().leader.unwrap();
    let (mut up, down): (Vec<Running>, Vec<Running>) = [a, b, c].into_iter().partition(|r| r.node.id() != leader);
    let stopped = down.into_iter().next().unwrap();
    let (dir, _) = stopped.stop().await;
    up[0].node.propose(add_node(10)).await.unwrap();
    epoch = up[1].node.propose(add_node(11)).await.unwrap();
    agree(&[&up[0], &up[1]], epoch).await;

    // It restarts from its store (on a new port: its address in the membership is stale, so it is a node
    // that the others cannot reach until it tells them; here it only follows) and catches up.
    let back = Running::start(leader, &dir, &secret, None).await;
    assert!(back.node.map().epoch >= 1, "a restarted node starts from what it stored, not from nothing");
    drop(back.stop().await);

    // A late node joins after logs were purged behind snapshots: it is sent the snapshot.
    let d = Running::start(4, &tmp.path().join("d"), &secret, None).await;
    d.node.join(&up[0].address).await.unwrap();
    epoch = d.node.propose(add_node(12)).await.unwrap();
    agree(&[&up[0], &up[1], &d], epoch).await;
    assert!(d.node.map().nodes.contains_key(&10));

    // A node with another secret can neither join nor propose.
    let stranger = Running::start(9, &tmp.path().join("x"), &Secret::generate(), None).await;
    let refused = stranger.node.join(&up[0].address).await;
    assert!(matches!(&refused, Err(ClusterError::NoLeader(m)) if m.contains("401")), "{refused:?}");
    drop(stranger.stop().await);

    // Every node stops and starts again from its store: the same map.
    let before = up[0].node.map();
    let mut dirs = Vec::new();
    for r in up.drain(..).chain([d]) {
        let id = r.node.id();
        let listener_addr = r.address.clone();
        let (dir, _) = r.stop().await;
        dirs.push((id, dir, listener_addr));
    }
    let mut again = Vec::new();
    for (id, dir, addr) in dirs {
        // The same addresses: the membership names them.
        let listener = TcpListener::bind(&addr).await.unwrap();
        again.push(Running::start(id, &dir, &secret, Some(listener)).await);
    }
    for r in &again {
        let map = r.node.wait_for_epoch(before.epoch, WAIT).await.unwrap();
        assert_eq!(*map, *before);
    }
    // And they still make changes.
    epoch = again[0].node.propose(add_node(13)).await.unwrap();
    agree(&again.iter().collect::<Vec<_>>(), epoch).await;
    for r in again {
        drop(r.stop().await);
    }
}

/// Nodes that join at once each ask for a membership change, and Raft makes one at a time: every join
/// lands (the leader asks again while another change is in flight), and the managers become three, then
/// five.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_joining_at_once_all_join() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = Secret::generate();
    let a = Running::start(1, &tmp.path().join("a"), &secret, None).await;
    a.node.initialize().await.unwrap();
    a.node.propose(bootstrap()).await.unwrap();
    let mut others = Vec::new();
    for id in 2..=5 {
        others.push(Running::start(id, &tmp.path().join(format!("n{id}")), &secret, None).await);
    }
    let joins = others.iter().map(|r| r.node.join(&a.address));
    for (r, joined) in others.iter().zip(futures::future::join_all(joins).await) {
        joined.unwrap_or_else(|e| panic!("node {} did not join: {e}", r.node.id()));
    }
    let status = a.node.status();
    assert_eq!(status.managers.len() + status.learners.len(), 5, "{status:?}");
    let mut all = vec![a];
    all.extend(others);
    for r in all {
        drop(r.stop().await);
    }
}
