//! Access keys beside the root key, end to end: `mosaic admin key create|list|allow|deny|delete` against a
//! real server, and aws-sdk-s3 signing with the new key: each key reads and writes only what it was
//! granted, grants survive a restart, a deleted key is refused.

mod support;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use support::{Server, s3_client, start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";

/// Runs `mosaic admin --json ...` with the root credentials; returns (success, JSON or error text).
fn admin(s: &Server, args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = support::admin(s, ROOT_AK, ROOT_SK, args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (out.status.success(), v, String::from_utf8_lossy(&out.stderr).to_string())
}

async fn get(c: &aws_sdk_s3::Client, b: &str, k: &str) -> Result<Vec<u8>, String> {
    match c.get_object().bucket(b).key(k).send().await {
        Ok(o) => Ok(o.body.collect().await.map_err(|e| e.to_string())?.to_vec()),
        Err(e) => Err(e.code().unwrap_or("?").to_string()),
    }
}

async fn put(c: &aws_sdk_s3::Client, b: &str, k: &str) -> Result<(), String> {
    c.put_object()
        .bucket(b)
        .key(k)
        .body(ByteStream::from_static(b"data"))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| e.code().unwrap_or("?").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_read_and_write_only_what_they_were_granted() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    for b in ["alpha", "beta"] {
        root.create_bucket().bucket(b).send().await.unwrap();
        put(&root, b, "obj").await.unwrap();
    }

    let (ok, created, err) = admin(&s, &["key", "create"]);
    assert!(ok, "{err}");
    let ak = created["access_key"].as_str().unwrap().to_string();
    let sk = created["secret_key"].as_str().unwrap().to_string();
    let user = s3_client(&s.s3, &ak, &sk);

    // No grants yet: nothing, not even bucket names (ListBuckets shows a key its own and granted buckets).
    assert_eq!(get(&user, "alpha", "obj").await, Err("AccessDenied".into()));
    assert!(user.list_buckets().send().await.unwrap().buckets().is_empty());

    assert!(admin(&s, &["key", "allow", &ak, "alpha", "--read"]).0);
    let names: Vec<_> = user
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_string))
        .collect();
    assert_eq!(names, ["alpha"]);
    assert_eq!(get(&user, "alpha", "obj").await, Ok(b"data".to_vec()));
    assert!(user.list_objects_v2().bucket("alpha").send().await.is_ok());
    assert_eq!(put(&user, "alpha", "new").await, Err("AccessDenied".into()));
    assert_eq!(get(&user, "beta", "obj").await, Err("AccessDenied".into()));
    let e = user.create_bucket().bucket("gamma").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    let e = user.delete_bucket().bucket("alpha").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));

    assert!(admin(&s, &["key", "allow", &ak, "alpha", "--write"]).0);
    assert_eq!(put(&user, "alpha", "new").await, Ok(()));
    // Copying needs read on the source bucket too.
    let e = user.copy_object().bucket("alpha").key("c").copy_source("beta/obj").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    user.copy_object().bucket("alpha").key("c").copy_source("alpha/obj").send().await.unwrap();

    let (ok, listed, _) = admin(&s, &["key", "list"]);
    assert!(ok);
    assert_eq!(listed["keys"][0]["access_key"], ak.as_str());
    assert_eq!(listed["keys"][0]["grants"]["alpha"], "read-write");
    assert!(!listed.to_string().contains(&sk), "secrets are never listed");

    // Grants survive a restart.
    assert_eq!(stop(s).0, 0);
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    let user = s3_client(&s.s3, &ak, &sk);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    assert_eq!(put(&user, "alpha", "after-restart").await, Ok(()));

    assert!(admin(&s, &["key", "deny", &ak, "alpha", "--write"]).0);
    assert_eq!(put(&user, "alpha", "x").await, Err("AccessDenied".into()));
    assert_eq!(get(&user, "alpha", "new").await, Ok(b"data".to_vec()));

    // Bad input: clear errors.
    let (ok, _, err) = admin(&s, &["key", "allow", "MKNOSUCHKEY", "alpha"]);
    assert!(!ok && err.contains("no access key MKNOSUCHKEY"), "{err}");
    let (ok, _, err) = admin(&s, &["key", "allow", &ak, "Bad_Bucket"]);
    assert!(!ok && err.contains("Bad_Bucket"), "{err}");
    let (ok, _, err) = admin(&s, &["key", "delete", "../etc"]);
    assert!(!ok && err.contains("invalid access key"), "{err}");

    assert!(admin(&s, &["key", "delete", &ak]).0);
    assert_eq!(get(&user, "alpha", "obj").await, Err("InvalidAccessKeyId".into()));
    let (ok, _, err) = admin(&s, &["key", "delete", &ak]);
    assert!(!ok && err.contains("no access key"), "{err}");
    // The root key is untouched throughout.
    assert_eq!(get(&root, "beta", "obj").await, Ok(b"data".to_vec()));
    assert_eq!(stop(s).0, 0);
}

/// An owning key creates buckets and may do everything in them, nothing in others'; it sees its own
/// buckets; a bucket taken by another is refused; the root key still reaches everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owning_keys_own_the_buckets_they_create() {
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    root.create_bucket().bucket("roots").send().await.unwrap();
    put(&root, "roots", "obj").await.unwrap();
    let client = |created: &serde_json::Value| {
        s3_client(&s.s3, created["access_key"].as_str().unwrap(), created["secret_key"].as_str().unwrap())
    };
    let (ok, a, err) = admin(&s, &["key", "create", "--owner"]);
    assert!(ok, "{err}");
    assert_eq!(a["owner"], true);
    let (ok, b, _) = admin(&s, &["key", "create", "--owner"]);
    assert!(ok);
    let (alice, bob) = (client(&a), client(&b));

    alice.create_bucket().bucket("alices").send().await.unwrap();
    // Creating it again is fine for its owner (S3 in us-east-1), taken for anyone else.
    alice.create_bucket().bucket("alices").send().await.unwrap();
    let e = bob.create_bucket().bucket("alices").send().await.unwrap_err();
    assert_eq!(e.code(), Some("BucketAlreadyExists"));
    assert_eq!(put(&alice, "alices", "k").await, Ok(()));
    assert_eq!(get(&alice, "alices", "k").await, Ok(b"data".to_vec()));
    alice
        .put_bucket_versioning()
        .bucket("alices")
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .expect("an owner configures its bucket");
    assert_eq!(get(&bob, "alices", "k").await, Err("AccessDenied".into()));
    assert_eq!(put(&bob, "alices", "x").await, Err("AccessDenied".into()));
    assert_eq!(get(&alice, "roots", "obj").await, Err("AccessDenied".into()));
    let e = alice.copy_object().bucket("alices").key("c").copy_source("roots/obj").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    let names = |c: aws_sdk_s3::operation::list_buckets::ListBucketsOutput| -> Vec<String> {
        c.buckets().iter().filter_map(|b| b.name().map(str::to_string)).collect()
    };
    assert_eq!(names(alice.list_buckets().send().await.unwrap()), ["alices"]);
    assert!(names(bob.list_buckets().send().await.unwrap()).is_empty());
    assert_eq!(names(root.list_buckets().send().await.unwrap()), ["alices", "roots"]);
    assert_eq!(get(&root, "alices", "k").await, Ok(b"data".to_vec()));

    // Its bucket gone and made again by the root key, the former owner has no access left.
    for v in root.list_object_versions().bucket("alices").send().await.unwrap().versions() {
        root.delete_object()
            .bucket("alices")
            .key(v.key().unwrap())
            .version_id(v.version_id().unwrap())
            .send()
            .await
            .unwrap();
    }
    alice.delete_bucket().bucket("alices").send().await.expect("an owner deletes its bucket");
    root.create_bucket().bucket("alices").send().await.unwrap();
    assert_eq!(put(&alice, "alices", "x").await, Err("AccessDenied".into()));
    // A plain key still cannot create buckets.
    let (_, plain, _) = admin(&s, &["key", "create"]);
    let e = client(&plain).create_bucket().bucket("plains").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    assert_eq!(stop(s).0, 0);
}
