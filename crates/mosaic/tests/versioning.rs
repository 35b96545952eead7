//! Versioning and object lock end to end: a real server and aws-sdk-s3 with its defaults. Versions, delete
//! markers and listings of versions; a locked version's removal refused for every key (the root key, the
//! bucket's owner, a key granted write), GOVERNANCE bypassed only by those allowed, a COMPLIANCE retention
//! never shortened; all of it still true after a restart.

mod support;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::{ByteStream, DateTime};
use aws_sdk_s3::types::{
    BucketVersioningStatus, Delete, ObjectIdentifier, ObjectLockLegalHold, ObjectLockLegalHoldStatus, ObjectLockMode,
    ObjectLockRetention, ObjectLockRetentionMode, VersioningConfiguration,
};
use support::{Server, s3_client, start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";

fn admin(s: &Server, args: &[&str]) -> serde_json::Value {
    let out = support::admin(s, ROOT_AK, ROOT_SK, args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("admin answers JSON")
}

fn client_of(s: &Server, created: &serde_json::Value) -> aws_sdk_s3::Client {
    s3_client(&s.s3, created["access_key"].as_str().unwrap(), created["secret_key"].as_str().unwrap())
}

async fn put(c: &aws_sdk_s3::Client, b: &str, k: &str, body: &'static [u8]) -> Option<String> {
    c.put_object().bucket(b).key(k).body(ByteStream::from_static(body)).send().await.unwrap().version_id
}

async fn get(c: &aws_sdk_s3::Client, b: &str, k: &str, v: Option<&str>) -> Result<Vec<u8>, String> {
    match c.get_object().bucket(b).key(k).set_version_id(v.map(str::to_string)).send().await {
        Ok(o) => Ok(o.body.collect().await.unwrap().to_vec()),
        Err(e) => Err(e.code().unwrap_or("?").to_string()),
    }
}

async fn delete_version(c: &aws_sdk_s3::Client, b: &str, k: &str, v: &str, bypass: bool) -> Result<(), String> {
    let mut d = c.delete_object().bucket(b).key(k).version_id(v);
    if bypass {
        d = d.bypass_governance_retention(true);
    }
    d.send().await.map(|_| ()).map_err(|e| e.code().unwrap_or("?").to_string())
}

fn in_an_hour() -> DateTime {
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    DateTime::from(t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_delete_markers_and_their_listing() {
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    c.create_bucket().bucket("ver").send().await.unwrap();
    assert!(c.get_bucket_versioning().bucket("ver").send().await.unwrap().status.is_none());
    assert_eq!(put(&c, "ver", "k", b"null").await, None, "no version id before versioning");
    let enabled = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    c.put_bucket_versioning().bucket("ver").versioning_configuration(enabled).send().await.unwrap();
    let status = c.get_bucket_versioning().bucket("ver").send().await.unwrap().status;
    assert_eq!(status, Some(BucketVersioningStatus::Enabled));
    let v1 = put(&c, "ver", "k", b"one").await.expect("a version id");
    let v2 = put(&c, "ver", "k", b"two").await.expect("a version id");
    assert_eq!(get(&c, "ver", "k", None).await.unwrap(), b"two");
    assert_eq!(get(&c, "ver", "k", Some(&v1)).await.unwrap(), b"one");
    assert_eq!(get(&c, "ver", "k", Some("null")).await.unwrap(), b"null");
    assert_eq!(get(&c, "ver", "k", Some(&"0".repeat(32))).await, Err("NoSuchVersion".into()));
    assert_eq!(get(&c, "ver", "k", Some("not-a-version")).await, Err("InvalidArgument".into()));

    let marker = c.delete_object().bucket("ver").key("k").send().await.unwrap();
    assert_eq!(marker.delete_marker, Some(true));
    assert_eq!(get(&c, "ver", "k", None).await, Err("NoSuchKey".into()));
    let head = c.head_object().bucket("ver").key("k").send().await.unwrap_err();
    assert_eq!(head.raw_response().map(|r| r.status().as_u16()), Some(404));
    let listed = c.list_objects_v2().bucket("ver").send().await.unwrap();
    assert!(listed.contents().is_empty(), "a deleted key is not listed");

    // Paging through the versions, one per page: all of them, newest first.
    let mut seen = Vec::new();
    let (mut key_marker, mut vid_marker) = (None, None);
    for _ in 0..10 {
        let page = c
            .list_object_versions()
            .bucket("ver")
            .max_keys(1)
            .set_key_marker(key_marker.clone())
            .set_version_id_marker(vid_marker.clone())
            .send()
            .await
            .unwrap();
        for m in page.delete_markers() {
            seen.push((m.version_id().unwrap().to_string(), m.is_latest().unwrap(), true));
        }
        for v in page.versions() {
            seen.push((v.version_id().unwrap().to_string(), v.is_latest().unwrap(), false));
        }
        if !page.is_truncated().unwrap_or(false) {
            break;
        }
        (key_marker, vid_marker) = (page.next_key_marker, page.next_version_id_marker);
    }
    let marker_id = marker.version_id.unwrap();
    let expected = vec![
        (marker_id.clone(), true, true),
        (v2.clone(), false, false),
        (v1, false, false),
        ("null".into(), false, false),
    ];
    assert_eq!(seen, expected);

    // DeleteObjects with versions: the marker goes, so the newest version is current again.
    let del = Delete::builder()
        .objects(ObjectIdentifier::builder().key("k").version_id(&marker_id).build().unwrap())
        .build()
        .unwrap();
    let out = c.delete_objects().bucket("ver").delete(del).send().await.unwrap();
    assert_eq!(out.deleted()[0].version_id(), Some(marker_id.as_str()));
    assert_eq!(out.deleted()[0].delete_marker(), Some(true));
    assert_eq!(get(&c, "ver", "k", None).await.unwrap(), b"two");

    // Versions survive a restart.
    assert_eq!(stop(s).0, 0);
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    assert_eq!(get(&c, "ver", "k", Some(&v2)).await.unwrap(), b"two");
    assert_eq!(get(&c, "ver", "k", Some("null")).await.unwrap(), b"null");
    assert_eq!(stop(s).0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_version_is_kept_from_every_key() {
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let owner_key = admin(&s, &["key", "create", "--owner"]);
    let owner = client_of(&s, &owner_key);
    owner.create_bucket().bucket("worm").object_lock_enabled_for_bucket(true).send().await.unwrap();
    let writer_key = admin(&s, &["key", "create"]);
    admin(&s, &["key", "allow", writer_key["access_key"].as_str().unwrap(), "worm"]);
    let writer = client_of(&s, &writer_key);
    let keys = [("root", &root), ("owner", &owner), ("writer", &writer)];

    // COMPLIANCE: refused for every key, bypass or not; never shortened.
    let c = owner
        .put_object()
        .bucket("worm")
        .key("c")
        .body(ByteStream::from_static(b"kept"))
        .object_lock_mode(ObjectLockMode::Compliance)
        .object_lock_retain_until_date(in_an_hour())
        .send()
        .await
        .unwrap()
        .version_id
        .unwrap();
    for (who, k) in keys {
        for bypass in [false, true] {
            assert_eq!(delete_version(k, "worm", "c", &c, bypass).await, Err("AccessDenied".into()), "{who}");
        }
    }
    let sooner = ObjectLockRetention::builder()
        .mode(ObjectLockRetentionMode::Compliance)
        .retain_until_date(DateTime::from(std::time::SystemTime::now() + std::time::Duration::from_secs(60)))
        .build();
    let e = root
        .put_object_retention()
        .bucket("worm")
        .key("c")
        .retention(sooner)
        .bypass_governance_retention(true)
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    let r = root.get_object_retention().bucket("worm").key("c").send().await.unwrap().retention.unwrap();
    assert_eq!(r.mode, Some(ObjectLockRetentionMode::Compliance));

    // GOVERNANCE: refused without the bypass; the bypass counts only from the root key and the owner.
    let g = |k: &'static str| {
        let owner = owner.clone();
        async move {
            owner
                .put_object()
                .bucket("worm")
                .key(k)
                .body(ByteStream::from_static(b"gov"))
                .object_lock_mode(ObjectLockMode::Governance)
                .object_lock_retain_until_date(in_an_hour())
                .send()
                .await
                .unwrap()
                .version_id
                .unwrap()
        }
    };
    let g1 = g("g1").await;
    for (who, k) in keys {
        assert_eq!(delete_version(k, "worm", "g1", &g1, false).await, Err("AccessDenied".into()), "{who}");
    }
    assert_eq!(delete_version(&writer, "worm", "g1", &g1, true).await, Err("AccessDenied".into()));
    delete_version(&owner, "worm", "g1", &g1, true).await.expect("the owner bypasses GOVERNANCE");
    let g2 = g("g2").await;
    delete_version(&root, "worm", "g2", &g2, true).await.expect("the root key bypasses GOVERNANCE");

    // A legal hold: refused for every key until it is taken off.
    let h = put(&owner, "worm", "h", b"held").await.unwrap();
    let on = ObjectLockLegalHold::builder().status(ObjectLockLegalHoldStatus::On).build();
    owner.put_object_legal_hold().bucket("worm").key("h").legal_hold(on).send().await.unwrap();
    for (who, k) in keys {
        assert_eq!(delete_version(k, "worm", "h", &h, true).await, Err("AccessDenied".into()), "{who}");
    }
    // Deleting without a version id adds a delete marker and keeps every locked version.
    assert_eq!(root.delete_object().bucket("worm").key("c").send().await.unwrap().delete_marker, Some(true));
    assert_eq!(get(&root, "worm", "c", Some(&c)).await.unwrap(), b"kept");

    // The lock holds after a restart.
    assert_eq!(stop(s).0, 0);
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    assert_eq!(delete_version(&root, "worm", "c", &c, true).await, Err("AccessDenied".into()));
    assert_eq!(delete_version(&root, "worm", "h", &h, true).await, Err("AccessDenied".into()));
    let off = ObjectLockLegalHold::builder().status(ObjectLockLegalHoldStatus::Off).build();
    root.put_object_legal_hold().bucket("worm").key("h").version_id(&h).legal_hold(off).send().await.unwrap();
    delete_version(&root, "worm", "h", &h, false).await.expect("no lock left");

    // A bucket with object lock stays versioned; a bucket without one refuses lock requests.
    let suspend = VersioningConfiguration::builder().status(BucketVersioningStatus::Suspended).build();
    let e = root.put_bucket_versioning().bucket("worm").versioning_configuration(suspend).send().await.unwrap_err();
    assert_eq!(e.code(), Some("InvalidBucketState"));
    root.create_bucket().bucket("plain").send().await.unwrap();
    let e = root.get_object_lock_configuration().bucket("plain").send().await.unwrap_err();
    assert_eq!(e.code(), Some("ObjectLockConfigurationNotFoundError"));
    let e = root
        .put_object()
        .bucket("plain")
        .key("k")
        .body(ByteStream::from_static(b"x"))
        .object_lock_legal_hold_status(ObjectLockLegalHoldStatus::On)
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("InvalidRequest"));
    assert_eq!(stop(s).0, 0);
}

/// Markers and versions of a bucket, per key: (delete markers, versions).
async fn counts(c: &aws_sdk_s3::Client, b: &str) -> std::collections::BTreeMap<String, (usize, usize)> {
    let mut out: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let (mut key_marker, mut vid_marker) = (None, None);
    loop {
        let page = c
            .list_object_versions()
            .bucket(b)
            .set_key_marker(key_marker)
            .set_version_id_marker(vid_marker)
            .send()
            .await
            .unwrap();
        for m in page.delete_markers() {
            out.entry(m.key().unwrap().to_string()).or_default().0 += 1;
        }
        for v in page.versions() {
            out.entry(v.key().unwrap().to_string()).or_default().1 += 1;
        }
        if !page.is_truncated().unwrap_or(false) {
            return out;
        }
        (key_marker, vid_marker) = (page.next_key_marker, page.next_version_id_marker);
    }
}

/// Lifecycle passes the server has made (its metrics).
async fn lifecycle_passes(s: &Server) -> u64 {
    let text = reqwest::get(format!("http://{}/metrics", s.admin)).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("mosaic_lifecycle_passes_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Lifecycle with a one-second day: current versions under a prefix expire (one delete marker each), the
/// server is killed while a pass is under way, and after the restart every expired key has exactly one
/// delete marker: nothing deleted twice, nothing missed; keys outside the rule are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_resumes_after_a_kill_without_double_or_missed_deletes() {
    use aws_sdk_s3::types::LifecycleRuleFilter;
    use aws_sdk_s3::types::{BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule};
    const KEYS: usize = 300;
    let d = tempfile::tempdir().unwrap();
    let env = [("MOSAIC_LIFECYCLE_DAY", "1s")];
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &env);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    c.create_bucket().bucket("lcy").send().await.unwrap();
    let enabled = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    c.put_bucket_versioning().bucket("lcy").versioning_configuration(enabled).send().await.unwrap();
    for i in 0..KEYS {
        put(&c, "lcy", &format!("exp/{i:04}"), b"x").await;
    }
    put(&c, "lcy", "keep/a", b"kept").await;
    let rule = LifecycleRule::builder()
        .id("expire")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix("exp/").build())
        .expiration(LifecycleExpiration::builder().days(2).build())
        .build()
        .unwrap();
    let cfg = BucketLifecycleConfiguration::builder().rules(rule).build().unwrap();
    c.put_bucket_lifecycle_configuration().bucket("lcy").lifecycle_configuration(cfg).send().await.unwrap();
    let got = c.get_bucket_lifecycle_configuration().bucket("lcy").send().await.unwrap();
    assert_eq!(got.rules()[0].id(), Some("expire"));

    // Wait (bounded) for the first delete marker, then kill the server in the middle of its pass.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let n = counts(&c, "lcy").await.values().filter(|(m, _)| *m > 0).count();
        if n > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no version expired within a minute of one-second days");
        tokio::task::yield_now().await;
    }
    support::kill9(s);
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &env);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let last = loop {
        let now = counts(&c, "lcy").await;
        if now.iter().filter(|(k, (m, _))| k.starts_with("exp/") && *m > 0).count() == KEYS {
            break now;
        }
        assert!(std::time::Instant::now() < deadline, "not every version expired after the restart");
        tokio::task::yield_now().await;
    };
    // Two more whole passes change nothing.
    let passes = lifecycle_passes(&s).await;
    while lifecycle_passes(&s).await < passes + 3 {
        assert!(std::time::Instant::now() < deadline, "the lifecycle passes stopped");
        tokio::task::yield_now().await;
    }
    let more = counts(&c, "lcy").await;
    assert_eq!(more, last, "later passes did nothing more");
    for (k, (markers, versions)) in &more {
        if k.starts_with("exp/") {
            assert_eq!((*markers, *versions), (1, 1), "{k}: one delete marker over its one version");
        } else {
            assert_eq!((*markers, *versions), (0, 1), "{k} is outside the rule");
        }
    }
    assert_eq!(more.len(), KEYS + 1);
    assert_eq!(get(&c, "lcy", "keep/a", None).await.unwrap(), b"kept");
    assert_eq!(stop(s).0, 0);
}
