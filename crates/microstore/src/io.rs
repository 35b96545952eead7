//! IO shares (paper 002: a microstore's share of drive IO). Each microstore holds points of the node's
//! drive IO; a drive whose device is contended serves each microstore's IO in proportion to its points
//! (`mosaic_engine::ScheduledDevice`), and work of no microstore (upkeep, moves, heal) at the unshared
//! weight. The points move as workers do (a microstore missing its target grows fast, one with slack gives
//! back linearly, floors), judged on the target and the drives: a microstore misses as to IO when it misses
//! its target (however idle its workers: it may be short of drive time, not of workers) while its IO
//! waited for its turn at the drives in the round.

use crate::manager::{Decision, ManagerConfig, Observation, ResourceManager, Target, Verdict};
use mosaic_store::{IoShares, ShareId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub struct IoConfig {
    /// Whether drives schedule IO by microstore (with one microstore they never do).
    pub enabled: bool,
    /// Points of the node, held by microstores or free.
    pub total_points: u32,
    /// What a new microstore gets (from the default one's, never below its floor).
    pub start_points: u32,
    pub floor_points: u32,
    /// What one with slack gives back per round, and a missing one's first grant (doubling after).
    pub step_points: u32,
    /// The weight of work no microstore asked for.
    pub unshared_points: u32,
    /// Device bytes a drive lets be in flight before IO waits its turn.
    pub in_flight_max_bytes: u64,
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            enabled: true,
            total_points: 10_000,
            start_points: 100,
            floor_points: 10,
            step_points: 10,
            unshared_points: 10,
            in_flight_max_bytes: 8 << 20,
        }
    }
}

/// Most device bytes a drive may let be in flight (a bound past which scheduling would never engage).
pub const MAX_IN_FLIGHT_BYTES: u64 = 1 << 30;

impl IoConfig {
    pub fn validate(&self) -> Result<(), String> {
        let points = |n: &str, v: u32| -> Result<(), String> {
            match (1..=mosaic_store::MAX_WEIGHT).contains(&v) {
                true => Ok(()),
                false => Err(format!("{n} is 1 to {}, not {v}", mosaic_store::MAX_WEIGHT)),
            }
        };
        points("io_total_points", self.total_points)?;
        points("io_start_points", self.start_points)?;
        points("io_floor_points", self.floor_points)?;
        points("io_step_points", self.step_points)?;
        points("io_unshared_points", self.unshared_points)?;
        if self.floor_points > self.start_points || self.start_points > self.total_points {
            return Err("io points: floor <= start <= total".into());
        }
        if !(4096..=MAX_IN_FLIGHT_BYTES).contains(&self.in_flight_max_bytes) {
            return Err(format!("io_in_flight is 4 KiB to 1 GiB, not {} bytes", self.in_flight_max_bytes));
        }
        Ok(())
    }

    fn manager(&self, workers: &ManagerConfig) -> ManagerConfig {
        ManagerConfig {
            total_workers: self.total_points,
            floor_workers: self.floor_points,
            shrink_step_workers: self.step_points,
            grow_start_workers: self.step_points,
            ..workers.clone()
        }
    }
}

/// A change of a microstore's IO points and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IoDecision {
    pub microstore: String,
    pub io_points_before: u32,
    pub io_points_after: u32,
    pub reason: String,
}

impl From<Decision> for IoDecision {
    fn from(d: Decision) -> IoDecision {
        IoDecision {
            microstore: d.microstore,
            io_points_before: d.workers_before,
            io_points_after: d.workers_after,
            reason: d.reason,
        }
    }
}

/// The microstores' points and their shares on the node's drives.
pub struct IoPlanner {
    config: IoConfig,
    manager: ResourceManager,
    /// Each microstore's share (`mosaic_store::share_id_of` its name).
    ids: BTreeMap<String, ShareId>,
    /// Each share's IOs that had waited for their turn, at the last round.
    waited: BTreeMap<String, u64>,
    /// The node's table (None: a registry that only plans, as in a cluster's scratch copy or a test).
    shares: Option<Arc<IoShares>>,
}

impl IoPlanner {
    pub fn new(config: IoConfig, workers: &ManagerConfig) -> Result<IoPlanner, String> {
        config.validate()?;
        let manager = ResourceManager::new(config.manager(workers))?;
        Ok(IoPlanner { config, manager, ids: BTreeMap::new(), waited: BTreeMap::new(), shares: None })
    }

    pub fn with_shares(&mut self, shares: Arc<IoShares>) {
        self.shares = Some(shares);
        self.apply();
    }

    pub fn points(&self, microstore: &str) -> Option<u32> {
        self.manager.workers(microstore)
    }

    pub fn share_of(&self, microstore: &str) -> Option<ShareId> {
        self.ids.get(microstore).copied()
    }

    /// What the node's drives served the microstore's share (None: no share, or no table).
    pub fn stats(&self, microstore: &str) -> Option<mosaic_store::ShareStats> {
        self.shares.as_ref()?.stats(self.share_of(microstore)?)
    }

    /// The share ids of the microstores holding points.
    pub fn share_ids(&self) -> BTreeMap<String, ShareId> {
        self.ids.clone()
    }

    /// Holds points for exactly the microstores named (`default` among them): a new one gets its start
    /// points from the default one's spare (fewer when it has fewer, none when it has none: its IO then
    /// runs unshared), one gone gives its points to the default one.
    pub fn sync(&mut self, microstores: &BTreeMap<String, Target>, default: &str) {
        assert!(microstores.contains_key(default), "the default microstore is always named");
        let gone: Vec<String> =
            self.manager.holdings().keys().filter(|n| !microstores.contains_key(*n)).cloned().collect();
        for name in gone {
            if let Some(h) = self.manager.remove(&name) {
                self.manager.grant(default, h.workers);
            }
            if let (Some(id), Some(shares)) = (self.ids.remove(&name), &self.shares) {
                shares.remove(id);
            }
        }
        if !self.manager.holdings().contains_key(default) {
            let all = self.manager.free_workers();
            self.manager.add(default, microstores[default], all).expect("the free points fit");
            self.give_id(default);
        }
        let new: Vec<(&String, &Target)> =
            microstores.iter().filter(|(n, _)| !self.manager.holdings().contains_key(*n)).collect();
        for (name, target) in new {
            let want = self.config.start_points;
            let short = want.saturating_sub(self.manager.free_workers());
            self.manager.release(default, short);
            let have = want.min(self.manager.free_workers());
            if have < self.config.floor_points || self.manager.add(name, *target, have).is_err() {
                tracing::warn!(microstore = name, "no IO points left for a new microstore: its IO runs unshared");
                continue;
            }
            self.give_id(name);
        }
        self.apply();
        debug_assert!(self.ids.keys().all(|n| self.manager.holdings().contains_key(n)));
    }

    /// The microstore's share: its name's, the same on every node. A name whose share another's already is
    /// (a hash collision, about one in 2^32 per pair) keeps its points but runs unshared.
    fn give_id(&mut self, name: &str) {
        let id = mosaic_store::share_id_of(name);
        if let Some((other, _)) = self.ids.iter().find(|(_, i)| **i == id) {
            tracing::warn!(
                microstore = name,
                other = other.as_str(),
                "two microstores' IO shares collide: it runs unshared"
            );
            return;
        }
        self.ids.insert(name.to_string(), id);
    }

    /// One round: points move toward microstores missing their targets.
    pub fn decide(
        &mut self,
        verdicts: BTreeMap<String, Verdict>,
        observations: &BTreeMap<String, Observation>,
    ) -> Vec<IoDecision> {
        let verdicts = self.short_of_io(verdicts);
        let decisions = self.manager.decide_on(verdicts, observations);
        if !decisions.is_empty() {
            self.apply();
        }
        decisions.into_iter().map(IoDecision::from).collect()
    }

    /// A target missed counts as to IO only where the microstore's IO waited for its turn at the drives in
    /// the round (more points would have served it sooner); elsewhere it is met: a microstore slow for
    /// want of cores does not gather points it cannot use (measured: it took nearly all of them in 10 s).
    fn short_of_io(&mut self, verdicts: BTreeMap<String, Verdict>) -> BTreeMap<String, Verdict> {
        let waited_now: BTreeMap<String, u64> =
            self.ids.keys().filter_map(|n| Some((n.clone(), self.stats(n)?.waited_ios))).collect();
        let out = verdicts
            .into_iter()
            .map(|(name, v)| {
                let waited = waited_now.get(&name).map_or(0, |now| now - self.waited.get(&name).copied().unwrap_or(0));
                let v = match v {
                    Verdict::Missing(by, why) if waited > 0 => {
                        Verdict::Missing(by, format!("{why}; {waited} of its IOs waited for the drives"))
                    }
                    Verdict::Missing(..) => Verdict::Met,
                    other => other,
                };
                (name, v)
            })
            .collect();
        self.waited = waited_now;
        out
    }

    /// Sets the node's weights from the points, and turns scheduling on while two or more share.
    fn apply(&self) {
        let Some(shares) = &self.shares else { return };
        for (name, id) in &self.ids {
            let points = self.manager.workers(name).expect("every share is held");
            if let Err(e) = shares.set_weight(*id, points) {
                tracing::warn!(microstore = name, error = %e, "an IO share was not set");
            }
        }
        shares.set_active(self.config.enabled && self.ids.len() > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(names: &[&str]) -> BTreeMap<String, Target> {
        names.iter().map(|n| (n.to_string(), Target::LatencyMsP99(10.0))).collect()
    }

    fn obs(p99: f64) -> Observation {
        Observation { requests: 1_000, latency_ms_p99: Some(p99), throughput_mib_s: 1.0, busy: 0.1, waited: 0 }
    }

    #[test]
    fn points_follow_the_microstores_and_their_weights_reach_the_node_s_table() {
        let config = IoConfig { total_points: 300, ..IoConfig::default() };
        let mut p = IoPlanner::new(config.clone(), &ManagerConfig::default()).unwrap();
        let shares = IoShares::new(config.in_flight_max_bytes, config.unshared_points);
        p.with_shares(shares.clone());
        p.sync(&targets(&["default"]), "default");
        assert_eq!(p.points("default"), Some(300));
        assert!(!shares.is_active(), "one microstore: nothing to share");
        p.sync(&targets(&["default", "small", "large"]), "default");
        assert_eq!((p.points("default"), p.points("small"), p.points("large")), (Some(100), Some(100), Some(100)));
        assert!(shares.is_active());
        let small = p.share_of("small").unwrap();
        assert_eq!(shares.stats(small).unwrap().weight, 100);
        // A third new one finds the default at its floor's spare only.
        p.sync(&targets(&["default", "small", "large", "x"]), "default");
        assert_eq!(p.points("x"), Some(90));
        assert_eq!(p.points("default"), Some(10));
        assert!(p.share_of("y").is_none());
        p.sync(&targets(&["default", "small", "large", "x", "y"]), "default");
        assert_eq!(p.points("y"), None, "no points left: unshared");
        // Missing its target (workers idle: judged on the target alone), small takes from those with slack.
        let verdicts = BTreeMap::from([
            ("small".to_string(), Verdict::Missing(3.0, "p99 30 ms".into())),
            ("large".to_string(), Verdict::Slack("idle".into())),
        ]);
        let o = BTreeMap::from([("small".to_string(), obs(30.0)), ("large".to_string(), obs(1.0))]);
        assert_eq!(p.decide(verdicts.clone(), &o), vec![], "slow, but none of its IO waited: nothing moves");
        shares.entry(small).record(4096, Some(500));
        let d = p.decide(verdicts.clone(), &o);
        assert!(d.iter().any(|d| d.reason.contains("1 of its IOs waited")), "{d:?}");
        shares.entry(small).record(4096, Some(500));
        assert!(d.iter().any(|d| d.microstore == "small" && d.io_points_after == 110), "{d:?}");
        assert_eq!(shares.stats(small).unwrap().weight, 110);
        let d = p.decide(verdicts.clone(), &o);
        assert!(d.iter().any(|d| d.microstore == "small" && d.io_points_after == 130), "doubling: {d:?}");
        assert_eq!(p.decide(verdicts, &o), vec![], "no IO waited since: nothing moves");
        // Gone: its share leaves the table and its points go to the default one.
        p.sync(&targets(&["default", "large", "x"]), "default");
        assert!(shares.stats(small).is_none());
        assert_eq!(p.points("default"), Some(10 + 130));
        let total: u32 = ["default", "large", "x"].iter().filter_map(|n| p.points(n)).sum();
        assert_eq!(total, 300, "points are conserved");
    }

    #[test]
    fn bad_settings_are_refused() {
        let ok = IoConfig::default();
        assert!(ok.validate().is_ok());
        for bad in [
            IoConfig { floor_points: 0, ..ok.clone() },
            IoConfig { start_points: 5, ..ok.clone() },
            IoConfig { total_points: 50, ..ok.clone() },
            IoConfig { in_flight_max_bytes: 100, ..ok.clone() },
            IoConfig { in_flight_max_bytes: MAX_IN_FLIGHT_BYTES + 1, ..ok.clone() },
            IoConfig { unshared_points: mosaic_store::MAX_WEIGHT + 1, ..ok.clone() },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
