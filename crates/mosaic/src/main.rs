//! `mosaic`: the one binary. `mosaic server` runs a store, `mosaic admin` operates one, `mosaic bench`
//! measures one. This crate wires the others together and owns configuration, the data directory layout,
//! logging, signals and the admin port; storage and protocol logic live in the library crates.

mod admin_auth;
mod admin_client;
mod admin_server;
mod config;
mod datadir;
mod logging;
mod server;
mod size;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "mosaic", version, about = "Mosaic: an S3-compatible object store built on object drives")]
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
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct AdminArgs {
    /// Admin address of the server.
    #[arg(long, env = "MOSAIC_ADMIN", default_value = "127.0.0.1:9001", value_name = "HOST:PORT", global = true)]
    admin: String,
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
}

#[derive(clap::Args)]
struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Paper 001's write workloads directly on one engine drive, without HTTP.
    Engine(EngineBenchArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum WorkloadArg {
    /// 2 KiB at offset 0 of each block, appending.
    WithinBlock,
    /// 4 KiB at offset 2048 of each block (every write spans two blocks).
    CrossBlock,
    /// --io-size writes at aligned offsets.
    Aligned,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    /// Unaligned pieces go to the fragment log in the KV store (no read on the write path).
    FragmentLog,
    /// The classic read-modify-write path (ablation baseline).
    Rmw,
}

#[derive(clap::Args)]
struct EngineBenchArgs {
    /// The workload.
    #[arg(long, value_enum)]
    workload: WorkloadArg,
    /// Data device: a file (created and preallocated if missing) or a block device. Default: the simulated
    /// in-memory device.
    #[arg(long, value_name = "PATH")]
    device: Option<PathBuf>,
    /// Size of the device when it is created (file or simulated).
    #[arg(long, default_value = "2GiB", value_parser = size_arg, value_name = "SIZE")]
    device_size: u64,
    /// Write size of the aligned workload (4KiB..512KiB and up).
    #[arg(long, default_value = "4KiB", value_parser = size_arg, value_name = "SIZE")]
    io_size: u64,
    /// Size of each object written.
    #[arg(long, default_value = "4MiB", value_parser = size_arg, value_name = "SIZE")]
    object_size: u64,
    /// User bytes to write in total.
    #[arg(long, default_value = "256MiB", value_parser = size_arg, value_name = "SIZE")]
    total: u64,
    /// Writers submitting at once (each write is one durable transaction).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    queue_depth: u16,
    /// How unaligned writes are handled.
    #[arg(long, value_enum, default_value = "fragment-log")]
    mode: ModeArg,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn size_arg(s: &str) -> Result<u64, String> {
    size::parse_size(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => run_server(*args),
        Command::Admin(a) => run_admin(a),
        Command::Bench(b) => run_bench(b),
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
    let client = admin_client::Client::new(&a.admin, creds)?;
    let (method, path) = match a.command {
        AdminCommand::Info => ("GET", "/admin/v1/info"),
        AdminCommand::Check => ("POST", "/admin/v1/check"),
        AdminCommand::Scrub => ("POST", "/admin/v1/scrub"),
    };
    let v = client.call(method, path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print_human(&v, "");
    }
    let failed = match a.command {
        AdminCommand::Check => v.get("clean").and_then(|c| c.as_bool()) == Some(false),
        AdminCommand::Scrub => v.get("damaged").and_then(|d| d.as_array()).is_some_and(|d| !d.is_empty()),
        AdminCommand::Info => false,
    };
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
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

fn run_bench(b: BenchArgs) -> Result<ExitCode, String> {
    match b.command {
        BenchCommand::Engine(a) => {
            let opts = mosaic_bench::EngineBenchOptions {
                workload: match a.workload {
                    WorkloadArg::WithinBlock => mosaic_bench::Workload::WithinBlock,
                    WorkloadArg::CrossBlock => mosaic_bench::Workload::CrossBlock,
                    WorkloadArg::Aligned => mosaic_bench::Workload::Aligned,
                },
                target: match a.device {
                    Some(p) => mosaic_bench::Target::Path(p),
                    None => mosaic_bench::Target::Sim,
                },
                device_bytes: a.device_size / 4096 * 4096,
                io_size_bytes: a.io_size,
                object_size_bytes: a.object_size,
                total_bytes: a.total,
                queue_depth: a.queue_depth as usize,
                mode: match a.mode {
                    ModeArg::FragmentLog => mosaic_engine::WriteMode::FragmentLog,
                    ModeArg::Rmw => mosaic_engine::WriteMode::Rmw,
                },
            };
            let json = a.json;
            let progress = move |done: u64, total: u64| {
                if !json {
                    let pct = done * 100 / total.max(1);
                    let bar = "#".repeat((pct / 4) as usize);
                    eprint!("\r[{bar:<25}] {pct:>3}% {done}/{total} writes");
                    if done == total {
                        eprintln!();
                    }
                }
            };
            let r = mosaic_bench::run_engine_bench(&opts, &progress)?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            } else {
                let rows = vec![
                    ("workload", format!("{:?} ({})", r.workload, r.mode)),
                    ("target", r.target.clone()),
                    ("writes", format!("{} x {} B, queue depth {}", r.ops, r.io_size_bytes, r.queue_depth)),
                    ("throughput", format!("{:.1} MiB/s, {:.0} writes/s", r.throughput_mib_s, r.ops_per_s)),
                    (
                        "latency p50/p99/p999",
                        format!(
                            "{} / {} / {} us",
                            r.latency.latency_us_p50, r.latency.latency_us_p99, r.latency.latency_us_p999
                        ),
                    ),
                    ("user bytes", size::format_size(r.user_bytes)),
                    ("device bytes written", size::format_size(r.device_bytes_written)),
                    ("kv bytes written", size::format_size(r.kv_bytes_written)),
                    ("(device+kv)/user", format!("{:.2}", r.write_amplification)),
                    (
                        "with lazy sync caught up",
                        format!(
                            "{:.2} ({:.1} s more, {} fragments left)",
                            r.write_amplification_with_lazy_sync,
                            r.lazy_sync_seconds,
                            r.fragments_outstanding_after_lazy_sync
                        ),
                    ),
                    ("rmw on write path", r.rmw_on_write_path.to_string()),
                    ("rmw in lazy sync", r.rmw_in_lazy_sync.to_string()),
                    ("peak RSS", size::format_size(r.rss_bytes_max)),
                ];
                print!("{}", mosaic_bench::report::table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
