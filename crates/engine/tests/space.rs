//! A thin drive: the data file holds what is stored and grows in preallocated steps up to the drive's
//! capacity; a drive at its capacity is full like any other; the bounds on fragments per block and
//! attributes per object hold at the limit and past it.

mod common;

use common::*;
use mosaic_engine::*;
use std::sync::Arc;

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Blocks allocated to a file by the file system (what it really takes on the disk).
fn file_blocks_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn a_thin_drive_file_grows_in_steps_up_to_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let capacity = 256 << 20;
    let device = FileDevice::create_with(&data, 1 << 20, IoEngine::Pread).unwrap();
    let engine = Engine::format_with_capacity(dir.path(), Arc::new(device), capacity, config()).unwrap();
    // A new drive takes the superblock area and one step, not its capacity.
    assert_eq!(file_len(&data), (1 << 20) + (64 << 20));
    assert!(file_blocks_bytes(&data) <= (66 << 20), "{}", file_blocks_bytes(&data));
    let usage = engine.space_usage();
    assert_eq!((usage.allocated_bytes, usage.capacity_bytes), (65 << 20, capacity));
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];
    let put = |e: &Engine, i: u64| {
        let name = format!("o{i}").into_bytes();
        e.submit(Transaction::new().op(Op::Write { coll, name, offset: 0, data: data_of(i) }))
    };
    for i in 0..12 {
        put(&engine, i).unwrap();
    }
    // 96 MiB stored: the file grew past its first step, by whole steps, and no further than needed.
    let grown = file_len(&data);
    assert!(grown > 65 << 20 && grown <= 130 << 20, "{grown}");
    assert_eq!(engine.space_usage().allocated_bytes, grown);
    assert!(engine.space_usage().used_bytes >= 96 << 20);
    engine.close().unwrap();
    drop(engine);
    // Reopened, the drive knows its size from the file and its capacity from the superblock.
    let device = FileDevice::open_with(&data, IoEngine::Pread).unwrap();
    let engine = Engine::open(dir.path(), Arc::new(device), config()).unwrap();
    assert_eq!(engine.space_usage().allocated_bytes, grown);
    let r = engine.reader();
    for i in 0..12 {
        let info = r.lookup(coll, format!("o{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), data_of(i));
    }
    drop(r);
    // At its capacity the drive is full, cleanly, and the file stops there.
    let err = (12..100).map(|i| put(&engine, i)).find_map(|r| r.err()).expect("the drive fills up");
    assert!(matches!(err.cause(), EngineError::NoSpace { .. }), "{err}");
    assert!(file_len(&data) <= capacity);
    assert!(engine.check().unwrap().is_clean());
    engine.close().unwrap();
}

fn data_of(i: u64) -> Vec<u8> {
    data(i, 8 << 20)
}

/// Sim devices grow the same way, so crash tests can run on a thin drive.
#[test]
fn a_thin_sim_device_grows_and_refuses_past_its_capacity() {
    let dev = SimDevice::thin(4 << 20, 8 << 20);
    assert_eq!((dev.size_bytes(), dev.capacity_bytes()), (4 << 20, 8 << 20));
    dev.grow_to(6 << 20).unwrap();
    assert_eq!(dev.size_bytes(), 6 << 20);
    assert!(dev.grow_to(9 << 20).is_err());
    let mut buf = AlignedBuf::zeroed(4096);
    assert!(dev.read_at(buf.as_mut_slice(), 7 << 20).is_err(), "past the size, within the capacity");
}

/// A block holds at most MAX_FRAGS_PER_BLOCK fragments: with lazy sync off, thousands of one-byte writes
/// into one block are merged by the write path before the bound, and every byte reads back.
#[test]
fn fragments_per_block_stay_bounded() {
    for inline in [true, false] {
        let cfg = if inline { config() } else { EngineConfig { inline_max_bytes: 0, ..config() } };
        let d = SimDrive::new(cfg);
        let name = b"frag".to_vec();
        let mut model = vec![0u8; 4096];
        d.engine()
            .submit(Transaction::new().op(Op::Write {
                coll: d.coll,
                name: name.clone(),
                offset: 0,
                data: vec![0; 4096],
            }))
            .unwrap();
        for i in 0..(MAX_FRAGS_PER_BLOCK * 3 / 2) {
            let (offset, byte) = ((i * 7919) % 4095 + 1, (i % 251) as u8);
            model[offset] = byte;
            let op = Op::Write { coll: d.coll, name: name.clone(), offset: offset as u64, data: vec![byte] };
            d.engine().submit(Transaction::new().op(op)).unwrap();
        }
        assert_eq!(d.read_all(&name).unwrap(), model, "inline {inline}");
        assert!(d.engine().check().unwrap().is_clean());
        if !inline {
            assert!(d.engine().stats().rmw_on_write_path >= 2, "the write path merged the block");
        }
    }
}

/// An object holds at most MAX_ATTRS_PER_OBJECT attributes: the next new one is refused, replacing one is
/// not, and the object can still be cloned and removed.
#[test]
fn attributes_per_object_stay_bounded() {
    let d = SimDrive::new(config());
    let name = b"attrs".to_vec();
    let set = |k: usize| Op::SetAttr {
        coll: d.coll,
        name: name.clone(),
        key: format!("k{k:06}").into_bytes(),
        value: vec![1],
    };
    // Half in the transaction that creates the object, half in one that adds to it.
    let mut txn = Transaction::new().op(Op::Create { coll: d.coll, name: name.clone() });
    for k in 0..MAX_ATTRS_PER_OBJECT / 2 {
        txn.push(set(k));
    }
    d.engine().submit(txn).unwrap();
    d.engine()
        .submit(Transaction {
            ops: (MAX_ATTRS_PER_OBJECT / 2..MAX_ATTRS_PER_OBJECT).map(set).collect(),
            priority: None,
        })
        .unwrap();
    let e = d.engine().submit(Transaction::new().op(set(MAX_ATTRS_PER_OBJECT))).unwrap_err();
    assert!(matches!(e.cause(), EngineError::Limit(_)), "{e}");
    d.engine().submit(Transaction::new().op(set(7))).unwrap();
    let clone = Op::Clone { coll: d.coll, from: name.clone(), to_coll: d.coll, to: b"copy".to_vec() };
    d.engine().submit(Transaction::new().op(clone)).unwrap();
    assert_eq!(
        d.engine()
            .reader()
            .attrs(d.engine().reader().lookup(d.coll, b"copy").unwrap().unwrap().nid, b"", 10)
            .unwrap()
            .len(),
        10
    );
    d.engine().submit(Transaction::new().op(Op::Remove { coll: d.coll, name: name.clone() })).unwrap();
    d.engine().submit(Transaction::new().op(Op::Remove { coll: d.coll, name: b"copy".to_vec() })).unwrap();
    assert!(d.engine().check().unwrap().is_clean());
}

/// A transaction holds at most MAX_TXN_OPS operations.
#[test]
fn transactions_are_bounded() {
    let d = SimDrive::new(config());
    let op = |i: usize| Op::Write {
        coll: d.coll,
        name: format!("t{}", i % 4).into_bytes(),
        offset: i as u64,
        data: vec![1],
    };
    let e = d.engine().submit(Transaction { ops: (0..=MAX_TXN_OPS).map(op).collect(), priority: None }).unwrap_err();
    assert!(matches!(e, EngineError::Limit(_)), "{e}");
    d.engine().submit(Transaction { ops: (0..1000).map(op).collect(), priority: None }).unwrap();
}
