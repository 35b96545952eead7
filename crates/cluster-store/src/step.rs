//! A moving group's next set: the drives its step moves to, as the rebalancer fills them and as every
//! node's writes follow their removals onto them.
//!
//! The step keeps some drives of the set served (they take every write and delete of the group) and fills
//! new ones from them. The fill copies an object at some moment; a delete after that reaches only the
//! set served, so the new drives would keep a copy the kept drives lack, and with k = m the copies tie
//! with the kept drives once the step is served, which brings the object back. So every node that
//! removes a name from a moving group's set (`StepFollower`) takes it off the new drives too (those that
//! answer), and the fill decides each object from the kept drives (`SetConfig::decided_by`). The follow
//! runs under the write's locks (the cluster's object locks among them), and the fill copies each object
//! under those locks too: a copy decided before a delete lands before the delete, whose follow takes it
//! away, and no heal on another node (the step may be served by then, where the copy ties with the kept
//! drives that lack it) acts between the delete and its follow.
//!
//! A removal that could not be followed (a new drive did not answer, a node of the set served was marked
//! down so that the step kept nothing, the node crashed between its commit and the follow) is caught by
//! the step: every node counts its removals under way and not followed per group (`FollowTally`), and a
//! fill during which any count changed on any node does not end the step (`fill_following`): the step
//! starts again, and its next fill finds the name gone from the kept drives and takes the copy off the
//! new ones.
//!
//! The last count seals the step on every node asked (`FollowTally::seal`): from then on a sealed node
//! refuses the group's removals under that step (a retryable error; other writes go on, armed) until it
//! serves a placement where the step is done, or the step is armed again, so no removal can slip in
//! between the last count and the switch. Two ways around a seal remain, and the cluster map's write
//! fence closes both: a node that restarted (its seals gone with its process) and a seal that lapsed
//! (`SEAL_LEASE`, if its rebalancer died). Such a node raises the fence through Raft, and waits until
//! that is committed and it serves a placement at least as new, before it writes to a moving group
//! (`FollowTally::fenced`); the step's report names the fence the rebalancer read before its count, and
//! the map refuses it once the fence moved (`Change::MoveDoneFenced`). A report committed before the
//! fence is in the placement the node then serves; one after it is refused, and the step starts again.
//!
//! Only a step being filled needs its removals followed: before its fill begins, its new drives hold
//! nothing the fill of this step copied (what an earlier attempt left there, the next fill decides from
//! the kept drives). So a node follows a group's removals only once the step was armed on it
//! (`FollowTally::arm`, when the rebalancer asks it for its count), and the fill begins only once every
//! removal begun before that count has ended (`arm_step`). The kept drives' rule (`SetConfig::kept_drives`:
//! a write commits on the kept drives first and needs their share) is armed the same way: a write begun
//! before the arming may have reached a write quorum with too few kept drives, so the rebalancer arms the
//! step, waits for every write begun before to end, heals the set served whole (that rebuilds what such a
//! write left short on the kept drives) and only then fills. While a move waits its turn, the writes and
//! deletes in its groups cost what they cost elsewhere (all drives at once, no renewed locks, no next set
//! opened, no follow).

use crate::{NodeDrive, PgDrive, connect_drive, group_placement};
use futures::future::BoxFuture;
use mosaic_cluster::rpc::RpcClient;
use mosaic_cluster::{ClusterMap, DriveId, NodeId};
use mosaic_drive::DriveStore;
use mosaic_erasure::{ErasureSet, RemovalFollower, SetConfig, SetGeometry, Settle};
use mosaic_store::{ErrorKind, StoreError, StoreResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Longest a followed removal may take: it begins under the write's locks within their use window
/// (`LockClient::USE_WITHIN`) and ends within that window's length, inside their lease, before another
/// writer can take them.
const FOLLOW_TIMEOUT: Duration = mosaic_cluster::locks::LockClient::USE_WITHIN;
/// A next set opened without some of its drives is opened again after this long (a drive that did not
/// answer may answer again before the map marks its node down or a new map composes the store anew).
const OPEN_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Rounds of a fill (`fill`) a step runs before it tries again later.
const MAX_FILL_ROUNDS: usize = 16;
/// Objects copied per heal call of a fill (its pace is kept between calls).
const FILL_HEAL_STEP: usize = 16;
/// Longest wait for the removals under way at the end of a fill to end (a follow ends within
/// `FOLLOW_TIMEOUT`), and how often the nodes are asked meanwhile.
const FOLLOW_SETTLE_WAIT: Duration = Duration::from_secs(20);
const FOLLOW_SETTLE_POLL: Duration = Duration::from_millis(50);
/// Writes under way per group on one node: far above the requests a node serves at once.
const MAX_UNDER_WAY: usize = 1 << 20;
/// How long a step's last count keeps a node's removals from the group sealed without news from its
/// rebalancer (each count asked renews it). The switch takes one Raft commit and the map reaching every
/// node, usually tens of milliseconds; past the lease the node raises the write fence before it removes.
pub const SEAL_LEASE: Duration = Duration::from_secs(10);
/// Longest a write to a moving group waits for its node's first write fence (a start: one Raft commit)
/// before it is refused.
const FENCE_WAIT: Duration = Duration::from_secs(10);

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
    let (set, missing) = open_reachable(map, me, step, local, client, cfg, Work::Background).await?;
    match missing.first() {
        Some(id) => Err(format!("drive {id} of its next set does not answer")),
        None => Ok(set),
    }
}

/// Whose work a set does: a fill's waits for the node's foreground work as heal does, a request's (a
/// removal followed) does not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Foreground,
    Background,
}

/// `open_step_set` over the drives that answer (a drive on a node the map marks down is not asked), and
/// the drives that are missing.
async fn open_reachable(
    map: &ClusterMap,
    me: NodeId,
    step: &Step,
    local: &HashMap<DriveId, DriveStore>,
    client: &RpcClient,
    cfg: SetConfig,
    work: Work,
) -> Result<(StepSet, Vec<DriveId>), String> {
    // Fenced with the placement served: once a newer map places the group otherwise, the drives' nodes
    // refuse these commands.
    let placement = group_placement(map, step.pg);
    let connects = step.target.iter().map(|id| async move {
        let down = map.drives.get(id).is_none_or(|d| d.node != me && crate::node_is_down(map, d.node));
        if down { None } else { connect_drive(map, me, *id, local, client).await }
    });
    let drives = futures::future::join_all(connects).await;
    let missing: Vec<DriveId> =
        step.target.iter().zip(&drives).filter(|(_, d)| d.is_none()).map(|(id, _)| *id).collect();
    let members = drives
        .into_iter()
        .enumerate()
        .map(|(slot, drive)| {
            let drive = Arc::new(drive?.for_group(placement.clone(), slot));
            Some(Arc::new(PgDrive::new(drive, step.pg as u32, slot)))
        })
        .collect();
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
        // A removal followed is a request's own work: it must not wait for the node's foreground work
        // as a fill does.
        node_foreground: if work == Work::Background { cfg.node_foreground } else { None },
        ..cfg
    };
    let set = ErasureSet::open(cfg, members).await.map_err(|e| e.to_string())?;
    Ok((set, missing))
}

/// A moving group's removals followed onto its next set: after a write took a name away from the set
/// served, the name is healed on the next set (decided by the kept drives, which took the removal), so a
/// copy the fill made before it goes too, from every new drive that answers. A removal that did not reach
/// every new drive is counted in the node's `FollowTally`. The next set is opened at the first removal.
pub struct StepFollower {
    map: Arc<ClusterMap>,
    me: NodeId,
    step: Step,
    local: Arc<HashMap<DriveId, DriveStore>>,
    client: RpcClient,
    /// The settings of the node's sets, without the cluster's object locks: the heal of a removal runs
    /// under the write's (`RemovalFollower::removed`).
    cfg: SetConfig,
    /// False while a node of the set served is marked down: the step keeps no drives then (writes need
    /// only their quorum), so removals are counted, not followed.
    follows: bool,
    tally: Arc<FollowTally>,
    /// The next set as last opened: with every drive (kept), or without some (opened again after
    /// `OPEN_RETRY_AFTER`). Held while opening, so that removals at once open it once.
    set: tokio::sync::Mutex<Option<Opened>>,
}

struct Opened {
    set: Arc<StepSet>,
    missing: Vec<DriveId>,
    at: Instant,
}

impl StepFollower {
    pub fn new(
        map: Arc<ClusterMap>,
        me: NodeId,
        step: Step,
        local: Arc<HashMap<DriveId, DriveStore>>,
        client: RpcClient,
        cfg: SetConfig,
        tally: Arc<FollowTally>,
    ) -> Self {
        let set = tokio::sync::Mutex::new(None);
        let cfg = SetConfig { shared_locks: None, ..cfg };
        StepFollower { map, me, step, local, client, cfg, follows: true, tally, set }
    }

    /// This follower, counting its removals without following them (the step keeps no drives).
    pub fn counting_only(self) -> Self {
        StepFollower { follows: false, ..self }
    }

    /// The next set over the drives that answer, and those that do not.
    async fn next_set(&self) -> StoreResult<(Arc<StepSet>, Vec<DriveId>)> {
        let mut opened = self.set.lock().await;
        let fresh = |o: &Opened| o.missing.is_empty() || o.at.elapsed() < OPEN_RETRY_AFTER;
        if let Some(o) = opened.as_ref().filter(|o| fresh(o)) {
            return Ok((o.set.clone(), o.missing.clone()));
        }
        let (set, missing) = open_reachable(
            &self.map,
            self.me,
            &self.step,
            &self.local,
            &self.client,
            self.cfg.clone(),
            Work::Foreground,
        )
        .await
        .map_err(|e| StoreError::unavailable(format!("group {}'s next set: {e}", self.step.pg)))?;
        let set = Arc::new(set);
        *opened = Some(Opened { set: set.clone(), missing: missing.clone(), at: Instant::now() });
        Ok((set, missing))
    }

    async fn follow(&self, coll: &str, name: &[u8]) -> StoreResult<()> {
        if !self.follows {
            return Err(StoreError::unavailable("a node of the group's set is down: its step keeps no drives"));
        }
        let (set, missing) = self.next_set().await?;
        set.heal_object(coll, name).await?;
        match missing.as_slice() {
            [] => Ok(()),
            _ => Err(StoreError::unavailable(format!("followed without the next set's drives {missing:?}"))),
        }
    }
}

impl RemovalFollower for StepFollower {
    fn begin(&self, removes: bool) -> BoxFuture<'_, StoreResult<mosaic_erasure::WriteBegun>> {
        Box::pin(async move {
            let (pg, target) = (self.step.pg as u32, &self.step.target);
            let (under_way, armed) = self.tally.begin(pg, target, self.map.placement_epoch, removes).await?;
            Ok(mosaic_erasure::WriteBegun { under_way: Box::new(under_way), armed })
        })
    }

    fn removed<'a>(&'a self, coll: &'a str, name: &'a [u8]) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let followed = match tokio::time::timeout(FOLLOW_TIMEOUT, self.follow(coll, name)).await {
                Ok(followed) => followed,
                Err(_) => Err(StoreError::unavailable(format!("not followed within {FOLLOW_TIMEOUT:?}"))),
            };
            if followed.is_err() {
                self.tally.not_followed(self.step.pg as u32);
            }
            followed
        })
    }
}

/// A node's writes to moving groups, per group: those under way (committing or having their removals
/// followed) and those that an armed step's fill may have missed (a removal not followed onto every drive
/// of the group's next set, a write while another step was armed), since the process started; the steps
/// sealed by their last count; and the write fence this process raised last.
#[derive(Debug)]
pub struct FollowTally {
    /// Tells this process's counts from those of an earlier one of the same node (a restart ends every
    /// removal under way, followed or not, and starts the counts again).
    incarnation: u64,
    groups: parking_lot::Mutex<BTreeMap<u32, GroupTally>>,
    seal_lease: Duration,
    /// None until this process's first fence is committed: until then it writes to no moving group.
    fence: tokio::sync::watch::Sender<Option<Fence>>,
    /// Woken when a write met a lapsed seal: the node raises the fence again.
    fence_wanted: tokio::sync::Notify,
}

/// A write fence this process raised (`Change::FenceWrites`), once committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The placement epoch of the map that carries it: a store of an older placement may still serve a
    /// step the map finished before the fence, and does not write to moving groups.
    pub placement_epoch: u64,
    /// When the node asked for it: it lifts the seals that lapsed before.
    pub asked_at: Instant,
}

/// A step sealed by its last count: the group's writes under it are refused until `until`.
#[derive(Debug)]
struct Seal {
    target: Vec<DriveId>,
    until: Instant,
}

#[derive(Debug, Default)]
struct GroupTally {
    /// The number the next write begun takes.
    next: u64,
    under_way: BTreeSet<u64>,
    not_followed: u64,
    /// The drives of the step whose writes are armed (`FollowTally::arm`); another step's are not.
    armed: Option<Vec<DriveId>>,
    sealed: Option<Seal>,
}

/// One node's count for one group, as the rebalancer asks it (`FollowReport::count`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowCount {
    pub incarnation: u64,
    /// Writes begun so far (the number the next one takes).
    pub begun: u64,
    /// The number of the oldest write under way, if any.
    pub oldest_under_way: Option<u64>,
    /// Writes the fill of the step armed may have missed: removals not followed, writes made while
    /// another step of the group was armed.
    pub not_followed: u64,
}

/// A group's counts on every node asked, by node.
pub type FollowCounts = BTreeMap<NodeId, FollowCount>;

/// One node's counts of every group it removed names from (`FollowTally::report`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowReport {
    pub incarnation: u64,
    pub groups: BTreeMap<u32, FollowCount>,
}

impl FollowReport {
    /// The node's count for group `pg` (none begun: zeros).
    pub fn count(&self, pg: u32) -> FollowCount {
        self.groups.get(&pg).copied().unwrap_or(FollowCount { incarnation: self.incarnation, ..Default::default() })
    }
}

/// A write under way, until dropped (None: one past `MAX_UNDER_WAY`, counted as not followed at once).
pub struct UnderWay {
    tally: Arc<FollowTally>,
    pg: u32,
    number: Option<u64>,
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        let Some(number) = self.number else { return };
        let ended = self.tally.groups.lock().get_mut(&self.pg).is_some_and(|g| g.under_way.remove(&number));
        debug_assert!(ended, "a write ends once");
    }
}

impl FollowTally {
    pub fn new() -> Arc<Self> {
        Self::with_seal_lease(SEAL_LEASE)
    }

    pub fn with_seal_lease(seal_lease: Duration) -> Arc<Self> {
        Arc::new(FollowTally {
            incarnation: rand::random(),
            groups: Default::default(),
            seal_lease,
            fence: tokio::sync::watch::Sender::new(None),
            fence_wanted: Default::default(),
        })
    }

    /// A write to group `pg` begins while the group moves to `target`, in a store of placement epoch
    /// `placement_epoch`: under way until the guard is dropped, and armed (under the kept drives' rule,
    /// its removals followed) if that step is armed on this node, decided here under the tally's lock, so
    /// that a write that is not armed began before the arming and its count. While another step of the
    /// group is armed (this node's map places the group elsewhere than the step being filled, or the next
    /// step is not armed yet) the write is under neither step's rule and a removal reaches neither's
    /// drives: it is counted as not followed, so that a fill of the armed step under way does not end on
    /// it. Refused (nothing counted): in a store older than this process's last fence, or when its first
    /// fence is not committed within `FENCE_WAIT` (an unarmed write could commit without the kept
    /// drives); and a write that `removes` a name while the step is sealed (its removal could miss the new
    /// drives after the step's last count). A sealed step's other writes go on: armed, the drives it keeps
    /// hold them, and what the new drives lack is rebuilt from those once the step is served.
    async fn begin(
        self: &Arc<Self>,
        pg: u32,
        target: &[DriveId],
        placement_epoch: u64,
        removes: bool,
    ) -> StoreResult<(UnderWay, bool)> {
        let mut fence = *self.fence.borrow();
        if fence.is_none() {
            let mut fences = self.fence.subscribe();
            if let Ok(Ok(first)) = tokio::time::timeout(FENCE_WAIT, fences.wait_for(|f| f.is_some())).await {
                fence = *first;
            }
        }
        let Some(fence) = fence.filter(|f| placement_epoch >= f.placement_epoch) else {
            return Err(StoreError::unavailable(format!(
                "group {pg} moves and this node's write fence (after a start or a lapsed seal) is not served yet"
            )));
        };
        self.begin_fenced(pg, target, removes, fence)
    }

    fn begin_fenced(
        self: &Arc<Self>,
        pg: u32,
        target: &[DriveId],
        removes: bool,
        fence: Fence,
    ) -> StoreResult<(UnderWay, bool)> {
        let mut groups = self.groups.lock();
        let g = groups.entry(pg).or_default();
        if let Some(seal) = g.sealed.as_ref().filter(|s| s.target == target) {
            let lapsed = Instant::now() >= seal.until;
            if lapsed && fence.asked_at >= seal.until {
                g.sealed = None;
            } else if removes && lapsed {
                self.fence_wanted.notify_one();
                let why = format!("group {pg}'s step seal lapsed: its removals wait for a write fence");
                return Err(StoreError::unavailable(why));
            } else if removes {
                // The store of the step served makes it (`Switch` calls again there).
                let why = format!("group {pg}'s step is being switched: its removals wait until it is served");
                return Err(StoreError::new(ErrorKind::Switching, why));
            }
        }
        let armed = g.armed.as_deref() == Some(target);
        if g.armed.is_some() && !armed {
            g.not_followed += 1;
        }
        // Past the limit a write is not tracked: counted as not followed, so no step ends on it.
        if g.under_way.len() >= MAX_UNDER_WAY {
            g.not_followed += 1;
            return Ok((UnderWay { tally: self.clone(), pg, number: None }, armed));
        }
        let number = g.next;
        g.next += 1;
        g.under_way.insert(number);
        Ok((UnderWay { tally: self.clone(), pg, number: Some(number) }, armed))
    }

    /// Records a write fence this process raised and saw committed (`Fence`); an older one changes
    /// nothing.
    pub fn fenced(&self, fence: Fence) {
        self.fence.send_if_modified(|last| {
            let newer = last.is_none_or(|l| l.asked_at <= fence.asked_at);
            if newer {
                *last = Some(fence);
            }
            newer
        });
        debug_assert!(self.fence.borrow().is_some_and(|l| l.asked_at >= fence.asked_at));
    }

    /// Waits until a write met a lapsed seal (a wake-up given while nobody waited is kept for the next).
    pub async fn fence_wanted(&self) {
        self.fence_wanted.notified().await
    }

    /// Arms group `pg`'s step to `target` on this node: every write to the group begun from now on is
    /// under the step's kept drives' rule and its removals are followed onto those drives (one step armed
    /// per group: arming the next disarms the one before). The count that follows the arming; the writes
    /// under way in it may be unarmed.
    /// Arming lifts the group's seal: the step starts again.
    pub fn arm(&self, pg: u32, target: &[DriveId]) -> FollowCount {
        self.arm_sealed(pg, target, None)
    }

    /// Arms group `pg`'s step to `target` and seals it for `seal_lease` from now (each seal renews it): the
    /// group's removals under that step are refused from now on, so the count answered covers every
    /// removal this process makes under the step, once those under way in it end. The step's last count.
    pub fn seal(&self, pg: u32, target: &[DriveId]) -> FollowCount {
        self.arm_sealed(pg, target, Some(Instant::now() + self.seal_lease))
    }

    /// Arms the step, sealed until `until` (None: not sealed), and answers the count.
    fn arm_sealed(&self, pg: u32, target: &[DriveId], until: Option<Instant>) -> FollowCount {
        let mut groups = self.groups.lock();
        let g = groups.entry(pg).or_default();
        if g.armed.as_deref() != Some(target) {
            g.armed = Some(target.to_vec());
        }
        g.sealed = until.map(|until| Seal { target: target.to_vec(), until });
        let count = self.count(g);
        debug_assert!(g.armed.as_deref() == Some(target));
        debug_assert_eq!(g.sealed.is_some(), until.is_some());
        count
    }

    fn count(&self, g: &GroupTally) -> FollowCount {
        FollowCount {
            incarnation: self.incarnation,
            begun: g.next,
            oldest_under_way: g.under_way.first().copied(),
            not_followed: g.not_followed,
        }
    }

    fn not_followed(&self, pg: u32) {
        self.groups.lock().entry(pg).or_default().not_followed += 1;
    }

    /// This node's counts (at most one per placement group).
    pub fn report(&self) -> FollowReport {
        let groups = self.groups.lock();
        FollowReport {
            incarnation: self.incarnation,
            groups: groups.iter().map(|(pg, g)| (*pg, self.count(g))).collect(),
        }
    }
}

/// Whether every removal begun on the nodes of `first` before they were asked has ended by `now` (a node
/// restarted or no longer asked ended them with its process, or no longer takes part).
pub fn ended_since(first: &FollowCounts, now: &FollowCounts) -> bool {
    first.iter().all(|(node, f)| match now.get(node) {
        Some(n) if n.incarnation == f.incarnation => n.oldest_under_way.is_none_or(|o| o >= f.begun),
        _ => true,
    })
}

/// The nodes on which a removal may have gone unfollowed between two counts: a failure counted, or the
/// node gone, restarted (it may have taken a removal down with it before following it) or new.
pub fn nodes_unfollowed(before: &FollowCounts, after: &FollowCounts) -> Vec<NodeId> {
    let nodes: BTreeSet<NodeId> = before.keys().chain(after.keys()).copied().collect();
    let changed = |n: &NodeId| match (before.get(n), after.get(n)) {
        (Some(x), Some(y)) => x.incarnation != y.incarnation || x.not_followed != y.not_followed,
        _ => true,
    };
    nodes.into_iter().filter(changed).collect()
}

/// Copies what a step's next set lacks from the kept drives, in rounds until one finds nothing to copy
/// (at most `MAX_FILL_ROUNDS`: writes kept coming faster), at most `bytes_per_s` on average (0: no limit);
/// the bytes copied.
pub async fn fill(set: &StepSet, bytes_per_s: u64) -> Result<u64, String> {
    let progress = set.heal_progress();
    let healed_bytes = || progress.healed_bytes.load(Relaxed);
    let (bytes_before, failed_before) = (healed_bytes(), progress.failed_objects.load(Relaxed));
    let started = tokio::time::Instant::now();
    for _ in 0..MAX_FILL_ROUNDS {
        let healed_before = progress.healed_objects.load(Relaxed);
        set.scan().await.map_err(|e| e.to_string())?;
        while set.heal_backlog() > 0 && set.heal_now(FILL_HEAL_STEP).await > 0 {
            // Paced to the rate: the bytes copied so far take at least bytes / rate seconds.
            if bytes_per_s > 0 {
                let due = Duration::from_secs_f64((healed_bytes() - bytes_before) as f64 / bytes_per_s as f64);
                tokio::time::sleep_until(started + due).await;
            }
        }
        if progress.failed_objects.load(Relaxed) > failed_before {
            return Err("some objects could not be rebuilt".into());
        }
        if progress.healed_objects.load(Relaxed) == healed_before {
            return Ok(healed_bytes() - bytes_before);
        }
    }
    Err(format!("writes kept coming faster than {MAX_FILL_ROUNDS} rounds of copying"))
}

/// Arms a step on every node that takes part (`ask`: `FollowTally::arm` on each, and their counts; an
/// error: a node did not answer) and waits until every write of the group begun before has ended: those
/// committed without the kept drives' rule and did not follow their removals, so the set served must be
/// healed whole after this (what such a write left short on the kept drives is rebuilt there) and before
/// the fill decides from the kept drives. The counts `fill_following` compares with.
pub async fn arm_step<F, Fut>(mut ask: F) -> Result<FollowCounts, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<FollowCounts, String>>,
{
    settled(&mut ask).await
}

/// `fill`, then the step sealed on every node (`seal`: `FollowTally::seal` on each, and their counts) and
/// their counts, once the writes under way end, compared with `armed` (`arm_step`'s): a removal not
/// followed or a write unruled since (counted before the fill ended), a node gone, restarted or new, and
/// the step must not end now (an error: it starts again, and the next fill finds the names gone from the
/// kept drives). On success the nodes asked remove nothing more under the step until they serve its end
/// or it is armed again. The bytes copied.
pub async fn fill_following<F, Fut>(
    set: &StepSet,
    bytes_per_s: u64,
    armed: FollowCounts,
    mut seal: F,
) -> Result<u64, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<FollowCounts, String>>,
{
    let bytes = fill(set, bytes_per_s).await?;
    let after = settled(&mut seal).await?;
    let nodes = nodes_unfollowed(&armed, &after);
    if !nodes.is_empty() {
        return Err(format!("removals went unfollowed during the fill (nodes {nodes:?}): the step starts again"));
    }
    Ok(bytes)
}

/// The counts once every removal under way when first asked has ended (at most `FOLLOW_SETTLE_WAIT`).
async fn settled<F, Fut>(ask: &mut F) -> Result<FollowCounts, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<FollowCounts, String>>,
{
    let first = ask().await?;
    let deadline = Instant::now() + FOLLOW_SETTLE_WAIT;
    let mut now = first.clone();
    while !ended_since(&first, &now) {
        if Instant::now() >= deadline {
            return Err(format!("removals under way did not end within {FOLLOW_SETTLE_WAIT:?}"));
        }
        tokio::time::sleep(FOLLOW_SETTLE_POLL).await;
        now = ask().await?;
    }
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tally`, its start fenced at placement epoch 0.
    fn fenced(tally: Arc<FollowTally>) -> Arc<FollowTally> {
        tally.fenced(Fence { placement_epoch: 0, asked_at: Instant::now() });
        tally
    }

    /// A removal from group `pg` moving to `target` begins in a store of placement epoch 0 (fenced: it
    /// does not wait).
    fn begin(tally: &Arc<FollowTally>, pg: u32, target: &[DriveId]) -> (UnderWay, bool) {
        try_begin(tally, pg, target, 0, true).expect("neither sealed nor unfenced")
    }

    /// `FollowTally::begin` of a fenced tally, which answers at once.
    fn try_begin(
        tally: &Arc<FollowTally>,
        pg: u32,
        target: &[DriveId],
        placement_epoch: u64,
        removes: bool,
    ) -> StoreResult<(UnderWay, bool)> {
        use futures::FutureExt;
        tally.begin(pg, target, placement_epoch, removes).now_or_never().expect("a fenced tally does not wait")
    }

    fn count(incarnation: u64, begun: u64, oldest_under_way: Option<u64>, not_followed: u64) -> FollowCount {
        FollowCount { incarnation, begun, oldest_under_way, not_followed }
    }

    #[test]
    fn a_tally_counts_removals_under_way_and_not_followed_per_group() {
        let tally = fenced(FollowTally::new());
        let inc = tally.report().incarnation;
        assert_eq!(tally.report().count(7), count(inc, 0, None, 0), "no removal yet");
        let first = begin(&tally, 7, &[]).0;
        let second = begin(&tally, 7, &[]).0;
        let other = begin(&tally, 2, &[]).0;
        assert_eq!(tally.report().count(7), count(inc, 2, Some(0), 0));
        drop(first);
        assert_eq!(tally.report().count(7), count(inc, 2, Some(1), 0), "the oldest under way is the second");
        tally.not_followed(7);
        drop(second);
        assert_eq!(tally.report().count(7), count(inc, 2, None, 1));
        assert_eq!(tally.report().count(2), count(inc, 1, Some(0), 0), "groups are counted apart");
        drop(other);
        assert_ne!(fenced(FollowTally::new()).report().incarnation, inc, "another process is told apart");
    }

    #[test]
    fn removals_past_the_limit_under_way_count_as_not_followed() {
        let tally = fenced(FollowTally::new());
        let inc = tally.report().incarnation;
        let at_limit: Vec<UnderWay> = (0..MAX_UNDER_WAY).map(|_| begin(&tally, 3, &[]).0).collect();
        let n = MAX_UNDER_WAY as u64;
        assert_eq!(tally.report().count(3), count(inc, n, Some(0), 0), "every one up to the limit is tracked");
        let past = begin(&tally, 3, &[]).0;
        assert_eq!(tally.report().count(3), count(inc, n, Some(0), 1), "the one past it is not followed");
        drop(past);
        drop(at_limit);
        assert_eq!(tally.report().count(3), count(inc, n, None, 1));
        drop(begin(&tally, 3, &[]).0);
        assert_eq!(tally.report().count(3), count(inc, n + 1, None, 1), "tracked again below the limit");
    }

    /// A group's removals are followed only once its step is armed, and only for the step armed: arming
    /// the group's next step disarms the one before. The count an arming answers covers every removal
    /// begun before it, so those not followed are among the removals it waits for.
    #[test]
    fn removals_are_followed_once_their_step_is_armed() {
        let tally = fenced(FollowTally::new());
        let inc = tally.report().incarnation;
        let (before, follow) = begin(&tally, 4, &[1, 2, 3]);
        assert!(!follow, "no step armed");
        assert_eq!(tally.arm(4, &[1, 2, 3]), count(inc, 1, Some(0), 0), "the removal before is under way");
        let (after, follow) = begin(&tally, 4, &[1, 2, 3]);
        assert!(follow, "armed");
        assert_eq!(tally.report().count(4).not_followed, 0);
        assert!(!begin(&tally, 5, &[1, 2, 3]).1, "another group is not armed");
        assert!(!begin(&tally, 4, &[1, 2, 5]).1, "nor another step of the group, which the armed one misses");
        assert_eq!(tally.arm(4, &[1, 2, 3]), count(inc, 3, Some(0), 1), "arming again changes nothing");
        drop((before, after));
        tally.arm(4, &[1, 2, 5]);
        assert!(begin(&tally, 4, &[1, 2, 5]).1);
        assert!(!begin(&tally, 4, &[1, 2, 3]).1, "the step before is disarmed");
        assert_eq!(tally.report().count(4), count(inc, 5, None, 2));
        assert_eq!(tally.report().count(5), count(inc, 1, None, 0), "unarmed: nothing is missed");
    }

    #[test]
    fn removals_begun_before_a_count_have_ended_once_none_older_is_under_way() {
        let first: FollowCounts = [(1, count(9, 5, Some(3), 0)), (2, count(9, 4, None, 0))].into();
        let at = |one: FollowCount, two: FollowCount| -> FollowCounts { [(1, one), (2, two)].into() };
        assert!(!ended_since(&first, &first), "removal 3 of node 1 is under way");
        assert!(!ended_since(&first, &at(count(9, 6, Some(4), 0), count(9, 4, None, 0))), "removal 4 too");
        assert!(ended_since(&first, &at(count(9, 7, Some(5), 0), count(9, 4, None, 0))), "5 began after");
        assert!(ended_since(&first, &at(count(9, 5, None, 1), count(9, 6, Some(4), 0))));
        assert!(!ended_since(&first, &at(count(9, 5, None, 1), count(9, 6, Some(3), 0))), "node 2's 3 began before");
        assert!(ended_since(&first, &at(count(8, 0, Some(0), 0), count(9, 4, None, 0))), "node 1 restarted");
        assert!(ended_since(&first, &[(2, count(9, 4, None, 0))].into()), "node 1 is no longer asked");
    }

    #[test]
    fn a_removal_goes_unfollowed_when_a_failure_is_counted_or_a_node_changes() {
        let before: FollowCounts = [(1, count(9, 5, Some(3), 2)), (2, count(7, 0, None, 0))].into();
        let after = |one: FollowCount| -> FollowCounts { [(1, one), (2, count(7, 0, None, 0))].into() };
        assert!(nodes_unfollowed(&before, &before).is_empty());
        assert!(nodes_unfollowed(&before, &after(count(9, 80, None, 2))).is_empty(), "removals followed");
        assert_eq!(nodes_unfollowed(&before, &after(count(9, 80, None, 3))), [1], "a failure counted");
        assert_eq!(nodes_unfollowed(&before, &after(count(4, 0, None, 0))), [1], "node 1 restarted");
        assert_eq!(nodes_unfollowed(&before, &[(2, count(7, 0, None, 0))].into()), [1], "node 1 gone");
        let mut joined = before.clone();
        joined.insert(3, count(5, 0, None, 0));
        assert_eq!(nodes_unfollowed(&before, &joined), [3], "node 3 new");
    }

    /// A process writes to no moving group before its first fence is committed (a write waits for it, at
    /// most `FENCE_WAIT`), nor in a store of a placement older than the fence's (a step the map finished
    /// before the fence may be served there).
    #[tokio::test(start_paused = true)]
    async fn writes_wait_for_a_fence_and_a_store_as_new_as_it() {
        let tally = FollowTally::new();
        let inc = tally.report().incarnation;
        let waited = tokio::time::Instant::now();
        assert!(tally.begin(4, &[1, 2, 3], 9, false).await.is_err(), "not fenced since the start");
        assert!(waited.elapsed() >= FENCE_WAIT, "it waited for the fence first");
        let waiting = tokio::spawn({
            let tally = tally.clone();
            async move { tally.begin(4, &[1, 2, 3], 9, false).await.map(|(_, armed)| armed) }
        });
        tokio::task::yield_now().await;
        tally.fenced(Fence { placement_epoch: 5, asked_at: Instant::now() });
        assert_eq!(waiting.await.unwrap(), Ok(false), "a waiting write goes on once fenced");
        assert!(try_begin(&tally, 4, &[1, 2, 3], 4, false).is_err(), "a store older than the fence");
        assert_eq!(tally.report().count(4), count(inc, 1, None, 0), "refused writes are not counted");
        assert!(try_begin(&tally, 4, &[1, 2, 3], 5, true).is_ok());
        let older = Instant::now() - Duration::from_secs(1);
        tally.fenced(Fence { placement_epoch: 9, asked_at: older });
        assert!(try_begin(&tally, 4, &[1, 2, 3], 5, true).is_ok(), "an older fence changes nothing");
    }

    /// The last count seals the step: the group's removals under it are refused (and not counted) until
    /// the step is armed again; its other writes go on, armed. Another group, or the group's next step,
    /// is not sealed.
    #[test]
    fn a_sealed_step_refuses_its_removals_until_it_is_armed_again() {
        let tally = fenced(FollowTally::with_seal_lease(Duration::from_secs(3600)));
        let inc = tally.report().incarnation;
        tally.arm(4, &[1, 2, 3]);
        let before = begin(&tally, 4, &[1, 2, 3]);
        assert_eq!(tally.seal(4, &[1, 2, 3]), count(inc, 1, Some(0), 0), "the write under way is in the count");
        let refused = try_begin(&tally, 4, &[1, 2, 3], 0, true).map(|_| ()).expect_err("sealed");
        assert_eq!(refused.kind, ErrorKind::Switching, "made again in the next store: {refused}");
        assert!(refused.message.contains("being switched"), "{refused}");
        let (put, armed) = try_begin(&tally, 4, &[1, 2, 3], 0, false).expect("a write removing nothing goes on");
        assert!(armed, "under the kept drives' rule");
        drop(put);
        // A fence asked now does not lift a seal that has not lapsed.
        tally.fenced(Fence { placement_epoch: 0, asked_at: Instant::now() });
        assert!(try_begin(&tally, 4, &[1, 2, 3], 0, true).is_err());
        drop(before);
        assert_eq!(tally.report().count(4), count(inc, 2, None, 0), "the count covers every write");
        drop(begin(&tally, 5, &[1, 2, 3])); // another group removes
        assert!(!begin(&tally, 4, &[1, 2, 5]).1, "another step removes, unarmed");
        assert_eq!(tally.arm(4, &[1, 2, 3]).begun, 3, "armed again");
        assert!(begin(&tally, 4, &[1, 2, 3]).1, "armed again: the seal is lifted");
    }

    /// A seal past its lease refuses removals (and asks for a fence) until a fence asked after it lapsed
    /// is committed; then it is lifted.
    #[test]
    fn a_lapsed_seal_is_lifted_only_by_a_fence_asked_after_it() {
        use futures::FutureExt;
        let tally = fenced(FollowTally::with_seal_lease(Duration::ZERO));
        assert!(tally.fence_wanted().now_or_never().is_none(), "no fence wanted yet");
        tally.seal(4, &[1, 2, 3]);
        let lapsed_at = Instant::now();
        let refused = try_begin(&tally, 4, &[1, 2, 3], 0, true).map(|_| ()).expect_err("lapsed, not fenced after");
        assert_eq!(refused.kind, ErrorKind::Unavailable, "the same store makes it once fenced: {refused}");
        assert!(refused.message.contains("lapsed"), "{refused}");
        assert!(tally.fence_wanted().now_or_never().is_some(), "a fence is wanted");
        assert!(try_begin(&tally, 4, &[1, 2, 3], 0, true).is_err());
        tally.fenced(Fence { placement_epoch: 0, asked_at: lapsed_at });
        assert!(begin(&tally, 4, &[1, 2, 3]).1, "a fence asked after the lapse lifts it");
        assert!(begin(&tally, 4, &[1, 2, 3]).1, "lifted for good");
    }
}
