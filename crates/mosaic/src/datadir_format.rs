//! The three small text files of a data directory, each a few `name=value` lines (the keys file: a version
//! line and JSON) closed by a `crc32c=` line over everything before it:
//!
//! - `MOSAIC`, the marker: format version, drive uuid, the build that created it;
//! - `credentials`: the root access key and secret;
//! - `keys`: the access keys beside the root key and their grants.
//!
//! Encoding and parsing only; reading, writing and syncing the files is `datadir`'s and `keys_file`'s.

use mosaic_s3::access::KeySet;

/// The data format this build reads and writes (the marker's `format_version`).
pub const MARKER_VERSION: u32 = 1;
const CREDENTIALS_VERSION_LINE: &str = "version=1\n";
const KEYS_VERSION_LINE: &str = "version=1\n";
/// The largest of these files we parse: the keys file at its limits (10,000 keys) stays well below.
pub const FILE_MAX_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

fn crc_line(body: &str) -> String {
    format!("crc32c={:08x}\n", mosaic_engine::crc32c(body.as_bytes()))
}

fn seal(body: String) -> String {
    let crc = crc_line(&body);
    body + &crc
}

/// The body of a sealed file, once its checksum line matches.
fn unseal(text: &str) -> Result<&str, String> {
    if text.len() > FILE_MAX_BYTES {
        return Err(format!("damaged (larger than {FILE_MAX_BYTES} bytes)"));
    }
    let (body, crc) = text.rsplit_once("crc32c=").ok_or("damaged (no checksum line)")?;
    if crc_line(body) != format!("crc32c={crc}") {
        return Err("damaged (checksum mismatch)".into());
    }
    Ok(body)
}

fn field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
}

pub fn encode_marker(uuid: &[u8; 16], created_by: &str) -> String {
    seal(format!("format_version={MARKER_VERSION}\nuuid={}\ncreated_by={created_by}\n", hex::encode(uuid)))
}

/// The marker's format version (any version: the caller says what it does with one it cannot read).
pub fn parse_marker(text: &str) -> Result<u32, String> {
    let body = unseal(text)?;
    field(body, "format_version").and_then(|v| v.parse::<u32>().ok()).ok_or_else(|| "no format version".into())
}

pub fn encode_credentials(c: &Credentials) -> String {
    seal(format!("{CREDENTIALS_VERSION_LINE}access_key={}\nsecret_key={}\n", c.access_key, c.secret_key))
}

pub fn parse_credentials(text: &str) -> Result<Credentials, String> {
    let body = unseal(text)?;
    let body = body.strip_prefix(CREDENTIALS_VERSION_LINE).ok_or("unsupported credentials file version")?;
    let c = Credentials {
        access_key: field(body, "access_key").ok_or("no access_key")?.to_string(),
        secret_key: field(body, "secret_key").ok_or("no secret_key")?.to_string(),
    };
    validate_credentials(&c)?;
    Ok(c)
}

pub fn validate_credentials(c: &Credentials) -> Result<(), String> {
    let ok = |s: &str| s.chars().all(|ch| ch.is_ascii_graphic());
    if !(3..=128).contains(&c.access_key.len()) || !ok(&c.access_key) {
        return Err("MOSAIC_ACCESS_KEY must be 3 to 128 printable ASCII characters".into());
    }
    if !(8..=128).contains(&c.secret_key.len()) || !ok(&c.secret_key) {
        return Err("MOSAIC_SECRET_KEY must be 8 to 128 printable ASCII characters".into());
    }
    Ok(())
}

pub fn encode_keys(keys: &KeySet) -> Result<String, String> {
    let json = serde_json::to_string(keys).map_err(|e| e.to_string())?;
    Ok(seal(format!("{KEYS_VERSION_LINE}{json}\n")))
}

pub fn parse_keys(text: &str) -> Result<KeySet, String> {
    let body = unseal(text)?;
    let json = body.strip_prefix(KEYS_VERSION_LINE).ok_or("unsupported keys file version")?;
    serde_json::from_str(json).map_err(|e| format!("damaged: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trip_and_damage() {
        let text = encode_marker(&[7; 16], "mosaic test");
        assert_eq!(parse_marker(&text), Ok(MARKER_VERSION));
        assert!(parse_marker(&text.replace("uuid=07", "uuid=08")).unwrap_err().contains("checksum mismatch"));
        assert!(parse_marker("format_version=1\n").unwrap_err().contains("no checksum"));
        assert!(parse_marker(&seal("uuid=00\n".into())).unwrap_err().contains("no format version"));
        assert_eq!(parse_marker(&seal("format_version=9\n".into())), Ok(9));
    }

    #[test]
    fn credentials_round_trip_and_damage() {
        let c = Credentials { access_key: "admin".into(), secret_key: "password123".into() };
        let text = encode_credentials(&c);
        assert_eq!(parse_credentials(&text), Ok(c));
        assert!(parse_credentials(&text.replace("admin", "admim")).is_err());
        assert!(parse_credentials(&seal("version=2\naccess_key=abc\nsecret_key=12345678\n".into())).is_err());
        let short = seal("version=1\naccess_key=ab\nsecret_key=12345678\n".into());
        assert!(parse_credentials(&short).unwrap_err().contains("3 to 128"));
        // A name that only starts like a field is not that field.
        let prefixed = seal("version=1\naccess_key_old=abc\nsecret_key=12345678\n".into());
        assert_eq!(parse_credentials(&prefixed).unwrap_err(), "no access_key");
    }

    #[test]
    fn keys_round_trip_and_damage() {
        let set = KeySet::default();
        let text = encode_keys(&set).unwrap();
        assert_eq!(parse_keys(&text), Ok(set));
        assert!(parse_keys(&seal("version=1\n{\"keys\": 5}\n".into())).unwrap_err().starts_with("damaged"));
        assert!(parse_keys(&seal("version=2\n{}\n".into())).unwrap_err().contains("version"));
    }

    #[test]
    fn oversize_file_is_refused_before_checksumming() {
        let big = "x".repeat(FILE_MAX_BYTES + 1);
        assert!(parse_keys(&big).unwrap_err().contains("larger than"));
    }
}
