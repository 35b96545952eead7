//! A moving group's next set: the drives its step moves to, as the rebalancer fills them and as every
//! node's writes follow their removals onto them.
//!
//! The step keeps some drives of the set served (they take every write and delete of the group) and fills
//! new ones from them. The fill copies an object at some moment; a delete after that reaches only the
//! set served, so the new drives would keep a copy the kept drives lack, and with k = m the copies tie
//! with the kept drives once the step is served, which brings the object back. So every node that
//! removes a name from a moving group's set (`StepFollower`) takes it off the new drives too, and the
//! fill decides each object from the kept drives (`SetConfig::decided_by`).

use crate::{NodeDrive, PgDrive, connect_drive, group_placement};
use futures::future::BoxFuture;
use mosaic_cluster::rpc::RpcClient;
use mosaic_cluster::{ClusterMap, DriveId, NodeId};
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, RemovalFollower, SetConfig, SetGeometry, Settle};
use mosaic_store::{StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a followed removal may take (the heal waits for the name's lock among the rest).
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(15);
/// After the next set failed to open, removals are not followed for this long (each would try again).
const OPEN_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A group's next set.
pub type StepSet = ErasureSet<PgDrive<NodeDrive>>;

/// Where a step set is: the group, the drives it moves to, and the slots the step keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub pg: usize,
    pub target: Vec<DriveId>,
    pub kept: u16,
}

impl Step {
    /// Group `pg`'s step as `map` places it; None when the group does not move.
    pub fn of(map: &ClusterMap, pg: usize) -> Option<Step> {
        let entry = map.pgs.get(pg)?;
        let from = entry.from.as_ref()?;
        let target = map.step_target(entry);
        debug_assert_eq!(from.len(), target.len());
        let kept = (0..from.len()).filter(|i| from[*i] == target[*i]).fold(0u16, |mask, i| mask | 1 << i);
        Some(Step { pg, target, kept })
    }
}

/// Opens the set over `step`'s drives with the settings of `cfg` (its locks, limits) made for filling:
/// it settles nothing, heals only when asked, and decides each object from the kept drives when at least
/// k are kept (fewer: more than m drives left the map, none saw every write, and it decides from all of
/// them without ever removing). Every drive must answer.
pub async fn open_step_set(
    map: &ClusterMap,
    me: NodeId,
    step: &Step,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
    cfg: SetConfig,
) -> Result<StepSet, String> {
    // Fenced with the placement served: once a newer map places the group otherwise, the drives' nodes
    // refuse these commands.
    let placement = group_placement(map, step.pg);
    let mut members = Vec::with_capacity(step.target.len());
    for (slot, id) in step.target.iter().enumerate() {
        let drive = connect_drive(map, me, *id, local, client)
            .await
            .ok_or(format!("drive {id} of its next set does not answer"))?;
        let drive = Arc::new(drive.for_group(placement.clone(), slot));
        members.push(Some(Arc::new(PgDrive::new(drive, step.pg as u32, slot))));
    }
    let geometry = SetGeometry::new(map.data_shards as usize, map.parity_shards as usize).map_err(|e| e.to_string())?;
    let cfg = SetConfig {
        geometry,
        heal_in_background: false,
        scan_interval: None,
        settle_at_open: Settle::Never,
        heal_removes: false,
        kept_drives: None,
        decided_by: Some(step.kept).filter(|kept| kept.count_ones() as usize >= geometry.data),
        removal_follower: None,
        ..cfg
    };
    ErasureSet::open(cfg, members).await.map_err(|e| e.to_string())
}

/// A moving group's removals followed onto its next set: after a write took a name away from the set
/// served, the name is healed on the next set (decided by the kept drives, which took the removal), so a
/// copy the fill made before it goes too. The next set is opened at the first removal.
pub struct StepFollower {
    map: Arc<ClusterMap>,
    me: NodeId,
    step: Step,
    local: Arc<HashMap<DriveId, DriveStore>>,
    client: RpcClient,
    /// The settings of the node's sets, with its object locks: the heal orders itself with every node's
    /// writes of the name.
    cfg: SetConfig,
    set: tokio::sync::OnceCell<StepSet>,
    /// When the next set last failed to open.
    open_failed_at: parking_lot::Mutex<Option<Instant>>,
}

impl StepFollower {
    pub fn new(
        map: Arc<ClusterMap>,
        me: NodeId,
        step: Step,
        local: Arc<HashMap<DriveId, DriveStore>>,
        client: RpcClient,
        cfg: SetConfig,
    ) -> Self {
        let set = tokio::sync::OnceCell::new();
        StepFollower { map, me, step, local, client, cfg, set, open_failed_at: parking_lot::Mutex::new(None) }
    }

    /// The next set, opened at the first call; a failure to open is remembered for `OPEN_RETRY_AFTER`.
    async fn next_set(&self) -> StoreResult<&StepSet> {
        let pg = self.step.pg;
        if self.open_failed_at.lock().is_some_and(|at| at.elapsed() < OPEN_RETRY_AFTER) {
            return Err(StoreError::unavailable(format!("group {pg}'s next set did not open a moment ago")));
        }
        let opened = self
            .set
            .get_or_try_init(|| async {
                open_step_set(&self.map, self.me, &self.step, &self.local, &self.client, self.cfg.clone())
                    .await
                    .map_err(|e| StoreError::unavailable(format!("group {pg}'s next set: {e}")))
            })
            .await;
        if opened.is_err() {
            *self.open_failed_at.lock() = Some(Instant::now());
        }
        opened
    }
}

impl RemovalFollower for StepFollower {
    fn removed<'a>(&'a self, coll: &'a str, name: &'a [u8]) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let followed = async { self.next_set().await?.heal_object(coll, name).await };
            match tokio::time::timeout(FOLLOW_TIMEOUT, followed).await {
                Ok(healed) => healed.map(|_| ()),
                Err(_) => Err(StoreError::unavailable(format!("not followed within {FOLLOW_TIMEOUT:?}"))),
            }
        })
    }
}
