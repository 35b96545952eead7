//! The microstores defined by hand and the buckets assigned to them, stored in the data directory as
//! `microstores`: a version line, the catalog as JSON, and a crc32c line; written to a temporary file,
//! synced and renamed, so a crash leaves the old catalog or the new one.

use mosaic::datadir_format;
use mosaic_microstore::Catalog;
use std::path::Path;

const MICROSTORES_FILE: &str = "microstores";

pub fn load(dir: &Path) -> Result<Catalog, String> {
    let path = dir.join(MICROSTORES_FILE);
    if !path.exists() {
        return Ok(Catalog::default());
    }
    let text = crate::datadir::read_small_file(&path)?;
    datadir_format::parse_microstores(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn save(dir: &Path, catalog: &Catalog) -> Result<(), String> {
    crate::datadir::write_synced(&dir.join(MICROSTORES_FILE), &datadir_format::encode_microstores(catalog)?, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_microstore::manager::Target;
    use mosaic_microstore::{Class, Definition};

    #[test]
    fn round_trip_and_damage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path()).unwrap(), Catalog::default());
        let mut c = Catalog::default();
        let def = Definition {
            target: Target::LatencyMsP99(12.5),
            class: Some(Class::SmallWrite),
            workers: 16,
            sets: vec![1],
        };
        c.microstores.insert("games".into(), def);
        c.buckets.insert("scores".into(), "games".into());
        save(d.path(), &c).unwrap();
        assert_eq!(load(d.path()).unwrap(), c);
        let path = d.path().join(MICROSTORES_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("scores", "scorez")).unwrap();
        assert!(load(d.path()).unwrap_err().contains("checksum mismatch"));
        std::fs::write(&path, datadir_format::encode_microstores(&c).unwrap().replace("version=3", "version=4"))
            .unwrap();
        assert!(load(d.path()).is_err());
        // A bucket assigned to a microstore that is not there is refused, even with a good checksum.
        c.buckets.insert("lost".into(), "ghost".into());
        std::fs::write(&path, datadir_format::encode_microstores(&c).unwrap()).unwrap();
        assert!(load(d.path()).unwrap_err().contains("ghost"));
    }
}
