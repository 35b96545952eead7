//! Scopes of a pool (a microstore's sets): a bucket's objects on some members only, and moved between
//! members with every object readable and writable during the move. Checked against a model (a map of
//! what was acknowledged) under seeded random mixes of writes, deletes, reads, listings, moves begun and
//! moves settled; under concurrent writers while the background walk runs; and from the state a crash
//! between a move's copy and its removal leaves.

use futures::StreamExt;
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::*;
use mosaic_pool::{Home, MoveReport, Pool, Scope, member_of};
use mosaic_store::{Op, Snapshot, Store, Txn};
use std::collections::BTreeMap;
use std::sync::Arc;

const DRIVE_BYTES: u64 = 256 << 20;
const MEMBERS: usize = 4;

fn drive(dirs: &mut Vec<tempfile::TempDir>) -> Arc<DriveStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cfg = EngineConfig { kv_write_buffer_bytes: 4 << 20, kv_block_cache_bytes: 8 << 20, ..Default::default() };
    let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(DRIVE_BYTES)), cfg).expect("format");
    dirs.push(dir);
    Arc::new(DriveStore::new(engine))
}

fn pool(dirs: &mut Vec<tempfile::TempDir>) -> Arc<Pool<DriveStore>> {
    Arc::new(Pool::new((0..MEMBERS).map(|_| drive(dirs)).collect()).expect("a pool"))
}

/// A pool of `MEMBERS` 2+1 sets (each drive smaller: twelve of them).
async fn sets_pool(dirs: &mut Vec<tempfile::TempDir>) -> Arc<Pool<ErasureSet<DriveStore>>> {
    let mut sets = Vec::new();
    for _ in 0..MEMBERS {
        let cfg = SetConfig::new(SetGeometry::new(2, 1).unwrap());
        let members = (0..3).map(|_| Some(small_drive(dirs))).collect();
        sets.push(Arc::new(ErasureSet::open(cfg, members).await.expect("a set")));
    }
    Arc::new(Pool::new(sets).expect("a pool"))
}

fn small_drive(dirs: &mut Vec<tempfile::TempDir>) -> Arc<DriveStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cfg = EngineConfig { kv_write_buffer_bytes: 2 << 20, kv_block_cache_bytes: 4 << 20, ..Default::default() };
    let engine = Engine::format(dir.path(), Arc::new(SimDevice::new(64 << 20)), cfg).expect("format");
    dirs.push(dir);
    Arc::new(DriveStore::new(engine))
}

/// A bucket's scopes on `members`, moving from `from`.
fn scopes_of(bucket: &str, members: &[usize], from: Option<&[usize]>) -> Vec<Scope> {
    bucket_scopes(bucket)
        .into_iter()
        .map(|(coll, prefix)| Scope {
            coll,
            prefix,
            members: members.to_vec(),
            moving_from: from.map(<[usize]>::to_vec),
        })
        .collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn read_all<L: ObjectLayer>(l: &L, bucket: &str, key: &str) -> LayerResult<Vec<u8>> {
    let got = l.get_object(bucket, key, None, None, None, &Precondition::default()).await?;
    let mut body = got.body;
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

async fn list_all<L: ObjectLayer>(l: &L, bucket: &str, page: usize) -> Vec<String> {
    let mut q = ListQuery { max_keys: page, ..Default::default() };
    let mut out = Vec::new();
    loop {
        let p = l.list_objects(bucket, &q).await.expect("a listing");
        out.extend(p.objects.iter().map(|o| o.key.clone()));
        match p.next_marker {
            Some(m) => q.start_after = m,
            None => return out,
        }
    }
}

/// The names each member holds in a collection.
async fn held<S: Store>(pool: &Pool<S>, coll: &str) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for m in pool.members() {
        let snap = m.snapshot();
        out.push(match snap.collection(coll).await.unwrap() {
            Some(c) => snap.list_entries(&c, b"", b"", 100_000).await.unwrap().into_iter().map(|e| e.name).collect(),
            None => Vec::new(),
        });
    }
    out
}

/// Where the buckets are, as the test sets it: members, and the members a move leaves; and so for the
/// home (the buckets of no scope).
#[derive(Clone)]
struct Where {
    members: BTreeMap<String, (Vec<usize>, Option<Vec<usize>>)>,
    home: (Vec<usize>, Option<Vec<usize>>),
}

impl Where {
    fn new() -> Self {
        Where { members: BTreeMap::new(), home: ((0..MEMBERS).collect(), None) }
    }

    fn scopes(&self) -> Vec<Scope> {
        self.members.iter().flat_map(|(b, (m, from))| scopes_of(b, m, from.as_deref())).collect()
    }

    fn home(&self) -> Home {
        Home { members: self.home.0.clone(), moving_from: self.home.1.clone() }
    }

    /// Where `bucket` is: its scope's members, or the home's.
    fn of(&self, bucket: &str) -> (Vec<usize>, Option<Vec<usize>>) {
        self.members.get(bucket).cloned().unwrap_or_else(|| self.home.clone())
    }

    /// Takes the moves a report says are done off, and says whether any was.
    fn settle(&mut self, report: &MoveReport) -> bool {
        let mut changed = false;
        if report.home_settled && self.home.1.take().is_some() {
            changed = true;
        }
        for (bucket, (_, from)) in self.members.iter_mut() {
            let all_settled =
                bucket_scopes(bucket).iter().all(|(c, p)| report.settled.iter().any(|(sc, sp)| sc == c && sp == p));
            if from.is_some() && all_settled {
                *from = None;
                changed = true;
            }
        }
        changed
    }
}

/// Every object of `bucket` lives only on the member its placement names (or, while moving, on the one
/// it leaves), and exactly where the placement says once no move is under way.
async fn check_placement<S: Store>(pool: &Pool<S>, bucket: &str, members: &[usize], from: Option<&[usize]>) {
    for (m, names) in held(pool, &format!("b/{bucket}")).await.into_iter().enumerate() {
        for name in names {
            let loc = mosaic_store::locator(&name);
            let now = members[member_of(loc, members.len())];
            let before = from.map(|f| f[member_of(loc, f.len())]);
            assert!(
                m == now || Some(m) == before,
                "{bucket}/{} on member {m}: its placement says {now} (before {before:?})",
                name.escape_ascii()
            );
        }
    }
}

async fn model_run<S: Store>(pool: Arc<Pool<S>>, seed: u64, steps: usize) {
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    let buckets = ["small", "large", "plain"];
    for b in buckets {
        l.create_bucket(b, None).await.unwrap();
    }
    let mut rng = Rng(seed | 1);
    let mut placed = Where::new();
    placed.members.insert("small".into(), ((0..MEMBERS).collect(), None));
    placed.members.insert("large".into(), ((0..MEMBERS).collect(), None));
    let mut model: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
    for step in 0..steps {
        let bucket = buckets[rng.below(3) as usize].to_string();
        let key = format!("k{:02}", rng.below(40));
        match rng.below(14) {
            0..=3 => {
                let size = [0usize, 100, 4096, 9000, 70_000][rng.below(5) as usize];
                let data = pattern(seed ^ step as u64, size);
                l.put_object(&bucket, &key, body(&data, 4096), PutOptions::default()).await.unwrap();
                model.insert((bucket, key), data);
            }
            4 => {
                l.delete_object(&bucket, &key, None).await.unwrap();
                model.remove(&(bucket, key));
            }
            5 | 6 => {
                let got = read_all(&l, &bucket, &key).await;
                match model.get(&(bucket.clone(), key.clone())) {
                    Some(want) => assert_eq!(got.as_ref(), Ok(want), "step {step}: {bucket}/{key}"),
                    None => assert_eq!(got, Err(LayerError::NoSuchKey), "step {step}: {bucket}/{key}"),
                }
            }
            7 => {
                let want: Vec<String> = model.keys().filter(|(b, _)| *b == bucket).map(|(_, k)| k.clone()).collect();
                assert_eq!(list_all(&l, &bucket, 1 + rng.below(9) as usize).await, want, "step {step}");
            }
            8 => {
                // A move begins where none is under way: to a random non-empty set of members. "plain" is
                // in no scope: the home moves.
                let (members, from) = placed.of(&bucket);
                if from.is_none() {
                    let mask = 1 + rng.below((1 << MEMBERS) - 1) as usize;
                    let to: Vec<usize> = (0..MEMBERS).filter(|m| mask & (1 << m) != 0).collect();
                    match placed.members.contains_key(&bucket) {
                        true => drop(placed.members.insert(bucket.clone(), (to, Some(members)))),
                        false => placed.home = (to, Some(members)),
                    }
                    pool.set_placement(placed.home(), placed.scopes()).await.unwrap();
                }
            }
            9 | 10 => {
                let report = pool.move_objects(rng.below(6)).await.unwrap();
                if placed.settle(&report) {
                    pool.set_placement(placed.home(), placed.scopes()).await.unwrap();
                }
            }
            11 => {
                // A copy reads its source where it is and writes its target where it goes.
                let source = (bucket.clone(), format!("k{:02}", rng.below(40)));
                let pre = Precondition::default();
                let copied = l.copy_object(&source.0, &source.1, None, &pre, &bucket, &key, None).await;
                match (copied, model.get(&source).cloned()) {
                    (Ok(_), Some(data)) => {
                        model.insert((bucket, key), data);
                    }
                    (Err(LayerError::NoSuchKey), None) => {}
                    (got, want) => panic!("step {step}: a copy of {source:?}: {got:?}, the model has {want:?}"),
                }
            }
            12 if rng.below(4) == 0 => {
                // A multipart upload whose parts may move between its two parts' writes.
                let id = l.create_multipart(&bucket, &key, PutOptions::default()).await.unwrap();
                let p1 = pattern(seed ^ (step as u64) << 1, MIN_PART_BYTES as usize);
                let e1 = l.upload_part(&bucket, &key, &id, 1, body(&p1, 1 << 20)).await.unwrap().etag;
                let report = pool.move_objects(rng.below(3)).await.unwrap();
                if placed.settle(&report) {
                    pool.set_placement(placed.home(), placed.scopes()).await.unwrap();
                }
                let p2 = pattern(seed ^ 77, 1000);
                let e2 = l.upload_part(&bucket, &key, &id, 2, body(&p2, 1000)).await.unwrap().etag;
                let parts = vec![CompletePart { part_number: 1, etag: e1 }, CompletePart { part_number: 2, etag: e2 }];
                l.complete_multipart(&bucket, &key, &id, parts, &Precondition::default(), Vec::new()).await.unwrap();
                model.insert((bucket, key), [p1, p2].concat());
            }
            _ => {
                for b in buckets {
                    let (members, from) = placed.of(b);
                    check_placement(&pool, b, &members, from.as_deref()).await;
                }
            }
        }
    }
    // Every move finishes; then every object is where its placement says, and reads as acknowledged.
    for _ in 0..100 {
        let report = pool.move_objects(1000).await.unwrap();
        if placed.settle(&report) {
            pool.set_placement(placed.home(), placed.scopes()).await.unwrap();
        }
        if placed.members.values().chain([&placed.home]).all(|(_, from)| from.is_none()) {
            break;
        }
    }
    assert!(placed.members.values().chain([&placed.home]).all(|(_, from)| from.is_none()), "every move settles");
    for b in buckets {
        check_placement(&pool, b, &placed.of(b).0, None).await;
    }
    assert_eq!(pool.home(), placed.home());
    for ((b, k), want) in &model {
        assert_eq!(read_all(&l, b, k).await.as_ref(), Ok(want), "{b}/{k} at the end");
    }
    for b in buckets {
        let want: Vec<String> = model.keys().filter(|(mb, _)| mb == b).map(|(_, k)| k.clone()).collect();
        assert_eq!(list_all(&l, b, 1000).await, want);
    }
    l.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reads_and_listings_match_a_model_through_moves() {
    for seed in [1, 2, 3, 0xdead_beef] {
        let mut dirs = Vec::new();
        model_run(pool(&mut dirs), seed, 400).await;
    }
}

/// The same over erasure sets, whose units are placed on their drives by the object's key: a part staged
/// on its scope's set is cloned into its object there, and a moved object keeps its stripes' placement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_holds_over_a_pool_of_erasure_sets() {
    for seed in [5, 0xfeed] {
        let mut dirs = Vec::new();
        model_run(sets_pool(&mut dirs).await, seed, 300).await;
    }
}

/// Writers that each own some keys overwrite and delete them while the background walk moves the bucket
/// back and forth: each writer reads its own last acknowledged write back every time, and at the end
/// every key holds its last write, once, on its member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_lose_nothing_while_the_walk_moves_their_bucket() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    let l = Arc::new(S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap());
    l.create_bucket("moving", None).await.unwrap();
    for i in 0..60 {
        let data = pattern(i, 5000);
        l.put_object("moving", &format!("w{}/k{i:02}", i % 3), body(&data, 4096), PutOptions::default()).await.unwrap();
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mover = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let plans: [&[usize]; 4] = [&[0, 1], &[2, 3], &[1], &[0, 1, 2, 3]];
            let mut current: Vec<usize> = (0..MEMBERS).collect();
            let mut moves = 0;
            for plan in plans.iter().cycle() {
                if *stop_rx.borrow() {
                    break;
                }
                pool.set_scopes(scopes_of("moving", plan, Some(&current))).await.unwrap();
                loop {
                    let report = pool.move_objects(3).await.unwrap();
                    if report.settled.len() == 2 {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                pool.set_scopes(scopes_of("moving", plan, None)).await.unwrap();
                current = plan.to_vec();
                moves += 1;
            }
            (current, moves)
        })
    };
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let l = l.clone();
            tokio::spawn(async move {
                let mut last: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
                let mut rng = Rng(w + 7);
                for step in 0..150u64 {
                    let i = w + 3 * rng.below(20);
                    let key = format!("w{w}/k{i:02}");
                    if rng.below(5) == 0 {
                        l.delete_object("moving", &key, None).await.unwrap();
                        last.insert(key.clone(), None);
                    } else {
                        let data = pattern(w * 1000 + step, 3000 + (step as usize % 3) * 4096);
                        l.put_object("moving", &key, body(&data, 4096), PutOptions::default()).await.unwrap();
                        last.insert(key.clone(), Some(data));
                    }
                    let got = read_all(&*l, "moving", &key).await.ok();
                    assert_eq!(got, last[&key], "writer {w} reads its own write of {key} back");
                }
                last
            })
        })
        .collect();
    let mut expected = BTreeMap::new();
    for (i, w) in writers.into_iter().enumerate() {
        for (k, v) in w.await.unwrap() {
            expected.insert(k, v);
        }
        for j in 0..60u64 {
            let key = format!("w{i}/k{j:02}");
            if j % 3 == i as u64 && !expected.contains_key(&key) {
                expected.insert(key, Some(pattern(j, 5000)));
            }
        }
    }
    stop_tx.send(true).unwrap();
    let (current, moves) = mover.await.unwrap();
    assert!(moves >= 1, "the bucket moved at least once while the writers wrote");
    check_placement(&pool, "moving", &current, None).await;
    for (k, v) in &expected {
        assert_eq!(read_all(&*l, "moving", k).await.ok().as_ref(), v.as_ref(), "{k} at the end");
    }
    let want: Vec<String> = expected.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k.clone()).collect();
    assert_eq!(list_all(&*l, "moving", 7).await, want);
    let copies: usize = held(&pool, "b/moving").await.iter().map(Vec::len).sum();
    assert_eq!(copies, want.len(), "every object once");
    l.shutdown().await.unwrap();
}

/// What a crash between a move's copy and its removal leaves (the object on both members, the same
/// version) reads once, lists once, is overwritten and deleted right, and the walk only removes the old
/// copy. A multipart upload begun before a move completes after it, its parts moved with the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_left_by_a_crash_and_an_upload_across_a_move_come_out_whole() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let all: Vec<usize> = (0..MEMBERS).collect();
    // Keys whose member changes when the bucket moves to member 3 alone.
    let keys: Vec<String> =
        (0..100).map(|i| format!("key-{i}")).filter(|k| member_of(k.as_bytes(), MEMBERS) != 3).take(3).collect();
    for k in &keys {
        l.put_object("bkt", k, body(&pattern(1, 10_000), 4096), PutOptions::default()).await.unwrap();
    }
    let upload_key = "upload-key";
    let id = l.create_multipart("bkt", upload_key, PutOptions::default()).await.unwrap();
    let p1 = pattern(10, MIN_PART_BYTES as usize);
    let e1 = l.upload_part("bkt", upload_key, &id, 1, body(&p1, 1 << 20)).await.unwrap().etag;

    pool.set_scopes(scopes_of("bkt", &[3], Some(&all))).await.unwrap();
    // The crash's leftovers: each key copied to member 3 (data and attributes), not removed from its own.
    for k in &keys {
        let from = &pool.members()[member_of(k.as_bytes(), MEMBERS)];
        let snap = from.snapshot();
        let c = snap.collection("b/bkt").await.unwrap().unwrap();
        let info = snap.lookup(&c, k.as_bytes()).await.unwrap().unwrap();
        let data = snap.read(&info.obj, 0, info.size_bytes).await.unwrap();
        let to = &pool.members()[3];
        let tc = to.snapshot().collection("b/bkt").await.unwrap().unwrap();
        let mut txn = Txn::new().op(Op::Reset { coll: tc, name: k.as_bytes().to_vec() }).op(Op::Write {
            coll: tc,
            name: k.as_bytes().to_vec(),
            offset: 0,
            data: data.to_vec(),
        });
        for (key, value) in snap.attrs(&info.obj, b"", 100).await.unwrap() {
            txn.push(Op::SetAttr { coll: tc, name: k.as_bytes().to_vec(), key, value });
        }
        to.commit(txn).await.unwrap();
    }
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(list_all(&l, "bkt", 2).await, sorted, "each once");
    for k in &keys {
        assert_eq!(read_all(&l, "bkt", k).await.unwrap(), pattern(1, 10_000));
    }
    // An overwrite and a delete of keys on two members.
    l.put_object("bkt", &keys[0], body(b"new", 3), PutOptions::default()).await.unwrap();
    l.delete_object("bkt", &keys[1], None).await.unwrap();
    assert_eq!(read_all(&l, "bkt", &keys[0]).await.unwrap(), b"new");
    assert_eq!(read_all(&l, "bkt", &keys[1]).await, Err(LayerError::NoSuchKey));
    // The upload's second part goes to the new member; completion finds the first there too.
    let p2 = pattern(11, 1000);
    let e2 = l.upload_part("bkt", upload_key, &id, 2, body(&p2, 1000)).await.unwrap().etag;
    let report = pool.move_objects(1000).await.unwrap();
    assert_eq!(report.settled.len(), 2, "both scopes settle: {report:?}");
    pool.set_scopes(scopes_of("bkt", &[3], None)).await.unwrap();
    let parts = vec![CompletePart { part_number: 1, etag: e1 }, CompletePart { part_number: 2, etag: e2 }];
    l.complete_multipart("bkt", upload_key, &id, parts, &Precondition::default(), Vec::new()).await.unwrap();
    assert_eq!(read_all(&l, "bkt", upload_key).await.unwrap(), [p1, p2].concat());
    let holdings = held(&pool, "b/bkt").await;
    assert!(holdings[..3].iter().all(Vec::is_empty), "nothing left on the members the bucket left");
    assert_eq!(holdings[3].len(), 3, "two keys and the upload's object on member 3");
    assert_eq!(read_all(&l, "bkt", &keys[2]).await.unwrap(), pattern(1, 10_000));
    l.shutdown().await.unwrap();
}

/// Scopes that overlap, name members the pool lacks, or exceed the limit are refused, and the pool keeps
/// the placement it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_scopes_are_refused_and_change_nothing() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    pool.set_scopes(scopes_of("a", &[1], None)).await.unwrap();
    let mut overlapping = scopes_of("a", &[1], None);
    overlapping.push(Scope { coll: "b/a".into(), prefix: b"x".to_vec(), members: vec![2], moving_from: None });
    assert!(pool.set_scopes(overlapping).await.is_err());
    assert!(pool.set_scopes(scopes_of("a", &[MEMBERS], None)).await.is_err());
    let too_many = (0..=mosaic_pool::MAX_SCOPES)
        .map(|i| Scope { coll: format!("b/c{i}"), prefix: Vec::new(), members: vec![0], moving_from: None })
        .collect();
    assert!(pool.set_scopes(too_many).await.is_err());
    assert_eq!(pool.scopes(), scopes_of("a", &[1], None));
}

/// Units staged before a move began lie on the member the scope leaves: the write runs there (its object
/// taken back there first when the walk had moved it) and its object then moves on, so a PUT in flight
/// when a bucket's move begins succeeds. Units staged where no placement puts the object any more (the
/// placement changed twice meanwhile) are refused as unavailable, and the write is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_staged_before_a_move_began_are_written_where_they_lie() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let all: Vec<usize> = (0..MEMBERS).collect();
    let coll = pool.snapshot().collection("b/bkt").await.unwrap().unwrap();
    let keys: Vec<String> =
        (0..100).map(|i| format!("key-{i}")).filter(|k| member_of(k.as_bytes(), MEMBERS) != 3).take(3).collect();
    let unit = pool.geometry().unit_bytes as usize;
    let stage = |name: &str, seed: u64| {
        let (pool, coll, name) = (pool.clone(), coll.clone(), name.to_string());
        async move {
            let data = pattern(seed, 2 * unit);
            let buf = mosaic_store::AlignedBuf::copy_of(&data);
            let (staged, _) = pool.stage_in(&coll, name.as_bytes(), buf, data.len(), name.as_bytes()).await.unwrap();
            (staged, data)
        }
    };
    let write = |name: &str, staged| {
        Txn::new().op(Op::Reset { coll: coll.clone(), name: name.as_bytes().to_vec() }).op(Op::WriteStaged {
            coll: coll.clone(),
            name: name.as_bytes().to_vec(),
            offset: 0,
            staged,
        })
    };
    let read = |name: &str| {
        let (pool, coll, name) = (pool.clone(), coll.clone(), name.to_string());
        async move {
            let snap = pool.snapshot();
            let info = snap.lookup(&coll, name.as_bytes()).await.unwrap().expect("the object is there");
            snap.read(&info.obj, 0, info.size_bytes).await.unwrap().to_vec()
        }
    };
    // keys[1] exists and the walk moves it before the write commits; keys[0] is new.
    pool.commit(write(&keys[1], stage(&keys[1], 1).await.0)).await.unwrap();
    let (new_units, new_data) = stage(&keys[0], 2).await;
    let (over_units, over_data) = stage(&keys[1], 3).await;
    pool.set_scopes(scopes_of("bkt", &[3], Some(&all))).await.unwrap();
    pool.move_objects(1000).await.unwrap();
    pool.commit(write(&keys[0], new_units)).await.expect("a write staged before the move began");
    pool.commit(write(&keys[1], over_units)).await.expect("an overwrite staged before the move began");
    assert_eq!(read(&keys[0]).await, new_data);
    assert_eq!(read(&keys[1]).await, over_data);
    let holdings = held(&pool, "b/bkt").await;
    for k in &keys[..2] {
        assert!(holdings[3].contains(&k.as_bytes().to_vec()), "{k} moved on to the new member");
        assert_eq!(holdings.iter().flatten().filter(|n| *n == k.as_bytes()).count(), 1, "{k} once");
    }
    // The move ends once no units staged before it began are in flight.
    assert_eq!(pool.move_objects(1000).await.unwrap().settled.len(), 2);
    pool.set_scopes(scopes_of("bkt", &[3], None)).await.unwrap();
    // A move from member 3 to member 2 begins while a write's units lie on member 3: the move does not end
    // before the write is done, which runs on member 3 and moves on.
    let (late_units, late_data) = stage(&keys[2], 4).await;
    pool.set_scopes(scopes_of("bkt", &[2], Some(&[3]))).await.unwrap();
    assert!(pool.move_objects(1000).await.unwrap().settled.is_empty(), "units staged before it are in flight");
    pool.commit(write(&keys[2], late_units)).await.unwrap();
    assert_eq!(pool.move_objects(1000).await.unwrap().settled.len(), 2);
    assert_eq!(read(&keys[2]).await, late_data);
    assert!(held(&pool, "b/bkt").await[2].contains(&keys[2].as_bytes().to_vec()));
    // Units on a member that the placement neither names nor leaves (it was set without a move from
    // there) are refused as unavailable: the write is tried again.
    let (stray_units, _) = stage(&keys[2], 5).await;
    pool.set_scopes(scopes_of("bkt", &[1], Some(&[3]))).await.unwrap();
    let refused = pool.commit(write(&keys[2], stray_units)).await.unwrap_err();
    assert_eq!(refused.kind, mosaic_store::ErrorKind::Unavailable, "{refused}");
    l.shutdown().await.unwrap();
}

/// PUTs of staged sizes in flight while a move begins and ends (as the server's mover runs it: begin,
/// walk until settled, then set without the members left) all succeed and read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_in_flight_when_a_move_begins_and_ends_succeed() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    let l = Arc::new(S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap());
    l.create_bucket("busy", None).await.unwrap();
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let l = l.clone();
            tokio::spawn(async move {
                for i in 0..40u64 {
                    let key = format!("w{w}/k{i:02}");
                    let data = pattern(w * 100 + i, 100_000 + i as usize);
                    l.put_object("busy", &key, body(&data, 8192), PutOptions::default()).await.unwrap();
                    assert_eq!(read_all(&*l, "busy", &key).await.unwrap(), data);
                }
            })
        })
        .collect();
    let all: Vec<usize> = (0..MEMBERS).collect();
    let mut current = all.clone();
    let plans = [vec![1], vec![2, 3], all.clone(), vec![0]];
    for (moves, plan) in plans.iter().cycle().cloned().enumerate() {
        if moves >= plans.len() && writers.iter().all(|w| w.is_finished()) {
            break;
        }
        tokio::task::yield_now().await;
        pool.set_scopes(scopes_of("busy", &plan, Some(&current))).await.unwrap();
        while pool.move_objects(4).await.unwrap().settled.len() < 2 {
            tokio::task::yield_now().await;
        }
        pool.set_scopes(scopes_of("busy", &plan, None)).await.unwrap();
        current = plan;
    }
    for w in writers {
        w.await.unwrap();
    }
    check_placement(&pool, "busy", &current, None).await;
    l.shutdown().await.unwrap();
}

/// A body staged across the beginning of a move (its first units before, the rest after) lies on one
/// member: an object's later units go where its first went while any are staged, and the write succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_staged_across_a_moves_beginning_lies_on_one_member() {
    let mut dirs = Vec::new();
    let pool = pool(&mut dirs);
    let l = S3Semantics::open(pool.clone(), SemanticsConfig::default()).await.unwrap();
    l.create_bucket("bkt", None).await.unwrap();
    let coll = pool.snapshot().collection("b/bkt").await.unwrap().unwrap();
    let key = (0..100).map(|i| format!("key-{i}")).find(|k| member_of(k.as_bytes(), MEMBERS) != 3).unwrap();
    let unit = pool.geometry().unit_bytes as usize;
    let data = pattern(7, 2 * unit);
    let stage = |part: &[u8]| {
        let (pool, coll, key, part) = (pool.clone(), coll.clone(), key.clone(), part.to_vec());
        async move {
            let buf = mosaic_store::AlignedBuf::copy_of(&part);
            pool.stage_in(&coll, key.as_bytes(), buf, part.len(), key.as_bytes()).await.unwrap().0
        }
    };
    let first = stage(&data[..unit]).await;
    pool.set_scopes(scopes_of("bkt", &[3], Some(&(0..MEMBERS).collect::<Vec<_>>()))).await.unwrap();
    let second = stage(&data[unit..]).await;
    let name = key.as_bytes().to_vec();
    let txn = Txn::new()
        .op(Op::Reset { coll: coll.clone(), name: name.clone() })
        .op(Op::WriteStaged { coll: coll.clone(), name: name.clone(), offset: 0, staged: first })
        .op(Op::WriteStaged { coll: coll.clone(), name: name.clone(), offset: unit as u64, staged: second });
    pool.commit(txn).await.expect("one member holds every unit");
    let snap = pool.snapshot();
    let info = snap.lookup(&coll, &name).await.unwrap().unwrap();
    assert_eq!(snap.read(&info.obj, 0, info.size_bytes).await.unwrap().to_vec(), data);
    assert_eq!(pool.move_objects(100).await.unwrap().settled.len(), 2);
    assert!(held(&pool, "b/bkt").await[3].contains(&name), "moved on to the new member");
    l.shutdown().await.unwrap();
}
