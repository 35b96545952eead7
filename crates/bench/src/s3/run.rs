//! Running a workload: prepare, warm up, measure with bounded workers, verify, clean up.

use super::body::{Pool, VerifyMode};
use super::client::BenchClient;
use super::drive_io;
use super::lean::LeanClient;
use super::pace::{Pace, RATE_OPS_PER_S_MAX};
use super::plan::{OpKind, S3Workload, SizeRange, Step, WorkerPlan, step_hash};
use super::recorder::Recorder;
use super::{
    ListResult, PriorityResult, RunConfig, S3BenchOptions, S3BenchResult, Tenant, TimePoint, Totals, VerifyResult,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Limits on what a run may ask for.
const CONCURRENCY_MAX: usize = 1024;
const OBJECTS_MAX: u64 = 10_000_000;
const OBJECT_SIZE_MAX_BYTES: u64 = 5 * 1024 * 1024 * 1024;
const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
const PREFIXES_MAX: u64 = 100_000;
const PRIORITY_OBJECT_BYTES: u64 = 64 * 1024;
const PRIORITY_KEY: &str = "priority-hot";
const LIST_PAGE_KEYS: i32 = 1000;

pub async fn run_s3_bench(o: &S3BenchOptions) -> Result<S3BenchResult, String> {
    validate(o)?;
    let ca_pem = match &o.ca_cert {
        Some(path) => Some(std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?),
        None => None,
    };
    let mut client = BenchClient::new(
        &o.endpoint,
        &o.access_key,
        &o.secret_key,
        &o.region,
        ca_pem.clone(),
        Pool::new(o.seed),
        o.timeout,
    )?;
    if o.lean_list || o.lean_get {
        let endpoints = crate::s3::client::endpoints(&o.endpoint)?;
        let lean = LeanClient::new(&endpoints, &o.access_key, &o.secret_key, &o.region, ca_pem.as_deref(), o.timeout)?;
        if o.lean_list {
            client.use_lean_lister(lean.clone());
        }
        if o.lean_get {
            client.use_lean_getter(lean);
        }
    }
    match o.workload {
        S3Workload::Tenants => run_tenants(o, &client).await,
        S3Workload::List => run_list(o, &client).await,
        S3Workload::Priority => run_priority(o, &client).await,
        w => run_mix(o, &client, Tenant { size: o.size, ..Tenant::new(w) }, &o.bucket, "", None).await,
    }
}

fn validate(o: &S3BenchOptions) -> Result<(), String> {
    if o.concurrency == 0 || o.concurrency > CONCURRENCY_MAX {
        return Err(format!("--concurrency must be 1..={CONCURRENCY_MAX}, not {}", o.concurrency));
    }
    if o.objects.is_some_and(|n| n > OBJECTS_MAX) {
        return Err(format!("--objects must be at most {OBJECTS_MAX}"));
    }
    let sizes = o.size.iter().chain(o.tenants.iter().filter_map(|t| t.size.as_ref()));
    for s in sizes {
        if s.min > s.max || s.max > OBJECT_SIZE_MAX_BYTES {
            return Err(format!("--size must be MIN-MAX with MIN <= MAX <= 5GiB, not {}-{}", s.min, s.max));
        }
    }
    if o.duration.is_zero() || o.duration > DURATION_MAX {
        return Err("--duration must be between 1s and 24h".into());
    }
    if o.ops == Some(0) {
        return Err("--ops must be at least 1".into());
    }
    if o.timeout.is_zero() {
        return Err("--timeout must be above zero".into());
    }
    if o.prefixes == 0 || o.prefixes > PREFIXES_MAX {
        return Err(format!("--prefixes must be 1..={PREFIXES_MAX}"));
    }
    if o.interval < Duration::from_millis(1) || o.deadline.is_zero() {
        return Err("--interval must be at least 1ms and --deadline above zero".into());
    }
    if let Some(m) = o.mix {
        if m.get + m.put + m.delete != 100 {
            return Err("--mix GET/PUT/DELETE must add up to 100".into());
        }
        if !matches!(
            o.workload,
            S3Workload::CosbenchA
                | S3Workload::CosbenchB
                | S3Workload::CosbenchC
                | S3Workload::CosbenchD
                | S3Workload::WriteOnly
                | S3Workload::ReadOnly
                | S3Workload::ReadWrite
        ) {
            return Err(format!("--mix does not apply to {}", o.workload.name()));
        }
    }
    if o.workload == S3Workload::Tenants {
        if o.tenants.len() != 2 {
            return Err("--tenants takes exactly two workloads".into());
        }
        if let Some(t) = o
            .tenants
            .iter()
            .find(|t| matches!(t.workload, S3Workload::Tenants | S3Workload::List | S3Workload::Priority))
        {
            return Err(format!("{} cannot run as a tenant", t.workload.name()));
        }
        if let Some(r) =
            o.tenants.iter().filter_map(|t| t.rate_ops_per_s).find(|r| !(1..=RATE_OPS_PER_S_MAX).contains(r))
        {
            return Err(format!("a tenant's rate must be 1 to {RATE_OPS_PER_S_MAX} op/s, not {r}"));
        }
    }
    Ok(())
}

fn run_config(o: &S3BenchOptions, bucket: &str, objects: u64, sizes: SizeRange) -> RunConfig {
    RunConfig {
        concurrency: o.concurrency,
        objects,
        size_min_bytes: sizes.min,
        size_max_bytes: sizes.max,
        seed: o.seed,
        duration_s: o.duration.as_secs_f64(),
        ops_limit: o.ops,
        warmup_s: o.warmup.as_secs_f64(),
        timeout_s: o.timeout.as_secs_f64(),
        bucket: bucket.to_string(),
        prefixes: o.prefixes,
        mix: o.mix.map(|m| format!("{}/{}/{}", m.get, m.put, m.delete)),
        rate_ops_per_s: None,
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Runs every worker's prepare steps (C at a time); any failure stops the run with the first error.
async fn prepare(client: &BenchClient, bucket: &str, plans: Vec<WorkerPlan>) -> Result<Vec<WorkerPlan>, String> {
    prepare_versions(client, bucket, plans, 1).await
}

/// `prepare`, each object written `versions` times (in a versioned bucket, that many versions of each).
async fn prepare_versions(
    client: &BenchClient,
    bucket: &str,
    plans: Vec<WorkerPlan>,
    versions: u32,
) -> Result<Vec<WorkerPlan>, String> {
    assert!((1..=super::MAX_LIST_VERSIONS).contains(&versions));
    let mut set = JoinSet::new();
    for (i, mut plan) in plans.into_iter().enumerate() {
        let (client, bucket) = (client.clone(), bucket.to_string());
        set.spawn(async move {
            let steps = plan.prepare();
            for _ in 0..versions {
                for s in &steps {
                    client
                        .put(&bucket, &s.key, s.size, s.offset, false)
                        .await
                        .map_err(|e| format!("preparing {}/{}: {} ({})", bucket, s.key, e.0.label(), e.1))?;
                }
            }
            Ok::<_, String>((i, plan))
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.map_err(|e| format!("prepare task failed: {e}"))??);
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, p)| p).collect())
}

async fn exec(client: &BenchClient, bucket: &str, s: &Step) -> Result<u64, super::client::OpError> {
    match s.kind {
        OpKind::Get => client.get(bucket, &s.key, VerifyMode::Object, s.size).await,
        OpKind::Put => client.put(bucket, &s.key, s.size, s.offset, false).await,
        OpKind::Delete => client.delete(bucket, &s.key).await,
        OpKind::Append => client.append(bucket, &s.key, s.offset, s.size).await,
        OpKind::List | OpKind::ListDelimited => unreachable!("listing is not a worker step"),
    }
}

struct Phase {
    measure_from: Instant,
    stop_at: Instant,
}

impl Phase {
    /// A phase measured from `warmup` on, for the run's duration.
    fn after(o: &S3BenchOptions, warmup: Duration) -> Phase {
        let measure_from = Instant::now() + warmup;
        Phase { measure_from, stop_at: measure_from + o.duration }
    }
}

/// Operations each worker may measure when `--ops` bounds the run.
fn quota(ops: Option<u64>, worker: usize, workers: usize) -> Option<u64> {
    ops.map(|n| n / workers as u64 + u64::from((worker as u64) < n % workers as u64))
}

/// How many operations a worker sends, and when.
struct Budget {
    /// Measured operations at most; None: until the phase ends.
    quota: Option<u64>,
    /// The tenant's arrival schedule; None: each operation as soon as the last one is answered.
    pace: Option<Arc<Pace>>,
}

async fn worker_loop(
    client: BenchClient,
    bucket: String,
    mut plan: WorkerPlan,
    rec: Arc<Recorder>,
    phase: Arc<Phase>,
    worker: u64,
    budget: Budget,
) -> (WorkerPlan, u64) {
    let (mut seq, mut measured, mut digest) = (0u64, 0u64, 0u64);
    while Instant::now() < phase.stop_at && budget.quota.is_none_or(|q| measured < q) {
        // Paced: the operation counts from when it was due, however long it waited for this worker.
        let started = match &budget.pace {
            Some(pace) => {
                let due = pace.take();
                if due >= phase.stop_at {
                    break;
                }
                tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                due
            }
            None => Instant::now(),
        };
        let step = plan.next_step();
        digest ^= step_hash(worker, seq, &step);
        seq += 1;
        let r = exec(&client, &bucket, &step).await;
        if r.is_err() && matches!(step.kind, OpKind::Put | OpKind::Append) {
            plan.forget(&step.key);
        }
        rec.record(step.kind, started, &r);
        if started >= phase.measure_from {
            measured += 1;
        }
    }
    (plan, digest)
}

/// Samples the live counters once a second into the timeline and the progress line.
fn spawn_sampler(
    rec: Arc<Recorder>,
    phase: Arc<Phase>,
    label: String,
    progress: bool,
    mut done: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<TimePoint>> {
    tokio::spawn(async move {
        let mut points = Vec::new();
        let (mut last_ops, mut last_bytes, mut last_errors) = (0u64, 0u64, 0u64);
        let mut last_t = phase.measure_from;
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::from_std(phase.measure_from + Duration::from_secs(1)),
            Duration::from_secs(1),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if progress && Instant::now() < phase.measure_from {
            eprint!("\r{label}warming up...");
        }
        loop {
            let finished = tokio::select! {
                _ = tick.tick() => false,
                _ = done.changed() => true,
            };
            let now = Instant::now();
            if now <= phase.measure_from {
                if finished {
                    break;
                }
                continue;
            }
            let dt = now.duration_since(last_t).as_secs_f64();
            let (ops, bytes, errors) = (
                rec.live_ops.load(Ordering::Relaxed),
                rec.live_bytes.load(Ordering::Relaxed),
                rec.live_errors.load(Ordering::Relaxed),
            );
            if dt > 0.05 {
                let p = TimePoint {
                    t_s: now.duration_since(phase.measure_from).as_secs_f64(),
                    ops_per_s: (ops - last_ops) as f64 / dt,
                    mib_per_s: (bytes - last_bytes) as f64 / dt / (1024.0 * 1024.0),
                    errors: errors - last_errors,
                };
                if progress {
                    let line = format!(
                        "{label}{} {:>6.0}s {:>10.0} ops/s {:>9.1} MiB/s  errors {errors}",
                        progress_bar(p.t_s, phase.stop_at.duration_since(phase.measure_from).as_secs_f64()),
                        p.t_s,
                        p.ops_per_s,
                        p.mib_per_s
                    );
                    if label.is_empty() { eprint!("\r{line}   ") } else { eprintln!("{line}") }
                }
                points.push(p);
                (last_ops, last_bytes, last_errors, last_t) = (ops, bytes, errors, now);
            }
            if finished {
                break;
            }
        }
        if progress && label.is_empty() {
            eprintln!();
        }
        points
    })
}

/// "[#####               ]": the share of the measured phase that has passed (an --ops run may end sooner).
fn progress_bar(elapsed_s: f64, total_s: f64) -> String {
    const WIDTH: usize = 20;
    let done = ((elapsed_s / total_s.max(1e-9)).clamp(0.0, 1.0) * WIDTH as f64) as usize;
    format!("[{}{}]", "#".repeat(done), " ".repeat(WIDTH - done))
}

fn totals(ops: &std::collections::BTreeMap<String, super::OpResult>) -> Totals {
    Totals {
        ops: ops.values().map(|r| r.ops).sum(),
        errors: ops.values().map(|r| r.errors).sum(),
        ops_per_s: ops.values().map(|r| r.ops_per_s).sum(),
        mib_per_s: ops.values().map(|r| r.mib_per_s).sum(),
    }
}

/// A measured phase: the recorder its operations go to and the sampler drawing its timeline.
struct Measured {
    started_at: String,
    phase: Arc<Phase>,
    rec: Arc<Recorder>,
    done: watch::Sender<bool>,
    sampler: tokio::task::JoinHandle<Vec<TimePoint>>,
    /// The server's drive gauges as the measured phase starts (`--drive-metrics`).
    drives_before: Option<tokio::task::JoinHandle<Result<drive_io::Sample, String>>>,
}

impl Measured {
    /// Begins a phase measured from `warmup` on. The caller starts its workers once this returns.
    async fn start(o: &S3BenchOptions, label: &str, warmup: Duration) -> Measured {
        // Tenants share the drives: only the run as a whole reads them.
        let url = o.drive_metrics.clone().filter(|_| label.is_empty());
        // Without a warmup the drives are read before any operation starts: read at the phase's start
        // alongside the workers, the reading could come after the first operations' IO and miss it.
        let read_first = match &url {
            Some(url) if warmup.is_zero() => Some(drive_io::scrape(url, o.timeout).await),
            _ => None,
        };
        let phase = Arc::new(Phase::after(o, warmup));
        let rec = Arc::new(Recorder::new(phase.measure_from));
        let (done, done_rx) = watch::channel(false);
        let sampler = spawn_sampler(rec.clone(), phase.clone(), label.to_string(), o.progress, done_rx);
        let drives_before = url.map(|url| {
            let (from, timeout) = (phase.measure_from, o.timeout);
            tokio::spawn(async move {
                if let Some(read) = read_first {
                    return read;
                }
                tokio::time::sleep_until(tokio::time::Instant::from_std(from)).await;
                drive_io::scrape(&url, timeout).await
            })
        });
        Measured { started_at: now_rfc3339(), phase, rec, done, sampler, drives_before }
    }

    /// The drives' IO from the phase's start to now, against the object bytes the clients wrote.
    async fn drive_io(
        o: &S3BenchOptions,
        before: tokio::task::JoinHandle<Result<drive_io::Sample, String>>,
        operations: &std::collections::BTreeMap<String, super::OpResult>,
    ) -> Result<drive_io::DriveIoReport, String> {
        let url = o.drive_metrics.as_deref().unwrap_or_default();
        let before = before.await.map_err(|e| format!("reading {url}: {e}"))??;
        let after = drive_io::scrape(url, o.timeout).await?;
        let written =
            [OpKind::Put, OpKind::Append].iter().filter_map(|k| operations.get(k.name())).map(|r| r.bytes).sum();
        Ok(drive_io::delta(&before, &after, written))
    }

    /// Ends the phase; the result holds everything every workload reports, the caller adds its own part.
    async fn finish(
        self,
        o: &S3BenchOptions,
        workload: S3Workload,
        config: RunConfig,
        digest: u64,
    ) -> Result<S3BenchResult, String> {
        let _ = self.done.send(true);
        let timeline = self.sampler.await.unwrap_or_default();
        let seconds = self.rec.measured().as_secs_f64();
        let operations = self.rec.summarize(seconds);
        let drive_io = match self.drives_before {
            Some(before) => Some(Self::drive_io(o, before, &operations).await?),
            None => None,
        };
        Ok(S3BenchResult {
            workload: workload.name().into(),
            endpoint: o.endpoint.clone(),
            started_at: self.started_at,
            config,
            seconds,
            total: totals(&operations),
            operations,
            first_error: self.rec.first_error(),
            timeline,
            plan_digest: format!("{digest:016x}"),
            drive_io,
            ..Default::default()
        })
    }
}

/// Creates the bucket (with versioning and SSE-S3 default encryption when asked).
async fn create_bucket(o: &S3BenchOptions, client: &BenchClient, bucket: &str) -> Result<(), String> {
    client.create_bucket(bucket).await.map_err(|e| format!("creating bucket {bucket}: {}", e.1))?;
    if o.versioning {
        client.enable_versioning(bucket).await.map_err(|e| format!("enabling versioning on {bucket}: {}", e.1))?;
    }
    if o.sse_s3 {
        let on = client.enable_sse_s3(bucket).await;
        on.map_err(|e| format!("enabling SSE-S3 default encryption on {bucket}: {}", e.1))?;
    }
    Ok(())
}

/// Empties and removes the bucket unless asked to keep it.
async fn cleanup(o: &S3BenchOptions, client: &BenchClient, bucket: &str) -> Result<(), String> {
    if o.keep {
        return Ok(());
    }
    client.empty_bucket(bucket).await.map_err(|e| format!("cleaning up {bucket}: {}", e.1))?;
    client.delete_bucket(bucket).await.map_err(|e| format!("removing {bucket}: {}", e.1))
}

/// GET/PUT/DELETE mixes, create and append: C workers, each on its own keys.
async fn run_mix(
    o: &S3BenchOptions,
    client: &BenchClient,
    tenant: Tenant,
    bucket: &str,
    label: &str,
    start: Option<&tokio::sync::Barrier>,
) -> Result<S3BenchResult, String> {
    let Tenant { workload, size, rate_ops_per_s } = tenant;
    let sizes = size.unwrap_or(workload.default_size());
    let objects = o.objects.unwrap_or(workload.default_objects());
    let c = o.concurrency;
    create_bucket(o, client, bucket).await?;
    // A --mix override applies to the main workload, not to tenants.
    let mix = if label.is_empty() { o.mix.unwrap_or(workload.mix()) } else { workload.mix() };
    let plans =
        (0..c).map(|w| WorkerPlan::new(workload, o.seed, w as u64, c as u64, objects, sizes).with_mix(mix)).collect();
    let prepares = workload.prepares() || mix.get > 0 || mix.delete > 0;
    let plans = if prepares { prepare(client, bucket, plans).await? } else { plans };
    // Tenants measure together: one that prepared sooner must not measure while another still prepares.
    // (A tenant whose preparation fails ends the run, and the others' waits with it: try_join_all drops them.)
    if let Some(start) = start {
        start.wait().await;
    }
    let m = Measured::start(o, label, o.warmup).await;
    // A paced tenant's arrivals start with the warm-up, so the measured phase begins at the steady rate.
    let pace = rate_ops_per_s.map(|r| Arc::new(Pace::new(Instant::now(), r)));
    let mut set = JoinSet::new();
    for (w, plan) in plans.into_iter().enumerate() {
        let q = quota(o.ops, w, c);
        let budget = Budget { quota: q, pace: pace.clone() };
        set.spawn(worker_loop(
            client.clone(),
            bucket.to_string(),
            plan,
            m.rec.clone(),
            m.phase.clone(),
            w as u64,
            budget,
        ));
    }
    let mut digest = 0u64;
    let mut plans = Vec::new();
    while let Some(r) = set.join_next().await {
        let (plan, d) = r.map_err(|e| format!("worker failed: {e}"))?;
        digest ^= d;
        plans.push(plan);
    }
    let config = RunConfig { rate_ops_per_s, ..run_config(o, bucket, objects, sizes) };
    let mut result = m.finish(o, workload, config, digest).await?;
    if workload == S3Workload::Append {
        result.verification = Some(verify_appends(client, bucket, &plans, c).await);
    }
    cleanup(o, client, bucket).await?;
    Ok(result)
}

/// Reads back every append stream whole: its length and every byte must be what was appended.
async fn verify_appends(client: &BenchClient, bucket: &str, plans: &[WorkerPlan], c: usize) -> VerifyResult {
    let expected: Vec<(String, u64)> = plans.iter().flat_map(|p| p.existing()).collect();
    let sem = Arc::new(tokio::sync::Semaphore::new(c));
    let mut set = JoinSet::new();
    for (key, len) in expected {
        let (client, bucket, sem) = (client.clone(), bucket.to_string(), sem.clone());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            client.get(&bucket, &key, VerifyMode::Append { len }, len).await.map_err(|e| e.1)
        });
    }
    let mut v = VerifyResult::default();
    while let Some(r) = set.join_next().await {
        v.objects += 1;
        let r = r.map_err(|e| e.to_string()).and_then(|x| x);
        if let Err(e) = r {
            v.errors += 1;
            v.first_error.get_or_insert(e);
        }
    }
    v
}

async fn run_tenants(o: &S3BenchOptions, client: &BenchClient) -> Result<S3BenchResult, String> {
    let started_at = now_rfc3339();
    let start = tokio::sync::Barrier::new(o.tenants.len());
    let start = &start;
    let runs = o.tenants.iter().enumerate().map(|(i, t)| {
        let bucket = format!("{}-t{}", o.bucket, i + 1);
        let label = format!("tenant {} {:<11}", i + 1, t.workload.name());
        async move { run_mix(o, client, *t, &bucket, &label, Some(start)).await }
    });
    let results = futures::future::try_join_all(runs).await?;
    let seconds = results.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let mut total = Totals::default();
    for r in &results {
        total.ops += r.total.ops;
        total.errors += r.total.errors;
        total.ops_per_s += r.total.ops_per_s;
        total.mib_per_s += r.total.mib_per_s;
    }
    Ok(S3BenchResult {
        workload: S3Workload::Tenants.name().into(),
        endpoint: o.endpoint.clone(),
        started_at,
        config: run_config(o, &o.bucket, 0, SizeRange::fixed(0)),
        seconds,
        total,
        first_error: results.iter().find_map(|r| r.first_error.clone()),
        plan_digest: format!(
            "{:016x}",
            results.iter().fold(0u64, |d, r| d ^ u64::from_str_radix(&r.plan_digest, 16).unwrap_or(0))
        ),
        tenants: results,
        ..Default::default()
    })
}

/// A steady reader of one prioritized object on a fixed interval while C writers PUT large objects.
async fn run_priority(o: &S3BenchOptions, client: &BenchClient) -> Result<S3BenchResult, String> {
    let bucket = o.bucket.as_str();
    let sizes = o.size.unwrap_or(S3Workload::Priority.default_size());
    let objects = o.objects.unwrap_or(S3Workload::Priority.default_objects());
    let c = o.concurrency;
    create_bucket(o, client, bucket).await?;
    client
        .put(bucket, PRIORITY_KEY, PRIORITY_OBJECT_BYTES, o.seed, true)
        .await
        .map_err(|e| format!("preparing the prioritized object: {}", e.1))?;
    let m = Measured::start(o, "", o.warmup).await;
    let mut set = JoinSet::new();
    for w in 0..c {
        let plan = WorkerPlan::new(S3Workload::Priority, o.seed, w as u64, c as u64, objects, sizes);
        let q = quota(o.ops, w, c);
        let budget = Budget { quota: q, pace: None };
        set.spawn(worker_loop(
            client.clone(),
            bucket.to_string(),
            plan,
            m.rec.clone(),
            m.phase.clone(),
            w as u64,
            budget,
        ));
    }
    let reader = {
        let (client, bucket, rec, phase, interval) =
            (client.clone(), bucket.to_string(), m.rec.clone(), m.phase.clone(), o.interval);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < phase.stop_at {
                tick.tick().await;
                let started = Instant::now();
                let r = client.get(&bucket, PRIORITY_KEY, VerifyMode::Object, PRIORITY_OBJECT_BYTES).await;
                rec.record(OpKind::Get, started, &r);
            }
        })
    };
    let mut digest = 0u64;
    while let Some(r) = set.join_next().await {
        digest ^= r.map_err(|e| format!("writer failed: {e}"))?.1;
    }
    reader.await.map_err(|e| format!("reader failed: {e}"))?;
    let rec = m.rec.clone();
    let mut result = m.finish(o, S3Workload::Priority, run_config(o, bucket, objects, sizes), digest).await?;
    let get = result.operations.get("GET").cloned().unwrap_or_default();
    result.priority = Some(PriorityResult {
        deadline_ms: o.deadline.as_secs_f64() * 1000.0,
        interval_ms: o.interval.as_secs_f64() * 1000.0,
        reads: get.ops + get.errors,
        deadline_misses: rec.count_over(OpKind::Get, o.deadline.as_micros() as u64) + get.errors,
        writer_mib_per_s: result.operations.get("PUT").map_or(0.0, |p| p.mib_per_s),
    });
    cleanup(o, client, bucket).await?;
    Ok(result)
}

/// Prepares N objects (flat or under prefixes) and lists them all: C listers each walk the whole bucket,
/// first flat, then prefix by prefix with a delimiter.
async fn run_list(o: &S3BenchOptions, client: &BenchClient) -> Result<S3BenchResult, String> {
    let bucket = o.bucket.as_str();
    let sizes = o.size.unwrap_or(S3Workload::List.default_size());
    let objects = o.objects.unwrap_or(S3Workload::List.default_objects());
    let versions = if o.versioning { o.versions } else { 1 };
    // Versions take many writes: more writers prepare them than there are listers.
    let c = if versions > 1 { o.concurrency.max(PREPARE_VERSIONS_WRITERS) } else { o.concurrency };
    create_bucket(o, client, bucket).await?;
    let plans: Vec<WorkerPlan> = (0..c)
        .map(|w| {
            WorkerPlan::new(S3Workload::List, o.seed, w as u64, c as u64, objects, sizes).with_prefixes(o.prefixes)
        })
        .collect();
    let mut digest = 0u64;
    let plans = prepare_versions(client, bucket, plans, versions).await?;
    for (w, p) in plans.iter().enumerate() {
        for (i, (key, size)) in p.existing().iter().enumerate() {
            digest ^=
                step_hash(w as u64, i as u64, &Step { kind: OpKind::Put, key: key.clone(), size: *size, offset: 0 });
        }
    }
    // Warm-up: list pages (unmeasured) until the warm-up time is over.
    let warm_until = Instant::now() + o.warmup;
    let mut token = None;
    while Instant::now() < warm_until {
        let page = list_page(client, o.versioning, bucket, "", None, token.take()).await.map_err(|e| e.1)?;
        token = page.next;
    }
    let m = Measured::start(o, "", Duration::ZERO).await;
    let (flat_keys, flat_s) = list_pass(o, client, bucket, &m.rec, &m.phase, false).await;
    let (delim_keys, delim_s) = list_pass(o, client, bucket, &m.rec, &m.phase, true).await;
    let mut result = m.finish(o, S3Workload::List, run_config(o, bucket, objects, sizes), digest).await?;
    // Each listing kind ran in its own part of the phase: its rate is over that part.
    for (name, secs) in [("LIST", flat_s), ("LIST_DELIMITED", delim_s)] {
        if let Some(r) = result.operations.get_mut(name) {
            r.ops_per_s = r.ops as f64 / secs.max(1e-9);
        }
    }
    result.total = totals(&result.operations);
    result.list = Some(ListResult {
        objects,
        versions,
        prefixes: o.prefixes,
        keys_listed_flat: flat_keys,
        keys_per_s_flat: flat_keys as f64 / flat_s.max(1e-9),
        keys_listed_delimited: delim_keys,
        keys_per_s_delimited: delim_keys as f64 / delim_s.max(1e-9),
    });
    cleanup(o, client, bucket).await?;
    Ok(result)
}

/// Writers that prepare a `list` run with several versions per key.
const PREPARE_VERSIONS_WRITERS: usize = 16;

/// A page of the bucket's listing: ListObjectVersions in a versioned bucket, else ListObjectsV2.
async fn list_page(
    client: &BenchClient,
    versions: bool,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    token: Option<String>,
) -> Result<super::client::ListPage, super::client::OpError> {
    if versions {
        client.list_versions_page(bucket, prefix, delimiter, token, LIST_PAGE_KEYS).await
    } else {
        client.list_page(bucket, prefix, delimiter, token, LIST_PAGE_KEYS).await
    }
}

/// Every lister walks the whole bucket once; returns (keys listed by all listers, seconds).
async fn list_pass(
    o: &S3BenchOptions,
    client: &BenchClient,
    bucket: &str,
    rec: &Arc<Recorder>,
    phase: &Arc<Phase>,
    delimited: bool,
) -> (u64, f64) {
    let start = Instant::now();
    let keys = Arc::new(AtomicU64::new(0));
    let versions = o.versioning;
    let mut set = JoinSet::new();
    for _ in 0..o.concurrency {
        let (client, bucket, rec, phase, keys) =
            (client.clone(), bucket.to_string(), rec.clone(), phase.clone(), keys.clone());
        set.spawn(async move {
            let kind = if delimited { OpKind::ListDelimited } else { OpKind::List };
            let delimiter = delimited.then_some("/");
            // Prefixes still to walk; the root first.
            let mut todo = vec![String::new()];
            while let Some(prefix) = todo.pop() {
                let mut token = None;
                loop {
                    if Instant::now() >= phase.stop_at {
                        return;
                    }
                    let started = Instant::now();
                    let r = list_page(&client, versions, &bucket, &prefix, delimiter, token.take()).await;
                    match r {
                        Ok(page) => {
                            rec.record(kind, started, &Ok(0));
                            keys.fetch_add(page.keys, Ordering::Relaxed);
                            todo.extend(page.prefixes);
                            match page.next {
                                Some(t) => token = Some(t),
                                None => break,
                            }
                        }
                        Err(e) => {
                            rec.record(kind, started, &Err(e));
                            break;
                        }
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    (keys.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::progress_bar;

    #[test]
    fn progress_bar_is_bounded() {
        assert_eq!(progress_bar(0.0, 10.0), format!("[{}]", " ".repeat(20)));
        assert_eq!(progress_bar(5.0, 10.0), format!("[{}{}]", "#".repeat(10), " ".repeat(10)));
        assert_eq!(progress_bar(50.0, 10.0), format!("[{}]", "#".repeat(20)));
        assert_eq!(progress_bar(1.0, 0.0).len(), 22);
    }
}
