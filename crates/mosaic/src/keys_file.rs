//! The access keys beside the root key, stored in the data directory as `keys` (mode 0600): a version
//! line, the key set as JSON, and a crc32c line. Written to a temporary file, synced and renamed, so a
//! crash leaves the old set or the new one.

use mosaic_s3::access::KeySet;
use std::path::Path;

const KEYS_FILE: &str = "keys";
const VERSION_LINE: &str = "version=1\n";

pub fn load(dir: &Path) -> Result<KeySet, String> {
    let path = dir.join(KEYS_FILE);
    if !path.exists() {
        return Ok(KeySet::default());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str) -> Result<KeySet, String> {
    let (body, crc) = text.rsplit_once("crc32c=").ok_or("damaged keys file (no checksum)")?;
    if crate::datadir::crc_line(body) != format!("crc32c={crc}") {
        return Err("damaged keys file (checksum mismatch)".into());
    }
    let json = body.strip_prefix(VERSION_LINE).ok_or("unsupported keys file version")?;
    serde_json::from_str(json).map_err(|e| format!("damaged keys file: {e}"))
}

pub fn save(dir: &Path, keys: &KeySet) -> Result<(), String> {
    let json = serde_json::to_string(keys).map_err(|e| e.to_string())?;
    let body = format!("{VERSION_LINE}{json}\n");
    crate::datadir::write_synced(&dir.join(KEYS_FILE), &format!("{body}{}", crate::datadir::crc_line(&body)), 0o600)
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
        set.keys.insert("MKAAA".into(), AccessKey { secret_key: "x".repeat(40), created_unix_s: 5, grants });
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
