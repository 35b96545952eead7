//! Microstores with sets of their own, end to end through the `mosaic` binary: eight drives with
//! `erasure = 2+2` make two sets; a microstore owns set 1; a bucket assigned to it moves there in the
//! background at a slow pace, under a mixed load (overwrites, deletes, new keys, reads, listings), the
//! server is killed with SIGKILL in the middle of the move and restarted, the move goes on and ends, and
//! every acknowledged write reads back exactly, no delete comes back, and the listing agrees. Another
//! tenant's bucket, of the default microstore, moves off set 1 first (the default keeps off the sets
//! microstores own). Assigned back to automatic routing, the bucket moves back to the default's set; the
//! microstore deleted, everything is on every set again.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{Server, kill9, logged, s3_client, stop};

const AK: &str = "setstestkey";
const SK: &str = "setstestsecret-0123456789";
const BUCKET: &str = "tenant";
/// A bucket of the default microstore.
const OTHERS: &str = "others";

fn admin(s: &Server, args: &[&str]) -> serde_json::Value {
    let out = support::admin(s, AK, SK, args);
    assert!(out.status.success(), "mosaic admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Polls the microstores' status until `done` holds, at most 120 s.
fn wait_status(s: &Server, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let v = admin(s, &["microstore", "status"]);
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not reached in 120 s: {v:#}");
        std::thread::yield_now();
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7919) % 251) as u8).collect()
}

async fn get(c: &aws_sdk_s3::Client, key: &str) -> Option<Vec<u8>> {
    get_in(c, BUCKET, key).await
}

async fn get_in(c: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Option<Vec<u8>> {
    match c.get_object().bucket(bucket).key(key).send().await {
        Ok(r) => Some(r.body.collect().await.unwrap().into_bytes().to_vec()),
        Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => None,
        Err(e) => panic!("GET {key}: {e:?}"),
    }
}

async fn list_all(c: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let r = c.list_objects_v2().bucket(bucket).max_keys(50).set_continuation_token(token).send().await.unwrap();
        keys.extend(r.contents().iter().filter_map(|o| o.key().map(str::to_string)));
        match r.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => return keys,
        }
    }
}

async fn verify(c: &aws_sdk_s3::Client, model: &BTreeMap<String, Option<Vec<u8>>>, phase: &str) {
    verify_in(c, BUCKET, model, phase).await
}

async fn verify_in(c: &aws_sdk_s3::Client, bucket: &str, model: &BTreeMap<String, Option<Vec<u8>>>, phase: &str) {
    for (k, v) in model {
        assert!(get_in(c, bucket, k).await == *v, "{phase}: {bucket}/{k} reads as acknowledged");
    }
    let want: Vec<String> = model.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k.clone()).collect();
    assert_eq!(list_all(c, bucket).await, want, "{phase}: the listing of {bucket} shows each live key once");
}

async fn put(c: &aws_sdk_s3::Client, model: &mut BTreeMap<String, Option<Vec<u8>>>, key: &str, data: Vec<u8>) {
    put_in(c, BUCKET, model, key, data).await
}

async fn put_in(
    c: &aws_sdk_s3::Client,
    bucket: &str,
    model: &mut BTreeMap<String, Option<Vec<u8>>>,
    key: &str,
    data: Vec<u8>,
) {
    c.put_object().bucket(bucket).key(key).body(ByteStream::from(data.clone())).send().await.unwrap();
    model.insert(key.to_string(), Some(data));
}

fn placement(v: &serde_json::Value) -> &serde_json::Value {
    &v["placements"][BUCKET]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_moves_to_its_microstores_set_through_a_kill_and_back() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("store");
    let drives: Vec<PathBuf> = (0..8).map(|d| root.path().join(format!("drive{d}"))).collect();
    let list = drives.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(",");
    let slow = root.path().join("slow.toml");
    std::fs::write(&slow, "[microstores]\nmove_rate = \"1MiB\"\n").unwrap();
    let fast = root.path().join("fast.toml");
    std::fs::write(&fast, "[microstores]\nmove_rate = \"1GiB\"\n").unwrap();
    let start = |config: &Path| {
        let env = [("MOSAIC_DRIVES", list.as_str()), ("MOSAIC_ERASURE", "2+2"), ("MOSAIC_DRIVE_SIZE", "96MiB")];
        let mut all = vec![("MOSAIC_ACCESS_KEY", AK), ("MOSAIC_SECRET_KEY", SK)];
        all.extend(env);
        support::start_with_args(&data, &all, &["--config", config.to_str().unwrap()])
    };
    let s = start(&slow);
    let v: serde_json::Value = serde_json::from_slice(&support::admin(&s, AK, SK, &["drives"]).stdout).unwrap();
    assert_eq!(v["sets"].as_array().unwrap().len(), 2, "eight drives of 2+2 are two sets: {v}");

    let c = s3_client(&s.s3, AK, SK);
    c.create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..300 {
        put(&c, &mut model, &format!("obj/{i:04}"), pattern(i, 64 * 1024 + i)).await;
    }
    let on_set_0 = model.keys().filter(|k| mosaic_pool::member_of(k.as_bytes(), 2) == 0).count();
    assert!(on_set_0 > 100, "about half the keys are on set 0 ({on_set_0})");
    // Another tenant's bucket, of the default microstore.
    c.create_bucket().bucket(OTHERS).send().await.unwrap();
    let mut others = BTreeMap::new();
    for i in 0..60 {
        put_in(&c, OTHERS, &mut others, &format!("o/{i:03}"), pattern(5000 + i, 20_000 + i)).await;
    }

    // A microstore owning set 1: the default microstore's buckets move off it (1 MiB/s, a few seconds for
    // the share of both buckets there); the bucket assigned to it moves there once they did.
    admin(&s, &["microstore", "create", "own", "--target-p99-ms", "50", "--workers", "8", "--sets", "1"]);
    let v = admin(&s, &["microstore", "status"]);
    let own = v["microstores"].as_array().unwrap().iter().find(|m| m["name"] == "own").unwrap();
    assert_eq!(own["sets"], serde_json::json!([1]));
    wait_status(&s, "the default microstore keeps off set 1", |v| v["home"]["sets"] == serde_json::json!([0]));
    admin(&s, &["microstore", "assign", BUCKET, "own"]);
    logged(&s, "the data of buckets of no microstore's sets moves off the sets microstores own");
    verify_in(&c, OTHERS, &others, "while the home moves").await;
    wait_status(&s, "the home moves", |v| v["home"]["moving_from"].is_null());
    logged(&s, "a bucket's data moves to its microstore's sets");
    logged(&s, "objects of moving buckets moved");
    // A mixed load while the move is under way: overwrites, deletes, new keys, reads and a listing.
    for i in 0..40 {
        match i % 4 {
            0 => put(&c, &mut model, &format!("obj/{:04}", i * 7), pattern(1000 + i, 9000)).await,
            1 => {
                let key = format!("obj/{:04}", i * 7);
                c.delete_object().bucket(BUCKET).key(&key).send().await.unwrap();
                model.insert(key, None);
            }
            2 => put(&c, &mut model, &format!("new/{i:04}"), pattern(2000 + i, 5000)).await,
            _ => {
                let key = format!("obj/{:04}", i * 5);
                assert!(get(&c, &key).await == model[&key], "{key} reads during the move");
            }
        }
    }
    verify(&c, &model, "during the move").await;
    let v = admin(&s, &["microstore", "status"]);
    assert_eq!(placement(&v)["sets"], serde_json::json!([1]), "{v:#}");
    assert_eq!(placement(&v)["moving_from"], serde_json::json!([0]), "still moving (from the home) when killed: {v:#}");
    kill9(s);

    // Restarted: the move goes on from the data directory's record and ends.
    let s = start(&fast);
    let c = s3_client(&s.s3, AK, SK);
    verify(&c, &model, "after the kill").await;
    verify_in(&c, OTHERS, &others, "after the kill").await;
    let v = wait_status(&s, "the move ends", |v| placement(v)["moving_from"].is_null());
    assert_eq!(placement(&v)["sets"], serde_json::json!([1]));
    verify(&c, &model, "after the move").await;
    put(&c, &mut model, "obj/after", pattern(9, 70_000)).await;

    // Back to automatic routing: the bucket moves back to the default microstore's set, and its placement
    // record goes (it follows the home from now on).
    admin(&s, &["microstore", "assign", BUCKET, "auto"]);
    wait_status(&s, "the move back ends", |v| placement(v).is_null());
    verify(&c, &model, "after moving back").await;
    put_in(&c, OTHERS, &mut others, "o/after", pattern(6000, 30_000)).await;
    // Microstores owning every set: the default microstore shares them all again (its home is every set),
    // and keeps off set 1 once more when the second one goes.
    admin(&s, &["microstore", "create", "rest", "--target-p99-ms", "50", "--workers", "4", "--sets", "0"]);
    wait_status(&s, "the home is every set", |v| v["home"].is_null());
    verify_in(&c, OTHERS, &others, "on every set").await;
    admin(&s, &["microstore", "delete", "rest"]);
    let settled_on_0 = serde_json::json!({ "sets": [0], "moving_from": null });
    wait_status(&s, "the home keeps off set 1 again", |v| v["home"] == settled_on_0);
    verify(&c, &model, "the home back on set 0").await;
    // The microstore deleted, its set goes back to the default microstore: the home moves onto every set
    // and its record goes.
    admin(&s, &["microstore", "delete", "own"]);
    wait_status(&s, "the home moves back", |v| v["home"].is_null());
    verify(&c, &model, "on every set again").await;
    verify_in(&c, OTHERS, &others, "on every set again").await;
    assert_eq!(stop(s).0, 0);
    let s = start(&fast);
    let c = s3_client(&s.s3, AK, SK);
    verify(&c, &model, "after a restart").await;
    verify_in(&c, OTHERS, &others, "after a restart").await;
    assert_eq!(stop(s).0, 0);
}

/// The resource manager moves a set on its own: six drives of 1+1 are three sets; a microstore owning set
/// 2 misses its latency target under a load of sixteen clients held to four workers, while the default
/// microstore (on sets 0 and 1) idles; after a few rounds set 1 becomes the microstore's, the home moves
/// off it and the bucket spreads onto it, under the load, and every acknowledged write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_microstore_missing_its_target_takes_a_set_from_the_default_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("store");
    let drives: Vec<PathBuf> = (0..6).map(|d| root.path().join(format!("drive{d}"))).collect();
    let list = drives.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(",");
    let config = root.path().join("sets.toml");
    let rules =
        "window_slot = \"200ms\"\nworkers = 8\nfloor_workers = 4\nset_patience_rounds = 3\nset_cooldown_rounds = 1";
    std::fs::write(&config, format!("[microstores]\n{rules}\nmove_rate = \"256MiB\"\n")).unwrap();
    let env = [
        ("MOSAIC_ACCESS_KEY", AK),
        ("MOSAIC_SECRET_KEY", SK),
        ("MOSAIC_DRIVES", list.as_str()),
        ("MOSAIC_ERASURE", "1+1"),
        ("MOSAIC_DRIVE_SIZE", "64MiB"),
    ];
    let s = support::start_with_args(&data, &env, &["--config", config.to_str().unwrap()]);
    let c = s3_client(&s.s3, AK, SK);
    c.create_bucket().bucket(OTHERS).send().await.unwrap();
    let mut others = BTreeMap::new();
    for i in 0..30 {
        put_in(&c, OTHERS, &mut others, &format!("o/{i:03}"), pattern(7000 + i, 10_000 + i)).await;
    }
    // A target no request meets (a microsecond).
    admin(&s, &["microstore", "create", "hot", "--target-p99-ms", "0.001", "--workers", "4", "--sets", "2"]);
    admin(&s, &["microstore", "assign", BUCKET, "hot"]);
    wait_status(&s, "the home keeps off set 2", |v| {
        v["home"] == serde_json::json!({ "sets": [0, 1], "moving_from": null })
    });
    c.create_bucket().bucket(BUCKET).send().await.unwrap();

    // Sixteen writers and readers until the set moved and the data followed (bounded in count).
    let done = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
    let mut load = vec![];
    for t in 0..16usize {
        let (c, done, acked) = (c.clone(), done.clone(), acked.clone());
        load.push(tokio::spawn(async move {
            for i in 0..5_000usize {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                let key = format!("k/{t:02}/{:03}", i % 40);
                if i % 3 == 2 {
                    let want = acked.lock().get(&key).cloned();
                    if let Some(want) = want {
                        assert_eq!(get(&c, &key).await, Some(want), "{key} reads what was last written");
                    }
                    continue;
                }
                let body = pattern(t * 10_000 + i, 3_000 + i % 700);
                c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(body.clone())).send().await.unwrap();
                acked.lock().insert(key, body);
            }
        }));
    }
    logged(&s, "microstore set moved");
    let v = wait_status(&s, "set 1 is the hot microstore's", |v| {
        let hot = v["microstores"].as_array().unwrap().iter().find(|m| m["name"] == "hot").cloned();
        hot.is_some_and(|m| m["sets"] == serde_json::json!([1, 2]))
    });
    let decision = v["decisions"].as_array().unwrap().iter().find(|d| d["set"] == 1).cloned();
    assert!(decision.is_some_and(|d| d["from"] == "default" && d["to"] == "hot"), "{v:#}");
    wait_status(&s, "the home keeps off set 1", |v| {
        v["home"] == serde_json::json!({ "sets": [0], "moving_from": null })
    });
    wait_status(&s, "the bucket spreads onto set 1", |v| {
        placement(v) == &serde_json::json!({ "sets": [1, 2], "moving_from": null })
    });
    done.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let model: BTreeMap<String, Option<Vec<u8>>> =
        acked.lock().iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    assert!(model.len() > 100, "the load wrote ({} keys)", model.len());
    verify(&c, &model, "after the set moved").await;
    verify_in(&c, OTHERS, &others, "after the set moved").await;
    assert_eq!(stop(s).0, 0);
}
