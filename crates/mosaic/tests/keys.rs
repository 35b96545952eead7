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

    // No grants yet: names of buckets only.
    assert_eq!(get(&user, "alpha", "obj").await, Err("AccessDenied".into()));
    assert_eq!(user.list_buckets().send().await.unwrap().buckets().len(), 2);

    assert!(admin(&s, &["key", "allow", &ak, "alpha", "--read"]).0);
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
