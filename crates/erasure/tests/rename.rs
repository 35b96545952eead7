//! Renames on erasure sets: each drive holding the object moves its name (nothing is read, copied or
//! encoded), in one transaction with the other changes; the destination is replaced; a write that fewer
//! than a quorum commit renames the object back and puts back what was at its destination.

mod common;

use common::flaky::{Faults, Flaky};
use common::*;
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, SetColl};
use mosaic_layer::testing::pattern;
use mosaic_store::{ErrorKind, Op, Snapshot, Store, StoreResult, Txn};
use std::sync::Arc;
use std::sync::atomic::Ordering;

type Drive = Flaky<DriveStore>;
type Set = ErasureSet<Drive>;
type Coll = SetColl<<Drive as Store>::Coll>;

/// A set of drives that fail commits or lookups on demand; it can be opened again over the same drives
/// (recovery runs as after a restart).
struct TestDrives {
    set: Set,
    members: Vec<Arc<Drive>>,
    faults: Vec<Arc<Faults>>,
    cfg: mosaic_erasure::SetConfig,
    _devices: Vec<mosaic_engine::SimDevice>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Writes queue any whole stripe of a tail for lazy sync (`write` encodes them at once).
async fn test_set(k: usize, m: usize) -> TestDrives {
    let (devices, dirs) = formatted_drives(k + m);
    let mut members = Vec::new();
    let mut faults = Vec::new();
    for (dev, dir) in devices.iter().zip(&dirs) {
        let engine = mosaic_engine::Engine::open(dir.path(), Arc::new(dev.clone()), engine_config()).unwrap();
        let f = Arc::new(Faults::default());
        members.push(Arc::new(Flaky { inner: Arc::new(DriveStore::new(engine)), faults: f.clone() }));
        faults.push(f);
    }
    let cfg = mosaic_erasure::SetConfig { lazy_encode_min_bytes: 1, ..set_config(k, m) };
    let set = ErasureSet::open(cfg.clone(), members.iter().cloned().map(Some).collect()).await.unwrap();
    TestDrives { set, members, faults, cfg, _devices: devices, _dirs: dirs }
}

impl TestDrives {
    /// The process stops and starts again: a new set over the same drives, which settles what the old one
    /// left undecided.
    async fn restart(&mut self) {
        let set = ErasureSet::open(self.cfg.clone(), self.members.iter().cloned().map(Some).collect()).await.unwrap();
        drop(std::mem::replace(&mut self.set, set));
    }

    fn fail_commits(&self, drives: &[usize], on: bool) {
        for &d in drives {
            self.faults[d].commits.store(on, Ordering::SeqCst);
        }
    }
}

async fn collection(set: &Set) -> Coll {
    set.commit(Txn::new().op(Op::CreateCollection { name: "c".into() })).await.unwrap();
    set.snapshot().collection("c").await.unwrap().unwrap()
}

/// Writes `data` as object `name` with listing tag `tag`; with `encode`, its whole stripes are encoded
/// (lazy sync) so that the object has shards as well as a tail.
async fn write(set: &Set, c: &Coll, name: &str, data: &[u8], encode: bool) {
    let n = name.as_bytes().to_vec();
    let txn = Txn::new()
        .op(Op::Reset { coll: c.clone(), name: n.clone() })
        .op(Op::Write { coll: c.clone(), name: n.clone(), offset: 0, data: data.to_vec() })
        .op(Op::SetNameTag { coll: c.clone(), name: n, tag: format!("tag of {name}").into_bytes() });
    set.commit(txn).await.unwrap();
    if encode {
        set.encode_tails_now(16).await;
    }
}

/// An object's bytes and listing tag (None: absent).
async fn read(set: &Set, name: &str) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let snap = set.snapshot();
    let c = snap.collection("c").await.unwrap().unwrap();
    let info = snap.lookup(&c, name.as_bytes()).await.unwrap()?;
    let data = snap.read(&info.obj, 0, info.size_bytes).await.unwrap().to_vec();
    let entries = snap.list_entries(&c, name.as_bytes(), name.as_bytes(), 1).await.unwrap();
    let tag = entries.into_iter().next().filter(|e| e.name == name.as_bytes()).and_then(|e| e.tag);
    Some((data, tag))
}

async fn names(set: &Set) -> Vec<String> {
    let snap = set.snapshot();
    let c = snap.collection("c").await.unwrap().unwrap();
    let entries = snap.list_entries(&c, b"", b"", 100).await.unwrap();
    entries.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
}

/// Renames `from` to `to` and writes a new object at `from`, in one transaction.
async fn rename_and_replace(set: &Set, c: &Coll, from: &str, to: &str, new: &[u8]) -> StoreResult<()> {
    let (f, t) = (from.as_bytes().to_vec(), to.as_bytes().to_vec());
    let txn = Txn::new()
        .op(Op::Rename { coll: c.clone(), from: f.clone(), to_coll: c.clone(), to: t })
        .op(Op::Reset { coll: c.clone(), name: f.clone() })
        .op(Op::Write { coll: c.clone(), name: f, offset: 0, data: new.to_vec() });
    set.commit(txn).await.map(|_| ())
}

/// Makes lookups fail on drives `drives` (a drive away for reads), or answer again.
fn fail_lookups(t: &TestDrives, drives: &[usize], on: bool) {
    for &d in drives {
        t.faults[d].lookups.store(on, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_moves_the_object_with_its_tag_and_replaces_the_destination() {
    for (k, m) in [(1, 0), (2, 1), (4, 2)] {
        let t = test_set(k, m).await;
        let c = collection(&t.set).await;
        let stripe = t.set.geometry().stripe_bytes() as usize;
        let (a, b) = (pattern(1, 3 * stripe + 100), pattern(2, 700));
        write(&t.set, &c, "a", &a, true).await;
        write(&t.set, &c, "b", &b, false).await;
        let new = pattern(3, 900);
        rename_and_replace(&t.set, &c, "a", "b", &new).await.unwrap();
        assert_eq!(read(&t.set, "b").await, Some((a.clone(), Some(b"tag of a".to_vec()))), "{k}+{m}: b is a's");
        assert_eq!(read(&t.set, "a").await.map(|(d, _)| d), Some(new.clone()), "{k}+{m}: a is the new object");
        // A rename onto an absent name, with nothing else in the transaction.
        let rename = Op::Rename { coll: c.clone(), from: b"b".to_vec(), to_coll: c.clone(), to: b"z".to_vec() };
        t.set.commit(Txn::new().op(rename)).await.unwrap();
        assert_eq!(read(&t.set, "b").await, None, "{k}+{m}");
        assert_eq!(read(&t.set, "z").await.map(|(d, _)| d), Some(a.clone()), "{k}+{m}");
        assert_eq!(names(&t.set).await, ["a", "z"], "{k}+{m}: the listing");
        // With any m drives away, both read.
        let away: Vec<usize> = (0..m).collect();
        fail_lookups(&t, &away, true);
        assert_eq!(read(&t.set, "z").await.map(|(d, _)| d), Some(a), "{k}+{m}: degraded");
        assert_eq!(read(&t.set, "a").await.map(|(d, _)| d), Some(new), "{k}+{m}: degraded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_are_refused_where_they_could_not_be_undone() {
    let t = test_set(2, 1).await;
    let c = collection(&t.set).await;
    t.set.commit(Txn::new().op(Op::CreateCollection { name: "other".into() })).await.unwrap();
    let other = t.set.snapshot().collection("other").await.unwrap().unwrap();
    write(&t.set, &c, "a", &pattern(1, 100), false).await;
    write(&t.set, &c, "x", &pattern(2, 100), false).await;
    let rename = |from: &str, to: &str, to_coll: &Coll| Op::Rename {
        coll: c.clone(),
        from: from.as_bytes().to_vec(),
        to_coll: to_coll.clone(),
        to: to.as_bytes().to_vec(),
    };
    let kind = |r: StoreResult<mosaic_store::Outcome>| r.map(|_| ()).unwrap_err().kind;
    assert_eq!(kind(t.set.commit(Txn::new().op(rename("a", "b", &other))).await), ErrorKind::InvalidArgument);
    assert_eq!(kind(t.set.commit(Txn::new().op(rename("missing", "b", &c))).await), ErrorKind::NotFound);
    // The destination takes no further change in the transaction (undoing the rename moves it back whole).
    let append = Op::Write { coll: c.clone(), name: b"b".to_vec(), offset: 100, data: vec![1] };
    assert_eq!(kind(t.set.commit(Txn::new().op(rename("a", "b", &c)).op(append)).await), ErrorKind::InvalidArgument);
    // A source the transaction already changed is refused.
    let tag_a = Op::SetNameTag { coll: c.clone(), name: b"a".to_vec(), tag: vec![] };
    assert_eq!(kind(t.set.commit(Txn::new().op(tag_a).op(rename("a", "b", &c))).await), ErrorKind::InvalidArgument);
    assert_eq!(names(&t.set).await, ["a", "x"], "nothing changed");
    // The destination may be the source of a clone in the same transaction.
    let clone = Op::Clone { coll: c.clone(), from: b"b".to_vec(), to_coll: c.clone(), to: b"a".to_vec() };
    t.set.commit(Txn::new().op(rename("a", "b", &c)).op(clone)).await.unwrap();
    assert_eq!(read(&t.set, "a").await.map(|(d, _)| d), Some(pattern(1, 100)));
    assert_eq!(read(&t.set, "b").await.map(|(d, _)| d), Some(pattern(1, 100)));
}

/// Two of three drives fail their commit: the one that committed renames the object back over the new one
/// and puts back what was at the destination (present or absent there before), at once, or at the next
/// open when the process stopped before it settled the write. Every drive then holds the old state: with
/// any one of them away, both names read as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_fewer_than_a_quorum_commit_is_renamed_back() {
    for (dest_present, restart) in [(false, false), (true, false), (false, true), (true, true)] {
        let case = format!("destination present {dest_present}, settled at restart {restart}");
        let mut t = test_set(2, 1).await;
        let c = collection(&t.set).await;
        let stripe = t.set.geometry().stripe_bytes() as usize;
        let (a, b) = (pattern(1, 2 * stripe + 300), pattern(2, 500));
        write(&t.set, &c, "a", &a, true).await;
        if dest_present {
            write(&t.set, &c, "b", &b, false).await;
        }
        t.fail_commits(&[0, 2], true);
        if restart {
            t.set.arm_crash_after_commits(1);
        }
        let e = rename_and_replace(&t.set, &c, "a", "b", &pattern(3, 800)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{case}: {e}");
        t.fail_commits(&[0, 2], false);
        if restart {
            t.restart().await;
            assert_eq!(t.set.counters().writes_undone_at_open.load(Ordering::Relaxed), 1, "{case}");
        }
        let want_b = dest_present.then(|| (b.clone(), Some(b"tag of b".to_vec())));
        for away in [None, Some(0), Some(1), Some(2)] {
            fail_lookups(&t, away.as_slice(), true);
            assert_eq!(read(&t.set, "a").await, Some((a.clone(), Some(b"tag of a".to_vec()))), "{case}, {away:?}: a");
            assert_eq!(read(&t.set, "b").await, want_b, "{case}, {away:?}: b");
            fail_lookups(&t, away.as_slice(), false);
        }
    }
}

/// Where an object's version is on fewer drives than a write quorum (a drive that missed it, not yet
/// healed), a rename of it or a change in place (which only its holders could take) first rebuilds it on
/// the others under the write's locks, so the write is not refused. A 1+1 set's write quorum is both
/// drives: without this, a versioned overwrite of such an object was refused until heal reached it. (Where
/// k > m, k holders are a write quorum, and the write goes on as before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_or_change_in_place_of_an_object_short_of_a_quorum_rebuilds_it_first() {
    for (k, m) in [(1, 1), (2, 2), (2, 1)] {
        let t = test_set(k, m).await;
        let c = collection(&t.set).await;
        let stripe = t.set.geometry().stripe_bytes() as usize;
        let (a, x) = (pattern(1, 3 * stripe + 100), pattern(2, 300));
        write(&t.set, &c, "a", &a, true).await;
        write(&t.set, &c, "x", &x, false).await;
        // The last m drives lose both objects, as drives that missed them would: their holders are k.
        for d in k..k + m {
            let dc = t.members[d].snapshot().collection("c").await.unwrap().unwrap();
            let txn = Txn::new()
                .op(Op::Remove { coll: dc, name: b"a".to_vec() })
                .op(Op::Remove { coll: dc, name: b"x".to_vec() });
            t.members[d].commit(txn).await.unwrap();
        }
        let new = pattern(3, 900);
        // As a versioned overwrite does it: the key's version asserted first, then renamed, then made anew.
        let txn = Txn::new()
            .op(Op::AssertExists { coll: c.clone(), name: b"a".to_vec() })
            .op(Op::Rename { coll: c.clone(), from: b"a".to_vec(), to_coll: c.clone(), to: b"b".to_vec() })
            .op(Op::Reset { coll: c.clone(), name: b"a".to_vec() })
            .op(Op::Write { coll: c.clone(), name: b"a".to_vec(), offset: 0, data: new.clone() });
        t.set.commit(txn).await.map(|_| ()).unwrap_or_else(|e| panic!("{k}+{m}: {e}"));
        let tag = Op::SetNameTag { coll: c.clone(), name: b"x".to_vec(), tag: b"new tag".to_vec() };
        t.set.commit(Txn::new().op(tag)).await.unwrap_or_else(|e| panic!("{k}+{m}: {e}"));
        assert_eq!(read(&t.set, "b").await, Some((a.clone(), Some(b"tag of a".to_vec()))), "{k}+{m}");
        assert_eq!(read(&t.set, "a").await.map(|(d, _)| d), Some(new.clone()), "{k}+{m}");
        assert_eq!(read(&t.set, "x").await, Some((x.clone(), Some(b"new tag".to_vec()))), "{k}+{m}");
        if k != m {
            // k holders are a write quorum already: the write needs no rebuild (heal comes later).
            continue;
        }
        // Every drive holds all three now: with any m away, each still reads.
        let away: Vec<usize> = (0..m).collect();
        fail_lookups(&t, &away, true);
        assert_eq!(read(&t.set, "b").await.map(|(d, _)| d), Some(a), "{k}+{m}: degraded");
        assert_eq!(read(&t.set, "a").await.map(|(d, _)| d), Some(new), "{k}+{m}: degraded");
        assert_eq!(read(&t.set, "x").await.map(|(d, _)| d), Some(x), "{k}+{m}: degraded");
    }
}

/// Past `SetConfig::rebuild_on_write_max_bytes` the write does not rebuild the object: it is refused (503)
/// and the object queued for heal; once healed, the write goes through. At the limit it is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_past_the_rebuild_limit_is_queued_for_heal_and_the_write_refused() {
    let mut t = test_set(1, 1).await;
    let size = 3 * t.set.geometry().stripe_bytes() as usize + 100;
    t.cfg.rebuild_on_write_max_bytes = size as u64 - 1;
    t.restart().await;
    let c = collection(&t.set).await;
    let (past, at) = (pattern(1, size), pattern(2, size - 1));
    write(&t.set, &c, "past", &past, true).await;
    write(&t.set, &c, "at", &at, true).await;
    let dc = t.members[1].snapshot().collection("c").await.unwrap().unwrap();
    let txn = Txn::new()
        .op(Op::Remove { coll: dc, name: b"past".to_vec() })
        .op(Op::Remove { coll: dc, name: b"at".to_vec() });
    t.members[1].commit(txn).await.unwrap();
    rename_and_replace(&t.set, &c, "at", "at2", &pattern(3, 10)).await.unwrap();
    let e = rename_and_replace(&t.set, &c, "past", "past2", &pattern(4, 10)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert_eq!(t.set.heal_backlog(), 1, "the object is queued for heal");
    assert_eq!(t.set.heal_now(1).await, 1);
    rename_and_replace(&t.set, &c, "past", "past2", &pattern(4, 10)).await.unwrap();
    assert_eq!(read(&t.set, "past2").await.map(|(d, _)| d), Some(past));
    assert_eq!(read(&t.set, "at2").await.map(|(d, _)| d), Some(at));
}
