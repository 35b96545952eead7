//! Microstores end to end through the `mosaic` binary: `mosaic admin microstore create|assign|delete|status`,
//! buckets classified from real S3 traffic and routed to the microstore of their class, the catalog kept
//! across a restart, and a microstore whose workers are all busy refusing with SlowDown while other
//! buckets are served.

mod support;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use std::time::{Duration, Instant};
use support::{Server, s3_client, start_with_args, stop};

const AK: &str = "rootkey";
const SK: &str = "rootsecret-0123456789";

fn admin(s: &Server, args: &[&str]) -> serde_json::Value {
    let out = support::admin(s, AK, SK, args);
    assert!(out.status.success(), "mosaic admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn admin_fails(s: &Server, args: &[&str]) -> String {
    let out = support::admin(s, AK, SK, args);
    assert!(!out.status.success(), "mosaic admin {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn start(data: &std::path::Path, config: &std::path::Path) -> Server {
    let env = [("MOSAIC_ACCESS_KEY", AK), ("MOSAIC_SECRET_KEY", SK)];
    start_with_args(data, &env, &["--config", config.to_str().unwrap()])
}

fn microstore<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["microstores"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap()
}

/// Polls `status` until `done` holds (rounds run every 100 ms here), at most 30 s.
fn wait_status(s: &Server, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = admin(s, &["microstore", "status"]);
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not reached in 30 s: {v:#}");
        std::thread::yield_now();
    }
}

fn bucket<'a>(status: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    status["buckets"].as_array().unwrap().iter().find(|b| b["bucket"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_classified_routed_and_refused_when_their_microstore_is_full() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let config = d.path().join("mosaic.toml");
    std::fs::write(
        &config,
        "[microstores]\nwindow_slot = \"100ms\"\nwindow_slots = 10\nmin_requests = 20\nhold_evaluations = 2\n\
         workers = 64\nfloor_workers = 1\nmax_waiting = 0\nadapt = false\n",
    )
    .unwrap();
    let s = start(&data, &config);
    let c = s3_client(&s.s3, AK, SK);

    // A server that was never asked has one default microstore holding every worker.
    let v = admin(&s, &["microstore", "list"]);
    assert_eq!(v["microstores"].as_array().unwrap().len(), 1);
    assert_eq!(microstore(&v, "default")["workers"], 64);

    let v = admin(
        &s,
        &["microstore", "create", "games", "--target-p99-ms", "50", "--class", "small-write", "--workers", "8"],
    );
    assert_eq!(v["ok"], true);
    admin(&s, &["microstore", "create", "tiny", "--target-mib-s", "100", "--workers", "1"]);
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(
        (microstore(&v, "games")["workers"].as_u64(), microstore(&v, "default")["workers"].as_u64()),
        (Some(8), Some(55))
    );
    assert!(admin_fails(&s, &["microstore", "create", "games", "--target-p99-ms", "5"]).contains("exists"));
    assert!(admin_fails(&s, &["microstore", "create", "Bad", "--target-p99-ms", "5"]).contains("microstore name"));
    assert!(
        admin_fails(&s, &["microstore", "create", "huge", "--target-p99-ms", "5", "--workers", "1000"])
            .contains("free")
    );
    assert!(admin_fails(&s, &["microstore", "assign", "scores", "ghost"]).contains("no microstore"));
    assert!(admin_fails(&s, &["microstore", "delete", "default"]).contains("cannot be deleted"));

    // Small PUTs: the bucket is classified small-write and served by games, the microstore of that class.
    for b in ["scores", "big", "other"] {
        c.create_bucket().bucket(b).send().await.unwrap();
    }
    for i in 0..60 {
        let body = ByteStream::from(vec![b'x'; 4096]);
        c.put_object().bucket("scores").key(format!("k{i}")).body(body).send().await.unwrap();
    }
    let v = wait_status(&s, "scores classified", |v| bucket(v, "scores").is_some_and(|b| b["class"] == "small-write"));
    let scores = bucket(&v, "scores").unwrap();
    assert_eq!((scores["microstore"].as_str(), scores["assigned"].as_bool()), (Some("games"), Some(false)));
    assert!(scores["summary"]["puts"].as_u64().unwrap() >= 20, "{scores:#}");
    assert_eq!(admin(&s, &["microstore", "assign", "scores", "default"])["routes_to"], "default");
    assert_eq!(admin(&s, &["microstore", "assign", "scores", "auto"])["routes_to"], "games");

    // A microstore of one worker, that worker held by a GET whose body the client does not read: the
    // next request to its bucket is refused with SlowDown (nothing may wait there), another bucket is served.
    admin(&s, &["microstore", "assign", "big", "tiny"]);
    let big = vec![7u8; 48 << 20];
    c.put_object().bucket("big").key("o").body(ByteStream::from(big)).send().await.unwrap();
    let held = c.get_object().bucket("big").key("o").send().await.unwrap();
    let refused = c.get_object().bucket("big").key("missing").send().await.unwrap_err();
    assert_eq!(refused.code(), Some("SlowDown"), "{refused:?}");
    c.put_object().bucket("other").key("k").body(ByteStream::from_static(b"ok")).send().await.unwrap();
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(microstore(&v, "tiny")["in_use"], 1);
    assert!(microstore(&v, "tiny")["refused"].as_u64().unwrap() >= 1);
    // The client goes away: its worker comes back (once the server sees the connection end).
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.get_object().bucket("big").key("missing").send().await {
            Err(e) if e.code() == Some("NoSuchKey") => break,
            Err(e) if e.code() == Some("SlowDown") && Instant::now() < deadline => tokio::task::yield_now().await,
            other => panic!("after the held GET ended: {other:?}"),
        }
    }

    // The catalog survives a restart; deleting a microstore sends its buckets back to automatic routing.
    stop(s);
    let s = start(&data, &config);
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(microstore(&v, "games")["workers"], 8);
    assert_eq!(microstore(&v, "tiny")["assigned"], serde_json::json!(["big"]));
    // A deleted bucket loses its hand assignment: a new bucket of that name starts routed automatically.
    let c = s3_client(&s.s3, AK, SK);
    admin(&s, &["microstore", "assign", "other", "games"]);
    c.delete_object().bucket("other").key("k").send().await.unwrap();
    c.delete_bucket().bucket("other").send().await.unwrap();
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(microstore(&v, "games")["assigned"], serde_json::json!([]));
    admin(&s, &["microstore", "delete", "tiny"]);
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(v["microstores"].as_array().unwrap().len(), 2);
    assert_eq!(microstore(&v, "default")["workers"], 56);
    stop(s);
}

/// Each microstore's requests reach the drives in its own IO share: the bytes a bucket's PUT stages and
/// its GET reads are counted in its microstore's share (the weight its drives schedule it by), not in
/// another's, and the points each holds show in the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_microstore_s_requests_reach_the_drives_in_its_own_io_share() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let config = d.path().join("mosaic.toml");
    std::fs::write(&config, "[microstores]\nwindow_slot = \"100ms\"\nadapt = false\n").unwrap();
    let s = start(&data, &config);
    let c = s3_client(&s.s3, AK, SK);
    admin(&s, &["microstore", "create", "big", "--target-mib-s", "100", "--workers", "8"]);
    admin(&s, &["microstore", "assign", "bulk", "big"]);
    for b in ["bulk", "misc"] {
        c.create_bucket().bucket(b).send().await.unwrap();
    }
    let served = |v: &serde_json::Value, name: &str| microstore(v, name)["io_served_bytes"].as_u64().unwrap();
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(
        (microstore(&v, "big")["io_points"].as_u64(), microstore(&v, "default")["io_points"].as_u64()),
        (Some(100), Some(9_900))
    );
    let (big0, default0) = (served(&v, "big"), served(&v, "default"));
    // Judged on throughput beside the default one (judged on latency): big's CPU work is bulk.
    assert_eq!(
        (microstore(&v, "big")["cpu_bulk"].as_bool(), microstore(&v, "default")["cpu_bulk"].as_bool()),
        (Some(true), Some(false))
    );
    let bulk_tasks = |v: &serde_json::Value| v["bulk_cpu_tasks"].as_u64().unwrap();
    let tasks0 = bulk_tasks(&v);

    let bulk_connections = |v: &serde_json::Value| v["bulk_cpu_connections"].as_u64().unwrap();
    let connections0 = bulk_connections(&v);

    // A new client's first request (a new connection) addresses bulk: the connection is served on the bulk
    // class's runtime.
    let to_bulk = s3_client(&s.s3, AK, SK);
    let body: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    to_bulk.put_object().bucket("bulk").key("o").body(ByteStream::from(body.clone())).send().await.unwrap();
    let v = admin(&s, &["microstore", "status"]);
    let (big1, default1) = (served(&v, "big"), served(&v, "default"));
    assert!(big1 - big0 >= 8 << 20, "a PUT of 8 MiB to bulk staged in big's share: {big0} -> {big1}");
    assert!(default1 - default0 < 1 << 20, "and not in default's: {default0} -> {default1}");
    // The request ran on the bulk class's threads (its hashing there, on its task), and its drive calls
    // on the class's blocking threads: a piece of work each.
    let tasks1 = bulk_tasks(&v);
    assert!(tasks1 - tasks0 >= 2, "the PUT to bulk ran in the bulk class: {tasks0} -> {tasks1}");
    let connections1 = bulk_connections(&v);
    assert!(connections1 > connections0, "its connection went to the bulk runtime: {connections0} -> {connections1}");

    // The same connection's request for misc (default) goes home, answered with the connection closed
    // (the client's next request opens one placed by its own class); a new connection for misc stays.
    to_bulk.put_object().bucket("misc").key("o").body(ByteStream::from(body.clone())).send().await.unwrap();
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(bulk_tasks(&v), tasks1, "the PUT to misc (default) on a bulk connection ran none in the bulk class");
    let again = to_bulk.get_object().bucket("bulk").key("o").send().await.unwrap();
    assert!(again.body.collect().await.unwrap().into_bytes() == body, "the client reconnects");
    let v = admin(&s, &["microstore", "status"]);
    // Had the connection stayed open, the GET would have reused it and no connection would be placed.
    assert_eq!(bulk_connections(&v), connections1 + 1, "its new connection, placed by a GET of bulk");
    let (connections1, tasks1) = (bulk_connections(&v), bulk_tasks(&v));
    let to_misc = s3_client(&s.s3, AK, SK);
    to_misc.put_object().bucket("misc").key("o2").body(ByteStream::from(body[..4096].to_vec())).send().await.unwrap();
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(bulk_tasks(&v), tasks1, "the PUT to misc (default) ran none in the bulk class");
    assert_eq!(bulk_connections(&v), connections1, "a connection whose first request is misc's stays");
    let got = c.get_object().bucket("bulk").key("o").send().await.unwrap().body.collect().await.unwrap().into_bytes();
    assert!(got == body, "bulk's object reads back");
    let v = admin(&s, &["microstore", "status"]);
    let (big2, default2) = (served(&v, "big"), served(&v, "default"));
    assert!(default2 - default1 >= 8 << 20, "a PUT of 8 MiB to misc in default's share: {default1} -> {default2}");
    assert!(big2 - big1 >= 8 << 20, "the GET of bulk's object read in big's share: {big1} -> {big2}");
    // A client that connected and sent nothing (its connection not yet placed) does not hold the server's
    // drain until its 30 s header timeout: the server stops as it would without CPU classes.
    let silent = std::net::TcpStream::connect(&s.s3).unwrap();
    let stopping = Instant::now();
    stop(s);
    assert!(stopping.elapsed() < Duration::from_secs(15), "the drain waited {:?}", stopping.elapsed());
    drop(silent);
}
