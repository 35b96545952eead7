//! The resource manager (paper 002): each microstore holds a share of the node's request workers; one that
//! misses its target while it is busy gains workers fast (its grant doubles each round it keeps missing),
//! one with slack gives them back linearly (a step per round), and none goes below its floor. Workers not
//! held wait in a free pool; a starved microstore draws from it first, then from microstores with slack.
//! Rounds are deterministic: the same holdings and observations give the same decisions.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a microstore is held to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Small objects: the 99th percentile of request latency, at most this.
    LatencyMsP99(f64),
    /// Large objects: bytes moved, at least this many MiB/s when the microstore is busy.
    ThroughputMibS(f64),
}

impl Target {
    fn validate(&self) -> Result<(), String> {
        let v = match *self {
            Target::LatencyMsP99(v) | Target::ThroughputMibS(v) => v,
        };
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("a target is a positive number, not {v}"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagerConfig {
    /// Workers of the node, held by microstores or free.
    pub total_workers: u32,
    /// No microstore holds fewer.
    pub floor_workers: u32,
    /// A microstore with slack gives back this many per round.
    pub shrink_step_workers: u32,
    /// Its first grant when it misses its target; each following round it still misses, twice the last.
    pub grow_start_workers: u32,
    /// A latency target has slack below this share of it; a throughput target above its inverse.
    pub slack_ratio: f64,
    /// A throughput target is missed only while the microstore's workers are at least this busy (an idle
    /// tenant is not starved).
    pub busy_min: f64,
    /// Fewer requests than this in a round say nothing but slack.
    pub min_requests: u64,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            total_workers: 256,
            floor_workers: 4,
            shrink_step_workers: 4,
            grow_start_workers: 4,
            slack_ratio: 0.5,
            busy_min: 0.8,
            min_requests: 20,
        }
    }
}

/// Most workers a node may have.
pub const MAX_WORKERS: u32 = 1 << 16;

impl ManagerConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.total_workers == 0 || self.total_workers > MAX_WORKERS {
            return Err(format!("total_workers is 1 to {MAX_WORKERS}, not {}", self.total_workers));
        }
        if self.floor_workers == 0 || self.floor_workers > self.total_workers {
            return Err(format!("floor_workers is 1 to total_workers, not {}", self.floor_workers));
        }
        if self.shrink_step_workers == 0 || self.grow_start_workers == 0 {
            return Err("shrink_step_workers and grow_start_workers are at least 1".into());
        }
        if !(self.slack_ratio > 0.0 && self.slack_ratio < 1.0) {
            return Err(format!("slack_ratio is between 0 and 1, not {}", self.slack_ratio));
        }
        if !(0.0..=1.0).contains(&self.busy_min) {
            return Err(format!("busy_min is 0 to 1, not {}", self.busy_min));
        }
        Ok(())
    }
}

/// What one microstore holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Holding {
    pub target: Target,
    pub workers: u32,
    /// The grant of its next round if it misses its target again.
    grant: u32,
}

/// One round's measurements of a microstore.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct Observation {
    pub requests: u64,
    pub latency_ms_p99: Option<f64>,
    pub throughput_mib_s: f64,
    /// The mean share of its workers in use over the round (0 to 1).
    pub busy: f64,
    /// Requests that waited for a worker in the round.
    pub waited: u64,
}

/// A change of a microstore's workers and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    pub microstore: String,
    pub workers_before: u32,
    pub workers_after: u32,
    pub reason: String,
}

/// How a microstore did against its target in a round.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Missing its target by this factor (above 1), and why.
    Missing(f64, String),
    /// Well within it (or idle), and why.
    Slack(String),
    Met,
}

pub struct ResourceManager {
    config: ManagerConfig,
    holdings: BTreeMap<String, Holding>,
    free: u32,
}

impl ResourceManager {
    pub fn new(config: ManagerConfig) -> Result<ResourceManager, String> {
        config.validate()?;
        let free = config.total_workers;
        Ok(ResourceManager { config, holdings: BTreeMap::new(), free })
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    pub fn free_workers(&self) -> u32 {
        self.free
    }

    pub fn holdings(&self) -> &BTreeMap<String, Holding> {
        &self.holdings
    }

    pub fn workers(&self, microstore: &str) -> Option<u32> {
        self.holdings.get(microstore).map(|h| h.workers)
    }

    fn check(&self) {
        let held: u64 = self.holdings.values().map(|h| u64::from(h.workers)).sum();
        assert_eq!(held + u64::from(self.free), u64::from(self.config.total_workers), "workers are conserved");
        assert!(self.holdings.values().all(|h| h.workers >= self.config.floor_workers), "no holding below its floor");
    }

    /// Adds a microstore holding `workers` from the free pool (at least the floor; as many as are free).
    pub fn add(&mut self, name: &str, target: Target, workers: u32) -> Result<(), String> {
        self.check();
        target.validate()?;
        if self.holdings.contains_key(name) {
            return Err(format!("microstore {name} exists"));
        }
        let workers = workers.max(self.config.floor_workers);
        if workers > self.free {
            return Err(format!("{workers} workers asked for microstore {name}, {} free", self.free));
        }
        self.free -= workers;
        self.holdings.insert(name.to_string(), Holding { target, workers, grant: self.config.grow_start_workers });
        self.check();
        Ok(())
    }

    /// Removes a microstore; its workers go back to the free pool.
    pub fn remove(&mut self, name: &str) -> Option<Holding> {
        self.check();
        let h = self.holdings.remove(name)?;
        self.free += h.workers;
        self.check();
        Some(h)
    }

    /// Takes up to `workers` from a microstore into the free pool, never below its floor; how many.
    pub fn release(&mut self, name: &str, workers: u32) -> u32 {
        self.check();
        let floor = self.config.floor_workers;
        let Some(h) = self.holdings.get_mut(name) else { return 0 };
        let give = workers.min(h.workers - floor);
        h.workers -= give;
        self.free += give;
        self.check();
        give
    }

    /// Gives a microstore up to `workers` from the free pool; how many.
    pub fn grant(&mut self, name: &str, workers: u32) -> u32 {
        self.check();
        let Some(h) = self.holdings.get_mut(name) else { return 0 };
        let take = workers.min(self.free);
        h.workers += take;
        self.free -= take;
        self.check();
        take
    }

    /// `workers_short`: a missed latency target counts only while its requests wait or its workers are
    /// busy.
    fn verdict(&self, h: &Holding, o: &Observation, workers_short: bool) -> Verdict {
        let c = &self.config;
        if o.requests < c.min_requests {
            return Verdict::Slack(format!("{} requests, fewer than {}", o.requests, c.min_requests));
        }
        match h.target {
            Target::LatencyMsP99(target) => {
                let p99 = o.latency_ms_p99.unwrap_or(0.0);
                // Missed while its workers sit idle, more workers would not help: its requests are slow for
                // another reason (the drives, the CPU), which workers taken from others address only when
                // those others shrink; so only a microstore whose requests wait, or whose workers are
                // busy, asks.
                let short = !workers_short || o.waited > 0 || o.busy >= c.busy_min;
                if p99 > target && short {
                    Verdict::Missing(p99 / target, format!("p99 {p99:.2} ms above its target {target} ms"))
                } else if p99 > target {
                    Verdict::Met
                } else if p99 <= target * c.slack_ratio {
                    Verdict::Slack(format!("p99 {p99:.2} ms at most {} x its target {target} ms", c.slack_ratio))
                } else {
                    Verdict::Met
                }
            }
            Target::ThroughputMibS(target) => {
                let t = o.throughput_mib_s;
                if t < target && o.busy >= c.busy_min {
                    let why = format!("{t:.1} MiB/s below its target {target} MiB/s, {:.0}% busy", o.busy * 100.0);
                    Verdict::Missing(target / t.max(target / 1_000.0), why)
                } else if t * c.slack_ratio >= target {
                    Verdict::Slack(format!(
                        "{t:.1} MiB/s at least {:.1} x its target {target} MiB/s",
                        1.0 / c.slack_ratio
                    ))
                } else if o.busy < 1.0 - c.busy_min {
                    Verdict::Slack(format!("{:.0}% of its workers busy", o.busy * 100.0))
                } else {
                    Verdict::Met
                }
            }
        }
    }

    /// Each observed microstore's verdict on its round, as to workers: a latency target missed while its
    /// workers sit idle is met (more workers would not help).
    pub fn verdicts(&self, observations: &BTreeMap<String, Observation>) -> BTreeMap<String, Verdict> {
        let observed = self.holdings.iter().filter_map(|(n, h)| Some((n, h, observations.get(n)?)));
        observed.map(|(n, h, o)| (n.clone(), self.verdict(h, o, true))).collect()
    }

    /// Each observed microstore's verdict on its round, as to its target alone: a latency target missed is
    /// missed however busy its workers are (its drives may be what is short).
    pub fn target_verdicts(&self, observations: &BTreeMap<String, Observation>) -> BTreeMap<String, Verdict> {
        let observed = self.holdings.iter().filter_map(|(n, h)| Some((n, h, observations.get(n)?)));
        observed.map(|(n, h, o)| (n.clone(), self.verdict(h, o, false))).collect()
    }

    /// One round: microstores with slack give back a step, those missing their targets (the worst first)
    /// take their grants from the free pool and then from those with slack. Microstores without an
    /// observation are left as they are.
    pub fn decide(&mut self, observations: &BTreeMap<String, Observation>) -> Vec<Decision> {
        let verdicts = self.verdicts(observations);
        self.decide_on(verdicts, observations)
    }

    /// `decide` on verdicts given (an IO share's: `target_verdicts`, since a share of the drives may be
    /// what a microstore whose workers idle is short of).
    pub fn decide_on(
        &mut self,
        verdicts: BTreeMap<String, Verdict>,
        observations: &BTreeMap<String, Observation>,
    ) -> Vec<Decision> {
        self.check();
        let before: BTreeMap<String, u32> = self.holdings.iter().map(|(n, h)| (n.clone(), h.workers)).collect();
        let mut reasons: BTreeMap<String, String> = BTreeMap::new();
        let mut missing = vec![];
        let mut slack = vec![];
        for (name, verdict) in verdicts.into_iter().filter(|(n, _)| self.holdings.contains_key(n)) {
            match verdict {
                Verdict::Missing(by, why) => missing.push((by, name, why)),
                Verdict::Slack(why) => slack.push((name, why)),
                Verdict::Met => {}
            }
        }
        let floor = self.config.floor_workers;
        // Shrink linearly, only while another microstore wants workers: with none missing its target there
        // is no reason to take away what serves a burst (a store with one microstore never changes).
        let demand = !missing.is_empty();
        for (name, why) in slack.iter().filter(|_| demand) {
            let h = self.holdings.get_mut(name).expect("named from the holdings");
            h.grant = self.config.grow_start_workers;
            let give = self.config.shrink_step_workers.min(h.workers - floor);
            if give > 0 {
                h.workers -= give;
                self.free += give;
                reasons.insert(name.clone(), format!("slack ({why}): gives back {give}"));
            }
        }
        // Grow fast, the worst first (ties by name, so a round is deterministic).
        missing.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, name, why) in missing {
            let want = self.holdings[&name].grant;
            let mut got = want.min(self.free);
            self.free -= got;
            let mut from = vec![];
            if got > 0 {
                from.push(format!("{got} free"));
            }
            // Then from those with slack, the one holding most above its floor first.
            let mut donors: Vec<(u32, String)> = slack
                .iter()
                .map(|(n, _)| (self.holdings[n].workers - floor, n.clone()))
                .filter(|(spare, _)| *spare > 0)
                .collect();
            donors.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            for (spare, donor) in donors {
                if got == want {
                    break;
                }
                let take = spare.min(want - got);
                self.holdings.get_mut(&donor).expect("a holding").workers -= take;
                got += take;
                from.push(format!("{take} from {donor}"));
                let line = reasons.entry(donor.clone()).or_default();
                line.push_str(&format!("{}{take} taken by {name}", if line.is_empty() { "" } else { "; " }));
            }
            let h = self.holdings.get_mut(&name).expect("named from the holdings");
            h.workers += got;
            h.grant = want.saturating_mul(2).min(self.config.total_workers);
            let taken = if from.is_empty() { "nothing to take".to_string() } else { from.join(", ") };
            reasons.insert(name, format!("missing ({why}): asked {want}, got {got} ({taken})"));
        }
        for (name, h) in self.holdings.iter_mut() {
            if matches!(observations.get(name).map(|o| self.config.min_requests <= o.requests), Some(true))
                && !reasons.contains_key(name)
            {
                h.grant = self.config.grow_start_workers;
            }
        }
        self.check();
        let mut decisions = vec![];
        for (name, h) in &self.holdings {
            let was = before[name];
            if was != h.workers {
                let reason = reasons.remove(name).unwrap_or_default();
                decisions.push(Decision {
                    microstore: name.clone(),
                    workers_before: was,
                    workers_after: h.workers,
                    reason,
                });
            }
        }
        decisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> ManagerConfig {
        ManagerConfig {
            total_workers: 64,
            floor_workers: 2,
            shrink_step_workers: 2,
            grow_start_workers: 2,
            slack_ratio: 0.5,
            busy_min: 0.8,
            min_requests: 10,
        }
    }

    fn small(p99: f64) -> Observation {
        Observation { requests: 1_000, latency_ms_p99: Some(p99), throughput_mib_s: 1.0, busy: 0.5, waited: 10 }
    }

    fn large(mib_s: f64, busy: f64) -> Observation {
        Observation { requests: 100, latency_ms_p99: Some(500.0), throughput_mib_s: mib_s, busy, waited: 0 }
    }

    fn two() -> ResourceManager {
        let mut m = ResourceManager::new(config()).unwrap();
        m.add("small", Target::LatencyMsP99(10.0), 16).unwrap();
        m.add("large", Target::ThroughputMibS(100.0), 48).unwrap();
        m
    }

    fn obs(list: &[(&str, Observation)]) -> BTreeMap<String, Observation> {
        list.iter().map(|(n, o)| (n.to_string(), o.clone())).collect()
    }

    #[test]
    fn a_starved_microstore_takes_from_one_with_slack_doubling_each_round() {
        let mut m = two();
        let mut grants = vec![];
        for _ in 0..4 {
            let d = m.decide(&obs(&[("small", small(30.0)), ("large", large(400.0, 0.9))]));
            let s = d.iter().find(|d| d.microstore == "small").unwrap();
            grants.push(s.workers_after - s.workers_before);
            assert!(s.reason.contains("missing"), "{}", s.reason);
        }
        assert_eq!(grants, vec![2, 4, 8, 16]);
        assert_eq!(m.workers("small"), Some(16 + 30));
        assert_eq!(m.workers("large"), Some(48 - 30));
    }

    #[test]
    fn slack_is_given_back_linearly_while_another_misses_and_never_below_the_floor() {
        let mut m = ResourceManager::new(config()).unwrap();
        m.add("idle", Target::LatencyMsP99(10.0), 40).unwrap();
        m.add("busy", Target::LatencyMsP99(10.0), 2).unwrap();
        m.add("quiet", Target::ThroughputMibS(100.0), 22).unwrap();
        // Nobody misses: nothing moves, however much slack there is.
        assert_eq!(m.decide(&obs(&[("idle", small(1.0)), ("quiet", large(10.0, 0.1))])), vec![]);
        let mut busy_grants = vec![];
        for _ in 0..12 {
            let before = m.workers("busy").unwrap();
            m.decide(&obs(&[("idle", small(1.0)), ("busy", small(40.0)), ("quiet", large(10.0, 0.1))]));
            busy_grants.push(m.workers("busy").unwrap() - before);
        }
        assert_eq!(&busy_grants[..6], &[2, 4, 8, 16, 28, 0], "the last grant is what was left: {busy_grants:?}");
        assert_eq!(m.workers("idle"), Some(2));
        assert_eq!(m.workers("quiet"), Some(2));
        assert_eq!(m.workers("busy"), Some(60));
        assert_eq!(m.free_workers(), 0);
    }

    #[test]
    fn release_and_grant_keep_floors_and_the_free_pool() {
        let mut m = two();
        assert_eq!(m.release("large", 100), 46);
        assert_eq!(m.free_workers(), 46);
        assert_eq!(m.grant("small", 50), 46);
        assert_eq!(m.workers("small"), Some(62));
        assert_eq!(m.release("nothing", 1), 0);
    }

    #[test]
    fn a_slow_microstore_whose_workers_sit_idle_asks_for_none() {
        let mut m = two();
        let idle = Observation { waited: 0, busy: 0.1, ..small(40.0) };
        let o = obs(&[("small", idle), ("large", large(400.0, 0.9))]);
        assert_eq!(m.verdicts(&o)["small"], Verdict::Met);
        assert!(matches!(m.target_verdicts(&o)["small"], Verdict::Missing(..)), "its target is missed still");
        assert_eq!(m.decide(&o), vec![]);
    }

    #[test]
    fn a_met_target_keeps_what_it_holds_and_an_idle_large_tenant_is_not_starved() {
        let mut m = two();
        let d = m.decide(&obs(&[("small", small(7.0)), ("large", large(50.0, 0.5))]));
        assert_eq!(d, vec![]);
    }

    #[test]
    fn a_starved_microstore_without_donors_gets_what_is_free_and_says_so() {
        let mut m = ResourceManager::new(config()).unwrap();
        m.add("a", Target::LatencyMsP99(10.0), 62).unwrap();
        m.add("b", Target::LatencyMsP99(10.0), 2).unwrap();
        let d = m.decide(&obs(&[("a", small(20.0)), ("b", small(20.0))]));
        assert_eq!(d, vec![]);
        assert_eq!(m.free_workers(), 0);
    }

    #[test]
    fn adding_past_what_is_free_is_refused_and_removal_frees() {
        let mut m = two();
        assert!(m.add("third", Target::LatencyMsP99(5.0), 1).is_err());
        assert!(m.add("small", Target::LatencyMsP99(5.0), 0).is_err());
        assert!(m.add("bad", Target::LatencyMsP99(f64::NAN), 0).is_err());
        m.remove("large").unwrap();
        assert_eq!(m.free_workers(), 48);
        m.add("third", Target::LatencyMsP99(5.0), 1).unwrap();
        assert_eq!(m.workers("third"), Some(2));
    }

    #[test]
    fn configs_out_of_bounds_are_refused() {
        for bad in [
            ManagerConfig { total_workers: 0, ..config() },
            ManagerConfig { total_workers: MAX_WORKERS + 1, ..config() },
            ManagerConfig { floor_workers: 0, ..config() },
            ManagerConfig { floor_workers: 65, ..config() },
            ManagerConfig { slack_ratio: 1.0, ..config() },
            ManagerConfig { busy_min: 1.5, ..config() },
        ] {
            assert!(ResourceManager::new(bad.clone()).is_err(), "{bad:?}");
        }
    }

    fn observation() -> impl Strategy<Value = Observation> {
        (0u64..200, proptest::option::of(0.0f64..100.0), 0.0f64..500.0, 0.0f64..=1.0, 0u64..3).prop_map(
            |(requests, latency_ms_p99, throughput_mib_s, busy, waited)| Observation {
                requests,
                latency_ms_p99,
                throughput_mib_s,
                busy,
                waited,
            },
        )
    }

    proptest! {
        /// Whatever the observations: workers are conserved, floors hold, and the same input gives the same
        /// decisions.
        #[test]
        fn rounds_conserve_workers_and_are_deterministic(rounds in proptest::collection::vec(proptest::collection::vec(observation(), 3), 1..40)) {
            let build = || {
                let mut m = ResourceManager::new(config()).unwrap();
                m.add("a", Target::LatencyMsP99(10.0), 10).unwrap();
                m.add("b", Target::ThroughputMibS(100.0), 20).unwrap();
                m.add("c", Target::LatencyMsP99(50.0), 2).unwrap();
                m
            };
            let (mut m1, mut m2) = (build(), build());
            for round in rounds {
                let o = obs(&[("a", round[0].clone()), ("b", round[1].clone()), ("c", round[2].clone())]);
                let d1 = m1.decide(&o);
                prop_assert_eq!(d1, m2.decide(&o));
                let held: u32 = m1.holdings().values().map(|h| h.workers).sum();
                prop_assert_eq!(held + m1.free_workers(), 64);
                prop_assert!(m1.holdings().values().all(|h| h.workers >= 2));
            }
        }
    }
}
