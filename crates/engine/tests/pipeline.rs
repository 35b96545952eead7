//! The commit pipeline's two stages: a transaction without staged data goes to the committer directly,
//! so it never waits for the device flush of another transaction's staged data; both commit, and the
//! engine closes with nothing left waiting.

mod common;

use common::*;
use mosaic_engine::*;
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// Longest the test waits for a write that must not wait for the held flush: a bound on a failure, not a
/// pause that orders anything.
const WRITE_DEADLINE: Duration = Duration::from_secs(20);

/// A simulated device whose flushes wait while the gate is held, and say so when one starts waiting.
struct GatedFlush {
    inner: SimDevice,
    held: Mutex<bool>,
    released: Condvar,
    flush_waiting: Mutex<Option<mpsc::Sender<()>>>,
}

impl GatedFlush {
    fn release(&self) {
        *self.held.lock() = false;
        self.released.notify_all();
    }
}

impl Device for GatedFlush {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset_bytes)
    }

    fn flush(&self) -> io::Result<()> {
        let mut held = self.held.lock();
        if *held && let Some(tx) = self.flush_waiting.lock().take() {
            let _ = tx.send(());
        }
        while *held {
            self.released.wait(&mut held);
        }
        drop(held);
        self.inner.flush()
    }

    fn kind(&self) -> &'static str {
        "gated"
    }
}

fn small_write(engine: &Engine, coll: CollectionId, name: &[u8], data: Vec<u8>) -> Result<Outcome> {
    engine.submit(Transaction::new().op(Op::Write { coll, name: name.to_vec(), offset: 0, data }))
}

#[test]
fn a_write_without_staged_data_does_not_wait_for_a_held_flush() {
    let dir = tempfile::tempdir().unwrap();
    let device = Arc::new(GatedFlush {
        inner: SimDevice::new(DEVICE_BYTES),
        held: Mutex::new(false),
        released: Condvar::new(),
        flush_waiting: Mutex::new(None),
    });
    let engine = Arc::new(Engine::format(dir.path(), device.clone(), config()).unwrap());
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];

    // A large write whose staged data's flush is held.
    let (waiting_tx, waiting_rx) = mpsc::channel();
    *device.flush_waiting.lock() = Some(waiting_tx);
    *device.held.lock() = true;
    let large = data(1, 1 << 20);
    let staged = engine.stage(&large, true).unwrap();
    let large_writer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            engine.submit(Transaction::new().op(Op::WriteStaged { coll, name: b"large".to_vec(), offset: 0, staged }))
        })
    };
    waiting_rx.recv().expect("the flusher reaches the held flush");

    // A small write meanwhile: inline in the KV store, it needs no device flush.
    let small = data(2, 4096);
    let (done_tx, done_rx) = mpsc::channel();
    let small_writer = {
        let (engine, small) = (engine.clone(), small.clone());
        std::thread::spawn(move || {
            let _ = done_tx.send(small_write(&engine, coll, b"small", small));
        })
    };
    let small_result = done_rx.recv_timeout(WRITE_DEADLINE);
    let small_read = engine.reader().lookup(coll, b"small").unwrap().map(|info| info.size_bytes);
    let large_visible = engine.reader().lookup(coll, b"large").unwrap().is_some();
    device.release();
    small_writer.join().unwrap();
    let small_result = small_result.expect("the small write committed while the large write's flush was held");
    small_result.expect("the small write succeeds");
    assert_eq!(small_read, Some(4096), "the small write is visible once acknowledged");
    assert!(!large_visible, "the large write is not committed before its data is durable");

    large_writer.join().unwrap().expect("the large write commits once its flush completes");
    let r = engine.reader();
    let info = r.lookup(coll, b"large").unwrap().expect("the large object");
    assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), large);
    let info = r.lookup(coll, b"small").unwrap().expect("the small object");
    assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), small);
    drop(r);
    engine.close().unwrap();
}

/// Many writers of both kinds at once: every write is acknowledged and reads back, and the engine closes.
#[test]
fn writes_with_and_without_staged_data_all_commit_and_read_back() {
    let d = SimDrive::new(config());
    let engine = d.engine();
    let coll = d.coll;
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                for i in 0..16u64 {
                    let name = format!("t{t}-{i}");
                    if (t + i) % 3 == 0 {
                        let staged = engine.stage(&data(t * 100 + i, 64 << 10), true).unwrap();
                        let op = Op::WriteStaged { coll, name: name.into_bytes(), offset: 0, staged };
                        engine.submit(Transaction::new().op(op)).unwrap();
                    } else {
                        small_write(engine, coll, name.as_bytes(), data(t * 100 + i, 1000)).unwrap();
                    }
                }
            });
        }
    });
    for t in 0..8u64 {
        for i in 0..16u64 {
            let len = if (t + i) % 3 == 0 { 64 << 10 } else { 1000 };
            let got = d.read_all(format!("t{t}-{i}").as_bytes()).expect("every acknowledged write is there");
            assert_eq!(got, data(t * 100 + i, len));
        }
    }
    assert!(engine.check().unwrap().is_clean(), "no leaked or doubly used blocks");
}

/// Group commit's gathering (`EngineConfig::commit_gather`) holds a group only while groups of several
/// transactions have been forming: a client alone, whose transactions come one after another, is never
/// held, and each of its writes is a group of its own.
#[test]
fn a_lone_client_is_never_held_for_a_group() {
    let cfg = EngineConfig { commit_gather: Duration::from_secs(5), ..config() };
    let d = SimDrive::new(cfg);
    let engine = d.engine();
    let before = engine.stats();
    for i in 0..200u64 {
        small_write(engine, d.coll, format!("lone-{i}").as_bytes(), data(i, 100)).unwrap();
    }
    let after = engine.stats();
    assert_eq!(after.groups_gathered, before.groups_gathered, "no group was held");
    assert_eq!(
        after.groups_committed - before.groups_committed,
        after.transactions_committed - before.transactions_committed,
        "one transaction per group"
    );
    assert_eq!(d.read_all(b"lone-199"), Some(data(199, 100)));
}
