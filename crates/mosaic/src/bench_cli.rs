//! `mosaic bench`: the command line of the bench crate's workloads (engine, S3 and comparisons).

use clap::{Subcommand, ValueEnum};
use mosaic::size_format;
use mosaic_bench::s3::pace::RATE_OPS_PER_S_MAX;
use mosaic_bench::s3::{Mix, S3BenchOptions, S3Workload, SizeRange, Tenant};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Paper 001's write workloads directly on one engine drive, without HTTP.
    Engine(EngineBenchArgs),
    /// The papers' workloads against any S3 endpoint (Mosaic, MinIO, Ceph RGW, AWS).
    S3(Box<S3BenchArgs>),
    /// Results of `bench s3 --json`/`--out` side by side, as ratios to the first, with one plot.
    Compare(CompareArgs),
    /// The ceiling: a minimal server answering the bench's PUTs and GETs from memory with the headers
    /// Mosaic sends, to measure what HTTP plus the client allow on this machine (bench tooling only: it
    /// checks no signature and keeps nothing).
    Ceiling(CeilingArgs),
}

#[derive(clap::Args)]
pub struct CeilingArgs {
    /// Where to listen (loopback by default).
    #[arg(long, default_value = "127.0.0.1:19600", value_name = "HOST:PORT")]
    address: std::net::SocketAddr,
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

/// The client that makes a run's GETs or walks its listing.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClientKind {
    /// aws-sdk-s3, like every other operation of the bench.
    Sdk,
    /// Signed GETs over reqwest (aws-sigv4): bodies verified as with the SDK, listing XML scanned rather
    /// than deserialized.
    Lean,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    /// Unaligned pieces go to the fragment log in the KV store (no read on the write path).
    FragmentLog,
    /// The classic read-modify-write path (ablation baseline).
    Rmw,
}

#[derive(Clone, Copy, ValueEnum)]
enum IoEngineArg {
    Auto,
    IoUring,
    Pread,
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
    /// How a file device issues IO: auto (io_uring where the kernel allows it), io-uring or pread.
    #[arg(long, value_enum, default_value = "auto")]
    io_engine: IoEngineArg,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(b: BenchArgs) -> Result<ExitCode, String> {
    match b.command {
        BenchCommand::S3(a) => run_s3(*a),
        BenchCommand::Compare(a) => run_compare(a),
        BenchCommand::Ceiling(a) => run_ceiling(a),
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
                io_engine: match a.io_engine {
                    IoEngineArg::Auto => mosaic_engine::IoEngine::Auto,
                    IoEngineArg::IoUring => mosaic_engine::IoEngine::IoUring,
                    IoEngineArg::Pread => mosaic_engine::IoEngine::Pread,
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
                    ("target", format!("{} ({})", r.target, r.io_path)),
                    ("writes", format!("{} x {} B, queue depth {}", r.ops, r.io_size_bytes, r.queue_depth)),
                    ("throughput", format!("{:.1} MiB/s, {:.0} writes/s", r.throughput_mib_s, r.ops_per_s)),
                    (
                        "block map",
                        format!(
                            "{} entries, {:.0} bytes per MiB mapped",
                            r.block_map_entries, r.block_map_bytes_per_mib
                        ),
                    ),
                    (
                        "latency p50/p99/p999",
                        format!(
                            "{} / {} / {} us",
                            r.latency.latency_us_p50, r.latency.latency_us_p99, r.latency.latency_us_p999
                        ),
                    ),
                    ("user bytes", size_format::format_size(r.user_bytes)),
                    ("device bytes written", size_format::format_size(r.device_bytes_written)),
                    (
                        "device IOs (writes / reads)",
                        format!(
                            "{} / {}, {} per write, runs of {}",
                            r.device_write_ios,
                            r.device_read_ios,
                            size_format::format_size(r.mean_write_io_bytes as u64),
                            size_format::format_size(r.mean_write_run_bytes as u64)
                        ),
                    ),
                    ("kv bytes written", size_format::format_size(r.kv_bytes_written)),
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
                    (
                        "peak RSS",
                        format!(
                            "{} (caches and memtables may hold {})",
                            size_format::format_size(r.rss_bytes_max),
                            size_format::format_size(r.memory_budget_bytes)
                        ),
                    ),
                ];
                print!("{}", mosaic_bench::report::table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn size_arg(s: &str) -> Result<u64, String> {
    size_format::parse_size(s)
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e} (use e.g. 30s, 2m, 500ms)"))
}

/// "4KiB" (fixed) or "1KiB-128KiB" (uniform between the two).
fn size_range_arg(s: &str) -> Result<SizeRange, String> {
    match s.split_once('-') {
        Some((a, b)) => {
            let r = SizeRange { min: size_format::parse_size(a)?, max: size_format::parse_size(b)? };
            if r.min > r.max {
                return Err(format!("invalid size range {s:?}: the minimum is above the maximum"));
            }
            Ok(r)
        }
        None => Ok(SizeRange::fixed(size_format::parse_size(s)?)),
    }
}

fn workload_arg(s: &str) -> Result<S3Workload, String> {
    S3Workload::parse(s).ok_or_else(|| {
        let names: Vec<&str> = S3Workload::ALL.iter().map(|w| w.name()).collect();
        format!("unknown workload {s:?}; one of: {}", names.join(", "))
    })
}

/// "90/5/5": GET, PUT and DELETE percentages.
fn mix_arg(s: &str) -> Result<Mix, String> {
    let parts: Vec<&str> = s.split('/').collect();
    let nums: Result<Vec<u32>, _> = parts.iter().map(|p| p.trim().parse::<u32>()).collect();
    match nums.as_deref() {
        Ok([get, put, delete]) if get + put + delete == 100 => {
            Ok(Mix { get: *get, put: *put, delete: *delete, zipf: false })
        }
        _ => Err(format!("invalid mix {s:?}: expected GET/PUT/DELETE percentages adding up to 100, e.g. 90/5/5")),
    }
}

/// "cosbench-b" or "cosbench-d:1MiB-8MiB".
/// WORKLOAD[:SIZE][@OPS_PER_S], e.g. cosbench-b@150 or cosbench-d:1MiB-8MiB.
fn tenant_arg(s: &str) -> Result<Tenant, String> {
    let (rest, rate_ops_per_s) = match s.rsplit_once('@') {
        Some((rest, rate)) => {
            let r: u32 = rate.parse().map_err(|_| format!("invalid rate {rate:?}: operations per second"))?;
            if !(1..=RATE_OPS_PER_S_MAX).contains(&r) {
                return Err(format!("a tenant's rate must be 1 to {RATE_OPS_PER_S_MAX} op/s, not {r}"));
            }
            (rest, Some(r))
        }
        None => (s, None),
    };
    let (workload, size) = match rest.split_once(':') {
        Some((w, size)) => (workload_arg(w)?, Some(size_range_arg(size)?)),
        None => (workload_arg(rest)?, None),
    };
    Ok(Tenant { workload, size, rate_ops_per_s })
}

#[derive(clap::Args)]
pub struct S3BenchArgs {
    /// The S3 endpoint, e.g. http://127.0.0.1:9000; several separated by commas spread the requests over
    /// them in turn (every node of a cluster; listings with --list-client lean use the first).
    #[arg(long, value_name = "URL[,URL...]")]
    endpoint: String,
    #[arg(long, env = "MOSAIC_BENCH_ACCESS_KEY", value_name = "KEY")]
    access_key: String,
    #[arg(long, env = "MOSAIC_BENCH_SECRET_KEY", value_name = "SECRET", hide_env_values = true)]
    secret_key: String,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// cosbench-a..d, write-only, read-only, read-write, list, create, append, tenants, priority.
    #[arg(long, value_parser = workload_arg)]
    workload: S3Workload,
    /// Length of the measured phase (an upper bound when --ops is given).
    #[arg(long, value_parser = duration_arg, value_name = "DURATION")]
    duration: Option<Duration>,
    /// Measured operations in total (split evenly between workers).
    #[arg(long, value_name = "N")]
    ops: Option<u64>,
    /// Warm-up before measuring (excluded from the results).
    #[arg(long, default_value = "2s", value_parser = duration_arg, value_name = "DURATION")]
    warmup: Duration,
    /// Operations in flight at once.
    #[arg(long, default_value_t = 16, value_name = "N")]
    concurrency: usize,
    /// Objects prepared (or the key space written to); default depends on the workload.
    #[arg(long, value_name = "N")]
    objects: Option<u64>,
    /// Object size, fixed (4KiB) or uniform in a range (1KiB-128KiB); default depends on the workload.
    #[arg(long, value_parser = size_range_arg, value_name = "SIZE|MIN-MAX")]
    size: Option<SizeRange>,
    /// Seed of keys, sizes and contents: the same seed issues the same keys and sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bucket to use (created if missing; tenants use BUCKET-t1 and BUCKET-t2).
    #[arg(long, default_value = "mosaic-bench")]
    bucket: String,
    /// An operation taking longer counts as a timeout error.
    #[arg(long, default_value = "60s", value_parser = duration_arg, value_name = "DURATION")]
    timeout: Duration,
    /// list: spread the objects under this many prefixes.
    #[arg(long, default_value_t = 1, value_name = "N")]
    prefixes: u64,
    /// priority: the reader's deadline per read.
    #[arg(long, default_value = "50ms", value_parser = duration_arg, value_name = "DURATION")]
    deadline: Duration,
    /// priority: time between two reads.
    #[arg(long, default_value = "10ms", value_parser = duration_arg, value_name = "DURATION")]
    interval: Duration,
    /// tenants: the two workloads, each optionally with a size and an offered rate in operations per second
    /// (cosbench-b@150,cosbench-d:1MiB-8MiB). A tenant with a rate runs an open loop: its operations are
    /// due at that rate, its latencies count from when each was due; without one, a closed loop.
    #[arg(long, value_delimiter = ',', value_parser = tenant_arg, default_value = "cosbench-b,cosbench-d",
        value_name = "WORKLOAD[:SIZE][@OPS_PER_S],...")]
    tenants: Vec<Tenant>,
    /// GET/PUT/DELETE percentages replacing the workload's mix, e.g. 100/0/0 for reads only.
    #[arg(long, value_parser = mix_arg, value_name = "G/P/D")]
    mix: Option<Mix>,
    /// Leave the objects in place after the run.
    #[arg(long)]
    keep: bool,
    /// Turn versioning on in the bucket before the run (every PUT then makes a version).
    #[arg(long)]
    versioning: bool,
    /// list with --versioning: write each key this many times and list with ListObjectVersions.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=mosaic_bench::s3::MAX_LIST_VERSIONS as i64))]
    versions: u32,
    /// list: the client that walks the listing: the SDK (aws-sdk-s3), or lean (signed GETs whose XML is
    /// scanned for counts and markers, not deserialized: the client's share of a page is then small).
    #[arg(long, value_enum, default_value = "sdk")]
    list_client: ClientKind,
    /// The client that makes the GETs of every workload: the SDK (aws-sdk-s3), or lean (signed GETs over
    /// reqwest, each body verified byte by byte as with the SDK, at a fraction of the SDK's CPU per request:
    /// on a machine the client shares with the server, the SDK's cost bounds the ratio between servers).
    #[arg(long, value_enum, default_value = "sdk")]
    get_client: ClientKind,
    /// Give the bucket SSE-S3 default encryption before the run (every PUT is encrypted at rest).
    #[arg(long)]
    sse_s3: bool,
    /// The server's Prometheus endpoint (Mosaic's admin port, e.g. http://127.0.0.1:9001/metrics): report
    /// each drive's IO over the measured phase (IO count and size, run length, write amplification).
    #[arg(long, value_name = "URL")]
    drive_metrics: Option<String>,
    /// Trust this PEM certificate (a CA's or the server's own) for an https:// endpoint.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write result.json, report.md, throughput.svg and latency-cdf.svg into this directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Results (result.json of --out, or saved --json output); the first is the baseline.
    #[arg(required = true, num_args = 2.., value_name = "RESULT.json")]
    results: Vec<PathBuf>,
    /// Also draw the comparison plot into this file (none without it: a default file would land in
    /// whatever directory the command runs in).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

fn run_s3(a: S3BenchArgs) -> Result<ExitCode, String> {
    let mut o = S3BenchOptions::new(&a.endpoint, &a.access_key, &a.secret_key, a.workload);
    o.region = a.region;
    o.ops = a.ops;
    o.duration = match (a.duration, a.ops) {
        (Some(d), _) => d,
        // Operation-bounded runs still end: at most an hour.
        (None, Some(_)) => Duration::from_secs(3600),
        (None, None) => Duration::from_secs(30),
    };
    o.warmup = a.warmup;
    o.concurrency = a.concurrency;
    o.objects = a.objects;
    o.size = a.size;
    o.seed = a.seed;
    o.bucket = a.bucket;
    o.timeout = a.timeout;
    o.prefixes = a.prefixes;
    o.deadline = a.deadline;
    o.interval = a.interval;
    o.tenants = a.tenants;
    o.mix = a.mix;
    o.keep = a.keep;
    o.versioning = a.versioning;
    o.versions = a.versions;
    if a.versions > 1 && !(a.versioning && a.workload == S3Workload::List) {
        return Err("--versions is for the list workload with --versioning".into());
    }
    o.lean_list = a.list_client == ClientKind::Lean;
    o.lean_get = a.get_client == ClientKind::Lean;
    if o.lean_list && a.workload != S3Workload::List {
        return Err("--list-client is for the list workload".into());
    }
    o.sse_s3 = a.sse_s3;
    o.progress = !a.json;
    o.drive_metrics = a.drive_metrics;
    o.ca_cert = a.ca_cert;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    let r = rt.block_on(mosaic_bench::s3::run_s3_bench(&o))?;
    if let Some(dir) = &a.out {
        mosaic_bench::s3::output::write_outputs(dir, &r)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    } else {
        print!("{}", mosaic_bench::s3::output::operations_table(&r));
        print!("{}", mosaic_bench::s3::output::workload_lines(&r));
        if let Some(d) = &r.drive_io {
            print!("{}", mosaic_bench::s3::drive_io::markdown(d));
        }
        println!(
            "total: {} ops in {:.1} s, {:.1} ops/s, {:.2} MiB/s, {} errors{}",
            r.total.ops,
            r.seconds,
            r.total.ops_per_s,
            r.total.mib_per_s,
            r.total.errors,
            r.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default()
        );
        if let Some(dir) = &a.out {
            println!("report: {}", dir.join("report.md").display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_ceiling(a: CeilingArgs) -> Result<ExitCode, String> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.address)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.address))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        println!("ceiling serving on {bound}");
        tokio::select! {
            r = mosaic_bench::ceiling::serve(listener) => r.map_err(|e| e.to_string()),
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

fn run_compare(a: CompareArgs) -> Result<ExitCode, String> {
    let runs = a.results.iter().map(|p| mosaic_bench::compare::load(p)).collect::<Result<Vec<_>, _>>()?;
    print!("{}", mosaic_bench::compare::table(&runs));
    if let Some(plot) = &a.plot {
        std::fs::write(plot, mosaic_bench::compare::plot(&runs))
            .map_err(|e| format!("writing {}: {e}", plot.display()))?;
        println!("plot: {}", plot.display());
    }
    Ok(ExitCode::SUCCESS)
}
