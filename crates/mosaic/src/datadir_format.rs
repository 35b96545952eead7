//! The small text files of a data directory and its drives, each a few `name=value` lines (the keys file: a
//! version line and JSON) closed by a `crc32c=` line over everything before it:
//!
//! - `MOSAIC`, the marker: format version, store uuid, the build that created it;
//! - `layout`: the store's drives: its erasure code, its sets, and every drive's set, slot, uuid and path;
//! - `mosaic-drive`, on every drive: the store, set and slot it belongs to and its own uuid, so that a drive
//!   in the wrong slot or from another store is refused;
//! - `credentials`: the root access key and secret;
//! - `keys`: the access keys beside the root key and their grants;
//! - `cluster/node`, on a cluster node: its node id and the cluster's secret;
//! - `microstores`: the microstores defined by hand and the buckets assigned to them.
//!
//! Encoding and parsing only; reading, writing and syncing the files is `datadir`'s and `keys_file`'s.

use mosaic_s3::access::KeySet;

/// The data format this build reads and writes (the marker's `format_version`).
pub const MARKER_VERSION: u32 = 1;
const CREDENTIALS_VERSION_LINE: &str = "version=1\n";
const KEYS_VERSION_LINE: &str = "version=1\n";
const LAYOUT_VERSION_LINE: &str = "version=1\n";
const IDENTITY_VERSION_LINE: &str = "version=1\n";
const CLUSTER_NODE_VERSION_LINE: &str = "version=1\n";
/// Version 2 adds the microstores' sets and the buckets' placements (a version 1 file has neither);
/// version 3 the home of the buckets placed nowhere else (a version 2 file has none: every set).
const MICROSTORES_VERSION_LINE: &str = "version=3\n";
const MICROSTORES_EARLIER_VERSION_LINES: [&str; 2] = ["version=1\n", "version=2\n"];
/// Most drives a store holds (sets of at most 16 drives).
pub const MAX_DRIVES: usize = 1024;
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

const SSE_KEYS_VERSION_LINE: &str = "version=1\n";
/// Version 2 adds a `sealing=<id>` line: the key that seals when a newer one is pending (known, not sealing
/// yet). A set without a pending key is written as version 1, which older builds read.
const SSE_KEYS_VERSION2_LINE: &str = "version=2\n";

/// The SSE master keys file: a version line, one `key=<id>:<64 hex digits>` line per key, (version 2) the
/// `sealing=<id>` line, a crc32c line.
pub fn encode_master_keys(keys: &mosaic_crypt::MasterKeys) -> String {
    let pending = keys.pending().is_some();
    let mut body = if pending { SSE_KEYS_VERSION2_LINE } else { SSE_KEYS_VERSION_LINE }.to_string();
    for (id, key) in keys.iter() {
        body.push_str(&format!("key={id}:{}\n", hex::encode(key.as_bytes())));
    }
    if pending {
        body.push_str(&format!("sealing={}\n", keys.current().0));
    }
    seal(body)
}

pub fn parse_master_keys(text: &str) -> Result<mosaic_crypt::MasterKeys, String> {
    let body = unseal(text)?;
    let (lines, v2) = match (body.strip_prefix(SSE_KEYS_VERSION_LINE), body.strip_prefix(SSE_KEYS_VERSION2_LINE)) {
        (Some(lines), _) => (lines, false),
        (None, Some(lines)) => (lines, true),
        (None, None) => return Err("unsupported SSE keys file version".into()),
    };
    let mut pairs = Vec::new();
    let mut sealing = None;
    for line in lines.lines() {
        if v2 && let Some(id) = line.strip_prefix("sealing=") {
            sealing = Some(id.parse::<u32>().map_err(|_| format!("damaged (sealing key id {id:?})"))?);
            continue;
        }
        let entry = line.strip_prefix("key=").ok_or_else(|| format!("damaged (line {line:?})"))?;
        let (id, key) = entry.split_once(':').ok_or("damaged (a key line without its id)")?;
        let id: u32 = id.parse().map_err(|_| format!("damaged (key id {id:?})"))?;
        let key: [u8; 32] = hex::decode(key)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| format!("damaged (key {id} is not 64 hex digits)"))?;
        pairs.push((id, mosaic_crypt::Key::from_bytes(key)));
    }
    if v2 && sealing.is_none() {
        return Err("damaged (a version 2 SSE keys file names no sealing key)".into());
    }
    mosaic_crypt::MasterKeys::from_keys_sealing(pairs, sealing).map_err(|e| format!("damaged ({e})"))
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

pub fn encode_microstores(catalog: &mosaic_microstore::Catalog) -> Result<String, String> {
    let json = serde_json::to_string(catalog).map_err(|e| e.to_string())?;
    Ok(seal(format!("{MICROSTORES_VERSION_LINE}{json}\n")))
}

/// The catalog of a microstores file; one that is not valid (unknown microstore, past a limit) is refused.
pub fn parse_microstores(text: &str) -> Result<mosaic_microstore::Catalog, String> {
    let body = unseal(text)?;
    let json = std::iter::once(MICROSTORES_VERSION_LINE)
        .chain(MICROSTORES_EARLIER_VERSION_LINES)
        .find_map(|line| body.strip_prefix(line))
        .ok_or("unsupported microstores file version")?;
    let catalog: mosaic_microstore::Catalog = serde_json::from_str(json).map_err(|e| format!("damaged: {e}"))?;
    catalog.validate().map_err(|e| format!("damaged: {e}"))?;
    Ok(catalog)
}

/// One drive of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutDrive {
    pub set: usize,
    pub slot: usize,
    pub uuid: [u8; 16],
    pub path: String,
}

/// The store's drives: `sets` sets of `data + parity` drives each, every drive by set and slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub store: [u8; 16],
    pub data: usize,
    pub parity: usize,
    pub sets: usize,
    pub drives: Vec<LayoutDrive>,
}

/// What a drive knows of itself: the store, set and slot it belongs to, and its own uuid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveIdentity {
    pub store: [u8; 16],
    pub set: usize,
    pub slot: usize,
    pub drive: [u8; 16],
}

fn uuid_of(text: &str) -> Result<[u8; 16], String> {
    hex::decode(text).ok().and_then(|b| b.try_into().ok()).ok_or_else(|| format!("{text:?} is not a uuid"))
}

fn number(body: &str, name: &str) -> Result<usize, String> {
    field(body, name).and_then(|v| v.parse().ok()).ok_or_else(|| format!("no {name}"))
}

pub fn encode_layout(l: &Layout) -> String {
    let mut body = format!(
        "{LAYOUT_VERSION_LINE}store={}\nerasure={}+{}\nsets={}\n",
        hex::encode(l.store),
        l.data,
        l.parity,
        l.sets
    );
    for d in &l.drives {
        body.push_str(&format!("drive={} {} {} {}\n", d.set, d.slot, hex::encode(d.uuid), d.path));
    }
    seal(body)
}

pub fn parse_layout(text: &str) -> Result<Layout, String> {
    let body = unseal(text)?;
    let body = body.strip_prefix(LAYOUT_VERSION_LINE).ok_or("unsupported layout version")?;
    let store = uuid_of(field(body, "store").ok_or("no store")?)?;
    let (k, m) = field(body, "erasure").and_then(|e| e.split_once('+')).ok_or("no erasure")?;
    let (data, parity): (usize, usize) = (k.parse().map_err(|_| "bad erasure")?, m.parse().map_err(|_| "bad erasure")?);
    if data == 0 || parity > data || data + parity > 16 {
        return Err(format!("an erasure code of {data}+{parity}"));
    }
    let sets = number(body, "sets")?;
    if sets == 0 || sets * (data + parity) > MAX_DRIVES {
        return Err(format!("{sets} sets"));
    }
    let mut drives = Vec::new();
    for line in body.lines().filter_map(|l| l.strip_prefix("drive=")) {
        let mut parts = line.splitn(4, ' ');
        let mut next = || parts.next().ok_or_else(|| format!("a short drive line {line:?}"));
        let set: usize = next()?.parse().map_err(|_| "a bad set")?;
        let slot: usize = next()?.parse().map_err(|_| "a bad slot")?;
        let uuid = uuid_of(next()?)?;
        let path = next()?.to_string();
        if set >= sets || slot >= data + parity || path.is_empty() {
            return Err(format!("a drive at set {set} slot {slot} outside the layout"));
        }
        if drives.iter().any(|d: &LayoutDrive| (d.set, d.slot) == (set, slot) || d.uuid == uuid) {
            return Err(format!("two drives at set {set} slot {slot} or with one uuid"));
        }
        drives.push(LayoutDrive { set, slot, uuid, path });
    }
    if drives.len() != sets * (data + parity) {
        return Err(format!("{} drives for {sets} sets of {}", drives.len(), data + parity));
    }
    Ok(Layout { store, data, parity, sets, drives })
}

pub fn encode_identity(i: &DriveIdentity) -> String {
    seal(format!(
        "{IDENTITY_VERSION_LINE}store={}\nset={}\nslot={}\ndrive={}\n",
        hex::encode(i.store),
        i.set,
        i.slot,
        hex::encode(i.drive)
    ))
}

pub fn parse_identity(text: &str) -> Result<DriveIdentity, String> {
    let body = unseal(text)?;
    let body = body.strip_prefix(IDENTITY_VERSION_LINE).ok_or("unsupported drive identity version")?;
    Ok(DriveIdentity {
        store: uuid_of(field(body, "store").ok_or("no store")?)?,
        set: number(body, "set")?,
        slot: number(body, "slot")?,
        drive: uuid_of(field(body, "drive").ok_or("no drive")?)?,
    })
}

/// A cluster node's identity: its id in the cluster map and, once it is in a cluster, the cluster's secret
/// (64 hex digits) that signs node-to-node calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNodeFile {
    pub node: u64,
    pub secret: Option<String>,
}

pub fn encode_cluster_node(n: &ClusterNodeFile) -> String {
    seal(format!("{CLUSTER_NODE_VERSION_LINE}node={}\nsecret={}\n", n.node, n.secret.as_deref().unwrap_or("")))
}

pub fn parse_cluster_node(text: &str) -> Result<ClusterNodeFile, String> {
    let body = unseal(text)?;
    let body = body.strip_prefix(CLUSTER_NODE_VERSION_LINE).ok_or("unsupported cluster node file version")?;
    let node = field(body, "node").and_then(|n| n.parse::<u64>().ok()).ok_or("no node id")?;
    let secret = field(body, "secret").ok_or("no secret line")?;
    let secret = match secret {
        "" => None,
        s if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => Some(s.to_string()),
        _ => return Err("the secret is not 64 hex digits".into()),
    };
    Ok(ClusterNodeFile { node, secret })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microstores_files_of_versions_1_and_2_still_read() {
        // What a build before microstores had sets wrote: no sets, no placements.
        let v1 = seal(format!(
            "version=1\n{}\n",
            r#"{"microstores":{"games":{"target":{"latency_ms_p99":10.0},"class":null,"workers":8}},"buckets":{"scores":"games"}}"#
        ));
        let c = parse_microstores(&v1).unwrap();
        assert!(c.microstores["games"].sets.is_empty() && c.placements.is_empty());
        assert_eq!(c.buckets["scores"], "games");
        // What a build before the home wrote: placements, no home.
        let v2 = seal(format!(
            "version=2\n{}\n",
            r#"{"microstores":{},"buckets":{},"placements":{"scores":{"sets":[1],"moving_from":null}}}"#
        ));
        let c2 = parse_microstores(&v2).unwrap();
        assert!(c2.home.is_none() && c2.placements["scores"].sets == [1]);
        let v3 = encode_microstores(&c).unwrap();
        assert!(v3.starts_with("version=3\n"), "written as version 3");
        assert_eq!(parse_microstores(&v3).unwrap(), c);
        let v4 = seal(format!("version=4\n{}\n", r#"{"microstores":{},"buckets":{}}"#));
        assert!(parse_microstores(&v4).unwrap_err().contains("version"), "a later version is refused");
    }

    #[test]
    fn layout_and_identity_round_trip_and_refusals() {
        let drives = (0..6)
            .map(|i| LayoutDrive { set: 0, slot: i, uuid: [i as u8; 16], path: format!("/mnt/disk {i}") })
            .collect();
        let l = Layout { store: [9; 16], data: 4, parity: 2, sets: 1, drives };
        let text = encode_layout(&l);
        assert_eq!(parse_layout(&text), Ok(l.clone()));
        assert!(parse_layout(&text.replace("disk 3", "disk 4")).unwrap_err().contains("checksum"));
        let mut short = l.clone();
        short.drives.pop();
        assert!(parse_layout(&encode_layout(&short)).unwrap_err().contains("5 drives"));
        let mut twice = l.clone();
        twice.drives[5].slot = 4;
        assert!(parse_layout(&encode_layout(&twice)).unwrap_err().contains("two drives"));
        let mut odd = l.clone();
        odd.parity = 5;
        assert!(parse_layout(&encode_layout(&odd)).is_err());
        let i = DriveIdentity { store: [1; 16], set: 2, slot: 5, drive: [3; 16] };
        assert_eq!(parse_identity(&encode_identity(&i)), Ok(i));
        assert!(parse_identity(&seal("version=2\n".into())).unwrap_err().contains("version"));
    }

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
    fn master_keys_round_trip_with_a_pending_key() {
        let mut keys = mosaic_crypt::MasterKeys::generate().unwrap();
        let v1 = encode_master_keys(&keys);
        assert!(v1.starts_with("version=1\n"), "a set without a pending key is written as older builds read it");
        assert_eq!(parse_master_keys(&v1).unwrap(), keys);
        keys.add_pending().unwrap();
        let v2 = encode_master_keys(&keys);
        assert!(v2.starts_with("version=2\n") && v2.contains("sealing=1\n"), "{v2}");
        let back = parse_master_keys(&v2).unwrap();
        assert_eq!((back.current().0, back.pending()), (1, Some(2)));
        assert_eq!(back, keys);
        let sealing = keys.sealing_with(2).unwrap();
        assert!(encode_master_keys(&sealing).starts_with("version=1\n"));
        for bad in
            [v2.replace("sealing=1", "sealing=9"), v2.replace("sealing=1\n", ""), v2.replace("version=2", "version=3")]
        {
            // Re-sealed so that the checksum holds and the content is what is refused.
            let body = bad.rsplit_once("crc32c=").map(|(b, _)| b.to_string()).unwrap();
            assert!(parse_master_keys(&seal(body)).is_err(), "{bad}");
        }
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
    fn cluster_node_round_trip_and_refusals() {
        for n in [
            ClusterNodeFile { node: 7, secret: None },
            ClusterNodeFile { node: u64::MAX, secret: Some("ab".repeat(32)) },
        ] {
            assert_eq!(parse_cluster_node(&encode_cluster_node(&n)), Ok(n));
        }
        let text = encode_cluster_node(&ClusterNodeFile { node: 7, secret: None });
        assert!(parse_cluster_node(&text.replace("node=7", "node=8")).unwrap_err().contains("checksum"));
        assert!(parse_cluster_node(&seal("version=2\nnode=1\nsecret=\n".into())).unwrap_err().contains("version"));
        assert!(parse_cluster_node(&seal("version=1\nnode=x\nsecret=\n".into())).unwrap_err().contains("node id"));
        assert!(parse_cluster_node(&seal("version=1\nnode=1\nsecret=abc\n".into())).unwrap_err().contains("hex"));
    }

    #[test]
    fn oversize_file_is_refused_before_checksumming() {
        let big = "x".repeat(FILE_MAX_BYTES + 1);
        assert!(parse_keys(&big).unwrap_err().contains("larger than"));
    }
}
