//! The server's drives: the erasure sets built from the data directory's layout, each drive's slot, path
//! and engine, and what the admin port shows and does with them (states, statistics, check, scrub, drive
//! replacement).

use crate::datadir::{self, DriveConfig, OpenStore};
use mosaic_drive::DriveStore;
use mosaic_engine::Engine;
use mosaic_erasure::{ErasureSet, SetConfig};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One drive as the admin port sees it.
pub struct DriveView {
    pub set: usize,
    pub slot: usize,
    pub path: PathBuf,
    pub engine: Option<Engine>,
}

pub struct Drives {
    pub sets: Vec<ErasureSet<DriveStore>>,
    /// Each drive's directory, by set and slot.
    paths: Mutex<Vec<Vec<PathBuf>>>,
    /// Drives replaced since the start whose heal has not finished.
    replaced: Mutex<BTreeSet<(usize, usize)>>,
    /// Why drives that could not be opened are missing, by set and slot.
    problems: Mutex<std::collections::BTreeMap<(usize, usize), String>>,
    cfg: DriveConfig,
    data_dir: PathBuf,
}

impl Drives {
    /// Builds the sets of the opened store (drives that could not be opened are left out of their set).
    pub async fn open(
        opened: OpenStore,
        set_cfg: SetConfig,
        cfg: DriveConfig,
        data_dir: &Path,
    ) -> Result<Drives, String> {
        let per_set = set_cfg.geometry.drives();
        let mut members: Vec<Vec<Option<Arc<DriveStore>>>> = vec![vec![None; per_set]; opened.layout.sets];
        let mut paths: Vec<Vec<PathBuf>> = vec![vec![PathBuf::new(); per_set]; opened.layout.sets];
        let mut problems = std::collections::BTreeMap::new();
        for d in opened.drives {
            members[d.set][d.slot] = d.engine.map(|e| Arc::new(DriveStore::new(e)));
            paths[d.set][d.slot] = d.path;
            if let Some(p) = d.problem {
                problems.insert((d.set, d.slot), p);
            }
        }
        let mut sets = Vec::new();
        for m in members {
            let set =
                ErasureSet::open(set_cfg.clone(), m).await.map_err(|e| format!("cannot open a set of drives: {e}"))?;
            sets.push(set);
        }
        Ok(Drives {
            sets,
            paths: Mutex::new(paths),
            replaced: Mutex::new(BTreeSet::new()),
            problems: Mutex::new(problems),
            cfg,
            data_dir: data_dir.to_path_buf(),
        })
    }

    /// Every drive, by set and slot.
    pub fn each(&self) -> Vec<DriveView> {
        let paths = self.paths.lock().clone();
        let mut out = Vec::new();
        for (s, set) in self.sets.iter().enumerate() {
            for (slot, m) in set.members().into_iter().enumerate() {
                out.push(DriveView {
                    set: s,
                    slot,
                    path: paths[s][slot].clone(),
                    engine: m.map(|d| d.engine().clone()),
                });
            }
        }
        out
    }

    /// A drive's state: online, healing (replaced and not yet healed), faulty (open but read-only after a
    /// failure) or offline (missing).
    pub fn state(&self, d: &DriveView) -> &'static str {
        let set = &self.sets[d.set];
        match &d.engine {
            None => "offline",
            Some(e) if !e.is_healthy() => "faulty",
            Some(_) if self.replaced.lock().contains(&(d.set, d.slot)) => {
                if set.heal_backlog() == 0
                    && set.heal_progress().scans_completed.load(std::sync::atomic::Ordering::Relaxed) > 0
                {
                    self.replaced.lock().remove(&(d.set, d.slot));
                    "online"
                } else {
                    "healing"
                }
            }
            Some(_) => "online",
        }
    }

    /// Formats a new drive in `path` for slot `slot` of set `set`, puts it in the set and starts healing it.
    pub async fn replace(&self, set: usize, slot: usize, path: &Path) -> Result<(), String> {
        let s = self.sets.get(set).ok_or_else(|| format!("there is no set {set}"))?;
        if slot >= s.geometry().drives() {
            return Err(format!("set {set} has no drive {slot}"));
        }
        let old = s.members()[slot].clone();
        s.detach_drive(slot);
        if let Some(old) = old {
            let engine = old.engine().clone();
            drop(old);
            let _ = tokio::task::spawn_blocking(move || engine.close()).await;
        }
        if let Some(faults) = &self.cfg.faults {
            // A fault injected into the old drive is not the new one's.
            faults.lock().remove(path);
        }
        let (data_dir, set_cfg) = (self.data_dir.clone(), self.cfg.clone());
        let p = path.to_path_buf();
        let engine = tokio::task::spawn_blocking(move || datadir::replace_drive(&data_dir, set, slot, &p, &set_cfg))
            .await
            .map_err(|e| e.to_string())??;
        self.paths.lock()[set][slot] = path.to_path_buf();
        self.problems.lock().remove(&(set, slot));
        self.replaced.lock().insert((set, slot));
        s.attach_drive(slot, Arc::new(DriveStore::new(engine))).await.map_err(|e| e.to_string())?;
        tracing::info!(set, slot, path = %path.display(), "a drive was replaced; heal is rebuilding it");
        Ok(())
    }

    /// Fault injection (testing only): makes drive `slot` of set `set` fail, refuse writes, or work again.
    pub fn inject_fault(&self, set: usize, slot: usize, fault: mosaic_engine::DeviceFault) -> Result<(), String> {
        let faults = self.cfg.faults.as_ref().ok_or("fault injection is off (it is for tests only)")?;
        let path = self
            .paths
            .lock()
            .get(set)
            .and_then(|s| s.get(slot))
            .cloned()
            .ok_or(format!("there is no drive {set}.{slot}"))?;
        let switch = faults.lock().get(&path).cloned().ok_or(format!("drive {set}.{slot} has no device open"))?;
        switch.set(fault);
        tracing::warn!(set, slot, ?fault, "fault injected");
        Ok(())
    }

    /// Compares every set's drives and heals what differs, now (not paced by the heal rate); returns what
    /// was done. Bounded: at most `HEAL_NOW_MAX_OBJECTS` objects per set.
    pub async fn heal_all(&self) -> serde_json::Value {
        const HEAL_NOW_MAX_OBJECTS: usize = 10_000_000;
        const STEP: usize = 1024;
        let mut sets = Vec::new();
        for (i, set) in self.sets.iter().enumerate() {
            let before = set.heal_progress().healed_objects.load(std::sync::atomic::Ordering::Relaxed);
            let failed_before = set.heal_progress().failed_objects.load(std::sync::atomic::Ordering::Relaxed);
            let scanned = set.scan().await;
            let mut tried = 0;
            while tried < HEAL_NOW_MAX_OBJECTS {
                let n = set.heal_now(STEP).await;
                if n == 0 {
                    break;
                }
                tried += n;
            }
            let p = set.heal_progress();
            sets.push(serde_json::json!({
                "set": i,
                "scanned_objects": scanned.as_ref().ok(),
                "scan_error": scanned.as_ref().err().map(|e| e.to_string()),
                "healed_objects": p.healed_objects.load(std::sync::atomic::Ordering::Relaxed) - before,
                "failed_objects": p.failed_objects.load(std::sync::atomic::Ordering::Relaxed) - failed_before,
                "backlog": set.heal_backlog(),
            }));
        }
        serde_json::json!({ "sets": sets })
    }

    /// Why a drive is missing, if it could not be opened.
    pub fn problem(&self, set: usize, slot: usize) -> Option<String> {
        self.problems.lock().get(&(set, slot)).cloned()
    }
}
