//! Where a placement group lives: weighted rendezvous hashing (straw2) in a hierarchy of failure domain
//! (zone or node), node and drive. Each candidate draws `ln(u) / weight` from a hash of (group, candidate)
//! and the largest draws win; the draws are exponential races, so taking the `width` best domains is
//! weighted sampling without replacement, and adding or removing a candidate changes only the groups it
//! wins or held (it moves only its share). The functions here are pure: every node computes the same
//! answer from the same map, bit for bit (the hash is fixed here, the logarithm is libm's, which gives the
//! same bits on every platform).

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

pub type NodeId = u64;
pub type DriveId = u32;

/// What the shards of one group must not share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureDomain {
    Node,
    Zone,
}

/// A node that may hold shards, with the drives that may.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub node: NodeId,
    pub zone: &'a str,
    /// (drive, weight); weights are positive.
    pub drives: Vec<(DriveId, u32)>,
}

impl Candidate<'_> {
    fn weight(&self) -> u64 {
        self.drives.iter().map(|&(_, w)| w as u64).sum()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("a set of {width} drives needs {width} distinct {domain}s with drives; the cluster has {have}")]
    TooFewDomains { width: usize, have: usize, domain: &'static str },
}

/// The placement group of an object's locator. Part of the format of a cluster (objects are found where it
/// says), pinned by a test: MD5 of the locator, its first 8 bytes little-endian, modulo the group count.
pub fn pg_of(locator: &[u8], pg_count: u32) -> u32 {
    debug_assert!(pg_count > 0);
    let digest = Md5::digest(locator);
    let first = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    let pg = (first % pg_count as u64) as u32;
    debug_assert!(pg < pg_count);
    pg
}

const SALT_DOMAIN: u64 = 0x6d6f_7361_6963_0001;
const SALT_NODE: u64 = 0x6d6f_7361_6963_0002;
const SALT_DRIVE: u64 = 0x6d6f_7361_6963_0003;

/// A 64-bit hash of three numbers (splitmix64's finalizer over each in turn): fixed forever.
fn mix(salt: u64, a: u64, b: u64) -> u64 {
    fn fin(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fin(fin(fin(salt ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(a)).wrapping_add(b))
}

/// FNV-1a of a zone's name: zones are named by people, groups hash them by name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// A straw2 draw: `ln(u) / weight` with `u` in (0, 1] from the hash; the largest wins.
fn draw(hash: u64, weight: u64) -> f64 {
    debug_assert!(weight > 0);
    let u = ((hash >> 11) + 1) as f64 / (1u64 << 53) as f64;
    libm::log(u) / weight as f64
}

/// The index of the largest draw among `items` (ties to the first), or None when `items` is empty.
fn best<T>(items: &[T], hash: impl Fn(&T) -> u64, weight: impl Fn(&T) -> u64) -> Option<usize> {
    let mut winner: Option<(usize, f64)> = None;
    for (i, item) in items.iter().enumerate() {
        let d = draw(hash(item), weight(item));
        if winner.is_none_or(|(_, w)| d > w) {
            winner = Some((i, d));
        }
    }
    winner.map(|(i, _)| i)
}

/// A failure domain: its hash key, its weight and its nodes (indices into the candidates).
struct Domain {
    key: u64,
    weight: u64,
    members: Vec<usize>,
}

/// The failure domains of `candidates` (in Node mode each node is its own); candidates without weight are
/// left out.
fn domains_of(candidates: &[Candidate<'_>], domain: FailureDomain) -> Vec<Domain> {
    let mut domains: Vec<Domain> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        let weight = c.weight();
        if weight == 0 {
            continue;
        }
        let key = match domain {
            FailureDomain::Node => c.node,
            FailureDomain::Zone => name_hash(c.zone),
        };
        let same =
            |d: &&mut Domain| domain == FailureDomain::Zone && d.key == key && candidates[d.members[0]].zone == c.zone;
        match domains.iter_mut().find(same) {
            Some(d) => {
                d.weight += weight;
                d.members.push(i);
            }
            None => domains.push(Domain { key, weight, members: vec![i] }),
        }
    }
    domains
}

/// The candidates (indices into `candidates`) that hold group `pg`, best ranked first: one node per failure
/// domain, the domains by their draws, then a node in each domain by its draw. `ranked` is scratch space.
fn choose_nodes(
    pg: u32,
    width: usize,
    candidates: &[Candidate<'_>],
    domains: &[Domain],
    ranked: &mut Vec<(f64, usize)>,
) -> Vec<usize> {
    debug_assert!(width > 0 && domains.len() >= width);
    ranked.clear();
    ranked.extend(domains.iter().enumerate().map(|(i, d)| (draw(mix(SALT_DOMAIN, pg as u64, d.key), d.weight), i)));
    // Largest draws first; a total order (draws are finite) with the index as the tie-break.
    let order = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if ranked.len() > width {
        ranked.select_nth_unstable_by(width - 1, order);
        ranked.truncate(width);
    }
    ranked.sort_unstable_by(order);
    let chosen: Vec<usize> = ranked
        .iter()
        .map(|&(_, i)| {
            let members = &domains[i].members;
            let best = best(members, |&c| mix(SALT_NODE, pg as u64, candidates[c].node), |&c| candidates[c].weight());
            members[best.expect("a domain has a node")]
        })
        .collect();
    debug_assert_eq!(chosen.len(), width);
    chosen
}

/// How far above its weight's share of its node's shards a drive may be filled.
const DRIVE_LOAD_SLACK: f64 = 0.02;

/// The drives of every group `0 .. pg_count`, each set best ranked first: nodes by `choose_nodes`, then on
/// each node the best-drawn drive that is not full. A drive is full at its weight's share of the shards its
/// node holds plus `DRIVE_LOAD_SLACK` (rendezvous with bounded loads): hashing alone would leave a drive
/// several percent off its share on a large cluster, bounded loads keep it within the slack while a change
/// still moves little more than its share (groups are filled in order, so only groups past a drive that
/// became full or free change drives, and only within their node).
pub fn place_all(
    pg_count: u32,
    width: usize,
    candidates: &[Candidate<'_>],
    domain: FailureDomain,
) -> Result<Vec<Vec<DriveId>>, PlacementError> {
    debug_assert!(width > 0);
    let domains = domains_of(candidates, domain);
    if domains.len() < width {
        let domain = match domain {
            FailureDomain::Node => "node",
            FailureDomain::Zone => "zone",
        };
        return Err(PlacementError::TooFewDomains { width, have: domains.len(), domain });
    }
    let mut nodes_of: Vec<Vec<usize>> = Vec::with_capacity(pg_count as usize);
    let mut node_shards = vec![0u64; candidates.len()];
    let mut ranked = Vec::with_capacity(domains.len());
    for pg in 0..pg_count {
        let nodes = choose_nodes(pg, width, candidates, &domains, &mut ranked);
        for &n in &nodes {
            node_shards[n] += 1;
        }
        nodes_of.push(nodes);
    }
    // Per candidate and drive: (shards placed, cap).
    let mut loads: Vec<Vec<(u64, u64)>> = candidates
        .iter()
        .zip(&node_shards)
        .map(|(c, &shards)| {
            let node_weight = c.weight().max(1) as f64;
            c.drives
                .iter()
                .map(|&(_, w)| (0, (shards as f64 * w as f64 / node_weight * (1.0 + DRIVE_LOAD_SLACK)).ceil() as u64))
                .collect()
        })
        .collect();
    let sets = nodes_of
        .iter()
        .enumerate()
        .map(|(pg, nodes)| {
            nodes
                .iter()
                .map(|&n| {
                    let drives = &candidates[n].drives;
                    let load = &mut loads[n];
                    let mut pick: Option<(usize, f64)> = None;
                    for (d, &(id, w)) in drives.iter().enumerate() {
                        if load[d].0 >= load[d].1 {
                            continue;
                        }
                        let drawn = draw(mix(SALT_DRIVE, pg as u64, id as u64), w as u64);
                        if pick.is_none_or(|(_, p)| drawn > p) {
                            pick = Some((d, drawn));
                        }
                    }
                    // The caps add up to at least the node's shards: a node always has an open drive.
                    let (d, _) = pick.expect("a node's caps cover its shards");
                    load[d].0 += 1;
                    drives[d].0
                })
                .collect()
        })
        .collect();
    Ok(sets)
}

/// How a map computes its groups' sets, fixed when the cluster is made: replaying a map's log must give
/// the sets it gave when first applied, so a map keeps its version and a node refuses one it does not know.
/// 1: `place_all` (rendezvous with bounded drive loads), for maps made before version 2.
pub const PLACEMENT_RENDEZVOUS: u32 = 1;
/// 2: `place_balanced` (each domain and drive at its weight's exact share; a change moves only what it must).
pub const PLACEMENT_BALANCED: u32 = 2;
/// The version a new cluster is made with.
pub const PLACEMENT_LATEST: u32 = PLACEMENT_BALANCED;

/// Integer shares of `total` in proportion to `weights` (all positive), none above `cap`, adding up to
/// `total`: floors first, the units left to the largest remainders (ties to the lower index); a share the
/// proportion would take past `cap` stops at it and the others share the rest. Needs `len * cap >= total`.
fn quotas(weights: &[u64], total: u64, cap: u64) -> Vec<u64> {
    assert!(weights.len() as u64 * cap >= total, "{} shares of at most {cap} cannot hold {total}", weights.len());
    debug_assert!(weights.iter().all(|&w| w > 0));
    let mut quota = vec![0u64; weights.len()];
    let mut capped = vec![false; weights.len()];
    let mut remaining = total;
    loop {
        let open_weight: u128 = weights.iter().zip(&capped).filter(|(_, c)| !**c).map(|(w, _)| *w as u128).sum();
        if open_weight == 0 {
            break;
        }
        let mut newly_capped = false;
        for i in 0..weights.len() {
            if !capped[i] && remaining as u128 * weights[i] as u128 / open_weight >= cap as u128 {
                capped[i] = true;
                quota[i] = cap;
                remaining -= cap;
                newly_capped = true;
            }
        }
        if !newly_capped {
            break;
        }
    }
    let open: Vec<usize> = (0..weights.len()).filter(|&i| !capped[i]).collect();
    let open_weight: u128 = open.iter().map(|&i| weights[i] as u128).sum();
    if !open.is_empty() {
        let mut remainders = Vec::with_capacity(open.len());
        let mut given = 0;
        for &i in &open {
            let exact = remaining as u128 * weights[i] as u128;
            quota[i] = (exact / open_weight) as u64;
            given += quota[i];
            remainders.push((exact % open_weight, i));
        }
        remainders.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, i) in remainders.iter().take((remaining - given) as usize) {
            quota[i] += 1;
        }
    }
    debug_assert_eq!(quota.iter().sum::<u64>(), total);
    debug_assert!(quota.iter().all(|&q| q <= cap));
    quota
}

/// Gives each of `slots` (a group and the child it had, if any) one child, every child at its quota of
/// the slots (by `weights`): a slot keeps its child unless the child is over its quota, and then the
/// slots that had no child give way first, then the kept ones the child draws lowest for (`draw`);
/// a slot without a child takes the best-drawn child under its quota.
fn spread(slots: &[(u32, Option<usize>)], weights: &[u64], draw: impl Fn(u32, usize) -> f64) -> Vec<usize> {
    debug_assert!(!weights.is_empty());
    let n = slots.len() as u64;
    let quota = quotas(weights, n, n);
    let natural = |g: u32| (0..weights.len()).max_by(|&a, &b| draw(g, a).total_cmp(&draw(g, b)).then(b.cmp(&a)));
    let mut child: Vec<Option<usize>> =
        slots.iter().map(|&(g, had)| had.filter(|&c| c < weights.len()).or_else(|| natural(g))).collect();
    let mut load = vec![0u64; weights.len()];
    for c in child.iter().flatten() {
        load[*c] += 1;
    }
    for c in 0..weights.len() {
        if load[c] <= quota[c] {
            continue;
        }
        let mut held: Vec<(bool, f64, usize)> = (0..slots.len())
            .filter(|&i| child[i] == Some(c))
            .map(|i| (slots[i].1 == Some(c), draw(slots[i].0, c), i))
            .collect();
        held.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        for &(_, _, i) in held.iter().take((load[c] - quota[c]) as usize) {
            child[i] = None;
        }
        load[c] = quota[c];
    }
    let chosen: Vec<usize> = slots
        .iter()
        .zip(child)
        .map(|(&(g, _), c)| {
            c.unwrap_or_else(|| {
                let open = (0..weights.len()).filter(|&c| load[c] < quota[c]);
                // The quotas add up to the slots: a slot without a child always finds one under its quota.
                let c = open.max_by(|&a, &b| draw(g, a).total_cmp(&draw(g, b)).then(b.cmp(&a))).expect("room");
                load[c] += 1;
                c
            })
        })
        .collect();
    debug_assert!(load.iter().zip(&quota).all(|(l, q)| l == q));
    chosen
}

/// One shard of a group while `place_balanced` works: its domain, and its node and drive once known
/// (indices into the candidates and the node's drives).
#[derive(Clone, Copy)]
struct Slot {
    domain: usize,
    node: Option<usize>,
    drive: Option<usize>,
}

/// The drives of every group `0 .. pg_count` given the sets they have now (`previous`, one per group, or
/// empty for a new map): every failure domain, node and drive holds its weight's share of the shards,
/// exactly to the shard (a domain at most one per group), and a change moves only the shards it must:
/// a shard stays where it is unless its drive left or holds more than its share; a domain over its share
/// gives up shards from its drives most over theirs, the ones they draw lowest for; a group short of
/// shards takes the best-drawn domains under their share (one of the rest only when none is left), then a
/// node and drive under theirs. A new map starts from the rendezvous choice of `choose_nodes`.
pub fn place_balanced(
    pg_count: u32,
    width: usize,
    candidates: &[Candidate<'_>],
    domain: FailureDomain,
    previous: &[Vec<DriveId>],
) -> Result<Vec<Vec<DriveId>>, PlacementError> {
    assert!(previous.is_empty() || previous.len() == pg_count as usize);
    debug_assert!(width > 0);
    let domains = domains_of(candidates, domain);
    if domains.len() < width {
        let domain = match domain {
            FailureDomain::Node => "node",
            FailureDomain::Zone => "zone",
        };
        return Err(PlacementError::TooFewDomains { width, have: domains.len(), domain });
    }
    let mut domain_of = vec![usize::MAX; candidates.len()];
    for (i, d) in domains.iter().enumerate() {
        for &m in &d.members {
            domain_of[m] = i;
        }
    }
    let mut slots = kept_slots(pg_count, width, candidates, &domains, &domain_of, previous);
    let quota =
        quotas(&domains.iter().map(|d| d.weight).collect::<Vec<_>>(), pg_count as u64 * width as u64, pg_count as u64);
    shed_over_quota(&mut slots, candidates, &domains, &quota);
    fill_domains(&mut slots, width, &domains, &quota);
    choose_nodes_and_drives(&mut slots, candidates, &domains);
    let sets: Vec<Vec<DriveId>> = slots
        .iter()
        .map(|group| {
            group
                .iter()
                .map(|s| {
                    let node = s.node.expect("every slot has a node");
                    candidates[node].drives[s.drive.expect("every slot has a drive")].0
                })
                .collect()
        })
        .collect();
    // Distinct domains are what lets a group lose a domain: checked on the way out, every time.
    for group in &slots {
        assert_eq!(group.len(), width);
        for (i, s) in group.iter().enumerate() {
            assert!(group[..i].iter().all(|o| o.domain != s.domain), "a group has two shards in one domain");
        }
    }
    Ok(sets)
}

/// Each group's shards that may stay: on a drive still a candidate, one per domain. A new map (no
/// `previous`) starts from the rendezvous choice of nodes.
fn kept_slots(
    pg_count: u32,
    width: usize,
    candidates: &[Candidate<'_>],
    domains: &[Domain],
    domain_of: &[usize],
    previous: &[Vec<DriveId>],
) -> Vec<Vec<Slot>> {
    let mut drive_at = std::collections::HashMap::new();
    for (c, cand) in candidates.iter().enumerate() {
        for (i, &(id, _)) in cand.drives.iter().enumerate() {
            if domain_of[c] != usize::MAX {
                drive_at.insert(id, (c, i));
            }
        }
    }
    let mut ranked = Vec::with_capacity(domains.len());
    (0..pg_count)
        .map(|pg| {
            let mut group: Vec<Slot> = Vec::with_capacity(width);
            if previous.is_empty() {
                for c in choose_nodes(pg, width, candidates, domains, &mut ranked) {
                    group.push(Slot { domain: domain_of[c], node: Some(c), drive: None });
                }
                return group;
            }
            for id in &previous[pg as usize] {
                if let Some(&(c, i)) = drive_at.get(id)
                    && group.len() < width
                    && group.iter().all(|s| s.domain != domain_of[c])
                {
                    group.push(Slot { domain: domain_of[c], node: Some(c), drive: Some(i) });
                }
            }
            group
        })
        .collect()
}

/// Takes shards off every domain above its quota: the excess is shared among the domain's drives by how
/// far each is above its own share of the domain's quota, and each drive gives up the groups that have
/// given up fewest so far (so that a group rarely needs two new domains), then those it draws lowest for.
fn shed_over_quota(slots: &mut [Vec<Slot>], candidates: &[Candidate<'_>], domains: &[Domain], quota: &[u64]) {
    let mut shed = vec![0u32; slots.len()];
    // (group, position in its slots) of every shard, by domain; positions hold until the end.
    let mut by_domain: Vec<Vec<(usize, usize)>> = vec![Vec::new(); domains.len()];
    for (g, group) in slots.iter().enumerate() {
        for (i, s) in group.iter().enumerate() {
            by_domain[s.domain].push((g, i));
        }
    }
    for (di, d) in domains.iter().enumerate() {
        let held = &by_domain[di];
        let Some(mut excess) = (held.len() as u64).checked_sub(quota[di]).filter(|&e| e > 0) else {
            continue;
        };
        // The domain's drives, their shares of its quota and the shards they hold now.
        let drives: Vec<(usize, usize)> =
            d.members.iter().flat_map(|&c| (0..candidates[c].drives.len()).map(move |i| (c, i))).collect();
        let weights: Vec<u64> = drives.iter().map(|&(c, i)| candidates[c].drives[i].1 as u64).collect();
        let share = quotas(&weights, quota[di], quota[di]);
        let mut on: Vec<Vec<(usize, usize)>> = vec![Vec::new(); drives.len()];
        let mut loose = Vec::new();
        for &(g, i) in held {
            let s = slots[g][i];
            match drives.iter().position(|&x| Some(x.0) == s.node && Some(x.1) == s.drive) {
                Some(k) => on[k].push((g, i)),
                None => loose.push((g, i)),
            }
        }
        let mut picked: Vec<(usize, usize)> = Vec::new();
        // Shards without a drive yet (a new map) go first, by the domain's draw.
        let domain_draw = |g: usize| draw(mix(SALT_DOMAIN, g as u64, d.key), d.weight);
        loose.sort_unstable_by(|a, b| domain_draw(a.0).total_cmp(&domain_draw(b.0)).then(a.cmp(b)));
        for &x in loose.iter().take(excess as usize) {
            picked.push(x);
        }
        excess -= picked.len() as u64;
        let mut load: Vec<u64> = on.iter().map(|v| v.len() as u64).collect();
        let mut give = vec![0usize; drives.len()];
        for _ in 0..excess {
            let k = (0..drives.len())
                .filter(|&k| load[k] > 0)
                .max_by(|&a, &b| {
                    (load[a] as i64 - share[a] as i64).cmp(&(load[b] as i64 - share[b] as i64)).then(b.cmp(&a))
                })
                .expect("a domain over its quota holds shards");
            load[k] -= 1;
            give[k] += 1;
        }
        for (k, held) in on.iter().enumerate() {
            let (c, i) = drives[k];
            let id = candidates[c].drives[i].0 as u64;
            let w = candidates[c].drives[i].1 as u64;
            if give[k] == 0 {
                continue;
            }
            let mut keyed: Vec<(u32, f64, (usize, usize))> =
                held.iter().map(|&(g, i)| (shed[g], draw(mix(SALT_DRIVE, g as u64, id), w), (g, i))).collect();
            keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
            picked.extend(keyed.iter().take(give[k]).map(|x| x.2));
        }
        for &(g, i) in &picked {
            slots[g][i].domain = usize::MAX;
            shed[g] += 1;
        }
    }
    for group in slots.iter_mut() {
        group.retain(|s| s.domain != usize::MAX);
    }
}

/// Gives every group short of shards the best-drawn domains it is not in that are under their quota, or,
/// when too few are, the best-drawn of the rest.
fn fill_domains(slots: &mut [Vec<Slot>], width: usize, domains: &[Domain], quota: &[u64]) {
    let mut load = vec![0u64; domains.len()];
    for s in slots.iter().flatten() {
        load[s.domain] += 1;
    }
    let mut ranked: Vec<(f64, usize)> = Vec::with_capacity(domains.len());
    for (g, group) in slots.iter_mut().enumerate() {
        if group.len() == width {
            continue;
        }
        ranked.clear();
        ranked.extend(
            domains
                .iter()
                .enumerate()
                .filter(|(i, _)| group.iter().all(|s| s.domain != *i))
                .map(|(i, d)| (draw(mix(SALT_DOMAIN, g as u64, d.key), d.weight), i)),
        );
        ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let under: Vec<usize> = ranked.iter().map(|&(_, i)| i).filter(|&i| load[i] < quota[i]).collect();
        let over = ranked.iter().map(|&(_, i)| i).filter(|&i| load[i] >= quota[i]);
        for i in under.into_iter().chain(over).take(width - group.len()).collect::<Vec<_>>() {
            load[i] += 1;
            group.push(Slot { domain: i, node: None, drive: None });
        }
        debug_assert_eq!(group.len(), width);
    }
}

/// A node in each group's domains and a drive on each node, each at its weight's share (`spread`).
fn choose_nodes_and_drives(slots: &mut [Vec<Slot>], candidates: &[Candidate<'_>], domains: &[Domain]) {
    let mut by_domain: Vec<Vec<(usize, usize)>> = vec![Vec::new(); domains.len()];
    for (g, group) in slots.iter().enumerate() {
        for (i, s) in group.iter().enumerate() {
            by_domain[s.domain].push((g, i));
        }
    }
    for (di, held) in by_domain.iter().enumerate() {
        let members = &domains[di].members;
        let had: Vec<(u32, Option<usize>)> = held
            .iter()
            .map(|&(g, i)| (g as u32, slots[g][i].node.and_then(|c| members.iter().position(|&m| m == c))))
            .collect();
        let weights: Vec<u64> = members.iter().map(|&c| candidates[c].weight()).collect();
        let chosen =
            spread(&had, &weights, |g, k| draw(mix(SALT_NODE, g as u64, candidates[members[k]].node), weights[k]));
        for (&(g, i), k) in held.iter().zip(chosen) {
            let s = &mut slots[g][i];
            if s.node != Some(members[k]) {
                s.node = Some(members[k]);
                s.drive = None;
            }
        }
    }
    let mut by_node: Vec<Vec<(usize, usize)>> = vec![Vec::new(); candidates.len()];
    for (g, group) in slots.iter().enumerate() {
        for (i, s) in group.iter().enumerate() {
            by_node[s.node.expect("a node was chosen")].push((g, i));
        }
    }
    for (c, held) in by_node.iter().enumerate() {
        if held.is_empty() {
            continue;
        }
        let drives = &candidates[c].drives;
        let had: Vec<(u32, Option<usize>)> = held.iter().map(|&(g, i)| (g as u32, slots[g][i].drive)).collect();
        let weights: Vec<u64> = drives.iter().map(|&(_, w)| w as u64).collect();
        let chosen = spread(&had, &weights, |g, k| draw(mix(SALT_DRIVE, g as u64, drives[k].0 as u64), weights[k]));
        for (&(g, i), k) in held.iter().zip(chosen) {
            slots[g][i].drive = Some(k);
        }
    }
}

/// Shard positions for the drives `chosen` (best first) given the group's `previous` set: a drive that
/// stays keeps its position (its shard does not move), a new drive on the node of one that left takes its
/// position (the shard moves within the node), other new drives fill the remaining positions in rank order.
pub fn assign_positions(
    previous: &[DriveId],
    chosen: &[DriveId],
    node_of: impl Fn(DriveId) -> Option<NodeId>,
) -> Vec<DriveId> {
    if previous.len() != chosen.len() {
        return chosen.to_vec();
    }
    let mut newcomers: Vec<DriveId> = chosen.iter().copied().filter(|d| !previous.contains(d)).collect();
    let mut set: Vec<Option<DriveId>> = previous.iter().map(|d| chosen.contains(d).then_some(*d)).collect();
    for (slot, old) in set.iter_mut().zip(previous) {
        if slot.is_none()
            && let Some(node) = node_of(*old)
            && let Some(i) = newcomers.iter().position(|d| node_of(*d) == Some(node))
        {
            *slot = Some(newcomers.remove(i));
        }
    }
    let mut rest = newcomers.into_iter();
    let set: Vec<DriveId> = set
        .into_iter()
        .map(|slot| slot.unwrap_or_else(|| rest.next().expect("as many newcomers as leavers")))
        .collect();
    debug_assert!(rest.next().is_none());
    debug_assert!(chosen.iter().all(|d| set.contains(d)));
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_hashes_are_fixed_forever() {
        // Changing these moves every object of every cluster: a format change, never a refactoring.
        let got: Vec<u32> = ["a", "photos/cat.jpg", "k-00001"].iter().map(|k| pg_of(k.as_bytes(), 4096)).collect();
        assert_eq!(got, PINNED_PGS);
        assert_eq!(mix(1, 2, 3), PINNED_MIX);
        assert_eq!(name_hash("zone-a"), PINNED_ZONE);
        assert_eq!(draw(u64::MAX, 1), 0.0);
        let all = nodes(6, 3);
        let sets = place_all(2, 4, &candidates(&all), FailureDomain::Node).unwrap();
        assert_eq!(sets, PINNED_SETS);
    }

    const PINNED_PGS: [u32; 3] = [268, 1763, 3145];
    const PINNED_MIX: u64 = 11689805963266651032;
    const PINNED_ZONE: u64 = 3552967045029796717;
    const PINNED_SETS: [[DriveId; 4]; 2] = [[10, 12, 3, 15], [9, 5, 0, 14]];

    type Node = (NodeId, String, Vec<(DriveId, u32)>);

    fn nodes(count: u64, drives_per_node: u32) -> Vec<Node> {
        (0..count)
            .map(|n| {
                let drives = (0..drives_per_node).map(|d| (n as u32 * drives_per_node + d, 100)).collect();
                (n, format!("z{}", n % 4), drives)
            })
            .collect()
    }

    fn candidates(nodes: &[Node]) -> Vec<Candidate<'_>> {
        nodes.iter().map(|(n, z, d)| Candidate { node: *n, zone: z, drives: d.clone() }).collect()
    }

    #[test]
    fn one_drive_per_domain() {
        let all = nodes(6, 3);
        let c = candidates(&all);
        let sets = place_all(500, 6, &c, FailureDomain::Node).unwrap();
        let zone_sets = place_all(500, 4, &c, FailureDomain::Zone).unwrap();
        for (set, zone_set) in sets.iter().zip(&zone_sets) {
            let mut owners: Vec<u32> = set.iter().map(|d| d / 3).collect();
            owners.sort();
            owners.dedup();
            assert_eq!(owners.len(), 6, "{set:?}");
            let zones: std::collections::BTreeSet<u32> = zone_set.iter().map(|d| (d / 3) % 4).collect();
            assert_eq!(zones.len(), 4);
        }
        assert_eq!(
            place_all(1, 7, &c, FailureDomain::Node),
            Err(PlacementError::TooFewDomains { width: 7, have: 6, domain: "node" })
        );
        assert_eq!(
            place_all(1, 5, &c, FailureDomain::Zone),
            Err(PlacementError::TooFewDomains { width: 5, have: 4, domain: "zone" })
        );
        // A node without weight is not a candidate.
        let mut light = all.clone();
        light[0].2.clear();
        assert!(place_all(1, 6, &candidates(&light), FailureDomain::Node).is_err());
    }

    #[test]
    fn positions_stay_put() {
        // Drives d live on node d / 10.
        let node_of = |d: DriveId| Some(d as NodeId / 10);
        assert_eq!(assign_positions(&[], &[3, 1, 2], node_of), vec![3, 1, 2]);
        assert_eq!(assign_positions(&[1, 2, 3], &[3, 1, 2], node_of), vec![1, 2, 3]);
        assert_eq!(assign_positions(&[10, 20, 30], &[90, 10, 30], node_of), vec![10, 90, 30]);
        assert_eq!(assign_positions(&[10, 20, 30], &[80, 90, 20], node_of), vec![80, 20, 90]);
        // A drive that changes within its node keeps its node's position, whatever the rank order.
        assert_eq!(assign_positions(&[10, 20, 30], &[90, 21, 30], node_of), vec![90, 21, 30]);
        assert_eq!(assign_positions(&[10, 20, 30], &[90, 11, 30], node_of), vec![11, 90, 30]);
    }
}
