//! Device full, device errors, bit flips in data blocks and KV values, restart during lazy sync.

mod common;

use common::*;
use mosaic_engine::*;
use std::sync::Arc;

fn put(d: &SimDrive, name: &str, data: Vec<u8>) -> Result<Outcome> {
    d.engine().submit(Transaction::new().op(Op::Write {
        coll: d.coll,
        name: name.as_bytes().to_vec(),
        offset: 0,
        data,
    }))
}

#[test]
fn device_full_is_clean_and_recoverable() {
    let d = SimDrive::new(config());
    let mut written = Vec::new();
    let mut i = 0;
    let err = loop {
        let name = format!("fill-{i}");
        match put(&d, &name, data(i, 1 << 20)) {
            Ok(_) => written.push(name),
            Err(e) => break e,
        }
        i += 1;
        assert!(i < 1000, "the device never filled up");
    };
    assert!(matches!(err.cause(), EngineError::NoSpace { .. }), "{err}");
    // Everything acknowledged is intact, and accounting is exact.
    for (n, name) in written.iter().enumerate() {
        assert_eq!(d.read_all(name.as_bytes()).unwrap(), data(n as u64, 1 << 20));
    }
    assert!(d.engine().check().unwrap().is_clean());
    // Removing objects makes room again (after the freeing commit is durable).
    for name in written.iter().take(4) {
        d.engine().submit(Transaction::new().op(Op::Remove { coll: d.coll, name: name.as_bytes().to_vec() })).unwrap();
    }
    put(&d, "after", data(99, 1 << 20)).unwrap();
    assert_eq!(d.read_all(b"after").unwrap(), data(99, 1 << 20));
    assert!(d.engine().check().unwrap().is_clean());
}

#[test]
fn device_errors_make_the_drive_read_only() {
    let mut d = SimDrive::new(config());
    put(&d, "before", data(1, 64 << 10)).unwrap();
    d.device.set_failing(true);
    let e = put(&d, "during", data(2, 64 << 10)).unwrap_err();
    assert!(matches!(e.cause(), EngineError::Io(_) | EngineError::ReadOnly(_)), "{e}");
    assert!(!d.engine().is_healthy());
    assert!(d.engine().failure().is_some());
    // Later writes are refused with a clear error, never silently dropped.
    let e = put(&d, "later", data(3, 100)).unwrap_err();
    assert!(matches!(e.cause(), EngineError::ReadOnly(_)), "{e}");
    d.device.set_failing(false);
    d.reopen(config());
    assert_eq!(d.read_all(b"before").unwrap(), data(1, 64 << 10));
    assert!(d.read_all(b"during").is_none());
    assert!(d.engine().check().unwrap().is_clean());
}

#[test]
fn flipped_data_bits_are_detected_on_read_and_by_scrub() {
    let d = SimDrive::new(config());
    put(&d, "victim", data(1, 256 << 10)).unwrap();
    put(&d, "bystander", data(2, 256 << 10)).unwrap();
    // Find a physical block of the victim by scanning the device for its content.
    let want = data(1, 256 << 10);
    let image_block = {
        let dev = d.engine().debug_device();
        let mut buf = AlignedBuf::zeroed(4096);
        let mut found = None;
        for b in 256..(DEVICE_BYTES / 4096) {
            dev.read_at(buf.as_mut_slice(), b * 4096).unwrap();
            if buf.as_slice() == &want[8192..12288] {
                found = Some(b);
                break;
            }
        }
        found.expect("victim block on the device")
    };
    d.device.corrupt_byte(image_block * 4096 + 17);
    let r = d.engine().reader();
    let info = r.lookup(d.coll, b"victim").unwrap().unwrap();
    let e = r.read(info.nid, 0, info.size_bytes).unwrap_err();
    // Block 2 is in the first 16 KiB checksum unit of the object's run (blocks 0-3): the error names the
    // unit's first block.
    assert!(matches!(e.cause(), EngineError::Checksum { object, block: 0, .. } if object == "victim"), "{e}");
    assert!(d.engine().stats().checksum_errors >= 1);
    // Other units of the same object and other objects still read; the damaged unit never does.
    assert_eq!(r.read(info.nid, 16384, 16384).unwrap(), want[16384..32768]);
    assert!(r.read(info.nid, 0, 4096).is_err());
    assert_eq!(d.read_all(b"bystander").unwrap(), data(2, 256 << 10));
    let scrub = d.engine().scrub(None).unwrap();
    assert_eq!(scrub.damaged.len(), 1, "{scrub:?}");
    assert_eq!(scrub.damaged[0].1, b"victim");
}

#[test]
fn flipped_fragment_bits_are_detected() {
    let mut d = SimDrive::new(config());
    put(&d, "small", data(5, 3000)).unwrap();
    d.engine().close().unwrap();
    d.engine = None;
    // Flip a byte inside the fragment value in the KV store files on disk (RocksDB WAL or SST).
    let needle = data(5, 3000)[100..132].to_vec();
    let mut flipped = false;
    for entry in std::fs::read_dir(d.dir.path().join("kv")).unwrap() {
        let p = entry.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        if let Some(pos) = bytes.windows(needle.len()).position(|w| w == needle.as_slice()) {
            bytes[pos + 5] ^= 0x40;
            std::fs::write(&p, bytes).unwrap();
            flipped = true;
        }
    }
    assert!(flipped, "fragment bytes not found in the KV files");
    // Either RocksDB's own checksums refuse the damaged record at open or read, or the fragment's crc does.
    match d.reopen_result(config()) {
        Err(_) => {}
        Ok(()) => {
            let r = d.engine().reader();
            if let Ok(Some(info)) = r.lookup(d.coll, b"small") {
                assert!(r.read(info.nid, 0, info.size_bytes).is_err(), "damaged bytes were returned")
            }
            let scrub = d.engine().scrub(None);
            assert!(scrub.is_err() || !scrub.unwrap().damaged.is_empty() || d.read_all(b"small").is_none());
        }
    }
}

#[test]
fn restart_during_lazy_sync_loses_nothing() {
    let cfg = EngineConfig { lazy_sync: true, ..config() };
    let mut d = SimDrive::new(cfg.clone());
    let mut m = Model::new();
    for i in 0..300u64 {
        let op = ModelOp::Append { obj: (i % 2) as u8, len: 1500, seed: i };
        try_apply(&mut d, &mut m, &op, &cfg).unwrap();
    }
    // Crash with whatever lazy sync has in flight, then recover.
    d.device.arm_crash(3, CrashMode::DropUnflushed);
    let _ = d.engine().sync_fragments(true);
    d.device.crash(CrashMode::DropUnflushed);
    d.device.revive();
    d.reopen(cfg.clone());
    assert_matches_model(&d, &m);
    assert!(d.engine().check().unwrap().is_clean());
    d.engine().sync_fragments(true).unwrap();
    assert_matches_model(&d, &m);
    assert!(d.engine().scrub(None).unwrap().damaged.is_empty());
    let _ = Arc::new(0);
}

#[test]
fn staged_blocks_of_a_failed_transaction_are_reused() {
    let d = SimDrive::new(config());
    let free_before = d.engine().stats().free_blocks;
    let staged = d.engine().stage(&data(1, 1 << 20), true).unwrap();
    // Append with a wrong offset fails the whole transaction.
    let e = d
        .engine()
        .submit(
            Transaction::new()
                .op(Op::WriteStaged { coll: d.coll, name: b"x".to_vec(), offset: 0, staged })
                .op(Op::Append { coll: d.coll, name: b"x".to_vec(), data: vec![1], expected_offset: Some(7) }),
        )
        .unwrap_err();
    assert!(matches!(e.cause(), EngineError::OffsetMismatch { .. }));
    assert_eq!(e.op_index(), Some(1), "the error names the append, the second operation: {e}");
    assert!(e.to_string().starts_with("operation 1 (append): "), "{e}");
    assert_eq!(d.engine().stats().free_blocks, free_before);
    assert!(d.read_all(b"x").is_none());
    assert!(d.engine().check().unwrap().is_clean());
}

#[test]
fn limits_hold_at_the_limit_and_fail_past_it() {
    let d = SimDrive::new(EngineConfig { max_op_data_bytes: 1 << 20, ..config() });
    let submit = |op: Op| d.engine().submit(Transaction::new().op(op));
    let name = |n: usize| vec![b'n'; n];
    submit(Op::Create { coll: d.coll, name: name(MAX_NAME_BYTES) }).unwrap();
    let e = submit(Op::Create { coll: d.coll, name: name(MAX_NAME_BYTES + 1) }).unwrap_err();
    assert!(matches!(e.cause(), EngineError::InvalidArgument(_)), "{e}");
    let obj = name(MAX_NAME_BYTES);
    let attr =
        |k: usize, v: usize| Op::SetAttr { coll: d.coll, name: obj.clone(), key: vec![b'k'; k], value: vec![0; v] };
    submit(attr(MAX_ATTR_KEY_BYTES, MAX_ATTR_VALUE_BYTES)).unwrap();
    assert!(matches!(submit(attr(MAX_ATTR_KEY_BYTES + 1, 1)).unwrap_err().cause(), EngineError::InvalidArgument(_)));
    assert!(matches!(submit(attr(1, MAX_ATTR_VALUE_BYTES + 1)).unwrap_err().cause(), EngineError::Limit(_)));
    // One op carries at most max_op_data_bytes, aligned or not.
    let write = |offset: u64, len: usize| Op::Write { coll: d.coll, name: obj.clone(), offset, data: vec![7; len] };
    submit(write(0, 1 << 20)).unwrap();
    assert!(matches!(submit(write(0, (1 << 20) + 1)).unwrap_err().cause(), EngineError::Limit(_)));
    assert!(matches!(submit(write(100, (1 << 20) + 1)).unwrap_err().cause(), EngineError::Limit(_)));
    let e = submit(write(MAX_OBJECT_BYTES, 1)).unwrap_err();
    assert!(matches!(e.cause(), EngineError::Limit(_)), "{e}");
    assert_eq!(d.read_all(&obj).unwrap(), vec![7; 1 << 20]);
    assert!(d.engine().check().unwrap().is_clean());
}

#[test]
fn a_database_of_another_format_version_is_refused() {
    let mut d = SimDrive::new(config());
    d.engine().close().unwrap();
    d.engine = None;
    {
        let db = rocksdb::DB::open_cf(
            &rocksdb::Options::default(),
            d.dir.path().join("kv"),
            ["names", "onodes", "blocks", "frags", "attrs", "omap", "alloc", "refs"],
        )
        .unwrap();
        db.put(b"format_version", 99u32.to_be_bytes()).unwrap();
    }
    let e = d.reopen_result(config()).unwrap_err();
    assert!(matches!(e.cause(), EngineError::UnsupportedVersion { found: 99, .. }), "{e}");
}

/// A database of the previous format (per-block block-map entries only) opens, reads as before and is marked
/// with the current version, so that builds of the previous format refuse it afterwards.
#[test]
fn a_database_of_the_previous_format_is_upgraded_in_place() {
    let mut d = SimDrive::new(config());
    put(&d, "kept", data(3, 20_000)).unwrap();
    d.engine().close().unwrap();
    d.engine = None;
    let set_version = |d: &SimDrive, v: Option<u32>| {
        let db = rocksdb::DB::open_cf(
            &rocksdb::Options::default(),
            d.dir.path().join("kv"),
            ["names", "onodes", "blocks", "frags", "attrs", "omap", "alloc", "refs"],
        )
        .unwrap();
        if let Some(v) = v {
            db.put(b"format_version", v.to_be_bytes()).unwrap();
        }
        db.get(b"format_version").unwrap().map(|raw| u32::from_be_bytes(raw.try_into().unwrap()))
    };
    set_version(&d, Some(1));
    d.reopen_result(config()).unwrap();
    assert_eq!(d.read_all(b"kept").unwrap(), data(3, 20_000));
    d.engine().close().unwrap();
    d.engine = None;
    assert_eq!(set_version(&d, None), Some(2));
}

/// A device whose page-cache reads return one flipped byte until the range is forgotten: a stale or damaged
/// cached page.
struct StaleCacheDevice {
    inner: SimDevice,
    stale: std::sync::atomic::AtomicBool,
    /// Whether reads that must not wait find the range in the page cache.
    resident: std::sync::atomic::AtomicBool,
}

impl StaleCacheDevice {
    fn new(stale: bool) -> Self {
        StaleCacheDevice { inner: SimDevice::new(DEVICE_BYTES), stale: stale.into(), resident: true.into() }
    }
}

impl Device for StaleCacheDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset_bytes)
    }
    fn read_cached_at(&self, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset_bytes)?;
        if self.stale.load(std::sync::atomic::Ordering::SeqCst) {
            buf[100] ^= 0x40;
        }
        Ok(())
    }
    fn read_cached_at_uninit_nowait(
        &self,
        buf: &mut [std::mem::MaybeUninit<u8>],
        offset_bytes: u64,
    ) -> std::io::Result<()> {
        if !self.resident.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        self.inner.read_cached_at_uninit(buf, offset_bytes)?;
        if self.stale.load(std::sync::atomic::Ordering::SeqCst) {
            buf[100].write(0x40);
        }
        Ok(())
    }
    fn forget_cached(&self, _offset_bytes: u64, _len_bytes: u64) {
        self.stale.store(false, std::sync::atomic::Ordering::SeqCst);
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset_bytes)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn kind(&self) -> &'static str {
        "stale-cache"
    }
}

#[test]
fn a_bad_cached_page_is_read_again_from_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(StaleCacheDevice::new(false));
    let engine = Engine::format(dir.path(), dev.clone(), config()).unwrap();
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];
    let want = data(9, 64 << 10);
    let write = Op::Write { coll, name: b"o".to_vec(), offset: 0, data: want.clone() };
    engine.submit(Transaction::new().op(write)).unwrap();
    dev.stale.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = engine.reader();
    let info = r.lookup(coll, b"o").unwrap().unwrap();
    assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), want, "the device's bytes, not the cache's");
    let s = engine.stats();
    assert_eq!((s.cache_rereads, s.checksum_errors), (1, 0));
    assert!(!dev.stale.load(std::sync::atomic::Ordering::SeqCst), "the bad pages were dropped");
    assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), want);
    assert_eq!(engine.stats().cache_rereads, 1);
}

/// A read that must not wait is the waiting read or nothing: the same bytes for every shape of object and
/// range when the device answers from memory; None past its size limit, when a device read would wait
/// (unless no device read is needed), and when the cached copy fails its checksum (the waiting read then
/// reads it again from the device).
#[test]
fn resident_reads_give_the_waiting_reads_bytes_or_nothing() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(StaleCacheDevice::new(false));
    let cfg = EngineConfig { inline_max_bytes: 0, page_cache_bytes: 0, ..config() };
    let engine = Engine::format(dir.path(), dev.clone(), cfg).unwrap();
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];
    let write = |name: &str, offset: u64, data: Vec<u8>| {
        engine.submit(Transaction::new().op(Op::Write { coll, name: name.into(), offset, data })).unwrap();
    };
    write("fragment", 0, data(1, 3000));
    write("blocks", 0, data(2, 64 << 10));
    write("mixed", 0, data(3, 64 << 10));
    write("mixed", 5000, data(4, 100));
    let staged = engine.stage(&data(5, 1 << 20), true).unwrap();
    engine
        .submit(Transaction::new().op(Op::WriteStaged { coll, name: b"staged".to_vec(), offset: 0, staged }))
        .unwrap();
    let r = engine.reader();
    let nid = |name: &str| r.lookup(coll, name.as_bytes()).unwrap().unwrap().nid;
    for name in ["fragment", "blocks", "mixed", "staged"] {
        for (offset, len) in [(0, u64::MAX), (4000, 9000), (1, 1), (2999, 5000), (10 << 20, 10)] {
            let want = r.read_bytes(nid(name), offset, len).unwrap();
            let got = r.read_bytes_resident(nid(name), offset, len, u64::MAX).unwrap();
            assert_eq!(got.as_ref(), Some(&want), "{name} at {offset}+{len}");
        }
        let size = r.lookup(coll, name.as_bytes()).unwrap().unwrap().size_bytes;
        assert_eq!(r.read_bytes_resident(nid(name), 0, u64::MAX, size - 1).unwrap(), None, "{name}: over the limit");
        assert!(r.read_bytes_resident(nid(name), 0, u64::MAX, size).unwrap().is_some(), "{name}: at the limit");
    }
    dev.resident.store(false, SeqCst);
    assert_eq!(r.read_bytes_resident(nid("blocks"), 0, 100, u64::MAX).unwrap(), None, "the device would wait");
    let frag = r.read_bytes_resident(nid("fragment"), 0, 100, u64::MAX).unwrap();
    assert_eq!(frag.as_deref(), Some(&data(1, 3000)[..100]), "no device read needed");
    dev.resident.store(true, SeqCst);
    dev.stale.store(true, SeqCst);
    assert_eq!(r.read_bytes_resident(nid("blocks"), 0, u64::MAX, u64::MAX).unwrap(), None, "a bad cached copy");
    assert_eq!(engine.stats().cache_rereads, 0);
    assert_eq!(r.read_bytes(nid("blocks"), 0, u64::MAX).unwrap(), data(2, 64 << 10));
    assert_eq!(engine.stats().cache_rereads, 1);
}

#[test]
fn reads_through_the_page_cache_see_every_direct_write() {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileDevice::create(&dir.path().join("data"), DEVICE_BYTES).unwrap();
    let engine = Engine::format(&dir.path().join("kv"), Arc::new(dev), config()).unwrap();
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];
    // Overwrites free blocks that later writes reuse: every read must see the newest bytes, never a page
    // cached from a block's earlier life.
    for round in 0..40u64 {
        let name = format!("o{}", round % 3).into_bytes();
        let want = data(round, (64 << 10) + (round as usize % 5) * 4096);
        engine.submit(Transaction::new().op(Op::Remove { coll, name: name.clone() })).ok();
        let write = Op::Write { coll, name: name.clone(), offset: 0, data: want.clone() };
        engine.submit(Transaction::new().op(write)).unwrap();
        let r = engine.reader();
        let info = r.lookup(coll, &name).unwrap().unwrap();
        assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), want, "round {round}");
    }
    let s = engine.stats();
    assert!(s.cached_bytes_read >= 40 * (64 << 10), "{s:?}");
    assert_eq!((s.cache_rereads, s.checksum_errors), (0, 0));
}

/// An engine on a 32 MiB file device, with one collection.
fn file_engine(cfg: EngineConfig) -> (tempfile::TempDir, Engine, CollectionId) {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileDevice::create(&dir.path().join("data"), DEVICE_BYTES).unwrap();
    let engine = Engine::format(&dir.path().join("kv"), Arc::new(dev), cfg).unwrap();
    let coll = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
    let coll = coll.created_collections[0];
    (dir, engine, coll)
}

/// Replaces `name` with `len` bytes of `data(seed)`.
fn replace(engine: &Engine, coll: CollectionId, name: &[u8], seed: u64, len: usize) -> Result<()> {
    engine.submit(Transaction::new().op(Op::Remove { coll, name: name.to_vec() })).ok();
    let op = Op::Write { coll, name: name.to_vec(), offset: 0, data: data(seed, len) };
    engine.submit(Transaction::new().op(op)).map(|_| ())
}

fn read_whole(engine: &Engine, coll: CollectionId, name: &[u8]) -> Result<bytes::Bytes> {
    let r = engine.reader();
    let info = r.lookup(coll, name)?.expect("the object exists");
    r.read_bytes(info.nid, 0, info.size_bytes)
}

/// A large read is served in place (pinned in the page cache and mapped, not copied), and the bytes it
/// returns hold their blocks: overwrites that free and reuse the device's blocks while the bytes live (the
/// reader already dropped, as when a socket still sends them) change nothing in them.
#[test]
fn large_reads_are_served_in_place_and_hold_their_blocks_until_dropped() {
    let (_dir, engine, coll) = file_engine(config());
    let len = 1 << 20;
    replace(&engine, coll, b"big", 1, len).unwrap();
    // The blocks were written directly, so the pin reads them into the page cache first.
    let held = read_whole(&engine, coll, b"big").unwrap();
    assert_eq!(held, data(1, len));
    let mapped = engine.stats().mapped_bytes_read;
    assert!(mapped >= len as u64, "mapped {mapped} bytes");
    // Overwrites of a 32 MiB device with 1 MiB: while the held bytes pin their epoch, no block freed since
    // is reused, so the device fills up (without the pin, 40 rounds reuse blocks and fit).
    let mut full = false;
    for round in 0..40u64 {
        match replace(&engine, coll, b"big", 100 + round, len) {
            Ok(()) => assert_eq!(read_whole(&engine, coll, b"big").unwrap(), data(100 + round, len), "round {round}"),
            Err(e) => {
                assert!(matches!(e.cause(), EngineError::NoSpace { .. }), "{e}");
                full = true;
                break;
            }
        }
    }
    assert!(full, "held bytes keep every block freed after them from reuse");
    assert_eq!(held, data(1, len), "bytes served in place never change while they live");
    drop(held);
    // The next commit releases what the pin held back; then overwrites reuse blocks again.
    let nudge = Op::Write { coll, name: b"nudge".to_vec(), offset: 0, data: vec![1; 100] };
    engine.submit(Transaction::new().op(nudge)).unwrap();
    for round in 0..40u64 {
        replace(&engine, coll, b"big", 200 + round, len).unwrap();
        let got = read_whole(&engine, coll, b"big").unwrap();
        assert_eq!(got, data(200 + round, len), "after the bytes dropped, round {round}");
    }
    let s = engine.stats();
    assert_eq!((s.cache_rereads, s.checksum_errors), (0, 0));
    assert!(engine.check().unwrap().is_clean());
}

/// A large read again of the same blocks is served from what the first one kept verified (no checksum
/// pass), and what is kept is forgotten once its blocks are freed: with blocks reused round after round on
/// a small device, every read has the newest bytes.
#[test]
fn large_reads_kept_verified_are_served_again_and_forgotten_when_their_blocks_are_freed() {
    let (_dir, engine, coll) = file_engine(config());
    let len = 1 << 20;
    for round in 0..40u64 {
        replace(&engine, coll, b"big", round, len).unwrap();
        assert_eq!(engine.stats().verified_cache_bytes, 0, "the old blocks were freed: nothing kept of them");
        let before = engine.stats().verified_bytes_read;
        assert_eq!(read_whole(&engine, coll, b"big").unwrap(), data(round, len), "round {round}, first read");
        assert_eq!(engine.stats().verified_cache_bytes, len as u64, "the first read keeps its segment");
        assert_eq!(read_whole(&engine, coll, b"big").unwrap(), data(round, len), "round {round}, kept");
        assert_eq!(engine.stats().verified_bytes_read, before + len as u64, "the second read is the kept one");
    }
    assert_eq!(engine.stats().checksum_errors, 0);
}

/// Damage under a large read (every data block of the file changed, as the page cache shows it) is an
/// error naming it, never bytes.
#[test]
fn damage_under_a_large_read_is_an_error_never_bytes() {
    let (dir, engine, coll) = file_engine(EngineConfig { verified_cache_bytes: 0, ..config() });
    let len = 1 << 20;
    replace(&engine, coll, b"big", 1, len).unwrap();
    assert_eq!(read_whole(&engine, coll, b"big").unwrap(), data(1, len));
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("data")).unwrap();
    for block in 16..DEVICE_BYTES / 4096 {
        f.write_all_at(&[0xa5], block * 4096 + 7).unwrap();
    }
    let e = read_whole(&engine, coll, b"big").unwrap_err();
    assert!(matches!(e, EngineError::Checksum { .. }), "{e}");
    assert!(engine.stats().mapped_bytes_read >= len as u64, "the first read was served in place");
}

/// `read_into` of `len` bytes at `offset` into the even 4 KiB pieces of a buffer twice as long (as an
/// erasure set interleaves its shards): the bytes read, and the pieces' bytes in order.
fn read_scattered(engine: &Engine, coll: CollectionId, offset: u64, len: usize) -> Result<(u64, Vec<u8>)> {
    let r = engine.reader();
    let info = r.lookup(coll, b"big")?.expect("the object exists");
    let mut buf = vec![0xeeu8; 2 * len.next_multiple_of(4096)];
    let mut pieces: Vec<&mut [std::mem::MaybeUninit<u8>]> = buf
        .chunks_mut(4096)
        .step_by(2)
        // SAFETY: u8 and MaybeUninit<u8> share a layout, and these bytes are initialised.
        .map(|c| unsafe { &mut *(c as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) })
        .collect();
    let last = pieces.len() - 1;
    let short = pieces[last].len() - (len.next_multiple_of(4096) - len);
    pieces[last] = &mut std::mem::take(&mut pieces[last])[..short];
    let n = r.read_into(info.nid, offset, &mut pieces)?;
    Ok((n, buf.chunks(4096).step_by(2).flatten().copied().take(n as usize).collect()))
}

/// A scattered read lands in its pieces verified, is kept verified and served again from what it kept,
/// and is never mapped into the process; unaligned and short reads copy; kept segments are forgotten when
/// their blocks are freed (blocks reused round after round on a small device).
#[test]
fn scattered_reads_land_in_their_pieces_verified_and_kept_without_a_mapping() {
    let (_dir, engine, coll) = file_engine(config());
    let len = 1 << 20;
    for round in 0..20u64 {
        replace(&engine, coll, b"big", round, len).unwrap();
        let (mapped, verified) = (engine.stats().mapped_bytes_read, engine.stats().verified_bytes_read);
        assert_eq!(read_scattered(&engine, coll, 0, len).unwrap(), (len as u64, data(round, len)), "round {round}");
        assert_eq!(engine.stats().verified_cache_bytes, len as u64, "the first read keeps its segment");
        assert_eq!(read_scattered(&engine, coll, 0, len).unwrap(), (len as u64, data(round, len)), "kept");
        assert_eq!(engine.stats().verified_bytes_read, verified + len as u64, "the second read is the kept one");
        assert_eq!(engine.stats().mapped_bytes_read, mapped, "nothing was mapped");
    }
    let want = data(19, len);
    let (n, got) = read_scattered(&engine, coll, 100, 300_000).unwrap();
    assert_eq!((n, &got[..]), (300_000, &want[100..300_100]), "an unaligned read");
    let (n, got) = read_scattered(&engine, coll, len as u64 - 8192, 3 * 4096).unwrap();
    assert_eq!((n, &got[..]), (8192, &want[len - 8192..]), "a read past the end is short");
    assert_eq!(read_scattered(&engine, coll, len as u64, 4096).unwrap().0, 0, "a read at the end");
    let s = engine.stats();
    assert_eq!((s.cache_rereads, s.checksum_errors), (0, 0));
}

/// Damage under a scattered read (as the page cache shows it) is an error naming it, never bytes.
#[test]
fn damage_under_a_scattered_read_is_an_error_never_bytes() {
    let (dir, engine, coll) = file_engine(EngineConfig { verified_cache_bytes: 0, ..config() });
    let len = 1 << 20;
    replace(&engine, coll, b"big", 1, len).unwrap();
    assert_eq!(read_scattered(&engine, coll, 0, len).unwrap().1, data(1, len));
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(dir.path().join("data")).unwrap();
    for block in 16..DEVICE_BYTES / 4096 {
        f.write_all_at(&[0xa5], block * 4096 + 7).unwrap();
    }
    let e = read_scattered(&engine, coll, 0, len).unwrap_err();
    assert!(matches!(e, EngineError::Checksum { .. }), "{e}");
    assert!(engine.stats().checksum_errors > 0);
}

#[test]
fn name_tags_are_listed_kept_on_rename_dropped_on_reset_and_bounded() {
    let d = SimDrive::new(config());
    let e = d.engine();
    let (coll, a, b) = (d.coll, b"a".to_vec(), b"b".to_vec());
    put(&d, "a", data(1, 100)).unwrap();
    let tag = |t: &[u8]| Op::SetNameTag { coll, name: a.clone(), tag: t.to_vec() };
    e.submit(Transaction::new().op(tag(b"size=100"))).unwrap();
    let listed = e.reader().list_entries(coll, b"", b"", 10).unwrap();
    assert_eq!((listed.len(), listed[0].tag.as_deref()), (1, Some(&b"size=100"[..])));
    // The name index still resolves the name, and a listing without tags sees the same names.
    assert_eq!(e.reader().lookup(coll, b"a").unwrap().unwrap().size_bytes, 100);
    assert_eq!(d.names(), vec![a.clone()]);
    // At the limit it is stored; past it the transaction fails and nothing changes.
    e.submit(Transaction::new().op(tag(&[7; MAX_NAME_TAG_BYTES]))).unwrap();
    let err = e.submit(Transaction::new().op(tag(&[7; MAX_NAME_TAG_BYTES + 1]))).unwrap_err();
    assert!(matches!(err.cause(), EngineError::Limit(_)), "{err}");
    assert_eq!(e.reader().list_entries(coll, b"", b"", 10).unwrap()[0].tag, Some(vec![7; MAX_NAME_TAG_BYTES]));
    // A rename carries the tag; a reset (an overwrite) drops it; a missing object has none to set.
    e.submit(Transaction::new().op(Op::Rename { coll, from: a.clone(), to_coll: coll, to: b.clone() })).unwrap();
    let listed = e.reader().list_entries(coll, b"", b"", 10).unwrap();
    assert_eq!((listed[0].name.as_slice(), listed[0].tag.clone()), (&b[..], Some(vec![7; MAX_NAME_TAG_BYTES])));
    e.submit(Transaction::new().op(Op::Reset { coll, name: b.clone() })).unwrap();
    assert_eq!(e.reader().list_entries(coll, b"", b"", 10).unwrap()[0].tag, None);
    assert!(matches!(e.submit(Transaction::new().op(tag(b"x"))).unwrap_err().cause(), EngineError::NotFound));
    let report = e.check().unwrap();
    assert!(report.problems.is_empty(), "{report:?}");
}

#[test]
fn the_background_scrub_finds_damaged_blocks_and_starts_over() {
    let d = SimDrive::new(config());
    put(&d, "victim", data(1, 64 << 10)).unwrap();
    put(&d, "bystander", data(2, 64 << 10)).unwrap();
    let victim_block = {
        let r = d.engine().reader();
        let info = r.lookup(d.coll, b"victim").unwrap().unwrap();
        (info.nid, r.read(info.nid, 0, 4096).unwrap())
    };
    // Find the victim's first block on the device by its content and damage it.
    let dev = d.engine().debug_device();
    let mut buf = AlignedBuf::zeroed(4096);
    let physical = (0..DEVICE_BYTES / 4096)
        .find(|b| {
            dev.read_at(buf.as_mut_slice(), b * 4096).unwrap();
            buf.as_slice() == victim_block.1.as_slice()
        })
        .expect("victim block on the device");
    d.device.corrupt_byte(physical * 4096 + 5);
    // Reopen with the background scrub on: the scrub reads with O_DIRECT-style device reads, and finds it.
    let mut d = d;
    d.reopen(EngineConfig { scrub_bytes_per_s: 64 << 20, scrub_pass_interval: std::time::Duration::ZERO, ..config() });
    let status = d.engine().wait_for_scrub_passes(2, std::time::Duration::from_secs(60));
    assert!(status.passes_completed >= 2, "{status:?}");
    assert_eq!(status.damaged.len(), 1, "{status:?}");
    assert_eq!(status.damaged[0].0, victim_block.0);
    assert!(status.damaged[0].1.contains("checksum mismatch in block 0"), "{status:?}");
    // Every block of both objects is verified in each pass.
    assert!(status.blocks_checked >= 2 * 32, "{status:?}");
    assert!(d.engine().stats().checksum_errors >= 2);
}

/// An idle server stays idle: once the background scrub has walked an empty drive, and again once it has
/// walked a drive that then does not change, no new pass starts before the pass interval (counted passes).
#[test]
fn background_scrub_of_an_unchanged_drive_waits_for_its_interval() {
    let interval = std::time::Duration::from_secs(3600);
    let cfg = EngineConfig { scrub_bytes_per_s: 1 << 30, scrub_pass_interval: interval, ..config() };
    let d = SimDrive::new(cfg);
    let status = d.engine().wait_for_scrub_passes(1, std::time::Duration::from_secs(60));
    assert_eq!((status.passes_started, status.passes_completed), (1, 1), "{status:?}");
    let next = status.next_pass_in.expect("waiting for the interval");
    assert!(next > interval - std::time::Duration::from_secs(60), "{status:?}");
    // Writes wake nothing: the scrub still waits for its interval (a bounded look for a second pass).
    put(&d, "o", data(1, 64 << 10)).unwrap();
    let status = d.engine().wait_for_scrub_passes(2, std::time::Duration::from_millis(300));
    assert_eq!((status.passes_started, status.passes_completed), (1, 1), "{status:?}");
    assert_eq!(status.blocks_checked, 0, "the first pass walked an empty drive");
}

/// Waits (without sleeping) until `cond` holds, at most 30 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::yield_now();
    }
}

#[test]
fn prioritized_work_holds_background_work_back_for_a_bounded_time() {
    let d = SimDrive::new(EngineConfig { lazy_sync: true, ..config() });
    let e = d.engine();
    let coll = d.coll;
    // A high-priority object: its transaction runs in the foreground-high class and marks the onode.
    let mark = Op::SetPriority { coll, name: b"hot".to_vec(), high: true };
    e.submit(
        Transaction::new().op(Op::Write { coll, name: b"hot".to_vec(), offset: 0, data: data(1, 64 << 10) }).op(mark),
    )
    .unwrap();
    assert_eq!(e.stats().prioritized_in_flight, 0, "a transaction's guard ends with its answer");
    let reader = e.reader();
    let info = reader.lookup(coll, b"hot").unwrap().unwrap();
    assert!(info.high_priority);
    reader.prioritize();
    assert_eq!(e.stats().prioritized_in_flight, 1);
    // Fragments over lazy sync's threshold: lazy sync waits for the prioritized reader at each step...
    for i in 0..8u64 {
        let w = Op::Write { coll, name: b"cold".to_vec(), offset: 16384 + i * 512, data: data(i, 512) };
        e.submit(Transaction::new().op(w)).unwrap();
    }
    eventually("lazy sync waits for prioritized work", || e.stats().background_waits_for_priority > 0);
    // ...but only for a bounded time, so the merge still happens while the reader is held.
    eventually("lazy sync merges anyway", || e.stats().fragments_outstanding == 0);
    assert_eq!(reader.read(info.nid, 0, 64 << 10).unwrap(), data(1, 64 << 10));
    drop(reader);
    assert_eq!(e.stats().prioritized_in_flight, 0);
}

/// Readers racing an overwriting writer always see one whole version: name, onode, size, attribute and data
/// of the same commit (the metadata cache never mixes a newer onode or attribute with an older snapshot or
/// the reverse).
#[test]
fn readers_racing_overwrites_see_whole_versions_through_the_metadata_cache() {
    let d = SimDrive::new(config());
    let (e, coll) = (d.engine().clone(), d.coll);
    let version = |i: u64| -> Vec<u8> { vec![(i % 251) as u8; 1000 + (i as usize * 3331) % 40_000] };
    let write = |i: u64| {
        let t = Transaction::new()
            .op(Op::Reset { coll, name: b"k".to_vec() })
            .op(Op::Write { coll, name: b"k".to_vec(), offset: 0, data: version(i) })
            .op(Op::SetAttr { coll, name: b"k".to_vec(), key: b"v".to_vec(), value: i.to_be_bytes().to_vec() });
        e.submit(t).unwrap();
    };
    write(0);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || checked == 0 {
                    let r = e.reader();
                    let info = r.lookup(coll, b"k").unwrap().expect("the key always exists");
                    let got = r.read(info.nid, 0, info.size_bytes).unwrap();
                    let i = got[0] as u64;
                    assert_eq!(got.len() as u64, info.size_bytes);
                    assert!(got.iter().all(|&b| b as u64 == i), "bytes of two versions mixed");
                    let attr = r.attr(info.nid, b"v").unwrap().expect("every version has the attribute");
                    let v = u64::from_be_bytes(attr.try_into().unwrap());
                    assert_eq!(v % 251, i, "the attribute of another version");
                    assert_eq!(version(v).len(), got.len(), "the attribute of another version");
                    // The size is that of a version whose fill byte is this one.
                    assert!(
                        (0..2000u64).any(|v| v % 251 == i && version(v).len() == got.len()),
                        "size of another version"
                    );
                    checked += 1;
                }
                checked
            })
        })
        .collect();
    for i in 1..2000 {
        write(i);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let s = e.stats();
    assert!(s.meta_cache_hits > 0, "{s:?}");
    // The newest version is what a new reader sees.
    let r = e.reader();
    let info = r.lookup(coll, b"k").unwrap().unwrap();
    assert_eq!(r.read(info.nid, 0, info.size_bytes).unwrap(), version(1999));
}

/// Clients' readers begun while no commit is published share one view (one RocksDB snapshot and epoch
/// pin): such readers all see the same state, a write acknowledged after a reader began is seen by every
/// reader begun after it and never by the older one, and the view kept between commits holds back none of
/// the blocks that later commits free (the committer lets it go when it publishes).
#[test]
fn readers_share_a_view_between_commits_and_never_miss_an_acknowledged_write() {
    let d = SimDrive::new(config());
    let (e, coll) = (d.engine().clone(), d.coll);
    let object_bytes = 1 << 20;
    let write = |i: u64| put(&d, "k", data(i, object_bytes)).unwrap();
    let read = |r: &Reader| {
        let info = r.lookup(coll, b"k").unwrap().unwrap();
        r.read(info.nid, 0, info.size_bytes).unwrap()
    };
    write(1);
    let (a, b) = (e.reader(), e.reader());
    assert!(read(&a) == data(1, object_bytes) && read(&b) == data(1, object_bytes));
    write(2);
    assert!(read(&a) == data(1, object_bytes), "a reader keeps its snapshot");
    let c = e.reader();
    assert!(read(&c) == data(2, object_bytes), "a reader begun after an acknowledged write sees it");
    drop((a, b, c));

    // One reader, then overwrites and no readers: the view that reader took must not pin its epoch.
    let free_before = e.stats().free_blocks;
    drop(e.reader());
    for i in 3..40 {
        write(i);
    }
    let free_after = e.stats().free_blocks;
    let object_blocks = object_bytes as u64 / 4096;
    assert!(
        free_after + 2 * object_blocks >= free_before,
        "freed blocks held back: {free_before} free before, {free_after} after 37 overwrites"
    );
    assert!(d.read_all(b"k").unwrap() == data(39, object_bytes));
    assert!(e.check().unwrap().is_clean());
}

/// A reader remembers the last object it stat-ed: a second stat of it (a GET's read after its lookup)
/// costs no metadata-cache lookup and gives the same answer, another object's stat is its own, and the
/// answer stays the snapshot's after an overwrite while a new reader sees the new size.
#[test]
fn a_readers_repeated_stat_is_answered_from_the_reader_and_stays_its_snapshots() {
    let d = SimDrive::new(config());
    let (e, coll) = (d.engine().clone(), d.coll);
    for (name, len) in [(&b"a"[..], 100usize), (b"b", 200)] {
        e.submit(Transaction::new().op(Op::Write { coll, name: name.to_vec(), offset: 0, data: data(1, len) }))
            .unwrap();
    }
    let r = e.reader();
    let a = r.lookup(coll, b"a").unwrap().unwrap();
    let looked_up = {
        let s = e.stats();
        s.meta_cache_hits + s.meta_cache_misses
    };
    assert_eq!(r.stat(a.nid).unwrap(), a);
    let s = e.stats();
    assert_eq!(s.meta_cache_hits + s.meta_cache_misses, looked_up, "the second stat asked no cache");
    let b = r.lookup(coll, b"b").unwrap().unwrap();
    assert_eq!((b.size_bytes, r.stat(b.nid).unwrap().size_bytes, r.stat(a.nid).unwrap().size_bytes), (200, 200, 100));
    e.submit(Transaction::new().op(Op::Write { coll, name: b"a".to_vec(), offset: 100, data: data(2, 50) })).unwrap();
    assert_eq!(r.stat(a.nid).unwrap().size_bytes, 100, "the reader's snapshot");
    assert_eq!(r.read(a.nid, 0, 1000).unwrap(), data(1, 100));
    assert_eq!(e.reader().stat(a.nid).unwrap().size_bytes, 150, "a new reader sees the append");
}

/// Block-map runs: a large write is one entry per MAX_RUN_BLOCKS blocks; overwrites, lazy-sync merges,
/// truncation and clone_range split runs exactly where they change, including at the run limit.
#[test]
fn block_map_runs_split_where_they_change_and_stop_at_the_limit() {
    let mut d = SimDrive::new(EngineConfig { inline_max_bytes: 0, ..config() });
    let (coll, bs) = (d.coll, BLOCK_SIZE_BYTES as usize);
    let blocks = MAX_RUN_BLOCKS as usize + 5;
    let mut model = data(1, blocks * bs);
    let staged = d.engine().stage(&model, true).unwrap();
    d.engine()
        .submit(Transaction::new().op(Op::WriteStaged { coll, name: b"big".to_vec(), offset: 0, staged }))
        .unwrap();
    let runs = d.engine().debug_block_runs(coll, b"big").unwrap();
    assert_eq!(runs.len(), 2, "one entry per {MAX_RUN_BLOCKS} blocks: {runs:?}");
    assert_eq!((runs[0].0, runs[0].2, runs[1].0, runs[1].2), (0, MAX_RUN_BLOCKS, MAX_RUN_BLOCKS, 5));
    let size = d.engine().block_map_size().unwrap();
    assert_eq!((size.entries, size.blocks), (2, blocks as u64));
    assert!(size.bytes * 1024 * 1024 / (blocks * bs) as u64 <= 1100, "{size:?}");

    let check = |d: &SimDrive, model: &[u8]| {
        let r = d.engine().reader();
        let info = r.lookup(coll, b"big").unwrap().unwrap();
        assert_eq!(info.size_bytes, model.len() as u64);
        assert!(r.read(info.nid, 0, info.size_bytes).unwrap() == model, "content differs");
        // Reads that start inside a run find it by its start up to MAX_RUN_BLOCKS-1 blocks back.
        for lb in [1, 1000, MAX_RUN_BLOCKS - 1, MAX_RUN_BLOCKS, MAX_RUN_BLOCKS + 2] {
            let off = lb * bs as u64 + 100;
            if off < info.size_bytes {
                let got = r.read(info.nid, off, 5000).unwrap();
                let end = (off as usize + 5000).min(model.len());
                assert!(got == model[off as usize..end], "read at block {lb}");
            }
        }
        let report = d.engine().check().unwrap();
        assert!(report.is_clean(), "{report:?}");
    };
    check(&d, &model);

    // An aligned overwrite across the run limit: three runs become five.
    let over = data(2, 3 * bs);
    let off = (MAX_RUN_BLOCKS as usize - 1) * bs;
    d.engine()
        .submit(Transaction::new().op(Op::Write {
            coll,
            name: b"big".to_vec(),
            offset: off as u64,
            data: over.clone(),
        }))
        .unwrap();
    model[off..off + over.len()].copy_from_slice(&over);
    check(&d, &model);
    let runs = d.engine().debug_block_runs(coll, b"big").unwrap();
    assert_eq!(runs.iter().map(|r| r.2).sum::<u64>(), blocks as u64, "{runs:?}");
    // Block 1023 was in the 16 KiB checksum unit of blocks 1020-1023: the kept blocks were read (checked)
    // and got a checksum each.
    assert_eq!(d.engine().stats().checksum_split_reads, 1);

    // Unaligned writes inside a run, merged by lazy sync: the merged block splits its run.
    for i in 0..8u64 {
        let w = data(10 + i, 300);
        let off = 500 * bs + 17 + i as usize * 400;
        d.engine()
            .submit(Transaction::new().op(Op::Write {
                coll,
                name: b"big".to_vec(),
                offset: off as u64,
                data: w.clone(),
            }))
            .unwrap();
        model[off..off + w.len()].copy_from_slice(&w);
    }
    d.engine().sync_fragments(true).unwrap();
    assert_eq!(d.engine().stats().fragments_outstanding, 0);
    check(&d, &model);

    // clone_range from the middle of a run into another object, then truncate inside a run.
    let t = Transaction::new().op(Op::CloneRange {
        src_coll: coll,
        src: b"big".to_vec(),
        src_offset: 100 * bs as u64,
        len: 50 * bs as u64,
        dst_coll: coll,
        dst: b"copy".to_vec(),
        dst_offset: 0,
    });
    d.engine().submit(t).unwrap();
    let r = d.engine().reader();
    let copy = r.lookup(coll, b"copy").unwrap().unwrap();
    assert!(r.read(copy.nid, 0, 50 * bs as u64).unwrap() == model[100 * bs..150 * bs]);
    drop(r);
    let cut = 700 * bs + 123;
    d.engine()
        .submit(Transaction::new().op(Op::Truncate { coll, name: b"big".to_vec(), size_bytes: cut as u64 }))
        .unwrap();
    model.truncate(cut);
    check(&d, &model);
    d.reopen(config());
    check(&d, &model);
}

/// Paper 001's page cache: appends merge into dirty pages without a read; small reads of those blocks come
/// from memory; lazy sync writes a dirty page without reading; a reader older than a change never sees it.
#[test]
fn the_page_cache_serves_recent_writes_and_old_readers_keep_their_snapshot() {
    let mut d = SimDrive::new(EngineConfig { inline_max_bytes: 0, ..config() });
    let coll = d.coll;
    let mut model = Vec::new();
    for i in 0..16u64 {
        let piece = data(100 + i, 2048);
        let t = Transaction::new().op(Op::Append {
            coll,
            name: b"log".to_vec(),
            data: piece.clone(),
            expected_offset: None,
        });
        d.engine().submit(t).unwrap();
        model.extend_from_slice(&piece);
    }
    let before = d.engine().stats();
    assert_eq!(before.page_cache_dirty_pages, 8, "{before:?}");
    let r = d.engine().reader();
    let nid = r.lookup(coll, b"log").unwrap().unwrap().nid;
    assert!(r.read(nid, 0, model.len() as u64).unwrap() == model);
    let after = d.engine().stats();
    assert!(after.page_cache_hits >= before.page_cache_hits + 8, "{after:?}");
    let read_bytes = |s: &EngineStats| s.device_bytes_read + s.cached_bytes_read;
    assert_eq!(read_bytes(&after), read_bytes(&before), "served from memory");
    drop(r);

    // Lazy sync writes the appended blocks (they have no base yet); their pages become clean.
    d.engine().sync_fragments(true).unwrap();
    assert_eq!(d.engine().stats().page_cache_dirty_pages, 0);

    // A reader opened before an overwrite keeps reading the old bytes.
    let old_reader = d.engine().reader();
    let patch = data(999, 100);
    let w = Op::Write { coll, name: b"log".to_vec(), offset: 4096 + 10, data: patch.clone() };
    d.engine().submit(Transaction::new().op(w)).unwrap();
    assert!(old_reader.read(nid, 4096, 4096).unwrap() == model[4096..8192], "an old reader sees a newer page");
    model[4096 + 10..4096 + 110].copy_from_slice(&patch);
    assert!(d.engine().reader().read(nid, 4096, 4096).unwrap() == model[4096..8192]);
    drop(old_reader);

    // The overwrite merged into the clean page of a block that has a base: lazy sync writes the dirty
    // page without reading that base.
    assert_eq!(d.engine().stats().page_cache_dirty_pages, 1);
    let read_before = read_bytes(&d.engine().stats());
    d.engine().sync_fragments(true).unwrap();
    let s = d.engine().stats();
    assert_eq!((s.fragments_outstanding, s.page_cache_dirty_pages), (0, 0), "{s:?}");
    assert_eq!(read_bytes(&s), read_before, "lazy sync read a base block");
    assert!(d.engine().reader().read(nid, 0, model.len() as u64).unwrap() == model);
    assert!(d.engine().check().unwrap().is_clean());
    // A new process starts with an empty cache and reads the same bytes from the device.
    d.reopen(EngineConfig { inline_max_bytes: 0, ..config() });
    let r = d.engine().reader();
    assert!(r.read(nid, 0, model.len() as u64).unwrap() == model);
    assert!(read_bytes(&d.engine().stats()) > 0);
}
