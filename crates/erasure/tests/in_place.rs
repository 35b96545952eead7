//! Reads of a set whose drives have a page cache (file devices, as in production): the k data shards are
//! read straight into their places in the object's bytes (`Snapshot::read_into`), checked there and kept
//! verified, never mapped into the process. Every range of objects with and without a tail reads back
//! exactly; a data shard damaged on its drive is served around and the object queued for heal.

mod common;

use common::engine_config;
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, FileDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::*;
use std::sync::Arc;

const DRIVE_BYTES: u64 = 64 << 20;

/// A k + m set of drives on files in `dir`, with the drives' engines.
async fn file_set(
    dir: &std::path::Path,
    k: usize,
    m: usize,
    cfg: EngineConfig,
) -> (ErasureSet<DriveStore>, Vec<Engine>) {
    let (mut members, mut engines) = (Vec::new(), Vec::new());
    for d in 0..k + m {
        let dev = FileDevice::create(&dir.join(format!("drive{d}")), DRIVE_BYTES).unwrap();
        let engine = Engine::format(&dir.join(format!("kv{d}")), Arc::new(dev), cfg.clone()).unwrap();
        engines.push(engine.clone());
        members.push(Some(Arc::new(DriveStore::new(engine))));
    }
    let set = ErasureSet::open(SetConfig::new(SetGeometry::new(k, m).unwrap()), members).await.unwrap();
    (set, engines)
}

/// A GET as a client's (foreground work: what it reads is kept verified).
async fn get(l: &impl ObjectLayer, key: &str, range: Option<(u64, u64)>) -> LayerResult<Vec<u8>> {
    let range = range.map(|(first, last)| RangeRequest::FromTo { first, last: Some(last) });
    mosaic_store::in_foreground(async {
        let got = l.get_object("bkt", key, None, range, None, &Precondition::default()).await?;
        let mut out = Vec::new();
        let mut b = got.body;
        while let Some(c) = futures::StreamExt::next(&mut b).await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    })
    .await
}

/// Whole stripes only, whole stripes and a tail, and more than one GET chunk.
const SIZES: [usize; 4] = [1 << 20, (1 << 20) + 5_000, (3 << 20) + 16_384 + 17, 6 << 20];

async fn filled(set: &ErasureSet<DriveStore>) -> (S3Semantics<ErasureSet<DriveStore>>, Vec<Vec<u8>>) {
    let l = S3Semantics::open(Arc::new(set.clone()), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let mut objects = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        let data = pattern(i as u64 + 1, *size);
        l.put_object("bkt", &format!("o{i}"), body(&data, 64 << 10), PutOptions::default()).await.unwrap();
        objects.push(data);
    }
    (l, objects)
}

fn degraded_reads(set: &ErasureSet<DriveStore>) -> u64 {
    set.counters().degraded_reads.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_read_in_place_give_every_range_exactly_kept_verified_and_never_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let (set, engines) = file_set(dir.path(), 4, 2, engine_config()).await;
    let (l, objects) = filled(&set).await;
    let mapped_before: u64 = engines.iter().map(|e| e.stats().mapped_bytes_read).sum();
    for round in 0..2 {
        for (i, data) in objects.iter().enumerate() {
            let key = format!("o{i}");
            assert_eq!(get(&l, &key, None).await.unwrap(), *data, "{key}, round {round}");
            let n = data.len() as u64;
            for (first, last) in [(0, 0), (1, 70_000), (16_383, 16_384 * 3), (n - 20_000, n - 1), (n / 3, n - 2)] {
                let got = get(&l, &key, Some((first, last))).await.unwrap();
                assert_eq!(got, data[first as usize..=last as usize], "{key} bytes {first}-{last}");
            }
        }
    }
    let kept: u64 = engines.iter().map(|e| e.stats().verified_cache_bytes).sum();
    let verified: u64 = engines.iter().map(|e| e.stats().verified_bytes_read).sum();
    assert!(kept > 0 && verified > 0, "large shard reads were kept verified ({kept}) and served again ({verified})");
    let mapped: u64 = engines.iter().map(|e| e.stats().mapped_bytes_read).sum();
    assert_eq!(mapped, mapped_before, "no shard read was mapped into the process");
    assert_eq!(degraded_reads(&set), 0);
    assert!(engines.iter().all(|e| e.stats().checksum_errors == 0));
}

/// Nothing kept verified here: a test that changes the file under the page cache changes kept pages too,
/// which no drive's own damage does (the device under the cache is what decays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_shard_damaged_under_an_in_place_read_is_served_around() {
    let dir = tempfile::tempdir().unwrap();
    let (set, engines) = file_set(dir.path(), 4, 2, EngineConfig { verified_cache_bytes: 0, ..engine_config() }).await;
    let (l, objects) = filled(&set).await;
    for (i, data) in objects.iter().enumerate() {
        assert_eq!(get(&l, &format!("o{i}"), None).await.unwrap(), *data, "o{i}");
    }
    assert_eq!(degraded_reads(&set), 0);
    // Damage every data block of drive 1's file (as its page cache shows it).
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("drive1")).unwrap();
    for block in 16..DRIVE_BYTES / 4096 {
        f.write_all_at(&[0xa5], block * 4096 + 7).unwrap();
    }
    for (i, data) in objects.iter().enumerate() {
        assert_eq!(get(&l, &format!("o{i}"), None).await.unwrap(), *data, "o{i} around the damage");
    }
    assert!(degraded_reads(&set) > 0);
    assert!(engines[1].stats().checksum_errors > 0, "the damage was found by its checksums");
}
