//! A network partition of a minority, with real network namespaces (needs root and `ip`): three
//! `mosaic server` nodes, each in a namespace of its own with two links, one to a client network the test
//! reaches and one to the cluster network the nodes call each other on. Cutting a node's cluster link
//! (its bridge port down: packets dropped, not refused) leaves it serving S3 to clients but alone: it must
//! refuse the writes and deletes it cannot make durable and serve no stale read, while the two others go
//! on writing, overwriting and deleting (2+1 sets: two of three shards are a write quorum). After the link is mended, every node
//! reads every acknowledged write back exactly, and no deleted object returns.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use support::{
    Server, admin, cluster_secret, json, logged, mosaic_in_netns, pattern, s3_client, spawn_server, status_when, stop,
};

const BUCKET: &str = "split";
const AK: &str = "rootkey";
const SK: &str = "rootsecret-0123456789";

/// Runs `ip ARGS`, failing the test with what it said.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two bridges (clients, cluster) and a namespace per node with a link to each; removed on drop. Names and
/// the subnets carry the test's process id, so two runs on one machine do not meet.
struct Net {
    tag: String,
    octet: u32,
    nodes: usize,
}

impl Net {
    fn new(nodes: usize) -> Net {
        remove_stale();
        let pid = std::process::id();
        let net = Net { tag: format!("{}", pid % 100_000), octet: 100 + pid % 100, nodes };
        for (bridge, host_ip) in [(net.bridge("c"), Some(net.client_ip(None))), (net.bridge("s"), None)] {
            ip(&["link", "add", &bridge, "type", "bridge"]);
            ip(&["link", "set", &bridge, "up"]);
            if let Some(host_ip) = host_ip {
                ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &bridge]);
            }
        }
        for i in 0..nodes {
            let ns = net.ns(i);
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            for (side, inner, address) in [("c", "eth0", net.client_ip(Some(i))), ("s", "eth1", net.cluster_ip(i))] {
                let outer = net.port(side, i);
                ip(&["link", "add", &outer, "type", "veth", "peer", "name", inner, "netns", &ns]);
                ip(&["link", "set", &outer, "master", &net.bridge(side), "up"]);
                ip(&["-n", &ns, "addr", "add", &format!("{address}/24"), "dev", inner]);
                ip(&["-n", &ns, "link", "set", inner, "up"]);
            }
        }
        net
    }

    fn bridge(&self, side: &str) -> String {
        format!("mt{side}{}", self.tag)
    }

    /// The bridge port of node `i`'s link on `side` ("c" clients, "s" cluster).
    fn port(&self, side: &str, i: usize) -> String {
        format!("mt{side}{}n{i}", self.tag)
    }

    fn ns(&self, i: usize) -> String {
        format!("mosaic-test-{}-{i}", self.tag)
    }

    /// Node `i`'s address on the client network (None: the test's own, on the bridge).
    fn client_ip(&self, i: Option<usize>) -> String {
        format!("10.{}.1.{}", self.octet, i.map_or(1, |i| 10 + i))
    }

    fn cluster_ip(&self, i: usize) -> String {
        format!("10.{}.2.{}", self.octet, 10 + i)
    }

    /// Cuts (or mends) node `i`'s cluster link: what it sends the others, and they it, is dropped.
    fn set_cluster_link(&self, i: usize, up: bool) {
        ip(&["link", "set", &self.port("s", i), if up { "up" } else { "down" }]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // A namespace lives on while sockets of its processes do (a closing connection to a peer that went
        // away): its links are removed here, so nothing of the test is left in this namespace.
        for i in 0..self.nodes {
            for side in ["c", "s"] {
                let _ = Command::new("ip").args(["link", "del", &self.port(side, i)]).status();
            }
            let _ = Command::new("ip").args(["netns", "del", &self.ns(i)]).status();
        }
        for side in ["c", "s"] {
            let _ = Command::new("ip").args(["link", "del", &self.bridge(side)]).status();
        }
    }
}

/// What an earlier run killed before its cleanup left: namespaces named for a process that is gone, their
/// servers and links (named after them).
fn remove_stale() {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("running ip (iproute2)");
    for ns in String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(tag) = ns.strip_prefix("mosaic-test-").and_then(|t| t.split('-').next()) else { continue };
        let alive = tag.parse::<u32>().is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if alive {
            continue;
        }
        let pids = Command::new("ip").args(["netns", "pids", ns]).output().expect("running ip");
        for pid in String::from_utf8_lossy(&pids.stdout).lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: plain kill(2) of a stale test server.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for link in [format!("mtc{tag}"), format!("mts{tag}")]
            .iter()
            .flat_map(|b| (0..8).map(move |i| format!("{b}n{i}")).chain([b.clone()]))
        {
            let _ = Command::new("ip").args(["link", "del", &link]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
}

/// Node `i` in its namespace: S3 and admin on the client network, the cluster port on the cluster one.
fn node(net: &Net, dir: &Path, i: usize, join: Option<&str>) -> Server {
    let data = dir.join(format!("node{i}"));
    let drives = format!("{},{}", data.join("d0").display(), data.join("d1").display());
    let (client, cluster) = (net.client_ip(Some(i)), format!("{}:9100", net.cluster_ip(i)));
    let mut command = mosaic_in_netns(&net.ns(i));
    command
        .envs([("MOSAIC_ACCESS_KEY", AK), ("MOSAIC_SECRET_KEY", SK), ("MOSAIC_DRIVES", drives.as_str())])
        .env("MOSAIC_CLUSTER_SECRET", cluster_secret())
        .args(["server", "--data", data.join("data").to_str().unwrap(), "--log-format", "json"])
        .args(["--drive-size", "96MiB", "--s3-address", &format!("{client}:9000")])
        .args(["--admin-address", &format!("{client}:9001"), "--cluster-address", &cluster]);
    if let Some(peer) = join {
        command.args(["--join", peer]);
    }
    spawn_server(command)
}

async fn put(c: &aws_sdk_s3::Client, key: &str, data: &[u8]) -> Result<(), String> {
    let body = ByteStream::from(data.to_vec());
    c.put_object().bucket(BUCKET).key(key).body(body).send().await.map(|_| ()).map_err(|e| format!("{e:?}"))
}

/// The object's bytes, None when it does not exist; other errors fail the test.
async fn get(c: &aws_sdk_s3::Client, key: &str) -> Option<Vec<u8>> {
    match c.get_object().bucket(BUCKET).key(key).send().await {
        Ok(r) => Some(r.body.collect().await.unwrap().into_bytes().to_vec()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => None,
        Err(e) => panic!("GET {key}: {e:?}"),
    }
}

/// Every node in `clients` reads every object of `model` exactly and finds none of `deleted`.
async fn verify(clients: &[&aws_sdk_s3::Client], model: &BTreeMap<String, Vec<u8>>, deleted: &[String], when: &str) {
    for (n, c) in clients.iter().enumerate() {
        for (key, data) in model {
            let got = get(c, key).await;
            assert!(got.as_ref() == Some(data), "{when}: node {n} read {key} wrong: {:?} bytes", got.map(|g| g.len()));
        }
        for key in deleted {
            assert_eq!(get(c, key).await, None, "{when}: node {n} reads deleted {key}");
        }
    }
}

/// Node `id`'s state in `status`.
fn state(status: &serde_json::Value, id: u64) -> String {
    let nodes = status["nodes"].as_array().unwrap();
    nodes.iter().find(|n| n["id"] == id).and_then(|n| n["state"].as_str()).unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_minority_refuses_writes_and_nothing_is_lost_after_healing() {
    let net = Net::new(3);
    let dir = tempfile::tempdir().unwrap();
    let a = node(&net, dir.path(), 0, None);
    json(admin(&a, AK, SK, &["cluster", "init", "--erasure", "2+1", "--groups", "8"]));
    let first = a.cluster.clone().unwrap();
    let nodes = [a, node(&net, dir.path(), 1, Some(&first)), node(&net, dir.path(), 2, Some(&first))];
    for s in &nodes {
        logged(s, "serving the cluster map");
    }
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, AK, SK)).collect();
    clients[0].create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..12 {
        let (key, data) = (format!("before/{i:02}"), pattern(i, [0, 3_000, 200_000][i % 3]));
        put(&clients[i % 3], &key, &data).await.unwrap();
        model.insert(key, data);
    }
    let status = json(admin(&nodes[0], AK, SK, &["cluster", "status"]));
    let minority =
        status["nodes"].as_array().unwrap().iter().find(|n| n["address"] == nodes[2].cluster.as_deref().unwrap());
    let minority = minority.and_then(|n| n["id"].as_u64()).unwrap();

    // Node 2 loses the cluster network; clients still reach it. The others mark it down.
    net.set_cluster_link(2, false);
    status_when(&nodes[0], AK, SK, |s| state(s, minority) == "down");

    // Alone, it can make nothing durable: its writes and deletes are refused, none acknowledged.
    assert!(put(&clients[2], "minority/new", &pattern(500, 3_000)).await.is_err(), "the minority acknowledged a write");
    let refused = clients[2].delete_object().bucket(BUCKET).key("before/00").send().await;
    assert!(refused.is_err(), "the minority acknowledged a delete");

    // The majority goes on: new objects, overwrites and deletes through both of its nodes.
    let mut deleted = Vec::new();
    for i in 0..12 {
        let (key, data) = (format!("during/{i:02}"), pattern(100 + i, [1_000, 70_000, 1_200_000][i % 3]));
        put(&clients[i % 2], &key, &data).await.unwrap();
        model.insert(key, data);
    }
    for i in [1, 4, 7] {
        let (key, data) = (format!("before/{i:02}"), pattern(200 + i, 50_000));
        put(&clients[i % 2], &key, &data).await.unwrap();
        model.insert(key, data);
    }
    for i in [3, 5, 9] {
        let key = format!("before/{i:02}");
        clients[i % 2].delete_object().bucket(BUCKET).key(&key).send().await.unwrap();
        model.remove(&key);
        deleted.push(key);
    }
    verify(&[&clients[0], &clients[1]], &model, &deleted, "during the partition").await;
    // The minority serves no stale read: what was overwritten or deleted meanwhile (small objects too,
    // whose bytes every drive holds whole) is the new state or an error, never the old bytes.
    for (i, key) in [(1, "before/01"), (4, "before/04"), (3, "before/03"), (9, "before/09")] {
        let old = pattern(i, [0, 3_000, 200_000][i % 3]);
        if let Ok(r) = clients[2].get_object().bucket(BUCKET).key(key).send().await {
            let got = r.body.collect().await.unwrap().into_bytes().to_vec();
            assert!(got != old && model.get(key) == Some(&got), "the minority read {key} stale");
        }
    }

    // Mended: node 2 is marked up again and every node reads exactly what was acknowledged.
    net.set_cluster_link(2, true);
    let mended = status_when(&nodes[0], AK, SK, |s| state(s, minority) == "up");
    // Node 2 has caught up with the map (it may never have seen the one that marked it down).
    status_when(&nodes[2], AK, SK, |s| s["epoch"].as_u64() >= mended["epoch"].as_u64() && s["serving"] == true);
    verify(&clients.iter().collect::<Vec<_>>(), &model, &deleted, "after healing").await;
    // The write the minority refused was never acknowledged: nowhere, or (had it landed) whole.
    for c in &clients {
        let got = get(c, "minority/new").await;
        assert!(got.is_none() || got == Some(pattern(500, 3_000)), "a refused write reads back damaged");
    }
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}
