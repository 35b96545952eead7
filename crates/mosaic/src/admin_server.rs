//! The admin port: health checks, Prometheus metrics, and the authenticated admin API that
//! `mosaic admin` talks to.

use crate::admin_auth;
use crate::datadir::Credentials;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use mosaic_engine::Engine;
use mosaic_layer::ObjectLayer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

pub struct AdminState {
    pub layer: Arc<dyn ObjectLayer>,
    pub engine: Engine,
    pub creds: Credentials,
    pub keys: Arc<mosaic_s3::access::KeyRing>,
    pub data_dir: std::path::PathBuf,
    pub prometheus: PrometheusHandle,
    pub started: Instant,
}

type Resp = http::Response<Full<Bytes>>;

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

/// Publishes the engine's counters as gauges, then renders every metric.
fn render_metrics(state: &AdminState) -> String {
    let s = state.engine.stats();
    let g = |name: &'static str, v: u64| metrics::gauge!(name).set(v as f64);
    g("mosaic_engine_user_bytes_written", s.user_bytes_written);
    g("mosaic_engine_device_bytes_written", s.device_bytes_written);
    g("mosaic_engine_device_bytes_read", s.device_bytes_read);
    g("mosaic_engine_cached_bytes_read", s.cached_bytes_read);
    g("mosaic_engine_cache_rereads", s.cache_rereads);
    let scrub = state.engine.scrub_status();
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
    g("mosaic_engine_device_flushes", s.device_flushes);
    g("mosaic_engine_free_blocks", s.free_blocks);
    g("mosaic_engine_total_blocks", s.total_blocks);
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
        metrics::gauge!("mosaic_engine_queue_depth", "class" => class.name()).set(*depth as f64);
    }
    for (i, v) in s.io_size_hist.iter().enumerate() {
        let le = format!("{}", 4096u64 << i);
        metrics::gauge!("mosaic_engine_io_size_count", "size_bytes" => le).set(*v as f64);
    }
    state.prometheus.render()
}

/// The background scrub's progress and the damaged objects of its last finished pass, by name.
fn scrub_json(state: &AdminState) -> serde_json::Value {
    let status = state.engine.scrub_status();
    let reader = state.engine.reader();
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

fn stats_json(state: &AdminState) -> serde_json::Value {
    let s = state.engine.stats();
    let space = state.engine.space_usage();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": state.started.elapsed().as_secs(),
        "ready": state.layer.is_ready(),
        "drive": {
            "uuid": hex::encode(state.engine.uuid()),
            "used_bytes": space.used_bytes,
            "allocated_bytes": space.allocated_bytes,
            "max_bytes": space.capacity_bytes,
            "free_bytes": space.capacity_bytes - space.used_bytes,
            "free_extents": s.free_extents,
            "user_bytes_written": s.user_bytes_written,
            "device_bytes_written": s.device_bytes_written,
            "device_bytes_read": s.device_bytes_read,
            "cached_bytes_read": s.cached_bytes_read,
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
        },
        "background_scrub": scrub_json(state),
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
    let st = state.clone();
    let resp = match (method.as_str(), path.as_str()) {
        ("GET", "/admin/v1/info") => json(200, stats_json(&state)),
        ("POST", "/admin/v1/check") => {
            let r = tokio::task::spawn_blocking(move || st.engine.check()).await;
            match r {
                Ok(Ok(c)) => json(
                    200,
                    serde_json::json!({
                        "clean": c.is_clean(),
                        "objects": c.objects,
                        "referenced_blocks": c.referenced_blocks,
                        "used_blocks": c.used_blocks,
                        "leaked_blocks": c.leaked_blocks,
                        "doubly_used_blocks": c.doubly_used_blocks,
                        "unmarked_blocks": c.unmarked_blocks,
                        "problems": c.problems,
                    }),
                ),
                Ok(Err(e)) => json(500, serde_json::json!({ "error": e.to_string() })),
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        ("POST", "/admin/v1/scrub") => {
            let r = tokio::task::spawn_blocking(move || st.engine.scrub(None)).await;
            match r {
                Ok(Ok(s)) => json(
                    200,
                    serde_json::json!({
                        "blocks_checked": s.blocks_checked,
                        "fragments_checked": s.fragments_checked,
                        "damaged": s.damaged.iter().map(|(c, n, w)| serde_json::json!({
                            "bucket": c.strip_prefix("b/").unwrap_or(c),
                            "key": String::from_utf8_lossy(n),
                            "problem": w,
                        })).collect::<Vec<_>>(),
                    }),
                ),
                Ok(Err(e)) => json(500, serde_json::json!({ "error": e.to_string() })),
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        _ if path == "/admin/v1/keys" || path.starts_with("/admin/v1/keys/") => {
            let st = state.clone();
            let (m, p) = (method.clone(), path.clone());
            match tokio::task::spawn_blocking(move || crate::admin_keys::route(&st, &m, &p)).await {
                Ok((status, v)) => json(status, v),
                Err(e) => json(500, serde_json::json!({ "error": e.to_string() })),
            }
        }
        _ => json(404, serde_json::json!({ "error": format!("no admin endpoint {method} {path}") })),
    };
    Ok(resp)
}

pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let st = state.clone();
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(TokioIo::new(stream), service_fn(move |req| route(st.clone(), req)));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    Ok(())
}
