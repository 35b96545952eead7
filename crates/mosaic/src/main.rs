//! `mosaic`: the one binary. `mosaic server` runs a store, `mosaic admin` operates one, `mosaic bench`
//! measures one. This crate wires the others together and owns configuration, the data directory layout,
//! logging, signals and the admin port; storage and protocol logic live in the library crates.

mod admin_auth;
mod admin_client;
mod admin_keys;
mod admin_microstores;
mod admin_server;
mod admin_sse;
mod bench_cli;
mod bucket_moves;
mod cluster;
mod config;
mod console;
mod datadir;
mod drives;
mod keys_file;
mod logging;
mod microstore_config;
mod microstores_file;
mod server;
mod sse_keys_file;

/// mimalloc instead of glibc's malloc: the data path allocates and frees megabyte buffers on many threads
/// (staging, shards, reads), and glibc kept them in per-thread arenas and a grown heap (RSS 1.5 GiB under
/// 64 MiB PUTs on a 4+2 set, with about 100 MiB live); mimalloc gives them back.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// `mosaic --version`: the crate's version and the commit it was built from (build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("MOSAIC_BUILD_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "mosaic", version = VERSION, about = "Mosaic: an S3-compatible object store built on object drives")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: S3 on --s3-address, admin/health/metrics on --admin-address.
    ///
    /// With no arguments: data in ./mosaic-data (created and formatted on first start), S3 on
    /// 127.0.0.1:9000, admin on 127.0.0.1:9001. Root credentials are generated on first start, printed
    /// once and stored in the data directory, unless MOSAIC_ACCESS_KEY and MOSAIC_SECRET_KEY are set.
    /// Precedence: flags > MOSAIC_* environment > --config file > defaults.
    Server(Box<config::ServerArgs>),
    /// Operate a running server through its admin port (authenticated with the root credentials).
    Admin(AdminArgs),
    /// Measure: the papers' workloads on the engine.
    Bench(bench_cli::BenchArgs),
    /// Server-side encryption keys kept in a data directory (offline; a server reads them at start).
    Sse(SseArgs),
}

#[derive(clap::Args)]
struct SseArgs {
    /// Data directory whose keys to change.
    #[arg(long, default_value = "./mosaic-data", value_name = "DIR", global = true)]
    data: PathBuf,
    #[command(subcommand)]
    command: SseCommand,
}

#[derive(Subcommand)]
enum SseCommand {
    /// Add a new master key: objects written from the next server start on are sealed with it; the older
    /// keys stay to open the objects they sealed. A cluster node's keys are the cluster's: rotate them
    /// with `mosaic admin sse rotate` on a running node instead.
    Rotate,
}

#[derive(Subcommand)]
enum AdminSseCommand {
    /// Add a new SSE master key that seals new objects from now on (the older keys stay to open what they
    /// sealed). In a cluster every node takes it, and it seals once every node that is up has it.
    Rotate,
}

#[derive(clap::Args)]
struct AdminArgs {
    /// Admin address of the server.
    #[arg(long, env = "MOSAIC_ADMIN", default_value = "127.0.0.1:9001", value_name = "HOST:PORT", global = true)]
    admin: String,
    /// Trust this PEM certificate (a CA's or the server's own) and talk HTTPS to the admin port.
    #[arg(long, env = "MOSAIC_CA_CERT", value_name = "FILE", global = true)]
    ca_cert: Option<PathBuf>,
    /// Data directory to read the root credentials from when MOSAIC_ACCESS_KEY/MOSAIC_SECRET_KEY are unset.
    #[arg(long, default_value = "./mosaic-data", value_name = "DIR", global = true)]
    data: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Version, uptime, readiness and drive usage.
    Info,
    /// Check space accounting: no leaked or doubly used blocks. Exits 1 if a problem is found.
    Check,
    /// Re-read every block and verify its checksum; lists damaged objects. Exits 1 if any is damaged.
    Scrub,
    /// The drives: each one's set, slot, path, state (online, healing, faulty, offline), space and
    /// errors, and each set's heal progress.
    Drives,
    /// Operate on one drive.
    #[command(subcommand)]
    Drive(DriveCommand),
    /// Compare every set's drives now and rebuild what a drive lacks or holds damaged (heal otherwise runs
    /// in the background at `heal_rate`). Exits 1 if objects could not be healed.
    Heal,
    /// Access keys beside the root key, each allowed read and/or write per bucket.
    #[command(subcommand)]
    Key(KeyCommand),
    /// The cluster this node is in (a server started with --cluster-address).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Microstores: slices of the server's request workers, each serving buckets of one workload class;
    /// buckets are classified by their object sizes and GET/PUT mix, and workers move toward a microstore
    /// missing its target.
    #[command(subcommand)]
    Microstore(MicrostoreCommand),
    /// Server-side encryption's master keys (the running server's, and in a cluster every node's).
    #[command(subcommand)]
    Sse(AdminSseCommand),
}

#[derive(Subcommand)]
enum MicrostoreCommand {
    /// The microstores (target, class, workers held and in use, waiting and refused requests), every
    /// watched bucket (its window, class and microstore) and the resource manager's last decisions.
    Status,
    /// The microstores (the same as status).
    List,
    /// Create microstore NAME, holding --workers taken from the free ones and then from the default one.
    Create {
        name: String,
        /// Its target: the 99th percentile latency in ms (small objects)...
        #[arg(long, conflicts_with = "target_mib_s", required_unless_present = "target_mib_s")]
        target_p99_ms: Option<f64>,
        /// ...or the throughput in MiB/s while busy (large objects).
        #[arg(long)]
        target_mib_s: Option<f64>,
        /// Buckets of this class not assigned by hand are served here: small-read, small-write, large-read,
        /// large-write, small-mixed or large-mixed.
        #[arg(long)]
        class: Option<String>,
        #[arg(long, default_value_t = 16)]
        workers: u32,
        /// The erasure sets its buckets' data lives on, its own, such as 1,2 (`admin drives` numbers
        /// them); a bucket that comes to it moves there in the background. None: every set, shared.
        #[arg(long, value_delimiter = ',')]
        sets: Vec<usize>,
    },
    /// Delete microstore NAME: its buckets are routed automatically again, its workers go to the default.
    Delete { name: String },
    /// Serve BUCKET by microstore MS, or by its class again with `auto`.
    Assign { bucket: String, microstore: String },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Make a new cluster with this node as its first member. Prints the cluster secret: other nodes join
    /// with `mosaic server --cluster-address ... --join THIS_NODE` and MOSAIC_CLUSTER_SECRET set to it.
    Init {
        /// The erasure code of every placement group's set, DATA+PARITY; its drives are on distinct nodes
        /// (or zones), so the cluster serves once it has DATA+PARITY of them.
        #[arg(long, default_value = "2+1", value_name = "K+M")]
        erasure: String,
        /// Placement groups: objects hash to one, each group is one erasure set.
        #[arg(long, default_value_t = cluster::DEFAULT_PLACEMENT_GROUPS)]
        groups: u32,
        /// What a set's drives must not share: node or zone.
        #[arg(long, default_value = "node")]
        failure_domain: String,
    },
    /// This node's view of the cluster: its role, the map's epoch, the nodes, their drives and placement
    /// groups, and the rebalancer's progress.
    Status,
    /// Add the node waiting at cluster address ADDRESS (started with --cluster-address and the cluster's
    /// MOSAIC_CLUSTER_SECRET, without --join): it joins through this node and takes its share of the
    /// placement groups. (Starting a node with --join PEER does the same from its side.)
    AddNode {
        /// The new node's cluster address, HOST:PORT, as other nodes reach it.
        address: String,
    },
    /// Move every placement group off node NODE (its drives stop receiving shards); `remove-node` takes it
    /// out once `status` shows it holds no groups.
    Drain {
        /// The node's id, as `status` shows it.
        node: u64,
    },
    /// Take node NODE out of the cluster: only once it is drained, or with --dead when it is gone for
    /// good (its groups are rebuilt on the other nodes from the shards left).
    RemoveNode {
        node: u64,
        #[arg(long)]
        dead: bool,
    },
    /// Set drive DRIVE's weight (its share of placement groups, by default its capacity in GiB): the
    /// groups whose set changes move in the background.
    SetWeight { drive: u32, weight: u32 },
    /// Pause or resume the moves of placement groups (rebalance after a change of nodes, drives or
    /// weights). A paused group keeps serving from where it is.
    Rebalance {
        #[arg(value_parser = ["pause", "resume"])]
        action: String,
    },
}

#[derive(Subcommand)]
enum DriveCommand {
    /// Replace drive SLOT (of set --set, default 0) with a new, empty directory: it is formatted into the
    /// slot and heal rebuilds everything it should hold (progress in `mosaic admin drives`).
    Replace {
        slot: usize,
        /// The new drive's directory (new or empty).
        new_path: PathBuf,
        #[arg(long, default_value_t = 0)]
        set: usize,
    },
    /// Testing only (a server started with --fault-injection): make drive SLOT's device fail (`fail`),
    /// refuse writes (`read-only`) or work again (`none`).
    #[command(hide = true)]
    Fault {
        slot: usize,
        fault: String,
        #[arg(long, default_value_t = 0)]
        set: usize,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create an access key with no access yet (with --owner: one that may create buckets and owns
    /// them); prints its secret once.
    Create {
        /// The key may create buckets and do everything in the buckets it creates.
        #[arg(long)]
        owner: bool,
    },
    /// List access keys and their grants (never secrets).
    List,
    /// Delete an access key: requests signed with it are refused from now on.
    Delete { access_key: String },
    /// Allow a key to read and/or write a bucket (both when neither --read nor --write is given).
    Allow(GrantArgs),
    /// Take back read and/or write access to a bucket (both when neither --read nor --write is given).
    Deny(GrantArgs),
}

#[derive(clap::Args)]
struct GrantArgs {
    access_key: String,
    bucket: String,
    #[arg(long)]
    read: bool,
    #[arg(long)]
    write: bool,
}

impl GrantArgs {
    fn path(&self, verb: &str) -> String {
        let what = match (self.read, self.write) {
            (true, false) => "read",
            (false, true) => "write",
            _ => "read-write",
        };
        format!("/admin/v1/keys/{}/{verb}/{}/{what}", path_segment(&self.access_key), path_segment(&self.bucket))
    }
}

/// Keys and bucket names are path segments of the admin API: anything else is refused here, clearly.
fn path_segment(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')).collect()
}

/// The Rust runtime ignores SIGPIPE, so printing into a closed pipe (`mosaic admin info | head -1`) is an
/// error that `println!` turns into a panic. A command-line tool should end quietly instead, as `cat` does:
/// the default action ends the process when its reader has gone. Sockets are unaffected (std sends with
/// MSG_NOSIGNAL). The server keeps ignoring the signal and writes its one message without panicking.
fn end_quietly_on_closed_stdout() {
    // SAFETY: restores the default disposition of one signal, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // Before parsing: `mosaic --help | head -1` prints too.
    if std::env::args_os().nth(1).is_none_or(|a| a != "server") {
        end_quietly_on_closed_stdout();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => run_server(*args),
        Command::Admin(a) => run_admin(a),
        Command::Bench(b) => bench_cli::run(b),
        Command::Sse(s) => match s.command {
            SseCommand::Rotate => sse_keys_file::rotate(&s.data).map(|id| {
                println!("master key {id} seals from the next start");
                ExitCode::SUCCESS
            }),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mosaic: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_server(args: config::ServerArgs) -> Result<ExitCode, String> {
    let file = match &args.config {
        Some(p) => config::load_file(p)?,
        None => config::FileConfig::default(),
    };
    let cfg = config::Config::resolve(&args, &file)?;
    server::run(cfg)?;
    Ok(ExitCode::SUCCESS)
}

fn run_admin(a: AdminArgs) -> Result<ExitCode, String> {
    let creds = admin_client::credentials(&a.data)?;
    let client = admin_client::Client::new(&a.admin, creds, a.ca_cert.as_deref())?;
    let (method, path) = match &a.command {
        AdminCommand::Info => ("GET", "/admin/v1/info".to_string()),
        AdminCommand::Check => ("POST", "/admin/v1/check".to_string()),
        AdminCommand::Scrub => ("POST", "/admin/v1/scrub".to_string()),
        AdminCommand::Drives => ("GET", "/admin/v1/drives".to_string()),
        AdminCommand::Drive(DriveCommand::Replace { slot, new_path, set }) => {
            let abs = std::path::absolute(new_path).map_err(|e| format!("{}: {e}", new_path.display()))?;
            let hexed = hex::encode(abs.display().to_string());
            ("POST", format!("/admin/v1/drives/{set}/{slot}/replace/{hexed}"))
        }
        AdminCommand::Drive(DriveCommand::Fault { slot, fault, set }) => {
            ("POST", format!("/admin/v1/drives/{set}/{slot}/fault/{}", path_segment(fault)))
        }
        AdminCommand::Heal => ("POST", "/admin/v1/heal".to_string()),
        AdminCommand::Sse(AdminSseCommand::Rotate) => ("POST", "/admin/v1/sse/rotate".to_string()),
        AdminCommand::Cluster(ClusterCommand::Status) => ("GET", "/admin/v1/cluster".to_string()),
        AdminCommand::Cluster(ClusterCommand::Init { erasure, groups, failure_domain }) => {
            let g = mosaic_erasure::SetGeometry::parse(erasure).map_err(|e| format!("--erasure: {e}"))?;
            (
                "POST",
                format!("/admin/v1/cluster/init/{}/{}/{groups}/{}", g.data, g.parity, path_segment(failure_domain)),
            )
        }
        AdminCommand::Cluster(ClusterCommand::AddNode { address }) => {
            let host_port = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']');
            if address.is_empty() || !address.chars().all(host_port) {
                return Err(format!("add-node: {address:?} is not a cluster address HOST:PORT"));
            }
            ("POST", format!("/admin/v1/cluster/add-node/{address}"))
        }
        AdminCommand::Cluster(ClusterCommand::Drain { node }) => ("POST", format!("/admin/v1/cluster/drain/{node}")),
        AdminCommand::Cluster(ClusterCommand::RemoveNode { node, dead }) => {
            ("POST", format!("/admin/v1/cluster/remove/{node}{}", if *dead { "/dead" } else { "" }))
        }
        AdminCommand::Cluster(ClusterCommand::SetWeight { drive, weight }) => {
            ("POST", format!("/admin/v1/cluster/weight/{drive}/{weight}"))
        }
        AdminCommand::Cluster(ClusterCommand::Rebalance { action }) => {
            ("POST", format!("/admin/v1/cluster/rebalance/{}", path_segment(action)))
        }
        AdminCommand::Microstore(m) => microstore_call(m)?,
        AdminCommand::Key(k) => match k {
            KeyCommand::Create { owner: false } => ("POST", "/admin/v1/keys".to_string()),
            KeyCommand::Create { owner: true } => ("POST", "/admin/v1/keys/owner".to_string()),
            KeyCommand::List => ("GET", "/admin/v1/keys".to_string()),
            KeyCommand::Delete { access_key } => ("DELETE", format!("/admin/v1/keys/{}", path_segment(access_key))),
            KeyCommand::Allow(g) => ("POST", g.path("allow")),
            KeyCommand::Deny(g) => ("POST", g.path("deny")),
        },
    };
    if let AdminCommand::Key(
        KeyCommand::Delete { access_key }
        | KeyCommand::Allow(GrantArgs { access_key, .. })
        | KeyCommand::Deny(GrantArgs { access_key, .. }),
    ) = &a.command
        && path_segment(access_key) != *access_key
    {
        return Err(format!("invalid access key {access_key:?}: letters, digits, '.', '-' and '_' only"));
    }
    if let AdminCommand::Key(KeyCommand::Allow(g) | KeyCommand::Deny(g)) = &a.command {
        mosaic_layer::validate_bucket_name(&g.bucket).map_err(|e| e.to_string())?;
    }
    let v = client.call(method, &path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print_human(&v, "");
    }
    let failed = match a.command {
        AdminCommand::Check => v.get("clean").and_then(|c| c.as_bool()) == Some(false),
        AdminCommand::Scrub => v.get("damaged").and_then(|d| d.as_array()).is_some_and(|d| !d.is_empty()),
        AdminCommand::Heal => {
            let sets_failed = v["sets"].as_array().is_some_and(|s| {
                s.iter().any(|s| s["failed_objects"].as_u64() != Some(0) || s["scan_error"].is_string())
            });
            // A cluster node's answer: what is left queued, and the scans that failed.
            let cluster_failed = v["objects_left"].as_u64().is_some_and(|n| n > 0)
                || v["scan_errors"].as_array().is_some_and(|e| !e.is_empty())
                || v["error"].is_string();
            sets_failed || cluster_failed
        }
        AdminCommand::Info
        | AdminCommand::Key(_)
        | AdminCommand::Drives
        | AdminCommand::Drive(_)
        | AdminCommand::Microstore(_)
        | AdminCommand::Sse(_)
        | AdminCommand::Cluster(_) => false,
    };
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The admin call of a microstore command (its names checked here, so a bad one never reaches a path).
fn microstore_call(m: &MicrostoreCommand) -> Result<(&'static str, String), String> {
    use mosaic_microstore::registry::validate_name;
    Ok(match m {
        MicrostoreCommand::Status | MicrostoreCommand::List => ("GET", "/admin/v1/microstores".to_string()),
        MicrostoreCommand::Create { name, target_p99_ms, target_mib_s, class, workers, sets } => {
            validate_name(name)?;
            let (kind, value) = match (target_p99_ms, target_mib_s) {
                (Some(ms), _) => ("p99-ms", *ms),
                (None, Some(mib)) => ("mib-s", *mib),
                (None, None) => return Err("give --target-p99-ms or --target-mib-s".into()),
            };
            if !(value.is_finite() && value > 0.0) {
                return Err(format!("a target is a positive number, not {value}"));
            }
            let class = match class {
                Some(c) => mosaic_microstore::Class::parse(c)
                    .map(|c| c.name())
                    .ok_or_else(|| format!("--class: {c:?} is not a class"))?,
                None => "any",
            };
            let path = format!("/admin/v1/microstores/create/{name}/{kind}/{value}/{class}/{workers}");
            if sets.is_empty() {
                ("POST", path)
            } else {
                mosaic_microstore::registry::validate_sets(sets, true).map_err(|e| format!("--sets: {e}"))?;
                let list: Vec<String> = sets.iter().map(usize::to_string).collect();
                ("POST", format!("{path}/{}", list.join(",")))
            }
        }
        MicrostoreCommand::Delete { name } => {
            validate_name(name)?;
            ("POST", format!("/admin/v1/microstores/delete/{name}"))
        }
        MicrostoreCommand::Assign { bucket, microstore } => {
            mosaic_layer::validate_bucket_name(bucket).map_err(|e| e.to_string())?;
            if microstore != "auto" {
                validate_name(microstore)?;
            }
            ("POST", format!("/admin/v1/microstores/assign/{bucket}/{microstore}"))
        }
    })
}

fn print_human(v: &serde_json::Value, indent: &str) {
    match v {
        serde_json::Value::Object(m) => {
            let w = m.keys().map(|k| k.len()).max().unwrap_or(0);
            for (k, val) in m {
                match val {
                    serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                        println!("{indent}{k}:");
                        print_human(val, &format!("{indent}  "));
                    }
                    other => println!("{indent}{k:<w$}  {}", other.to_string().trim_matches('"')),
                }
            }
        }
        serde_json::Value::Array(items) if items.is_empty() => println!("{indent}(none)"),
        serde_json::Value::Array(items) => {
            for i in items {
                print_human(i, &format!("{indent}- "));
            }
        }
        other => println!("{indent}{other}"),
    }
}
