//! Crash tests across a 4+2 set and a set of one drive, on simulated devices: random S3 operations (and
//! lazy syncs of the tails that appends leave) while drives lose power at
//! different instants (each after a random number of IOs, dropping or tearing what was not flushed), and
//! the process stops at random commits before it settles their outcome (no undo, no cleanup). Then every
//! drive comes back, the set reopens (recovery settles undecided writes) and: every acknowledged write reads
//! back exactly; an unacknowledged one is wholly there or wholly absent; the listing shows exactly the
//! objects that read.
//!
//! MOSAIC_SET_CRASH_POINTS sets the number of crash points (default 1000; the long mode runs 100000).

mod common;

use common::*;
use mosaic_drive::DriveStore;
use mosaic_engine::{CrashMode, Engine};
use mosaic_erasure::ErasureSet;
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

type Layer = S3Semantics<ErasureSet<DriveStore>>;

/// What a key may hold: the acknowledged value, or either of two when a write was not acknowledged.
#[derive(Clone, Debug)]
enum Expect {
    Is(Option<Vec<u8>>),
    Either(Option<Vec<u8>>, Option<Vec<u8>>),
}

static UNDONE_AT_OPEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static KEPT_AT_OPEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn open_set(
    k: usize,
    m: usize,
    devices: &[mosaic_engine::SimDevice],
    dirs: &[tempfile::TempDir],
) -> (Vec<Arc<DriveStore>>, Layer) {
    let mut stores = Vec::new();
    for (d, dev) in devices.iter().enumerate() {
        let engine = Engine::open(dirs[d].path(), Arc::new(dev.clone()), engine_config()).unwrap();
        stores.push(Arc::new(DriveStore::new(engine)));
    }
    // Lazy sync encodes any whole stripe a tail holds, so that crashes land in encodings too.
    let cfg = mosaic_erasure::SetConfig { lazy_encode_min_bytes: 1, ..set_config(k, m) };
    let set = ErasureSet::open(cfg, stores.iter().cloned().map(Some).collect()).await.unwrap();
    use std::sync::atomic::Ordering::Relaxed;
    UNDONE_AT_OPEN.fetch_add(set.counters().writes_undone_at_open.load(Relaxed), Relaxed);
    KEPT_AT_OPEN.fetch_add(set.counters().writes_kept_at_open.load(Relaxed), Relaxed);
    let layer = S3Semantics::open(Arc::new(set), SemanticsConfig::default()).await.unwrap();
    (stores, layer)
}

/// Power off and on: every drive loses what it did not flush (each in its mode), the process stops (the
/// layer and the drives close), the drives come back and the set reopens (recovery runs).
async fn power_cycle(
    layer: Option<Layer>,
    stores: Vec<Arc<DriveStore>>,
    (k, m): (usize, usize),
    devices: &[mosaic_engine::SimDevice],
    modes: &[CrashMode],
    dirs: &[tempfile::TempDir],
) -> (Vec<Arc<DriveStore>>, Layer) {
    for (dev, mode) in devices.iter().zip(modes) {
        dev.crash(*mode);
    }
    drop(layer);
    for s in stores {
        sole_owner(&s).await;
        let _ = s.engine().close();
    }
    for dev in devices {
        dev.revive();
    }
    open_set(k, m, devices, dirs).await
}

async fn read(l: &Layer, key: &str) -> LayerResult<Vec<u8>> {
    let got = l.get_object("bkt", key, None, None, None, &Precondition::default()).await?;
    let mut out = Vec::new();
    let mut b = got.body;
    while let Some(c) = futures::StreamExt::next(&mut b).await {
        out.extend_from_slice(&c?);
    }
    Ok(out)
}

/// One random operation on key `k`; updates the model with what must or may hold after it.
async fn apply(l: &Layer, model: &mut BTreeMap<String, Expect>, rng: &mut rand::rngs::StdRng) -> bool {
    if rng.random_bool(0.2) {
        // Lazy sync of the tails appends left (it changes how bytes are kept, never what they are).
        l.store().encode_tails_now(4).await;
    }
    let k = format!("k{}", rng.random_range(0..12));
    let before = match model.get(&k) {
        Some(Expect::Is(v)) => v.clone(),
        _ => return true,
    };
    let size = match rng.random_range(0..4) {
        0 => rng.random_range(0..2000),
        1 => rng.random_range(16_000..40_000),
        _ => rng.random_range(60_000..400_000),
    };
    let data = pattern(rng.random(), size);
    let (result, after) = match rng.random_range(0..10) {
        0..=5 => (l.put_object("bkt", &k, body(&data, 50_000), PutOptions::default()).await.map(|_| ()), Some(data)),
        6 | 7 => (l.delete_object("bkt", &k, None).await.map(|_| ()), None),
        8 => {
            let src = format!("k{}", rng.random_range(0..12));
            let src_value = match model.get(&src) {
                Some(Expect::Is(Some(v))) if src != k => v.clone(),
                _ => return true,
            };
            (
                l.copy_object("bkt", &src, None, &Precondition::default(), "bkt", &k, None).await.map(|_| ()),
                Some(src_value),
            )
        }
        _ => {
            let Some(old) = before.clone() else { return true };
            let extra = pattern(rng.random(), rng.random_range(1..5000));
            let opts = PutOptions { write_offset: Some(old.len() as u64), ..Default::default() };
            let r = l.put_object("bkt", &k, body(&extra, 4096), opts).await.map(|_| ());
            (r, Some([old, extra].concat()))
        }
    };
    match result {
        Ok(()) => {
            model.insert(k, Expect::Is(after));
            true
        }
        Err(_) => {
            model.insert(k, Expect::Either(before, after));
            false
        }
    }
}

/// Checks every key against the model and settles unacknowledged ones to what they read.
async fn verify(l: &Layer, model: &mut BTreeMap<String, Expect>, point: u64) {
    let page = l.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    let listed: BTreeMap<String, u64> = page.objects.iter().map(|o| (o.key.clone(), o.size_bytes)).collect();
    for (k, e) in model.iter_mut() {
        let got = match read(l, k).await {
            Ok(v) => Some(v),
            Err(LayerError::NoSuchKey) => None,
            Err(err) => panic!("point {point}: {k}: {err:?}"),
        };
        match e {
            Expect::Is(v) => assert_eq!(&got, v, "point {point}: acknowledged {k}"),
            Expect::Either(a, b) => {
                assert!(got == *a || got == *b, "point {point}: {k} is neither its old nor its new value")
            }
        }
        assert_eq!(
            listed.get(k).copied(),
            got.as_ref().map(|v| v.len() as u64),
            "point {point}: {k} listed as it reads"
        );
        *e = Expect::Is(got);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_across_a_4_plus_2_set() {
    let points: u64 = std::env::var("MOSAIC_SET_CRASH_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    crashes(4, 2, points).await;
}

/// A set of one drive keeps no undo log (its drive's transaction is atomic by itself): the same checks hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_on_a_1_plus_0_set() {
    let points: u64 = std::env::var("MOSAIC_SET_CRASH_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    crashes(1, 0, points / 2).await;
}

/// A key written twice (both acknowledged), then a third write cut short on half the drives: at open,
/// recovery settles the newest write first, so undoing it brings back the acknowledged second value. Settled
/// oldest first (write ids were once random, so the order was), the second write was undone on the drives
/// where the third had failed, the third then on the others, and the key read as absent (found by the
/// kill test on a 4+2 set).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_write_survives_a_newer_one_undone_at_open() {
    let (devices, dirs) = formatted_drives(6);
    let (mut stores, first) = open_set(4, 2, &devices, &dirs).await;
    first.create_bucket("bkt", None).await.unwrap();
    let mut layer = Some(first);
    let before = UNDONE_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed);
    for round in 0..12u64 {
        let l = layer.as_ref().expect("open");
        let put = |v: Vec<u8>| async move { l.put_object("bkt", "k", body(&v, 50_000), PutOptions::default()).await };
        put(pattern(round, 300_000)).await.unwrap();
        let acknowledged = pattern(round + 100, 200_000 + round as usize);
        put(acknowledged.clone()).await.unwrap();
        // Three drives lose power right after staging their next shard (their commit fails) and the process
        // stops after the write's drive transactions: it holds on three drives, too few to stand.
        for dev in &devices[..3] {
            dev.arm_crash(1, CrashMode::DropUnflushed);
        }
        l.store().arm_crash_after_commits(1);
        assert!(put(pattern(round + 200, 250_000)).await.is_err(), "round {round}: the write was cut short");
        let modes = [CrashMode::DropUnflushed; 6];
        let (reopened, l) =
            power_cycle(layer.take(), std::mem::take(&mut stores), (4, 2), &devices, &modes, &dirs).await;
        stores = reopened;
        assert!(read(&l, "k").await.unwrap() == acknowledged, "round {round}: the acknowledged value");
        layer = Some(l);
    }
    let undone = UNDONE_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(undone >= 12, "every round undid its cut-short write at open ({undone})");
}

/// A new version cut short on half the drives of a 4+2 set, the process stopped before it settles, three
/// times over: at open, recovery renames the kept version back over the new one on the drives that
/// committed, so the acknowledged versions read exactly, in order, with the acknowledged current one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_cut_short_is_renamed_back_at_open() {
    let (devices, dirs) = formatted_drives(6);
    let (mut stores, first) = open_set(4, 2, &devices, &dirs).await;
    first.create_bucket("bkt", None).await.unwrap();
    first.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    let mut layer = Some(first);
    let before = UNDONE_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed);
    async fn put(l: &Layer, v: Vec<u8>) -> LayerResult<ObjectMeta> {
        l.put_object("bkt", "k", body(&v, 50_000), PutOptions::default()).await
    }
    let (v1, v2) = (pattern(1, 300_000), pattern(2, 5_000));
    let id1 = put(layer.as_ref().unwrap(), v1.clone()).await.unwrap().version_id.unwrap();
    let id2 = put(layer.as_ref().unwrap(), v2.clone()).await.unwrap().version_id.unwrap();
    for round in 0..3 {
        let l = layer.as_ref().expect("open");
        // Three drives lose power right after staging their shard of the new version (their commit fails)
        // and the process stops after the write's drive transactions.
        for dev in &devices[..3] {
            dev.arm_crash(1, CrashMode::DropUnflushed);
        }
        l.store().arm_crash_after_commits(1);
        assert!(put(l, pattern(3, 200_000)).await.is_err(), "round {round}: the write was cut short");
        let modes = [CrashMode::DropUnflushed; 6];
        let (reopened, l) =
            power_cycle(layer.take(), std::mem::take(&mut stores), (4, 2), &devices, &modes, &dirs).await;
        stores = reopened;
        assert!(read(&l, "k").await.unwrap() == v2, "round {round}: the current version");
        let page = l.list_object_versions("bkt", &VersionQuery { max_keys: 10, ..Default::default() }).await.unwrap();
        let ids: Vec<_> = page.versions.iter().map(|v| v.version_id.clone().unwrap()).collect();
        assert_eq!(ids, [id2.clone(), id1.clone()], "round {round}: the versions, newest first");
        let got = l.get_object("bkt", "k", Some(&id1), None, None, &Precondition::default()).await.unwrap();
        let mut old = Vec::new();
        let mut b = got.body;
        while let Some(c) = futures::StreamExt::next(&mut b).await {
            old.extend_from_slice(&c.unwrap());
        }
        assert!(old == v1, "round {round}: the noncurrent version");
        layer = Some(l);
    }
    let undone = UNDONE_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(undone >= 3, "every cut-short write was undone at open ({undone})");
    for s in &stores {
        assert!(s.engine().check().unwrap().is_clean());
    }
}

/// Arms the crash of one point: how each drive loses power (returned) and when, and whether the process
/// stops between a commit's drive transactions and its outcome.
fn arm_crash(l: &Layer, devices: &[mosaic_engine::SimDevice], rng: &mut rand::rngs::StdRng) -> Vec<CrashMode> {
    let n = devices.len();
    let modes: Vec<CrashMode> = (0..n)
        .map(
            |_| if rng.random_bool(0.5) { CrashMode::DropUnflushed } else { CrashMode::TearOne { seed: rng.random() } },
        )
        .collect();
    if n > 1 && rng.random_bool(0.25) {
        // Half the drives lose power right after staging their next shard (their commit fails), and the
        // process stops after that commit: a write on too few drives that only recovery can undo.
        for d in rand::seq::index::sample(rng, n, n / 2) {
            devices[d].arm_crash(1, modes[d]);
        }
        l.store().arm_crash_after_commits(1);
    } else {
        for (d, dev) in devices.iter().enumerate() {
            if rng.random_bool(0.5) {
                dev.arm_crash(rng.random_range(0..40), modes[d]);
            }
        }
        if rng.random_bool(0.4) {
            l.store().arm_crash_after_commits(rng.random_range(1..5));
        }
    }
    modes
}

async fn crashes(k: usize, m: usize, points: u64) {
    let n = k + m;
    let seed: u64 = std::env::var("MOSAIC_SET_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(11);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (devices, dirs) = formatted_drives(n);
    let (mut stores, first) = open_set(k, m, &devices, &dirs).await;
    first.create_bucket("bkt", None).await.unwrap();
    let mut layer = Some(first);
    let mut model: BTreeMap<String, Expect> = (0..12).map(|i| (format!("k{i}"), Expect::Is(None))).collect();
    let mut interrupted = 0;
    for point in 0..points {
        let l = layer.as_ref().expect("open");
        let modes = arm_crash(l, &devices, &mut rng);
        for _ in 0..rng.random_range(1..7) {
            if !apply(l, &mut model, &mut rng).await {
                interrupted += 1;
                break;
            }
        }
        let (reopened, l) =
            power_cycle(layer.take(), std::mem::take(&mut stores), (k, m), &devices, &modes, &dirs).await;
        stores = reopened;
        verify(&l, &mut model, point).await;
        // Keep the drives from filling: clear every key now and then.
        if point % 100 == 99 {
            for k in model.keys() {
                l.delete_object("bkt", k, None).await.unwrap();
            }
            model.values_mut().for_each(|e| *e = Expect::Is(None));
        }
        layer = Some(l);
    }
    assert!(interrupted > points / 4, "only {interrupted} of {points} crash points interrupted an operation");
    let (undone, kept) = (
        UNDONE_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed),
        KEPT_AT_OPEN.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!(
        "{points} crash points: {interrupted} interrupted an operation; at open {undone} writes were undone and {kept} kept"
    );
    assert!(
        n == 1 || undone > points / 50 && kept > points / 50,
        "recovery was exercised both ways ({undone} undone, {kept} kept)"
    );
    for s in &stores {
        assert!(s.engine().check().unwrap().is_clean());
    }
}

/// A key's versions as the versioned crash test knows them, newest first: (version id, body; None is a
/// delete marker).
type Versions = Vec<(String, Option<Vec<u8>>)>;

/// What may differ from the known versions after a crash: an operation that was not acknowledged.
#[derive(Clone, Debug)]
enum Pending {
    None,
    /// A new version (a put's body, or a delete marker) may have been made.
    New(Option<Vec<u8>>),
    /// A version may have been removed.
    Removed(String),
}

/// Versioned overwrites, delete markers and removals of versions at random crash points of a set: no
/// acknowledged version is ever lost or changed, the order of versions holds, and an operation that was
/// not acknowledged happened wholly or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_survive_crashes_across_a_4_plus_2_set() {
    let points: u64 =
        std::env::var("MOSAIC_SET_CRASH_POINTS").ok().and_then(|v| v.parse().ok()).map_or(200, |p: u64| p / 5);
    version_crashes(4, 2, points).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_survive_crashes_on_a_1_plus_0_set() {
    let points: u64 =
        std::env::var("MOSAIC_SET_CRASH_POINTS").ok().and_then(|v| v.parse().ok()).map_or(100, |p: u64| p / 10);
    version_crashes(1, 0, points).await;
}

async fn version_crashes(k: usize, m: usize, points: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let (devices, dirs) = formatted_drives(k + m);
    let (mut stores, first) = open_set(k, m, &devices, &dirs).await;
    first.create_bucket("bkt", None).await.unwrap();
    first.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    let mut layer = Some(first);
    let keys: Vec<String> = (0..4).map(|i| format!("v{i}")).collect();
    let mut model: BTreeMap<String, Versions> = keys.iter().map(|k| (k.clone(), Vec::new())).collect();
    let mut interrupted = 0;
    for point in 0..points {
        let l = layer.as_ref().expect("open");
        let modes = arm_crash(l, &devices, &mut rng);
        let mut pending: (String, Pending) = (String::new(), Pending::None);
        for _ in 0..rng.random_range(1..6) {
            let key = keys[rng.random_range(0..keys.len())].clone();
            let versions = model.get_mut(&key).expect("a known key");
            let (result, op) = match rng.random_range(0..10) {
                0..=5 => {
                    let data = pattern(rng.random(), rng.random_range(0..120_000));
                    let r = l.put_object("bkt", &key, body(&data, 50_000), PutOptions::default()).await;
                    (r.map(|m| m.version_id.map(|v| (v, Some(data.clone())))), Pending::New(Some(data)))
                }
                6 | 7 => {
                    let r = l.delete_object("bkt", &key, None).await;
                    (r.map(|d| d.version_id.map(|v| (v, None))), Pending::New(None))
                }
                _ => {
                    if versions.is_empty() {
                        continue;
                    }
                    let v = versions[rng.random_range(0..versions.len())].0.clone();
                    let r = l.delete_object("bkt", &key, Some(&v)).await;
                    (r.map(|_| None), Pending::Removed(v))
                }
            };
            match (result, op) {
                (Ok(Some(made)), _) => versions.insert(0, made),
                (Ok(None), Pending::Removed(v)) => versions.retain(|(id, _)| *id != v),
                (Ok(None), _) => panic!("point {point}: a versioned write without a version id"),
                (Err(_), op) => {
                    interrupted += 1;
                    pending = (key, op);
                    break;
                }
            }
        }
        let (reopened, l) =
            power_cycle(layer.take(), std::mem::take(&mut stores), (k, m), &devices, &modes, &dirs).await;
        stores = reopened;
        verify_versions(&l, &mut model, &pending, point).await;
        if point % 50 == 49 {
            // Keep the drives from filling: remove every version now and then.
            for (key, versions) in model.iter_mut() {
                for (v, _) in versions.drain(..) {
                    l.delete_object("bkt", key, Some(&v)).await.unwrap();
                }
            }
        }
        layer = Some(l);
    }
    assert!(interrupted > points / 5, "only {interrupted} of {points} crash points interrupted an operation");
    for s in &stores {
        assert!(s.engine().check().unwrap().is_clean());
    }
}

/// Checks every key's versions after a crash against the model, then settles the model to what is there.
async fn verify_versions(l: &Layer, model: &mut BTreeMap<String, Versions>, pending: &(String, Pending), point: u64) {
    let q = VersionQuery { max_keys: 1000, ..Default::default() };
    let page = l.list_object_versions("bkt", &q).await.unwrap();
    assert!(page.next_key_marker.is_none());
    for (key, known) in model.iter_mut() {
        let mut found: Versions = Vec::new();
        for v in page.versions.iter().filter(|v| &v.key == key) {
            let id = v.version_id.clone().expect("versioned bucket: every version has an id");
            let data = match l.get_object("bkt", key, Some(&id), None, None, &Precondition::default()).await {
                Ok(got) => {
                    let mut out = Vec::new();
                    let mut b = got.body;
                    while let Some(c) = futures::StreamExt::next(&mut b).await {
                        out.extend_from_slice(&c.unwrap());
                    }
                    assert!(!v.delete_marker, "point {point}: {key} {id}: a delete marker read as an object");
                    Some(out)
                }
                Err(LayerError::DeleteMarker { .. }) => None,
                Err(e) => panic!("point {point}: {key} {id}: {e:?}"),
            };
            found.push((id, data));
        }
        let mine = if &pending.0 == key { &pending.1 } else { &Pending::None };
        let mut expected = known.clone();
        match mine {
            Pending::None => assert_eq!(&found, known, "point {point}: the acknowledged versions of {key}"),
            Pending::New(body) => {
                // Either nothing new, or exactly one new newest version with the body that was written.
                if found.len() == known.len() + 1 {
                    assert_eq!(&found[0].1, body, "point {point}: {key}'s unacknowledged version");
                    expected.insert(0, found[0].clone());
                }
                assert_eq!(found, expected, "point {point}: the versions of {key}");
            }
            Pending::Removed(v) => {
                if found.len() + 1 == known.len() {
                    expected.retain(|(id, _)| id != v);
                }
                assert_eq!(found, expected, "point {point}: the versions of {key}");
            }
        }
        // The current version is the newest one.
        let current = read(l, key).await;
        match found.first().map(|(_, d)| d) {
            Some(Some(data)) => assert_eq!(current.as_ref().ok(), Some(data), "point {point}: {key} current"),
            _ => assert!(current.is_err(), "point {point}: {key} has no current object"),
        }
        *known = found;
    }
}
