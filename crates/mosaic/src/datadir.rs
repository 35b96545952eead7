//! The data directory: its marker file (format version + checksum), the drive (a data file used with
//! O_DIRECT plus its metadata database), and the root credentials (mode 0600). The data file is thin by
//! default: it holds what is stored and grows in large preallocated steps up to the drive's maximum.
//!
//! ```text
//! mosaic-data/
//!   MOSAIC            marker: format version, store uuid, crc32c (written last)
//!   layout            the erasure code, the sets and every drive (set, slot, uuid, path), crc32c
//!   credentials       root access key and secret (0600)
//!   cluster/          on a cluster node (--cluster-address): node (its id and the cluster secret, 0600)
//!                     and raft/ (the cluster map's log, vote and snapshots)
//!   drive0/           the default drive (with --drive, each drive is its own directory):
//!     data              the data device (a thin file)
//!     kv/               the metadata database (RocksDB)
//!     mosaic-drive      the drive's identity: store, set, slot, uuid, crc32c
//! ```

use mosaic::datadir_format as format;
use mosaic_engine::{Engine, EngineConfig, FileDevice};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MARKER: &str = "MOSAIC";
const CREDENTIALS: &str = "credentials";
const DRIVE_DIR: &str = "drive0";
/// Most a new drive grows to by default (the allocator keeps a bitmap of 32 MiB per TiB in memory).
const DEFAULT_DRIVE_MAX_BYTES: u64 = 1 << 40;
const MIN_DRIVE_BYTES: u64 = 64 << 20;
/// What a thin data file holds when it is created: the superblock area (the engine grows it from there).
const THIN_FILE_START_BYTES: u64 = 1 << 20;

pub use mosaic::datadir_format::{Credentials, validate_credentials};

/// What `open_store` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// A fresh directory that was just formatted.
    Formatted,
    /// An existing Mosaic data directory.
    Existing,
}

/// Reads one of the data directory's small files, refusing one too large to be ours before reading it.
pub(crate) fn read_small_file(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?.len();
    if len > format::FILE_MAX_BYTES as u64 {
        return Err(format!("{} is damaged (larger than {} bytes)", path.display(), format::FILE_MAX_BYTES));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Checks the directory and says whether it is new, ours, or someone else's.
pub fn inspect(dir: &Path) -> Result<bool, String> {
    if !dir.exists() {
        return Ok(false);
    }
    if !dir.is_dir() {
        return Err(format!("{} exists and is not a directory", dir.display()));
    }
    let marker = dir.join(MARKER);
    if marker.exists() {
        let text = read_small_file(&marker)?;
        let version = format::parse_marker(&text).map_err(|e| format!("{}: {e}", marker.display()))?;
        if version != format::MARKER_VERSION {
            return Err(format!(
                "{} was written by a Mosaic with data format {version}; this build reads format {}",
                dir.display(),
                format::MARKER_VERSION
            ));
        }
        return Ok(true);
    }
    let others: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .take(5)
        .collect();
    if others.is_empty() {
        return Ok(false);
    }
    Err(format!(
        "refusing to use {}: it is not empty and is not a Mosaic data directory (it holds {}). \
         Choose an empty or new directory with --data.",
        dir.display(),
        others.join(", ")
    ))
}

/// The maximum of a new drive when none is configured: nine tenths of the free space, at most 1 TiB.
fn default_drive_max(dir: &Path) -> u64 {
    let free = free_bytes(dir).unwrap_or(DEFAULT_DRIVE_MAX_BYTES);
    (free / 10 * 9).clamp(MIN_DRIVE_BYTES, DEFAULT_DRIVE_MAX_BYTES) / 4096 * 4096
}

fn free_bytes(dir: &Path) -> Option<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and s a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as u64 * s.f_frsize as u64)
}

pub fn drive_dir(dir: &Path) -> PathBuf {
    dir.join(DRIVE_DIR)
}

/// A cluster node's directory, in the data directory: its identity file and its Raft store.
pub const CLUSTER_DIR: &str = "cluster";
const CLUSTER_NODE_FILE: &str = "node";

/// A cluster node's identity: read from the data directory, or made (a random node id, no secret yet).
pub fn cluster_node(dir: &Path) -> Result<format::ClusterNodeFile, String> {
    let path = dir.join(CLUSTER_DIR).join(CLUSTER_NODE_FILE);
    if !path.exists() {
        // 53 bits: exact in any JSON reader (the console is JavaScript).
        let made = format::ClusterNodeFile { node: rand::random::<u64>() >> 11, secret: None };
        record_cluster_node(dir, &made)?;
        return Ok(made);
    }
    read_cluster_node(&path)
}

/// Whether the data directory is a cluster node's (it recorded a cluster secret); read only.
pub fn in_cluster(dir: &Path) -> Result<bool, String> {
    let path = dir.join(CLUSTER_DIR).join(CLUSTER_NODE_FILE);
    Ok(path.exists() && read_cluster_node(&path)?.secret.is_some())
}

fn read_cluster_node(path: &Path) -> Result<format::ClusterNodeFile, String> {
    format::parse_cluster_node(&read_small_file(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Records a cluster node's identity (mode 0600: it holds the cluster secret), synced.
pub fn record_cluster_node(dir: &Path, n: &format::ClusterNodeFile) -> Result<(), String> {
    write_synced(&dir.join(CLUSTER_DIR).join(CLUSTER_NODE_FILE), &format::encode_cluster_node(n), 0o600)
}

/// The store's layout file, in the data directory.
const LAYOUT: &str = "layout";
/// Each drive's identity file, in the drive's directory.
const IDENTITY: &str = "mosaic-drive";

/// How the server's drives are configured.
#[derive(Clone)]
pub struct DriveConfig {
    /// The drives' directories, in slot order; empty: one drive in the data directory (`drive0`).
    pub paths: Vec<PathBuf>,
    /// The erasure code for a new store (None: chosen by the number of drives).
    pub erasure: Option<mosaic_erasure::SetGeometry>,
    /// Most each new drive's file grows to.
    pub max_bytes: Option<u64>,
    pub preallocate: bool,
    pub engine: EngineConfig,
    pub io_engine: mosaic_engine::IoEngine,
    pub simulate_power_loss: bool,
    /// With fault injection (testing only): each drive's device fails on demand, by drive directory.
    pub faults: Option<FaultSwitches>,
    /// The node's KV memory, shared by its drives (None: each drive its own).
    pub kv_memory: Option<mosaic_engine::KvMemory>,
    /// A cluster node's drives: each one is recorded as its own 1+0 set, since the cluster map, not this
    /// directory, groups drives into erasure sets.
    pub cluster_node: bool,
    /// The node's IO shares: each drive schedules its device IO by them (None: straight through).
    pub io_shares: Option<Arc<mosaic_store::IoShares>>,
}

/// The fault switches of the drives' devices, by drive directory (fault injection, testing only).
pub type FaultSwitches = Arc<parking_lot::Mutex<std::collections::BTreeMap<PathBuf, mosaic_engine::FaultSwitch>>>;

/// A drive of the store as the server found it.
pub struct OpenDrive {
    pub set: usize,
    pub slot: usize,
    pub path: PathBuf,
    /// None when the drive could not be opened (`problem` says why): the store runs without it.
    pub engine: Option<Engine>,
    pub problem: Option<String>,
}

/// The store as opened: its layout and drives.
pub struct OpenStore {
    pub state: State,
    pub layout: format::Layout,
    pub drives: Vec<OpenDrive>,
}

/// The geometry of a layout.
pub fn geometry_of(l: &format::Layout) -> mosaic_erasure::SetGeometry {
    mosaic_erasure::SetGeometry { data: l.data, parity: l.parity }
}

/// How `n` drives split into sets: one set of up to 16 drives; more form equal sets of 4 to 16 drives (as
/// MinIO requires: a set of fewer would survive too few failures), as few as possible.
pub fn sets_for(n: usize) -> Result<usize, String> {
    const MIN_POOLED_SET_DRIVES: usize = 4;
    let max = mosaic_erasure::MAX_SET_DRIVES;
    if (1..=max).contains(&n) {
        return Ok(1);
    }
    (2..=n)
        .find(|s| n.is_multiple_of(*s) && (MIN_POOLED_SET_DRIVES..=max).contains(&(n / s)))
        .ok_or_else(|| format!("{n} drives cannot be split into equal sets of {MIN_POOLED_SET_DRIVES} to {max} drives"))
}

/// How `n` drives split into sets: into sets of the erasure code's width when one is given and the drives
/// are a multiple of it (so a node's drives can make several sets, which microstores may own), else as
/// `sets_for` splits them.
pub fn sets_of(n: usize, erasure: Option<mosaic_erasure::SetGeometry>) -> Result<usize, String> {
    match erasure {
        Some(g) if n > g.drives() && n.is_multiple_of(g.drives()) => Ok(n / g.drives()),
        _ => sets_for(n),
    }
}

impl DriveConfig {
    fn wrap(&self, drive: &Path, d: FileDevice) -> Arc<dyn mosaic_engine::Device> {
        let d: Arc<dyn mosaic_engine::Device> = if self.simulate_power_loss {
            Arc::new(mosaic_engine::VolatileCacheDevice::new(Arc::new(d)))
        } else {
            Arc::new(d)
        };
        let d: Arc<dyn mosaic_engine::Device> = match &self.faults {
            Some(faults) => {
                let switch = faults.lock().entry(drive.to_path_buf()).or_default().clone();
                Arc::new(mosaic_engine::FaultyDevice::new(d, switch))
            }
            None => d,
        };
        match &self.io_shares {
            Some(shares) => Arc::new(mosaic_engine::ScheduledDevice::new(d, shares.clone())),
            None => d,
        }
    }

    /// The drives' paths as configured, or the default one.
    fn paths_for(&self, dir: &Path) -> Vec<PathBuf> {
        if self.paths.is_empty() { vec![drive_dir(dir)] } else { self.paths.clone() }
    }
}

/// Opens the store's drives, formatting them first if the data directory is new. Refuses a foreign
/// directory, drives that belong to another store or sit in another slot, and a drive list that differs
/// from the store's. A drive that cannot be opened is reported and left out (the store runs degraded).
pub fn open_store(dir: &Path, cfg: &DriveConfig) -> Result<OpenStore, String> {
    let ours = inspect(dir)?;
    let paths = cfg.paths_for(dir);
    if !ours {
        return format_store(dir, &paths, cfg);
    }
    let is_cluster_node = dir.join(CLUSTER_DIR).exists();
    if is_cluster_node != cfg.cluster_node {
        return Err(if is_cluster_node {
            format!("{} is a cluster node's data directory: start it with --cluster-address", dir.display())
        } else {
            format!("{} holds a standalone store; a cluster node needs a new data directory", dir.display())
        });
    }
    let layout = match read_small_file(&dir.join(LAYOUT)) {
        Ok(text) => format::parse_layout(&text).map_err(|e| format!("{}: {e}", dir.join(LAYOUT).display()))?,
        // A store from before layouts: one drive in drive0, made a 1+0 set.
        Err(_) if !dir.join(LAYOUT).exists() => upgrade_single_drive(dir, &paths, cfg)?,
        Err(e) => return Err(e),
    };
    let configured: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let stored: Vec<String> = layout.drives.iter().map(|d| d.path.clone()).collect();
    if configured != stored {
        return Err(format!(
            "the store's drives are [{}] but the configuration names [{}]; give the same drives in the same order",
            stored.join(", "),
            configured.join(", ")
        ));
    }
    let mut drives = Vec::new();
    for d in &layout.drives {
        let path = PathBuf::from(&d.path);
        match open_drive_at(&path, cfg) {
            Ok(engine) => {
                check_identity(&path, &layout, d, &engine)?;
                drives.push(OpenDrive { set: d.set, slot: d.slot, path, engine: Some(engine), problem: None });
            }
            Err(problem) => {
                tracing::error!(drive = %path.display(), set = d.set, slot = d.slot, %problem, "a drive is missing; the store runs without it");
                drives.push(OpenDrive { set: d.set, slot: d.slot, path, engine: None, problem: Some(problem) });
            }
        }
    }
    Ok(OpenStore { state: State::Existing, layout, drives })
}

/// Opens the engine of the drive in directory `path`.
fn open_drive_at(path: &Path, cfg: &DriveConfig) -> Result<Engine, String> {
    let device = FileDevice::open_with(&path.join("data"), cfg.io_engine)
        .map_err(|e| format!("cannot open {}: {e}", path.join("data").display()))?;
    Engine::open_sharing(path, cfg.wrap(path, device), cfg.engine.clone(), cfg.kv_memory.clone())
        .map_err(|e| format!("cannot open the drive in {}: {e}", path.display()))
}

/// Refuses a drive whose identity file names another store, set or slot, or whose engine is not the one the
/// layout names.
fn check_identity(
    path: &Path,
    layout: &format::Layout,
    d: &format::LayoutDrive,
    engine: &Engine,
) -> Result<(), String> {
    let file = path.join(IDENTITY);
    let id = read_small_file(&file)
        .and_then(|t| format::parse_identity(&t).map_err(|e| format!("{}: {e}", file.display())))?;
    if id.store != layout.store {
        return Err(format!("the drive in {} belongs to another store", path.display()));
    }
    if (id.set, id.slot) != (d.set, d.slot) || id.drive != d.uuid || engine.uuid() != d.uuid {
        return Err(format!(
            "the drive in {} is drive {} of set {} but is configured as drive {} of set {}: give the drives in their order",
            path.display(),
            id.slot,
            id.set,
            d.slot,
            d.set
        ));
    }
    Ok(())
}

/// A data directory from before layouts (one drive in `drive0`): gives it a layout and an identity file.
fn upgrade_single_drive(dir: &Path, paths: &[PathBuf], cfg: &DriveConfig) -> Result<format::Layout, String> {
    if paths != [drive_dir(dir)] {
        return Err(format!("{} holds a single-drive store: start it without --drive", dir.display()));
    }
    let engine = open_drive_at(&paths[0], cfg)?;
    let uuid = engine.uuid();
    engine.close().map_err(|e| e.to_string())?;
    drop(engine);
    let layout = format::Layout {
        store: uuid,
        data: 1,
        parity: 0,
        sets: 1,
        drives: vec![format::LayoutDrive { set: 0, slot: 0, uuid, path: paths[0].display().to_string() }],
    };
    let id = format::DriveIdentity { store: uuid, set: 0, slot: 0, drive: uuid };
    write_synced(&paths[0].join(IDENTITY), &format::encode_identity(&id), 0o644)?;
    record_layout(dir, &layout)?;
    tracing::info!(dir = %dir.display(), "the data directory now records its layout (one drive, 1+0)");
    Ok(layout)
}

/// Formats every drive of a new store, then writes its layout and (last) the marker.
fn format_store(dir: &Path, paths: &[PathBuf], cfg: &DriveConfig) -> Result<OpenStore, String> {
    let sets = if cfg.cluster_node { paths.len() } else { sets_of(paths.len(), cfg.erasure)? };
    let per_set = paths.len() / sets;
    let geometry = match cfg.erasure {
        _ if cfg.cluster_node => mosaic_erasure::SetGeometry { data: 1, parity: 0 },
        Some(g) if g.drives() != per_set => {
            return Err(format!(
                "erasure {}+{} needs sets of {} drives; {} drives make sets of {per_set}",
                g.data,
                g.parity,
                g.drives(),
                paths.len()
            ));
        }
        Some(g) => g,
        None => mosaic_erasure::SetGeometry::default_for(per_set)?,
    };
    let mut unique: Vec<&PathBuf> = paths.iter().collect();
    unique.sort();
    unique.dedup();
    if unique.len() != paths.len() {
        return Err("a drive is named twice".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let store: [u8; 16] = rand::random();
    let mut drives = Vec::new();
    let mut entries = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let (set, slot) = (i / per_set, i % per_set);
        let engine = format_drive(dir, path, cfg)?;
        let id = format::DriveIdentity { store, set, slot, drive: engine.uuid() };
        write_synced(&path.join(IDENTITY), &format::encode_identity(&id), 0o644)?;
        entries.push(format::LayoutDrive { set, slot, uuid: engine.uuid(), path: path.display().to_string() });
        drives.push(OpenDrive { set, slot, path: path.clone(), engine: Some(engine), problem: None });
    }
    let layout = format::Layout { store, data: geometry.data, parity: geometry.parity, sets, drives: entries };
    record_layout(dir, &layout)?;
    if cfg.cluster_node {
        std::fs::create_dir_all(dir.join(CLUSTER_DIR)).map_err(|e| format!("cannot create {CLUSTER_DIR}: {e}"))?;
    }
    // The marker goes last: a directory with a marker always holds a complete store.
    let marker = format::encode_marker(&store, concat!("mosaic ", env!("CARGO_PKG_VERSION")));
    write_synced(&dir.join(MARKER), &marker, 0o644)?;
    Ok(OpenStore { state: State::Formatted, layout, drives })
}

/// Formats a new drive in directory `path` (which must be new or empty): a thin data file and its database.
pub fn format_drive(dir: &Path, path: &Path, cfg: &DriveConfig) -> Result<Engine, String> {
    if path.exists()
        && std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?.next().is_some()
    {
        return Err(format!("refusing to format {}: it is not empty", path.display()));
    }
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let _ = dir;
    let max = cfg.max_bytes.unwrap_or_else(|| default_drive_max(path)) / 4096 * 4096;
    let initial = if cfg.preallocate { max } else { THIN_FILE_START_BYTES };
    let free = free_bytes(path).unwrap_or(u64::MAX);
    if initial > free {
        return Err(format!("the drive needs {initial} bytes but {} has only {free} free", path.display()));
    }
    let device = FileDevice::create_with(&path.join("data"), initial, cfg.io_engine)
        .map_err(|e| format!("cannot create the data file in {}: {e}", path.display()))?;
    Engine::format_sharing(path, cfg.wrap(path, device), max, cfg.engine.clone(), cfg.kv_memory.clone())
        .map_err(|e| format!("cannot format the drive in {}: {e}", path.display()))
}

/// Formats a replacement for drive `slot` of set `set` in `path` and records it in the layout and its
/// identity file. Returns the new drive.
pub fn replace_drive(dir: &Path, set: usize, slot: usize, path: &Path, cfg: &DriveConfig) -> Result<Engine, String> {
    let mut layout = format::parse_layout(&read_small_file(&dir.join(LAYOUT))?)?;
    let engine = format_drive(dir, path, cfg)?;
    let id = format::DriveIdentity { store: layout.store, set, slot, drive: engine.uuid() };
    write_synced(&path.join(IDENTITY), &format::encode_identity(&id), 0o644)?;
    let d = layout.drives.iter_mut().find(|d| (d.set, d.slot) == (set, slot)).ok_or("no such drive")?;
    d.uuid = engine.uuid();
    d.path = path.display().to_string();
    record_layout(dir, &layout)?;
    Ok(engine)
}

/// Writes the layout into the data directory and a copy into every drive's directory (the layout lives
/// with the drives too: it can be read back from any of them). A drive that is missing gets its copy when
/// it is replaced.
fn record_layout(dir: &Path, layout: &format::Layout) -> Result<(), String> {
    let text = format::encode_layout(layout);
    for d in &layout.drives {
        let drive = Path::new(&d.path);
        if drive.join(IDENTITY).exists()
            && let Err(e) = write_synced(&drive.join(LAYOUT), &text, 0o644)
        {
            tracing::warn!(drive = %drive.display(), error = %e, "could not record the layout on a drive");
        }
    }
    write_synced(&dir.join(LAYOUT), &text, 0o644)
}

pub(crate) fn write_synced(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if let Some(parent) = path.parent()
        && let Ok(d) = std::fs::File::open(parent)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

pub(crate) fn random_string(alphabet: &[u8], len: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..len).map(|_| alphabet[rng.random_range(0..alphabet.len())] as char).collect()
}

/// Root credentials: from the environment when both variables are set, else from the data directory,
/// else newly generated and stored (mode 0600). Returns them and whether they were just generated.
pub fn root_credentials(dir: &Path, env: Option<Credentials>) -> Result<(Credentials, bool), String> {
    if let Some(c) = env {
        validate_credentials(&c)?;
        return Ok((c, false));
    }
    let path = dir.join(CREDENTIALS);
    if path.exists() {
        let text = read_small_file(&path)?;
        return format::parse_credentials(&text).map(|c| (c, false)).map_err(|e| format!("{}: {e}", path.display()));
    }
    let c = Credentials {
        access_key: random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 20),
        secret_key: random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 40),
    };
    write_synced(&path, &format::encode_credentials(&c), 0o600)?;
    Ok((c, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drives_split_into_as_few_equal_sets_as_possible() {
        let sets: Vec<usize> = [1, 6, 16, 18, 20, 32, 48, 64].iter().map(|n| sets_for(*n).unwrap()).collect();
        assert_eq!(sets, [1, 1, 1, 2, 2, 2, 3, 4]);
        // Sets of fewer than 4 drives would survive too few failures: 17 and 34 drives have no split.
        for n in [0, 17, 34] {
            assert!(sets_for(n).unwrap_err().contains(&format!("{n} drives")), "{n}");
        }
        // A given code makes sets of its width when the drives are a multiple of it.
        let g = |text: &str| Some(mosaic_erasure::SetGeometry::parse(text).unwrap());
        assert_eq!(sets_of(8, g("2+2")), Ok(2));
        assert_eq!(sets_of(6, g("2+1")), Ok(2));
        assert_eq!(sets_of(20, g("4+1")), Ok(4));
        assert_eq!(sets_of(4, g("2+2")), Ok(1));
        assert_eq!(sets_of(18, None), Ok(2));
        assert_eq!(sets_of(7, g("2+1")), Ok(1), "not a multiple: one set, which the code then refuses");
    }

    #[test]
    fn credentials_round_trip_and_mode() {
        let d = tempfile::tempdir().unwrap();
        let (c, new) = root_credentials(d.path(), None).unwrap();
        assert!(new);
        let mode = std::fs::metadata(d.path().join(CREDENTIALS)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, new) = root_credentials(d.path(), None).unwrap();
        assert!(!new);
        assert_eq!(c, again);
        let env = Credentials { access_key: "admin".into(), secret_key: "password123".into() };
        assert_eq!(root_credentials(d.path(), Some(env.clone())).unwrap().0, env);
        let bad = Credentials { access_key: "a".into(), secret_key: "password123".into() };
        assert!(root_credentials(d.path(), Some(bad)).is_err());
    }

    #[test]
    fn damaged_credentials_are_refused() {
        let d = tempfile::tempdir().unwrap();
        root_credentials(d.path(), None).unwrap();
        let p = d.path().join(CREDENTIALS);
        let t = std::fs::read_to_string(&p).unwrap().replace("access_key=", "access_key=X");
        std::fs::write(&p, t).unwrap();
        assert!(root_credentials(d.path(), None).is_err());
    }

    #[test]
    fn foreign_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert!(!inspect(d.path()).unwrap());
        std::fs::write(d.path().join("notes.txt"), "x").unwrap();
        let e = inspect(d.path()).unwrap_err();
        assert!(e.contains("notes.txt") && e.contains("refusing"), "{e}");
    }
}
