//! The access keys beside the root key, stored in the data directory as `keys` (mode 0600): a version
//! line, the key set as JSON, and a crc32c line. Written to a temporary file, synced and renamed, so a
//! crash leaves the old set or the new one.

use mosaic::datadir_format;
use mosaic_s3::access::KeySet;
use std::path::Path;

const KEYS_FILE: &str = "keys";

pub fn load(dir: &Path) -> Result<KeySet, String> {
    let path = dir.join(KEYS_FILE);
    if !path.exists() {
        return Ok(KeySet::default());
    }
    let text = crate::datadir::read_small_file(&path)?;
    datadir_format::parse_keys(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn save(dir: &Path, keys: &KeySet) -> Result<(), String> {
    crate::datadir::write_synced(&dir.join(KEYS_FILE), &datadir_format::encode_keys(keys)?, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_s3::access::{AccessKey, Grant};

    #[test]
    fn round_trip_and_damage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path()).unwrap(), KeySet::default());
        let mut set = KeySet::default();
        let mut grants = std::collections::BTreeMap::new();
        grants.insert("photos".to_string(), Grant { read: true, write: false });
        set.keys
            .insert("MKAAA".into(), AccessKey { secret_key: "x".repeat(40), created_unix_s: 5, grants, owner: true });
        save(d.path(), &set).unwrap();
        assert_eq!(load(d.path()).unwrap(), set);
        let path = d.path().join(KEYS_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("photos", "photoz")).unwrap();
        assert!(load(d.path()).unwrap_err().contains("checksum mismatch"));
        std::fs::write(&path, "version=2\n{}\n").unwrap();
        assert!(load(d.path()).is_err());
    }
}
