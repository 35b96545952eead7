//! The microstores' admin endpoints: `GET /admin/v1/microstores` (status),
//! `POST /admin/v1/microstores/create/{name}/{p99-ms|mib-s}/{target}/{class|any}/{workers}`,
//! `POST /admin/v1/microstores/delete/{name}` and `POST /admin/v1/microstores/assign/{bucket}/{name|auto}`.
//! Every change is saved in the data directory before it applies.

use mosaic_microstore::manager::Target;
use mosaic_microstore::{Class, Definition, Microstores};
use std::path::Path;

/// The status, or the answer to a change: (HTTP status, JSON body).
pub fn route(ms: &Microstores, data_dir: &Path, method: &str, path: &str) -> (u16, serde_json::Value) {
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
    let save = |c: &mosaic_microstore::Catalog| crate::microstores_file::save(data_dir, c);
    let parts: Vec<&str> = args.split('/').collect();
    let done = match parts.as_slice() {
        ["create", name, kind, value, class, workers] => match definition(kind, value, class, workers) {
            Ok(d) => ms.create(name, d, save),
            Err(e) => return (400, serde_json::json!({ "error": e })),
        },
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

fn definition(kind: &str, value: &str, class: &str, workers: &str) -> Result<Definition, String> {
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
    Ok(Definition { target, class, workers })
}
