//! Three `mosaic server` processes on loopback form a cluster: the first is initialized with
//! `mosaic admin cluster init` (2+1 sets over eight placement groups), the others join with the secret it
//! printed (one through a node that is not the leader) and take the first node's root credentials. Through
//! the aws SDK: what one node writes every node reads and lists, an overwrite and a delete on one node are
//! what every node sees next; a node restarted without --join rejoins and reads everything back; a node
//! with the wrong secret is refused. Then the Raft leader is killed (SIGKILL) under a write load through
//! another node: the new leader marks it down, every acknowledged write reads back exactly from the
//! survivors; the killed node returns, is marked up, `admin heal` rebuilds its shards of what was written
//! without it, and with another node killed everything still reads back from the two left.

#[path = "support/history.rs"]
mod history;
mod support;

use aws_sdk_s3::primitives::ByteStream;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::{
    Server, admin, cluster_secret, json, kill9, logged, pattern, printed, s3_client, start_with_args, status_when, stop,
};

const BUCKET: &str = "spread";

/// A node with two drives beside its data directory in `dir`, its cluster port at `cluster`.
fn node(dir: &Path, cluster: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
    let drives = format!("{},{}", dir.join("d0").display(), dir.join("d1").display());
    let mut all_env = vec![("MOSAIC_DRIVES", drives.as_str()), ("MOSAIC_DRIVE_SIZE", "96MiB")];
    all_env.extend_from_slice(env);
    let mut all_args = vec!["--cluster-address", cluster];
    all_args.extend_from_slice(args);
    start_with_args(&dir.join("data"), &all_env, &all_args)
}

async fn get(c: &aws_sdk_s3::Client, key: &str) -> Result<Vec<u8>, String> {
    let r = c.get_object().bucket(BUCKET).key(key).send().await.map_err(|e| format!("GET {key}: {e:?}"))?;
    Ok(r.body.collect().await.unwrap().into_bytes().to_vec())
}

async fn list_all(c: &aws_sdk_s3::Client) -> Vec<String> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let r = c.list_objects_v2().bucket(BUCKET).max_keys(5).set_continuation_token(token).send().await.unwrap();
        keys.extend(r.contents().iter().filter_map(|o| o.key().map(str::to_string)));
        match r.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => return keys,
        }
    }
}

/// Waits until `s` serves a store composed with every node up and every drive answering. A node that
/// returns composes first from the map it had, whose commands the others refuse while their newer map marks
/// it down (`mosaic_cluster_store::fence`); it composes again once marked up.
fn serves_every_node(s: &Server) {
    loop {
        let line = logged(s, "serving the cluster map");
        if line["down_nodes"] == 0 && line["unreachable_drives"] == 0 {
            return;
        }
    }
}

/// Every node reads every object of `model` exactly and lists exactly its keys.
async fn verify(clients: &[aws_sdk_s3::Client], model: &BTreeMap<String, Vec<u8>>, phase: &str) {
    for (n, c) in clients.iter().enumerate() {
        for (key, data) in model {
            let got = get(c, key).await.unwrap_or_else(|e| panic!("{phase}: node {n}: {e}"));
            assert!(got == *data, "{phase}: node {n} read {key} wrong ({} bytes, want {})", got.len(), data.len());
        }
        assert_eq!(list_all(c).await, model.keys().cloned().collect::<Vec<_>>(), "{phase}: node {n} lists");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_form_a_cluster_that_serves_from_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..3).map(|i| dir.path().join(format!("node{i}"))).collect();

    let a = node(&dirs[0], "127.0.0.1:0", &[], &[]);
    let (ak, sk) = (printed(&a, "access key:"), printed(&a, "secret key:"));
    let status = json(admin(&a, &ak, &sk, &["cluster", "status"]));
    assert_eq!(status["role"], "none", "{status}");
    // Before the cluster has placement, S3 answers 503 with a reason.
    let early = s3_client(&a.s3, &ak, &sk).list_buckets().send().await.unwrap_err();
    assert_eq!(early.raw_response().map(|r| r.status().as_u16()), Some(503), "{early:?}");
    let bad = admin(&a, &ak, &sk, &["cluster", "init", "--erasure", "2+1", "--groups", "100000"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("placement groups"));
    let init = json(admin(&a, &ak, &sk, &["cluster", "init", "--erasure", "2+1", "--groups", "8"]));
    let secret = init["secret"].as_str().unwrap().to_string();
    assert_eq!(secret.len(), 64);
    let again = admin(&a, &ak, &sk, &["cluster", "init"]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already"));

    let joining = [("MOSAIC_CLUSTER_SECRET", secret.as_str())];
    let a_cluster = a.cluster.clone().unwrap();
    let b = node(&dirs[1], "127.0.0.1:0", &joining, &["--join", &a_cluster]);
    // The third joins through the second, which forwards to the leader.
    let b_cluster = b.cluster.clone().unwrap();
    let c = node(&dirs[2], "127.0.0.1:0", &joining, &["--join", &b_cluster]);
    for s in [&a, &b, &c] {
        logged(s, "serving the cluster map");
    }
    // A fourth node with a wrong secret is refused, and says why.
    let wrong = "ab".repeat(32);
    let refused = support::mosaic()
        .env("MOSAIC_CLUSTER_SECRET", &wrong)
        .args(["server", "--data", dir.path().join("intruder").to_str().unwrap()])
        .args(["--s3-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0", "--drive-size", "96MiB"])
        .args(["--cluster-address", "127.0.0.1:0", "--join", &a_cluster])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("joining the cluster"), "{refused:?}");

    let clients: Vec<_> = [&a, &b, &c].iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    clients[1].create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..24usize {
        let key = format!("obj/{i:03}");
        let data = pattern(i, [0, 1_000, 100_000, 1_500_000][i % 4]);
        let writer = &clients[i % 3];
        writer.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    verify(&clients, &model, "after writes").await;
    let (user_ak, user_sk) = keys_are_the_clusters(&[&a, &b, &c], &ak, &sk).await;
    microstores_are_the_clusters(&[&a, &b, &c], &ak, &sk).await;
    // Sealed objects join the model: every later check (a restarted node's too) opens them.
    model.extend(sse_keys_are_the_clusters(&[&a, &b, &c], &dirs, &ak, &sk).await);

    let over = pattern(99, 300_000);
    let key = "obj/005".to_string();
    clients[2].put_object().bucket(BUCKET).key(&key).body(ByteStream::from(over.clone())).send().await.unwrap();
    model.insert(key, over);
    clients[0].delete_object().bucket(BUCKET).key("obj/010").send().await.unwrap();
    model.remove("obj/010");
    verify(&clients, &model, "after an overwrite and a delete").await;

    let status = json(admin(&b, &ak, &sk, &["cluster", "status"]));
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3, "{status}");
    assert_eq!((status["groups_placed"].as_u64(), status["serving"].as_bool()), (Some(8), Some(true)), "{status}");
    let managers = status["nodes"].as_array().unwrap().iter().filter(|n| n["manager"] == true).count();
    assert_eq!(managers, 3, "three nodes make three managers: {status}");
    console_shows_the_cluster(&c, &ak, &sk).await;

    // The second node stops and starts again on its address, without --join: it rejoins from its store.
    // Every start raises the map's write fence before the node writes to a moving group (a step counted
    // before the restart can no longer be reported done).
    let raised = status_when(&b, &ak, &sk, |s| s["write_fence"].as_u64() >= Some(3)); // one per start
    let fence_before = raised["write_fence"].as_u64().expect("a write fence");
    let (code, _) = stop(b);
    assert_eq!(code, 0);
    let b = node(&dirs[1], &b_cluster, &[], &[]);
    logged(&b, "serving the cluster map");
    status_when(&a, &ak, &sk, |s| s["write_fence"].as_u64() > Some(fence_before));
    let clients: Vec<_> = [&a, &b, &c].iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after a restart").await;
    // The restarted node serves the cluster's keys (its saved copy of the map's).
    let user = s3_client(&b.s3, &user_ak, &user_sk);
    user.get_object().bucket(BUCKET).key("obj/001").send().await.expect("the user's key on the restarted node");
    // And the cluster's microstores; one deleted through it is gone on every node.
    assert_eq!(microstore(&b, &ak, &sk, "small")["assigned"], serde_json::json!([BUCKET]));
    assert!(admin(&b, &ak, &sk, &["microstore", "delete", "small"]).status.success());
    for s in [&a, &b, &c] {
        applied(s, "microstores", 5);
        assert!(microstore(s, &ak, &sk, "small").is_null());
    }

    for s in [a, b, c] {
        assert_eq!(stop(s).0, 0);
    }
}

/// Waits until node `s` applied version `version` of the cluster's access keys.
fn applied_keys(s: &Server, version: u64) {
    applied(s, "keys", version);
}

/// Waits until node `s` applied version `version` of the cluster's shared setting `setting`.
fn applied(s: &Server, setting: &str, version: u64) {
    loop {
        let line = logged(s, "applied a shared setting of the cluster");
        if line["setting"] == setting && line["version"] == version {
            return;
        }
    }
}

/// SSE master keys are the cluster's: objects sealed through every node before a rotation made through
/// one node, and after it, open on every node; every node saved the new key. Returns the objects.
async fn sse_keys_are_the_clusters(nodes: &[&Server], dirs: &[PathBuf], ak: &str, sk: &str) -> Vec<(String, Vec<u8>)> {
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, ak, sk)).collect();
    let mut sealed = Vec::new();
    let mut seal_through_each = |phase: &str| {
        let puts: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(n, c)| {
                let (key, data) = (format!("sealed/{phase}/{n}"), pattern(40 + n, 70_000 + n * 10_000));
                sealed.push((key.clone(), data.clone()));
                let put = c.put_object().bucket(BUCKET).key(key).body(ByteStream::from(data));
                put.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256).send()
            })
            .collect();
        futures::future::join_all(puts)
    };
    for put in seal_through_each("before").await {
        put.unwrap();
    }
    let rotated = json(admin(nodes[1], ak, sk, &["sse", "rotate"]));
    // The map held no keys: version 1 adds key 2 pending, version 2 makes it seal.
    assert_eq!((rotated["sealing"].as_u64(), rotated["version"].as_u64()), (Some(2), Some(2)), "{rotated}");
    for s in nodes {
        applied(s, "sse-keys", 2);
    }
    for put in seal_through_each("after").await {
        put.unwrap();
    }
    for (n, c) in clients.iter().enumerate() {
        for (key, data) in &sealed {
            assert!(get(c, key).await.unwrap() == *data, "node {n} opens {key}");
        }
    }
    for dir in dirs {
        let file = std::fs::read_to_string(dir.join("data").join("sse-keys")).unwrap();
        assert!(file.contains("key=1:") && file.contains("key=2:") && file.starts_with("version=1"), "{file}");
    }
    // Offline, a cluster node's keys are not rotated alone.
    let (code, _, err) = support::run(&["sse", "rotate", "--data", dirs[0].join("data").to_str().unwrap()]);
    assert!(code != 0 && err.contains("mosaic admin sse rotate"), "{err}");
    sealed
}

/// Microstore `name` as node `s`'s status has it (null: none).
fn microstore(s: &Server, ak: &str, sk: &str, name: &str) -> serde_json::Value {
    let status = json(admin(s, ak, sk, &["microstore", "status"]));
    status["microstores"].as_array().unwrap().iter().find(|m| m["name"] == name).cloned().unwrap_or_default()
}

/// Microstores are the cluster's: one created through one node and a bucket assigned to it through another
/// are served by every node once they applied the map's catalog; a microstore owning sets is refused (a
/// cluster's microstores share its groups); a bucket deleted through a third node loses its assignment on
/// every node.
async fn microstores_are_the_clusters(nodes: &[&Server], ak: &str, sk: &str) {
    let owning = admin(nodes[0], ak, sk, &["microstore", "create", "own", "--target-p99-ms", "20", "--sets", "0"]);
    assert!(!owning.status.success() && String::from_utf8_lossy(&owning.stderr).contains("share"), "{owning:?}");
    let created =
        admin(nodes[2], ak, sk, &["microstore", "create", "small", "--target-p99-ms", "20", "--workers", "8"]);
    assert!(created.status.success(), "{created:?}");
    for s in nodes {
        applied(s, "microstores", 1);
    }
    assert!(admin(nodes[1], ak, sk, &["microstore", "assign", BUCKET, "small"]).status.success());
    for (n, s) in nodes.iter().enumerate() {
        applied(s, "microstores", 2);
        let small = microstore(s, ak, sk, "small");
        assert_eq!(small["workers"], 8, "node {n}: {small}");
        assert_eq!(small["assigned"], serde_json::json!([BUCKET]), "node {n}: {small}");
    }
    let doomed = "doomed";
    s3_client(&nodes[0].s3, ak, sk).create_bucket().bucket(doomed).send().await.unwrap();
    assert!(admin(nodes[2], ak, sk, &["microstore", "assign", doomed, "small"]).status.success());
    for s in nodes {
        applied(s, "microstores", 3);
    }
    assert_eq!(
        microstore(nodes[0], ak, sk, "small")["assigned"],
        serde_json::json!([doomed, BUCKET]),
        "sorted by name"
    );
    s3_client(&nodes[1].s3, ak, sk).delete_bucket().bucket(doomed).send().await.unwrap();
    for (n, s) in nodes.iter().enumerate() {
        applied(s, "microstores", 4);
        assert_eq!(microstore(s, ak, sk, "small")["assigned"], serde_json::json!([BUCKET]), "node {n}");
    }
}

/// Access keys are the cluster's: a key made through one node and granted through another is served by
/// every node once they applied the map's keys (a change planned on a node from the map's version). Returns
/// the key, which may read the bucket and not write it.
async fn keys_are_the_clusters(nodes: &[&Server], ak: &str, sk: &str) -> (String, String) {
    let created = json(admin(nodes[2], ak, sk, &["key", "create"]));
    let (user_ak, user_sk) = (created["access_key"].as_str().unwrap(), created["secret_key"].as_str().unwrap());
    for s in nodes {
        applied_keys(s, 1);
    }
    let allowed = admin(nodes[1], ak, sk, &["key", "allow", user_ak, BUCKET, "--read"]);
    assert!(allowed.status.success(), "{allowed:?}");
    for (n, s) in nodes.iter().enumerate() {
        applied_keys(s, 2);
        let user = s3_client(&s.s3, user_ak, user_sk);
        let read = user.get_object().bucket(BUCKET).key("obj/001").send().await;
        assert!(read.is_ok(), "node {n}: the key made on another node reads: {read:?}");
        let write = user.put_object().bucket(BUCKET).key("denied").body(ByteStream::from_static(b"x")).send().await;
        let code = write.unwrap_err().into_service_error().meta().code().map(str::to_string);
        assert_eq!(code.as_deref(), Some("AccessDenied"), "node {n}: the key was granted reads only");
    }
    (user_ak.to_string(), user_sk.to_string())
}

/// The web console of a node: its cluster page's call names every node, and its bucket list (an S3 call
/// made by the console to its node) holds the cluster's bucket.
async fn console_shows_the_cluster(s: &Server, ak: &str, sk: &str) {
    let http = reqwest::Client::new();
    let base = format!("http://{}/console/api", s.admin);
    let login = http.post(format!("{base}/login")).json(&serde_json::json!({ "access_key": ak, "secret_key": sk }));
    let login = login.send().await.unwrap();
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let get = |call: &str| http.get(format!("{base}/{call}")).header("cookie", &cookie).send();
    let cluster: serde_json::Value = get("admin/cluster").await.unwrap().json().await.unwrap();
    assert_eq!(cluster["nodes"].as_array().map(Vec::len), Some(3), "{cluster}");
    assert!(cluster["nodes"].as_array().unwrap().iter().all(|n| n["state"] == "up"), "{cluster}");
    let buckets: serde_json::Value = get("buckets").await.unwrap().json().await.unwrap();
    assert_eq!(buckets["buckets"][0]["name"], BUCKET, "{buckets}");
}

/// Three nodes made a cluster of 2+1 sets: the servers (the first initialized it), the root credentials.
struct Formed {
    dir: tempfile::TempDir,
    nodes: Vec<Server>,
    ak: String,
    sk: String,
}

/// A node `name` (in `dir`) that joins the cluster through `member`, once it serves the map.
fn join(dir: &Path, name: &str, member: &Server) -> Server {
    let secret = cluster_secret();
    let through = member.cluster.clone().unwrap();
    let s = node(&dir.join(name), "127.0.0.1:0", &[("MOSAIC_CLUSTER_SECRET", &secret)], &["--join", &through]);
    logged(&s, "serving the cluster map");
    s
}

fn form() -> Formed {
    form_with("2+1")
}

fn form_with(erasure: &str) -> Formed {
    form_with_env(erasure, &[])
}

/// Three nodes of two drives each, in a cluster of `erasure` sets over 8 groups, each started with `env`.
fn form_with_env(erasure: &str, env: &[(&str, &str)]) -> Formed {
    let dir = tempfile::tempdir().unwrap();
    // Started with the secret, as a deployment gives every node one: init takes it instead of making one.
    let given = cluster_secret();
    let a = node(
        &dir.path().join("node0"),
        "127.0.0.1:0",
        &[&[("MOSAIC_CLUSTER_SECRET", given.as_str())][..], env].concat(),
        &[],
    );
    let (ak, sk) = (printed(&a, "access key:"), printed(&a, "secret key:"));
    let init = json(admin(&a, &ak, &sk, &["cluster", "init", "--erasure", erasure, "--groups", "8"]));
    let secret = init["secret"].as_str().unwrap().to_string();
    assert_eq!(secret, given);
    let joining = [&[("MOSAIC_CLUSTER_SECRET", secret.as_str())][..], env].concat();
    let a_cluster = a.cluster.clone().unwrap();
    let mut nodes = vec![a];
    for i in 1..3 {
        nodes.push(node(&dir.path().join(format!("node{i}")), "127.0.0.1:0", &joining, &["--join", &a_cluster]));
    }
    for s in &nodes {
        logged(s, "serving the cluster map");
    }
    Formed { dir, nodes, ak, sk }
}

/// With k = m (1+1 sets), objects deleted while groups move stay deleted once the moves are done: a copy a
/// step's fill made before a delete would tie with the kept drive that lacks the object, and bring it back
/// (the fill decides from the kept drives, and every node follows its removals onto the step's new
/// drives). Deletes and overwrites go on through two nodes while a fourth node's share moves onto it;
/// afterwards every node reads exactly the objects not deleted and lists exactly their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_deleted_during_moves_stay_deleted_when_k_equals_m() {
    const OBJECTS: usize = 48;
    let Formed { dir, mut nodes, ak, sk } = form_with("1+1");
    // 1+1 sets are placed once two nodes are in: the third one's share moves first.
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    let first = s3_client(&nodes[0].s3, &ak, &sk);
    first.create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..OBJECTS {
        let key = format!("k/{i:03}");
        let data = pattern(7000 + i, [100, 20_000, 300_000][i % 3]);
        first.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    // The fourth node joins with moves paused: they resume as the deletes begin.
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "pause"]);
    assert!(out.status.success(), "{out:?}");
    nodes.push(join(dir.path(), "node3", &nodes[0]));
    let paused = json(admin(&nodes[0], &ak, &sk, &["cluster", "status"]));
    assert!(paused["groups_moving"].as_u64() > Some(0), "{paused}");
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "resume"]);
    assert!(out.status.success(), "{out:?}");
    // Through two nodes at once: each deletes every other key of its half, and overwrites one in four.
    let halves = [(1usize, 0..OBJECTS / 2), (3, OBJECTS / 2..OBJECTS)].map(|(n, range)| {
        let client = s3_client(&nodes[n].s3, &ak, &sk);
        let model = model.clone();
        tokio::spawn(async move {
            let (mut written, mut deleted, mut unknown) = (BTreeMap::new(), Vec::new(), Vec::new());
            for i in range {
                let key = model.keys().nth(i).unwrap().clone();
                if i % 2 == 0 {
                    match client.delete_object().bucket(BUCKET).key(&key).send().await {
                        Ok(_) => deleted.push(key),
                        Err(_) => unknown.push(key),
                    }
                } else if i % 4 == 1 {
                    let data = pattern(8000 + i, 50_000);
                    let put = client.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone()));
                    match put.send().await {
                        Ok(_) => drop(written.insert(key, data)),
                        Err(_) => unknown.push(key),
                    }
                }
            }
            (written, deleted, unknown)
        })
    });
    let (mut deleted, mut unknown) = (Vec::new(), Vec::new());
    for half in halves {
        let (written, gone, failed) = half.await.unwrap();
        model.extend(written);
        for key in gone.iter().chain(&failed) {
            model.remove(key);
        }
        deleted.extend(gone);
        unknown.extend(failed);
    }
    assert!(deleted.len() >= OBJECTS / 3, "deletes were acknowledged: {deleted:?}");
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    // A write that failed (a delete refused while its group's step switched, say) may or may not have
    // landed: its key is deleted now that nothing moves, and checked by neither side.
    for key in unknown {
        first.delete_object().bucket(BUCKET).key(&key).send().await.unwrap();
    }
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after deletes during moves of 1+1 sets").await;
    for key in &deleted {
        for (n, c) in clients.iter().enumerate() {
            assert!(get(c, key).await.is_err(), "{key} was deleted and is back on node {n}");
        }
    }
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_loses_no_acknowledged_write() {
    const WRITES: usize = 40;
    const KILL_AFTER: usize = 10;
    let Formed { dir, mut nodes, ak, sk } = form();
    let status = json(admin(&nodes[0], &ak, &sk, &["cluster", "status"]));
    assert_eq!(status["role"], "leader", "the node that made the cluster leads it: {status}");
    let writer = s3_client(&nodes[1].s3, &ak, &sk);
    writer.create_bucket().bucket(BUCKET).send().await.unwrap();

    // Writes through the second node; the first (the leader) is killed after KILL_AFTER acknowledgements.
    let (acked_tx, acked_rx) = std::sync::mpsc::channel::<usize>();
    let load = tokio::spawn(async move {
        let mut acked = BTreeMap::new();
        for i in 0..WRITES {
            let key = format!("load/{i:03}");
            let data = pattern(1000 + i, [10, 30_000, 700_000][i % 3]);
            let put = writer.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await;
            if put.is_ok() {
                acked.insert(key, data);
                let _ = acked_tx.send(acked.len());
            }
        }
        acked
    });
    let leader_cluster = nodes[0].cluster.clone().unwrap();
    tokio::task::spawn_blocking(move || while acked_rx.recv().is_ok_and(|n| n < KILL_AFTER) {}).await.unwrap();
    kill9(nodes.remove(0));
    let mut model = load.await.unwrap();
    assert!(model.len() >= KILL_AFTER + 10, "writes go on with two of three nodes: {} acknowledged", model.len());
    let down = first_logged(&nodes, |v| v["message"] == "node state changed by the leader's probes");
    assert_eq!(down["state"], "Down", "{down}");
    let survivors: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    for i in 0..6usize {
        let key = format!("down/{i:03}");
        let data = pattern(2000 + i, [5, 40_000, 300_000][i % 3]);
        survivors[i % 2]
            .put_object()
            .bucket(BUCKET)
            .key(&key)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        model.insert(key, data);
    }
    verify(&survivors, &model, "with the leader killed").await;

    // The killed node comes back on its address, rejoins, is marked up, and reads everything too.
    let back = node(&dir.path().join("node0"), &leader_cluster, &[], &[]);
    nodes.insert(0, back);
    for s in &nodes {
        serves_every_node(s);
    }
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after the killed node returned").await;

    // Every owner heals its groups: the returned node gets its shards of what was written without it, so
    // with another node gone the two left still hold two of three shards of everything.
    for s in &nodes {
        let healed = json(admin(s, &ak, &sk, &["heal"]));
        assert_eq!(
            (healed["objects_left"].as_u64(), healed["scan_errors"].as_array().map(Vec::len)),
            (Some(0), Some(0)),
            "{healed}"
        );
    }
    kill9(nodes.remove(1));
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "healed, with another node killed").await;
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

/// A manager that does not lead is killed while a fourth node's share moves onto it, under a mixed load
/// (new keys, overwrites, deletes) through another node: writes go on while it is down (the steps of its
/// groups wait for it), it returns, the moves finish, and every node reads every acknowledged write
/// exactly and none of the deleted keys; healed, everything survives the loss of one more node. Beside the
/// load, three nodes write, delete and read one key at once, and its history must be one a linearizable
/// register could give (`history::check`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_a_move_loses_no_acknowledged_write() {
    const OPS: usize = 45;
    const KILL_AFTER: usize = 8;
    let Formed { dir, mut nodes, ak, sk } = form();
    let first = s3_client(&nodes[0].s3, &ak, &sk);
    first.create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..12usize {
        let key = format!("before/{i:03}");
        let data = pattern(5000 + i, [0, 3_000, 400_000][i % 3]);
        first.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    // The fourth node joins with moves paused, so that the kill lands while its groups are moving however
    // fast a step runs on this machine; moves resume once the node is down.
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "pause"]);
    assert!(out.status.success(), "{out:?}");
    nodes.push(join(dir.path(), "node3", &nodes[0]));

    // The load: every fifth op deletes a key of the model, every fifth overwrites one, the rest are new.
    let writer = s3_client(&nodes[1].s3, &ak, &sk);
    let (acked_tx, acked_rx) = std::sync::mpsc::channel::<usize>();
    let load = tokio::spawn(mixed_load(
        writer,
        model.clone(),
        MixedLoad { ops: OPS, every: 5, stride: 1, seed: 6000 },
        acked_tx,
        None,
    ));
    // Beside it, one key written, deleted and read through three nodes at once, its history checked at the
    // end.
    let base = std::time::Instant::now();
    let (down_seen, down) = tokio::sync::watch::channel(false);
    let histories: Vec<_> = [0, 1, 3]
        .into_iter()
        .enumerate()
        .map(|(client, n)| {
            let c = s3_client(&nodes[n].s3, &ak, &sk);
            tokio::spawn(history_client(c, client, base, down.clone()))
        })
        .collect();
    let killed_address = nodes[2].cluster.clone().unwrap();
    tokio::task::spawn_blocking(move || while acked_rx.recv().is_ok_and(|n| n < KILL_AFTER) {}).await.unwrap();
    let status = json(admin(&nodes[0], &ak, &sk, &["cluster", "status"]));
    assert!(status["groups_moving"].as_u64() > Some(0), "the kill lands during the move: {status}");
    kill9(nodes.remove(2));
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "resume"]);
    assert!(out.status.success(), "{out:?}");
    let down = first_logged(&nodes, |v| v["message"] == "node state changed by the leader's probes");
    assert_eq!(down["state"], "Down", "{down}");
    down_seen.send_replace(true);
    let (model, deleted) = load.await.unwrap();
    assert!(deleted.len() >= 3, "deletes were acknowledged: {deleted:?}");
    let mut history = Vec::new();
    let mut after_down = Vec::new();
    for h in histories {
        let (ops, after) = h.await.unwrap();
        history.extend(ops);
        after_down.extend(after);
    }
    let acked = |after: bool| {
        let ops = history.iter().zip(&after_down).filter(|(_, a)| **a == after);
        let acked = ops.clone().filter(|(op, _)| op.end_ns.is_some()).count();
        (acked, ops.count())
    };
    // Until the node is marked down, a group whose move keeps one of its drives refuses writes (a write
    // must reach the kept drives); after that, the key is served again.
    let (acked_after, after) = acked(true);
    assert!(
        acked_after * 2 >= after,
        "{acked_after} of {after} operations after the node was marked down acknowledged"
    );
    assert!(acked(false).0 > 0, "operations on the key were acknowledged before: {:?}", acked(false));
    assert!(history.iter().any(|op| matches!(op.kind, history::Kind::Delete(_)) && op.end_ns.is_some()));
    history::check(&history).unwrap_or_else(|e| panic!("the key's history is not linearizable: {e}\n{history:?}"));

    // It returns on its address; the moves finish with every node serving the last placement.
    let back = node(&dir.path().join("node2"), &killed_address, &[], &[]);
    nodes.insert(2, back);
    for s in &nodes {
        serves_every_node(s);
    }
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    clients[0].delete_object().bucket(BUCKET).key(HISTORY_KEY).send().await.unwrap();
    verify(&clients, &model, "after a node killed during a move returned and the move finished").await;
    for key in &deleted {
        for c in &clients {
            assert!(get(c, key).await.is_err(), "{key} was deleted and is back");
        }
    }
    for s in &nodes {
        let healed = json(admin(s, &ak, &sk, &["heal"]));
        assert_eq!(healed["objects_left"].as_u64(), Some(0), "{healed}");
    }
    kill9(nodes.remove(1));
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "healed, with another node killed").await;
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

/// The owner of a moving group dies (its process aborts, as under kill -9) between its step's last count,
/// which sealed the step on every node, and its report, while keys are written, overwritten and deleted
/// through the joining node. Writes and deletes go on while it is down; it returns (its seals on the
/// other nodes held until then, or lapsed), raises the write fence at its start, and its step is armed,
/// filled and reported again: the moves finish, and every node reads every acknowledged write exactly and
/// none of the deleted keys. (A seal that lapses is `mosaic_cluster_store::step`'s unit tests' case.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_dies_before_a_steps_report_loses_no_acknowledged_write() {
    const OBJECTS: usize = 24;
    const MAX_OPS: usize = 400;
    const ACKED_WHILE_DOWN: usize = 10;
    const ABORTED: &str = "aborting before a step's report, as the fault flag asks";
    // The three nodes share the token: the first to report a step removes it and aborts, the others go on.
    let token_dir = tempfile::tempdir().unwrap();
    let token = token_dir.path().join("abort-before-report");
    let fault = [("MOSAIC_FAULT_ABORT_BEFORE_MOVE_REPORT", token.to_str().unwrap())];
    let Formed { dir, mut nodes, ak, sk } = form_with_env("2+1", &fault);
    let first = s3_client(&nodes[0].s3, &ak, &sk);
    first.create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..OBJECTS {
        let key = format!("before/{i:03}");
        let data = pattern(8000 + i, [0, 3_000, 400_000][i % 3]);
        first.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "pause"]);
    assert!(out.status.success(), "{out:?}");
    nodes.push(join(dir.path(), "node3", &nodes[0]));
    std::fs::write(&token, b"").unwrap();
    let fence_before = json(admin(&nodes[0], &ak, &sk, &["cluster", "status"]))["write_fence"].as_u64().unwrap();

    // The load, through the joining node (which has no token): every third op deletes a key of the model,
    // every third overwrites one, the rest are new; it runs until told to stop, at most MAX_OPS ops.
    let writer = s3_client(&nodes[3].s3, &ak, &sk);
    let (acked_tx, acked_rx) = std::sync::mpsc::channel::<usize>();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mix = MixedLoad { ops: MAX_OPS, every: 3, stride: 7, seed: 9000 };
    let load = tokio::spawn(mixed_load(writer, model.clone(), mix, acked_tx, Some(stop_rx)));
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "resume"]);
    assert!(out.status.success(), "{out:?}");
    let aborted = first_logged(&nodes[..3], |v| v["message"] == ABORTED);
    let dead = nodes.iter().position(|s| s.cluster.as_deref() == aborted["node"].as_str()).expect("a node aborted");
    let dead_address = nodes[dead].cluster.clone().unwrap();
    kill9(nodes.remove(dead));
    assert!(!token.exists(), "the aborted node took the token");
    // Writes and deletes go on while the owner is down (and its step's seals held, then lapsed).
    tokio::task::spawn_blocking(move || {
        while acked_rx.try_recv().is_ok() {}
        for _ in 0..ACKED_WHILE_DOWN {
            acked_rx.recv().expect("the load goes on while the owner is down");
        }
    })
    .await
    .unwrap();

    // It returns on its address without the fault; the moves finish with every node serving the last
    // placement, and no other node aborted meanwhile.
    nodes.insert(dead, node(&dir.path().join(format!("node{dead}")), &dead_address, &[], &[]));
    for s in &nodes {
        serves_every_node(s);
    }
    let status = status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    assert!(status["write_fence"].as_u64() > Some(fence_before), "the returned node raised the fence: {status}");
    stop_tx.send_replace(true);
    let (model, deleted) = load.await.unwrap();
    assert!(!deleted.is_empty(), "deletes were acknowledged");
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after the owner that died before its report returned and the move finished").await;
    for key in &deleted {
        for c in &clients {
            assert!(get(c, key).await.is_err(), "{key} was deleted and is back");
        }
    }
    for s in &nodes {
        let healed = json(admin(s, &ak, &sk, &["heal"]));
        assert_eq!(healed["objects_left"].as_u64(), Some(0), "{healed}");
    }
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

/// A mixed load's shape: of every `every` ops the first deletes a key of the model and the second
/// overwrites one (victims picked `stride` keys apart), the rest write new keys; bodies seeded from `seed`.
struct MixedLoad {
    ops: usize,
    every: usize,
    stride: usize,
    seed: usize,
}

/// Runs `mix` through `writer` over `model`, at most `mix.ops` ops and none once `stop` says so; sends
/// each acknowledged op's number on `acked`. Returns the model as acknowledged and the keys deleted.
async fn mixed_load(
    writer: aws_sdk_s3::Client,
    mut model: BTreeMap<String, Vec<u8>>,
    mix: MixedLoad,
    acked: std::sync::mpsc::Sender<usize>,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let mut deleted = Vec::new();
    for i in 0..mix.ops {
        if stop.as_ref().is_some_and(|s| *s.borrow()) {
            break;
        }
        let victim = model.keys().nth((i * mix.stride) % model.len().max(1)).cloned();
        let done = match (i % mix.every, victim) {
            (0, Some(key)) => {
                let done = writer.delete_object().bucket(BUCKET).key(&key).send().await.is_ok();
                if done {
                    model.remove(&key);
                    deleted.push(key);
                }
                done
            }
            (kind, victim) => {
                let key = victim.filter(|_| kind == 1).unwrap_or(format!("load/{i:03}"));
                let data = pattern(mix.seed + i, [20, 50_000, 600_000][i % 3]);
                let put = writer.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone()));
                let done = put.send().await.is_ok();
                if done {
                    model.insert(key, data);
                }
                done
            }
        };
        if done {
            let _ = acked.send(i);
        }
    }
    (model, deleted)
}

/// The key of the single-key histories.
const HISTORY_KEY: &str = "history";

/// A client of a single-key history, each operation timed from `base`: every client writes unique values,
/// reads and deletes, each through its own node (the cluster's object locks keep two nodes' writes of the
/// key from interleaving on its drives). It makes HISTORY_OPS operations, waits until `down` says the test
/// saw a node marked down, and makes AFTER_DOWN_OPS more. Returns the operations and, for each one, whether
/// it started after `down`.
async fn history_client(
    c: aws_sdk_s3::Client,
    client: usize,
    base: std::time::Instant,
    mut down: tokio::sync::watch::Receiver<bool>,
) -> (Vec<history::Op>, Vec<bool>) {
    use aws_sdk_s3::operation::get_object::GetObjectError;
    use history::Kind;
    const HISTORY_OPS: usize = 24;
    const AFTER_DOWN_OPS: usize = 12;
    let now_ns = || base.elapsed().as_nanos() as u64;
    let mut ops = Vec::with_capacity(HISTORY_OPS + AFTER_DOWN_OPS);
    let mut after_down = Vec::with_capacity(HISTORY_OPS + AFTER_DOWN_OPS);
    for n in 0..HISTORY_OPS + AFTER_DOWN_OPS {
        if n == HISTORY_OPS {
            down.wait_for(|seen| *seen).await.expect("the test tells when the node is down");
        }
        after_down.push(*down.borrow());
        let id = (client * 10_000 + n + 1) as u64;
        let start_ns = now_ns();
        let (kind, done) = match n % 4 {
            0 | 2 => {
                let body = ByteStream::from(id.to_string().into_bytes());
                (Kind::Write(id), c.put_object().bucket(BUCKET).key(HISTORY_KEY).body(body).send().await.is_ok())
            }
            3 => (Kind::Delete(id), c.delete_object().bucket(BUCKET).key(HISTORY_KEY).send().await.is_ok()),
            _ => match c.get_object().bucket(BUCKET).key(HISTORY_KEY).send().await {
                // A body that is no value written reads as value 0, which no write explains.
                Ok(r) => match r.body.collect().await {
                    Ok(b) => (Kind::Read(Some(String::from_utf8_lossy(&b.into_bytes()).parse().unwrap_or(0))), true),
                    Err(_) => (Kind::Read(None), false),
                },
                Err(e) if matches!(e.as_service_error(), Some(GetObjectError::NoSuchKey(_))) => {
                    (Kind::Read(None), true)
                }
                Err(_) => (Kind::Read(None), false),
            },
        };
        ops.push(history::Op { client, start_ns, end_ns: done.then(now_ns), kind });
    }
    (ops, after_down)
}

/// A member restarted on another cluster port (and S3 port) is reached there: the leader sends it the log
/// (it applies a later change of the map), every node's map names its new addresses, its drives serve
/// reads and writes through every node, and nothing written before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_on_another_address_is_reached_there() {
    let Formed { dir, mut nodes, ak, sk } = form();
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    clients[0].create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..12usize {
        let (key, data) = (format!("before/{i:02}"), pattern(500 + i, [0, 5_000, 300_000][i % 3]));
        let put = clients[i % 3].put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone()));
        put.send().await.unwrap();
        model.insert(key, data);
    }
    let status = json(admin(&nodes[0], &ak, &sk, &["cluster", "status"]));
    let moved = node_id(&status, &nodes[2]);
    let old_address = nodes[2].cluster.clone().unwrap();
    assert_eq!(stop(nodes.remove(2)).0, 0);
    // Started again without --join on a new port: it rejoins from its store and tells the cluster.
    let c = node(&dir.path().join("node2"), "127.0.0.1:0", &[], &[]);
    let new_address = c.cluster.clone().unwrap();
    assert_ne!(new_address, old_address);
    logged(&c, "this node's addresses changed in the cluster");
    nodes.push(c);
    for s in &nodes {
        status_when(s, &ak, &sk, |st| {
            st["nodes"].as_array().unwrap().iter().any(|n| {
                n["id"] == moved
                    && n["address"] == new_address.as_str()
                    && n["state"] == "up"
                    && n["s3_address"] == nodes[2].s3.as_str()
            })
        });
    }
    // The log reaches it at its new address: a change made through another node is applied there.
    json(admin(&nodes[0], &ak, &sk, &["key", "create"]));
    applied_keys(&nodes[2], 1);
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    for i in 0..12usize {
        let (key, data) = (format!("after/{i:02}"), pattern(700 + i, [0, 5_000, 300_000][i % 3]));
        let put = clients[(i + 2) % 3].put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone()));
        put.send().await.unwrap();
        model.insert(key, data);
    }
    verify(&clients, &model, "after a member moved").await;
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

/// The id of the node whose cluster address is `s`'s, in `status`.
fn node_id(status: &serde_json::Value, s: &Server) -> u64 {
    let address = s.cluster.as_deref().unwrap();
    let nodes = status["nodes"].as_array().unwrap();
    nodes.iter().find(|n| n["address"] == address).and_then(|n| n["id"].as_u64()).unwrap()
}

fn groups_of(status: &serde_json::Value, id: u64) -> u64 {
    let nodes = status["nodes"].as_array().unwrap();
    nodes.iter().find(|n| n["id"] == id).and_then(|n| n["groups"].as_u64()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_added_drained_and_removed_as_dead_without_losing_a_byte() {
    let Formed { dir, mut nodes, ak, sk } = form();
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    clients[0].create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..24usize {
        let key = format!("before/{i:03}");
        let data = pattern(3000 + i, [0, 2_000, 200_000, 1_100_000][i % 4]);
        clients[i % 3].put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }

    // A fourth node joins: the groups whose sets now name its drives move there, one drive each (2+1 sets
    // move one drive at a time), while writes go on through it.
    nodes.push(join(dir.path(), "node3", &nodes[0]));
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    for i in 0..8usize {
        let key = format!("during/{i:03}");
        let data = pattern(4000 + i, [10, 60_000, 900_000][i % 3]);
        clients[3].put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    // Done when no group moves and the old shards are cleared off the drives left.
    let status = status_when(&nodes[0], &ak, &sk, |s| {
        s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0 && s["rebalance"]["objects_cleared"] != 0
    });
    let moved = &status["rebalance"];
    assert!(moved["groups_moved"].as_u64() > Some(0), "{status}");
    assert!(moved["bytes_moved"].as_u64() > Some(0), "{status}");
    let added_id = node_id(&status, &nodes[3]);
    assert!(groups_of(&status, added_id) > 0, "{status}");
    verify(&clients, &model, "after a node was added").await;

    // A node that holds groups is not removed; drained, its groups move off it, then it is removed.
    let drained = node_id(&status, &nodes[1]);
    let refused = admin(&nodes[0], &ak, &sk, &["cluster", "remove-node", &drained.to_string()]);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("drain it first"));
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "drain", &drained.to_string()]);
    assert!(out.status.success(), "{out:?}");
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && groups_of(s, drained) == 0);
    let out = admin(&nodes[2], &ak, &sk, &["cluster", "remove-node", &drained.to_string()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stop(nodes.remove(1)).0, 0);
    // The leader takes it out of Raft and makes the added node a manager in its place.
    let status = status_when(&nodes[0], &ak, &sk, |s| {
        let managers = s["nodes"].as_array().unwrap().iter().filter(|n| n["manager"] == true).count();
        s["nodes"].as_array().unwrap().len() == 3 && managers == 3
    });
    assert!(status["nodes"].as_array().unwrap().iter().all(|n| n["id"] != drained), "{status}");
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after a node was drained and removed").await;

    // With moves paused a fifth node joins: its groups stay where they are until moves resume. Then the
    // first node (the Raft leader) is killed and removed as dead: its groups are rebuilt on the others.
    let out = admin(&nodes[1], &ak, &sk, &["cluster", "rebalance", "pause"]);
    assert!(out.status.success(), "{out:?}");
    nodes.push(join(dir.path(), "node4", &nodes[0]));
    let paused = json(admin(&nodes[1], &ak, &sk, &["cluster", "status"]));
    assert_eq!(paused["rebalance"]["paused"], true, "{paused}");
    // Every group that names the new node's drives is still moving (none can have moved there).
    let on_fifth = groups_of(&paused, node_id(&paused, nodes.last().unwrap()));
    assert!(paused["groups_moving"].as_u64().unwrap() >= on_fifth, "nothing moves while paused: {paused}");
    let out = admin(&nodes[1], &ak, &sk, &["cluster", "rebalance", "resume"]);
    assert!(out.status.success(), "{out:?}");
    status_when(&nodes[1], &ak, &sk, |s| s["groups_moving"] == 0 && s["nodes"].as_array().unwrap().len() == 4);
    let dead = node_id(&status, &nodes[0]);
    kill9(nodes.remove(0));
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "remove-node", &dead.to_string(), "--dead"]);
    assert!(out.status.success(), "{out:?}");
    let status =
        status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["nodes"].as_array().unwrap().len() == 3);
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3, "{status}");
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "after a dead node was removed").await;

    // Everything was moved or rebuilt whole: with one more node gone, two of three shards are left.
    kill9(nodes.remove(2));
    let clients: Vec<_> = nodes.iter().map(|s| s3_client(&s.s3, &ak, &sk)).collect();
    verify(&clients, &model, "re-protected, with another node killed").await;
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}

/// The first log line of any of `servers` that `matches` (waiting on their logs in turn, at most a minute).
fn first_logged(servers: &[Server], matches: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        for s in servers {
            if let Ok(line) = s.log.recv_timeout(std::time::Duration::from_millis(20))
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && matches(&v)
            {
                return v;
            }
        }
    }
    panic!("no server logged the line within a minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_node_is_added_with_add_node() {
    let dir = tempfile::tempdir().unwrap();
    // As a deployment starts every node: the same secret, root credentials and SSE master key.
    let config = dir.path().join("mosaic.toml");
    std::fs::write(&config, format!("sse_master_key = \"{}\"\n", "42".repeat(32))).unwrap();
    let secret = cluster_secret();
    let alike = [
        ("MOSAIC_CLUSTER_SECRET", secret.as_str()),
        ("MOSAIC_CONFIG", config.to_str().unwrap()),
        ("MOSAIC_ACCESS_KEY", "clusterroot"),
        ("MOSAIC_SECRET_KEY", "clusterroot-secret-0123"),
    ];
    let (ak, sk) = ("clusterroot", "clusterroot-secret-0123");
    let a = node(&dir.path().join("a"), "127.0.0.1:0", &alike, &[]);
    json(admin(&a, ak, sk, &["cluster", "init", "--erasure", "1+1", "--groups", "4"]));
    // Started with the secret and no --join: they wait to be invited.
    let b = node(&dir.path().join("b"), "127.0.0.1:0", &alike, &[]);
    let b_cluster = b.cluster.clone().unwrap();
    let own_keys = node(&dir.path().join("c"), "127.0.0.1:0", &alike[..1], &[]);

    let stranger = own_keys.cluster.clone().unwrap();
    for (bad, says) in [
        ("no-port", "HOST:PORT"),
        ("a/b:1", "HOST:PORT"),
        ("127.0.0.1:1", "inviting 127.0.0.1:1"),
        // It made its own root credentials and SSE master key: it would serve with them.
        (stranger.as_str(), "differ from the cluster's"),
    ] {
        let out = admin(&a, ak, sk, &["cluster", "add-node", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "add-node {bad}: {err}");
    }
    let added = json(admin(&a, ak, sk, &["cluster", "add-node", &b_cluster]));
    logged(&b, "serving the cluster map");
    let status = json(admin(&b, ak, sk, &["cluster", "status"]));
    assert_eq!(status["node"], added["node"], "{added} {status}");
    assert_eq!(status["nodes"].as_array().map(Vec::len), Some(2), "{status}");
    let again = admin(&a, ak, sk, &["cluster", "add-node", &b_cluster]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("member already"));

    // The added node serves what the first wrote, SSE-S3 sealed objects too.
    let (ca, cb) = (s3_client(&a.s3, ak, sk), s3_client(&b.s3, ak, sk));
    ca.create_bucket().bucket(BUCKET).send().await.unwrap();
    let data = pattern(3, 100_000);
    let put = ca.put_object().bucket(BUCKET).key("k").body(ByteStream::from(data.clone()));
    put.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256).send().await.unwrap();
    assert!(get(&cb, "k").await.unwrap() == data);
    // A master key the config gives is changed there, not rotated.
    let rotate = admin(&b, ak, sk, &["sse", "rotate"]);
    assert!(!rotate.status.success() && String::from_utf8_lossy(&rotate.stderr).contains("given in the config"));
    for s in [a, b, own_keys] {
        assert_eq!(stop(s).0, 0);
    }
}

/// While a fourth node's share moves onto it (1+1 sets: a write needs both drives), writes through every
/// node all succeed: a step's left drive is cleared only once every node serves the step, so no write
/// planned one change behind finds its collection gone there (before, about 1 in 1,000 failed with 503).
/// Every acknowledged write is listed afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_every_node_during_moves_all_succeed() {
    writes_through_every_node_during_moves("1+1", false).await;
}

/// The same with 2+1 sets into a versioned bucket, where every other write overwrites a key: an overwrite
/// keeps the older version under a new name (a rename), which a step's seal does not refuse, as it
/// removes no name (before, a few in a thousand failed with 503). Every acknowledged write is a version
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versioned_overwrites_through_every_node_during_moves_all_succeed() {
    writes_through_every_node_during_moves("2+1", true).await;
}

/// The same with 1+1 sets, whose write quorum is both drives: a key written after a step's last fill round
/// is on one drive only until healed, and an overwrite renames its version, which only its holders take.
/// The write rebuilds it on the other first (before, such overwrites failed with 503 until heal came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versioned_overwrites_on_one_plus_one_sets_during_moves_all_succeed() {
    writes_through_every_node_during_moves("1+1", true).await;
}

/// Writes through every node while a fourth node's share moves onto it, into a bucket made meanwhile;
/// `overwrite`: the bucket is versioned and every other write overwrites a key.
async fn writes_through_every_node_during_moves(erasure: &str, overwrite: bool) {
    const WRITES_MAX_PER_NODE: usize = 20_000;
    const DURING: &str = "made-during-moves";
    let Formed { dir, mut nodes, ak, sk } = form_with(erasure);
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    let first = s3_client(&nodes[0].s3, &ak, &sk);
    first.create_bucket().bucket(BUCKET).send().await.unwrap();
    // Enough in the groups that their moves take a while.
    for i in 0..300 {
        let put =
            first.put_object().bucket(BUCKET).key(format!("pre/{i:03}")).body(ByteStream::from(pattern(i, 20_000)));
        put.send().await.unwrap();
    }
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "pause"]);
    assert!(out.status.success(), "{out:?}");
    nodes.push(join(dir.path(), "node3", &nodes[0]));
    let out = admin(&nodes[0], &ak, &sk, &["cluster", "rebalance", "resume"]);
    assert!(out.status.success(), "{out:?}");
    // Into a bucket made while groups move: its collection is missing on the steps' new drives until a
    // write gives it to them.
    first.create_bucket().bucket(DURING).send().await.unwrap();
    let enabled = aws_sdk_s3::types::VersioningConfiguration::builder()
        .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
        .build();
    if overwrite {
        first.put_bucket_versioning().bucket(DURING).versioning_configuration(enabled).send().await.unwrap();
    }
    let moving = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let loads: Vec<_> = (0..nodes.len())
        .map(|n| {
            let client = s3_client(&nodes[n].s3, &ak, &sk);
            let moving = moving.clone();
            tokio::spawn(async move {
                let (mut acked, mut keys, mut failed) = (0, std::collections::BTreeSet::new(), Vec::new());
                for i in 0..WRITES_MAX_PER_NODE {
                    if !moving.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("load/{n}/{:05}", if overwrite { i / 2 } else { i });
                    match client
                        .put_object()
                        .bucket(DURING)
                        .key(&key)
                        .body(ByteStream::from(vec![n as u8; 1000]))
                        .send()
                        .await
                    {
                        Ok(_) => {
                            acked += 1;
                            keys.insert(key);
                        }
                        Err(e) => {
                            let status = e.raw_response().map(|r| r.status().as_u16());
                            let message =
                                e.as_service_error().and_then(aws_sdk_s3::error::ProvideErrorMetadata::message);
                            failed.push(format!("{key}: {status:?} {message:?}"));
                        }
                    }
                }
                (acked, keys.len(), failed)
            })
        })
        .collect();
    status_when(&nodes[0], &ak, &sk, |s| s["groups_moving"] == 0 && s["rebalance"]["nodes_behind"] == 0);
    moving.store(false, std::sync::atomic::Ordering::Relaxed);
    let (mut acked, mut keys, mut failed) = (0, 0, Vec::new());
    for load in loads {
        let (a, k, f) = load.await.unwrap();
        acked += a;
        keys += k;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} writes during moves failed: {:?}",
        failed.len(),
        acked + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(keys > 0 && (acked > keys) == overwrite, "writes while groups moved: {acked} writes of {keys} keys");
    let mut listed = 0;
    let mut pages = first.list_objects_v2().bucket(DURING).prefix("load/").into_paginator().send();
    while let Some(page) = pages.next().await {
        listed += page.unwrap().contents().len();
    }
    assert_eq!(listed, keys, "every key written is listed");
    let (mut versions, mut key_marker, mut version_marker) = (0, None, None);
    loop {
        let list = first.list_object_versions().bucket(DURING).prefix("load/");
        let page = list.set_key_marker(key_marker).set_version_id_marker(version_marker).send().await.unwrap();
        versions += page.versions().len();
        if page.is_truncated() != Some(true) {
            break;
        }
        (key_marker, version_marker) = (page.next_key_marker, page.next_version_id_marker);
    }
    assert_eq!(versions, acked, "every acknowledged write is a version");
    // The groups' sets as this node serves them are in its metrics, one series per group.
    let metrics = reqwest::get(format!("http://{}/metrics", nodes[0].admin)).await.unwrap().text().await.unwrap();
    for pg in 0..8 {
        for name in ["mosaic_set_failed_writes", "mosaic_set_heal_backlog"] {
            assert!(metrics.contains(&format!("{name}{{group=\"{pg}\"}}")), "{name} of group {pg}:\n{metrics}");
        }
    }
    // Every drive command of the moves stayed within its capability (a refused one passes for a drive
    // that is away, which the sets tolerate, so it is counted instead).
    for node in &nodes {
        let metrics = reqwest::get(format!("http://{}/metrics", node.admin)).await.unwrap().text().await.unwrap();
        let refused = metrics.lines().find_map(|l| l.strip_prefix("mosaic_drive_capabilities_refused_total "));
        assert!(refused.is_none_or(|n| n.trim() == "0"), "capabilities refused: {refused:?}");
    }
    for s in nodes {
        assert_eq!(stop(s).0, 0);
    }
}
