//! A pool of stores as one: the semantics suite on pools of drives and of erasure sets, objects spread
//! over the members by their keys, copies between members, buckets over every member.

use futures::StreamExt;
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_layer::testing::{body, pattern, run_suite};
use mosaic_layer::*;
use mosaic_pool::{Pool, member_of};
use mosaic_store::{Op, Snapshot, Store, Txn};
use std::sync::Arc;

const DRIVE_BYTES: u64 = 128 << 20;

fn engine_config() -> EngineConfig {
    EngineConfig { kv_write_buffer_bytes: 4 << 20, kv_block_cache_bytes: 8 << 20, ..Default::default() }
}

fn drive(dirs: &mut Vec<tempfile::TempDir>) -> Arc<DriveStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(DRIVE_BYTES)), engine_config()).expect("format");
    dirs.push(dir);
    Arc::new(DriveStore::new(engine))
}

fn drives_pool(n: usize, dirs: &mut Vec<tempfile::TempDir>) -> Arc<Pool<DriveStore>> {
    Arc::new(Pool::new((0..n).map(|_| drive(dirs)).collect()).expect("a pool"))
}

async fn set_of(k: usize, m: usize, dirs: &mut Vec<tempfile::TempDir>) -> Arc<ErasureSet<DriveStore>> {
    let cfg = SetConfig::new(SetGeometry::new(k, m).unwrap());
    let members = (0..k + m).map(|_| Some(drive(dirs))).collect();
    Arc::new(ErasureSet::open(cfg, members).await.expect("a set"))
}

async fn read_all<L: ObjectLayer>(l: &L, bucket: &str, key: &str) -> Vec<u8> {
    let got = l.get_object(bucket, key, None, None, None, &Precondition::default()).await.expect("the object reads");
    let mut body = got.body;
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk.expect("the body streams"));
    }
    out
}

/// Keys that live on each member of an `n`-member pool (the first `per` found for each).
fn keys_by_member(n: usize, per: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); n];
    for i in 0.. {
        let key = format!("dir/key-{i:04}");
        let m = member_of(key.as_bytes(), n);
        if out[m].len() < per {
            out[m].push(key);
        }
        if out.iter().all(|k| k.len() == per) {
            return out;
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_a_pool_of_three_drives() {
    let mut dirs = Vec::new();
    run_suite(|| drives_pool(3, &mut dirs)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_a_pool_of_two_2_plus_1_sets() {
    let mut dirs = Vec::new();
    let rt = tokio::runtime::Handle::current();
    run_suite(|| {
        let sets = tokio::task::block_in_place(|| {
            rt.block_on(async {
                let a = set_of(2, 1, &mut dirs).await;
                let b = set_of(2, 1, &mut dirs).await;
                vec![a, b]
            })
        });
        Arc::new(Pool::new(sets).expect("a pool"))
    })
    .await;
}

/// Objects land on the member their key hashes to, each member's drive holds only its own, and a listing
/// of the bucket merges them in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_live_on_the_member_of_their_key_and_list_merged() {
    let mut dirs = Vec::new();
    let pool = drives_pool(3, &mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let keys = keys_by_member(3, 5);
    for k in keys.iter().flatten() {
        l.put_object("bkt", k, body(k.as_bytes(), 7), PutOptions::default()).await.unwrap();
    }
    for (m, member_keys) in keys.iter().enumerate() {
        let snap = pool.members()[m].snapshot();
        let coll = snap.collection("b/bkt").await.unwrap().expect("every member has the bucket");
        let names: Vec<String> = snap
            .list_entries(&coll, b"", b"", 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .collect();
        let mut want = member_keys.clone();
        want.sort();
        assert_eq!(names, want, "member {m} holds exactly its keys");
    }
    let mut all: Vec<String> = keys.into_iter().flatten().collect();
    all.sort();
    let mut listed = Vec::new();
    let mut q = ListQuery { max_keys: 4, ..Default::default() };
    loop {
        let page = l.list_objects("bkt", &q).await.unwrap();
        listed.extend(page.objects.iter().map(|o| o.key.clone()));
        match page.next_marker {
            Some(m) => q.start_after = m,
            None => break,
        }
    }
    assert_eq!(listed, all, "pages of 4 walk every member's keys in order");
    l.shutdown().await.unwrap();
}

/// A copy between keys of two members copies the data (small, inline-sized, and several units with an
/// unaligned tail) and its metadata; a multipart upload lands on its key's member and completes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_between_members_and_multipart_uploads_keep_every_byte() {
    let mut dirs = Vec::new();
    let pool = drives_pool(2, &mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    l.create_bucket("other", None).await.unwrap();
    let keys = keys_by_member(2, 3);
    for (i, size) in [100usize, 20_000, 3 * 1024 * 1024 + 77].into_iter().enumerate() {
        let (src, dst) = (&keys[0][i], &keys[1][i]);
        let data = pattern(i as u64, size);
        let put = l.put_object("bkt", src, body(&data, 64 * 1024), PutOptions::default()).await.unwrap();
        let copied = l.copy_object("bkt", src, None, &Precondition::default(), "other", dst, None).await.unwrap();
        assert_eq!(copied.etag, put.etag);
        assert_eq!(read_all(&l, "other", dst).await, data, "a copy of {size} bytes between members");
        assert_eq!(l.head_object("other", dst, None, &Precondition::default()).await.unwrap().size_bytes, size as u64);
        // The source's precondition is checked on its own member.
        let stale = Precondition { if_match: Some("\"nope\"".into()), ..Default::default() };
        assert!(l.copy_object("bkt", src, None, &stale, "other", dst, None).await.is_err());
    }
    // A multipart upload of a key on member 1: its parts live there and are cloned into the object.
    let key = &keys[1][0];
    let id = l.create_multipart("bkt", key, PutOptions::default()).await.unwrap();
    let p1 = pattern(10, MIN_PART_BYTES as usize);
    let p2 = pattern(11, 1000);
    let e1 = l.upload_part("bkt", key, &id, 1, body(&p1, 1 << 20)).await.unwrap().etag;
    let e2 = l.upload_part("bkt", key, &id, 2, body(&p2, 1000)).await.unwrap().etag;
    let parts = vec![CompletePart { part_number: 1, etag: e1 }, CompletePart { part_number: 2, etag: e2 }];
    l.complete_multipart("bkt", key, &id, parts, &Precondition::default(), Vec::new()).await.unwrap();
    assert_eq!(read_all(&l, "bkt", key).await, [p1, p2].concat());
    l.shutdown().await.unwrap();
}

/// A bucket is empty only when every member's share is: deleting it is refused while a member other than
/// the home one holds an object. A member that missed the bucket's creation gets it with its first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_span_every_member() {
    let mut dirs = Vec::new();
    let pool = drives_pool(3, &mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let keys = keys_by_member(3, 1);
    l.put_object("bkt", &keys[2][0], body(b"x", 1), PutOptions::default()).await.unwrap();
    assert_eq!(l.delete_bucket("bkt").await, Err(LayerError::BucketNotEmpty));
    l.delete_object("bkt", &keys[2][0], None).await.unwrap();
    l.delete_bucket("bkt").await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.err(), Some(LayerError::NoSuchBucket));
    for m in pool.members() {
        assert!(m.snapshot().collection("b/bkt").await.unwrap().is_none(), "removed from every member");
    }

    // Member 1 misses a creation (as if it was down then): the bucket works, and member 1 gets it at its
    // first write.
    l.create_bucket("late", None).await.unwrap();
    pool.members()[1].commit(Txn::new().op(Op::RemoveCollection { name: "b/late".into() })).await.unwrap();
    drop(l);
    let pool = Arc::new(Pool::new(pool.members().to_vec()).unwrap());
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    assert_eq!(
        l.get_object("late", &keys[1][0], None, None, None, &Precondition::default()).await.err(),
        Some(LayerError::NoSuchKey)
    );
    assert!(l.list_objects("late", &ListQuery::default()).await.unwrap().objects.is_empty());
    l.put_object("late", &keys[1][0], body(b"late", 4), PutOptions::default()).await.unwrap();
    assert_eq!(read_all(&l, "late", &keys[1][0]).await, b"late");
    assert!(pool.members()[1].snapshot().collection("b/late").await.unwrap().is_some());
    l.shutdown().await.unwrap();
}

/// A pool of no members, or of members working in other units, is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_refuses_no_members_and_members_of_other_units() {
    assert!(Pool::<DriveStore>::new(Vec::new()).err().unwrap().message.contains("1 to 256 members"));
    let mut dirs = Vec::new();
    let pool = Pool::new(vec![set_of(2, 1, &mut dirs).await, set_of(4, 2, &mut dirs).await]);
    assert!(pool.err().unwrap().message.contains("other units"));
}

/// A pool that replaces another with some members changed (a cluster's new map reopens the groups it
/// moves) takes over the collection handles the old one remembered: a shared member's as it was, a changed
/// member's asked again. Not taken: a collection the changed home member lacks, and anything when more
/// than half the members changed. The new pool serves what the old one wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_pool_takes_over_the_collections_of_the_members_it_keeps() {
    let mut dirs = Vec::new();
    let old = drives_pool(3, &mut dirs);
    let l = S3Semantics::open(old.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let keys = keys_by_member(3, 1);
    for k in keys.iter().flatten() {
        l.put_object("bkt", k, body(k.as_bytes(), 7), PutOptions::default()).await.unwrap();
    }
    // The layer's own collections and the bucket's are remembered by the old pool now.
    let remembered = 3;
    let create = |name: &str| Txn::new().op(Op::CreateCollection { name: name.into() });
    let members = old.members().to_vec();

    // Member 2 changed: a new drive that has the bucket (as a move's fill makes it) but not the others.
    let fresh = drive(&mut dirs);
    fresh.commit(create("b/bkt")).await.unwrap();
    let new = Arc::new(Pool::new(vec![members[0].clone(), members[1].clone(), fresh]).unwrap());
    assert_eq!(new.take_collections_from(&old).await, remembered);
    let l = S3Semantics::open(new.clone(), SemanticsConfig::default()).await.unwrap();
    for k in &keys[0] {
        assert_eq!(read_all(&l, "bkt", k).await, k.as_bytes(), "a shared member's object");
    }
    l.put_object("bkt", &keys[2][0], body(b"again", 5), PutOptions::default()).await.unwrap();
    assert_eq!(read_all(&l, "bkt", &keys[2][0]).await, b"again", "the changed member's handle works");

    // The home member changed, to a drive that has only the bucket: the others are looked up at use.
    let home = drive(&mut dirs);
    home.commit(create("b/bkt")).await.unwrap();
    let rehomed = Pool::new(vec![home, members[1].clone(), members[2].clone()]).unwrap();
    assert_eq!(rehomed.take_collections_from(&old).await, 1);
    // Two of three changed: nothing is taken.
    let (a, b) = (drive(&mut dirs), drive(&mut dirs));
    let mostly_new = Pool::new(vec![a, b, members[2].clone()]).unwrap();
    assert_eq!(mostly_new.take_collections_from(&old).await, 0);
    l.shutdown().await.unwrap();
}
