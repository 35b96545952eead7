//! Which undecided writes a set settles at open (`Settle`): a set that shares its drives with writers on
//! other nodes settles none, or only writes older than a grace period; a single node's set settles all.

mod common;

use common::*;
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, SetConfig, Settle};
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::{ObjectLayer, PutOptions, S3Semantics, SemanticsConfig};
use mosaic_store::{Op, Snapshot, Store, Txn};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_settling_instance_settles_and_only_what_is_old_enough() {
    let t = TestSet::new(2, 1).await;
    let members = t.set.members();
    let layer = S3Semantics::open(Arc::new(t.set), SemanticsConfig::default()).await.unwrap();
    layer.create_bucket("bkt", None).await.unwrap();
    // The writer stops between its drive transactions and their outcome: the write's undo entries stay.
    layer.store().arm_crash_after_commits(1);
    let cut = layer.put_object("bkt", "k", body(&pattern(1, 100_000), 65_536), PutOptions::default()).await;
    assert!(cut.is_err(), "the writer stopped");

    let open = |settle: Settle| {
        let members = members.clone();
        async move { ErasureSet::open(SetConfig { settle_at_open: settle, ..set_config(2, 1) }, members).await.unwrap() }
    };
    let settled = |set: &ErasureSet<_>| {
        set.counters().writes_kept_at_open.load(Relaxed) + set.counters().writes_undone_at_open.load(Relaxed)
    };
    // Another node's instance leaves the write alone; so does the owner while the write is young.
    assert_eq!(settled(&open(Settle::Never).await), 0);
    assert_eq!(settled(&open(Settle::OlderThan(Duration::from_secs(3600))).await), 0);
    // Old enough (here: any age) it is settled: it holds on every drive, so it stands.
    let owner = open(Settle::OlderThan(Duration::ZERO)).await;
    assert_eq!(owner.counters().writes_kept_at_open.load(Relaxed), 1);
    // Settled once: the entries are gone, a later open finds nothing.
    drop(owner);
    assert_eq!(settled(&open(Settle::All).await), 0);
}

/// A set's settling at open as counted: writes kept, undone, and left undecided.
fn outcomes(c: &mosaic_erasure::SetCounters) -> [u64; 3] {
    [&c.writes_kept_at_open, &c.writes_undone_at_open, &c.writes_left_undecided_at_open].map(|n| n.load(Relaxed))
}

/// Writes `data` to object `k` of collection `c` through `set`, whose writer stops between the write's
/// drive transactions and their outcome: the write's undo entries stay on the drives that took it.
async fn write_cut_short(set: &ErasureSet<DriveStore>, data: &[u8]) {
    let coll = set.snapshot().collection("c").await.unwrap().unwrap();
    set.arm_crash_after_commits(1);
    let write = Op::Write { coll, name: b"k".to_vec(), offset: 0, data: data.to_vec() };
    assert!(set.commit(Txn::new().op(write)).await.is_err(), "the writer stopped");
}

/// Object `k` of collection `c` through `set`, read whole (`len` bytes); it must be there.
async fn read_k(set: &ErasureSet<DriveStore>, len: u64) -> Vec<u8> {
    let snap = set.snapshot();
    let c = snap.collection("c").await.unwrap().unwrap();
    let info = snap.lookup(&c, b"k").await.unwrap().expect("the write stands");
    snap.read(&info.obj, 0, len).await.unwrap().to_vec()
}

/// A newly formatted drive (its directory kept by the caller).
fn new_drive() -> (tempfile::TempDir, Arc<DriveStore>) {
    let (dir, dev) = (drive_dir(), mosaic_engine::SimDevice::new(DRIVE_BYTES));
    let engine = mosaic_engine::Engine::format(dir.path(), Arc::new(dev), engine_config()).unwrap();
    (dir, Arc::new(DriveStore::new(engine)))
}

/// Settling at open never undoes a write that the drives which did not answer could hold at a write
/// quorum: on a 2+1 set, a write made while drive 2 was away reached drives 0 and 1 (a quorum: it may have
/// been acknowledged) and the writer stopped before its outcome. Opened with drive 1 away and drive 2
/// back, only drive 0 holds it; undoing it there would leave drive 1's shard alone, below k for good. It
/// stays undecided, and is kept once drive 1 answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_missing_drives_could_hold_is_not_undone() {
    let t = TestSet::new(2, 1).await;
    let all = t.set.members();
    let without = |slot: usize| all.iter().enumerate().map(|(d, m)| m.clone().filter(|_| d != slot)).collect();
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let data = pattern(7, 100_000);
    write_cut_short(&ErasureSet::open(set_config(2, 1), without(2)).await.unwrap(), &data).await;

    let reopened = ErasureSet::open(set_config(2, 1), without(1)).await.unwrap();
    assert_eq!(outcomes(reopened.counters()), [0, 0, 1], "left undecided, not undone");
    drop(reopened);

    let whole = ErasureSet::open(set_config(2, 1), all).await.unwrap();
    assert_eq!(outcomes(whole.counters()), [1, 0, 0], "kept once drive 1 answers");
    assert_eq!(read_k(&whole, 100_000).await, data);
}

/// A drive put in a slot since a write was made was never sent the write, so its lack of it says nothing
/// of whether the write was acknowledged. On a 2+2 set (write quorum 3), a write made while drive 3 was
/// away reached drives 0, 1 and 2 (a quorum: it may have been acknowledged) and the writer stopped before
/// its outcome. Drive 2 then fails for good: opened with drive 3 back, the write stays undecided. A newly
/// formatted drive put in slot 2 lacks the write; counted as a drive the write failed on, it would take
/// the write below its quorum and undo it on drives 0 and 1, which hold k shards of it. It stays
/// undecided, heal rebuilds it on drives 2 and 3, and the next open keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_put_in_since_a_write_does_not_count_against_it() {
    let t = TestSet::new(2, 2).await;
    let all = t.set.members();
    let without = |slot: usize| all.iter().enumerate().map(|(d, m)| m.clone().filter(|_| d != slot)).collect();
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let data = pattern(9, 100_000);
    write_cut_short(&ErasureSet::open(set_config(2, 2), without(3)).await.unwrap(), &data).await;

    let reopened = ErasureSet::open(set_config(2, 2), without(2)).await.unwrap();
    assert_eq!(outcomes(reopened.counters()), [0, 0, 1], "left undecided while drive 2 may come back");
    let (_dir, new_drive) = new_drive();
    reopened.attach_drive(2, new_drive.clone()).await.unwrap();
    assert_eq!(outcomes(reopened.counters()), [0, 0, 2], "still undecided with a new drive in slot 2");
    assert_eq!(read_k(&reopened, 100_000).await, data);
    while reopened.heal_backlog() > 0 && reopened.heal_now(64).await > 0 {}
    drop(reopened);

    let mut healed = all.clone();
    healed[2] = Some(new_drive);
    let whole = ErasureSet::open(set_config(2, 2), healed.clone()).await.unwrap();
    assert_eq!(outcomes(whole.counters()), [1, 0, 0], "kept once heal put it on every drive");
    assert_eq!(read_k(&whole, 100_000).await, data);
    // Drives 0 and 1 alone: the rebuilt shards on 2 and 3 read it too.
    drop(whole);
    let mut rebuilt = healed;
    rebuilt[0] = None;
    rebuilt[1] = None;
    let cfg = SetConfig { settle_at_open: Settle::Never, ..set_config(2, 2) };
    assert_eq!(read_k(&ErasureSet::open(cfg, rebuilt).await.unwrap(), 100_000).await, data);
}

/// The same for a cluster group's step with k = m (issue 16): a 1+1 group keeps slot 0 and fills a new
/// drive in slot 1. A write made in the step's window, after the fill's last round, goes to the set served
/// (the kept drive and the one the step leaves: its quorum) and its writer stops before its outcome. The
/// stepped set holds it on the kept drive only; settling there must not count the new drive, which was
/// never sent it, against it. It stays undecided until heal puts it on the new drive, then it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_a_steps_window_is_not_undone_on_the_stepped_set() {
    let t = TestSet::with_config(SetConfig { kept_drives: Some(0b01), ..set_config(1, 1) }).await;
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let (_dir, filled) = new_drive();
    let stepped_members = vec![t.set.members()[0].clone(), Some(filled)];
    let fill_cfg =
        SetConfig { decided_by: Some(0b01), heal_removes: false, settle_at_open: Settle::Never, ..set_config(1, 1) };
    let filling = ErasureSet::open(fill_cfg, stepped_members.clone()).await.unwrap();
    filling.scan().await.unwrap();
    while filling.heal_backlog() > 0 && filling.heal_now(64).await > 0 {}
    drop(filling);

    let data = pattern(11, 40_000);
    write_cut_short(&t.set, &data).await;

    let open_stepped = || {
        let members = stepped_members.clone();
        let cfg = SetConfig { read_fast_path: false, settle_at_open: Settle::All, ..set_config(1, 1) };
        async move { ErasureSet::open(cfg, members).await.unwrap() }
    };
    let owner = open_stepped().await;
    assert_eq!(outcomes(owner.counters()), [0, 0, 1], "left undecided, not undone");
    assert_eq!(read_k(&owner, 40_000).await, data);
    owner.scan().await.unwrap();
    while owner.heal_backlog() > 0 && owner.heal_now(64).await > 0 {}
    drop(owner);
    let owner = open_stepped().await;
    assert_eq!(outcomes(owner.counters()), [1, 0, 0], "kept once the new drive holds it");
    drop(owner);
    // The new drive alone reads it.
    let alone = vec![None, stepped_members[1].clone()];
    let cfg = SetConfig { settle_at_open: Settle::Never, ..set_config(1, 1) };
    assert_eq!(read_k(&ErasureSet::open(cfg, alone).await.unwrap(), 40_000).await, data);
}
