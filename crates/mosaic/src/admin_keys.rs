//! The admin API for access keys (root credentials only):
//!
//! - `GET /admin/v1/keys`: every key and its grants (never a secret).
//! - `POST /admin/v1/keys`: a new key; the answer holds its secret, shown this once.
//! - `DELETE /admin/v1/keys/{key}`
//! - `POST /admin/v1/keys/{key}/allow/{bucket}/{read|write|read-write}`
//! - `POST /admin/v1/keys/{key}/deny/{bucket}/{read|write|read-write}`
//!
//! Every change is written to the data directory (synced) before it is answered and before it applies. On
//! a cluster node the keys are the cluster's: a change is made to the map's shared setting `keys` through
//! Raft first, and every node applies the map's keys as they change, so a key made through one node is
//! served by all of them.

use crate::admin_server::AdminState;
use mosaic_s3::access::{AccessKey, Grant, KeyRing, KeySet};
use serde_json::{Value, json};

fn error(status: u16, msg: impl Into<String>) -> (u16, Value) {
    (status, json!({ "error": msg.into() }))
}

fn list(set: &KeySet) -> Value {
    let keys: Vec<Value> = set
        .keys
        .iter()
        .map(|(ak, k)| {
            let grants: serde_json::Map<String, Value> =
                k.grants.iter().map(|(b, g)| (b.clone(), Value::String(grant_name(*g).into()))).collect();
            json!({ "access_key": ak, "created_unix_s": k.created_unix_s, "owner": k.owner, "grants": grants })
        })
        .collect();
    json!({ "keys": keys })
}

fn grant_name(g: Grant) -> &'static str {
    match (g.read, g.write) {
        (true, true) => "read-write",
        (true, false) => "read",
        (false, true) => "write",
        (false, false) => "none",
    }
}

fn parse_grant(s: &str) -> Option<Grant> {
    match s {
        "read" => Some(Grant { read: true, write: false }),
        "write" => Some(Grant { read: false, write: true }),
        "read-write" => Some(Grant { read: true, write: true }),
        _ => None,
    }
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The map's shared setting that holds a cluster's access keys (the keys file's text).
pub const CLUSTER_SETTING: &str = "keys";
/// Tries of a change that other nodes' changes to the cluster's keys refused.
const CLUSTER_CHANGE_TRIES: usize = 5;

/// Applies `f` to the key set and saves it before it applies: on a standalone server this node's set; on a
/// cluster node the cluster's, planned from the map's version and set there first (a node whose set the
/// map does not hold yet publishes its own), then saved here.
fn change<T>(state: &AdminState, f: impl Fn(&mut KeySet) -> Result<T, String>) -> Result<T, String> {
    let save = |set: &KeySet| crate::keys_file::save(&state.data_dir, set);
    let Some(cluster) = state.cluster.as_ref().filter(|c| c.runs()) else { return state.keys.update(f, save) };
    let runtime = tokio::runtime::Handle::current();
    let mut last = String::new();
    for _ in 0..CLUSTER_CHANGE_TRIES {
        let shared = cluster.shared(CLUSTER_SETTING);
        let version = shared.as_ref().map_or(0, |s| s.version);
        let base = shared.map(|s| mosaic::datadir_format::parse_keys(&s.value)).transpose()?;
        let planned = |set: &mut KeySet| {
            if let Some(base) = &base {
                set.clone_from(base);
            }
            f(set)
        };
        let publish = |set: &KeySet| {
            let text = mosaic::datadir_format::encode_keys(set)?;
            runtime.block_on(cluster.set_shared(CLUSTER_SETTING, text, version + 1))?;
            save(set)
        };
        match state.keys.update(planned, publish) {
            // Another node changed the keys since this one read them: plan again from theirs.
            Err(e) if e.contains(mosaic_cluster::map::SHARED_VERSION_REFUSED) => last = e,
            done => return done,
        }
    }
    Err(format!("the cluster's access keys kept changing on other nodes; try again ({last})"))
}

/// Applies the cluster's access keys as the map has them (`text`, the keys file's) on this node: saved in
/// `data_dir`, then served.
pub fn apply_cluster_keys(keys: &KeyRing, data_dir: &std::path::Path, text: &str) -> Result<(), String> {
    let cluster_keys = mosaic::datadir_format::parse_keys(text)?;
    if *keys.snapshot() == cluster_keys {
        // This node made the change (it saved it then) or saved it before a restart.
        return Ok(());
    }
    let replace = |set: &mut KeySet| {
        set.clone_from(&cluster_keys);
        Ok(())
    };
    keys.update(replace, |set| crate::keys_file::save(data_dir, set))
}

pub fn route(state: &AdminState, method: &str, path: &str) -> (u16, Value) {
    let rest = path.strip_prefix("/admin/v1/keys").unwrap_or("");
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (method, parts.as_slice()) {
        ("GET", []) => (200, list(&state.keys.snapshot())),
        // An owning key (`owner`) may create buckets, which it then owns.
        ("POST", []) | ("POST", ["owner"]) => {
            let owner = parts.len() == 1;
            let access_key =
                format!("MK{}", crate::datadir::random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 18));
            let secret_key =
                crate::datadir::random_string(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 40);
            let key = AccessKey {
                secret_key: secret_key.clone(),
                created_unix_s: now_unix_s(),
                grants: Default::default(),
                owner,
            };
            let added = change(state, |set| {
                if set.keys.contains_key(&access_key) {
                    return Err("key collision, try again".into());
                }
                set.keys.insert(access_key.clone(), key.clone());
                Ok(())
            });
            match added {
                Ok(()) => (200, json!({ "access_key": access_key, "secret_key": secret_key, "owner": owner })),
                Err(e) => error(409, e),
            }
        }
        ("DELETE", [ak]) => {
            let ak = ak.to_string();
            let r = change(state, |set| set.keys.remove(&ak).map(|_| ()).ok_or_else(|| format!("no access key {ak}")));
            match r {
                Ok(()) => (200, json!({ "deleted": ak })),
                Err(e) if e.starts_with("no access key") => error(404, e),
                Err(e) => error(500, e),
            }
        }
        ("POST", [ak, verb @ ("allow" | "deny"), bucket, what]) => {
            let Some(g) = parse_grant(what) else {
                return error(400, format!("unknown access {what:?}: use read, write or read-write"));
            };
            if let Err(e) = mosaic_layer::validate_bucket_name(bucket) {
                return error(400, e.to_string());
            }
            let (ak, bucket, allow) = (ak.to_string(), bucket.to_string(), *verb == "allow");
            let r = change(state, |set| {
                let key = set.keys.get_mut(&ak).ok_or_else(|| format!("no access key {ak}"))?;
                let cur = key.grants.get(&bucket).copied().unwrap_or_default();
                let next = if allow {
                    Grant { read: cur.read || g.read, write: cur.write || g.write }
                } else {
                    Grant { read: cur.read && !g.read, write: cur.write && !g.write }
                };
                if next == Grant::default() {
                    key.grants.remove(&bucket);
                } else {
                    key.grants.insert(bucket.clone(), next);
                }
                Ok(next)
            });
            match r {
                Ok(next) => (200, json!({ "access_key": ak, "bucket": bucket, "access": grant_name(next) })),
                Err(e) if e.starts_with("no access key") => error(404, e),
                Err(e) if e.contains("at most") => error(409, e),
                Err(e) => error(500, e),
            }
        }
        _ => error(404, format!("no admin endpoint {method} {path}")),
    }
}
