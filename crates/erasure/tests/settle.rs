//! Which undecided writes a set settles at open (`Settle`): a set that shares its drives with writers on
//! other nodes settles none, or only writes older than a grace period; a single node's set settles all.

mod common;

use common::*;
use mosaic_erasure::{ErasureSet, SetConfig, Settle};
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::{ObjectLayer, PutOptions, S3Semantics, SemanticsConfig};
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

/// Settling at open never undoes a write that the drives which did not answer could hold at a write
/// quorum: on a 2+1 set, a write made while drive 2 was away reached drives 0 and 1 (a quorum: it may have
/// been acknowledged) and the writer stopped before its outcome. Opened with drive 1 away and drive 2
/// back, only drive 0 holds it; undoing it there would leave drive 1's shard alone, below k for good. It
/// stays undecided, and is kept once drive 1 answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_missing_drives_could_hold_is_not_undone() {
    use mosaic_store::{Op, Snapshot, Store, Txn};
    let t = TestSet::new(2, 1).await;
    let all = t.set.members();
    let without = |slot: usize| all.iter().enumerate().map(|(d, m)| m.clone().filter(|_| d != slot)).collect();
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    let degraded = ErasureSet::open(set_config(2, 1), without(2)).await.unwrap();
    let coll = degraded.snapshot().collection("c").await.unwrap().unwrap();
    let data = pattern(7, 100_000);
    degraded.arm_crash_after_commits(1);
    let write = Op::Write { coll, name: b"k".to_vec(), offset: 0, data: data.clone() };
    assert!(degraded.commit(Txn::new().op(write)).await.is_err(), "the writer stopped");
    drop(degraded);

    let counts = |c: &mosaic_erasure::SetCounters| {
        [&c.writes_kept_at_open, &c.writes_undone_at_open, &c.writes_left_undecided_at_open].map(|n| n.load(Relaxed))
    };
    let reopened = ErasureSet::open(set_config(2, 1), without(1)).await.unwrap();
    assert_eq!(counts(reopened.counters()), [0, 0, 1], "left undecided, not undone");
    drop(reopened);

    let whole = ErasureSet::open(set_config(2, 1), all).await.unwrap();
    assert_eq!(counts(whole.counters()), [1, 0, 0], "kept once drive 1 answers");
    let snap = whole.snapshot();
    let c = snap.collection("c").await.unwrap().unwrap();
    let info = snap.lookup(&c, b"k").await.unwrap().expect("the write stands");
    assert_eq!(snap.read(&info.obj, 0, 100_000).await.unwrap().as_ref(), data);
}
