//! `mosaic bench s3`: the papers' workloads against any S3 endpoint. A run prepares the objects it needs,
//! warms up (not measured), runs `concurrency` workers until the duration or the operation count is
//! reached, verifies every body it reads, and reports per-operation throughput, latency percentiles from
//! HDR histograms, errors by class and a once-a-second timeline.

pub mod body;
pub mod client;
pub mod drive_io;
pub mod lean;
pub mod lean_list;
pub mod output;
pub mod pace;
pub mod plan;
pub mod recorder;
mod run;

pub use plan::{Mix, OpKind, S3Workload, SizeRange};
pub use recorder::OpResult;
pub use run::run_s3_bench;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct S3BenchOptions {
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
    pub workload: S3Workload,
    /// Upper bound of the measured phase.
    pub duration: Duration,
    /// Upper bound on measured operations, split evenly between workers.
    pub ops: Option<u64>,
    pub warmup: Duration,
    pub concurrency: usize,
    pub objects: Option<u64>,
    pub size: Option<SizeRange>,
    pub seed: u64,
    pub bucket: String,
    /// Per-operation timeout; an operation over it counts as a `timeout` error.
    pub timeout: Duration,
    /// `list`: spread the objects under this many prefixes.
    pub prefixes: u64,
    /// `priority`: the reader's deadline and its interval between reads.
    pub deadline: Duration,
    pub interval: Duration,
    /// `tenants`: the two workloads, their optional sizes and rates.
    pub tenants: Vec<Tenant>,
    /// GET/PUT/DELETE percentages replacing the workload's own (key popularity stays the workload's).
    pub mix: Option<Mix>,
    /// Leave the objects in place after the run (they are removed by default).
    pub keep: bool,
    /// Turn versioning on in the bucket before the run.
    pub versioning: bool,
    /// `list` with versioning: each key is written this many times and the listers walk
    /// ListObjectVersions (every version is one listed entry). 1 to `MAX_LIST_VERSIONS`.
    pub versions: u32,
    /// `list`: walk the listing with the lean client (signed GETs, XML scanned) instead of the SDK.
    pub lean_list: bool,
    /// GETs through the lean client (signed GETs over reqwest, bodies verified) instead of the SDK.
    pub lean_get: bool,
    /// Give the bucket SSE-S3 default encryption before the run (every PUT is then encrypted at rest).
    pub sse_s3: bool,
    /// Print a live progress line on stderr.
    pub progress: bool,
    /// The server's Prometheus endpoint: its per-drive IO over the measured phase goes into the result.
    pub drive_metrics: Option<String>,
    /// PEM certificates that HTTPS endpoints are trusted by (a CA's or the server's own); None: the
    /// system's roots.
    pub ca_cert: Option<std::path::PathBuf>,
}

impl S3BenchOptions {
    /// Options with the defaults the CLI uses; tests override what they need.
    pub fn new(endpoint: &str, access_key: &str, secret_key: &str, workload: S3Workload) -> S3BenchOptions {
        S3BenchOptions {
            endpoint: endpoint.to_string(),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            region: "us-east-1".into(),
            workload,
            duration: Duration::from_secs(30),
            ops: None,
            warmup: Duration::from_secs(2),
            concurrency: 16,
            objects: None,
            size: None,
            seed: 1,
            bucket: "mosaic-bench".into(),
            timeout: Duration::from_secs(60),
            prefixes: 1,
            deadline: Duration::from_millis(50),
            interval: Duration::from_millis(10),
            tenants: vec![Tenant::new(S3Workload::CosbenchB), Tenant::new(S3Workload::CosbenchD)],
            mix: None,
            keep: false,
            versioning: false,
            versions: 1,
            lean_list: false,
            lean_get: false,
            sse_s3: false,
            progress: false,
            drive_metrics: None,
            ca_cert: None,
        }
    }
}

/// One tenant of the `tenants` workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tenant {
    pub workload: S3Workload,
    /// Object sizes in place of the workload's own.
    pub size: Option<SizeRange>,
    /// Open loop at this many operations per second (`pace`); None: a closed loop, each worker sending
    /// its next operation as soon as the last one is answered.
    pub rate_ops_per_s: Option<u32>,
}

impl Tenant {
    pub fn new(workload: S3Workload) -> Tenant {
        Tenant { workload, size: None, rate_ops_per_s: None }
    }
}

/// Most versions per key the `list` workload writes.
pub const MAX_LIST_VERSIONS: u32 = 100;

fn one() -> u32 {
    1
}

/// The configuration as run, recorded in the result.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct RunConfig {
    pub concurrency: usize,
    pub objects: u64,
    pub size_min_bytes: u64,
    pub size_max_bytes: u64,
    pub seed: u64,
    pub duration_s: f64,
    pub ops_limit: Option<u64>,
    pub warmup_s: f64,
    pub timeout_s: f64,
    pub bucket: String,
    pub prefixes: u64,
    /// GET/PUT/DELETE percentages when overridden with --mix.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mix: Option<String>,
    /// A paced tenant's offered rate (open loop); absent for a closed loop.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rate_ops_per_s: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Totals {
    pub ops: u64,
    pub errors: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct TimePoint {
    pub t_s: f64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    pub errors: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct ListResult {
    pub objects: u64,
    /// Versions per key; the entries listed count every version (1 without versioning).
    #[serde(default = "one")]
    pub versions: u32,
    pub prefixes: u64,
    pub keys_listed_flat: u64,
    pub keys_per_s_flat: f64,
    pub keys_listed_delimited: u64,
    pub keys_per_s_delimited: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct PriorityResult {
    pub deadline_ms: f64,
    pub interval_ms: f64,
    pub reads: u64,
    /// Reads slower than the deadline or failed.
    pub deadline_misses: u64,
    pub writer_mib_per_s: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct VerifyResult {
    pub objects: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct S3BenchResult {
    pub workload: String,
    pub endpoint: String,
    pub started_at: String,
    pub config: RunConfig,
    /// Length of the measured phase.
    pub seconds: f64,
    pub operations: BTreeMap<String, OpResult>,
    pub total: Totals,
    pub first_error: Option<String>,
    pub timeline: Vec<TimePoint>,
    /// XOR of a hash of every step issued (worker, sequence, operation, key, size): equal for two runs that
    /// issued the same keys and sizes.
    pub plan_digest: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub list: Option<ListResult>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub priority: Option<PriorityResult>,
    /// Read-back of every object after the run (append streams).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub verification: Option<VerifyResult>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tenants: Vec<S3BenchResult>,
    /// The server's per-drive IO over the measured phase (`--drive-metrics`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub drive_io: Option<drive_io::DriveIoReport>,
}
