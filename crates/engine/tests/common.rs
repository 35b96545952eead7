//! Shared helpers for engine tests: a simulated drive and a model of object contents.

#![allow(dead_code)]

use mosaic_engine::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

pub const DEVICE_BYTES: u64 = 32 << 20;

pub struct SimDrive {
    pub dir: tempfile::TempDir,
    pub device: SimDevice,
    /// None only while reopening: the old engine must be gone before the database is opened again.
    pub engine: Option<Engine>,
    pub coll: CollectionId,
}

pub fn config() -> EngineConfig {
    EngineConfig { lazy_sync: false, inline_max_bytes: 8192, kv_write_buffer_bytes: 4 << 20, ..Default::default() }
}

impl SimDrive {
    pub fn new(cfg: EngineConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let device = SimDevice::new(DEVICE_BYTES);
        let engine = Engine::format(dir.path(), Arc::new(device.clone()), cfg).unwrap();
        let out = engine.submit(Transaction::new().op(Op::CreateCollection { name: "c".into() })).unwrap();
        let coll = out.created_collections[0];
        SimDrive { dir, device, engine: Some(engine), coll }
    }

    pub fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine is open")
    }

    /// Closes the engine (errors ignored: after a crash it may be read-only) and opens it again.
    pub fn reopen_result(&mut self, cfg: EngineConfig) -> Result<()> {
        if let Some(e) = self.engine.take() {
            let _ = e.close();
        }
        self.engine = Some(Engine::open(self.dir.path(), Arc::new(self.device.clone()), cfg)?);
        Ok(())
    }

    pub fn reopen(&mut self, cfg: EngineConfig) {
        self.reopen_result(cfg).unwrap();
    }

    pub fn read_all(&self, name: &[u8]) -> Option<Vec<u8>> {
        let r = self.engine().reader();
        let info = r.lookup(self.coll, name).unwrap()?;
        Some(r.read(info.nid, 0, info.size_bytes).unwrap())
    }

    pub fn names(&self) -> Vec<Vec<u8>> {
        self.engine().reader().list(self.coll, b"", b"", usize::MAX).unwrap().into_iter().map(|(n, _)| n).collect()
    }
}

/// Deterministic bytes for (seed, len).
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The simple model: object name -> contents.
pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

pub fn model_write(m: &mut Model, name: &[u8], offset: u64, bytes: &[u8]) {
    let obj = m.entry(name.to_vec()).or_default();
    let end = offset as usize + bytes.len();
    if obj.len() < end {
        obj.resize(end, 0);
    }
    obj[offset as usize..end].copy_from_slice(bytes);
}

pub fn assert_matches_model(d: &SimDrive, m: &Model) {
    assert_eq!(d.names(), m.keys().cloned().collect::<Vec<_>>(), "names differ");
    // The batched stat of a listing page agrees with the model, in the order asked (here: reversed).
    let reader = d.engine().reader();
    let listed = reader.list(d.coll, b"", b"", usize::MAX).unwrap();
    let nids: Vec<u64> = listed.iter().rev().map(|(_, nid)| *nid).collect();
    let stats = reader.stat_many(&nids, b"none").unwrap();
    for ((name, nid), (info, attr)) in listed.iter().rev().zip(stats) {
        assert_eq!((info.nid, &info.name, attr), (*nid, name, None));
        assert_eq!(info.size_bytes, m[name].len() as u64, "stat_many size of {}", String::from_utf8_lossy(name));
    }
    for (name, want) in m {
        let got = d.read_all(name).expect("object present");
        assert_eq!(got.len(), want.len(), "size of {}", String::from_utf8_lossy(name));
        assert!(got == *want, "content of {} differs", String::from_utf8_lossy(name));
    }
}

#[derive(Debug, Clone)]
pub enum ModelOp {
    Write { obj: u8, offset: u32, len: u32, seed: u64 },
    Append { obj: u8, len: u32, seed: u64 },
    Staged { obj: u8, block: u16, blocks: u8, seed: u64 },
    Truncate { obj: u8, size: u32 },
    Remove { obj: u8 },
    Rename { from: u8, to: u8 },
    Clone { from: u8, to: u8 },
    CloneRange { from: u8, to: u8 },
    Sync,
    Reopen,
}

pub fn op_strategy() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        6 => (0u8..4, 0u32..70_000, 1u32..20_000, any::<u64>()).prop_map(|(obj, offset, len, seed)| ModelOp::Write { obj, offset, len, seed }),
        4 => (0u8..4, 1u32..6000, any::<u64>()).prop_map(|(obj, len, seed)| ModelOp::Append { obj, len, seed }),
        // Up to 40 blocks: runs of 16 and more carry 16 KiB checksum units, which later writes cut through.
        3 => (0u8..4, 0u16..20, 1u8..40, any::<u64>()).prop_map(|(obj, block, blocks, seed)| ModelOp::Staged { obj, block, blocks, seed }),
        2 => (0u8..4, 0u32..80_000).prop_map(|(obj, size)| ModelOp::Truncate { obj, size }),
        1 => (0u8..4).prop_map(|obj| ModelOp::Remove { obj }),
        1 => (0u8..4, 0u8..4).prop_map(|(from, to)| ModelOp::Rename { from, to }),
        1 => (0u8..4, 0u8..4).prop_map(|(from, to)| ModelOp::Clone { from, to }),
        1 => (0u8..4, 0u8..4).prop_map(|(from, to)| ModelOp::CloneRange { from, to }),
        1 => Just(ModelOp::Sync),
        1 => Just(ModelOp::Reopen),
    ]
}

pub fn name(obj: u8) -> Vec<u8> {
    format!("obj-{obj}").into_bytes()
}

/// Applies one op to the drive and, if the drive committed it, to the model. Errors that the model
/// predicts (NotFound, OffsetMismatch) are checked here; others are returned.
pub fn try_apply(d: &mut SimDrive, m: &mut Model, op: &ModelOp, cfg: &EngineConfig) -> Result<()> {
    let c = d.coll;
    let bs = BLOCK_SIZE_BYTES as usize;
    match op.clone() {
        ModelOp::Write { obj, offset, len, seed } => {
            let bytes = data(seed, len as usize);
            d.engine().submit(Transaction::new().op(Op::Write {
                coll: c,
                name: name(obj),
                offset: offset as u64,
                data: bytes.clone(),
            }))?;
            model_write(m, &name(obj), offset as u64, &bytes);
        }
        ModelOp::Append { obj, len, seed } => {
            let bytes = data(seed, len as usize);
            let expected = m.get(&name(obj)).map(|v| v.len() as u64).unwrap_or(0);
            d.engine().submit(Transaction::new().op(Op::Append {
                coll: c,
                name: name(obj),
                data: bytes.clone(),
                expected_offset: Some(expected),
            }))?;
            model_write(m, &name(obj), expected, &bytes);
            // A wrong offset is refused and changes nothing.
            let err = d.engine().submit(Transaction::new().op(Op::Append {
                coll: c,
                name: name(obj),
                data: vec![1],
                expected_offset: Some(expected + len as u64 + 1),
            }));
            match err {
                Err(e) if matches!(e.cause(), EngineError::OffsetMismatch { .. }) => {}
                Err(e) => return Err(e),
                Ok(_) => panic!("append at a wrong offset was accepted"),
            }
        }
        ModelOp::Staged { obj, block, blocks, seed } => {
            let bytes = data(seed, blocks as usize * bs);
            let staged = d.engine().stage(&bytes, false)?;
            let offset = block as u64 * bs as u64;
            d.engine().submit(Transaction::new().op(Op::WriteStaged { coll: c, name: name(obj), offset, staged }))?;
            model_write(m, &name(obj), offset, &bytes);
        }
        ModelOp::Truncate { obj, size } => {
            let r = d.engine().submit(Transaction::new().op(Op::Truncate {
                coll: c,
                name: name(obj),
                size_bytes: size as u64,
            }));
            match m.get_mut(&name(obj)) {
                Some(v) => {
                    r?;
                    v.resize(size as usize, 0);
                }
                None => assert!(matches!(r.as_ref().map_err(EngineError::cause), Err(EngineError::NotFound)), "{r:?}"),
            }
        }
        ModelOp::Remove { obj } => {
            let r = d.engine().submit(Transaction::new().op(Op::Remove { coll: c, name: name(obj) }));
            match m.remove(&name(obj)) {
                Some(v) => {
                    if let Err(e) = r {
                        m.insert(name(obj), v);
                        return Err(e);
                    }
                }
                None => assert!(matches!(r.as_ref().map_err(EngineError::cause), Err(EngineError::NotFound)), "{r:?}"),
            };
        }
        ModelOp::Rename { from, to } => {
            let r = d.engine().submit(Transaction::new().op(Op::Rename {
                coll: c,
                from: name(from),
                to_coll: c,
                to: name(to),
            }));
            match m.get(&name(from)).cloned() {
                Some(v) => {
                    r?;
                    m.remove(&name(from));
                    m.insert(name(to), v);
                }
                None => assert!(matches!(r.as_ref().map_err(EngineError::cause), Err(EngineError::NotFound)), "{r:?}"),
            }
        }
        ModelOp::Clone { from, to } => {
            let r = d.engine().submit(Transaction::new().op(Op::Clone {
                coll: c,
                from: name(from),
                to_coll: c,
                to: name(to),
            }));
            match m.get(&name(from)).cloned() {
                Some(v) => {
                    r?;
                    m.insert(name(to), v);
                }
                None => assert!(matches!(r.as_ref().map_err(EngineError::cause), Err(EngineError::NotFound)), "{r:?}"),
            }
        }
        ModelOp::CloneRange { from, to } => {
            // Multipart-style: append the whole source at the (aligned) end of the destination.
            let (Some(src), true) = (m.get(&name(from)).cloned(), from != to) else { return Ok(()) };
            let dst_len = m.get(&name(to)).map(|v| v.len()).unwrap_or(0);
            if !dst_len.is_multiple_of(bs) || src.is_empty() {
                return Ok(());
            }
            d.engine().submit(Transaction::new().op(Op::CloneRange {
                src_coll: c,
                src: name(from),
                src_offset: 0,
                len: src.len() as u64,
                dst_coll: c,
                dst: name(to),
                dst_offset: dst_len as u64,
            }))?;
            model_write(m, &name(to), dst_len as u64, &src);
        }
        ModelOp::Sync => {
            d.engine().sync_fragments(true)?;
        }
        ModelOp::Reopen => d.reopen(cfg.clone()),
    }
    Ok(())
}
