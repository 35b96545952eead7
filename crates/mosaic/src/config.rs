//! Server configuration: defaults < TOML file (--config / MOSAIC_CONFIG) < MOSAIC_* environment < flags.
//! Unknown keys in the file are an error naming the key. docs/configuration.md lists every key.

use mosaic::size_format::parse_size;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file's shape. Every field is optional: what is missing comes from the defaults.
#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub s3_address: Option<String>,
    pub admin_address: Option<String>,
    pub domain: Option<String>,
    pub drive_size: Option<String>,
    pub drive_preallocate: Option<bool>,
    pub drives: Option<Vec<PathBuf>>,
    pub erasure: Option<String>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    pub shutdown_timeout_secs: Option<u64>,
    pub console_session_max_secs: Option<u64>,
    pub max_connections: Option<usize>,
    pub worker_threads: Option<usize>,
    pub kv_cache_size: Option<String>,
    pub meta_cache_size: Option<String>,
    pub page_cache_size: Option<String>,
    pub verified_cache_size: Option<String>,
    pub inline_max_size: Option<String>,
    pub read_cache: Option<String>,
    pub scrub_rate: Option<String>,
    pub scrub_interval: Option<String>,
    pub heal_rate: Option<String>,
    pub scan_interval: Option<String>,
    pub commit_gather: Option<String>,
    pub lifecycle_day: Option<String>,
    pub io_engine: Option<String>,
    pub background_io_idle: Option<bool>,
    pub background_cpu_class: Option<bool>,
    pub lazy_encode_min_size: Option<String>,
    pub kms_keys: Option<Vec<String>>,
    pub sse_master_key: Option<String>,
    pub sse_c_over_http: Option<bool>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub cluster_address: Option<String>,
    pub cluster_advertise: Option<String>,
    pub cluster_ca: Option<PathBuf>,
    pub join: Option<String>,
    pub zone: Option<String>,
    pub move_rate: Option<String>,
    pub microstores: Option<crate::microstore_config::MicrostoresFile>,
}

/// Values given on the command line or in the environment (clap merges the two; flags win).
#[derive(Default, Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// TOML configuration file (keys as in docs/configuration.md).
    #[arg(long, env = "MOSAIC_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory holding the drive; created and formatted on first start.
    #[arg(long, env = "MOSAIC_DATA_DIR", value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address of the S3 API.
    #[arg(long, env = "MOSAIC_S3_ADDRESS", value_name = "HOST:PORT")]
    pub s3_address: Option<String>,
    /// Address of the admin API, health checks and metrics.
    #[arg(long, env = "MOSAIC_ADMIN_ADDRESS", value_name = "HOST:PORT")]
    pub admin_address: Option<String>,
    /// Domain for virtual-host-style requests (bucket.DOMAIN); path style always works.
    #[arg(long, env = "MOSAIC_DOMAIN", value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// Most the drive's data file grows to (e.g. 64GiB); default: nine tenths of the free space when the
    /// drive is created, at most 1 TiB. The file holds what is stored and grows in preallocated steps.
    /// Ignored once the drive exists.
    #[arg(long, env = "MOSAIC_DRIVE_SIZE", value_name = "SIZE")]
    pub drive_size: Option<String>,
    /// Preallocate the whole drive file when it is created, instead of growing it as data arrives.
    #[arg(long, env = "MOSAIC_DRIVE_PREALLOCATE")]
    pub drive_preallocate: bool,
    /// A drive: a directory (ideally on its own disk) holding the drive's data file and metadata database.
    /// Repeat for several drives, always in the same order; up to 16 drives form one erasure-coded set, more
    /// form several sets of equal size. Default: one drive in the data directory.
    #[arg(long = "drive", env = "MOSAIC_DRIVES", value_name = "DIR", value_delimiter = ',')]
    pub drives: Vec<PathBuf>,
    /// The erasure code of a new store, as DATA+PARITY (e.g. 4+2): any PARITY drives of a set may fail.
    /// Default by drives per set: 1: 1+0, 2-3: one parity, 4-5: two, 6-7: three, 8 and more: four.
    #[arg(long, env = "MOSAIC_ERASURE", value_name = "K+M")]
    pub erasure: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "MOSAIC_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log level or filter (error, warn, info, debug, trace, or a tracing filter).
    #[arg(long, env = "MOSAIC_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Seconds that in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, env = "MOSAIC_SHUTDOWN_TIMEOUT_SECS", value_name = "SECS")]
    pub shutdown_timeout_secs: Option<u64>,
    /// Seconds a web console session lasts after sign-in, however used.
    #[arg(long, env = "MOSAIC_CONSOLE_SESSION_MAX_SECS", value_name = "SECS")]
    pub console_session_max_secs: Option<u64>,
    /// Largest number of open S3 connections; more wait to be accepted.
    #[arg(long, env = "MOSAIC_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Threads that serve requests (the async runtime's workers; drive IO runs on threads of its own).
    /// Default: one per core.
    #[arg(long, env = "MOSAIC_WORKER_THREADS", value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Testing only: put a volatile write cache in front of the data file, so that killing the process
    /// loses every data write since the last flush, as a power cut does (the power-loss test).
    #[arg(long, env = "MOSAIC_SIMULATE_POWER_LOSS", hide = true)]
    pub simulate_power_loss: bool,
    /// Block cache of the metadata database (e.g. 256MiB).
    #[arg(long, env = "MOSAIC_KV_CACHE_SIZE", value_name = "SIZE")]
    pub kv_cache_size: Option<String>,
    /// The drive's cache of object names and onodes (e.g. 16MiB); 0 turns it off.
    #[arg(long, env = "MOSAIC_META_CACHE_SIZE", value_name = "SIZE")]
    pub meta_cache_size: Option<String>,
    /// The page cache of recently written blocks, for the node (e.g. 256MiB; default a 128th of the memory,
    /// from 32MiB to 1GiB); 0 turns it off.
    #[arg(long, env = "MOSAIC_PAGE_CACHE_SIZE", value_name = "SIZE")]
    pub page_cache_size: Option<String>,
    /// Large reads kept verified and pinned in the kernel's page cache, for the node (e.g. 1GiB; default a
    /// sixteenth of the memory, at most 2GiB); 0 keeps none.
    #[arg(long, env = "MOSAIC_VERIFIED_CACHE_SIZE", value_name = "SIZE")]
    pub verified_cache_size: Option<String>,
    /// Objects up to this size live wholly in the metadata database (e.g. 16KiB).
    #[arg(long, env = "MOSAIC_INLINE_MAX_SIZE", value_name = "SIZE")]
    pub inline_max_size: Option<String>,
    /// Where object reads are cached: page-cache (the kernel's, outside the process) or off (every read
    /// from the device).
    #[arg(long, env = "MOSAIC_READ_CACHE", value_name = "MODE")]
    pub read_cache: Option<String>,
    /// Device read rate of the background scrub, per second (e.g. 8MiB); 0 turns it off.
    #[arg(long, env = "MOSAIC_SCRUB_RATE", value_name = "SIZE")]
    pub scrub_rate: Option<String>,
    /// Shortest time from the start of one background scrub pass to the start of the next (e.g. 24h,
    /// 7d): an idle or unchanged drive is not walked again before then.
    #[arg(long, env = "MOSAIC_SCRUB_INTERVAL", value_name = "DURATION")]
    pub scrub_interval: Option<String>,
    /// Most bytes per second that heal rebuilds onto drives of a set (e.g. 512MiB); 0: no limit. Heal runs
    /// in the drives' background IO class either way, behind client requests.
    #[arg(long, env = "MOSAIC_HEAL_RATE", value_name = "SIZE")]
    pub heal_rate: Option<String>,
    /// How often each set's drives are compared to find objects that a drive lacks or holds differently
    /// (e.g. 1h).
    #[arg(long, env = "MOSAIC_SCAN_INTERVAL", value_name = "DURATION")]
    pub scan_interval: Option<String>,
    /// Longest a drive holds a short group of writes for more to join it, while groups of several have
    /// been forming (default 2ms, at most 10ms; 0 commits every group at once).
    #[arg(long, env = "MOSAIC_COMMIT_GATHER", value_name = "DURATION")]
    pub commit_gather: Option<String>,
    /// How long a "day" of lifecycle rules lasts (default 1d); shorter only to test rules in seconds
    /// (e.g. 2s). Lifecycle passes run four times a day, at least every 100ms and at most every hour.
    #[arg(long, env = "MOSAIC_LIFECYCLE_DAY", value_name = "DURATION")]
    pub lifecycle_day: Option<String>,
    /// Appends gather in an object's tail (m + 1 copies) until it holds this much (e.g. 1MiB); then
    /// background lazy sync encodes its whole stripes. 0 encodes each stripe in the append that fills it
    /// (the read-modify-write ablation, for benchmarks).
    #[arg(long, env = "MOSAIC_LAZY_ENCODE_MIN_SIZE", value_name = "SIZE", hide = true)]
    pub lazy_encode_min_size: Option<String>,
    /// Testing only: each drive's device can be made to fail or to refuse writes through the admin API
    /// (the drive fault tests).
    #[arg(long, env = "MOSAIC_FAULT_INJECTION", hide = true)]
    pub fault_injection: bool,
    /// How the data device issues IO: auto (io_uring where the kernel allows it, else pread/pwrite),
    /// io-uring, or pread.
    #[arg(long, env = "MOSAIC_IO_ENGINE", value_name = "ENGINE")]
    pub io_engine: Option<String>,
    /// Whether the drives' device IO for background work (heal, scans, lazy encoding, a cluster's moves)
    /// goes to the kernel in the idle IO class, behind clients' IO (default true; the IO scheduler must know
    /// classes: mq-deadline or BFQ).
    #[arg(long, env = "MOSAIC_BACKGROUND_IO_IDLE", value_name = "BOOL")]
    pub background_io_idle: Option<bool>,
    /// Whether background work's CPU work (decoding, checksums and copies in drive calls for heal, scans,
    /// lazy encoding, a cluster's moves) runs on threads of a lower CPU priority, behind clients' work
    /// (default true; the nice is the microstores' `bulk_nice`, 10 when that is 0).
    #[arg(long, env = "MOSAIC_BACKGROUND_CPU_CLASS", value_name = "BOOL")]
    pub background_cpu_class: Option<bool>,
    /// An SSE-KMS key id the local key provider serves (repeat for more); its key is derived from the
    /// master key, so it needs no secret of its own.
    #[arg(long = "kms-key", env = "MOSAIC_KMS_KEYS", value_delimiter = ',', value_name = "KEY_ID")]
    pub kms_keys: Vec<String>,
    /// Accept SSE-C keys over plain HTTP (they are refused there by default: a key sent in the clear is
    /// no secret). For tests and trusted networks only.
    #[arg(long, env = "MOSAIC_SSE_C_OVER_HTTP")]
    pub sse_c_over_http: bool,
    /// Serve HTTPS on the S3 and admin ports with this certificate chain (PEM, leaf first); needs
    /// --tls-key. Reloaded with the key on SIGHUP.
    #[arg(long, env = "MOSAIC_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "MOSAIC_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Run as a node of a cluster, listening for other nodes on this address. A new node waits for
    /// `mosaic admin cluster init` (the first node) or joins with --join.
    #[arg(long, env = "MOSAIC_CLUSTER_ADDRESS", value_name = "HOST:PORT")]
    pub cluster_address: Option<String>,
    /// Where other nodes reach this one, when not --cluster-address (behind NAT or a wildcard bind).
    #[arg(long, env = "MOSAIC_CLUSTER_ADVERTISE", value_name = "HOST:PORT")]
    pub cluster_advertise: Option<String>,
    /// Calls between nodes go over TLS: the certificates (PEM) of the authority that signed every node's
    /// --tls-cert. This node serves its cluster port with --tls-cert, which must name the address other
    /// nodes reach it at, and calls only nodes whose certificates this authority signed.
    #[arg(long, env = "MOSAIC_CLUSTER_CA", value_name = "FILE")]
    pub cluster_ca: Option<PathBuf>,
    /// Join the cluster of the node at this cluster address (once; a member restarts without it). Needs
    /// the cluster's secret in MOSAIC_CLUSTER_SECRET (printed by `mosaic admin cluster init`).
    #[arg(long, env = "MOSAIC_JOIN", value_name = "HOST:PORT")]
    pub join: Option<String>,
    /// This node's failure domain when the cluster places shards by zone (default: "default").
    #[arg(long, env = "MOSAIC_ZONE", value_name = "NAME")]
    pub zone: Option<String>,
    /// Most bytes per second this node's rebalancer copies onto the drives of the placement groups it moves
    /// (e.g. 64MiB; every node that owns moving groups copies at up to this rate); 0: no limit.
    #[arg(long, env = "MOSAIC_MOVE_RATE", value_name = "SIZE")]
    pub move_rate: Option<String>,
    /// Testing only: the rebalancer aborts the process (as a kill -9 would) between a step's last count
    /// and its report, once: when it is the one to remove this file (nodes may share the path).
    #[arg(long, env = "MOSAIC_FAULT_ABORT_BEFORE_MOVE_REPORT", value_name = "PATH", hide = true)]
    pub fault_abort_before_move_report: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The resolved configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub data_dir: PathBuf,
    pub s3_address: SocketAddr,
    pub admin_address: SocketAddr,
    pub domain: Option<String>,
    pub drive_size_bytes: Option<u64>,
    /// Preallocate the whole drive file at format time (else it grows in steps).
    pub drive_preallocate: bool,
    /// The drives' directories in slot order; empty: one drive in the data directory.
    pub drives: Vec<PathBuf>,
    /// The erasure code for a new store; None: chosen by the drives per set.
    pub erasure: Option<mosaic_erasure::SetGeometry>,
    pub log_format: LogFormat,
    pub log_level: String,
    pub shutdown_timeout: Duration,
    /// How long a console session lasts after sign-in.
    pub console_session_max: Duration,
    pub max_connections: usize,
    /// Threads of the async runtime that serves requests.
    pub worker_threads: usize,
    pub kv_cache_bytes: u64,
    pub meta_cache_bytes: u64,
    pub page_cache_bytes: u64,
    /// Bytes of large reads kept verified, for the node (split among its drives).
    pub verified_cache_bytes: u64,
    pub inline_max_bytes: u64,
    /// Object reads through the kernel's page cache (`read_cache = "page-cache"`).
    pub page_cache_reads: bool,
    /// Background scrub rate in bytes per second; 0: off.
    pub scrub_bytes_per_s: u64,
    /// Shortest time between the starts of two background scrub passes.
    pub scrub_interval: Duration,
    /// Heal's rate limit per set in bytes per second; 0: none.
    pub heal_bytes_per_s: u64,
    /// Time between two background scans of a set's drives.
    pub scan_interval: Duration,
    /// Group commit's gathering window on every drive (`mosaic_engine::EngineConfig::commit_gather`).
    pub commit_gather: Duration,
    pub lifecycle_day: Duration,
    /// Tail bytes before lazy sync encodes an object's whole stripes; 0: on the request path.
    pub lazy_encode_min_bytes: u64,
    pub io_engine: mosaic_engine::IoEngine,
    /// Background work's device IO in the kernel's idle class (`mosaic_engine::set_background_io_idle`).
    pub background_io_idle: bool,
    /// Background work's blocking CPU work at the bulk nice (`mosaic_store::set_background_cpu_class`).
    pub background_cpu_class: bool,
    pub simulate_power_loss: bool,
    pub fault_injection: bool,
    /// SSE-KMS key ids served by the local key provider.
    pub kms_keys: Vec<String>,
    /// The SSE master key from the config (64 hex digits), for nodes that must share it; None: the key
    /// file in the data directory (made at first start).
    pub sse_master_key: Option<[u8; 32]>,
    pub sse_c_over_http: bool,
    /// HTTPS on both ports; None: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Cluster mode; None: a standalone store.
    pub cluster: Option<ClusterConfig>,
    pub microstores: mosaic_microstore::registry::Config,
    /// Requests admitted through microstores and watched (`[microstores] enabled`, default true).
    pub microstores_enabled: bool,
    /// Bytes per second a bucket's move between sets copies (`[microstores] move_rate`, default 64 MiB).
    pub microstore_move_bytes_s: u64,
}

/// A cluster node's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// Where it listens for other nodes.
    pub address: SocketAddr,
    /// Where other nodes reach it.
    pub advertise: String,
    /// A member's cluster address to join through.
    pub join: Option<String>,
    /// The cluster secret to join with (MOSAIC_CLUSTER_SECRET; never a flag, so it is not in `ps`).
    pub secret: Option<String>,
    pub zone: String,
    /// Calls between nodes go over TLS, trusting this authority (PEM); the node serves with `Config::tls`.
    pub ca: Option<PathBuf>,
    /// Most bytes per second its rebalancer copies (0: no limit).
    pub move_bytes_per_s: u64,
    /// Testing only: the file whose removal aborts the process before a step's report (see the flag).
    pub abort_before_move_report: Option<PathBuf>,
}

/// The certificate chain and private key files of HTTPS.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub const DEFAULT_DATA_DIR: &str = "./mosaic-data";
pub const DEFAULT_S3_ADDRESS: &str = "127.0.0.1:9000";
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:9001";
/// What a node's rebalancer copies per second at most unless told otherwise.
const DEFAULT_MOVE_RATE: &str = "1GiB";
/// Bounds of configurable limits.
const MAX_CONNECTIONS_LIMIT: usize = 65_536;
const MAX_WORKER_THREADS: usize = 1024;
const MAX_SHUTDOWN_SECS: u64 = 3600;
/// A console session lasts at most 12 hours (also the default).
const MAX_CONSOLE_SESSION_SECS: u64 = 12 * 3600;
const MAX_INLINE_BYTES: u64 = 1 << 20;
const MAX_SCRUB_BYTES_PER_S: u64 = 16 << 30;
/// Largest tail lazy sync lets an object gather (its m + 1 copies are kept whole until then).
const MAX_LAZY_ENCODE_MIN_BYTES: u64 = 1 << 30;
const MIN_SCRUB_INTERVAL: Duration = Duration::from_secs(1);
const MAX_SCRUB_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);
/// Longest gathering window: past it a held write waits longer than a device flush takes.
const MAX_COMMIT_GATHER: Duration = Duration::from_millis(10);
const MAX_META_CACHE_BYTES: u64 = 64 << 30;
const MAX_PAGE_CACHE_BYTES: u64 = 64 << 30;
const MAX_VERIFIED_CACHE_BYTES: u64 = 64 << 30;

/// The machine's memory in bytes (0 if the kernel does not say).
fn machine_memory_bytes() -> u64 {
    // SAFETY: sysinfo writes into the struct we pass.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sysinfo(&mut info) } == 0 { info.totalram * u64::from(info.mem_unit) } else { 0 }
}

/// The default of `verified_cache_size`: a sixteenth of the machine's memory, at most 2 GiB (pinned pages
/// are not reclaimed while kept, so the default stays a small share).
fn default_verified_cache_bytes() -> u64 {
    (machine_memory_bytes() / 16).min(2 << 30)
}

/// The default of `worker_threads`: one per core the process may run on.
fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKER_THREADS)
}

/// The default of `page_cache_size`: a 128th of the machine's memory, from 32 MiB to 1 GiB. Small objects
/// live in the KV store: a read of one whose page is cached needs no KV iterator over its fragments and no
/// blob read, which the old fixed 32 MiB left to every read of a working set beyond about 30 MB.
fn default_page_cache_bytes() -> u64 {
    (machine_memory_bytes() / 128).clamp(32 << 20, 1 << 30)
}

pub fn load_file(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    parse_file(&text).map_err(|e| format!("config file {}: {e}", path.display()))
}

pub fn parse_file(text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| e.message().to_string())
}

fn addr(name: &str, v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| format!("{name}: {v:?} is not an address of the form HOST:PORT (e.g. 127.0.0.1:9000)"))
}

/// A HOST:PORT whose host may be a name (other nodes resolve it), as a cluster address is advertised.
pub(crate) fn host_port(name: &str, v: &str) -> Result<(), String> {
    let bad = || format!("{name}: {v:?} is not of the form HOST:PORT (e.g. node1.example:9100)");
    let (host, port) = v.rsplit_once(':').ok_or_else(bad)?;
    let host_ok = !host.is_empty() && host.len() <= 253 && !host.chars().any(|c| c.is_whitespace() || c == '/');
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(())
}

fn size(name: &str, v: &str) -> Result<u64, String> {
    parse_size(v).map_err(|e| format!("{name}: {e}"))
}

/// Both files or neither: a certificate without its key (or the reverse) is a mistake, not plain HTTP.
fn tls_files(args: &ServerArgs, file: &FileConfig) -> Result<Option<TlsFiles>, String> {
    let cert = args.tls_cert.clone().or_else(|| file.tls_cert.clone());
    let key = args.tls_key.clone().or_else(|| file.tls_key.clone());
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
        (None, None) => Ok(None),
        (Some(_), None) => Err("tls_cert is set but tls_key is not: HTTPS needs both".into()),
        (None, Some(_)) => Err("tls_key is set but tls_cert is not: HTTPS needs both".into()),
    }
}

fn cluster_config(args: &ServerArgs, file: &FileConfig) -> Result<Option<ClusterConfig>, String> {
    let pick = |a: &Option<String>, f: &Option<String>| a.clone().or_else(|| f.clone());
    let join = pick(&args.join, &file.join);
    let ca = args.cluster_ca.clone().or_else(|| file.cluster_ca.clone());
    let Some(address) = pick(&args.cluster_address, &file.cluster_address) else {
        if join.is_some() {
            return Err("join: a node joins a cluster only with a cluster_address of its own".into());
        }
        if ca.is_some() {
            return Err("cluster_ca: TLS between nodes needs a cluster_address".into());
        }
        return Ok(None);
    };
    if ca.is_some() && tls_files(args, file)?.is_none() {
        return Err("cluster_ca: a node serves its cluster port over TLS with tls_cert and tls_key; set both".into());
    }
    let address = addr("cluster_address", &address)?;
    let advertised = pick(&args.cluster_advertise, &file.cluster_advertise);
    if let Some(a) = &advertised {
        host_port("cluster_advertise", a)?;
    }
    let advertise = advertised.unwrap_or_else(|| address.to_string());
    if address.ip().is_unspecified() && advertise == address.to_string() {
        return Err(format!("cluster_advertise: {address} is a wildcard; say where other nodes reach this one"));
    }
    if let Some(j) = &join {
        host_port("join", j)?;
    }
    let zone = pick(&args.zone, &file.zone).unwrap_or_else(|| "default".into());
    if zone.is_empty() || zone.len() > 64 || !zone.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!("zone: {zone:?} is not 1 to 64 letters, digits, '-' or '_'"));
    }
    let secret = std::env::var("MOSAIC_CLUSTER_SECRET").ok().filter(|s| !s.is_empty());
    if let Some(s) = &secret
        && (s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err("MOSAIC_CLUSTER_SECRET: 64 hex digits, as `mosaic admin cluster init` printed".into());
    }
    let move_rate = pick(&args.move_rate, &file.move_rate).unwrap_or_else(|| DEFAULT_MOVE_RATE.into());
    let move_bytes_per_s = size("move_rate", &move_rate)?;
    let abort_before_move_report = args.fault_abort_before_move_report.clone();
    Ok(Some(ClusterConfig { address, advertise, join, secret, zone, ca, move_bytes_per_s, abort_before_move_report }))
}

impl Config {
    /// Merges flags/env (`args`) over the file over the defaults and checks every value.
    pub fn resolve(args: &ServerArgs, file: &FileConfig) -> Result<Config, String> {
        let pick = |a: &Option<String>, f: &Option<String>| a.clone().or_else(|| f.clone());
        let s3 = pick(&args.s3_address, &file.s3_address).unwrap_or_else(|| DEFAULT_S3_ADDRESS.into());
        let admin = pick(&args.admin_address, &file.admin_address).unwrap_or_else(|| DEFAULT_ADMIN_ADDRESS.into());
        let log_format = match pick(&args.log_format, &file.log_format).as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(format!("log_format: {other:?} is not one of text, json")),
        };
        let log_level = pick(&args.log_level, &file.log_level).unwrap_or_else(|| "info".into());
        tracing_subscriber::EnvFilter::try_new(&log_level).map_err(|e| format!("log_level: {log_level:?}: {e}"))?;
        let shutdown = args.shutdown_timeout_secs.or(file.shutdown_timeout_secs).unwrap_or(30);
        if shutdown > MAX_SHUTDOWN_SECS {
            return Err(format!("shutdown_timeout_secs: {shutdown} is above the maximum {MAX_SHUTDOWN_SECS}"));
        }
        let console_session_max_secs =
            args.console_session_max_secs.or(file.console_session_max_secs).unwrap_or(MAX_CONSOLE_SESSION_SECS);
        if !(1..=MAX_CONSOLE_SESSION_SECS).contains(&console_session_max_secs) {
            return Err(format!(
                "console_session_max_secs: {console_session_max_secs} is not between 1 and {MAX_CONSOLE_SESSION_SECS}"
            ));
        }
        let max_connections = args.max_connections.or(file.max_connections).unwrap_or(1024);
        if max_connections == 0 || max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(format!("max_connections: {max_connections} is not between 1 and {MAX_CONNECTIONS_LIMIT}"));
        }
        let worker_threads = args.worker_threads.or(file.worker_threads).unwrap_or_else(default_worker_threads);
        if worker_threads == 0 || worker_threads > MAX_WORKER_THREADS {
            return Err(format!("worker_threads: {worker_threads} is not between 1 and {MAX_WORKER_THREADS}"));
        }
        let drive_size_bytes = match pick(&args.drive_size, &file.drive_size) {
            Some(v) => {
                let b = size("drive_size", &v)?;
                if b < 64 << 20 {
                    return Err(format!("drive_size: {v} is below the minimum 64MiB"));
                }
                Some(b)
            }
            None => None,
        };
        let kv_cache_bytes =
            size("kv_cache_size", &pick(&args.kv_cache_size, &file.kv_cache_size).unwrap_or("128MiB".into()))?;
        let meta_cache_bytes =
            size("meta_cache_size", &pick(&args.meta_cache_size, &file.meta_cache_size).unwrap_or("16MiB".into()))?;
        if meta_cache_bytes > MAX_META_CACHE_BYTES {
            return Err(format!("meta_cache_size: {meta_cache_bytes} bytes is above the maximum 64GiB"));
        }
        let page_cache_bytes = match pick(&args.page_cache_size, &file.page_cache_size) {
            Some(v) => size("page_cache_size", &v)?,
            None => default_page_cache_bytes(),
        };
        if page_cache_bytes > MAX_PAGE_CACHE_BYTES {
            return Err(format!("page_cache_size: {page_cache_bytes} bytes is above the maximum 64GiB"));
        }
        let verified_cache_bytes = match pick(&args.verified_cache_size, &file.verified_cache_size) {
            Some(v) => size("verified_cache_size", &v)?,
            None => default_verified_cache_bytes(),
        };
        if verified_cache_bytes > MAX_VERIFIED_CACHE_BYTES {
            return Err(format!("verified_cache_size: {verified_cache_bytes} bytes is above the maximum 64GiB"));
        }
        let inline_max_bytes =
            size("inline_max_size", &pick(&args.inline_max_size, &file.inline_max_size).unwrap_or("16KiB".into()))?;
        if inline_max_bytes > MAX_INLINE_BYTES {
            return Err(format!("inline_max_size: {inline_max_bytes} bytes is above the maximum 1MiB"));
        }
        let page_cache_reads = match pick(&args.read_cache, &file.read_cache).as_deref().unwrap_or("page-cache") {
            "page-cache" => true,
            "off" => false,
            other => return Err(format!("read_cache: {other:?} is not one of page-cache, off")),
        };
        let io_engine = match pick(&args.io_engine, &file.io_engine).as_deref().unwrap_or("auto") {
            "auto" => mosaic_engine::IoEngine::Auto,
            "io-uring" => mosaic_engine::IoEngine::IoUring,
            "pread" => mosaic_engine::IoEngine::Pread,
            other => return Err(format!("io_engine: {other:?} is not one of auto, io-uring, pread")),
        };
        let scrub_bytes_per_s = size("scrub_rate", &pick(&args.scrub_rate, &file.scrub_rate).unwrap_or("8MiB".into()))?;
        if scrub_bytes_per_s > MAX_SCRUB_BYTES_PER_S {
            return Err(format!("scrub_rate: {scrub_bytes_per_s} bytes per second is above the maximum 16GiB"));
        }
        let drives = if args.drives.is_empty() { file.drives.clone().unwrap_or_default() } else { args.drives.clone() };
        if drives.len() > mosaic::datadir_format::MAX_DRIVES {
            return Err(format!("drives: {} drives; at most {}", drives.len(), mosaic::datadir_format::MAX_DRIVES));
        }
        if let Some(empty) = drives.iter().find(|d| d.as_os_str().is_empty()) {
            return Err(format!("drives: an empty path {empty:?}"));
        }
        let erasure = match pick(&args.erasure, &file.erasure) {
            Some(e) => Some(mosaic_erasure::SetGeometry::parse(&e).map_err(|e| format!("erasure: {e}"))?),
            None => None,
        };
        let interval = pick(&args.scrub_interval, &file.scrub_interval).unwrap_or("24h".into());
        let scrub_interval = humantime::parse_duration(&interval)
            .map_err(|e| format!("scrub_interval: {interval:?} is not a duration such as 24h or 7d: {e}"))?;
        if !(MIN_SCRUB_INTERVAL..=MAX_SCRUB_INTERVAL).contains(&scrub_interval) {
            return Err(format!("scrub_interval: {interval} is not between 1s and 366d"));
        }
        let heal_bytes_per_s = size("heal_rate", &pick(&args.heal_rate, &file.heal_rate).unwrap_or("1GiB".into()))?;
        let lazy = pick(&args.lazy_encode_min_size, &file.lazy_encode_min_size).unwrap_or("1MiB".into());
        let lazy_encode_min_bytes = size("lazy_encode_min_size", &lazy)?;
        if lazy_encode_min_bytes > MAX_LAZY_ENCODE_MIN_BYTES {
            return Err(format!("lazy_encode_min_size: {lazy} is above the maximum 1GiB"));
        }
        let interval = pick(&args.scan_interval, &file.scan_interval).unwrap_or("1h".into());
        let scan_interval = humantime::parse_duration(&interval)
            .map_err(|e| format!("scan_interval: {interval:?} is not a duration such as 1h or 30m: {e}"))?;
        if !(MIN_SCRUB_INTERVAL..=MAX_SCRUB_INTERVAL).contains(&scan_interval) {
            return Err(format!("scan_interval: {interval} is not between 1s and 366d"));
        }
        let gather = pick(&args.commit_gather, &file.commit_gather).unwrap_or("2ms".into());
        let commit_gather = humantime::parse_duration(&gather)
            .map_err(|e| format!("commit_gather: {gather:?} is not a duration such as 2ms or 0s: {e}"))?;
        if commit_gather > MAX_COMMIT_GATHER {
            return Err(format!("commit_gather: {gather} is above the maximum 10ms"));
        }
        let day = pick(&args.lifecycle_day, &file.lifecycle_day).unwrap_or("1d".into());
        let lifecycle_day = humantime::parse_duration(&day)
            .map_err(|e| format!("lifecycle_day: {day:?} is not a duration such as 1d or 2s: {e}"))?;
        if !(MIN_SCRUB_INTERVAL..=MAX_SCRUB_INTERVAL).contains(&lifecycle_day) {
            return Err(format!("lifecycle_day: {day} is not between 1s and 366d"));
        }
        let mut kms_keys = file.kms_keys.clone().unwrap_or_default();
        kms_keys.extend(args.kms_keys.iter().cloned());
        kms_keys.sort();
        kms_keys.dedup();
        if kms_keys.len() > mosaic_layer::MAX_KMS_KEYS {
            return Err(format!("kms_keys: at most {} keys", mosaic_layer::MAX_KMS_KEYS));
        }
        let bad_id = |k: &String| {
            k.is_empty() || k.len() > mosaic_layer::MAX_KMS_KEY_ID_BYTES || k.chars().any(char::is_control)
        };
        if let Some(bad) = kms_keys.iter().find(|k| bad_id(k)) {
            return Err(format!("kms_keys: {bad:?} is not a key id (1 to 256 printable characters)"));
        }
        let sse_master_key = match &file.sse_master_key {
            None => None,
            Some(h) => Some(
                hex::decode(h.trim())
                    .ok()
                    .and_then(|v| <[u8; 32]>::try_from(v).ok())
                    .ok_or("sse_master_key: 64 hex digits (256 bits)")?,
            ),
        };
        let domain = pick(&args.domain, &file.domain).filter(|d| !d.is_empty());
        if let Some(d) = &domain {
            mosaic_s3::validate_domain(d).map_err(|e| format!("domain: {e}"))?;
        }
        Ok(Config {
            data_dir: args.data.clone().or_else(|| file.data_dir.clone()).unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            s3_address: addr("s3_address", &s3)?,
            admin_address: addr("admin_address", &admin)?,
            domain,
            drive_size_bytes,
            drive_preallocate: args.drive_preallocate || file.drive_preallocate.unwrap_or(false),
            drives,
            erasure,
            log_format,
            log_level,
            shutdown_timeout: Duration::from_secs(shutdown),
            console_session_max: Duration::from_secs(console_session_max_secs),
            max_connections,
            worker_threads,
            kv_cache_bytes,
            meta_cache_bytes,
            page_cache_bytes,
            verified_cache_bytes,
            inline_max_bytes,
            page_cache_reads,
            scrub_bytes_per_s,
            scrub_interval,
            heal_bytes_per_s,
            scan_interval,
            commit_gather,
            lifecycle_day,
            lazy_encode_min_bytes,
            io_engine,
            background_io_idle: args.background_io_idle.or(file.background_io_idle).unwrap_or(true),
            background_cpu_class: args.background_cpu_class.or(file.background_cpu_class).unwrap_or(true),
            simulate_power_loss: args.simulate_power_loss,
            fault_injection: args.fault_injection,
            kms_keys,
            sse_master_key,
            sse_c_over_http: args.sse_c_over_http || file.sse_c_over_http.unwrap_or(false),
            tls: tls_files(args, file)?,
            microstores: crate::microstore_config::resolve(file.microstores.as_ref())?,
            microstores_enabled: crate::microstore_config::enabled(file.microstores.as_ref()),
            microstore_move_bytes_s: crate::microstore_config::move_rate_bytes_s(file.microstores.as_ref())?,
            cluster: cluster_config(args, file)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(args: ServerArgs, file: &str) -> Result<Config, String> {
        Config::resolve(&args, &parse_file(file)?)
    }

    #[test]
    fn defaults() {
        let c = resolve(ServerArgs::default(), "").unwrap();
        assert_eq!(c.data_dir, PathBuf::from("./mosaic-data"));
        assert_eq!(c.s3_address.to_string(), "127.0.0.1:9000");
        assert_eq!(c.admin_address.to_string(), "127.0.0.1:9001");
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.worker_threads, default_worker_threads());
        assert!((1..=MAX_WORKER_THREADS).contains(&c.worker_threads));
        assert_eq!(c.inline_max_bytes, 16 << 10);
        assert_eq!(c.drive_size_bytes, None);
        assert!(c.page_cache_reads);
        assert_eq!(c.scrub_bytes_per_s, 8 << 20);
        assert_eq!(c.heal_bytes_per_s, 1 << 30);
        assert_eq!(c.lazy_encode_min_bytes, 1 << 20);
        assert_eq!(c.scan_interval, Duration::from_secs(3600));
        assert_eq!(c.commit_gather, Duration::from_millis(2));
        assert_eq!(c.lifecycle_day, Duration::from_secs(86_400));
        assert_eq!(c.tls, None);
        let memory = machine_memory_bytes();
        assert_eq!(c.page_cache_bytes, (memory / 128).clamp(32 << 20, 1 << 30), "a 128th of {memory} bytes");
        assert!((32 << 20..=1 << 30).contains(&c.page_cache_bytes));
        assert_eq!(c.verified_cache_bytes, (memory / 16).min(2 << 30));
    }

    #[test]
    fn cluster_settings_and_their_refusals() {
        assert_eq!(resolve(ServerArgs::default(), "").unwrap().cluster, None);
        let file = "cluster_address = \"0.0.0.0:9100\"\ncluster_advertise = \"node1.example:9100\"\nzone = \"rack-1\"";
        let c = resolve(ServerArgs::default(), file).unwrap().cluster.unwrap();
        assert_eq!((c.advertise.as_str(), c.zone.as_str(), c.join), ("node1.example:9100", "rack-1", None));
        let args = ServerArgs { join: Some("node0.example:9100".into()), ..Default::default() };
        assert_eq!(resolve(args, file).unwrap().cluster.unwrap().join.as_deref(), Some("node0.example:9100"));
        let c = resolve(ServerArgs::default(), "cluster_address = \"127.0.0.1:0\"").unwrap().cluster.unwrap();
        assert_eq!((c.advertise.as_str(), c.zone.as_str(), c.ca), ("127.0.0.1:0", "default", None));
        assert_eq!(c.move_bytes_per_s, 1 << 30);
        let args = ServerArgs { move_rate: Some("0".into()), ..Default::default() };
        let c = resolve(args, "cluster_address = \"127.0.0.1:0\"\nmove_rate = \"16MiB\"").unwrap().cluster.unwrap();
        assert_eq!(c.move_bytes_per_s, 0, "the flag over the file");
        let c = resolve(ServerArgs::default(), "cluster_address = \"127.0.0.1:0\"\nmove_rate = \"16MiB\"").unwrap();
        assert_eq!(c.cluster.unwrap().move_bytes_per_s, 16 << 20);
        let tls = "cluster_address = \"127.0.0.1:0\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n";
        let c = resolve(ServerArgs::default(), &format!("{tls}cluster_ca = \"/ca.pem\"")).unwrap().cluster.unwrap();
        assert_eq!(c.ca, Some(PathBuf::from("/ca.pem")));
        for (bad, says) in [
            ("join = \"a:1\"", "join"),
            ("cluster_address = \"0.0.0.0:9100\"", "wildcard"),
            ("cluster_address = \"nowhere\"", "cluster_address"),
            ("cluster_address = \"127.0.0.1:1\"\ncluster_advertise = \"host:0\"", "cluster_advertise"),
            ("cluster_address = \"127.0.0.1:1\"\ncluster_advertise = \"a b:1\"", "cluster_advertise"),
            ("cluster_address = \"127.0.0.1:1\"\njoin = \"peer\"", "join"),
            ("cluster_address = \"127.0.0.1:1\"\nzone = \"\"", "zone"),
            ("cluster_address = \"127.0.0.1:1\"\nzone = \"a/b\"", "zone"),
            ("cluster_address = \"127.0.0.1:1\"\nmove_rate = \"fast\"", "move_rate"),
            ("cluster_ca = \"/ca.pem\"", "cluster_address"),
            ("cluster_address = \"127.0.0.1:1\"\ncluster_ca = \"/ca.pem\"", "tls_cert"),
        ] {
            let e = resolve(ServerArgs::default(), bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_takes_both_files_flags_over_the_file() {
        let file = "tls_cert = \"/etc/c.pem\"\ntls_key = \"/etc/k.pem\"";
        let c = resolve(ServerArgs::default(), file).unwrap();
        assert_eq!(c.tls, Some(TlsFiles { cert: "/etc/c.pem".into(), key: "/etc/k.pem".into() }));
        let args = ServerArgs { tls_cert: Some("/new/c.pem".into()), ..Default::default() };
        let c = resolve(args, file).unwrap();
        assert_eq!(c.tls.unwrap().cert, PathBuf::from("/new/c.pem"));
        let half = ServerArgs { tls_key: Some("/k.pem".into()), ..Default::default() };
        assert!(resolve(half, "").unwrap_err().contains("tls_cert"));
    }

    #[test]
    fn lifecycle_day() {
        let c = resolve(ServerArgs::default(), "lifecycle_day = \"2s\"").unwrap();
        assert_eq!(c.lifecycle_day, Duration::from_secs(2));
        for bad in ["lifecycle_day = \"0s\"", "lifecycle_day = \"400d\"", "lifecycle_day = \"daily\""] {
            let e = resolve(ServerArgs::default(), bad).unwrap_err();
            assert!(e.starts_with("lifecycle_day"), "{e}");
        }
    }

    #[test]
    fn heal_and_scan() {
        let c = resolve(ServerArgs::default(), "heal_rate = \"64MiB\"\nscan_interval = \"10m\"").unwrap();
        assert_eq!((c.heal_bytes_per_s, c.scan_interval), (64 << 20, Duration::from_secs(600)));
        for bad in [
            "heal_rate = \"fast\"",
            "scan_interval = \"0s\"",
            "scan_interval = \"never\"",
            "lazy_encode_min_size = \"2GiB\"",
        ] {
            let e = resolve(ServerArgs::default(), bad).unwrap_err();
            assert!(e.starts_with(bad.split(' ').next().unwrap()), "{e}");
        }
    }

    #[test]
    fn scrub_interval() {
        assert_eq!(resolve(ServerArgs::default(), "").unwrap().scrub_interval, Duration::from_secs(86_400));
        let c = resolve(ServerArgs::default(), "scrub_interval = \"7d\"").unwrap();
        assert_eq!(c.scrub_interval, Duration::from_secs(7 * 86_400));
        let args = ServerArgs { scrub_interval: Some("1s".into()), ..Default::default() };
        assert_eq!(resolve(args, "scrub_interval = \"7d\"").unwrap().scrub_interval, Duration::from_secs(1));
        for bad in ["soon", "0s", "500ms", "400d"] {
            let e = resolve(ServerArgs::default(), &format!("scrub_interval = \"{bad}\"")).unwrap_err();
            assert!(e.starts_with("scrub_interval: "), "{e}");
        }
    }

    #[test]
    fn scrub_rate() {
        assert_eq!(resolve(ServerArgs::default(), "scrub_rate = \"0\"").unwrap().scrub_bytes_per_s, 0);
        let args = ServerArgs { scrub_rate: Some("64MiB".into()), ..Default::default() };
        assert_eq!(resolve(args, "scrub_rate = \"1MiB\"").unwrap().scrub_bytes_per_s, 64 << 20);
        assert!(resolve(ServerArgs::default(), "scrub_rate = \"fast\"").unwrap_err().contains("scrub_rate"));
        assert!(resolve(ServerArgs::default(), "scrub_rate = \"17GiB\"").unwrap_err().contains("maximum"));
    }

    #[test]
    fn background_io_idle() {
        assert!(resolve(ServerArgs::default(), "").unwrap().background_io_idle, "on by default");
        assert!(!resolve(ServerArgs::default(), "background_io_idle = false").unwrap().background_io_idle);
        let flag = ServerArgs { background_io_idle: Some(true), ..ServerArgs::default() };
        assert!(resolve(flag, "background_io_idle = false").unwrap().background_io_idle, "the flag wins");
        assert!(resolve(ServerArgs::default(), "background_io_idle = \"no\"").is_err());
        assert!(resolve(ServerArgs::default(), "").unwrap().background_cpu_class, "on by default");
        assert!(!resolve(ServerArgs::default(), "background_cpu_class = false").unwrap().background_cpu_class);
        let flag = ServerArgs { background_cpu_class: Some(true), ..ServerArgs::default() };
        assert!(resolve(flag, "background_cpu_class = false").unwrap().background_cpu_class, "the flag wins");
        let gather = |file: &str| resolve(ServerArgs::default(), file).map(|c| c.commit_gather);
        assert_eq!(gather("commit_gather = \"0s\""), Ok(Duration::ZERO), "off");
        assert_eq!(gather("commit_gather = \"10ms\""), Ok(Duration::from_millis(10)), "at the limit");
        assert!(gather("commit_gather = \"11ms\"").unwrap_err().contains("maximum 10ms"), "past it");
        assert!(gather("commit_gather = \"soon\"").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn io_engine() {
        assert_eq!(resolve(ServerArgs::default(), "").unwrap().io_engine, mosaic_engine::IoEngine::Auto);
        let c = resolve(ServerArgs::default(), "io_engine = \"pread\"").unwrap();
        assert_eq!(c.io_engine, mosaic_engine::IoEngine::Pread);
        let args = ServerArgs { io_engine: Some("io-uring".into()), ..Default::default() };
        assert_eq!(resolve(args, "io_engine = \"pread\"").unwrap().io_engine, mosaic_engine::IoEngine::IoUring);
        let e = resolve(ServerArgs::default(), "io_engine = \"aio\"").unwrap_err();
        assert!(e.contains("io_engine") && e.contains("auto, io-uring, pread"), "{e}");
    }

    #[test]
    fn read_cache() {
        assert!(!resolve(ServerArgs::default(), "read_cache = \"off\"").unwrap().page_cache_reads);
        let args = ServerArgs { read_cache: Some("page-cache".into()), ..Default::default() };
        assert!(resolve(args, "read_cache = \"off\"").unwrap().page_cache_reads);
        let e = resolve(ServerArgs::default(), "read_cache = \"mmap\"").unwrap_err();
        assert!(e.contains("read_cache") && e.contains("page-cache, off"), "{e}");
        assert!(resolve(ServerArgs::default(), "read_cache = 1").is_err());
    }

    #[test]
    fn every_file_key_parses() {
        let c = resolve(
            ServerArgs::default(),
            r#"
            data_dir = "/tmp/x"
            s3_address = "127.0.0.1:19000"
            admin_address = "127.0.0.1:19001"
            domain = "s3.local"
            drive_size = "1GiB"
            log_format = "json"
            log_level = "debug"
            shutdown_timeout_secs = 5
            max_connections = 10
            worker_threads = 1024
            kv_cache_size = "64MiB"
            meta_cache_size = "1MiB"
            page_cache_size = "2MiB"
            verified_cache_size = "3MiB"
            inline_max_size = "8KiB"
            "#,
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.s3_address.port(), 19000);
        assert_eq!(c.admin_address.port(), 19001);
        assert_eq!(c.domain.as_deref(), Some("s3.local"));
        assert_eq!(c.drive_size_bytes, Some(1 << 30));
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(c.max_connections, 10);
        assert_eq!(c.worker_threads, 1024, "the most threads are allowed");
        assert_eq!(c.kv_cache_bytes, 64 << 20);
        assert_eq!(c.meta_cache_bytes, 1 << 20);
        assert_eq!(c.page_cache_bytes, 2 << 20);
        assert_eq!(c.verified_cache_bytes, 3 << 20);
        assert_eq!(c.inline_max_bytes, 8 << 10);
    }

    #[test]
    fn flags_beat_file() {
        let args = ServerArgs {
            s3_address: Some("127.0.0.1:1".into()),
            log_format: Some("text".into()),
            ..Default::default()
        };
        let c = resolve(args, "s3_address = \"127.0.0.1:2\"\nlog_format = \"json\"").unwrap();
        assert_eq!(c.s3_address.port(), 1);
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = resolve(ServerArgs::default(), "s3_adress = \"x\"").unwrap_err();
        assert!(e.contains("s3_adress"), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = [
            "s3_address = \"nowhere\"",
            "admin_address = \"1.2.3.4\"",
            "drive_size = \"lots\"",
            "drive_size = \"1MiB\"",
            "log_format = \"xml\"",
            "log_level = \"[[\"",
            "shutdown_timeout_secs = 99999",
            "shutdown_timeout_secs = -1",
            "console_session_max_secs = 0",
            "console_session_max_secs = 43201",
            "max_connections = 0",
            "max_connections = 1000000",
            "worker_threads = 0",
            "worker_threads = 1025",
            "kv_cache_size = \"1XB\"",
            "meta_cache_size = \"65GiB\"",
            "page_cache_size = \"65GiB\"",
            "verified_cache_size = \"65GiB\"",
            "inline_max_size = \"2MiB\"",
            "data_dir = 5",
            "domain = 7",
            "domain = \"not a domain\"",
            "tls_cert = \"/c.pem\"",
            "tls_key = \"/k.pem\"",
        ];
        for b in bad {
            assert!(resolve(ServerArgs::default(), b).is_err(), "accepted: {b}");
        }
    }
}
