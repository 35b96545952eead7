//! Failed drives as operating conditions: with up to m drives failed every read and write works and reads
//! return exact bytes; past m, reads and writes fail cleanly and nothing is damaged; drives that come back
//! and replaced drives are healed; flipped bits are detected, served around and rebuilt; a write that
//! fewer than a quorum commit is undone.

mod common;

use common::*;
use mosaic_erasure::ErasureSet;
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::*;
use mosaic_store::Store;
use std::sync::Arc;

const SIZES: [usize; 8] = [0, 100, 16 * 1024, 20_000, 100_000, 262_144, (3 << 20) + 17, 5 << 20];

async fn layer(t: &TestSet) -> S3Semantics<ErasureSet<mosaic_drive::DriveStore>> {
    S3Semantics::open(Arc::new(t.set.clone()), SemanticsConfig::default()).await.unwrap()
}

async fn put(l: &impl ObjectLayer, key: &str, data: &[u8]) -> LayerResult<ObjectMeta> {
    l.put_object("bkt", key, body(data, 64 << 10), PutOptions::default()).await
}

async fn get(l: &impl ObjectLayer, key: &str) -> LayerResult<Vec<u8>> {
    let got = l.get_object("bkt", key, None, None, None, &Precondition::default()).await?;
    let mut out = Vec::new();
    let mut b = got.body;
    while let Some(c) = futures::StreamExt::next(&mut b).await {
        out.extend_from_slice(&c?);
    }
    Ok(out)
}

/// Writes one object of every size; returns their keys and contents.
async fn fill(l: &impl ObjectLayer, prefix: &str, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        let key = format!("{prefix}-{size}");
        let data = pattern(seed + i as u64, *size);
        put(l, &key, &data).await.unwrap();
        out.push((key, data));
    }
    out
}

async fn check_all(l: &impl ObjectLayer, objects: &[(String, Vec<u8>)]) {
    for (key, data) in objects {
        assert_eq!(get(l, key).await.unwrap_or_else(|e| panic!("{key}: {e:?}")), *data, "{key}");
    }
    let page = l.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    for (key, data) in objects {
        let o = page.objects.iter().find(|o| o.key == *key).unwrap_or_else(|| panic!("{key} is listed"));
        assert_eq!(o.size_bytes, data.len() as u64, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_m_drives_failed_everything_works_and_past_m_fails_cleanly() {
    let t = TestSet::new(4, 2).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let mut objects = fill(&l, "before", 1).await;
    t.devices[1].set_failing(true);
    t.devices[4].set_failing(true);
    check_all(&l, &objects).await;
    // Writes, overwrites, deletes and multipart go on with two drives down.
    objects.extend(fill(&l, "during", 100).await);
    objects[0].1 = pattern(7, 70_000);
    put(&l, &objects[0].0, &objects[0].1).await.unwrap();
    let gone = objects.remove(3);
    l.delete_object("bkt", &gone.0, None).await.unwrap();
    check_all(&l, &objects).await;
    assert_eq!(get(&l, &gone.0).await, Err(LayerError::NoSuchKey));
    assert!(t.set.counters().partial_writes.load(std::sync::atomic::Ordering::Relaxed) > 0);
    // A third failure: reads of encoded objects and writes that need the devices are refused as
    // unavailable; objects kept whole in every drive's metadata still read (their bytes are intact). Never
    // wrong bytes, never a panic.
    t.devices[0].set_failing(true);
    for (key, data) in &objects {
        match get(&l, key).await {
            Ok(got) => assert!(got == *data && data.len() <= 16 * 1024, "{key}"),
            Err(e) => assert!(matches!(e, LayerError::Unavailable(_)) && data.len() > 16 * 1024, "{key}: {e:?}"),
        }
    }
    assert!(matches!(put(&l, "refused", &pattern(9, 1 << 20)).await, Err(LayerError::Unavailable(_))));
    assert!(!t.set.is_ready(), "three drives failed writes: no write quorum");
    // The drives come back (reopened) and heal brings them up to date: then any two others may fail.
    for d in [0, 1, 4] {
        t.devices[d].set_failing(false);
        t.reopen_drive(d).await;
    }
    assert!(t.set.is_ready());
    check_all(&l, &objects).await;
    t.heal_all().await;
    assert_eq!(t.set.heal_backlog(), 0);
    t.devices[2].set_failing(true);
    t.devices[5].set_failing(true);
    check_all(&l, &objects).await;
    assert_eq!(
        get(&l, &gone.0).await,
        Err(LayerError::NoSuchKey),
        "a drive that missed the delete does not bring it back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bits_are_detected_served_around_and_rebuilt() {
    let t = TestSet::new(4, 2).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let objects = fill(&l, "obj", 11).await;
    // Flip bytes all over drive 3's data area: every shard there that is hit fails its checksum.
    for i in 0..4000u64 {
        t.devices[3].corrupt_byte((1 << 20) + (i * 7919 * 4096 + i * 131) % (24 << 20));
    }
    check_all(&l, &objects).await;
    let degraded = t.set.counters().degraded_reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(degraded > 0, "damaged shards were read around");
    assert!(t.set.heal_backlog() > 0, "and queued for heal");
    // Damaged parity is never read by a healthy read: the deep scan reads every shard and finds it.
    let scanned = t.set.scan_deep().await.unwrap();
    assert!(scanned >= objects.len() as u64);
    t.heal_all().await;
    // Drive 3 holds good shards again: with two other drives failed, everything still reads.
    t.devices[0].set_failing(true);
    t.devices[1].set_failing(true);
    check_all(&l, &objects).await;
}

/// Rebuilding a replaced drive reads k of the other holders' shards: a damaged one is read around (the
/// next holder in its place) and rebuilt by the same heal; damage on a holder the rebuild did not read is
/// left to the deep scan, after which every shard is good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heal_that_rebuilds_a_replaced_drive_reads_around_damaged_shards() {
    let mut t = TestSet::new(4, 2).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let objects = fill(&l, "obj", 31).await;
    for i in 0..4000u64 {
        t.devices[3].corrupt_byte((1 << 20) + (i * 7919 * 4096 + i * 131) % (24 << 20));
    }
    t.replace_drive(2).await;
    t.heal_all().await;
    assert_eq!(t.set.counters().degraded_reads.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing read yet");
    // The replaced drive's shards were rebuilt from good sources only: with drive 3 (damaged) and another
    // failed, everything reads from the other four, drive 2 among them.
    t.devices[3].set_failing(true);
    t.devices[0].set_failing(true);
    check_all(&l, &objects).await;
    t.devices[3].set_failing(false);
    t.devices[0].set_failing(false);
    // The deep scan finds what the rebuild did not read; then drives 2 and 3 both hold good shards: with
    // two others failed, everything reads.
    t.set.scan_deep().await.unwrap();
    t.heal_all().await;
    t.devices[0].set_failing(true);
    t.devices[1].set_failing(true);
    check_all(&l, &objects).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_drive_is_rebuilt_by_heal() {
    let mut t = TestSet::new(4, 2).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    l.create_bucket("empty", None).await.unwrap();
    let objects = fill(&l, "obj", 21).await;
    t.replace_drive(2).await;
    // Reads work at once (the new drive holds nothing yet); heal fills it.
    check_all(&l, &objects).await;
    t.heal_all().await;
    let healed = t.set.heal_progress().healed_objects.load(std::sync::atomic::Ordering::Relaxed);
    assert!(healed >= objects.len() as u64, "{healed}");
    // A multipart upload through the layer's collection handles, taken before the drive was replaced:
    // its parts and the object reach the new drive too.
    let id = l.create_multipart("bkt", "mpu", PutOptions::default()).await.unwrap();
    let parts = [pattern(5, 5 << 20), pattern(6, 70_000)];
    let mut completes = Vec::new();
    for (i, d) in parts.iter().enumerate() {
        let p = l.upload_part("bkt", "mpu", &id, i as u32 + 1, body(d, 1 << 20)).await.unwrap();
        completes.push(CompletePart { part_number: p.part_number, etag: format!("\"{}\"", p.etag) });
    }
    l.complete_multipart("bkt", "mpu", &id, completes, &Precondition::default(), Vec::new()).await.unwrap();
    let mut objects = objects;
    objects.push(("mpu".to_string(), parts.concat()));
    t.devices[0].set_failing(true);
    t.devices[1].set_failing(true);
    check_all(&l, &objects).await;
    assert!(l.list_buckets().await.unwrap().iter().any(|b| b.name == "empty"), "the new drive has the empty bucket");
}

/// A rebuild of large objects keeps several steps in flight (reads and decoding, and writes to the new
/// drive) while no foreground work is: each step's shard lands at its own offset, which the rebuilt drive
/// proves by serving every read with two other drives failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_are_rebuilt_with_steps_in_flight() {
    let mut t = TestSet::new(4, 2).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let mut objects = Vec::new();
    for (i, size) in [(13 << 20) + 4097, 24 << 20, (9 << 20) - 1].into_iter().enumerate() {
        let key = format!("large-{i}");
        let data = pattern(40 + i as u64, size);
        put(&l, &key, &data).await.unwrap();
        objects.push((key, data));
    }
    t.replace_drive(1).await;
    t.heal_all().await;
    let healed = t.set.heal_progress().healed_bytes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(healed >= (13 + 24 + 8) << 18, "a quarter of the objects' stripes rebuilt: {healed}");
    let deepest = t.set.heal_progress().steps_read_at_once_max.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(deepest, 3, "with nothing else in flight, a rebuild reads three steps at once");
    t.devices[0].set_failing(true);
    t.devices[3].set_failing(true);
    check_all(&l, &objects).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fewer_than_a_quorum_commit_is_undone() {
    let t = TestSet::new(2, 1).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let old = pattern(1, 300_000);
    put(&l, "k", &old).await.unwrap();
    // Two of three drives lose power after staging their shards: their commit fails, one drive commits.
    for d in [0, 2] {
        t.devices[d].arm_crash(1, mosaic_engine::CrashMode::DropUnflushed);
    }
    let e = put(&l, "k", &pattern(2, 300_000)).await.unwrap_err();
    assert!(matches!(e, LayerError::Unavailable(_)), "{e:?}");
    assert!(t.set.counters().failed_writes.load(std::sync::atomic::Ordering::Relaxed) > 0);
    for d in [0, 2] {
        t.devices[d].revive();
        t.reopen_drive(d).await;
    }
    assert_eq!(get(&l, "k").await.unwrap(), old, "the old object stands on every drive");
    // Drive 1, which committed, was put back: with any other drive down the old object reads.
    t.devices[0].set_failing(true);
    assert_eq!(get(&l, "k").await.unwrap(), old);
}

/// A drive that missed a delete (it was failing) comes back still holding the object: whichever m drives
/// fail next, the object is never served or listed again, and heal removes it from that drive. This holds
/// without tombstones because a committed delete reached a write quorum, so the drives that missed it are
/// never a read quorum (at most m < k; at most m - 1 when k = m). While the stale drive is among only k
/// survivors, the object is absent where its one copy plus the failed drives are fewer than a write quorum
/// (no acknowledged version can be that rare: 4+2), and refused (503) where they are not (2+2, 2+1: an
/// object written while the delete's drives were down would look the same); never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_a_drive_missed_is_not_undone_by_it() {
    for (k, m) in [(4, 2), (2, 2), (2, 1)] {
        let t = TestSet::new(k, m).await;
        let l = layer(&t).await;
        l.create_bucket("bkt", None).await.unwrap();
        let small = pattern(1, 100);
        let big = pattern(2, 300_000);
        put(&l, "small", &small).await.unwrap();
        put(&l, "big", &big).await.unwrap();
        put(&l, "kept", &small).await.unwrap();
        let stale = k + m - 1;
        t.devices[stale].set_failing(true);
        l.delete_object("bkt", "small", None).await.unwrap();
        l.delete_object("bkt", "big", None).await.unwrap();
        t.devices[stale].set_failing(false);
        t.reopen_drive(stale).await;
        // Any other drives fail, up to m in all with the stale one counted among the survivors.
        let fail: Vec<usize> = (0..m).collect();
        for &d in &fail {
            t.devices[d].set_failing(true);
        }
        let write_quorum = k + usize::from(k == m);
        let certain = 1 + m < write_quorum;
        for key in ["small", "big"] {
            let e = get(&l, key).await.unwrap_err();
            match certain {
                true => assert!(matches!(e, LayerError::NoSuchKey), "{k}+{m} {key}: {e:?}"),
                false => {
                    assert!(matches!(e, LayerError::NoSuchKey | LayerError::Unavailable(_)), "{k}+{m} {key}: {e:?}")
                }
            }
        }
        let page = l.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await;
        if let Ok(page) = page {
            assert!(page.objects.iter().all(|o| o.key == "kept"), "{k}+{m}: a deleted object is listed");
        }
        for &d in &fail {
            t.devices[d].set_failing(false);
            t.reopen_drive(d).await;
        }
        t.heal_all().await;
        assert_deleted(&l, &format!("{k}+{m}"), &small).await;
        // Heal took the object off the stale drive: the drives that applied the delete may fail now.
        let applied: Vec<usize> = (0..k + m).filter(|d| *d != stale).take(m).collect();
        for &d in &applied {
            t.devices[d].set_failing(true);
        }
        assert_deleted(&l, &format!("{k}+{m}"), &small).await;
        for &d in &applied {
            t.devices[d].set_failing(false);
        }
    }
}

/// "small" and "big" read as absent and are not listed; "kept" lists and reads.
async fn assert_deleted(l: &impl ObjectLayer, set: &str, kept: &[u8]) {
    for key in ["small", "big"] {
        let e = get(l, key).await.unwrap_err();
        assert!(matches!(e, LayerError::NoSuchKey), "{set} {key}: {e:?}");
    }
    let page = l.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    let keys: Vec<&str> = page.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["kept"], "{set}");
    assert_eq!(get(l, "kept").await.unwrap(), kept, "{set}");
}

/// A set made with `heal_removes: false` (a cluster group's next set, filled before it is served: what it
/// lacks may be whole on the set served) rebuilds but never takes an object off the drives that hold it,
/// even where a quorum of its own drives lacks it; the same set with removals takes it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_that_only_rebuilds_keeps_what_a_quorum_lacks() {
    use mosaic_erasure::Healed;
    use mosaic_store::{Op, Snapshot, Txn};
    for removes in [false, true] {
        let t = TestSet::with_config(mosaic_erasure::SetConfig { heal_removes: removes, ..set_config(2, 1) }).await;
        t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
        let coll = t.set.snapshot().collection("c").await.unwrap().unwrap();
        let write = |name: &str| Txn::new().op(Op::Create { coll: coll.clone(), name: name.as_bytes().to_vec() });
        t.set.commit(write("o")).await.unwrap();
        // After the removal the last drive holds "o" again as it was (as a drive the set does not see
        // whole would: what a group's next set lacks of an object the set served holds).
        let stale = 2;
        let drive = t.set.members()[stale].clone().unwrap();
        let snap = drive.snapshot();
        let c = snap.collection("c").await.unwrap().unwrap();
        let info = snap.lookup(&c, b"o").await.unwrap().unwrap();
        let attrs = snap.attrs(&info.obj, b"", 100).await.unwrap();
        t.set.commit(Txn::new().op(Op::Remove { coll: coll.clone(), name: b"o".to_vec() })).await.unwrap();
        let mut plant = Txn::new().op(Op::Create { coll: c, name: b"o".to_vec() });
        for (key, value) in attrs {
            plant = plant.op(Op::SetAttr { coll: c, name: b"o".to_vec(), key, value });
        }
        drive.commit(plant).await.unwrap();
        let healed = t.set.heal_object("c", b"o").await.unwrap();
        let snap = drive.snapshot();
        let held = snap.lookup(&c, b"o").await.unwrap().is_some();
        assert_eq!((healed == Healed::Nothing, held), (!removes, !removes), "heal_removes: {removes}");
        assert!(t.set.snapshot().lookup(&coll, b"o").await.unwrap().is_none(), "absent either way");
    }
}

/// The set that fills a cluster group's next set decides from the drives the step keeps
/// (`SetConfig::decided_by`): they took every write and delete of the group. Shown on a 2+2 set whose step
/// keeps slots 0 and 1 and fills slots 2 and 3: an object the fill copied before a delete (held by the new
/// drives only) is a tie of two against two, which a decision from all drives calls present and rebuilds
/// on the kept drives, the deleted object back where the group is served. Decided by the kept drives, it
/// is taken off the new ones; what the kept drives hold is still rebuilt there, and a copy already alike is
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_decides_from_the_kept_drives_so_a_copy_never_outvotes_a_delete() {
    use mosaic_erasure::Healed;
    use mosaic_store::{Op, Snapshot, Txn};
    for decided_by in [None, Some(0b0011)] {
        let cfg = mosaic_erasure::SetConfig { heal_removes: false, decided_by, ..set_config(2, 2) };
        let t = TestSet::with_config(cfg).await;
        t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
        let coll = t.set.snapshot().collection("c").await.unwrap().unwrap();
        for name in ["deleted", "lacking", "alike"] {
            let data = pattern(name.len() as u64, 40_000);
            let write = Op::Write { coll: coll.clone(), name: name.as_bytes().to_vec(), offset: 0, data };
            t.set.commit(Txn::new().op(write)).await.unwrap();
        }
        // The delete reached the kept drives (through the set served); the new ones lack "lacking" (written
        // after the fill's last look at it).
        let drive_remove = |slot: usize, name: &'static str| {
            let drive = t.set.members()[slot].clone().unwrap();
            async move {
                let c = drive.snapshot().collection("c").await.unwrap().unwrap();
                drive.commit(Txn::new().op(Op::Remove { coll: c, name: name.as_bytes().to_vec() })).await.unwrap();
            }
        };
        for slot in [0, 1] {
            drive_remove(slot, "deleted").await;
        }
        for slot in [2, 3] {
            drive_remove(slot, "lacking").await;
        }
        let deleted = t.set.heal_object("c", b"deleted").await.unwrap();
        let back = t.set.snapshot().lookup(&coll, b"deleted").await.unwrap().is_some();
        match decided_by {
            None => assert_eq!((deleted, back), (Healed::Drives(2), true), "the copies outvote the delete"),
            Some(_) => assert_eq!((deleted, back), (Healed::Drives(2), false), "the copies are taken off"),
        }
        for slot in 0..4 {
            let drive = t.set.members()[slot].clone().unwrap();
            let c = drive.snapshot().collection("c").await.unwrap().unwrap();
            let held = drive.snapshot().lookup(&c, b"deleted").await.unwrap().is_some();
            assert_eq!(held, decided_by.is_none(), "drive {slot}, decided by {decided_by:?}");
        }
        if decided_by.is_some() {
            assert_eq!(t.set.heal_object("c", b"lacking").await.unwrap(), Healed::Drives(2));
            assert_eq!(t.set.heal_object("c", b"alike").await.unwrap(), Healed::Nothing);
            // Every drive holds both now: the set reads them with two drives gone, either two.
            for gone in [[0, 1], [2, 3]] {
                let members = (0..4).map(|d| t.set.members()[d].clone().filter(|_| !gone.contains(&d))).collect();
                // Settling nothing: with two drives gone the undo logs of the writes above cannot be decided.
                let cfg =
                    mosaic_erasure::SetConfig { settle_at_open: mosaic_erasure::Settle::Never, ..set_config(2, 2) };
                let rest = ErasureSet::open(cfg, members).await.unwrap();
                let snap = rest.snapshot();
                let c = snap.collection("c").await.unwrap().unwrap();
                for name in ["lacking", "alike"] {
                    let info = snap.lookup(&c, name.as_bytes()).await.unwrap().expect("held");
                    let bytes = snap.read(&info.obj, 0, 40_000).await.unwrap();
                    assert_eq!(bytes.as_ref(), pattern(name.len() as u64, 40_000), "{name} without drives {gone:?}");
                }
            }
        }
    }
}

/// A drive that failed to give a collection's handle when it was looked up, and answers again later, is
/// asked again: with another drive down, counting it absent would leave reads without their quorum (a
/// 2+1 set whose first lookup caught one node away and whose reads then caught another), and a write
/// through the old handle must reach it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_that_failed_a_collection_lookup_is_asked_again() {
    use mosaic_store::{Op, Snapshot, Txn};
    use std::sync::atomic::Ordering;
    let (members, faults, _drives) = flaky_drives(3);
    let set = ErasureSet::open(set_config(2, 1), members).await.unwrap();
    set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let coll = set.snapshot().collection("c").await.unwrap().unwrap();
    set.commit(Txn::new().op(Op::Write { coll, name: b"o".to_vec(), offset: 0, data: b"first".to_vec() }))
        .await
        .unwrap();

    faults[2].collections.store(true, Ordering::SeqCst);
    let snap = set.snapshot();
    let coll = snap.collection("c").await.unwrap().expect("two of three drives give the collection");
    faults[2].collections.store(false, Ordering::SeqCst);
    faults[0].lookups.store(true, Ordering::SeqCst);
    let found = snap.lookup(&coll, b"o").await.expect("drive 2 is asked again: two of three agree");
    assert_eq!(found.map(|i| i.size_bytes), Some(5));

    // A write through the handle taken without drive 2 reaches drive 2: with drive 1 down afterwards, the
    // object reads from drives 0 and 2.
    faults[0].lookups.store(false, Ordering::SeqCst);
    set.commit(Txn::new().op(Op::Write {
        coll: coll.clone(),
        name: b"o".to_vec(),
        offset: 5,
        data: b"+second".to_vec(),
    }))
    .await
    .unwrap();
    faults[1].lookups.store(true, Ordering::SeqCst);
    let snap = set.snapshot();
    let info = snap.lookup(&coll, b"o").await.expect("drives 0 and 2 agree").expect("the object");
    assert_eq!(snap.read(&info.obj, 0, 64).await.unwrap().as_ref(), b"first+second");
}

/// While a cluster group moves a step, a write must also reach the drives the step keeps
/// (`SetConfig::kept_drives`): once the step is served the drives it left are gone, and a write that a
/// quorum took only with their help would have fewer than k shards left. Shown on a 2+1 set whose step
/// replaces slot 2: the same failure (the kept drive 0 down) that the quorum alone accepts and then loses
/// is refused with the rule, and everything the rule acknowledged reads back from the step's set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moving_group_acknowledges_a_write_only_where_the_step_keeps_it() {
    let kept = 0b011;
    let t = TestSet::with_config(mosaic_erasure::SetConfig { kept_drives: Some(kept), ..set_config(2, 1) }).await;
    let moving = layer(&t).await;
    moving.create_bucket("bkt", None).await.unwrap();
    let all_up = pattern(1, 100_000);
    put(&moving, "all-up", &all_up).await.unwrap();
    // The drive the step leaves may fail: the kept drives hold the write.
    t.devices[2].set_failing(true);
    let leaving_down = pattern(2, 20_000);
    put(&moving, "leaving-down", &leaving_down).await.unwrap();
    t.devices[2].set_failing(false);
    t.reopen_drive(2).await;
    // The quorum alone: a set of the same drives without the rule.
    let plain_set = ErasureSet::open(set_config(2, 1), t.set.members()).await.unwrap();
    let plain = S3Semantics::open(Arc::new(plain_set), SemanticsConfig::default()).await.unwrap();
    assert_eq!(get(&plain, "all-up").await.unwrap(), all_up);
    // A kept drive down: drives 1 and 2 are a write quorum, but only one of them stays. The rule refuses
    // the write; the quorum alone acknowledges it.
    t.devices[0].set_failing(true);
    let refused = put(&moving, "kept-down", &pattern(3, 20_000)).await;
    assert!(matches!(refused, Err(LayerError::Unavailable(_))), "{refused:?}");
    put(&plain, "quorum-only", &pattern(4, 20_000)).await.unwrap();
    drop(plain);
    t.devices[0].set_failing(false);
    t.reopen_drive(0).await;

    // The step is served: slot 2 is a new, empty drive (its heal has not run yet) and the old one is gone.
    let (new_devices, new_dirs) = formatted_drives(1);
    let engine =
        mosaic_engine::Engine::open(new_dirs[0].path(), Arc::new(new_devices[0].clone()), engine_config()).unwrap();
    let mut members = t.set.members();
    members[2] = Some(Arc::new(mosaic_drive::DriveStore::new(engine)));
    let stepped_set = ErasureSet::open(set_config(2, 1), members).await.unwrap();
    let stepped = S3Semantics::open(Arc::new(stepped_set), SemanticsConfig::default()).await.unwrap();
    assert_eq!(get(&stepped, "all-up").await.unwrap(), all_up);
    assert_eq!(get(&stepped, "leaving-down").await.unwrap(), leaving_down);
    assert_eq!(get(&stepped, "kept-down").await, Err(LayerError::NoSuchKey), "the refused write was undone");
    // What the quorum alone acknowledged has one shard left where the group is served, and two drives
    // without it: an acknowledged write answers 404, lost.
    assert_eq!(get(&stepped, "quorum-only").await, Err(LayerError::NoSuchKey));
}

/// A moving group's kept drives commit a write before the others do: a write refused because too few kept
/// drives took it never reaches the drive the step leaves. Committed in parallel, it reached a read quorum
/// (the leaving drive and a kept one) before its undo, so a reader could see it and then see it gone (a
/// cluster's single-key history caught that while a node of a moving group was down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_kept_drives_refuse_never_reaches_the_others() {
    use mosaic_store::{ErrorKind, Op, Snapshot, Txn};
    use std::sync::atomic::Ordering;
    let (members, faults, _drives) = flaky_drives(3);
    let cfg = mosaic_erasure::SetConfig { kept_drives: Some(0b011), ..set_config(2, 1) };
    let set = ErasureSet::open(cfg, members).await.unwrap();
    set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let coll = set.snapshot().collection("c").await.unwrap().unwrap();
    let write = |name: &[u8]| Op::Write { coll: coll.clone(), name: name.to_vec(), offset: 0, data: b"data".to_vec() };
    set.commit(Txn::new().op(write(b"first"))).await.unwrap();
    let leaving_before = faults[2].committed.load(Ordering::SeqCst);
    assert!(leaving_before > 0, "the leaving drive takes writes the kept drives took");

    // Kept drive 0 fails its commits: drive 1 takes the write alone, one of the two kept drives needed.
    faults[0].commits.store(true, Ordering::SeqCst);
    let refused = set.commit(Txn::new().op(write(b"refused"))).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.kind == ErrorKind::Unavailable),
        "too few kept drives took it: {refused:?}"
    );
    assert_eq!(faults[2].committed.load(Ordering::SeqCst), leaving_before, "the leaving drive never saw it");
    faults[0].commits.store(false, Ordering::SeqCst);

    // Read without kept drive 0: drives 1 (undone) and 2 (never written) agree the object is absent.
    faults[0].lookups.store(true, Ordering::SeqCst);
    let snap = set.snapshot();
    assert!(snap.lookup(&coll, b"refused").await.unwrap().is_none(), "the refused write is nowhere");
    let info = snap.lookup(&coll, b"first").await.unwrap().expect("two of three drives agree on the object");
    assert_eq!(snap.read(&info.obj, 0, 64).await.unwrap().as_ref(), b"data");
}

/// A follower whose step is armed or not as a test says, and that counts the writes under way.
#[derive(Default)]
struct SwitchedFollower {
    armed: std::sync::atomic::AtomicBool,
    under_way: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts a write under way until dropped.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl mosaic_erasure::RemovalFollower for SwitchedFollower {
    fn begin(
        &self,
        _removes: bool,
    ) -> futures::future::BoxFuture<'_, mosaic_store::StoreResult<mosaic_erasure::WriteBegun>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.under_way.fetch_add(1, SeqCst);
        let under_way = Box::new(Counted(self.under_way.clone()));
        Box::pin(std::future::ready(Ok(mosaic_erasure::WriteBegun { under_way, armed: self.armed.load(SeqCst) })))
    }

    fn removed<'a>(
        &'a self,
        _coll: &'a str,
        _name: &'a [u8],
    ) -> futures::future::BoxFuture<'a, mosaic_store::StoreResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// With a follower, the kept drives' rule holds only for the writes it arms (a move waiting its turn
/// costs its group's writes nothing): with kept drive 0 failing, a 2+1 write that drives 1 and 2 take is
/// acknowledged while unarmed and refused once armed; every write is under way from its beginning to its
/// end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_drives_rule_holds_only_for_armed_writes() {
    use mosaic_store::{ErrorKind, Op, Snapshot, Txn};
    use std::sync::atomic::Ordering::SeqCst;
    let (members, faults, _drives) = flaky_drives(3);
    let follower = Arc::new(SwitchedFollower::default());
    let cfg = mosaic_erasure::SetConfig {
        kept_drives: Some(0b011),
        removal_follower: Some(follower.clone()),
        ..set_config(2, 1)
    };
    let set = ErasureSet::open(cfg, members).await.unwrap();
    set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let coll = set.snapshot().collection("c").await.unwrap().unwrap();
    let write = |name: &[u8]| Op::Write { coll: coll.clone(), name: name.to_vec(), offset: 0, data: b"data".to_vec() };
    faults[0].commits.store(true, SeqCst);
    set.commit(Txn::new().op(write(b"unarmed"))).await.expect("unarmed: a write quorum is enough");
    assert_eq!(follower.under_way.load(SeqCst), 0, "the write ended");
    follower.armed.store(true, SeqCst);
    let refused = set.commit(Txn::new().op(write(b"armed"))).await;
    assert!(refused.as_ref().is_err_and(|e| e.kind == ErrorKind::Unavailable), "armed: {refused:?}");
    assert_eq!(follower.under_way.load(SeqCst), 0, "the refused write ended too");
    faults[0].commits.store(false, SeqCst);
    set.commit(Txn::new().op(write(b"armed"))).await.expect("the kept drives take it");
}

/// After a k = m group's step is served, a write made after the fill's last round is on the kept drives
/// alone (k of 2k), and the new drives hold the copy the fill made before it, or nothing. A lookup's fast
/// path asks the k drives of the name's data shards and takes their answer when they agree, so it may ask
/// the new drives only and read the old bytes of an acknowledged overwrite, or miss an acknowledged new
/// object (a cluster test saw the first). With the fast path off (`SetConfig::read_fast_path`, as a
/// cluster sets it where k = m) every drive is asked and the newest version wins the tie; and a heal of
/// the stepped set (what the rebalancer runs once the last step is served) puts the writes on the new
/// drive too, so they read without the kept drive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_k_equals_m_step_every_lookup_asks_every_drive() {
    const KEYS: usize = 12;
    let t = TestSet::with_config(mosaic_erasure::SetConfig { kept_drives: Some(0b01), ..set_config(1, 1) }).await;
    let moving = layer(&t).await;
    moving.create_bucket("bkt", None).await.unwrap();
    for i in 0..KEYS {
        put(&moving, &format!("k{i}"), &pattern(i as u64, 30_000)).await.unwrap();
    }
    // The step keeps slot 0 and fills a new drive in slot 1 from it.
    let (new_devices, new_dirs) = formatted_drives(1);
    let engine =
        mosaic_engine::Engine::open(new_dirs[0].path(), Arc::new(new_devices[0].clone()), engine_config()).unwrap();
    let new_drive = Arc::new(mosaic_drive::DriveStore::new(engine));
    let stepped_members = vec![t.set.members()[0].clone(), Some(new_drive)];
    let fill_cfg = mosaic_erasure::SetConfig {
        decided_by: Some(0b01),
        heal_removes: false,
        settle_at_open: mosaic_erasure::Settle::Never,
        ..set_config(1, 1)
    };
    let filling = ErasureSet::open(fill_cfg, stepped_members.clone()).await.unwrap();
    filling.scan().await.unwrap();
    while filling.heal_backlog() > 0 && filling.heal_now(64).await > 0 {}
    drop(filling);
    // After the fill's last round, through the set served: every key overwritten, new keys written.
    let mut model = std::collections::BTreeMap::new();
    for i in 0..KEYS {
        let (old, new) = (format!("k{i}"), format!("new{i}"));
        let (overwrite, fresh) = (pattern(100 + i as u64, 20_000), pattern(200 + i as u64, 10_000));
        put(&moving, &old, &overwrite).await.unwrap();
        put(&moving, &new, &fresh).await.unwrap();
        model.insert(old, overwrite);
        model.insert(new, fresh);
    }
    drop(moving);
    let open_stepped = |read_fast_path: bool| {
        let members = stepped_members.clone();
        // Settling nothing: the undo logs' recent entries are of writes decided on the set served, which a
        // settle on this set (without its drive left) would count short of their quorum.
        let settle_at_open = mosaic_erasure::Settle::Never;
        let cfg = mosaic_erasure::SetConfig { read_fast_path, settle_at_open, ..set_config(1, 1) };
        async move {
            let set = Arc::new(ErasureSet::open(cfg, members).await.unwrap());
            (set.clone(), S3Semantics::open(set, SemanticsConfig::default()).await.unwrap())
        }
    };
    // The fast path reads some keys wrong: their data shard's drive is the new one.
    let (_, fast) = open_stepped(true).await;
    let mut wrong = 0;
    for (key, data) in &model {
        wrong += usize::from(get(&fast, key).await.ok().as_ref() != Some(data));
    }
    assert!(wrong > 0, "some key's data shard lies on the new drive");
    drop(fast);
    let (set, every) = open_stepped(false).await;
    for (key, data) in &model {
        assert!(get(&every, key).await.as_ref() == Ok(data), "{key} asking every drive");
    }
    // Healed, the new drive holds every write: it reads them alone.
    set.scan().await.unwrap();
    while set.heal_backlog() > 0 && set.heal_now(64).await > 0 {}
    drop(every);
    drop(set);
    let alone = vec![None, stepped_members[1].clone()];
    let cfg = mosaic_erasure::SetConfig { settle_at_open: mosaic_erasure::Settle::Never, ..set_config(1, 1) };
    let alone = S3Semantics::open(Arc::new(ErasureSet::open(cfg, alone).await.unwrap()), SemanticsConfig::default())
        .await
        .unwrap();
    for (key, data) in &model {
        assert!(get(&alone, key).await.as_ref() == Ok(data), "{key} on the new drive alone");
    }
}

/// A set refuses a kept-drives rule that names a slot it does not have or keeps fewer than k drives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_must_keep_k_drives_of_the_set() {
    let t = TestSet::new(2, 1).await;
    for kept in [0b001, 0b1011, 0] {
        let cfg = mosaic_erasure::SetConfig { kept_drives: Some(kept), ..set_config(2, 1) };
        let refused = ErasureSet::open(cfg, t.set.members()).await.err().map(|e| e.kind);
        assert_eq!(refused, Some(mosaic_store::ErrorKind::InvalidArgument), "{kept:#b}");
    }
    let cfg = mosaic_erasure::SetConfig { kept_drives: Some(0b110), ..set_config(2, 1) };
    assert!(ErasureSet::open(cfg, t.set.members()).await.is_ok(), "k drives kept");
}

/// Shared locks as a test sets them: refused, or held with their lease run out; `held` counts those taken
/// and not yet released.
#[derive(Default)]
struct TestLocks {
    refuse: std::sync::atomic::AtomicBool,
    lapsed: Arc<std::sync::atomic::AtomicBool>,
    calls: std::sync::atomic::AtomicUsize,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

struct TestHeld {
    lapsed: Arc<std::sync::atomic::AtomicBool>,
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for TestHeld {
    fn drop(&mut self) {
        self.held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl mosaic_erasure::HeldShared for TestHeld {
    fn holds(&self) -> bool {
        !self.lapsed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn renew(&mut self) -> futures::future::BoxFuture<'_, mosaic_store::StoreResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

impl mosaic_erasure::SharedLocks for TestLocks {
    fn lock(
        &self,
        keys: Vec<u64>,
    ) -> futures::future::BoxFuture<'_, mosaic_store::StoreResult<Box<dyn mosaic_erasure::HeldShared>>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            assert!(!keys.is_empty());
            self.calls.fetch_add(1, SeqCst);
            if self.refuse.load(SeqCst) {
                return Err(mosaic_store::StoreError::unavailable("held by another node"));
            }
            self.held.fetch_add(1, SeqCst);
            let held = TestHeld { lapsed: self.lapsed.clone(), held: self.held.clone() };
            Ok(Box::new(held) as Box<dyn mosaic_erasure::HeldShared>)
        })
    }
}

/// A set whose drives other processes write too (`SetConfig::shared_locks`, a cluster's nodes) takes the
/// shared locks for every write, changes nothing when they are refused, and begins no commit once their
/// lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_commits_only_under_its_shared_locks() {
    use std::sync::atomic::Ordering::SeqCst;
    let locks = Arc::new(TestLocks::default());
    let cfg = mosaic_erasure::SetConfig { shared_locks: Some(locks.clone()), ..set_config(2, 1) };
    let t = TestSet::with_config(cfg).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let first = pattern(1, 40_000);
    put(&l, "o", &first).await.unwrap();
    let calls = locks.calls.load(SeqCst);
    assert!(calls >= 2, "the bucket and the object were written under shared locks: {calls}");

    locks.refuse.store(true, SeqCst);
    let refused = put(&l, "o", &pattern(2, 30_000)).await;
    assert!(matches!(refused, Err(LayerError::Unavailable(_))), "{refused:?}");
    assert!(matches!(put(&l, "new", b"x").await, Err(LayerError::Unavailable(_))));
    locks.refuse.store(false, SeqCst);

    locks.lapsed.store(true, SeqCst);
    let late = put(&l, "o", &pattern(3, 30_000)).await;
    assert!(matches!(late, Err(LayerError::Unavailable(_))), "{late:?}");
    locks.lapsed.store(false, SeqCst);

    assert_eq!(get(&l, "o").await.unwrap(), first, "no refused write changed the object");
    assert_eq!(get(&l, "new").await, Err(LayerError::NoSuchKey));
    let second = pattern(4, 30_000);
    put(&l, "o", &second).await.unwrap();
    assert_eq!(get(&l, "o").await.unwrap(), second);
}

/// A follower of removals that notes, for each name it is told of, whether the shared locks were held then.
struct LockNotingFollower {
    locks: Arc<TestLocks>,
    seen: std::sync::Mutex<Vec<(Vec<u8>, bool)>>,
}

impl mosaic_erasure::RemovalFollower for LockNotingFollower {
    fn begin(
        &self,
        _removes: bool,
    ) -> futures::future::BoxFuture<'_, mosaic_store::StoreResult<mosaic_erasure::WriteBegun>> {
        Box::pin(std::future::ready(Ok(mosaic_erasure::WriteBegun { under_way: Box::new(()), armed: true })))
    }

    fn removed<'a>(
        &'a self,
        _coll: &'a str,
        name: &'a [u8],
    ) -> futures::future::BoxFuture<'a, mosaic_store::StoreResult<()>> {
        let held = self.locks.held.load(std::sync::atomic::Ordering::SeqCst) > 0;
        self.seen.lock().unwrap().push((name.to_vec(), held));
        Box::pin(async { Ok(()) })
    }
}

/// A removal is followed while the write still holds its locks: a cluster's heal or a step's fill of the
/// name (on another node, under the shared locks) cannot act between the delete and its follow, when the
/// drives a step keeps lack the name and its new drives may still hold a copy that would tie with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_is_followed_under_the_writes_locks() {
    use std::sync::atomic::Ordering::SeqCst;
    let locks = Arc::new(TestLocks::default());
    let follower = Arc::new(LockNotingFollower { locks: locks.clone(), seen: Default::default() });
    let cfg = mosaic_erasure::SetConfig {
        shared_locks: Some(locks.clone()),
        removal_follower: Some(follower.clone()),
        ..set_config(1, 1)
    };
    let t = TestSet::with_config(cfg).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    put(&l, "o", &pattern(1, 40_000)).await.unwrap();
    assert!(follower.seen.lock().unwrap().is_empty(), "a write that removes nothing is not followed");
    l.delete_object("bkt", "o", None).await.unwrap();
    let seen = follower.seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the delete was followed");
    assert!(seen.iter().all(|(_, held)| *held), "every removal was followed under the locks: {seen:?}");
    assert_eq!(locks.held.load(SeqCst), 0, "and the locks were released after it");
    assert_eq!(get(&l, "o").await, Err(LayerError::NoSuchKey));
}

/// A present drive that lacks a collection the set holds (it missed the creation, as a drive a move fills
/// can) gets it at the next write: a 1+1 set, whose writes need both drives, writes again at once instead
/// of refusing until a heal scan runs, and the drive then serves the object alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_gives_a_drive_the_collection_it_lacks() {
    use mosaic_store::{Op, Snapshot, Store, Txn};
    let t = TestSet::new(1, 1).await;
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let lacking = t.set.members()[1].clone().unwrap();
    lacking.commit(Txn::new().op(Op::RemoveCollection { name: "c".into() })).await.unwrap();
    assert!(lacking.snapshot().collection("c").await.unwrap().is_none());

    let coll = t.set.snapshot().collection("c").await.unwrap().expect("drive 0 holds it: k = 1");
    let write = Op::Write { coll: coll.clone(), name: b"o".to_vec(), offset: 0, data: b"after".to_vec() };
    t.set.commit(Txn::new().op(write)).await.expect("both drives take the write");
    let c = lacking.snapshot().collection("c").await.unwrap().expect("the drive got the collection");
    assert!(lacking.snapshot().lookup(&c, b"o").await.unwrap().is_some(), "and the object");
}

/// On a node that counts its foreground work (a cluster node: its other sets' requests and the drive
/// commands it serves for other nodes' clients), heal waits for it as it waits for its own set's
/// requests: once per `NODE_YIELD_EVERY_BYTES` rebuilt while the node is busy it waits the whole
/// `HEAL_YIELD_MAX`, and it rebuilds one step at a time. The set's
/// requests count in the node's work when a client waits for them (`in_foreground`), and only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_waits_for_the_nodes_foreground_work_and_the_sets_requests_count_in_it() {
    let work = mosaic_store::ForegroundWork::new();
    let cfg = mosaic_erasure::SetConfig { node_foreground: Some(work.clone()), ..set_config(4, 2) };
    let mut t = TestSet::with_config(cfg).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    assert_eq!(work.begun(), 0, "work no client waits for does not count on the node");
    let mut objects = mosaic_store::in_foreground(fill(&l, "obj", 41)).await;
    objects.extend(mosaic_store::in_foreground(fill(&l, "more", 42)).await);
    assert!(work.begun() >= objects.len() as u64, "a client's requests count on the node");
    assert!(!work.is_quiet(std::time::Duration::from_secs(3600)));
    assert_eq!(work.in_flight(), 0, "none left in flight");
    t.replace_drive(1).await;
    let queued = t.set.heal_backlog();
    assert!(queued >= 4, "the replaced drive's objects are queued ({queued})");
    // Another set's request in flight on the node: once heal rebuilt its budget of bytes it waits the
    // whole bound before going on.
    let busy = work.begin();
    let started = std::time::Instant::now();
    t.heal_all().await;
    let healed = t.set.heal_progress().healed_bytes.load(std::sync::atomic::Ordering::Relaxed);
    // Heal went on past its first budget (so it waited for the node at least once).
    assert!(healed >= 3 * mosaic_erasure::NODE_YIELD_EVERY_BYTES, "healed {healed} bytes");
    assert!(started.elapsed() >= mosaic_erasure::HEAL_YIELD_MAX, "healed in {:?}", started.elapsed());
    // The set itself was idle the whole time (nothing but heal read or wrote it): its node's work alone
    // keeps each rebuild to one step at a time (the 5 MiB object has two).
    let deepest = t.set.heal_progress().steps_read_at_once_max.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(deepest, 1, "a busy node's heal reads one step at a time");
    drop(busy);
    t.devices[0].set_failing(true);
    t.devices[2].set_failing(true);
    check_all(&l, &objects).await;
}

/// Objects of the GF(2^16) code (what sets wrote before GF(2^8) became the default) read back exactly
/// through a set that writes GF(2^8), with m drives missing too (each object decoded with its own code).
/// Stripes of the two codes are never joined into one object: an upload whose parts straddle the change is
/// refused with a clear error and changes nothing, and completes once its old part is uploaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_the_older_code_are_read_and_never_joined_with_the_newer() {
    use mosaic_erasure::{CODEC_REED_SOLOMON, SetConfig};
    let t = TestSet::with_config(SetConfig { codec: Some(CODEC_REED_SOLOMON), ..set_config(4, 2) }).await;
    let old = layer(&t).await;
    old.create_bucket("bkt", None).await.unwrap();
    let objects = fill(&old, "old", 31).await;
    let id = old.create_multipart("bkt", "mpu", PutOptions::default()).await.unwrap();
    let parts = [pattern(7, 5 << 20), pattern(8, 3 << 20)];
    let p1 = old.upload_part("bkt", "mpu", &id, 1, body(&parts[0], 1 << 20)).await.unwrap().etag;
    drop(old);

    // The sets opened below share their drives with `t.set`, which stays open (its cleaner may still be
    // removing the undo entries of the writes above): as guests they settle nothing at open, and their own
    // entries' removals hold whether or not another set removed an entry first.
    let guest = SetConfig { settle_at_open: mosaic_erasure::Settle::Never, ..set_config(4, 2) };
    let new_set = ErasureSet::open(guest.clone(), t.set.members()).await.unwrap();
    // On a CPU without the newer code's instructions the default stays the older code: nothing to straddle.
    let newer = mosaic_erasure::gf8_supported();
    assert_eq!(set_config(4, 2).write_codec() != CODEC_REED_SOLOMON, newer);
    let new = S3Semantics::open(Arc::new(new_set), SemanticsConfig::default()).await.unwrap();
    check_all(&new, &objects).await;
    let fresh = fill(&new, "new", 41).await;
    // Two drives missing: both codes rebuild what they lost.
    let mut members = t.set.members();
    (members[0], members[1]) = (None, None);
    let degraded_set = ErasureSet::open(guest, members).await.unwrap();
    let degraded = S3Semantics::open(Arc::new(degraded_set), SemanticsConfig::default()).await.unwrap();
    check_all(&degraded, &objects).await;
    check_all(&degraded, &fresh).await;
    drop(degraded);

    let no_precondition = Precondition::default();
    let complete = |etags: Vec<String>| {
        let parts: Vec<CompletePart> = etags
            .into_iter()
            .enumerate()
            .map(|(i, etag)| CompletePart { part_number: i as u32 + 1, etag: format!("\"{etag}\"") })
            .collect();
        new.complete_multipart("bkt", "mpu", &id, parts, &no_precondition, Vec::new())
    };
    let p2 = new.upload_part("bkt", "mpu", &id, 2, body(&parts[1], 1 << 20)).await.unwrap().etag;
    if newer {
        let refused = complete(vec![p1, p2.clone()]).await;
        assert!(
            matches!(&refused, Err(LayerError::InvalidArgument(why)) if why.contains("never of two codes")),
            "{refused:?}"
        );
        assert!(matches!(get(&new, "mpu").await, Err(LayerError::NoSuchKey)), "a refused completion writes nothing");
    }
    let p1 = new.upload_part("bkt", "mpu", &id, 1, body(&parts[0], 1 << 20)).await.unwrap().etag;
    complete(vec![p1, p2]).await.unwrap();
    assert_eq!(get(&new, "mpu").await.unwrap(), parts.concat());
    check_all(&new, &objects).await;
}

/// A store's snapshot of a set of one drive is that drive's snapshot, taken at its first use: every
/// lookup through it sees the same state (a write committed meanwhile is not seen, a new snapshot sees
/// it), and with the drive missing it answers unavailable, never absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_drive_sets_snapshot_is_its_drives_snapshot() {
    use mosaic_store::{ErrorKind, Op, Snapshot, Txn};
    let t = TestSet::new(1, 0).await;
    let write = |name: &'static str, data: Vec<u8>| {
        let set = t.set.clone();
        async move {
            let snap = set.snapshot();
            let coll = snap.collection("c").await.unwrap().unwrap();
            let name = name.as_bytes().to_vec();
            let txn = Txn::new().op(Op::Reset { coll: coll.clone(), name: name.clone() }).op(Op::Write {
                coll,
                name,
                offset: 0,
                data,
            });
            set.commit(txn).await.unwrap();
        }
    };
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    write("a", pattern(1, 100)).await;
    let before = t.set.snapshot();
    let coll = before.collection("c").await.unwrap().unwrap();
    let a = before.lookup(&coll, b"a").await.unwrap().unwrap();
    write("a", pattern(2, 300)).await;
    write("b", pattern(3, 10)).await;
    assert_eq!(before.lookup(&coll, b"a").await.unwrap().unwrap().size_bytes, 100, "the snapshot's state");
    assert!(before.lookup(&coll, b"b").await.unwrap().is_none(), "written after the snapshot");
    assert_eq!(before.read(&a.obj, 0, 1000).await.unwrap(), pattern(1, 100));
    let after = t.set.snapshot();
    let coll = after.collection("c").await.unwrap().unwrap();
    let a = after.lookup(&coll, b"a").await.unwrap().unwrap();
    assert_eq!(after.read(&a.obj, 0, 1000).await.unwrap(), pattern(2, 300));
    assert!(after.lookup(&coll, b"b").await.unwrap().is_some());

    t.set.detach_drive(0);
    let missing = t.set.snapshot();
    let e = missing.collection("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
}

/// `n` formatted drives behind `Flaky` wrappers, as set members, with their faults; the devices and
/// directories are returned to be kept alive.
#[allow(clippy::type_complexity)]
fn flaky_drives(
    n: usize,
) -> (
    Vec<Option<Arc<common::flaky::Flaky<mosaic_drive::DriveStore>>>>,
    Vec<Arc<common::flaky::Faults>>,
    (Vec<mosaic_engine::SimDevice>, Vec<tempfile::TempDir>),
) {
    use common::flaky::{Faults, Flaky};
    let (devices, dirs) = formatted_drives(n);
    let mut faults = Vec::new();
    let mut members = Vec::new();
    for (dev, dir) in devices.iter().zip(&dirs) {
        let engine = mosaic_engine::Engine::open(dir.path(), Arc::new(dev.clone()), engine_config()).unwrap();
        let f = Arc::new(Faults::default());
        members
            .push(Some(Arc::new(Flaky { inner: Arc::new(mosaic_drive::DriveStore::new(engine)), faults: f.clone() })));
        faults.push(f);
    }
    (members, faults, (devices, dirs))
}
