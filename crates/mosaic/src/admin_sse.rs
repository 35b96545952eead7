//! `POST /admin/v1/sse/rotate` (root credentials only): a new SSE master key seals new objects from now
//! on; the older keys stay to open what they sealed.
//!
//! A standalone server saves the extended set (synced) before it serves it. On a cluster node the keys are
//! the cluster's (the map's shared setting `sse-keys`; every node saves and serves the map's keys as they
//! change), and a rotation is two changes: the new key is added as pending (known, not sealing), and only
//! once every node the map counts as up applied that does a second change make it seal, so that no node
//! seals an object that another node cannot open. A rotation that stops between the two (a node did not
//! apply in time) leaves the key pending; the next rotation makes it seal.

use crate::admin_server::AdminState;
use crate::cluster::Cluster;
use mosaic_crypt::MasterKeys;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// The map's shared setting that holds a cluster's SSE master keys (the `sse-keys` file's text).
pub const CLUSTER_SETTING: &str = "sse-keys";
/// Tries of a change that other nodes' changes to the cluster's keys refused.
const CLUSTER_CHANGE_TRIES: usize = 5;
/// How long a rotation waits for every node to apply the pending key (and then the sealing one).
const ROTATE_WAIT: Duration = Duration::from_secs(60);

/// One change of this node's keys at a time (a rotation here, the cluster's keys applied): each reads the
/// keys served, saves the next set, then serves it.
static CHANGING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn error(status: u16, msg: impl Into<String>) -> (u16, Value) {
    (status, json!({ "error": msg.into() }))
}

pub fn rotate(state: &AdminState) -> (u16, Value) {
    if state.sse_given {
        return error(409, "the SSE master key is given in the config (sse_master_key): it is changed there");
    }
    let rotated = match state.cluster.as_ref().filter(|c| c.runs()) {
        None => rotate_here(state).map(|id| json!({ "sealing": id })),
        Some(cluster) => rotate_in_cluster(state, cluster),
    };
    match rotated {
        Ok(v) => (200, v),
        Err(e) => error(503, e),
    }
}

/// A standalone server's rotation: saved, then served.
fn rotate_here(state: &AdminState) -> Result<u32, String> {
    let _one = CHANGING.lock();
    let mut keys = state.sse_keys.master_keys();
    let id = keys.rotate().map_err(|e| e.to_string())?;
    crate::sse_keys_file::save(&state.data_dir, &keys)?;
    state.sse_keys.extend_master(keys.clone()).map_err(|e| e.to_string())?;
    if let Some(cluster) = &state.cluster {
        // A node waiting to join: what it shows the member that invites it.
        cluster.set_shared_sse(&keys);
    }
    tracing::info!(key = id, "rotated the SSE master key");
    Ok(id)
}

/// A cluster's rotation: a pending key every node applies, then that key sealing.
fn rotate_in_cluster(state: &AdminState, cluster: &Cluster) -> Result<Value, String> {
    let runtime = tokio::runtime::Handle::current();
    let (keys, version) = change(state, cluster, |keys| match keys.pending() {
        // Left by a rotation that stopped before its key sealed: that one is made to seal.
        Some(_) => Ok(false),
        None => keys.add_pending().map(|_| true).map_err(|e| e.to_string()),
    })?;
    let id = keys.pending().expect("a pending key after the first change");
    runtime.block_on(cluster.wait_for_shared(CLUSTER_SETTING, version, ROTATE_WAIT)).map_err(|e| {
        format!(
            "master key {id} is known to the cluster and does not seal yet: {e}; run the rotation again once \
             every node is up"
        )
    })?;
    let (keys, version) = change(state, cluster, |keys| {
        if keys.current().0 >= id {
            return Ok(false);
        }
        *keys = keys.clone().sealing_with(id).map_err(|e| e.to_string())?;
        Ok(true)
    })?;
    debug_assert!(keys.current().0 >= id);
    // Sealing already where applied; a node that has not applied yet seals with the older key meanwhile,
    // which every node opens: a wait that ends early is reported, not an error.
    let everywhere = runtime.block_on(cluster.wait_for_shared(CLUSTER_SETTING, version, ROTATE_WAIT));
    tracing::info!(key = id, version, "rotated the cluster's SSE master key");
    Ok(json!({ "sealing": id, "version": version, "applied_everywhere": everywhere.is_ok() }))
}

/// Changes the cluster's keys with `f` (false: nothing to change), planned from the map's version (a node
/// whose map holds none plans from its own, which every node took when it joined) and refused when
/// another node changed them first (then planned again). Returns the keys and their version in the map.
fn change(
    state: &AdminState,
    cluster: &Cluster,
    f: impl Fn(&mut MasterKeys) -> Result<bool, String>,
) -> Result<(MasterKeys, u64), String> {
    let runtime = tokio::runtime::Handle::current();
    let mut last = String::new();
    for _ in 0..CLUSTER_CHANGE_TRIES {
        let shared = cluster.shared(CLUSTER_SETTING);
        let version = shared.as_ref().map_or(0, |s| s.version);
        let served = state.sse_keys.master_keys();
        let base = match shared {
            Some(s) => mosaic::datadir_format::parse_master_keys(&s.value)?,
            None => served.clone(),
        };
        if !base.extends(&served) {
            return Err("the cluster's SSE master keys do not hold every key this node serves: not changed".into());
        }
        let mut keys = base;
        if !f(&mut keys)? {
            return Ok((keys, version));
        }
        let text = mosaic::datadir_format::encode_master_keys(&keys);
        match runtime.block_on(cluster.set_shared(CLUSTER_SETTING, text, version + 1)) {
            Ok(()) => return Ok((keys, version + 1)),
            // Another node changed the keys since this one read them: plan again from theirs.
            Err(e) if e.contains(mosaic_cluster::map::SHARED_VERSION_REFUSED) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(format!("the cluster's SSE master keys kept changing on other nodes; try again ({last})"))
}

/// Applies the cluster's SSE master keys as the map has them (`text`, the keys file's) on this node: saved
/// in `data_dir`, then served. Keys that do not hold every key this node serves are refused (what this
/// node sealed must keep opening).
pub fn apply_cluster_sse(sse: &mosaic_layer::SseKeys, data_dir: &Path, text: &str) -> Result<(), String> {
    let _one = CHANGING.lock();
    let cluster = mosaic::datadir_format::parse_master_keys(text)?;
    let served = sse.master_keys();
    if cluster == served {
        return Ok(());
    }
    if !cluster.extends(&served) {
        return Err("the cluster's SSE master keys do not hold every key this node serves (was a key rotated on \
                    this node alone, offline?): not taken, so that what this node sealed keeps opening"
            .into());
    }
    crate::sse_keys_file::save(data_dir, &cluster)?;
    sse.extend_master(cluster).map_err(|e| e.to_string())
}
