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
