//! Sets of simulated drives for the erasure tests.

#![allow(dead_code)]

use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use std::sync::Arc;

/// A set of k + m drives on simulated devices, with their directories and devices kept for the test.
pub struct TestSet {
    pub set: ErasureSet<DriveStore>,
    pub devices: Vec<SimDevice>,
    pub dirs: Vec<tempfile::TempDir>,
    pub cfg: SetConfig,
}

pub const DRIVE_BYTES: u64 = 128 << 20;

pub fn engine_config() -> EngineConfig {
    EngineConfig { kv_write_buffer_bytes: 4 << 20, kv_block_cache_bytes: 8 << 20, ..Default::default() }
}

pub fn set_config(k: usize, m: usize) -> SetConfig {
    SetConfig { geometry: SetGeometry::new(k, m).unwrap(), inline_max_bytes: 16 * 1024, max_op_data_bytes: 64 << 20 }
}

impl TestSet {
    pub async fn new(k: usize, m: usize) -> TestSet {
        let cfg = set_config(k, m);
        let mut devices = Vec::new();
        let mut dirs = Vec::new();
        let mut members = Vec::new();
        for _ in 0..k + m {
            let dir = tempfile::tempdir().unwrap();
            let dev = SimDevice::new(DRIVE_BYTES);
            let engine = Engine::format(dir.path(), Arc::new(dev.clone()), engine_config()).unwrap();
            members.push(Some(Arc::new(DriveStore::new(engine))));
            devices.push(dev);
            dirs.push(dir);
        }
        let set = ErasureSet::open(cfg.clone(), members).await.unwrap();
        TestSet { set, devices, dirs, cfg }
    }
}
