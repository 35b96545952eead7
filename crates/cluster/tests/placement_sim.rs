//! Placement over a simulated large cluster (issue 16): 1,000 drives on 100 nodes of mixed capacity.
//! Each drive's share of shards is within 5% of its weight's share, and adding a node moves within 5% of
//! the optimal fraction of shards (its weight over the new total), never a shard it need not move.

use mosaic_cluster::{Change, ClusterMap, FailureDomain};

const NODES: u64 = 100;
const DRIVES_PER_NODE: u32 = 10;
/// Enough groups that a drive's count of shards (about 6,300) varies by well under 5% from chance alone.
const PG_COUNT: u32 = 1 << 20;

/// Drive weights vary by node (100 to 200, like disks of several sizes), uniform within a node.
fn weight_of(node: u64) -> u32 {
    100 + (node % 5) as u32 * 25
}

fn add_node(node: u64, weight: u32) -> Change {
    let mut changes = vec![Change::AddNode {
        node,
        address: format!("10.0.{}.{}:9100", node / 250, node % 250),
        s3_address: format!("10.0.{}.{}:9000", node / 250, node % 250),
        zone: format!("rack-{}", node % 10),
    }];
    changes.extend((0..DRIVES_PER_NODE).map(|d| Change::AddDrive { node, name: format!("d{d}"), weight }));
    Change::Batch(changes)
}

fn cluster() -> ClusterMap {
    let mut map = ClusterMap::empty();
    map.apply(&Change::Bootstrap {
        cluster_id: "sim".into(),
        data_shards: 4,
        parity_shards: 2,
        pg_count: PG_COUNT,
        failure_domain: FailureDomain::Node,
    })
    .unwrap();
    let all: Vec<Change> = (0..NODES).map(|n| add_node(n, weight_of(n))).collect();
    // One batch of batches is refused; nodes go in as batches of their own, placed once at the end.
    let flat: Vec<Change> = all
        .into_iter()
        .flat_map(|c| match c {
            Change::Batch(v) => v,
            other => vec![other],
        })
        .collect();
    map.apply(&Change::Batch(flat)).unwrap();
    assert_eq!(map.drives.len(), (NODES * DRIVES_PER_NODE as u64) as usize);
    assert_eq!(map.pgs.len(), PG_COUNT as usize);
    map
}

fn shards_per_drive(map: &ClusterMap) -> std::collections::BTreeMap<u32, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for pg in &map.pgs {
        for d in &pg.set {
            *counts.entry(*d).or_insert(0u64) += 1;
        }
    }
    counts
}

#[test]
fn shares_follow_weights_and_additions_move_only_their_share() {
    let mut map = cluster();
    let total_shards = PG_COUNT as u64 * 6;
    let total_weight: u64 = map.drives.values().map(|d| d.weight as u64).sum();
    let counts = shards_per_drive(&map);
    let mut worst = 0.0f64;
    for (id, drive) in &map.drives {
        let want = total_shards as f64 * drive.weight as f64 / total_weight as f64;
        let got = *counts.get(id).unwrap_or(&0) as f64;
        worst = worst.max((got / want - 1.0).abs());
    }
    for w in [100u32, 125, 150, 175, 200] {
        let ratios: Vec<f64> = map
            .drives
            .iter()
            .filter(|(_, d)| d.weight == w)
            .map(|(id, d)| {
                *counts.get(id).unwrap_or(&0) as f64 / (total_shards as f64 * d.weight as f64 / total_weight as f64)
            })
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / ratios.len() as f64).sqrt();
        let expect = 1.0 / (total_shards as f64 * w as f64 / total_weight as f64).sqrt();
        println!("weight {w}: mean ratio {mean:.4} sd {sd:.4} poisson sd {expect:.4}");
    }
    println!("worst drive share off its weight's share by {:.2}%", worst * 100.0);
    assert!(worst < 0.05, "a drive's share is {:.2}% off its weight's share", worst * 100.0);

    // A node of average weight joins: the optimal fraction of shards to move is its weight over the total.
    let before = map.clone();
    let weight = 150;
    map.apply(&add_node(NODES, weight)).unwrap();
    let new_total = total_weight + weight as u64 * DRIVES_PER_NODE as u64;
    let optimal = (weight as u64 * DRIVES_PER_NODE as u64) as f64 / new_total as f64;
    let (mut moved, mut within_node) = (0u64, 0u64);
    for (old, new) in before.pgs.iter().zip(&map.pgs) {
        for (a, b) in old.set.iter().zip(&new.set) {
            if a != b {
                moved += 1;
                // A shard moves onto the new node, or to another drive of its node (bounded loads).
                if map.drives[b].node != NODES {
                    assert_eq!(map.drives[b].node, before.drives[a].node);
                    within_node += 1;
                }
            }
        }
        assert_eq!(new.from.is_some(), old.set != new.set, "a group that moves keeps its old set until done");
    }
    let fraction = moved as f64 / total_shards as f64;
    println!(
        "moved {:.5} of shards ({} within their node), optimal {:.5}: {:.4}x",
        fraction,
        within_node,
        optimal,
        fraction / optimal
    );
    assert!((fraction / optimal - 1.0).abs() < 0.05, "moved {fraction:.5} where {optimal:.5} is optimal");
}
