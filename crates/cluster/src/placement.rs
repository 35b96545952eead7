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
