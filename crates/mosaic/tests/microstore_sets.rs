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
