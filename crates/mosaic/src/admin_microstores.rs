//! The microstores' admin endpoints: `GET /admin/v1/microstores` (status),
//! `POST /admin/v1/microstores/create/{name}/{p99-ms|mib-s}/{target}/{class|any}/{workers}[/{sets}]` (sets:
//! the erasure sets its buckets' data lives on, such as `1,2`; none: every set, shared),
//! `POST /admin/v1/microstores/delete/{name}` and `POST /admin/v1/microstores/assign/{bucket}/{name|auto}`.
//! Every change is saved in the data directory before it applies. On a cluster node the catalog is the
//! cluster map's (the shared setting `microstores`): a change is planned from the map's catalog, set there
//! first, then saved and applied here, and every other node applies it as its map arrives.

use crate::cluster::Cluster;
use mosaic_microstore::manager::Target;
use mosaic_microstore::{Catalog, Class, Definition, Microstores};
use std::path::Path;

/// The map's shared setting that holds a cluster's microstores (the microstores file's text).
pub const CLUSTER_SETTING: &str = "microstores";
/// Tries of a change that other nodes' changes to the cluster's microstores refused.
const CLUSTER_CHANGE_TRIES: usize = 5;

/// A change on a cluster node (call it off the async runtime: it waits for the map). It is planned on a
/// scratch copy of the map's catalog (so no lock of the microstores that serve requests is held while the
/// map decides), set in the map from its version, then saved and served here; every other node applies it
/// as its map arrives.
pub fn route_in_cluster(
    ms: &Microstores,
    data_dir: &Path,
    cluster: &Cluster,
    method: &str,
    path: &str,
) -> (u16, serde_json::Value) {
    if method == "GET" {
        return route(ms, data_dir, 0, method, path);
    }
    let failed = |e: String| (500, serde_json::json!({ "error": format!("the cluster's microstores: {e}") }));
    let runtime = tokio::runtime::Handle::current();
    let mut last = String::new();
    for _ in 0..CLUSTER_CHANGE_TRIES {
        let shared = cluster.shared(CLUSTER_SETTING);
        let version = shared.as_ref().map_or(0, |s| s.version);
        // A map without microstores yet takes this node's (the first change after an upgrade publishes them).
        let base = match shared.map(|s| mosaic::datadir_format::parse_microstores(&s.value)).transpose() {
            Ok(base) => base.unwrap_or_else(|| ms.catalog()),
            Err(e) => return failed(e),
        };
        let scratch = Microstores::new(ms.config().clone(), Catalog::default())
            .and_then(|scratch| scratch.replace_catalog(base, |_| Ok(())).map(|()| scratch));
        let scratch = match scratch {
            Ok(s) => s,
            Err(e) => return failed(e),
        };
        let planned = parking_lot::Mutex::new(None);
        let plan = |c: &Catalog| {
            *planned.lock() = Some(c.clone());
            Ok(())
        };
        let (status, mut v) = route_with(&scratch, 0, method, path, &plan);
        // Refused (or nothing to change): answered as planned.
        let Some(next) = planned.into_inner() else { return (status, v) };
        let text = match mosaic::datadir_format::encode_microstores(&next) {
            Ok(t) => t,
            Err(e) => return failed(e),
        };
        match runtime.block_on(cluster.set_shared(CLUSTER_SETTING, text, version + 1)) {
            Ok(()) => {}
            // Another node changed the microstores since this one read them: plan again from theirs.
            Err(e) if e.contains(mosaic_cluster::map::SHARED_VERSION_REFUSED) => {
                last = e;
                continue;
            }
            Err(e) => return (409, serde_json::json!({ "error": e })),
        }
        // Served here at once (the map's follower then finds it applied).
        if let Err(e) = ms.replace_catalog(next, |c| crate::microstores_file::save(data_dir, c)) {
            return failed(e);
        }
        let parts: Vec<&str> = path.trim_start_matches("/admin/v1/microstores/").split('/').collect();
        if let Some(route) = route_of(ms, &parts) {
            v["routes_to"] = route.into();
        }
        return (status, v);
    }
    (
        409,
        serde_json::json!({ "error": format!("the cluster's microstores kept changing on other nodes; try again ({last})") }),
    )
}

/// Forgets a deleted bucket's hand assignment in the cluster's catalog (planned from the map's version,
/// tried again when another node changed it first); every node then applies the map's.
pub async fn forget_in_cluster(cluster: &Cluster, bucket: &str) {
    for _ in 0..CLUSTER_CHANGE_TRIES {
        let Some(shared) = cluster.shared(CLUSTER_SETTING).filter(|_| cluster.runs()) else { return };
        let mut catalog = match mosaic::datadir_format::parse_microstores(&shared.value) {
            Ok(c) => c,
            Err(e) => return tracing::warn!(error = %e, "the cluster's microstores cannot be read"),
        };
        if catalog.buckets.remove(bucket).is_none() {
            return;
        }
        let text = match mosaic::datadir_format::encode_microstores(&catalog) {
            Ok(t) => t,
            Err(e) => return tracing::warn!(error = %e, "the cluster's microstores cannot be written"),
        };
        match cluster.set_shared(CLUSTER_SETTING, text, shared.version + 1).await {
            Ok(()) => return,
            Err(e) if e.contains(mosaic_cluster::map::SHARED_VERSION_REFUSED) => continue,
            Err(e) => {
                return tracing::warn!(bucket, error = %e, "a deleted bucket's assignment stays in the cluster's microstores");
            }
        }
    }
    tracing::warn!(bucket, "a deleted bucket's assignment stays in the cluster's microstores: they kept changing");
}

/// Applies the cluster's microstores as the map has them (`text`, the microstores file's) on this node:
/// saved in `data_dir`, then served.
pub fn apply_cluster(ms: &Microstores, data_dir: &Path, text: &str) -> Result<(), String> {
    let catalog = mosaic::datadir_format::parse_microstores(text)?;
    if ms.catalog() == catalog {
        // This node made the change (it saved it then) or saved it before a restart.
        return Ok(());
    }
    ms.replace_catalog(catalog, |c| crate::microstores_file::save(data_dir, c))
}

/// The status, or the answer to a change: (HTTP status, JSON body). `pooled_sets`: the sets a microstore
/// may own (0 when the store is one set or a cluster's, where microstores share every set).
pub fn route(
    ms: &Microstores,
    data_dir: &Path,
    pooled_sets: usize,
    method: &str,
    path: &str,
) -> (u16, serde_json::Value) {
    let save = |c: &Catalog| crate::microstores_file::save(data_dir, c);
    route_with(ms, pooled_sets, method, path, &save)
}

/// The status, or a change stored through `save` before it applies.
fn route_with(
    ms: &Microstores,
    pooled_sets: usize,
    method: &str,
    path: &str,
    save: &dyn Fn(&Catalog) -> Result<(), String>,
) -> (u16, serde_json::Value) {
    if (method, path) == ("GET", "/admin/v1/microstores") {
        return match serde_json::to_value(ms.status()) {
            Ok(v) => (200, v),
            Err(e) => (500, serde_json::json!({ "error": e.to_string() })),
        };
    }
    let not_found = || (404, serde_json::json!({ "error": format!("no admin endpoint {method} {path}") }));
    let Some(args) = path.strip_prefix("/admin/v1/microstores/").filter(|_| method == "POST") else {
        return not_found();
    };
    let parts: Vec<&str> = args.split('/').collect();
    let done = match parts.as_slice() {
        ["create", name, kind, value, class, workers, sets @ ..] if sets.len() <= 1 => {
            let sets = sets.first().map_or(Ok(Vec::new()), |s| parse_sets(s, pooled_sets));
            match sets.and_then(|sets| definition(kind, value, class, workers, sets)) {
                Ok(d) => ms.create(name, d, save),
                Err(e) => return (400, serde_json::json!({ "error": e })),
            }
        }
        ["delete", name] => ms.delete(name, save),
        ["assign", bucket, target] => {
            if let Err(e) = mosaic_layer::validate_bucket_name(bucket) {
                return (400, serde_json::json!({ "error": e.to_string() }));
            }
            ms.assign(bucket, (*target != "auto").then_some(*target), save)
        }
        _ => return not_found(),
    };
    match done {
        Ok(()) => (200, serde_json::json!({ "ok": true, "routes_to": route_of(ms, &parts) })),
        Err(e) => (409, serde_json::json!({ "error": e })),
    }
}

fn route_of(ms: &Microstores, parts: &[&str]) -> Option<String> {
    match parts {
        ["assign", bucket, _] => Some(ms.route(Some(bucket))),
        _ => None,
    }
}

/// Sets as the path gives them ("1,2"): ascending, each one the server has.
fn parse_sets(text: &str, pooled_sets: usize) -> Result<Vec<usize>, String> {
    if pooled_sets == 0 {
        return Err("this server's store is one erasure set (or a cluster's groups): its microstores share it; \
                    own sets need several (drives in a multiple of the erasure code's width)"
            .into());
    }
    let sets = text
        .split(',')
        .map(|s| s.trim().parse::<usize>().map_err(|_| format!("sets: {s:?} is not a set number")))
        .collect::<Result<Vec<usize>, String>>()?;
    mosaic_microstore::registry::validate_sets(&sets, true)?;
    if let Some(s) = sets.iter().find(|s| **s >= pooled_sets) {
        return Err(format!("sets: this server has sets 0 to {}, not {s}", pooled_sets - 1));
    }
    Ok(sets)
}

fn definition(kind: &str, value: &str, class: &str, workers: &str, sets: Vec<usize>) -> Result<Definition, String> {
    let v: f64 = value.parse().map_err(|_| format!("target: {value:?} is not a number"))?;
    let target = match kind {
        "p99-ms" => Target::LatencyMsP99(v),
        "mib-s" => Target::ThroughputMibS(v),
        other => return Err(format!("target kind: {other:?} is not p99-ms or mib-s")),
    };
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("a target is a positive number, not {value}"));
    }
    let class = match class {
        "any" => None,
        c => Some(Class::parse(c).ok_or_else(|| format!("class: {c:?} is not a class"))?),
    };
    let workers = workers.parse().map_err(|_| format!("workers: {workers:?} is not a number"))?;
    Ok(Definition { target, class, workers, sets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_parsed_and_checked_against_the_servers() {
        assert_eq!(parse_sets("1,2", 4), Ok(vec![1, 2]));
        assert_eq!(parse_sets("3", 4), Ok(vec![3]));
        assert!(parse_sets("4", 4).unwrap_err().contains("0 to 3"));
        assert!(parse_sets("2,1", 4).is_err());
        assert!(parse_sets("1,x", 4).unwrap_err().contains("\"x\""));
        assert!(parse_sets("", 4).is_err());
        assert!(parse_sets("0", 0).unwrap_err().contains("one erasure set"));
    }

    #[test]
    fn a_microstore_with_sets_is_created_and_bad_ones_refused() {
        let d = tempfile::tempdir().unwrap();
        let ms = Microstores::new(Default::default(), Default::default()).unwrap();
        let post = |path: &str| route(&ms, d.path(), 2, "POST", path);
        assert_eq!(post("/admin/v1/microstores/create/small/p99-ms/20/any/4/1").0, 200);
        assert_eq!(ms.catalog().microstores["small"].sets, [1]);
        assert_eq!(post("/admin/v1/microstores/create/big/mib-s/100/any/4/2").0, 400);
        assert_eq!(post("/admin/v1/microstores/create/other/mib-s/100/any/4/0").0, 200, "every set owned");
        assert_eq!(post("/admin/v1/microstores/create/big/mib-s/100/any/4/0/1").0, 404);
        assert_eq!(post("/admin/v1/microstores/create/big/mib-s/100/any/4").0, 200);
        assert!(ms.catalog().microstores["big"].sets.is_empty());
        let stored = crate::microstores_file::load(d.path()).unwrap();
        assert_eq!(stored.microstores["small"].sets, [1], "saved before it applies");
    }
}
