//! The microstores of a node: their catalog (definitions and the buckets assigned by hand), the load
//! redirector (a request goes to its bucket's microstore's workers: the one it is assigned to, else the one
//! serving its class, else the default), and the rounds that classify buckets and move workers.

use crate::bandwidth::{Bandwidth, BandwidthConfig, BandwidthDecision};
use crate::class::Class;
use crate::io::{IoConfig, IoDecision, IoPlanner};
use crate::manager::{Decision, ManagerConfig, Observation, ResourceManager, Target};
use crate::monitor::{BucketStatus, Monitor, MonitorConfig};
use crate::sets::{SetDecision, SetPlanner, SetsConfig};
use crate::window::Sample;
use crate::workers::{Admission, Refused, WorkerPool};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The microstore every bucket belongs to unless assigned or classified elsewhere; it cannot be deleted.
pub const DEFAULT: &str = "default";
pub const MAX_MICROSTORES: usize = 64;
pub const MAX_NAME_BYTES: usize = 63;
/// Most buckets assigned by hand.
pub const MAX_ASSIGNMENTS: usize = 100_000;
/// Most sets a microstore or a bucket's placement names (a pool's members).
pub const MAX_SETS: usize = 256;
/// Decisions kept for `status`.
const DECISIONS_KEPT: usize = 256;

/// A microstore as the operator defines it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub target: Target,
    /// Buckets of this class that are not assigned by hand are served here.
    #[serde(default)]
    pub class: Option<Class>,
    /// Workers it starts with (the resource manager moves them later).
    pub workers: u32,
    /// The erasure sets its buckets' data lives on, its own (ascending); empty: every set, shared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sets: Vec<usize>,
}

/// Where a bucket's data lives: the sets its objects are placed on and, while they move there, the sets
/// they leave. A bucket without one is on every set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketPlacement {
    pub sets: Vec<usize>,
    #[serde(default)]
    pub moving_from: Option<Vec<usize>>,
}

/// Sets named as a list: ascending, each below `MAX_SETS`, and (`nonempty`) at least one.
pub fn validate_sets(sets: &[usize], nonempty: bool) -> Result<(), String> {
    let ascending = sets.windows(2).all(|w| w[0] < w[1]);
    if !ascending || sets.iter().any(|s| *s >= MAX_SETS) || (nonempty && sets.is_empty()) {
        return Err(format!(
            "sets {sets:?}: give {} ascending set numbers below {MAX_SETS}",
            if nonempty { "1 or more" } else { "0 or more" }
        ));
    }
    Ok(())
}

/// What is stored: the microstores and the buckets assigned by hand.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub microstores: BTreeMap<String, Definition>,
    pub buckets: BTreeMap<String, String>,
    /// Buckets whose data lives on some sets only, or moves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub placements: BTreeMap<String, BucketPlacement>,
    /// Where the data of buckets placed nowhere else lives (the default microstore's sets: those no
    /// microstore owns), or moves; None: every set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<BucketPlacement>,
}

impl Catalog {
    pub fn validate(&self) -> Result<(), String> {
        if self.microstores.len() > MAX_MICROSTORES {
            return Err(format!("at most {MAX_MICROSTORES} microstores, not {}", self.microstores.len()));
        }
        if self.buckets.len() > MAX_ASSIGNMENTS {
            return Err(format!("at most {MAX_ASSIGNMENTS} buckets assigned by hand"));
        }
        for name in self.microstores.keys() {
            validate_name(name)?;
        }
        if let Some((bucket, ms)) = self.buckets.iter().find(|(_, ms)| !self.microstores.contains_key(*ms)) {
            return Err(format!("bucket {bucket} is assigned to {ms}, which is not a microstore"));
        }
        if self.placements.len() > MAX_ASSIGNMENTS {
            return Err(format!("at most {MAX_ASSIGNMENTS} buckets placed on some sets"));
        }
        for (name, d) in &self.microstores {
            validate_sets(&d.sets, false).map_err(|e| format!("microstore {name}: {e}"))?;
        }
        let home = self.home.iter().map(|p| ("the default microstore's home", p));
        for (bucket, p) in self.placements.iter().map(|(b, p)| (b.as_str(), p)).chain(home) {
            validate_sets(&p.sets, true).map_err(|e| format!("bucket {bucket}: {e}"))?;
            if let Some(from) = &p.moving_from {
                validate_sets(from, true).map_err(|e| format!("bucket {bucket} moving from: {e}"))?;
            }
        }
        Ok(())
    }

    /// The sets some microstore owns (the default microstore keeps off them).
    pub fn owned_sets(&self) -> std::collections::BTreeSet<usize> {
        self.microstores
            .iter()
            .filter(|(n, _)| n.as_str() != DEFAULT)
            .flat_map(|(_, d)| d.sets.iter().copied())
            .collect()
    }
}

/// The sets the home belongs on, of `set_count`: those no microstore owns, or every one when microstores
/// own them all (the default microstore then shares them).
pub fn home_for(owned: &std::collections::BTreeSet<usize>, set_count: usize) -> Vec<usize> {
    let free: Vec<usize> = (0..set_count).filter(|s| !owned.contains(s)).collect();
    if free.is_empty() { (0..set_count).collect() } else { free }
}

pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("a microstore name is 1 to {MAX_NAME_BYTES} of a-z, 0-9 and '-', not starting with '-': {name:?}"))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub monitor: MonitorConfig,
    pub manager: ManagerConfig,
    /// The default microstore's target.
    pub default_target: Target,
    /// Requests that may wait for a worker per microstore, and for how long.
    pub max_waiting: u32,
    pub max_wait: Duration,
    /// Whether rounds move workers and bandwidth (off: the partition stays as defined).
    pub adapt: bool,
    /// How bandwidth caps move (its slack ratio and request floor are the manager's).
    pub bandwidth: BandwidthConfig,
    /// How sets move between microstores (when adapting, on a server of several sets).
    pub sets: SetsConfig,
    /// How drive IO is shared among microstores.
    pub io: IoConfig,
    /// The nice of the bulk CPU class, where microstores judged on throughput run their heavy CPU work
    /// beside one judged on latency (`mosaic_store::spawn_blocking_in`); 0: no CPU classes.
    pub bulk_nice: i32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            monitor: MonitorConfig::default(),
            manager: ManagerConfig::default(),
            default_target: Target::LatencyMsP99(100.0),
            max_waiting: 4_096,
            max_wait: Duration::from_secs(30),
            adapt: true,
            bandwidth: BandwidthConfig::default(),
            sets: SetsConfig::default(),
            io: IoConfig::default(),
            bulk_nice: DEFAULT_BULK_NICE,
        }
    }
}

/// The bulk CPU class's default nice: measured in docs/bench/2026-12-07-bulk-cpu.md.
pub const DEFAULT_BULK_NICE: i32 = 10;

/// A decision of either resource.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AnyDecision {
    Workers(Decision),
    Bandwidth(BandwidthDecision),
    Sets(SetDecision),
    Io(IoDecision),
}

/// A decision with the time it was taken (ms since the registry started).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoggedDecision {
    pub at_ms: u64,
    #[serde(flatten)]
    pub decision: AnyDecision,
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundReport {
    pub class_changes: Vec<(String, Class)>,
    pub decisions: Vec<Decision>,
    pub bandwidth: Vec<BandwidthDecision>,
    /// Sets moved between microstores (stored in the catalog; their buckets' data moves after).
    pub sets: Vec<SetDecision>,
    /// Why the sets decided could not be stored (then none moved).
    pub sets_error: Option<String>,
    /// IO points moved between microstores.
    pub io: Vec<IoDecision>,
    pub observations: BTreeMap<String, Observation>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MicrostoreStatus {
    pub name: String,
    pub target: Target,
    pub class: Option<Class>,
    /// Its own sets (empty: every set, shared).
    pub sets: Vec<usize>,
    pub workers: u32,
    /// Its object bytes are paced to this; None: unlimited.
    pub bandwidth_cap_mib_s: Option<f64>,
    /// Its points of drive IO (None: it runs unshared) and what the drives served it.
    pub io_points: Option<u32>,
    pub io_served_bytes: u64,
    pub io_waited_ios: u64,
    pub io_wait_ms: f64,
    /// Whether its heavy CPU work runs in the bulk CPU class (`Config::bulk_nice`).
    pub cpu_bulk: bool,
    pub in_use: u32,
    pub waiting: u32,
    pub refused: u64,
    /// Buckets assigned by hand.
    pub assigned: Vec<String>,
    /// What the last round measured of it.
    pub last_round: Option<Observation>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketRoute {
    #[serde(flatten)]
    pub watched: BucketStatus,
    pub microstore: String,
    pub assigned: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    pub microstores: Vec<MicrostoreStatus>,
    pub free_workers: u32,
    pub buckets: Vec<BucketRoute>,
    pub decisions: Vec<LoggedDecision>,
    pub adapt: bool,
    /// Buckets whose data lives on some sets only, or moves.
    pub placements: BTreeMap<String, BucketPlacement>,
    /// Where the other buckets' data lives, or moves (None: every set).
    pub home: Option<BucketPlacement>,
    /// Pieces of work the node ran in the bulk CPU class since it started.
    pub bulk_cpu_tasks: u64,
    /// Connections the node served whole on the bulk class's runtime since it started.
    pub bulk_cpu_connections: u64,
}

struct Inner {
    catalog: Catalog,
    pools: BTreeMap<String, Arc<WorkerPool>>,
    /// Whether some microstore serves a class (else routing never asks the monitor: one lock less per
    /// request on a server that defines none).
    any_class: bool,
    /// Each microstore's IO share (as the IO planner has them; read per request).
    share_ids: BTreeMap<String, mosaic_store::ShareId>,
}

fn any_class(catalog: &Catalog) -> bool {
    catalog.microstores.values().any(|d| d.class.is_some())
}

pub struct Microstores {
    config: Config,
    monitor: Monitor,
    manager: Mutex<ResourceManager>,
    bandwidth: Mutex<Bandwidth>,
    planner: Mutex<SetPlanner>,
    /// Locked after `manager` and `inner` when with them.
    io: Mutex<IoPlanner>,
    /// The erasure sets microstores may own (0: none, the store is one set or a cluster's).
    set_count: usize,
    inner: RwLock<Inner>,
    decisions: Mutex<VecDeque<LoggedDecision>>,
    started: Instant,
    last_round: Mutex<Instant>,
    last_observations: Mutex<BTreeMap<String, Observation>>,
    /// Stores the catalog when a change comes from the S3 side (a bucket deleted).
    saver: Option<Saver>,
    /// Told of each deleted bucket (a cluster node's: the cluster's catalog forgets it too).
    forget_hook: Option<ForgetHook>,
    /// Whether this registry sets the process's bulk CPU class (a server's; not a scratch copy or a test's).
    cpu_classes: bool,
}

/// Stores a catalog (the server's: the data directory's microstores file).
pub type Saver = Box<dyn Fn(&Catalog) -> Result<(), String> + Send + Sync>;
/// Told of a deleted bucket once this node forgot it.
pub type ForgetHook = Box<dyn Fn(&str) + Send + Sync>;

impl Microstores {
    /// The microstores of `catalog` (the default one added when missing, holding every worker the others
    /// do not).
    pub fn new(config: Config, mut catalog: Catalog) -> Result<Microstores, String> {
        let mut manager = ResourceManager::new(config.manager.clone())?;
        let bandwidth = Bandwidth::new(BandwidthConfig {
            slack_ratio: config.manager.slack_ratio,
            min_requests: config.manager.min_requests,
            ..config.bandwidth.clone()
        })?;
        let monitor = Monitor::new(config.monitor.clone())?;
        let planner = SetPlanner::new(config.sets.clone())?;
        let io = IoPlanner::new(config.io.clone(), &config.manager)?;
        catalog.microstores.remove(DEFAULT);
        catalog.validate()?;
        let mut pools = BTreeMap::new();
        for (name, d) in &catalog.microstores {
            manager.add(name, d.target, d.workers)?;
        }
        let rest = manager.free_workers();
        manager.add(DEFAULT, config.default_target, rest).map_err(|e| format!("the default microstore: {e}"))?;
        for (name, h) in manager.holdings() {
            pools.insert(name.clone(), WorkerPool::new(h.workers, config.max_waiting, config.max_wait));
        }
        let workers = manager.workers(DEFAULT).unwrap_or(0);
        catalog.microstores.insert(
            DEFAULT.to_string(),
            Definition { target: config.default_target, class: None, workers, sets: vec![] },
        );
        let now = Instant::now();
        let mut inner = Inner { any_class: any_class(&catalog), catalog, pools, share_ids: BTreeMap::new() };
        let mut io = Mutex::new(io);
        sync_io(io.get_mut(), &mut inner, false);
        Ok(Microstores {
            config,
            monitor,
            manager: Mutex::new(manager),
            bandwidth: Mutex::new(bandwidth),
            planner: Mutex::new(planner),
            io,
            set_count: 0,
            inner: RwLock::new(inner),
            decisions: Mutex::new(VecDeque::new()),
            started: now,
            last_round: Mutex::new(now),
            last_observations: Mutex::new(BTreeMap::new()),
            saver: None,
            forget_hook: None,
            cpu_classes: false,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How the catalog is stored when a bucket is deleted (see `bucket_deleted`).
    pub fn with_saver(mut self, saver: Saver) -> Microstores {
        self.saver = Some(saver);
        self
    }

    /// Schedules the node's drive IO by microstore through `shares` (the table its drives' schedulers read).
    pub fn with_io_shares(mut self, shares: std::sync::Arc<mosaic_store::IoShares>) -> Microstores {
        self.io.get_mut().with_shares(shares);
        self
    }

    /// Runs the heavy CPU work of microstores judged on throughput in the process's bulk CPU class while
    /// one judged on latency exists (`Config::bulk_nice`; 0: never). For the server's registry only: the
    /// class is process-wide. Err: the nice is out of range.
    pub fn with_cpu_classes(mut self) -> Result<Microstores, String> {
        if self.config.bulk_nice == 0 {
            return Ok(self);
        }
        mosaic_store::set_bulk_nice(self.config.bulk_nice)?;
        self.cpu_classes = true;
        sync_io(self.io.get_mut(), self.inner.get_mut(), true);
        Ok(self)
    }

    /// The number of erasure sets microstores may own (the server's pool; 0, the default: none).
    pub fn with_sets(mut self, set_count: usize) -> Microstores {
        assert!(set_count <= MAX_SETS, "at most {MAX_SETS} sets");
        self.set_count = set_count;
        self
    }

    /// A bucket was deleted: its window goes, and its hand assignment (a new bucket of the same name starts
    /// with none), stored through the saver.
    pub fn bucket_deleted(&self, bucket: &str) -> Result<(), String> {
        let save = |c: &Catalog| self.store(c);
        self.forget_bucket(bucket, save)?;
        if let Some(hook) = &self.forget_hook {
            hook(bucket);
        }
        Ok(())
    }

    /// Stores a catalog through the saver (nothing to do without one).
    fn store(&self, catalog: &Catalog) -> Result<(), String> {
        self.saver.as_ref().map_or(Ok(()), |s| s(catalog))
    }

    /// Who is told of each deleted bucket after this node forgot it.
    pub fn with_forget_hook(mut self, hook: ForgetHook) -> Microstores {
        self.forget_hook = Some(hook);
        self
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The catalog to store (without the default microstore, which is configuration).
    pub fn catalog(&self) -> Catalog {
        let mut c = self.inner.read().catalog.clone();
        c.microstores.remove(DEFAULT);
        c
    }

    /// The microstore serving a bucket (a request without a bucket is served by the default one).
    pub fn route(&self, bucket: Option<&str>) -> String {
        let inner = self.inner.read();
        route_in(&inner, &self.monitor, bucket).to_string()
    }

    /// The IO share (and so the CPU class) of the microstore serving a bucket, without admitting a request.
    pub fn share_of_bucket(&self, bucket: Option<&str>) -> mosaic_store::ShareId {
        let inner = self.inner.read();
        let name = route_in(&inner, &self.monitor, bucket);
        inner.share_ids.get(name).copied().unwrap_or(mosaic_store::UNSHARED)
    }

    /// Admits a request into its bucket's microstore (waiting for a worker, bounded).
    pub async fn admit(&self, bucket: Option<&str>) -> Result<Admission, Refused> {
        let (pool, share) = {
            let inner = self.inner.read();
            let name = route_in(&inner, &self.monitor, bucket);
            (inner.pools[name].clone(), inner.share_ids.get(name).copied().unwrap_or(mosaic_store::UNSHARED))
        };
        Ok(pool.admit().await?.in_io_share(share))
    }

    /// Counts a finished request in its bucket's window.
    pub fn record(&self, bucket: &str, sample: Sample) {
        self.monitor.record(bucket, self.now_ms(), sample);
    }

    /// Forgets a deleted bucket (its window and any assignment).
    pub fn forget_bucket(&self, bucket: &str, save: impl FnOnce(&Catalog) -> Result<(), String>) -> Result<(), String> {
        self.monitor.forget(bucket);
        if !self.inner.read().catalog.buckets.contains_key(bucket) {
            return Ok(());
        }
        self.change(save, |c| {
            c.buckets.remove(bucket);
            Ok(())
        })
    }

    /// The sets bucket `bucket`'s data belongs on: its microstore's own; None: every set.
    pub fn wanted_sets(&self, bucket: &str) -> Option<Vec<usize>> {
        let inner = self.inner.read();
        let sets = &inner.catalog.microstores[route_in(&inner, &self.monitor, Some(bucket))].sets;
        (!sets.is_empty()).then(|| sets.clone())
    }

    /// Buckets whose data placement may have to change: those assigned by hand, placed on some sets, or
    /// watched (a bucket routed by its class is).
    pub fn placement_candidates(&self) -> Vec<String> {
        self.candidates_in(&self.inner.read())
    }

    fn candidates_in(&self, inner: &Inner) -> Vec<String> {
        let mut out: Vec<String> = self.monitor.status(self.now_ms()).into_iter().map(|b| b.bucket).collect();
        out.extend(inner.catalog.buckets.keys().cloned());
        out.extend(inner.catalog.placements.keys().cloned());
        out.sort();
        out.dedup();
        out
    }

    /// Where the buckets placed on some sets are.
    pub fn placements(&self) -> BTreeMap<String, BucketPlacement> {
        self.inner.read().catalog.placements.clone()
    }

    /// Where the data of the buckets placed nowhere else is (None: on every set).
    pub fn home(&self) -> Option<BucketPlacement> {
        self.inner.read().catalog.home.clone()
    }

    /// The sets some microstore owns.
    pub fn owned_sets(&self) -> std::collections::BTreeSet<usize> {
        self.inner.read().catalog.owned_sets()
    }

    /// Records where the data of the buckets placed nowhere else is (None: on every set), stored through
    /// the saver first.
    pub fn set_home(&self, home: Option<BucketPlacement>) -> Result<(), String> {
        let save = |c: &Catalog| self.store(c);
        self.change(save, |c| {
            c.home = home;
            Ok(())
        })
    }

    /// Records where a bucket's data is (None: on every set), stored through the saver first.
    pub fn set_placement(&self, bucket: &str, placement: Option<BucketPlacement>) -> Result<(), String> {
        let save = |c: &Catalog| self.store(c);
        self.change(save, |c| {
            match placement {
                Some(p) => c.placements.insert(bucket.to_string(), p),
                None => c.placements.remove(bucket),
            };
            Ok(())
        })
    }

    /// Applies a change to the catalog: `save` stores the result first; if it fails nothing changes.
    fn change(
        &self,
        save: impl FnOnce(&Catalog) -> Result<(), String>,
        edit: impl FnOnce(&mut Catalog) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut inner = self.inner.write();
        let mut next = inner.catalog.clone();
        edit(&mut next)?;
        next.validate()?;
        let mut stored = next.clone();
        stored.microstores.remove(DEFAULT);
        save(&stored)?;
        inner.any_class = any_class(&next);
        inner.catalog = next;
        Ok(())
    }

    /// Creates a microstore; its workers come from the free pool, then from the default microstore.
    pub fn create(
        &self,
        name: &str,
        definition: Definition,
        save: impl FnOnce(&Catalog) -> Result<(), String>,
    ) -> Result<(), String> {
        validate_name(name)?;
        let mut manager = self.manager.lock();
        if self.inner.read().catalog.microstores.contains_key(name) {
            return Err(format!("microstore {name} exists"));
        }
        let owned = self.inner.read().catalog.owned_sets();
        if let Some(s) = definition.sets.iter().find(|s| owned.contains(s)) {
            return Err(format!("set {s} is another microstore's"));
        }
        let floor = manager.config().floor_workers;
        let want = definition.workers.max(floor);
        let short = want.saturating_sub(manager.free_workers());
        let released = manager.release(DEFAULT, short);
        if let Err(e) = manager.add(name, definition.target, want) {
            manager.grant(DEFAULT, released);
            return Err(e);
        }
        let created = self.change(save, |c| {
            c.microstores.insert(name.to_string(), Definition { workers: want, ..definition });
            Ok(())
        });
        if let Err(e) = created {
            manager.remove(name);
            manager.grant(DEFAULT, released);
            return Err(e);
        }
        let pool = WorkerPool::new(want, self.config.max_waiting, self.config.max_wait);
        let mut inner = self.inner.write();
        inner.pools.insert(name.to_string(), pool);
        inner.pools[DEFAULT].resize(manager.workers(DEFAULT).expect("the default microstore is held"));
        sync_io(&mut self.io.lock(), &mut inner, self.cpu_classes);
        Ok(())
    }

    /// Deletes a microstore: its buckets go back to automatic routing, its workers to the default one.
    pub fn delete(&self, name: &str, save: impl FnOnce(&Catalog) -> Result<(), String>) -> Result<(), String> {
        if name == DEFAULT {
            return Err("the default microstore cannot be deleted".into());
        }
        let mut manager = self.manager.lock();
        self.change(save, |c| {
            if c.microstores.remove(name).is_none() {
                return Err(format!("no microstore {name}"));
            }
            c.buckets.retain(|_, ms| ms != name);
            Ok(())
        })?;
        let mut inner = self.inner.write();
        self.drop_holding(&mut manager, &mut inner, name);
        inner.pools[DEFAULT].resize(manager.workers(DEFAULT).expect("the default microstore is held"));
        sync_io(&mut self.io.lock(), &mut inner, self.cpu_classes);
        Ok(())
    }

    /// A microstore's workers go back to the default one, its bandwidth cap and worker pool go (requests
    /// admitted there finish on their permits; new ones route elsewhere).
    fn drop_holding(&self, manager: &mut ResourceManager, inner: &mut Inner, name: &str) {
        let held = manager.remove(name).map(|h| h.workers).unwrap_or(0);
        manager.grant(DEFAULT, held);
        self.bandwidth.lock().forget(name);
        inner.pools.remove(name);
    }

    /// Takes a whole catalog (a cluster's, as its map has it): microstores it lacks are deleted, those it
    /// adds or defines otherwise are (re)created, each with the workers it names as far as the free pool and
    /// the default microstore's spare allow (at least the floor), its assignments and placements replace
    /// these. Refused, changing nothing, when the floors do not fit; `save` stores it first.
    pub fn replace_catalog(
        &self,
        mut next: Catalog,
        save: impl FnOnce(&Catalog) -> Result<(), String>,
    ) -> Result<(), String> {
        next.microstores.remove(DEFAULT);
        next.validate()?;
        let mut manager = self.manager.lock();
        let now = self.catalog();
        let gone: Vec<String> = now
            .microstores
            .iter()
            .filter(|(n, d)| next.microstores.get(*n) != Some(d))
            .map(|(n, _)| n.clone())
            .collect();
        let added: Vec<(&String, &Definition)> =
            next.microstores.iter().filter(|(n, d)| now.microstores.get(*n) != Some(d)).collect();
        // What each added one gets: planned before anything changes.
        let floor = manager.config().floor_workers;
        let freed: u32 = gone.iter().filter_map(|n| manager.workers(n)).sum();
        let default_spare = manager.workers(DEFAULT).expect("the default microstore is held") - floor;
        let mut available = manager.free_workers() + freed + default_spare;
        let mut grants = Vec::with_capacity(added.len());
        for (name, d) in &added {
            let want = d.workers.max(floor).min(available);
            if want < floor {
                return Err(format!("microstore {name} needs {floor} workers; {available} are left on this node"));
            }
            available -= want;
            grants.push(want);
        }
        self.change(save, |c| {
            let default = c.microstores.remove(DEFAULT);
            *c = next.clone();
            c.microstores.extend(default.map(|d| (DEFAULT.to_string(), d)));
            Ok(())
        })?;
        let mut inner = self.inner.write();
        for name in &gone {
            self.drop_holding(&mut manager, &mut inner, name);
        }
        for ((name, d), want) in added.into_iter().zip(grants) {
            let short = want.saturating_sub(manager.free_workers());
            manager.release(DEFAULT, short);
            manager.add(name, d.target, want).expect("planned to fit");
            inner.pools.insert(name.clone(), WorkerPool::new(want, self.config.max_waiting, self.config.max_wait));
        }
        inner.pools[DEFAULT].resize(manager.workers(DEFAULT).expect("the default microstore is held"));
        debug_assert_eq!(inner.pools.len(), manager.holdings().len());
        sync_io(&mut self.io.lock(), &mut inner, self.cpu_classes);
        Ok(())
    }

    /// Assigns a bucket by hand (Some) or back to automatic routing (None).
    pub fn assign(
        &self,
        bucket: &str,
        microstore: Option<&str>,
        save: impl FnOnce(&Catalog) -> Result<(), String>,
    ) -> Result<(), String> {
        self.change(save, |c| {
            match microstore {
                Some(ms) if !c.microstores.contains_key(ms) => return Err(format!("no microstore {ms}")),
                Some(ms) => {
                    c.buckets.insert(bucket.to_string(), ms.to_string());
                }
                None => {
                    c.buckets.remove(bucket);
                }
            }
            Ok(())
        })
    }

    /// One round: buckets are classified, each microstore's round is observed and, when adapting, workers
    /// move toward those missing their targets.
    pub fn round(&self) -> RoundReport {
        let now_ms = self.now_ms();
        let class_changes = self.monitor.evaluate(now_ms);
        let elapsed_us = {
            let mut last = self.last_round.lock();
            let e = last.elapsed().as_micros().max(1) as u64;
            *last = Instant::now();
            e
        };
        let mut manager = self.manager.lock();
        let pools: Vec<(String, Arc<WorkerPool>)> =
            self.inner.read().pools.iter().map(|(n, p)| (n.clone(), p.clone())).collect();
        let mut observations = BTreeMap::new();
        for (name, pool) in &pools {
            let r = pool.take_round();
            let workers = u64::from(pool.workers().max(1));
            observations.insert(
                name.clone(),
                Observation {
                    requests: r.requests,
                    latency_ms_p99: r.latency_us.quantile(0.99).map(|us| us as f64 / 1000.0),
                    throughput_mib_s: r.bytes as f64 / (1 << 20) as f64 / (elapsed_us as f64 / 1e6),
                    busy: (r.busy_us as f64 / (workers * elapsed_us) as f64).min(1.0),
                    waited: r.waited,
                },
            );
        }
        let (decisions, bandwidth) = if self.config.adapt {
            let targets = manager.holdings().iter().map(|(n, h)| (n.clone(), h.target)).collect();
            (manager.decide(&observations), self.bandwidth.lock().decide(&targets, &observations))
        } else {
            (vec![], vec![])
        };
        let (sets, sets_error) = if self.config.adapt && self.config.sets.enabled && self.set_count > 1 {
            self.move_sets(&manager.target_verdicts(&observations))
        } else {
            (vec![], None)
        };
        let io = if self.config.adapt && self.config.io.enabled {
            self.io.lock().decide(manager.target_verdicts(&observations), &observations)
        } else {
            vec![]
        };
        let caps = self.bandwidth.lock();
        for (name, pool) in &pools {
            if let Some(w) = manager.workers(name) {
                pool.resize(w);
            }
            pool.pacer().set_rate(caps.cap_mib_s(name).map(|mib| (mib * (1u64 << 20) as f64) as u64));
        }
        drop(caps);
        let mut log = self.decisions.lock();
        let all = decisions.iter().cloned().map(AnyDecision::Workers);
        let all = all.chain(bandwidth.iter().cloned().map(AnyDecision::Bandwidth));
        let all = all.chain(io.iter().cloned().map(AnyDecision::Io));
        for d in all.chain(sets.iter().cloned().map(AnyDecision::Sets)) {
            if log.len() == DECISIONS_KEPT {
                log.pop_front();
            }
            log.push_back(LoggedDecision { at_ms: now_ms, decision: d });
        }
        *self.last_observations.lock() = observations.clone();
        RoundReport { class_changes, decisions, bandwidth, sets, sets_error, io, observations }
    }

    /// The set planner's round: the sets it moves are stored in the catalog (through the saver; all or
    /// none), and the buckets' moves follow from there.
    fn move_sets(&self, verdicts: &BTreeMap<String, crate::manager::Verdict>) -> (Vec<SetDecision>, Option<String>) {
        let (holdings, moving) = {
            let inner = self.inner.read();
            (self.set_holdings(&inner.catalog), !self.placement_settled(&inner))
        };
        let decisions = self.planner.lock().decide(&holdings, verdicts, moving);
        if decisions.is_empty() {
            return (decisions, None);
        }
        let after = crate::sets::apply(&holdings, &decisions);
        let save = |c: &Catalog| self.store(c);
        let stored = self.change(save, |c| {
            for (name, sets) in after.iter().filter(|(n, _)| n.as_str() != DEFAULT) {
                let d = c.microstores.get_mut(name).ok_or_else(|| format!("microstore {name} is gone"))?;
                d.sets = sets.clone();
            }
            Ok(())
        });
        match stored {
            Ok(()) => (decisions, None),
            Err(e) => (vec![], Some(e)),
        }
    }

    /// The sets of each microstore taking part in set moves: those owning sets, and the default one holding
    /// the sets no microstore owns (left out when microstores own every set: it shares them all).
    fn set_holdings(&self, catalog: &Catalog) -> BTreeMap<String, Vec<usize>> {
        let mut out: BTreeMap<String, Vec<usize>> = catalog
            .microstores
            .iter()
            .filter(|(n, d)| n.as_str() != DEFAULT && !d.sets.is_empty())
            .map(|(n, d)| (n.clone(), d.sets.clone()))
            .collect();
        let owned = catalog.owned_sets();
        if owned.len() < self.set_count {
            out.insert(DEFAULT.to_string(), home_for(&owned, self.set_count));
        }
        out
    }

    /// Whether every bucket's data and the home are where their microstores' sets say, with no move under
    /// way (the same rule the buckets' moves follow: a bucket of no microstore's sets is on the home).
    fn placement_settled(&self, inner: &Inner) -> bool {
        let c = &inner.catalog;
        let wanted_home = home_for(&c.owned_sets(), self.set_count);
        let home = match &c.home {
            Some(h) if h.moving_from.is_some() => return false,
            Some(h) => h.sets.clone(),
            None => (0..self.set_count).collect(),
        };
        if home != wanted_home || c.placements.values().any(|p| p.moving_from.is_some()) {
            return false;
        }
        self.candidates_in(inner).iter().all(|b| {
            let sets = &c.microstores[route_in(inner, &self.monitor, Some(b))].sets;
            let wanted = if sets.is_empty() { &home } else { sets };
            c.placements.get(b).map_or(&home, |p| &p.sets) == wanted
        })
    }

    pub fn status(&self) -> Status {
        let now_ms = self.now_ms();
        let manager = self.manager.lock();
        let inner = self.inner.read();
        let observed = self.last_observations.lock().clone();
        let caps = self.bandwidth.lock();
        let io = self.io.lock();
        let microstores = inner
            .catalog
            .microstores
            .iter()
            .map(|(name, d)| {
                let pool = &inner.pools[name];
                let served = io.stats(name).unwrap_or_default();
                MicrostoreStatus {
                    name: name.clone(),
                    target: manager.holdings().get(name).map(|h| h.target).unwrap_or(d.target),
                    class: d.class,
                    sets: d.sets.clone(),
                    workers: pool.workers(),
                    bandwidth_cap_mib_s: caps.cap_mib_s(name),
                    io_points: io.points(name),
                    io_served_bytes: served.served_bytes,
                    io_waited_ios: served.waited_ios,
                    io_wait_ms: served.wait_us as f64 / 1000.0,
                    cpu_bulk: self.cpu_classes
                        && inner.share_ids.get(name).is_some_and(|id| mosaic_store::is_bulk(*id)),
                    in_use: pool.in_use(),
                    waiting: pool.waiting(),
                    refused: pool.refused(),
                    assigned: inner
                        .catalog
                        .buckets
                        .iter()
                        .filter(|(_, ms)| *ms == name)
                        .map(|(b, _)| b.clone())
                        .collect(),
                    last_round: observed.get(name).cloned(),
                }
            })
            .collect();
        let buckets = self
            .monitor
            .status(now_ms)
            .into_iter()
            .map(|watched| {
                let microstore = route_in(&inner, &self.monitor, Some(&watched.bucket)).to_string();
                let assigned = inner.catalog.buckets.contains_key(&watched.bucket);
                BucketRoute { watched, microstore, assigned }
            })
            .collect();
        Status {
            microstores,
            free_workers: manager.free_workers(),
            buckets,
            decisions: self.decisions.lock().iter().cloned().collect(),
            adapt: self.config.adapt,
            placements: inner.catalog.placements.clone(),
            home: inner.catalog.home.clone(),
            bulk_cpu_tasks: mosaic_store::bulk_tasks_total(),
            bulk_cpu_connections: mosaic_store::bulk_connections_total(),
        }
    }
}

/// Gives the IO planner the microstores of the catalog and takes their share ids; with `cpu_classes`, sets
/// the process's bulk shares from them.
fn sync_io(io: &mut IoPlanner, inner: &mut Inner, cpu_classes: bool) {
    let targets = inner.catalog.microstores.iter().map(|(n, d)| (n.clone(), d.target)).collect();
    io.sync(&targets, DEFAULT);
    inner.share_ids = io.share_ids();
    if cpu_classes && let Err(e) = mosaic_store::set_bulk_shares(bulk_shares(inner)) {
        tracing::warn!(error = %e, "the bulk CPU class is unchanged");
    }
}

/// The shares of the microstores whose heavy CPU work runs in the bulk class: those judged on throughput,
/// while one judged on latency is there to yield to (alone, a class would only yield to upkeep). A
/// microstore without a share (the IO points ran out) runs unshared, at the default priority.
fn bulk_shares(inner: &Inner) -> Vec<mosaic_store::ShareId> {
    let microstores = &inner.catalog.microstores;
    if !microstores.values().any(|d| matches!(d.target, Target::LatencyMsP99(_))) {
        return Vec::new();
    }
    let bulk = microstores.iter().filter(|(_, d)| matches!(d.target, Target::ThroughputMibS(_)));
    bulk.filter_map(|(name, _)| inner.share_ids.get(name).copied()).collect()
}

/// The microstore of a bucket: assigned by hand, else the first (by name) serving its class, else default.
fn route_in<'a>(inner: &'a Inner, monitor: &Monitor, bucket: Option<&str>) -> &'a str {
    let Some(bucket) = bucket else { return DEFAULT };
    if let Some(ms) = inner.catalog.buckets.get(bucket) {
        return ms;
    }
    if !inner.any_class {
        return DEFAULT;
    }
    let Some(class) = monitor.class_of(bucket) else { return DEFAULT };
    inner.catalog.microstores.iter().find(|(_, d)| d.class == Some(class)).map(|(n, _)| n.as_str()).unwrap_or(DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{OpKind, WindowConfig};

    fn config() -> Config {
        Config {
            monitor: MonitorConfig {
                window: WindowConfig { slot_ms: 60_000, slots: 2 },
                classify: crate::ClassifyConfig { min_requests: 5, ..Default::default() },
                max_buckets: 64,
            },
            manager: ManagerConfig { total_workers: 32, floor_workers: 2, ..Default::default() },
            ..Default::default()
        }
    }

    fn ok(_: &Catalog) -> Result<(), String> {
        Ok(())
    }

    fn small(target_ms: f64, workers: u32) -> Definition {
        Definition { target: Target::LatencyMsP99(target_ms), class: Some(Class::SmallWrite), workers, sets: vec![] }
    }

    #[test]
    fn a_store_that_never_asks_has_one_default_microstore_with_every_worker() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        let s = m.status();
        assert_eq!(s.microstores.len(), 1);
        assert_eq!((s.microstores[0].name.as_str(), s.microstores[0].workers), (DEFAULT, 32));
        assert_eq!(m.route(Some("any")), DEFAULT);
        assert_eq!(m.catalog(), Catalog::default());
    }

    #[test]
    fn buckets_route_by_hand_then_by_class_then_to_the_default() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("games", small(10.0, 8), ok).unwrap();
        assert_eq!(m.status().microstores.iter().map(|s| s.workers).collect::<Vec<_>>(), vec![24, 8]);
        for _ in 0..10 {
            m.record("scores", Sample { op: OpKind::Put, size_bytes: 4 << 10, latency_us: 100 });
        }
        assert_eq!(m.route(Some("scores")), DEFAULT, "not classified before a round");
        let r = m.round();
        assert_eq!(r.class_changes, vec![("scores".to_string(), Class::SmallWrite)]);
        assert_eq!(m.route(Some("scores")), "games");
        m.assign("scores", Some(DEFAULT), ok).unwrap();
        assert_eq!(m.route(Some("scores")), DEFAULT);
        m.assign("scores", None, ok).unwrap();
        assert_eq!(m.route(Some("scores")), "games");
        m.assign("photos", Some("games"), ok).unwrap();
        assert!(m.assign("photos", Some("nothing"), ok).is_err());
        m.delete("games", ok).unwrap();
        assert_eq!(m.route(Some("photos")), DEFAULT);
        assert_eq!(m.status().microstores[0].workers, 32);
        assert!(m.delete(DEFAULT, ok).is_err());
    }

    #[test]
    fn a_change_whose_save_fails_changes_nothing() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        let fail = |_: &Catalog| Err("disk full".to_string());
        assert_eq!(m.create("games", small(10.0, 8), fail), Err("disk full".into()));
        assert_eq!(m.status().microstores.len(), 1);
        assert_eq!(m.status().microstores[0].workers, 32);
        m.create("games", small(10.0, 8), ok).unwrap();
        assert!(m.assign("b", Some("games"), fail).is_err());
        assert_eq!(m.route(Some("b")), DEFAULT);
        assert!(m.delete("games", fail).is_err());
        assert_eq!(m.status().microstores.len(), 2);
    }

    #[test]
    fn names_and_limits_are_checked() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        for bad in ["", "Games", "-x", &"a".repeat(MAX_NAME_BYTES + 1), "a b"] {
            assert!(m.create(bad, small(10.0, 2), ok).is_err(), "{bad:?}");
        }
        assert!(m.create(&"a".repeat(MAX_NAME_BYTES), small(10.0, 2), ok).is_ok());
        assert!(m.create("games", small(10.0, 2), ok).is_ok());
        assert!(m.create("games", small(10.0, 2), ok).is_err(), "exists");
        // More workers than there are (the default keeps its floor).
        assert!(m.create("big", small(10.0, 1_000), ok).is_err());
        assert_eq!(m.status().microstores.iter().map(|s| s.workers).sum::<u32>(), 32);
        let mut c = Catalog::default();
        c.buckets.insert("b".into(), "ghost".into());
        assert!(Microstores::new(config(), c).is_err());
    }

    #[test]
    fn a_stored_catalog_comes_back_as_it_was() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("games", small(10.0, 8), ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        let stored = m.catalog();
        let again = Microstores::new(config(), stored.clone()).unwrap();
        assert_eq!(again.catalog(), stored);
        assert_eq!(again.route(Some("scores")), "games");
        assert_eq!(again.status().microstores.iter().map(|s| s.workers).collect::<Vec<_>>(), vec![24, 8]);
    }

    #[test]
    fn a_microstores_sets_place_its_buckets_and_placements_are_kept_and_checked() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("games", Definition { sets: vec![1, 2], ..small(10.0, 8) }, ok).unwrap();
        m.create("shared", Definition { class: None, ..small(10.0, 2) }, ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        m.assign("logs", Some("shared"), ok).unwrap();
        assert_eq!(m.wanted_sets("scores"), Some(vec![1, 2]));
        assert_eq!(m.wanted_sets("logs"), None, "a microstore without sets shares every set");
        assert_eq!(m.wanted_sets("anything"), None);
        let moving = BucketPlacement { sets: vec![1, 2], moving_from: Some(vec![0, 1, 2, 3]) };
        m.set_placement("scores", Some(moving.clone())).unwrap();
        m.set_placement("old", Some(BucketPlacement { sets: vec![3], moving_from: None })).unwrap();
        m.record("watched", Sample { op: OpKind::Get, size_bytes: 1, latency_us: 1 });
        assert_eq!(m.placement_candidates(), ["logs", "old", "scores", "watched"]);
        assert_eq!(m.status().placements["scores"], moving);
        assert_eq!(m.status().microstores.iter().find(|s| s.name == "games").unwrap().sets, [1, 2]);
        let again = Microstores::new(config(), m.catalog()).unwrap();
        assert_eq!(again.placements(), m.placements(), "placements are stored with the catalog");
        m.set_placement("old", None).unwrap();
        assert!(!m.placements().contains_key("old"));
        // Sets out of order, repeated, past the limit, or none for a placement are refused.
        for bad in [vec![2, 1], vec![1, 1], vec![MAX_SETS]] {
            assert!(m.create("bad", Definition { sets: bad.clone(), ..small(10.0, 1) }, ok).is_err(), "{bad:?}");
            assert!(m.set_placement("b", Some(BucketPlacement { sets: bad, moving_from: None })).is_err());
        }
        assert!(m.set_placement("b", Some(BucketPlacement { sets: vec![], moving_from: None })).is_err());
        let from_none = BucketPlacement { sets: vec![0], moving_from: Some(vec![]) };
        assert!(m.set_placement("b", Some(from_none)).is_err());
        assert!(!m.placements().contains_key("b"), "a refused placement changes nothing");
        // The sets microstores own; the home of the others kept and checked as a placement is.
        assert_eq!(m.owned_sets().into_iter().collect::<Vec<_>>(), [1, 2]);
        let home = BucketPlacement { sets: vec![0, 3], moving_from: Some(vec![0, 1, 2, 3]) };
        m.set_home(Some(home.clone())).unwrap();
        assert_eq!((m.home(), m.status().home), (Some(home.clone()), Some(home.clone())));
        assert_eq!(Microstores::new(config(), m.catalog()).unwrap().home(), Some(home.clone()), "stored");
        assert!(m.set_home(Some(BucketPlacement { sets: vec![3, 0], moving_from: None })).is_err());
        assert!(m.set_home(Some(BucketPlacement { sets: vec![], moving_from: None })).is_err());
        assert_eq!(m.home(), Some(home), "a refused home changes nothing");
        m.set_home(None).unwrap();
        assert_eq!(m.home(), None);
    }

    #[tokio::test]
    async fn a_starved_microstore_gains_workers_in_a_round() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("games", small(10.0, 2), ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        for _ in 0..50 {
            let a = m.admit(Some("scores")).await.unwrap();
            a.finish(1_000, 50_000);
        }
        for _ in 0..50 {
            let a = m.admit(Some("logs")).await.unwrap();
            a.finish(1_000, 100);
        }
        let r = m.round();
        let d: Vec<_> =
            r.decisions.iter().map(|d| (d.microstore.as_str(), d.workers_before, d.workers_after)).collect();
        assert_eq!(d, vec![(DEFAULT, 30, 26), ("games", 2, 6)], "{:?}", r.decisions);
        // No drive IO of its waited (there are no drives here): its points stay.
        assert_eq!(r.io, vec![]);
        let status = m.status();
        assert_eq!(status.decisions.len(), 2);
        let games = status.microstores.iter().find(|s| s.name == "games").unwrap();
        assert_eq!(games.io_points, Some(100));
    }

    #[tokio::test]
    async fn requests_run_in_their_microstore_s_io_share_and_its_weight_follows_the_points() {
        let shares = mosaic_store::IoShares::new(1 << 20, 10);
        let m = Microstores::new(config(), Catalog::default()).unwrap().with_io_shares(shares.clone());
        assert!(!shares.is_active(), "one microstore: drives do not schedule");
        assert_eq!(m.admit(Some("logs")).await.unwrap().io_share(), m.admit(None).await.unwrap().io_share());
        m.create("games", small(10.0, 2), ok).unwrap();
        assert!(shares.is_active());
        m.assign("scores", Some("games"), ok).unwrap();
        let games = m.admit(Some("scores")).await.unwrap().io_share();
        let default = m.admit(Some("logs")).await.unwrap().io_share();
        assert!(games != default && games != mosaic_store::UNSHARED && default != mosaic_store::UNSHARED);
        assert_eq!(shares.stats(games).unwrap().weight, 100);
        assert_eq!(shares.stats(default).unwrap().weight, 9_900);
        for _ in 0..50 {
            m.admit(Some("scores")).await.unwrap().finish(1_000, 50_000);
            m.admit(Some("logs")).await.unwrap().finish(1_000, 100);
        }
        // Slow, and its IO waited for the drives: it gains points from the default one's slack.
        shares.entry(games).record(4096, Some(2_000));
        let r = m.round();
        let io: Vec<_> = r.io.iter().map(|d| (d.microstore.as_str(), d.io_points_before, d.io_points_after)).collect();
        assert_eq!(io, vec![(DEFAULT, 9_900, 9_890), ("games", 100, 110)], "{:?}", r.io);
        assert_eq!(shares.stats(games).unwrap().weight, 110);
        m.delete("games", ok).unwrap();
        assert!(shares.stats(games).is_none(), "a deleted microstore's share goes");
        assert!(!shares.is_active());
        assert_eq!(m.admit(Some("scores")).await.unwrap().io_share(), default);
    }

    /// A microstore judged on throughput runs in the bulk CPU class while one judged on latency is there
    /// (the default one, 100 ms); a bad nice is refused; a registry not told to set classes sets none.
    /// (One test: the class is process-wide, and no other test here sets it.)
    #[tokio::test]
    async fn a_throughput_microstore_beside_a_latency_one_runs_in_the_bulk_cpu_class() {
        let large = Definition { target: Target::ThroughputMibS(100.0), class: None, workers: 2, sets: vec![] };
        let bad = Microstores::new(Config { bulk_nice: 20, ..config() }, Catalog::default()).unwrap();
        assert!(bad.with_cpu_classes().is_err(), "nice 20 is out of range");
        let scratch = Microstores::new(config(), Catalog::default()).unwrap();
        scratch.create("big", large.clone(), ok).unwrap();
        scratch.assign("b", Some("big"), ok).unwrap();
        let big = scratch.admit(Some("b")).await.unwrap().io_share();
        assert!(!mosaic_store::is_bulk(big), "a registry not told to set classes sets none");
        let default_throughput = Config { default_target: Target::ThroughputMibS(50.0), ..config() };
        let m = Microstores::new(default_throughput, Catalog::default()).unwrap().with_cpu_classes().unwrap();
        m.create("big", large.clone(), ok).unwrap();
        m.assign("b", Some("big"), ok).unwrap();
        let share = m.admit(Some("b")).await.unwrap().io_share();
        assert_eq!(share, big, "a name's share is the same in every registry");
        assert!(!mosaic_store::is_bulk(share), "no microstore is judged on latency: nothing to yield to");
        m.create("games", small(10.0, 2), ok).unwrap();
        m.assign("g", Some("games"), ok).unwrap();
        let games = m.admit(Some("g")).await.unwrap().io_share();
        assert!(mosaic_store::is_bulk(share) && !mosaic_store::is_bulk(games));
        m.delete("games", ok).unwrap();
        assert!(!mosaic_store::is_bulk(share), "the latency one gone: back to the default class");
        let off = Microstores::new(Config { bulk_nice: 0, ..config() }, Catalog::default()).unwrap();
        let off = off.with_cpu_classes().unwrap();
        off.create("big", large, ok).unwrap();
        assert!(!mosaic_store::is_bulk(share), "bulk_nice = 0: no classes");
    }

    #[test]
    fn a_whole_catalog_replaces_the_microstores_and_their_workers_follow() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("games", small(10.0, 8), ok).unwrap();
        m.create("logs", small(50.0, 4), ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        let mut next = m.catalog();
        next.microstores.remove("logs");
        next.microstores.insert(
            "photos".into(),
            Definition { target: Target::ThroughputMibS(50.0), class: None, workers: 6, sets: vec![] },
        );
        // Defined otherwise: recreated with what it names now.
        next.microstores.get_mut("games").unwrap().workers = 10;
        next.buckets.insert("pics".into(), "photos".into());
        let saved = parking_lot::Mutex::new(None);
        m.replace_catalog(next.clone(), |c| {
            *saved.lock() = Some(c.clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(m.catalog(), next);
        assert_eq!(saved.lock().as_ref(), Some(&next), "stored first");
        let workers: BTreeMap<String, u32> = m.status().microstores.into_iter().map(|s| (s.name, s.workers)).collect();
        assert_eq!(workers, BTreeMap::from([(DEFAULT.into(), 16), ("games".into(), 10), ("photos".into(), 6)]));
        assert_eq!(m.route(Some("pics")), "photos");
        assert_eq!(m.route(Some("scores")), "games");
        // The same catalog again changes nothing; one whose floors do not fit changes nothing either.
        m.replace_catalog(next.clone(), ok).unwrap();
        assert_eq!(m.status().microstores.iter().map(|s| s.workers).sum::<u32>(), 32);
        let mut crowded = next.clone();
        for i in 0..20 {
            crowded.microstores.insert(format!("m{i}"), small(10.0, 2));
        }
        assert!(m.replace_catalog(crowded, ok).unwrap_err().contains("workers"));
        assert_eq!(m.catalog(), next);
        // Workers asked past what is left are cut to it.
        let mut greedy = next.clone();
        greedy.microstores.get_mut("photos").unwrap().workers = 1_000;
        m.replace_catalog(greedy, ok).unwrap();
        let workers: BTreeMap<String, u32> = m.status().microstores.into_iter().map(|s| (s.name, s.workers)).collect();
        assert_eq!(workers, BTreeMap::from([(DEFAULT.into(), 2), ("games".into(), 10), ("photos".into(), 20)]));
        let fail = |_: &Catalog| Err("disk full".to_string());
        assert_eq!(m.replace_catalog(Catalog::default(), fail), Err("disk full".into()));
        assert_eq!(m.status().microstores.len(), 3);
    }

    #[tokio::test]
    async fn a_starved_microstore_takes_a_set_from_the_default_once_the_data_is_settled() {
        let sets = crate::sets::SetsConfig { patience_rounds: 2, cooldown_rounds: 0, ..Default::default() };
        let saved = Arc::new(Mutex::new(None));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (keep, failing) = (saved.clone(), fail.clone());
        let saver: Saver = Box::new(move |c| {
            if failing.load(std::sync::atomic::Ordering::Relaxed) {
                return Err("disk full".into());
            }
            *keep.lock() = Some(c.clone());
            Ok(())
        });
        let m =
            Microstores::new(Config { sets, ..config() }, Catalog::default()).unwrap().with_saver(saver).with_sets(4);
        m.create("games", Definition { sets: vec![3], ..small(10.0, 2) }, ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        let starve = || async {
            for _ in 0..50 {
                m.admit(Some("scores")).await.unwrap().finish(1_000, 50_000);
            }
        };
        // The home is still on every set (it has not moved off set 3): nothing moves, however long.
        for _ in 0..4 {
            starve().await;
            assert_eq!(m.round().sets, vec![]);
        }
        m.set_home(Some(BucketPlacement { sets: vec![0, 1, 2], moving_from: None })).unwrap();
        m.set_placement("scores", Some(BucketPlacement { sets: vec![3], moving_from: None })).unwrap();
        starve().await;
        assert_eq!(m.round().sets, vec![], "patience");
        // A decision whose save fails moves nothing and says why; patience starts over.
        fail.store(true, std::sync::atomic::Ordering::Relaxed);
        starve().await;
        let r = m.round();
        assert_eq!((r.sets, r.sets_error.as_deref()), (vec![], Some("disk full")));
        assert_eq!(m.catalog().microstores["games"].sets, [3]);
        fail.store(false, std::sync::atomic::Ordering::Relaxed);
        starve().await;
        assert_eq!(m.round().sets, vec![], "patience again");
        starve().await;
        let r = m.round();
        assert_eq!(
            r.sets.iter().map(|d| (d.set, d.from.as_str(), d.to.as_str())).collect::<Vec<_>>(),
            [(2, DEFAULT, "games")]
        );
        assert_eq!(m.catalog().microstores["games"].sets, [2, 3]);
        assert_eq!(saved.lock().as_ref().unwrap().microstores["games"].sets, [2, 3], "stored");
        assert_eq!(m.wanted_sets("scores"), Some(vec![2, 3]));
        assert!(m.status().decisions.iter().any(|d| matches!(&d.decision, AnyDecision::Sets(s) if s.set == 2)));
        // Its bucket and the home must move now: until they did, no other set moves.
        for _ in 0..4 {
            starve().await;
            assert_eq!(m.round().sets, vec![]);
        }
        // Settled (as the buckets' moves record it), the next decision asks two sets; the default gives one
        // (it keeps its floor).
        m.set_home(Some(BucketPlacement { sets: vec![0, 1], moving_from: None })).unwrap();
        m.set_placement("scores", Some(BucketPlacement { sets: vec![2, 3], moving_from: None })).unwrap();
        let mut moved = vec![];
        for _ in 0..4 {
            starve().await;
            moved.extend(m.round().sets.into_iter().map(|d| d.set));
        }
        assert_eq!(moved, [1]);
        assert_eq!(m.catalog().microstores["games"].sets, [1, 2, 3]);
        // A microstore may not own another's set.
        assert!(m.create("other", Definition { sets: vec![3], ..small(10.0, 2) }, ok).unwrap_err().contains("set 3"));
    }

    #[tokio::test]
    async fn a_missed_latency_target_caps_the_bandwidth_of_a_large_microstore_that_moves_more_than_its_own() {
        let m = Microstores::new(config(), Catalog::default()).unwrap();
        m.create("small", small(10.0, 8), ok).unwrap();
        let large = Definition {
            target: Target::ThroughputMibS(1.0),
            class: Some(Class::LargeWrite),
            workers: 4,
            sets: vec![],
        };
        m.create("large", large, ok).unwrap();
        m.assign("s", Some("small"), ok).unwrap();
        m.assign("l", Some("large"), ok).unwrap();
        for _ in 0..30 {
            m.admit(Some("s")).await.unwrap().finish(1_000, 50_000);
        }
        for _ in 0..4 {
            m.admit(Some("l")).await.unwrap().finish(256 << 20, 500_000);
        }
        let r = m.round();
        assert_eq!(r.bandwidth.len(), 1, "{r:?}");
        assert_eq!(r.bandwidth[0].microstore, "large");
        let cap = m.status().microstores.iter().find(|s| s.name == "large").unwrap().bandwidth_cap_mib_s;
        assert!(cap.is_some_and(|c| c >= 1.0), "{cap:?}");
        assert!(m.admit(Some("l")).await.unwrap().pacer().is_some());
        assert!(m.admit(Some("s")).await.unwrap().pacer().is_none());
        // Deleting the microstore forgets its cap.
        m.delete("large", ok).unwrap();
        m.create(
            "large",
            Definition { target: Target::ThroughputMibS(1.0), class: None, workers: 4, sets: vec![] },
            ok,
        )
        .unwrap();
        assert_eq!(m.status().microstores.iter().find(|s| s.name == "large").unwrap().bandwidth_cap_mib_s, None);
    }

    #[test]
    fn a_deleted_bucket_loses_its_window_and_its_assignment() {
        let saved = std::sync::Arc::new(Mutex::new(None));
        let keep = saved.clone();
        let saver: Saver = Box::new(move |c: &Catalog| {
            *keep.lock() = Some(c.clone());
            Ok(())
        });
        let m = Microstores::new(config(), Catalog::default()).unwrap().with_saver(saver);
        m.create("games", small(10.0, 8), ok).unwrap();
        m.assign("scores", Some("games"), ok).unwrap();
        m.record("scores", Sample { op: OpKind::Put, size_bytes: 1, latency_us: 1 });
        m.bucket_deleted("scores").unwrap();
        assert_eq!(m.route(Some("scores")), DEFAULT);
        assert!(m.status().buckets.is_empty());
        assert!(saved.lock().as_ref().is_some_and(|c| c.buckets.is_empty()));
        // A bucket without an assignment stores nothing.
        *saved.lock() = None;
        m.bucket_deleted("other").unwrap();
        assert!(saved.lock().is_none());
    }

    #[test]
    fn a_catalog_at_its_limits_is_valid_and_past_them_refused() {
        let mut c = Catalog::default();
        for i in 0..MAX_MICROSTORES {
            c.microstores.insert(format!("m{i}"), small(10.0, 2));
        }
        for i in 0..MAX_ASSIGNMENTS {
            c.buckets.insert(format!("b{i}"), "m0".to_string());
        }
        assert_eq!(c.validate(), Ok(()));
        let mut more = c.clone();
        more.microstores.insert("one-more".into(), small(10.0, 2));
        assert!(more.validate().unwrap_err().contains("microstores"));
        c.buckets.insert("one-more".into(), "m0".into());
        assert!(c.validate().unwrap_err().contains("assigned"));
    }
}
