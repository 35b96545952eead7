//! `mosaic server`: open (or create) the data directory, serve S3 and the admin port, and shut down cleanly
//! on SIGINT/SIGTERM (a second signal exits at once).

use crate::admin_server::{self, AdminState};
use crate::bucket_moves::SetPool;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::datadir::{self, Credentials, State};
use crate::drives::Drives;
use mosaic_engine::EngineConfig;
use mosaic_layer::{ObjectLayer, S3Semantics, SemanticsConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

fn env_credentials() -> Result<Option<Credentials>, String> {
    match (std::env::var("MOSAIC_ACCESS_KEY").ok(), std::env::var("MOSAIC_SECRET_KEY").ok()) {
        (Some(a), Some(s)) => Ok(Some(Credentials { access_key: a, secret_key: s })),
        (None, None) => Ok(None),
        _ => Err("set both MOSAIC_ACCESS_KEY and MOSAIC_SECRET_KEY, or neither".into()),
    }
}

/// glibc gives every thread that allocates its own arena (up to 8 per core), and freed megabyte-sized
/// request buffers stay resident in each of them. A few shared arenas bound that retention; the server's
/// allocation rate is far below where arena contention matters.
fn bound_malloc_retention() {
    const ARENAS_MAX: libc::c_int = 2;
    // SAFETY: mallopt only changes allocator tuning; called once at start before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS_MAX);
    }
}

/// Raises the soft limit of open descriptors to the hard limit (at most 1,048,576): connections, RocksDB's
/// files and the pages large reads keep pinned (one descriptor each, bounded by a quarter of this limit)
/// all take descriptors. A limit that cannot be raised stays as it is.
fn raise_descriptor_limit() {
    const MOST: libc::rlim_t = 1 << 20;
    // SAFETY: getrlimit and setrlimit read and write the struct we pass; called once at start.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return;
        }
        let want = l.rlim_max.min(MOST);
        if l.rlim_cur < want {
            l.rlim_cur = want;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Memtables of all drives' KV stores together, when a node has several drives (one drive keeps its own
/// 96 MiB budget).
const NODE_MEMTABLE_BYTES: usize = 192 << 20;
/// Least metadata or page cache a drive gets when the node's is split between drives (unless the node's
/// is smaller, or off).
const MIN_DRIVE_CACHE_BYTES: usize = 2 << 20;

pub fn run(cfg: Config) -> Result<(), String> {
    bound_malloc_retention();
    raise_descriptor_limit();
    crate::logging::init(cfg.log_format, &cfg.log_level);
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let started = Instant::now();
    // The caches are the node's: with several drives they are shared (the KV block cache and memtables) or
    // split (the metadata and page caches), so that more drives do not multiply the memory.
    let drives_n = cfg.drives.len().max(1);
    let kv_memory =
        (drives_n > 1).then(|| mosaic_engine::KvMemory::new(cfg.kv_cache_bytes as usize, NODE_MEMTABLE_BYTES));
    let engine_cfg = EngineConfig {
        inline_max_bytes: cfg.inline_max_bytes,
        kv_block_cache_bytes: cfg.kv_cache_bytes as usize,
        meta_cache_bytes: (cfg.meta_cache_bytes as usize / drives_n)
            .max(MIN_DRIVE_CACHE_BYTES.min(cfg.meta_cache_bytes as usize)),
        page_cache_bytes: (cfg.page_cache_bytes as usize / drives_n)
            .max(MIN_DRIVE_CACHE_BYTES.min(cfg.page_cache_bytes as usize)),
        page_cache_reads: cfg.page_cache_reads,
        verified_cache_bytes: cfg.verified_cache_bytes / drives_n as u64,
        // Segments of large reads are at least 256 KiB; a quarter of a drive's bytes in 1 MiB chunks.
        verified_cache_entries: (cfg.verified_cache_bytes / drives_n as u64 / (256 << 10)) as usize,
        scrub_bytes_per_s: cfg.scrub_bytes_per_s,
        scrub_pass_interval: cfg.scrub_interval,
        commit_gather: cfg.commit_gather,
        ..Default::default()
    };
    let creds_env = env_credentials()?;
    // The node's drive IO shared among microstores (inactive while only the default one exists).
    let io_shares = (cfg.microstores_enabled && cfg.microstores.io.enabled).then(|| {
        let io = &cfg.microstores.io;
        mosaic_store::IoShares::new(io.in_flight_max_bytes, io.unshared_points)
    });
    let max_op_data_bytes = engine_cfg.max_op_data_bytes as u64;
    mosaic_engine::set_background_io_idle(cfg.background_io_idle);
    // Before the drives open: the first background drive call (recovery) starts the class's threads at the
    // nice they keep.
    mosaic_store::set_background_cpu_class(cfg.background_cpu_class);
    if cfg.microstores.bulk_nice > 0 {
        mosaic_store::set_bulk_nice(cfg.microstores.bulk_nice)?;
    }
    let drive_cfg = datadir::DriveConfig {
        paths: cfg.drives.clone(),
        erasure: cfg.erasure,
        max_bytes: cfg.drive_size_bytes,
        preallocate: cfg.drive_preallocate,
        engine: engine_cfg,
        io_engine: cfg.io_engine,
        simulate_power_loss: cfg.simulate_power_loss,
        faults: cfg.fault_injection.then(Default::default),
        kv_memory,
        cluster_node: cfg.cluster.is_some(),
        io_shares: io_shares.clone(),
    };
    let opened = datadir::open_store(&cfg.data_dir, &drive_cfg)?;
    match opened.state {
        State::Formatted => tracing::info!(dir = %cfg.data_dir.display(), "formatted a new data directory"),
        State::Existing => tracing::info!(dir = %cfg.data_dir.display(), "opened the data directory"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(cfg.worker_threads)
        .thread_name("mosaic-io")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let set_cfg = mosaic_erasure::SetConfig {
        geometry: datadir::geometry_of(&opened.layout),
        inline_max_bytes: cfg.inline_max_bytes,
        max_op_data_bytes,
        heal_in_background: true,
        heal_bytes_per_s: cfg.heal_bytes_per_s,
        scan_interval: Some(cfg.scan_interval),
        lazy_encode_min_bytes: cfg.lazy_encode_min_bytes,
        // This node owns its sets: it settles what a crash left in their undo logs.
        settle_at_open: mosaic_erasure::Settle::All,
        heal_removes: true,
        kept_drives: None,
        decided_by: None,
        // A cluster's groups turn it off where k = m (`mosaic_cluster_store::build`).
        read_fast_path: true,
        removal_follower: None,
        // A cluster node's groups take the cluster's locks when they are composed.
        shared_locks: None,
        // Heal and lazy sync wait for a quiet moment in the node's client requests (of every set: they
        // share the cores and the disk), not merely for none in flight on their own set, which under a
        // load happens between any two requests. A one-drive set has nothing to heal.
        node_foreground: (opened.layout.drives.len() > 1).then(mosaic_store::ForegroundWork::new),
        // New objects get the default code for this CPU (GF(2^8) Reed-Solomon where it runs).
        codec: None,
        rebuild_on_write_max_bytes: mosaic_erasure::REBUILD_ON_WRITE_MAX_BYTES,
    };
    // A cluster node's drives are each its own 1+0 set here, for the admin port only: the cluster's sets
    // (placement groups) write through them, and settle and heal as the map says.
    let local_set_cfg = match cfg.cluster {
        Some(_) => mosaic_erasure::SetConfig {
            heal_in_background: false,
            scan_interval: None,
            settle_at_open: mosaic_erasure::Settle::Never,
            ..set_cfg.clone()
        },
        None => set_cfg.clone(),
    };
    let layout = opened.layout.clone();
    let drives = Arc::new(rt.block_on(Drives::open(opened, local_set_cfg, drive_cfg, &cfg.data_dir))?);
    tracing::info!(
        drives = layout.drives.len(),
        sets = layout.sets,
        erasure = %format!("{}+{}", layout.data, layout.parity),
        "drives open"
    );
    let listeners = rt.block_on(Listeners::bind(&cfg))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    // One certificate for the S3, admin and cluster ports (one SIGHUP reloads it for all).
    let certificates = match &cfg.tls {
        Some(files) => Some(mosaic_s3::tls::Certificates::load(&files.cert, &files.key)?),
        None => None,
    };
    let cluster = match &cfg.cluster {
        Some(c) => {
            let local = drives.each().into_iter().zip(drives.sets.iter()).filter_map(|(view, set)| {
                let store = set.members().into_iter().next().flatten()?;
                Some((view.path.display().to_string(), (*store).clone()))
            });
            let s3 = listeners.s3.local_addr().map_err(|e| e.to_string())?.to_string();
            let tls = cluster_tls(c, certificates.as_ref())?;
            let opened =
                Cluster::open(c.clone(), cfg.data_dir.clone(), local.collect(), s3, set_cfg, tls, stop_rx.clone());
            let cluster = rt.block_on(opened)?;
            // A joining node takes the cluster's credentials and keys here, before they are read below.
            rt.block_on(cluster.prepare())?;
            Some(cluster)
        }
        None => None,
    };
    let (creds, generated) = datadir::root_credentials(&cfg.data_dir, creds_env)?;
    if generated {
        // Printed once, on the start that created them; they are stored (mode 0600) in the data directory.
        // A closed stdout must not stop the server: the credentials are in the file too.
        use std::io::Write as _;
        let shown = writeln!(
            std::io::stdout(),
            "Root credentials (stored in {}/credentials):\n  access key: {}\n  secret key: {}",
            cfg.data_dir.display(),
            creds.access_key,
            creds.secret_key
        );
        if let Err(e) = shown {
            tracing::warn!(error = %e, "could not print the root credentials; they are in the data directory");
        }
    }
    let master = crate::sse_keys_file::load_or_create(&cfg.data_dir, cfg.sse_master_key)?;
    if let Some(cluster) = &cluster {
        // What a member compares with its own before this node may join it (`admin cluster add-node`).
        cluster.set_shared_state(&creds, &master);
    }
    let sse_keys = Arc::new(sse_keys(&cfg, master)?);
    let (layer, pool): (Arc<dyn ObjectLayer>, Option<Arc<SetPool>>) = match &cluster {
        Some(cluster) => {
            let _entered = rt.enter();
            cluster.serve(SemanticsConfig { sse_keys: Some(sse_keys.clone()), ..Default::default() });
            (cluster.switch.clone(), None)
        }
        None => {
            let catalog = crate::microstores_file::load(&cfg.data_dir)?;
            crate::bucket_moves::check_sets(&catalog, drives.sets.len())
                .map_err(|e| format!("{}/microstores: {e}", cfg.data_dir.display()))?;
            rt.block_on(semantics_over(&drives, sse_keys.clone(), &catalog))?
        }
    };
    let serving = Serving {
        cfg: cfg.clone(),
        layer: layer.clone(),
        sse_keys,
        drives: drives.clone(),
        pool,
        creds,
        certificates,
        prometheus,
        started,
        io_shares,
    };
    let result = rt.block_on(serve_all(serving, listeners, cluster.clone(), (stop_tx, stop_rx)));
    let mut closed = rt.block_on(layer.shutdown());
    if let Some(cluster) = &cluster {
        rt.block_on(cluster.shutdown());
        // The cluster's sets do not close the drives they share: this node closes its own.
        for set in &drives.sets {
            let set_closed = rt.block_on(mosaic_store::Store::close(set));
            closed = closed.and(set_closed.map_err(mosaic_layer::LayerError::from));
        }
    }
    drop(rt);
    result?;
    closed.map_err(|e| format!("closing the drive failed: {e}"))?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The server's listening sockets, bound before anything is served (a cluster node advertises their
/// addresses).
struct Listeners {
    s3: TcpListener,
    admin: TcpListener,
}

impl Listeners {
    async fn bind(cfg: &Config) -> Result<Listeners, String> {
        let s3 =
            TcpListener::bind(cfg.s3_address).await.map_err(|e| format!("cannot listen on {}: {e}", cfg.s3_address))?;
        let admin = TcpListener::bind(cfg.admin_address)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cfg.admin_address))?;
        Ok(Listeners { s3, admin })
    }
}

/// What the server serves.
struct Serving {
    cfg: Config,
    layer: Arc<dyn ObjectLayer>,
    sse_keys: Arc<mosaic_layer::SseKeys>,
    drives: Arc<Drives>,
    /// The pool of the sets, when there are several (a standalone server's).
    pool: Option<Arc<SetPool>>,
    creds: Credentials,
    certificates: Option<Arc<mosaic_s3::tls::Certificates>>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    started: Instant,
    /// The table the drives' IO schedulers read (None: IO shares are off).
    io_shares: Option<Arc<mosaic_store::IoShares>>,
}

/// TLS between nodes, when the cluster names the authority of the nodes' certificates: this node serves
/// its cluster port with its own certificate.
fn cluster_tls(
    cluster: &crate::config::ClusterConfig,
    certificates: Option<&Arc<mosaic_s3::tls::Certificates>>,
) -> Result<Option<mosaic_cluster::rpc::Tls>, String> {
    let Some(ca) = &cluster.ca else { return Ok(None) };
    let certificates = certificates.ok_or("cluster_ca: the cluster port serves over TLS with tls_cert and tls_key")?;
    let roots = crate::admin_client::trusted_certificates(ca).map_err(|e| format!("cluster_ca: {e}"))?;
    mosaic_cluster::rpc::Tls::new(certificates.acceptor()?, roots).map(Some)
}

/// The S3 semantics over the store's sets: one set directly, several as a pool (each object on the set its
/// key hashes to among all, or among its bucket's sets when `placements` place it: a microstore's own).
async fn semantics_over(
    drives: &Drives,
    sse_keys: Arc<mosaic_layer::SseKeys>,
    catalog: &mosaic_microstore::Catalog,
) -> Result<(Arc<dyn ObjectLayer>, Option<Arc<SetPool>>), String> {
    let open = |e: mosaic_layer::LayerError| format!("cannot open the store: {e}");
    let cfg = SemanticsConfig { sse_keys: Some(sse_keys), ..Default::default() };
    if let [set] = drives.sets.as_slice() {
        let s = S3Semantics::open(Arc::new(set.clone()), cfg).await.map_err(open)?;
        return Ok((Arc::new(s), None));
    }
    let sets = drives.sets.iter().map(|s| Arc::new(s.clone())).collect();
    let pool = Arc::new(mosaic_pool::Pool::new(sets).map_err(|e| format!("cannot pool the sets of drives: {e}"))?);
    // Before anything is read: a bucket's objects are found where its placement (or the home) says.
    let scopes = crate::bucket_moves::scopes_of(&catalog.placements);
    let home = crate::bucket_moves::home_of(catalog.home.as_ref(), pool.members().len());
    pool.set_placement(home, scopes).await.map_err(|e| format!("the buckets' placements: {e}"))?;
    let s = S3Semantics::open(pool.clone(), cfg).await.map_err(open)?;
    Ok((Arc::new(s), Some(pool)))
}

/// The web console: its S3 calls go to the S3 listener on loopback (or the address it is bound to), over
/// TLS trusting the server's own certificate when the S3 port serves TLS.
fn console_for(
    s3_bound: std::net::SocketAddr,
    tls_files: Option<&crate::config::TlsFiles>,
    admin_tls: bool,
    session_max: std::time::Duration,
) -> Result<crate::console::Console, String> {
    let ip = match s3_bound.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        ip => ip.to_string(),
    };
    let https = tls_files.is_some();
    let scheme = if https { "https" } else { "http" };
    let cert = match tls_files {
        Some(f) => Some(std::fs::read(&f.cert).map_err(|e| format!("{}: {e}", f.cert.display()))?),
        None => None,
    };
    let s3 = crate::console::s3::S3Port::new(
        format!("{scheme}://{ip}:{}", s3_bound.port()),
        s3_bound.port(),
        https,
        cert.as_deref(),
    )?;
    use crate::console::session::{IDLE_TIMEOUT, Sessions};
    let sessions = Sessions::new(IDLE_TIMEOUT.min(session_max), session_max);
    Ok(crate::console::Console { sessions, failures: Default::default(), s3, secure: admin_tls })
}

/// The keys of SSE-S3 and SSE-KMS: the master keys (config, else the data directory's) and the KMS key
/// ids served.
fn sse_keys(cfg: &Config, master: mosaic_crypt::MasterKeys) -> Result<mosaic_layer::SseKeys, String> {
    mosaic_layer::SseKeys::new(master, cfg.kms_keys.iter().cloned().collect()).map_err(|e| format!("kms_keys: {e}"))
}

async fn serve_all(
    serving: Serving,
    listeners: Listeners,
    cluster: Option<Arc<Cluster>>,
    (stop_tx, stop_rx): (watch::Sender<bool>, watch::Receiver<bool>),
) -> Result<(), String> {
    let Serving { cfg, layer, sse_keys, drives, pool, creds, certificates, prometheus, started, io_shares } = serving;
    let (s3_listener, admin_listener) = (listeners.s3, listeners.admin);
    let s3_bound = s3_listener.local_addr().map_err(|e| e.to_string())?;
    let admin_bound = admin_listener.local_addr().map_err(|e| e.to_string())?;
    let keys = Arc::new(mosaic_s3::access::KeyRing::new(
        &creds.access_key,
        &creds.secret_key,
        crate::keys_file::load(&cfg.data_dir)?,
    ));
    let catalog = crate::microstores_file::load(&cfg.data_dir)?;
    let dir = cfg.data_dir.clone();
    let saver: mosaic_microstore::registry::Saver = Box::new(move |c| crate::microstores_file::save(&dir, c));
    // Microstores may own sets of a pool of several (a store of one set, or a cluster's, has none).
    let pooled_sets = pool.as_ref().map_or(0, |p| p.members().len());
    let mut microstores =
        mosaic_microstore::Microstores::new(cfg.microstores.clone(), catalog)?.with_saver(saver).with_sets(pooled_sets);
    if let Some(shares) = io_shares {
        microstores = microstores.with_io_shares(shares);
    }
    microstores = microstores.with_cpu_classes()?;
    if let Some(cluster) = &cluster {
        // A deleted bucket's assignment goes from the cluster's catalog too.
        let (cluster, runtime) = (Arc::downgrade(cluster), tokio::runtime::Handle::current());
        microstores = microstores.with_forget_hook(Box::new(move |bucket| {
            let (cluster, bucket) = (cluster.clone(), bucket.to_string());
            runtime.spawn(async move {
                if let Some(cluster) = cluster.upgrade() {
                    crate::admin_microstores::forget_in_cluster(&cluster, &bucket).await;
                }
            });
        }));
    }
    let microstores = Arc::new(microstores);
    let mut service =
        mosaic_s3::build_service_with_keys(layer.clone(), keys.clone(), cfg.domain.as_deref(), cfg.sse_c_over_http)?;
    if cfg.microstores_enabled {
        service = service.with_microstores(microstores.clone());
    }
    // Installed before the server says it serves, so that a signal right after that line is handled.
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = signal(SignalKind::interrupt()).and_then(|i| Ok((i, signal(SignalKind::terminate())?)));
    let (int, term) = handlers.map_err(|e| format!("cannot install signal handlers: {e}"))?;
    tokio::spawn(signals(int, term, stop_tx));
    let tls = certificates.as_ref().map(|c| c.acceptor()).transpose()?;
    let hangup = signal(SignalKind::hangup()).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    tokio::spawn(reload_on_hangup(hangup, certificates));
    let console = console_for(s3_bound, cfg.tls.as_ref(), tls.is_some(), cfg.console_session_max)?;
    let admin_state = Arc::new(AdminState {
        layer: layer.clone(),
        drives,
        creds,
        keys,
        sse_keys,
        sse_given: cfg.sse_master_key.is_some(),
        data_dir: cfg.data_dir.clone(),
        prometheus,
        started,
        cluster: cluster.clone(),
        microstores: microstores.clone(),
        console: Some(console),
    });
    if let Some(cluster) = &cluster {
        // A cluster's access keys are the map's: every change any node makes is applied here too.
        let (keys, dir) = (admin_state.keys.clone(), cfg.data_dir.clone());
        let apply = move |text: &str| crate::admin_keys::apply_cluster_keys(&keys, &dir, text);
        cluster.on_shared(crate::admin_keys::CLUSTER_SETTING, Box::new(apply));
        // And its microstores (each node holds its own share of workers of each).
        let (ms, dir) = (microstores.clone(), cfg.data_dir.clone());
        let apply = move |text: &str| crate::admin_microstores::apply_cluster(&ms, &dir, text);
        cluster.on_shared(crate::admin_microstores::CLUSTER_SETTING, Box::new(apply));
        // So are its SSE master keys, unless the config gives every node its key.
        if cfg.sse_master_key.is_none() {
            let (sse, dir, weak) = (admin_state.sse_keys.clone(), cfg.data_dir.clone(), Arc::downgrade(cluster));
            let apply = move |text: &str| {
                crate::admin_sse::apply_cluster_sse(&sse, &dir, text)?;
                // What a joining node takes from this one (and what an invited one must match) is current.
                if let Some(cluster) = weak.upgrade() {
                    cluster.set_shared_sse(&sse.master_keys());
                }
                Ok(())
            };
            cluster.on_shared(crate::admin_sse::CLUSTER_SETTING, Box::new(apply));
        }
    }
    if let Some(pool) = pool {
        let moves = crate::bucket_moves::BucketMoves::new(pool, microstores.clone(), cfg.microstore_move_bytes_s);
        tokio::spawn(moves.run(stop_rx.clone()));
    }
    tokio::spawn(microstore_rounds(microstores, stop_rx.clone()));
    tokio::spawn(lifecycle_worker(layer.clone(), cfg.lifecycle_day, stop_rx.clone()));
    let mut admin_stop = stop_rx.clone();
    let admin = tokio::spawn(admin_server::serve(admin_listener, admin_state, tls.clone(), async move {
        let _ = admin_stop.wait_for(|s| *s).await;
    }));
    tracing::info!(
        s3 = %s3_bound,
        admin = %admin_bound,
        cluster = cluster.as_ref().map(|c| c.address()),
        node = cluster.as_ref().map(|c| c.node_id()),
        tls = tls.is_some(),
        ms = started.elapsed().as_millis() as u64,
        "mosaic is serving"
    );
    let limits = mosaic_s3::HttpLimits { max_connections: cfg.max_connections, ..Default::default() };
    let mut s3_stop = stop_rx.clone();
    mosaic_s3::serve(
        s3_listener,
        service,
        limits,
        tls,
        async move {
            let _ = s3_stop.wait_for(|s| *s).await;
        },
        cfg.shutdown_timeout,
    )
    .await
    .map_err(|e| e.to_string())?;
    let _ = admin.await;
    Ok(())
}

/// The microstores' rounds, one per window slot: buckets are classified, workers move toward microstores
/// missing their targets; every class change and decision is logged with its reason and exported.
async fn microstore_rounds(ms: Arc<mosaic_microstore::Microstores>, mut stop: watch::Receiver<bool>) {
    let slot = Duration::from_millis(ms.config().monitor.window.slot_ms);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + slot, slot);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let report = ms.round();
        for (bucket, class) in &report.class_changes {
            tracing::info!(bucket, class = class.name(), "bucket classified");
            metrics::counter!("mosaic_microstore_class_changes_total", "class" => class.name()).increment(1);
        }
        for d in &report.decisions {
            tracing::info!(
                microstore = d.microstore,
                before = d.workers_before,
                after = d.workers_after,
                reason = d.reason,
                "microstore workers moved"
            );
            metrics::counter!("mosaic_microstore_decisions_total", "microstore" => d.microstore.clone()).increment(1);
        }
        for d in &report.bandwidth {
            let mib = |c: Option<f64>| c.map_or("unlimited".to_string(), |c| format!("{c:.1} MiB/s"));
            tracing::info!(
                microstore = d.microstore,
                before = mib(d.cap_mib_s_before),
                after = mib(d.cap_mib_s_after),
                reason = d.reason,
                "microstore bandwidth moved"
            );
            metrics::counter!("mosaic_microstore_decisions_total", "microstore" => d.microstore.clone()).increment(1);
        }
        for d in &report.io {
            tracing::info!(
                microstore = d.microstore,
                before = d.io_points_before,
                after = d.io_points_after,
                reason = d.reason,
                "microstore IO share moved"
            );
            metrics::counter!("mosaic_microstore_decisions_total", "microstore" => d.microstore.clone()).increment(1);
        }
        for d in &report.sets {
            tracing::info!(set = d.set, from = d.from, to = d.to, reason = d.reason, "microstore set moved");
            metrics::counter!("mosaic_microstore_decisions_total", "microstore" => d.to.clone()).increment(1);
        }
        if let Some(e) = &report.sets_error {
            tracing::warn!(error = e, "a set move was decided but could not be stored; none moved");
        }
        let status = ms.status();
        metrics::gauge!("mosaic_bulk_cpu_tasks").set(status.bulk_cpu_tasks as f64);
        metrics::gauge!("mosaic_bulk_cpu_connections").set(status.bulk_cpu_connections as f64);
        for s in status.microstores {
            let g = |name: &'static str, v: f64| metrics::gauge!(name, "microstore" => s.name.clone()).set(v);
            // 1: its heavy CPU work runs in the bulk class.
            g("mosaic_microstore_cpu_bulk", f64::from(u8::from(s.cpu_bulk)));
            g("mosaic_microstore_workers", f64::from(s.workers));
            g("mosaic_microstore_workers_in_use", f64::from(s.in_use));
            g("mosaic_microstore_waiting", f64::from(s.waiting));
            // 0: unlimited.
            g("mosaic_microstore_bandwidth_cap_mib_s", s.bandwidth_cap_mib_s.unwrap_or(0.0));
            g("mosaic_microstore_sets", s.sets.len() as f64);
            // 0: it runs unshared.
            g("mosaic_microstore_io_points", f64::from(s.io_points.unwrap_or(0)));
            g("mosaic_microstore_io_served_bytes", s.io_served_bytes as f64);
            g("mosaic_microstore_io_wait_ms", s.io_wait_ms);
            if let Some(o) = report.observations.get(&s.name) {
                g("mosaic_microstore_latency_ms_p99", o.latency_ms_p99.unwrap_or(0.0));
                g("mosaic_microstore_throughput_mib_s", o.throughput_mib_s);
                g("mosaic_microstore_busy_ratio", o.busy);
            }
        }
    }
}

/// SIGHUP: read the TLS certificate and key again; new connections get the new one, open connections keep
/// theirs. A bad pair is logged and the old one kept. Without TLS there is nothing to reload (and SIGHUP
/// does not stop the server).
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    certificates: Option<Arc<mosaic_s3::tls::Certificates>>,
) {
    while hangup.recv().await.is_some() {
        let Some(c) = &certificates else {
            tracing::info!("SIGHUP: no TLS certificate to reload");
            continue;
        };
        match c.reload() {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
            Err(e) => tracing::warn!(error = %e, "SIGHUP: TLS certificate not reloaded; serving the previous one"),
        }
    }
}

/// First SIGINT/SIGTERM: graceful stop. Second: exit at once.
async fn signals(
    mut int: tokio::signal::unix::Signal,
    mut term: tokio::signal::unix::Signal,
    stop: watch::Sender<bool>,
) {
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::info!("stopping: no new connections; in-flight requests may finish (signal again to exit now)");
    let _ = stop.send(true);
    tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
    tracing::warn!("second signal: exiting now");
    std::process::exit(130);
}

/// Shortest and longest time between lifecycle passes.
const LIFECYCLE_PASS_MIN: Duration = Duration::from_millis(100);
const LIFECYCLE_PASS_MAX: Duration = Duration::from_secs(3600);

/// Applies the buckets' lifecycle rules four times a "day" until the server stops. Each pass starts over
/// from the first bucket and every action is conditional on what the pass read, so a restart resumes
/// without deleting twice or missing anything.
async fn lifecycle_worker(layer: Arc<dyn ObjectLayer>, day: Duration, mut stop: watch::Receiver<bool>) {
    let every = (day / 4).clamp(LIFECYCLE_PASS_MIN, LIFECYCLE_PASS_MAX);
    let day_ms = day.as_millis().min(i64::MAX as u128) as i64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let pass = layer.lifecycle_pass(now_ms, day_ms).await;
        metrics::counter!("mosaic_lifecycle_passes_total").increment(1);
        match pass {
            Ok(r) => {
                metrics::counter!("mosaic_lifecycle_expired_total", "what" => "current").increment(r.expired_current);
                metrics::counter!("mosaic_lifecycle_expired_total", "what" => "noncurrent")
                    .increment(r.expired_noncurrent);
                metrics::counter!("mosaic_lifecycle_expired_total", "what" => "delete_marker")
                    .increment(r.removed_delete_markers);
                metrics::counter!("mosaic_lifecycle_expired_total", "what" => "upload").increment(r.aborted_uploads);
                if r.expired_current + r.expired_noncurrent + r.removed_delete_markers + r.aborted_uploads > 0 {
                    tracing::info!(?r, "lifecycle pass");
                }
            }
            Err(e) => tracing::warn!(error = %e, "lifecycle pass failed; the next one tries again"),
        }
    }
}
