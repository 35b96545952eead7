//! Lazy sync of tails on erasure sets (paper 001 carried to erasure coding): appends only add to an
//! object's tail on its m + 1 holders; once the tail holds enough, its whole stripes are encoded in the
//! background, and the object reads back the same, with any m drives failed, before and after. An encoding
//! that fewer than a write quorum of drives commit is undone, and the tail it replaced is back, byte for
//! byte. With encoding on the request path (the ablation) the same holds.

mod common;

use common::*;
use mosaic_erasure::ErasureSet;
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::*;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

const APPEND_BYTES: usize = 2048;

async fn layer(t: &TestSet) -> S3Semantics<ErasureSet<mosaic_drive::DriveStore>> {
    S3Semantics::open(Arc::new(t.set.clone()), SemanticsConfig::default()).await.unwrap()
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

/// Appends `n` pieces of 2 KiB to `key` (created empty when `data` is); returns what it holds.
async fn append(l: &impl ObjectLayer, key: &str, mut data: Vec<u8>, n: usize, seed: u64) -> Vec<u8> {
    if data.is_empty() {
        l.put_object("bkt", key, body(b"", 1), PutOptions::default()).await.unwrap();
    }
    for i in 0..n {
        let piece = pattern(seed + i as u64, APPEND_BYTES);
        let opts = PutOptions { write_offset: Some(data.len() as u64), ..Default::default() };
        l.put_object("bkt", key, body(&piece, APPEND_BYTES), opts).await.unwrap();
        data.extend_from_slice(&piece);
    }
    data
}

fn config(k: usize, m: usize, lazy_min: u64) -> mosaic_erasure::SetConfig {
    mosaic_erasure::SetConfig { lazy_encode_min_bytes: lazy_min, ..set_config(k, m) }
}

/// Every choice of m failed drives (the first m, the last m) still reads `data` back.
async fn reads_with_m_failed(t: &TestSet, l: &impl ObjectLayer, key: &str, data: &[u8]) {
    let (k, m) = (t.cfg.geometry.data, t.cfg.geometry.parity);
    for failed in [(0..m).collect::<Vec<_>>(), (k..k + m).collect()] {
        for &d in &failed {
            t.devices[d].set_failing(true);
        }
        assert!(get(l, key).await.unwrap() == data, "{key} reads back with drives {failed:?} failed");
        for &d in &failed {
            t.devices[d].set_failing(false);
            t.reopen_drive(d).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_gather_in_the_tail_and_lazy_sync_encodes_its_whole_stripes() {
    let t = TestSet::with_config(config(4, 2, 64 << 10)).await;
    let stripe = t.cfg.geometry.stripe_bytes() as usize;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    // Below the threshold nothing is queued; past it the object is.
    let data = append(&l, "log", Vec::new(), 31, 1).await;
    assert_eq!(t.set.encode_backlog(), 0, "62 KiB of tail is below 64 KiB");
    let data = append(&l, "log", data, 20, 100).await;
    assert_eq!(t.set.encode_backlog(), 1);
    assert_eq!(t.set.encode_tails_now(10).await, 1);
    let progress = t.set.heal_progress();
    let encoded = progress.encoded_bytes.load(Relaxed);
    assert_eq!(encoded as usize, data.len() / stripe * stripe, "every whole stripe of the tail, no more");
    assert_eq!(progress.encoded_objects.load(Relaxed), 1);
    assert!(get(&l, "log").await.unwrap() == data);
    assert_eq!(
        l.head_object("bkt", "log", None, &Precondition::default()).await.unwrap().size_bytes,
        data.len() as u64
    );
    reads_with_m_failed(&t, &l, "log", &data).await;
    // Appends go on after the encoded stripes; a second sync encodes the new whole stripes.
    let data = append(&l, "log", data, 40, 1000).await;
    assert_eq!(t.set.encode_tails_now(10).await, 1);
    assert_eq!(progress.encoded_bytes.load(Relaxed) as usize, data.len() / stripe * stripe);
    assert!(get(&l, "log").await.unwrap() == data);
    // Ranges across the encoded part and the tail.
    let mid = data.len() / 2;
    let r = RangeRequest::FromTo { first: mid as u64 - 5000, last: Some(mid as u64 + 70_000) };
    let got = l.get_object("bkt", "log", None, Some(r), None, &Precondition::default()).await.unwrap();
    let mut b = got.body;
    let mut out = Vec::new();
    while let Some(c) = futures::StreamExt::next(&mut b).await {
        out.extend_from_slice(&c.unwrap());
    }
    assert!(out == data[mid - 5000..=mid + 70_000], "a range across stripes and tail");
    // The body holds its drives' snapshots: let go before drives are taken out.
    drop(b);
    reads_with_m_failed(&t, &l, "log", &data).await;
    // The degraded reads above queued heal; once it ran, the drives agree on everything.
    t.heal_all().await;
    t.set.scan().await.unwrap();
    assert_eq!(t.set.heal_backlog(), 0, "every drive holds the encoded object alike");
    l.shutdown().await.unwrap();
}

/// An encoding that fewer than a write quorum of drives commit (half the drives lose power after staging
/// their shard) is undone on the drives that did: holders get their tail back from the copy they kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoding_too_few_drives_commit_is_undone_and_the_tail_is_back() {
    for crashed in [[0usize, 1, 2], [3, 4, 5], [1, 3, 5]] {
        let t = TestSet::with_config(config(4, 2, 16 << 10)).await;
        let l = layer(&t).await;
        l.create_bucket("bkt", None).await.unwrap();
        let data = append(&l, "log", Vec::new(), 40, 7).await;
        assert_eq!(t.set.encode_backlog(), 1);
        for &d in &crashed {
            t.devices[d].arm_crash(1, mosaic_engine::CrashMode::DropUnflushed);
        }
        t.set.encode_tails_now(10).await;
        assert_eq!(t.set.heal_progress().encoded_bytes.load(Relaxed), 0, "{crashed:?}: not encoded");
        for &d in &crashed {
            t.devices[d].crash(mosaic_engine::CrashMode::DropUnflushed);
            t.devices[d].revive();
            t.reopen_drive(d).await;
        }
        assert!(get(&l, "log").await.unwrap() == data, "{crashed:?}: the tail reads back as it was");
        reads_with_m_failed(&t, &l, "log", &data).await;
        // And the next sync, with every drive up, encodes it.
        let data = append(&l, "log", data, 1, 99).await;
        assert_eq!(t.set.encode_tails_now(10).await, 1);
        assert!(t.set.heal_progress().encoded_bytes.load(Relaxed) > 0);
        assert!(get(&l, "log").await.unwrap() == data, "{crashed:?}");
        l.shutdown().await.unwrap();
    }
}

/// The ablation: each stripe encoded by the append that fills it (reading the stripe's earlier bytes back
/// on the request path). Same bytes, nothing queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_encoding_on_the_request_path_appends_read_back_the_same() {
    let t = TestSet::with_config(config(4, 2, 0)).await;
    let l = layer(&t).await;
    l.create_bucket("bkt", None).await.unwrap();
    let data = append(&l, "log", Vec::new(), 50, 3).await;
    assert_eq!(t.set.encode_backlog(), 0);
    assert!(get(&l, "log").await.unwrap() == data);
    reads_with_m_failed(&t, &l, "log", &data).await;
    l.shutdown().await.unwrap();
}
