//! The SSE master keys, stored in the data directory as `sse-keys` (mode 0600, versioned and
//! checksummed; see `datadir_format`): made at the first start that finds none, extended by
//! `mosaic sse rotate`. Written to a temporary file, synced and renamed, so a crash leaves the old set or
//! the new one. A key in the config (`sse_master_key`) replaces the file, for nodes that share one.

use mosaic::datadir_format;
use mosaic_crypt::{Key, MasterKeys};
use std::path::Path;

const SSE_KEYS_FILE: &str = "sse-keys";

/// The master keys: the config's key (id 1) when given, else the data directory's, made when missing.
pub fn load_or_create(dir: &Path, configured: Option<[u8; 32]>) -> Result<MasterKeys, String> {
    if let Some(k) = configured {
        return MasterKeys::from_keys([(1, Key::from_bytes(k))]).map_err(|e| e.to_string());
    }
    let path = dir.join(SSE_KEYS_FILE);
    if path.exists() {
        let text = crate::datadir::read_small_file(&path)?;
        return datadir_format::parse_master_keys(&text).map_err(|e| format!("{}: {e}", path.display()));
    }
    let keys = MasterKeys::generate().map_err(|e| e.to_string())?;
    crate::datadir::write_synced(&path, &datadir_format::encode_master_keys(&keys), 0o600)?;
    tracing::info!(path = %path.display(), "made the SSE master key");
    Ok(keys)
}

/// Adds a master key that seals new objects from the next start on; the older ones stay to open theirs.
/// Refused on a cluster node's data directory: a key made on one node alone would seal objects the other
/// nodes cannot open (`mosaic admin sse rotate` rotates the cluster's).
pub fn rotate(dir: &Path) -> Result<u32, String> {
    if crate::datadir::in_cluster(dir)? {
        return Err(format!(
            "{} is a cluster node's: its SSE master keys are the cluster's; rotate them with \
             `mosaic admin sse rotate` on a running node (every node takes the new key)",
            dir.display()
        ));
    }
    let mut keys = load_or_create(dir, None)?;
    let id = keys.rotate().map_err(|e| e.to_string())?;
    save(dir, &keys)?;
    Ok(id)
}

/// Saves `keys` as the data directory's master keys (synced, replacing the file whole).
pub fn save(dir: &Path, keys: &MasterKeys) -> Result<(), String> {
    crate::datadir::write_synced(&dir.join(SSE_KEYS_FILE), &datadir_format::encode_master_keys(keys), 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_rotated_and_damage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let first = load_or_create(d.path(), None).unwrap();
        assert_eq!(load_or_create(d.path(), None).unwrap(), first, "the same keys at the next start");
        assert_eq!(rotate(d.path()).unwrap(), 2);
        let rotated = load_or_create(d.path(), None).unwrap();
        assert_eq!((rotated.current().0, rotated.get(1)), (2, first.get(1)));
        let path = d.path().join(SSE_KEYS_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        let flipped = if text.contains("key=1:a") {
            text.replacen("key=1:a", "key=1:b", 1)
        } else {
            text.replacen("key=1:", "key=1:a", 1)
        };
        std::fs::write(&path, flipped).unwrap();
        assert!(load_or_create(d.path(), None).unwrap_err().contains("damaged"));
        std::fs::write(&path, "version=9\n").unwrap();
        assert!(load_or_create(d.path(), None).is_err());
        let configured = load_or_create(d.path(), Some([7; 32])).unwrap();
        assert_eq!(configured.current(), (1, &Key::from_bytes([7; 32])));
    }

    #[test]
    fn a_cluster_nodes_keys_are_not_rotated_offline() {
        let d = tempfile::tempdir().unwrap();
        let first = load_or_create(d.path(), None).unwrap();
        std::fs::create_dir_all(d.path().join(crate::datadir::CLUSTER_DIR)).unwrap();
        let mut node = crate::datadir::cluster_node(d.path()).unwrap();
        assert_eq!(rotate(d.path()).unwrap(), 2, "a node in no cluster yet rotates its own");
        node.secret = Some("ab".repeat(32));
        crate::datadir::record_cluster_node(d.path(), &node).unwrap();
        assert!(rotate(d.path()).unwrap_err().contains("mosaic admin sse rotate"));
        let kept = load_or_create(d.path(), None).unwrap();
        assert_eq!((kept.current().0, kept.get(1)), (2, first.get(1)), "nothing changed");
    }
}
