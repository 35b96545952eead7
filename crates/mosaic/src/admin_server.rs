//! The admin port: health checks, Prometheus metrics, and the authenticated admin API that
//! `mosaic admin` talks to.

use crate::admin_auth;
use crate::datadir::Credentials;
use crate::drives::{DriveView, Drives};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use mosaic_engine::Engine;
use mosaic_layer::ObjectLayer;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

pub struct AdminState {
    pub layer: Arc<dyn ObjectLayer>,
    pub drives: Arc<Drives>,
    pub creds: Credentials,
    pub keys: Arc<mosaic_s3::access::KeyRing>,
    /// The SSE master keys served (extended by a rotation or the cluster's).
    pub sse_keys: Arc<mosaic_layer::SseKeys>,
    /// Whether the config gives the SSE master key (then it is not rotated here).
    pub sse_given: bool,
    pub data_dir: std::path::PathBuf,
    pub prometheus: PrometheusHandle,
    pub started: Instant,
    /// A cluster node's cluster (None: a standalone server).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    pub microstores: Arc<mosaic_microstore::Microstores>,
    /// The web console (None: turned off).
    pub console: Option<crate::console::Console>,
}

pub(crate) type Resp = http::Response<Full<Bytes>>;

fn text(status: u16, body: impl Into<Bytes>) -> Resp {
    http::Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("valid response")
}

fn json(status: u16, v: serde_json::Value) -> Resp {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec_pretty(&v).expect("serializes"))))
        .expect("valid response")
}

/// Publishes every drive's counters (labelled by set and slot) and the sets' as gauges, then renders every
/// metric.
fn render_metrics(state: &AdminState) -> String {
    for d in state.drives.each() {
        let drive = format!("{}.{}", d.set, d.slot);
        let up = metrics::gauge!("mosaic_drive_online", "drive" => drive.clone());
        up.set(if state.drives.state(&d) == "offline" || state.drives.state(&d) == "faulty" { 0.0 } else { 1.0 });
        let Some(e) = &d.engine else { continue };
        engine_gauges(e, &drive);
    }
    // Page-cache ranges pinned while large reads send them, across the process's drives (bounded).
    metrics::gauge!("mosaic_engine_pinned_bytes").set(mosaic_engine::pinned_bytes() as f64);
    for (i, set) in state.drives.sets.iter().enumerate() {
        set_gauges(set, "set", &i.to_string());
    }
    commit_time_gauges();
    if let Some(cluster) = &state.cluster {
        let again = cluster.switch.made_again_total();
        metrics::gauge!("mosaic_switch_calls_made_again").set(again as f64);
    }
    // A cluster node's placement groups, as the store it serves now composed them (a group's counters
    // start again when its set is opened anew).
    if let Some(store) = state.cluster.as_ref().and_then(|c| c.served_store()) {
        for (pg, set) in store.members().iter().enumerate() {
            set_gauges(set, "group", &pg.to_string());
        }
    }
    state.prometheus.render()
}

/// The process's set commits by how a moving group's step treated them (`mosaic_erasure::CommitPath`):
/// how many, their total time, and how many took longer than each of `COMMIT_SLOW_MS`.
fn commit_time_gauges() {
    for path in mosaic_erasure::CommitPath::ALL {
        let t = mosaic_erasure::commit_times(path);
        let label = path.label();
        metrics::gauge!("mosaic_set_commits", "path" => label).set(t.commits.load(Relaxed) as f64);
        let seconds = t.total_us.load(Relaxed) as f64 / 1e6;
        metrics::gauge!("mosaic_set_commit_seconds_total", "path" => label).set(seconds);
        for (ms, n) in mosaic_erasure::COMMIT_SLOW_MS.iter().zip(&t.slower_than) {
            let g = metrics::gauge!("mosaic_set_commits_slower_than", "path" => label, "ms" => ms.to_string());
            g.set(n.load(Relaxed) as f64);
        }
    }
}

/// An erasure set's counters, heal and lazy sync as gauges labelled `label_key` = `label`.
fn set_gauges<S: mosaic_store::Store>(set: &mosaic_erasure::ErasureSet<S>, label_key: &'static str, label: &str) {
    let c = set.counters();
    let g = |name: &'static str, v: u64| metrics::gauge!(name, label_key => label.to_string()).set(v as f64);
    g("mosaic_set_degraded_reads", c.degraded_reads.load(Relaxed));
    g("mosaic_set_partial_writes", c.partial_writes.load(Relaxed));
    g("mosaic_set_failed_writes", c.failed_writes.load(Relaxed));
    g("mosaic_set_writes_left_undecided", c.writes_left_undecided_at_open.load(Relaxed));
    g("mosaic_set_heal_backlog", set.heal_backlog() as u64);
    let h = set.heal_progress();
    g("mosaic_set_healed_objects", h.healed_objects.load(Relaxed));
    g("mosaic_set_healed_bytes", h.healed_bytes.load(Relaxed));
    g("mosaic_set_heal_failures", h.failed_objects.load(Relaxed));
    g("mosaic_set_encode_backlog", set.encode_backlog() as u64);
    g("mosaic_set_encoded_bytes", h.encoded_bytes.load(Relaxed));
    g("mosaic_set_encoded_objects", h.encoded_objects.load(Relaxed));
}

/// One drive's engine counters as gauges labelled `drive`.
fn engine_gauges(e: &Engine, drive: &str) {
    let s = e.stats();
    let g = |name: &'static str, v: u64| metrics::gauge!(name, "drive" => drive.to_string()).set(v as f64);
    g("mosaic_engine_user_bytes_written", s.user_bytes_written);
    g("mosaic_engine_device_bytes_written", s.device_bytes_written);
    g("mosaic_engine_device_bytes_read", s.device_bytes_read);
    g("mosaic_engine_device_write_ios", s.device_write_ios);
    g("mosaic_engine_device_read_ios", s.device_read_ios);
    g("mosaic_engine_write_runs", s.write_runs());
    g("mosaic_engine_cached_bytes_read", s.cached_bytes_read);
    g("mosaic_engine_mapped_bytes_read", s.mapped_bytes_read);
    g("mosaic_engine_verified_bytes_read", s.verified_bytes_read);
    g("mosaic_engine_verified_cache_bytes", s.verified_cache_bytes);
    g("mosaic_engine_cache_rereads", s.cache_rereads);
    let scrub = e.scrub_status();
    g("mosaic_engine_scrub_passes", scrub.passes_completed);
    g("mosaic_engine_scrub_damaged_objects", scrub.damaged.len() as u64);
    g("mosaic_engine_kv_wal_bytes", s.kv_wal_bytes);
    g("mosaic_engine_kv_flush_bytes", s.kv_flush_bytes);
    g("mosaic_engine_kv_compaction_bytes", s.kv_compaction_bytes);
    g("mosaic_engine_rmw_on_write_path", s.rmw_on_write_path);
    g("mosaic_engine_rmw_in_lazy_sync", s.rmw_in_lazy_sync);
    g("mosaic_engine_fragments_outstanding", s.fragments_outstanding);
    g("mosaic_engine_fragment_bytes_outstanding", s.fragment_bytes_outstanding);
    g("mosaic_engine_checksum_errors", s.checksum_errors);
    g("mosaic_engine_transactions_committed", s.transactions_committed);
    g("mosaic_engine_groups_committed", s.groups_committed);
    g("mosaic_engine_groups_gathered", s.groups_gathered);
    g("mosaic_engine_device_flushes", s.device_flushes);
    g("mosaic_engine_free_blocks", s.free_blocks);
    g("mosaic_engine_total_blocks", s.total_blocks);
    g("mosaic_engine_allocated_blocks", s.allocated_blocks);
    g("mosaic_engine_free_extents", s.free_extents);
    g("mosaic_engine_object_reads", s.object_reads);
    g("mosaic_engine_meta_cache_hits", s.meta_cache_hits);
    g("mosaic_engine_meta_cache_misses", s.meta_cache_misses);
    g("mosaic_engine_meta_cache_bytes", s.meta_cache_bytes);
    g("mosaic_engine_page_cache_hits", s.page_cache_hits);
    g("mosaic_engine_page_cache_misses", s.page_cache_misses);
    g("mosaic_engine_page_cache_bytes", s.page_cache_bytes);
    g("mosaic_engine_page_cache_dirty_pages", s.page_cache_dirty_pages);
    g("mosaic_engine_checksum_split_reads", s.checksum_split_reads);
    g("mosaic_engine_prioritized_in_flight", s.prioritized_in_flight);
    g("mosaic_engine_background_waits_for_priority", s.background_waits_for_priority);
    for (class, depth) in s.queue_depth.iter() {
        metrics::gauge!("mosaic_engine_queue_depth", "drive" => drive.to_string(), "class" => class.name())
            .set(*depth as f64);
    }
    for (i, v) in s.io_size_hist.iter().enumerate() {
        let le = format!("{}", 4096u64 << i);
        metrics::gauge!("mosaic_engine_io_size_count", "drive" => drive.to_string(), "size_bytes" => le).set(*v as f64);
    }
}

/// A drive's background scrub: its progress and the damaged objects of its last finished pass, by name.
fn scrub_json(e: &Engine) -> serde_json::Value {
    let status = e.scrub_status();
    let reader = e.reader();
    let damaged: Vec<serde_json::Value> = status
        .damaged
        .iter()
        .map(|(nid, what)| {
            let name = reader.stat(*nid).map(|i| String::from_utf8_lossy(&i.name).into_owned()).unwrap_or_default();
            serde_json::json!({ "object": name, "problem": what })
        })
        .collect();
    serde_json::json!({
        "passes_completed": status.passes_completed,
        "blocks_checked": status.blocks_checked,
        "damaged": damaged,
    })
}

/// One drive: where it is, its state, its space and its counters.
fn drive_json(state: &AdminState, d: &DriveView) -> serde_json::Value {
    let mut v = serde_json::json!({
        "set": d.set,
        "slot": d.slot,
        "path": d.path.display().to_string(),
        "state": state.drives.state(d),
    });
    let Some(e) = &d.engine else {
        v["problem"] = serde_json::json!(state.drives.problem(d.set, d.slot));
        return v;
    };
    let s = e.stats();
    let space = e.space_usage();
    let more = serde_json::json!({
        "uuid": hex::encode(e.uuid()),
        "failure": e.failure(),
        "used_bytes": space.used_bytes,
        "allocated_bytes": space.allocated_bytes,
        "max_bytes": space.capacity_bytes,
        "free_bytes": space.capacity_bytes - space.used_bytes,
        "free_extents": s.free_extents,
        "user_bytes_written": s.user_bytes_written,
        "device_bytes_written": s.device_bytes_written,
        "device_bytes_read": s.device_bytes_read,
        "cached_bytes_read": s.cached_bytes_read,
        "mapped_bytes_read": s.mapped_bytes_read,
        "verified_bytes_read": s.verified_bytes_read,
        "verified_cache_bytes": s.verified_cache_bytes,
        "cache_rereads": s.cache_rereads,
        "kv_bytes_written": s.kv_bytes_written(),
        "rmw_on_write_path": s.rmw_on_write_path,
        "rmw_in_lazy_sync": s.rmw_in_lazy_sync,
        "fragments_outstanding": s.fragments_outstanding,
        "checksum_errors": s.checksum_errors,
        "transactions_committed": s.transactions_committed,
        "meta_cache_hits": s.meta_cache_hits,
        "meta_cache_misses": s.meta_cache_misses,
        "meta_cache_bytes": s.meta_cache_bytes,
        "page_cache_hits": s.page_cache_hits,
        "page_cache_misses": s.page_cache_misses,
        "page_cache_bytes": s.page_cache_bytes,
        "page_cache_dirty_pages": s.page_cache_dirty_pages,
        "prioritized_in_flight": s.prioritized_in_flight,
        "background_waits_for_priority": s.background_waits_for_priority,
        "background_scrub": scrub_json(e),
    });
    if let (Some(o), serde_json::Value::Object(m)) = (v.as_object_mut(), more) {
        o.extend(m);
    }
    v
}

/// Each set: its code, its drives' states and its heal progress.
fn sets_json(state: &AdminState) -> serde_json::Value {
    let sets: Vec<serde_json::Value> = state
        .drives
        .sets
        .iter()
        .enumerate()
        .map(|(i, set)| {
            let g = set.geometry();
            let h = set.heal_progress();
            let c = set.counters();
            serde_json::json!({
                "set": i,
                "erasure": format!("{}+{}", g.data, g.parity),
                "ready": mosaic_store::Store::is_ready(set),
                "heal_backlog": set.heal_backlog(),
                "healed_objects": h.healed_objects.load(Relaxed),
                "healed_bytes": h.healed_bytes.load(Relaxed),
                "heal_failures": h.failed_objects.load(Relaxed),
                "scans_completed": h.scans_completed.load(Relaxed),
                "encode_backlog": set.encode_backlog(),
                "encoded_bytes": h.encoded_bytes.load(Relaxed),
                "degraded_reads": c.degraded_reads.load(Relaxed),
                "partial_writes": c.partial_writes.load(Relaxed),
                "failed_writes": c.failed_writes.load(Relaxed),
                "writes_left_undecided": c.writes_left_undecided_at_open.load(Relaxed),
            })
        })
        .collect();
    serde_json::Value::Array(sets)
}

fn stats_json(state: &AdminState) -> serde_json::Value {
    let drives: Vec<DriveView> = state.drives.each();
    let (mut used, mut allocated, mut max) = (0u64, 0u64, 0u64);
    for e in drives.iter().filter_map(|d| d.engine.as_ref()) {
        let s = e.space_usage();
        (used, allocated, max) = (used + s.used_bytes, allocated + s.allocated_bytes, max + s.capacity_bytes);
    }
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": state.started.elapsed().as_secs(),
        "ready": state.layer.is_ready(),
        "space": { "used_bytes": used, "allocated_bytes": allocated, "max_bytes": max, "free_bytes": max - used },
        "sets": sets_json(state),
        "drives": drives.iter().map(|d| drive_json(state, d)).collect::<Vec<_>>(),
    })
}

async fn route(state: Arc<AdminState>, req: http::Request<hyper::body::Incoming>) -> Result<Resp, hyper::Error> {
    let path = req.uri().path().to_string();
    let method = req.method().as_str().to_string();
    match (method.as_str(), path.as_str()) {
        ("GET", "/health/live") => return Ok(text(200, "ok\n")),
        ("GET", "/health/ready") => {
            return Ok(if state.layer.is_ready() { text(200, "ready\n") } else { text(503, "not ready\n") });
        }
        ("GET", "/metrics") => {
            let st = state.clone();
            let body = tokio::task::spawn_blocking(move || render_metrics(&st)).await.unwrap_or_default();
            let mut r = text(200, body);
            r.headers_mut().insert("content-type", "text/plain; version=0.0.4".parse().expect("valid"));
            return Ok(r);
        }
        _ => {}
    }
    if crate::console::serves(&path) {
        return Ok(crate::console::route(&state, req).await);
    }
    if !path.starts_with("/admin/v1/") {
        return Ok(text(404, "not found\n"));
    }
    let h = |k: &str| req.headers().get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Err(why) = admin_auth::verify(
        &state.creds.access_key,
        &state.creds.secret_key,
        &method,
        &path,
        h(admin_auth::HEADER_KEY).as_deref(),
        h(admin_auth::HEADER_DATE).as_deref(),
        h(admin_auth::HEADER_SIGNATURE).as_deref(),
    ) {
        return Ok(json(403, serde_json::json!({ "error": why })));
    }
    Ok(dispatch(state, &method, &path).await)
}

/// The admin API's answer to an authenticated call (by `mosaic admin`, or by a root console session).
pub(crate) async fn dispatch(state: Arc<AdminState>, method: &str, path: &str) -> Resp {
    let (method, path) = (method.to_string(), path.to_string());
    let st = state.clone();
    match (method.as_str(), path.as_str()) {
        ("GET", "/admin/v1/info") => json(200, stats_json(&state)),
        ("GET", "/admin/v1/drives") => {
            let drives: Vec<serde_json::Value> = state.drives.each().iter().map(|d| drive_json(&state, d)).collect();
            json(200, serde_json::json!({ "sets": sets_json(&state), "drives": drives }))
        }
        ("POST", "/admin/v1/check") => match tokio::task::spawn_blocking(move || check_json(&st)).await {
            Ok(v) => json(200, v),
            Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
        },
        ("POST", "/admin/v1/scrub") => {
            // Every drive verifies its blocks, and each set reads every shard back (queueing damage for heal).
            let mut deep = Vec::new();
            for set in &state.drives.sets {
                deep.push(set.scan_deep().await.map_err(|e| e.to_string()));
            }
            match tokio::task::spawn_blocking(move || scrub_drives_json(&st)).await {
                Ok(mut v) => {
                    v["sets_scanned_objects"] =
                        serde_json::json!(deep.iter().map(|r| r.clone().unwrap_or(0)).sum::<u64>());
                    v["set_scan_errors"] =
                        serde_json::json!(deep.into_iter().filter_map(Result::err).collect::<Vec<_>>());
                    json(200, v)
                }
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        ("POST", "/admin/v1/heal") => match &state.cluster {
            // A cluster node's drives serve the cluster's groups: heal is of the groups it owns.
            Some(cluster) => json(200, cluster.heal().await),
            None => json(200, state.drives.heal_all().await),
        },
        _ if method == "POST" && path.starts_with("/admin/v1/drives/") && path.contains("/fault/") => {
            match fault_request(&path) {
                Ok((set, slot, fault)) => match state.drives.inject_fault(set, slot, fault) {
                    Ok(()) => json(
                        200,
                        serde_json::json!({ "fault": { "set": set, "slot": slot, "fault": format!("{fault:?}") } }),
                    ),
                    Err(e) => json(409, serde_json::json!({ "error": e })),
                },
                Err(e) => json(400, serde_json::json!({ "error": e })),
            }
        }
        _ if method == "POST" && path.starts_with("/admin/v1/drives/") => match replace_request(&path) {
            Ok((set, slot, new_path)) => match state.drives.replace(set, slot, &new_path).await {
                Ok(()) => json(
                    200,
                    serde_json::json!({ "replaced": { "set": set, "slot": slot, "path": new_path.display().to_string() } }),
                ),
                Err(e) => json(409, serde_json::json!({ "error": e })),
            },
            Err(e) => json(400, serde_json::json!({ "error": e })),
        },
        _ if path == "/admin/v1/keys" || path.starts_with("/admin/v1/keys/") => {
            let st = state.clone();
            let (m, p) = (method.clone(), path.clone());
            match tokio::task::spawn_blocking(move || crate::admin_keys::route(&st, &m, &p)).await {
                Ok((status, v)) => json(status, v),
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        ("POST", "/admin/v1/sse/rotate") => {
            let st = state.clone();
            match tokio::task::spawn_blocking(move || crate::admin_sse::rotate(&st)).await {
                Ok((status, v)) => json(status, v),
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        _ if path == "/admin/v1/microstores" || path.starts_with("/admin/v1/microstores/") => {
            if state.cluster.as_ref().is_some_and(|c| c.runs()) {
                // A cluster's microstores are its map's, and share its groups.
                let (st, method, path) = (state.clone(), method.to_string(), path.to_string());
                let change = move || {
                    let cluster = st.cluster.as_ref().expect("a cluster node");
                    crate::admin_microstores::route_in_cluster(&st.microstores, &st.data_dir, cluster, &method, &path)
                };
                return match tokio::task::spawn_blocking(change).await {
                    Ok((status, v)) => json(status, v),
                    Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
                };
            }
            // A standalone server's sets are pooled when there are several.
            let pooled =
                if state.cluster.is_none() && state.drives.sets.len() > 1 { state.drives.sets.len() } else { 0 };
            let (status, v) =
                crate::admin_microstores::route(&state.microstores, &state.data_dir, pooled, &method, &path);
            json(status, v)
        }
        _ if path == "/admin/v1/cluster" || path.starts_with("/admin/v1/cluster/") => {
            cluster_route(&state, &method, &path).await
        }
        _ => json(404, serde_json::json!({ "error": format!("no admin endpoint {method} {path}") })),
    }
}

/// The cluster's endpoints: `GET /admin/v1/cluster` (status) and
/// `POST /admin/v1/cluster/init/{data}/{parity}/{groups}/{node|zone}`.
async fn cluster_route(state: &AdminState, method: &str, path: &str) -> Resp {
    let Some(cluster) = &state.cluster else {
        return json(
            409,
            serde_json::json!({ "error": "this server is not a cluster node (start it with --cluster-address)" }),
        );
    };
    if (method, path) == ("GET", "/admin/v1/cluster") {
        return json(200, cluster.status().await);
    }
    let not_found = || json(404, serde_json::json!({ "error": format!("no admin endpoint {method} {path}") }));
    if method != "POST" {
        return not_found();
    }
    if let Some(address) = path.strip_prefix("/admin/v1/cluster/add-node/") {
        if let Err(e) = crate::config::host_port("address", address) {
            return json(400, serde_json::json!({ "error": e }));
        }
        return match cluster.add_node(address).await {
            Ok(node) => json(200, serde_json::json!({ "node": node, "address": address })),
            Err(e) => json(409, serde_json::json!({ "error": e })),
        };
    }
    if let Some(args) = path.strip_prefix("/admin/v1/cluster/").filter(|a| !a.starts_with("init/")) {
        let change = match cluster_change(args) {
            Ok(Some(c)) => c,
            Ok(None) => return not_found(),
            Err(e) => return json(400, serde_json::json!({ "error": e })),
        };
        return match cluster.change(change).await {
            Ok(epoch) => json(200, serde_json::json!({ "epoch": epoch })),
            Err(e) => json(409, serde_json::json!({ "error": e })),
        };
    }
    let Some(args) = path.strip_prefix("/admin/v1/cluster/init/") else {
        return not_found();
    };
    let request = match init_request(args) {
        Ok(r) => r,
        Err(e) => return json(400, serde_json::json!({ "error": e })),
    };
    match cluster.init(request).await {
        Ok(secret) => json(
            200,
            serde_json::json!({ "node": cluster.node_id(), "address": cluster.address(), "secret": secret.to_hex() }),
        ),
        Err(e) => json(409, serde_json::json!({ "error": e })),
    }
}

/// The map change an admin call asks for: `drain/{node}`, `remove/{node}[/dead]`,
/// `weight/{drive}/{weight}`, `rebalance/{pause|resume}`. None: no such call.
fn cluster_change(args: &str) -> Result<Option<mosaic_cluster::Change>, String> {
    use mosaic_cluster::{Change, NodeState};
    let parts: Vec<&str> = args.split('/').collect();
    let number = |what: &str, v: &str| v.parse::<u64>().map_err(|_| format!("{what}: {v:?} is not a number"));
    let small = |what: &str, v: &str| {
        number(what, v).and_then(|n| u32::try_from(n).map_err(|_| format!("{what}: {n} is too large")))
    };
    Ok(Some(match parts.as_slice() {
        ["drain", node] => Change::SetNodeState { node: number("node", node)?, state: NodeState::Draining },
        ["remove", node] => Change::RemoveNode { node: number("node", node)?, dead: false },
        ["remove", node, "dead"] => Change::RemoveNode { node: number("node", node)?, dead: true },
        ["weight", drive, weight] => {
            Change::SetDriveWeight { drive: small("drive", drive)?, weight: small("weight", weight)? }
        }
        ["rebalance", "pause"] => Change::PauseMoves { paused: true },
        ["rebalance", "resume"] => Change::PauseMoves { paused: false },
        _ => return Ok(None),
    }))
}

fn init_request(args: &str) -> Result<crate::cluster::InitRequest, String> {
    let parts: Vec<&str> = args.split('/').collect();
    let [data, parity, groups, domain] = parts.as_slice() else {
        return Err("expected /init/{data}/{parity}/{groups}/{node|zone}".into());
    };
    let number = |what: &str, v: &str| v.parse::<u32>().map_err(|_| format!("{what}: {v:?} is not a number"));
    let (data, parity) = (number("data shards", data)?, number("parity shards", parity)?);
    let width = mosaic_cluster::map::MAX_SET_DRIVES as u32;
    if data == 0 || parity > data || data + parity > width {
        return Err(format!(
            "an erasure code of {data}+{parity}: 1 or more data shards, no more parity than data, at most {width} in all"
        ));
    }
    // A node that stops would take its shards' objects with it, and a group could not move (the new drive
    // is filled from the others while it serves).
    if parity == 0 {
        return Err(format!("an erasure code of {data}+0: a cluster's sets need at least one parity shard"));
    }
    let pg_count = number("placement groups", groups)?;
    let max_groups = crate::cluster::MAX_PLACEMENT_GROUPS;
    if !(1..=max_groups).contains(&pg_count) {
        return Err(format!("placement groups: {pg_count} is not between 1 and {max_groups}"));
    }
    let failure_domain = match *domain {
        "node" => mosaic_cluster::FailureDomain::Node,
        "zone" => mosaic_cluster::FailureDomain::Zone,
        other => return Err(format!("failure domain: {other:?} is not node or zone")),
    };
    Ok(crate::cluster::InitRequest { data_shards: data as u8, parity_shards: parity as u8, pg_count, failure_domain })
}

/// `check` on every drive: clean when every open drive is.
fn check_json(state: &AdminState) -> serde_json::Value {
    let mut clean = true;
    let mut drives = Vec::new();
    for d in state.drives.each() {
        let Some(e) = &d.engine else {
            drives.push(serde_json::json!({ "set": d.set, "slot": d.slot, "state": "offline" }));
            continue;
        };
        match e.check() {
            Ok(c) => {
                clean &= c.is_clean();
                drives.push(serde_json::json!({
                    "set": d.set,
                    "slot": d.slot,
                    "clean": c.is_clean(),
                    "objects": c.objects,
                    "referenced_blocks": c.referenced_blocks,
                    "used_blocks": c.used_blocks,
                    "leaked_blocks": c.leaked_blocks,
                    "doubly_used_blocks": c.doubly_used_blocks,
                    "unmarked_blocks": c.unmarked_blocks,
                    "problems": c.problems,
                }));
            }
            Err(err) => {
                clean = false;
                drives.push(serde_json::json!({ "set": d.set, "slot": d.slot, "error": err.to_string() }));
            }
        }
    }
    serde_json::json!({ "clean": clean, "drives": drives })
}

/// `scrub` on every drive: every block and fragment read back and checked.
fn scrub_drives_json(state: &AdminState) -> serde_json::Value {
    let (mut blocks, mut fragments) = (0u64, 0u64);
    let mut damaged = Vec::new();
    for d in state.drives.each() {
        let Some(e) = &d.engine else { continue };
        match e.scrub(None) {
            Ok(s) => {
                blocks += s.blocks_checked;
                fragments += s.fragments_checked;
                damaged.extend(s.damaged.iter().map(|(c, n, w)| {
                    serde_json::json!({
                        "set": d.set,
                        "slot": d.slot,
                        "bucket": c.strip_prefix("b/").unwrap_or(c),
                        "key": String::from_utf8_lossy(n),
                        "problem": w,
                    })
                }));
            }
            Err(err) => damaged.push(serde_json::json!({ "set": d.set, "slot": d.slot, "problem": err.to_string() })),
        }
    }
    serde_json::json!({ "blocks_checked": blocks, "fragments_checked": fragments, "damaged": damaged })
}

/// `/admin/v1/drives/SET/SLOT/fault/none|fail|read-only` (fault injection, testing only).
fn fault_request(path: &str) -> Result<(usize, usize, mosaic_engine::DeviceFault), String> {
    use mosaic_engine::DeviceFault;
    let parts: Vec<&str> = path.trim_start_matches("/admin/v1/drives/").split('/').collect();
    let [set, slot, "fault", fault] = parts.as_slice() else {
        return Err(format!("no admin endpoint POST {path}"));
    };
    let set = set.parse().map_err(|_| format!("{set:?} is not a set number"))?;
    let slot = slot.parse().map_err(|_| format!("{slot:?} is not a slot number"))?;
    let fault = match *fault {
        "none" => DeviceFault::None,
        "fail" => DeviceFault::Fail,
        "read-only" => DeviceFault::ReadOnly,
        other => return Err(format!("{other:?} is not one of none, fail, read-only")),
    };
    Ok((set, slot, fault))
}

/// `/admin/v1/drives/SET/SLOT/replace/HEXPATH`: the drive to replace and the directory of its successor.
fn replace_request(path: &str) -> Result<(usize, usize, std::path::PathBuf), String> {
    let parts: Vec<&str> = path.trim_start_matches("/admin/v1/drives/").split('/').collect();
    let [set, slot, "replace", hex_path] = parts.as_slice() else {
        return Err(format!("no admin endpoint POST {path}"));
    };
    let set = set.parse().map_err(|_| format!("{set:?} is not a set number"))?;
    let slot = slot.parse().map_err(|_| format!("{slot:?} is not a slot number"))?;
    let raw = hex::decode(hex_path).map_err(|_| "the new drive's path is not hex-encoded".to_string())?;
    let p = String::from_utf8(raw).map_err(|_| "the new drive's path is not UTF-8".to_string())?;
    if p.is_empty() {
        return Err("the new drive needs a path".into());
    }
    Ok((set, slot, std::path::PathBuf::from(p)))
}

/// Serves the admin API until `shutdown` resolves; with `tls`, over HTTPS only.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (st, tls, watcher) = (state.clone(), tls.clone(), graceful.watcher());
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(stream, peer, st, watcher).await;
            };
            if let Ok(Ok(stream)) = tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream)).await {
                serve_connection(stream, peer, st, watcher).await;
            }
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    Ok(())
}

/// How long a client has for its TLS handshake, and then for each request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The address a request came from (the console limits failed sign-ins by it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer(pub std::net::SocketAddr);

async fn serve_connection<I>(
    io: I,
    peer: std::net::SocketAddr,
    state: Arc<AdminState>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(
            TokioIo::new(io),
            service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(Peer(peer));
                route(state.clone(), req)
            }),
        );
    let _ = watcher.watch(conn).await;
}
