//! The resource manager's drives (paper 002: a microstore's drives move toward it as load changes): the
//! erasure sets microstores own move, a whole set at a time, from one with slack to one missing its
//! target. A set's move migrates data (the buckets of the microstore it leaves move off it, those of the
//! one it joins spread onto it), so sets move far more slowly than workers: only after a microstore missed
//! its target in the round and in 80% of the last `patience_rounds` quiet rounds while its donor had slack
//! as long (a share, so that one noisy round does not start the count over), never while a bucket's data
//! or the home still moves, and not for `cooldown_rounds` after a move. Grow fast (a microstore's grant
//! doubles each time it still misses after its last gain, back to one set once it has slack), shrink
//! linearly (a donor gives at most one set per decision), never below `floor_sets`.
//!
//! Who takes part: the microstores that own sets, and the default microstore, which holds the home (the
//! sets no microstore owns). A microstore without sets of its own shares the home and is left out (a set
//! of its own would be fewer drives than it shares). Decisions are deterministic for a given input.

use crate::manager::Verdict;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SetsConfig {
    /// Whether sets move at all (off: each microstore keeps the sets it was created with).
    pub enabled: bool,
    /// Quiet rounds in a row a microstore must miss its target (and its donor have slack) before a set
    /// moves.
    pub patience_rounds: u32,
    /// Rounds after a decision before the next may be taken (besides waiting for the data to move).
    pub cooldown_rounds: u32,
    /// No microstore holding sets keeps fewer.
    pub floor_sets: u32,
}

impl Default for SetsConfig {
    fn default() -> Self {
        SetsConfig { enabled: true, patience_rounds: 3, cooldown_rounds: 2, floor_sets: 1 }
    }
}

/// Most rounds of patience or cooldown (a round is a window slot, seconds by default).
pub const MAX_ROUNDS: u32 = 10_000;

impl SetsConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.patience_rounds == 0 || self.patience_rounds > MAX_ROUNDS || self.cooldown_rounds > MAX_ROUNDS {
            return Err(format!("set_patience_rounds is 1 to {MAX_ROUNDS} and set_cooldown_rounds 0 to {MAX_ROUNDS}"));
        }
        if self.floor_sets == 0 {
            return Err("set_floor is at least 1 (a microstore holding sets keeps one)".into());
        }
        Ok(())
    }
}

/// A set moved from one microstore to another, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetDecision {
    pub set: usize,
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// A round's verdict, as the planner keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Missing,
    Slack,
    Met,
}

/// What the planner keeps of a microstore between rounds.
#[derive(Clone, Debug, PartialEq)]
struct Track {
    /// The verdicts of the last `patience_rounds` quiet rounds, oldest first.
    recent: VecDeque<Kind>,
    /// Sets it asks for when it next gains.
    grant: u32,
}

impl Track {
    /// Whether `kind` held in this round and in at least `PATIENCE_SHARE_PERCENT` of the last `patience`
    /// quiet rounds (a streak would start over at one noisy round).
    fn lasted(&self, kind: Kind, patience: u32) -> bool {
        let held = self.recent.iter().filter(|k| **k == kind).count() as u64;
        self.recent.len() as u64 == u64::from(patience)
            && self.recent.back() == Some(&kind)
            && held * 100 >= u64::from(patience) * PATIENCE_SHARE_PERCENT
    }
}

/// The share of the patience window in which a taker must have missed its target (or a giver had slack).
const PATIENCE_SHARE_PERCENT: u64 = 80;

pub struct SetPlanner {
    config: SetsConfig,
    tracks: BTreeMap<String, Track>,
    cooldown_left: u32,
}

impl SetPlanner {
    pub fn new(config: SetsConfig) -> Result<SetPlanner, String> {
        config.validate()?;
        Ok(SetPlanner { config, tracks: BTreeMap::new(), cooldown_left: 0 })
    }

    pub fn config(&self) -> &SetsConfig {
        &self.config
    }

    /// One round. `holdings`: the sets each taking part holds (disjoint; the default microstore's is the
    /// home); `verdicts`: how each did this round; `moving`: whether some data still moves between sets.
    /// The decisions are to be applied by the caller, all of them or none.
    pub fn decide(
        &mut self,
        holdings: &BTreeMap<String, Vec<usize>>,
        verdicts: &BTreeMap<String, Verdict>,
        moving: bool,
    ) -> Vec<SetDecision> {
        let held_before = check_disjoint(holdings);
        self.tracks.retain(|name, _| holdings.contains_key(name));
        if held_before.is_none() || moving || self.cooldown_left > 0 {
            // Only quiet rounds count: what a round measures while data moves says little of the sets
            // after.
            self.cooldown_left = self.cooldown_left.saturating_sub(u32::from(!moving));
            self.tracks.values_mut().for_each(|t| t.recent.clear());
            return vec![];
        }
        self.count(holdings, verdicts);
        let decisions = self.plan(holdings, verdicts);
        if !decisions.is_empty() {
            self.cooldown_left = self.config.cooldown_rounds;
            self.tracks.values_mut().for_each(|t| t.recent.clear());
        }
        debug_assert!(decisions.iter().all(|d| holdings[&d.from].contains(&d.set) && d.from != d.to));
        decisions
    }

    fn count(&mut self, holdings: &BTreeMap<String, Vec<usize>>, verdicts: &BTreeMap<String, Verdict>) {
        let patience = self.config.patience_rounds as usize;
        for name in holdings.keys() {
            let t = self.tracks.entry(name.clone()).or_insert(Track { recent: VecDeque::new(), grant: 1 });
            let kind = match verdicts.get(name) {
                Some(Verdict::Missing(..)) => Kind::Missing,
                Some(Verdict::Slack(_)) => Kind::Slack,
                Some(Verdict::Met) | None => Kind::Met,
            };
            if kind == Kind::Slack {
                // It needs no more: its next gain starts from one set again.
                t.grant = 1;
            }
            if t.recent.len() == patience {
                t.recent.pop_front();
            }
            t.recent.push_back(kind);
            debug_assert!(t.recent.len() <= patience);
        }
    }

    fn plan(
        &mut self,
        holdings: &BTreeMap<String, Vec<usize>>,
        verdicts: &BTreeMap<String, Verdict>,
    ) -> Vec<SetDecision> {
        let patience = self.config.patience_rounds;
        let floor = self.config.floor_sets as usize;
        let mut missing: Vec<(f64, &String, &str)> = holdings
            .keys()
            .filter(|n| self.tracks[*n].lasted(Kind::Missing, patience))
            .filter_map(|n| match verdicts.get(n) {
                Some(Verdict::Missing(by, why)) => Some((*by, n, why.as_str())),
                _ => None,
            })
            .collect();
        // The worst first (ties by name, so a round is deterministic).
        missing.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut spare: BTreeMap<&String, Vec<usize>> = holdings
            .iter()
            .filter(|(n, sets)| self.tracks[*n].lasted(Kind::Slack, patience) && sets.len() > floor)
            .map(|(n, sets)| (n, sets.clone()))
            .collect();
        let mut decisions = vec![];
        for (_, name, why) in missing {
            let want = self.tracks[name].grant;
            let mut got = 0;
            // The donor holding most first; each gives one set, its highest.
            let mut donors: Vec<(&String, usize)> = spare.iter().map(|(n, s)| (*n, s.len())).collect();
            donors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            for (donor, _) in donors {
                if got == want {
                    break;
                }
                let sets = spare.remove(donor).expect("a donor");
                let set = *sets.last().expect("a donor holds more than its floor");
                let reason = format!(
                    "{name} missing its target in most of {patience} rounds ({why}), {donor} with slack as long: \
                     set {set} moves ({} of {want} asked)",
                    got + 1
                );
                decisions.push(SetDecision { set, from: donor.clone(), to: name.clone(), reason });
                got += 1;
            }
            if got > 0 {
                let t = self.tracks.get_mut(name).expect("tracked");
                t.grant = want.saturating_mul(2).min(crate::registry::MAX_SETS as u32);
            }
        }
        decisions
    }
}

/// The sets held, if no set is held twice.
fn check_disjoint(holdings: &BTreeMap<String, Vec<usize>>) -> Option<BTreeSet<usize>> {
    let mut all = BTreeSet::new();
    let every = holdings.values().flatten().all(|s| all.insert(*s));
    every.then_some(all)
}

/// The holdings after `decisions`.
pub fn apply(holdings: &BTreeMap<String, Vec<usize>>, decisions: &[SetDecision]) -> BTreeMap<String, Vec<usize>> {
    let mut out = holdings.clone();
    for d in decisions {
        out.get_mut(&d.from).expect("a donor holds").retain(|s| *s != d.set);
        let to = out.get_mut(&d.to).expect("a recipient holds");
        to.push(d.set);
        to.sort_unstable();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> SetsConfig {
        SetsConfig { enabled: true, patience_rounds: 2, cooldown_rounds: 1, floor_sets: 1 }
    }

    fn holdings(list: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
        list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
    }

    fn missing() -> Verdict {
        Verdict::Missing(3.0, "p99 30 ms above its target 10 ms".into())
    }

    fn slack() -> Verdict {
        Verdict::Slack("idle".into())
    }

    fn verdicts(list: &[(&str, Verdict)]) -> BTreeMap<String, Verdict> {
        list.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()
    }

    #[test]
    fn a_set_moves_after_patience_then_waits_for_the_move_and_the_cooldown_and_the_grant_doubles() {
        let mut p = SetPlanner::new(config()).unwrap();
        let mut h = holdings(&[("default", &[0, 1, 2, 3, 4]), ("small", &[5])]);
        let v = verdicts(&[("default", slack()), ("small", missing())]);
        assert_eq!(p.decide(&h, &v, false), vec![], "one round is not enough");
        let d = p.decide(&h, &v, false);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].set, d[0].from.as_str(), d[0].to.as_str()), (4, "default", "small"), "{d:?}");
        assert!(d[0].reason.contains("small missing its target"), "{}", d[0].reason);
        h = apply(&h, &d);
        assert_eq!(h["small"], [4, 5]);
        // While the data moves nothing else moves, and those rounds do not count.
        for _ in 0..5 {
            assert_eq!(p.decide(&h, &v, true), vec![]);
        }
        // Then the cooldown's round, and patience again.
        assert_eq!(p.decide(&h, &v, false), vec![], "cooldown");
        // The grant doubled, but a donor gives one set per decision: with another donor, two move.
        let mut h2 = h.clone();
        h2.insert("large".into(), vec![6, 7]);
        let v2 = verdicts(&[("default", slack()), ("small", missing()), ("large", slack())]);
        assert_eq!(p.decide(&h2, &v2, false), vec![], "patience again");
        let d = p.decide(&h2, &v2, false);
        assert_eq!(d.iter().map(|d| (d.set, d.from.as_str())).collect::<Vec<_>>(), vec![(3, "default"), (7, "large")]);
    }

    #[test]
    fn one_round_within_the_target_does_not_start_the_patience_over() {
        let mut p = SetPlanner::new(SetsConfig { patience_rounds: 5, ..config() }).unwrap();
        let h = holdings(&[("default", &[0, 1]), ("small", &[2])]);
        let round = |p: &mut SetPlanner, small: Verdict| {
            p.decide(&h, &verdicts(&[("default", slack()), ("small", small)]), false)
        };
        for _ in 0..2 {
            assert_eq!(round(&mut p, missing()), vec![]);
        }
        assert_eq!(round(&mut p, Verdict::Met), vec![]);
        assert_eq!(round(&mut p, missing()), vec![]);
        assert_eq!(round(&mut p, missing()).len(), 1, "four of five rounds missed, the last among them");
        // Two rounds within it out of five are too many.
        let mut p = SetPlanner::new(SetsConfig { patience_rounds: 5, ..config() }).unwrap();
        for v in [missing(), Verdict::Met, missing(), Verdict::Met, missing(), missing()] {
            assert_eq!(round(&mut p, v), vec![]);
        }
        assert_eq!(round(&mut p, missing()).len(), 1, "the window slid past them");
    }

    #[test]
    fn donors_keep_their_floor_and_a_met_or_missing_one_gives_nothing() {
        let mut p = SetPlanner::new(config()).unwrap();
        let h = holdings(&[("default", &[0]), ("a", &[1, 2]), ("b", &[3])]);
        let v = verdicts(&[("default", slack()), ("a", Verdict::Met), ("b", missing())]);
        for _ in 0..5 {
            assert_eq!(p.decide(&h, &v, false), vec![], "default at its floor, a met its target");
        }
        let v = verdicts(&[("default", slack()), ("a", missing()), ("b", missing())]);
        for _ in 0..5 {
            assert_eq!(p.decide(&h, &v, false), vec![], "nobody has slack to give");
        }
    }

    #[test]
    fn the_default_microstore_gets_a_set_back_and_overlaps_freeze_everything() {
        let mut p = SetPlanner::new(config()).unwrap();
        let h = holdings(&[("default", &[0]), ("big", &[1, 2, 3])]);
        let v = verdicts(&[("default", missing()), ("big", slack())]);
        p.decide(&h, &v, false);
        let d = p.decide(&h, &v, false);
        assert_eq!(d.iter().map(|d| (d.set, d.to.as_str())).collect::<Vec<_>>(), vec![(3, "default")]);
        let mut p = SetPlanner::new(config()).unwrap();
        let overlapping = holdings(&[("default", &[0, 1]), ("big", &[1, 2, 3])]);
        for _ in 0..5 {
            assert_eq!(p.decide(&overlapping, &v, false), vec![]);
        }
    }

    #[test]
    fn configs_out_of_bounds_are_refused() {
        for bad in [
            SetsConfig { patience_rounds: 0, ..config() },
            SetsConfig { patience_rounds: MAX_ROUNDS + 1, ..config() },
            SetsConfig { cooldown_rounds: MAX_ROUNDS + 1, ..config() },
            SetsConfig { floor_sets: 0, ..config() },
        ] {
            assert!(SetPlanner::new(bad.clone()).is_err(), "{bad:?}");
        }
    }

    fn verdict() -> impl Strategy<Value = Verdict> {
        prop_oneof![
            (1.0f64..10.0).prop_map(|by| Verdict::Missing(by, "slow".into())),
            Just(Verdict::Slack("idle".into())),
            Just(Verdict::Met),
        ]
    }

    proptest! {
        /// Whatever the verdicts: every set stays held by exactly one microstore, floors hold, a set moves
        /// only from a holder, and the same input gives the same decisions.
        #[test]
        fn rounds_conserve_sets_and_floors_and_are_deterministic(
            rounds in proptest::collection::vec((proptest::collection::vec(verdict(), 3), any::<bool>()), 1..60)
        ) {
            let start = holdings(&[("default", &[0, 1, 2]), ("a", &[3, 4]), ("b", &[5])]);
            let (mut p1, mut p2) = (SetPlanner::new(config()).unwrap(), SetPlanner::new(config()).unwrap());
            let mut h = start.clone();
            for (v, moving) in rounds {
                let v = verdicts(&[("default", v[0].clone()), ("a", v[1].clone()), ("b", v[2].clone())]);
                let d1 = p1.decide(&h, &v, moving);
                prop_assert_eq!(&d1, &p2.decide(&h, &v, moving));
                prop_assert!(!moving || d1.is_empty());
                h = apply(&h, &d1);
                let all: Vec<usize> = h.values().flatten().copied().collect();
                prop_assert_eq!(all.len(), 6);
                prop_assert_eq!(check_disjoint(&h).map(|s| s.len()), Some(6));
                prop_assert!(h.values().all(|s| !s.is_empty()));
            }
        }
    }
}
