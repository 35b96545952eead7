//! The data directory: its marker file (format version + checksum), the drive (a data file used with
//! O_DIRECT plus its metadata database), and the root credentials (mode 0600). The data file is thin by
//! default: it holds what is stored and grows in large preallocated steps up to the drive's maximum.
//!
//! ```text
//! mosaic-data/
//!   MOSAIC            marker: format version, uuid, crc32c
//!   credentials       root access key and secret (0600)
//!   drive0/data       the data device (preallocated file)
//!   drive0/kv/        the metadata database (RocksDB)
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

/// What `prepare` found.
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

/// Opens the drive, formatting the directory first if it is new. Refuses a foreign directory. A new drive
/// may grow to `max_bytes` (default: see `default_drive_max`); with `preallocate` its file takes all of
/// it at once.
pub fn open_drive(
    dir: &Path,
    max_bytes: Option<u64>,
    preallocate: bool,
    cfg: EngineConfig,
    io_engine: mosaic_engine::IoEngine,
    simulate_power_loss: bool,
) -> Result<(Engine, State), String> {
    let wrap = |d: FileDevice| -> Arc<dyn mosaic_engine::Device> {
        if simulate_power_loss { Arc::new(mosaic_engine::VolatileCacheDevice::new(Arc::new(d))) } else { Arc::new(d) }
    };
    let ours = inspect(dir)?;
    let drive = drive_dir(dir);
    if ours {
        let device = FileDevice::open_with(&drive.join("data"), io_engine)
            .map_err(|e| format!("cannot open the data file: {e}"))?;
        let engine = Engine::open(&drive, wrap(device), cfg).map_err(|e| format!("cannot open the drive: {e}"))?;
        return Ok((engine, State::Existing));
    }
    std::fs::create_dir_all(&drive).map_err(|e| format!("cannot create {}: {e}", drive.display()))?;
    let max = max_bytes.unwrap_or_else(|| default_drive_max(dir)) / 4096 * 4096;
    let initial = if preallocate { max } else { THIN_FILE_START_BYTES };
    let free = free_bytes(dir).unwrap_or(u64::MAX);
    if initial > free {
        return Err(format!("the drive needs {initial} bytes but {} has only {free} free", dir.display()));
    }
    let device = FileDevice::create_with(&drive.join("data"), initial, io_engine)
        .map_err(|e| format!("cannot create the data file: {e}"))?;
    let engine = Engine::format_with_capacity(&drive, wrap(device), max, cfg)
        .map_err(|e| format!("cannot format the drive: {e}"))?;
    // The marker goes last: a directory with a marker always holds a complete drive.
    let marker = format::encode_marker(&engine.uuid(), concat!("mosaic ", env!("CARGO_PKG_VERSION")));
    write_synced(&dir.join(MARKER), &marker, 0o644)?;
    Ok((engine, State::Formatted))
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
