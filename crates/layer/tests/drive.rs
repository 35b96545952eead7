//! The S3 semantics on one drive: the semantics suite, and what only a drive can show (objects written
//! before listing tags existed, priority marks reaching the engine).

use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, Op, SimDevice, Transaction};
use mosaic_layer::testing::{body, run_suite};
use mosaic_layer::*;
use mosaic_store::{Snapshot, Store};
use std::sync::Arc;

fn drive(dirs: &mut Vec<tempfile::TempDir>) -> Arc<DriveStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine =
        Engine::format(dir.path(), Arc::new(SimDevice::new(256 << 20)), EngineConfig::default()).expect("format");
    dirs.push(dir);
    Arc::new(DriveStore::new(engine))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_one_drive() {
    let mut dirs = Vec::new();
    run_suite(|| drive(&mut dirs)).await;
}

/// A byte of an encrypted body damaged on the drive: reads of its package fail, the others still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_encrypted_body_is_an_error_never_other_bytes() {
    let mut dirs = Vec::new();
    let cfg = SemanticsConfig { sse_keys: Some(mosaic_layer::testing::test_sse_keys()), ..Default::default() };
    let layer = S3Semantics::open(drive(&mut dirs), cfg).await.unwrap();
    mosaic_layer::testing::encryption_detects_damage(&layer).await;
    layer.shutdown().await.unwrap();
}

async fn bucket_coll(store: &DriveStore, bucket: &str) -> u32 {
    store.snapshot().collection(&format!("b/{bucket}")).await.unwrap().unwrap()
}

/// A drive written before listing tags existed has name entries without one: a listing still shows each
/// object's size, ETag and time, from its onode and metadata record.
#[tokio::test]
async fn objects_without_a_listing_tag_are_listed_from_their_metadata() {
    let mut dirs = Vec::new();
    let store = drive(&mut dirs);
    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let tagged = layer.put_object("bkt", "a", body(b"hello", 5), PutOptions::default()).await.unwrap();
    // "b" as an older build wrote it: data and metadata, no tag.
    let coll = bucket_coll(&store, "bkt").await;
    let untagged = ObjectMeta { version: 1, size_bytes: 3, etag: "e0".into(), ..Default::default() };
    let write = Op::Write { coll, name: b"b".to_vec(), offset: 0, data: b"abc".to_vec() };
    let meta = Op::SetAttr { coll, name: b"b".to_vec(), key: b"s3.meta".to_vec(), value: untagged.encode() };
    let engine = store.engine().clone();
    engine.submit(Transaction::new().op(write).op(meta)).unwrap();
    let entries = engine.reader().list_entries(coll, b"", b"", 10).unwrap();
    assert_eq!(entries.iter().map(|e| e.tag.is_some()).collect::<Vec<_>>(), [true, false]);
    let page = layer.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    let got: Vec<(&str, u64, &str, i64)> =
        page.objects.iter().map(|o| (o.key.as_str(), o.size_bytes, o.etag.as_str(), o.last_modified_unix_ms)).collect();
    assert_eq!(got, [("a", 5, tagged.etag.as_str(), tagged.last_modified_unix_ms), ("b", 3, "e0", 0)]);
    layer.shutdown().await.unwrap();
}

/// `x-amz-meta-mosaic-priority: high` marks the object in the drive; a GET of it holds a prioritized
/// request until its body is dropped; an overwrite without the metadata clears the mark.
#[tokio::test]
async fn priority_metadata_marks_the_object_and_its_reads() {
    let mut dirs = Vec::new();
    let store = drive(&mut dirs);
    let engine = store.engine().clone();
    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let coll = bucket_coll(&store, "bkt").await;
    let high = |key: &str| engine.reader().lookup(coll, key.as_bytes()).unwrap().unwrap().high_priority;
    let mut opts = PutOptions::default();
    opts.user_metadata.insert("mosaic-priority".into(), "High".into());
    layer.put_object("bkt", "hot", body(b"hello", 5), opts).await.unwrap();
    layer.put_object("bkt", "plain", body(b"hello", 5), PutOptions::default()).await.unwrap();
    assert!(high("hot"));
    assert!(!high("plain"));
    let got = layer.get_object("bkt", "hot", None, None, None, &Precondition::default()).await.unwrap();
    assert_eq!(engine.stats().prioritized_in_flight, 1, "the GET's reader is prioritized");
    drop(got);
    let got = layer.get_object("bkt", "plain", None, None, None, &Precondition::default()).await.unwrap();
    assert_eq!(engine.stats().prioritized_in_flight, 0);
    drop(got);
    layer.put_object("bkt", "hot", body(b"again", 5), PutOptions::default()).await.unwrap();
    assert!(!high("hot"), "an overwrite without the metadata is not prioritized");
    assert_eq!(engine.stats().prioritized_in_flight, 0);
    layer.shutdown().await.unwrap();
}

/// A damaged bucket record is an error that names the bucket, never a bucket created at time 0.
#[tokio::test]
async fn a_damaged_bucket_record_is_reported() {
    let mut dirs = Vec::new();
    let store = drive(&mut dirs);
    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("photos", None).await.unwrap();
    let sys = store.snapshot().collection("sys").await.unwrap().unwrap();
    let damage = Op::SetAttr {
        coll: sys,
        name: b"bucket/photos\0".to_vec(),
        key: b"bucket".to_vec(),
        value: b"{\"vers".to_vec(),
    };
    store.engine().submit(Transaction::new().op(damage)).unwrap();
    let e = layer.bucket_info("photos").await.unwrap_err();
    assert!(matches!(&e, LayerError::Corrupt(w) if w.contains("bucket record of bucket photos is damaged")), "{e:?}");
    let future = Op::SetAttr {
        coll: sys,
        name: b"bucket/photos\0".to_vec(),
        key: b"bucket".to_vec(),
        value: br#"{"version":9,"created_unix_ms":1}"#.to_vec(),
    };
    store.engine().submit(Transaction::new().op(future)).unwrap();
    let e = layer.list_buckets().await.unwrap_err();
    assert!(matches!(&e, LayerError::Corrupt(w) if w.contains("has version 9")), "{e:?}");
    layer.shutdown().await.unwrap();
}

/// A drive written before names carried locators (bucket records "bucket/<b>", uploads "<b>/<id>", parts
/// "<b>/<id>/<n>"): opening the layer renames them once, and the bucket and its upload work as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_of_an_older_build_are_renamed_at_open() {
    let mut dirs = Vec::new();
    let store = drive(&mut dirs);
    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    let id = layer.create_multipart("bkt", "big", PutOptions::default()).await.unwrap();
    let part = layer.upload_part("bkt", "big", &id, 1, body(b"part one", 3)).await.unwrap();
    drop(layer);
    // Back to the older names, and no marker: as an older build left the drive.
    let snap = store.snapshot();
    let (sys, mpu) = (snap.collection("sys").await.unwrap().unwrap(), snap.collection("mpu").await.unwrap().unwrap());
    let older = |name: &[u8]| name[..name.iter().position(|&b| b == 0).unwrap()].to_vec();
    let mut txn = mosaic_store::Txn::new();
    for (coll, prefix) in [(sys, &b"bucket/"[..]), (mpu, &b"bkt/"[..])] {
        for e in snap.list_entries(&coll, prefix, prefix, 100).await.unwrap() {
            let to = older(&e.name);
            txn.push(mosaic_store::Op::Rename { coll, from: e.name, to_coll: coll, to });
        }
    }
    assert_eq!(txn.ops.len(), 3, "the bucket record, the upload record and its part");
    let marker = mosaic_store::with_locator(b"upgrade/names-with-locators", b"");
    txn.push(mosaic_store::Op::Remove { coll: sys, name: marker });
    store.commit(txn).await.unwrap();
    drop(snap);
    assert!(store.snapshot().lookup(&sys, b"bucket/bkt").await.unwrap().is_some());

    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    assert_eq!(layer.bucket_info("bkt").await.unwrap().name, "bkt");
    let uploads = layer.list_uploads("bkt", "").await.unwrap();
    assert_eq!((uploads.len(), uploads[0].upload_id.as_str()), (1, id.as_str()));
    let done = vec![CompletePart { part_number: 1, etag: part.etag.clone() }];
    layer.complete_multipart("bkt", "big", &id, done, &Precondition::default(), Vec::new()).await.unwrap();
    let got = layer.get_object("bkt", "big", None, None, None, &Precondition::default()).await.unwrap();
    assert_eq!(got.meta.size_bytes, 8);
    assert!(store.snapshot().lookup(&sys, b"bucket/bkt").await.unwrap().is_none(), "renamed, not copied");
    // Once renamed, a reopen finds the marker and renames nothing.
    drop(layer);
    let layer = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    layer.delete_object("bkt", "big", None).await.unwrap();
    layer.delete_bucket("bkt").await.unwrap();
    layer.shutdown().await.unwrap();
}

/// Two layers over one store, as two nodes of a cluster: one enables versioning, and the other, which
/// had read the bucket as unversioned, keeps the overwritten version once its cached record has expired
/// (here at once); with no expiry it would still overwrite in place.
#[tokio::test]
async fn a_bucket_record_changed_by_another_layer_is_read_again_after_its_ttl() {
    let mut dirs = Vec::new();
    let store = drive(&mut dirs);
    let fresh = SemanticsConfig { bucket_state_ttl: Some(std::time::Duration::ZERO), ..Default::default() };
    let a = S3Semantics::open(store.clone(), fresh).await.unwrap();
    let b = S3Semantics::open(store.clone(), SemanticsConfig::default()).await.unwrap();
    a.create_bucket("bkt", None).await.unwrap();
    a.put_object("bkt", "k", body(b"one", 3), PutOptions::default()).await.unwrap();
    assert_eq!(a.bucket_info("bkt").await.unwrap().versioning, Versioning::Unversioned);
    b.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    a.put_object("bkt", "k", body(b"two", 3), PutOptions::default()).await.unwrap();
    let versions = a.list_object_versions("bkt", &VersionQuery { max_keys: 100, ..Default::default() }).await.unwrap();
    assert_eq!(versions.versions.len(), 2, "the overwritten version was kept");
    a.shutdown().await.unwrap();
}

/// A switch refuses calls as unavailable until it holds a layer, then serves each call from the layer it
/// holds when the call starts.
#[tokio::test]
async fn a_switch_serves_from_the_layer_it_holds() {
    let mut dirs = Vec::new();
    let switch = Switch::new("no cluster map yet");
    assert!(!switch.is_ready());
    let e = switch.list_buckets().await.unwrap_err();
    assert_eq!(e, LayerError::Unavailable("no cluster map yet".into()));
    let first = Arc::new(S3Semantics::open(drive(&mut dirs), SemanticsConfig::default()).await.unwrap());
    assert!(switch.set(first.clone()).is_none());
    switch.create_bucket("one", None).await.unwrap();
    let second = Arc::new(S3Semantics::open(drive(&mut dirs), SemanticsConfig::default()).await.unwrap());
    assert!(switch.set(second.clone()).is_some());
    switch.create_bucket("two", None).await.unwrap();
    let names = |l: Vec<BucketInfo>| l.into_iter().map(|b| b.name).collect::<Vec<_>>();
    assert_eq!(names(first.list_buckets().await.unwrap()), ["one"]);
    assert_eq!(names(switch.list_buckets().await.unwrap()), ["two"]);
    switch.shutdown().await.unwrap();
    assert!(matches!(switch.list_buckets().await, Err(LayerError::Unavailable(_))));
    first.shutdown().await.unwrap();
}

/// Many changes of one bucket's settings at once all land (each re-read and applied again when another
/// landed first), the last one winning: none is refused as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_of_a_bucket_record_all_land() {
    let mut dirs = Vec::new();
    let layer = Arc::new(S3Semantics::open(drive(&mut dirs), SemanticsConfig::default()).await.unwrap());
    layer.create_bucket("bkt", None).await.unwrap();
    let changes = (0..50u32).map(|i| {
        let layer = layer.clone();
        tokio::spawn(async move { layer.put_bucket_tags("bkt", vec![("n".into(), i.to_string())]).await })
    });
    for done in futures::future::join_all(changes).await {
        done.unwrap().unwrap();
    }
    let tags = layer.bucket_info("bkt").await.unwrap().tags;
    assert_eq!(tags.len(), 1);
    layer.shutdown().await.unwrap();
}

/// An upload of S3's most parts (10,000) completes and reads back, plain and encrypted. Their sizes in the
/// metadata record (about 80 KB of JSON) once made it larger than an attribute may be, so the completion
/// failed; past 1,000 parts they are kept in an attribute of their own. The drive's database lives in
/// /dev/shm where there is one (30,000 small commits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_of_10000_parts_completes_and_reads() {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let engine =
        Engine::format(dir.path(), Arc::new(SimDevice::new(256 << 20)), EngineConfig::default()).expect("format");
    let cfg = SemanticsConfig {
        sse_keys: Some(mosaic_layer::testing::test_sse_keys()),
        min_part_bytes: 1,
        ..Default::default()
    };
    let layer = S3Semantics::open(Arc::new(DriveStore::new(engine)), cfg).await.unwrap();
    mosaic_layer::testing::uploads_of_many_parts(&layer, MAX_PARTS, true).await;
    layer.shutdown().await.unwrap();
}
