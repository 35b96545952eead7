//! Sets of simulated drives for the erasure tests.

#![allow(dead_code)]

pub mod flaky;

use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_store::Store;
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
    SetConfig::new(SetGeometry::new(k, m).unwrap())
}

/// A directory for a drive's metadata database: in memory (/dev/shm) where there is one, so that the many
/// WAL syncs of a crash test cost nothing (the simulated device keeps the data in memory anyway).
pub fn drive_dir() -> tempfile::TempDir {
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(_) => tempfile::tempdir().unwrap(),
    }
}

/// Formats `n` simulated drives and closes them: their devices and directories, to open sets on.
pub fn formatted_drives(n: usize) -> (Vec<SimDevice>, Vec<tempfile::TempDir>) {
    let mut devices = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..n {
        let dir = drive_dir();
        let dev = SimDevice::new(DRIVE_BYTES);
        let engine = Engine::format(dir.path(), Arc::new(dev.clone()), engine_config()).unwrap();
        engine.close().unwrap();
        devices.push(dev);
        dirs.push(dir);
    }
    (devices, dirs)
}

/// Waits (polling, at most 10 s) until nothing but the caller holds `store`: a background task of a
/// dropped set holds it until its current step ends (at most one tick).
pub async fn sole_owner(store: &Arc<DriveStore>) {
    for _ in 0..10_000 {
        if Arc::strong_count(store) == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("a drive is still held by a dropped set ({} holders)", Arc::strong_count(store));
}

impl TestSet {
    pub async fn new(k: usize, m: usize) -> TestSet {
        Self::with_config(set_config(k, m)).await
    }

    pub async fn with_config(cfg: SetConfig) -> TestSet {
        let (k, m) = (cfg.geometry.data, cfg.geometry.parity);
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

impl TestSet {
    /// Takes drive `slot` out of the set, closes it and opens it again from its directory and device (a
    /// drive that failed and came back), and puts it back.
    pub async fn reopen_drive(&self, slot: usize) {
        let old = self.set.members()[slot].clone();
        self.set.detach_drive(slot);
        if let Some(old) = old {
            let _ = old.close().await;
            // A background step of the set (the undo cleaner) may hold it a moment longer: its database
            // stays locked until the last holder lets go.
            sole_owner(&old).await;
            drop(old);
        }
        let engine = self.open_engine(slot).await;
        self.set.attach_drive(slot, Arc::new(DriveStore::new(engine))).await.unwrap();
    }

    /// Opens drive `slot`'s engine again, polling (at most 10 s) while a straggling read of the old one (a
    /// blocking task a degraded read no longer waits for) still holds its database's lock.
    async fn open_engine(&self, slot: usize) -> Engine {
        for _ in 0..10_000 {
            match Engine::open(self.dirs[slot].path(), Arc::new(self.devices[slot].clone()), engine_config()) {
                Ok(e) => return e,
                Err(e) if e.to_string().contains("lock") => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await
                }
                Err(e) => panic!("drive {slot} does not open again: {e}"),
            }
        }
        panic!("drive {slot} is still held by its old engine")
    }

    /// Replaces drive `slot` with a newly formatted one (the old one is gone).
    pub async fn replace_drive(&mut self, slot: usize) {
        let old = self.set.members()[slot].clone();
        self.set.detach_drive(slot);
        if let Some(old) = old {
            let _ = old.close().await;
        }
        let dir = tempfile::tempdir().unwrap();
        let dev = SimDevice::new(DRIVE_BYTES);
        let engine = Engine::format(dir.path(), Arc::new(dev.clone()), engine_config()).unwrap();
        self.set.attach_drive(slot, Arc::new(DriveStore::new(engine))).await.unwrap();
        self.devices[slot] = dev;
        self.dirs[slot] = dir;
    }

    /// Heals until nothing is queued (bounded).
    pub async fn heal_all(&self) {
        for _ in 0..1000 {
            if self.set.heal_now(10_000).await == 0 {
                return;
            }
        }
        panic!("heal did not settle");
    }
}
