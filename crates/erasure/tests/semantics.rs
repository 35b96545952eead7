//! The semantics suite on erasure sets of 1+0, 2+1 and 4+2 drives: S3 behaves exactly as on one drive.

mod common;

use common::*;
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, SimDevice};
use mosaic_erasure::ErasureSet;
use mosaic_layer::testing::run_suite;
use std::sync::Arc;

/// Runs the suite on fresh sets of `k`+`m` drives.
async fn suite(k: usize, m: usize) {
    suite_with(k, m, mosaic_erasure::LAZY_ENCODE_MIN_BYTES).await
}

async fn suite_with(k: usize, m: usize, lazy_encode_min_bytes: u64) {
    let mut dirs = Vec::new();
    let rt = tokio::runtime::Handle::current();
    run_suite(|| {
        let mut members = Vec::new();
        for _ in 0..k + m {
            let dir = tempfile::tempdir().unwrap();
            let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(DRIVE_BYTES)), engine_config()).unwrap();
            members.push(Some(Arc::new(DriveStore::new(engine))));
            dirs.push(dir);
        }
        // A small threshold runs the background workers, so that lazy sync races the suite's requests.
        let background = lazy_encode_min_bytes == 1;
        let cfg =
            mosaic_erasure::SetConfig { lazy_encode_min_bytes, heal_in_background: background, ..set_config(k, m) };
        let set = tokio::task::block_in_place(|| rt.block_on(ErasureSet::open(cfg, members))).unwrap();
        Arc::new(set)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_one_drive_as_a_set() {
    suite(1, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_a_2_plus_1_set() {
    suite(2, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_on_a_4_plus_2_set() {
    suite(4, 2).await;
}

/// With tails encoded on the request path (the ablation of lazy sync), and with lazy sync encoding any
/// whole stripe (in the background, while the suite runs): the same semantics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantics_suite_holds_however_tails_are_encoded() {
    suite_with(2, 1, 0).await;
    suite_with(2, 1, 1).await;
}
