//! Whole-drive verification: `check` (space accounting: no leaked and no doubly used block) and `scrub`
//! (every block and fragment re-read and verified against its checksum).

use crate::alloc::Allocator;
use crate::blockio::BlockIo;
use crate::error::Result;
use crate::keys::*;
use crate::reader::Reader;
use crate::superblock::{BLOCK_SIZE_BYTES, Superblock};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many problems of each kind are listed in a report (the counts are exact).
const MAX_LISTED: usize = 100;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub objects: u64,
    pub referenced_blocks: u64,
    pub used_blocks: u64,
    /// Marked used but referenced by no object.
    pub leaked_blocks: u64,
    /// Referenced more often than the refs table allows, or referenced while free.
    pub doubly_used_blocks: u64,
    /// Referenced but not marked used in the persisted allocation map.
    pub unmarked_blocks: u64,
    /// Block-map runs of one object that map the same logical block.
    pub overlapping_runs: u64,
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.leaked_blocks == 0
            && self.doubly_used_blocks == 0
            && self.unmarked_blocks == 0
            && self.overlapping_runs == 0
            && self.problems.is_empty()
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScrubReport {
    pub blocks_checked: u64,
    pub fragments_checked: u64,
    /// Damaged objects as (collection name, object name, what is wrong), sorted.
    pub damaged: Vec<(String, Vec<u8>, String)>,
}

/// Checks that the block map, the refs table, the persisted allocation map and the allocator agree.
pub(crate) fn check(reader: &Reader, alloc: &Mutex<Allocator>, sb: &Superblock) -> Result<CheckReport> {
    let snap = reader.snapshot_iter_access();
    let mut report = CheckReport::default();
    let mut refcount: BTreeMap<u64, u64> = BTreeMap::new();
    // The end of the previous run, to find runs of one object that overlap.
    let mut prev_end: Option<(Nid, u64)> = None;
    for item in snap.iter(CF_BLOCKS)? {
        let (k, v) = item?;
        let (nid, start) = (u64_at(&k, 0)?, u64_at(&k, 8)?);
        let run = BlockRun::decode(&v)?;
        if let Some((n, end)) = prev_end
            && n == nid
            && start < end
        {
            report.overlapping_runs += 1;
            push(&mut report.problems, format!("nid {nid}: the run at block {start} overlaps the one before"));
        }
        prev_end = Some((nid, start + run.len_blocks()));
        for p in run.physical_start..run.physical_start + run.len_blocks() {
            *refcount.entry(p).or_default() += 1;
        }
    }
    for item in snap.iter(CF_ONODES)? {
        item?;
        report.objects += 1;
    }
    let mut refs_table: BTreeMap<u64, u64> = BTreeMap::new();
    for item in snap.iter(CF_REFS)? {
        let (k, v) = item?;
        refs_table.insert(u64_at(&k, 0)?, u64_at(&v, 0)?);
    }
    let mut bitmap: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for item in snap.iter(CF_ALLOC)? {
        let (k, v) = item?;
        bitmap.insert(u64_at(&k, 0)?, v.to_vec());
    }
    let marked = |b: u64| -> bool {
        let g = b / crate::alloc::BITMAP_GROUP_BLOCKS;
        let i = (b % crate::alloc::BITMAP_GROUP_BLOCKS) as usize;
        bitmap.get(&g).and_then(|raw| raw.get(i / 8)).is_some_and(|byte| byte & (1 << (i % 8)) != 0)
    };
    let alloc = alloc.lock();
    for (&b, &n) in &refcount {
        report.referenced_blocks += 1;
        let allowed = refs_table.get(&b).copied().unwrap_or(1);
        if n != allowed {
            report.doubly_used_blocks += 1;
            push(&mut report.problems, format!("block {b}: {n} references, refs table says {allowed}"));
        }
        if alloc.is_free(b) {
            report.doubly_used_blocks += 1;
            push(&mut report.problems, format!("block {b} is referenced and free"));
        }
        if !marked(b) {
            report.unmarked_blocks += 1;
            push(&mut report.problems, format!("block {b} is referenced but not marked used"));
        }
    }
    for (&b, _) in refs_table.iter().filter(|(b, _)| !refcount.contains_key(b)) {
        push(&mut report.problems, format!("refs table names unreferenced block {b}"));
    }
    let total = sb.device_size_bytes / BLOCK_SIZE_BYTES;
    for b in sb.data_start_block..total {
        if marked(b) {
            report.used_blocks += 1;
            if !refcount.contains_key(&b) {
                report.leaked_blocks += 1;
                push(&mut report.problems, format!("block {b} is marked used but unreferenced"));
            }
        }
    }
    Ok(report)
}

/// Re-reads every block and fragment of `reader`'s snapshot and verifies its checksum. `max_bytes_per_s`
/// bounds the device read rate (None: as fast as possible).
pub(crate) fn scrub(reader: &Reader, io: &BlockIo, max_bytes_per_s: Option<u64>) -> Result<ScrubReport> {
    let snap = reader.snapshot_iter_access();
    let mut report = ScrubReport::default();
    let mut damaged: BTreeSet<(Nid, String)> = BTreeSet::new();
    let started = std::time::Instant::now();
    let mut bytes_read = 0u64;
    for item in snap.iter(CF_BLOCKS)? {
        let (k, v) = item?;
        let nid = u64_at(&k, 0)?;
        let start = u64_at(&k, 8)?;
        let run = BlockRun::decode(&v)?;
        report.blocks_checked += run.len_blocks();
        for unit in run.units(0, run.len_blocks()) {
            if let Some(what) = io.verify_unit(start, &run, unit) {
                damaged.insert((nid, what));
            }
        }
        bytes_read += run.len_blocks() * BLOCK_SIZE_BYTES;
        if let Some(rate) = max_bytes_per_s.filter(|r| *r > 0) {
            let due = std::time::Duration::from_secs_f64(bytes_read as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    for item in snap.iter(CF_FRAGS)? {
        let (k, v) = item?;
        report.fragments_checked += 1;
        if decode_frag(&v).is_err() {
            damaged.insert((u64_at(&k, 0)?, format!("fragment checksum mismatch in block {}", u64_at(&k, 8)?)));
        }
    }
    let colls: BTreeMap<CollectionId, String> =
        reader.collections("", MAX_COLLECTIONS)?.into_iter().map(|(n, id)| (id, n)).collect();
    let mut seen = BTreeSet::new();
    for (nid, what) in damaged {
        if !seen.insert(nid) {
            continue;
        }
        let (coll, name) = match reader.stat(nid) {
            Ok(info) => (colls.get(&info.collection).cloned().unwrap_or_default(), info.name),
            Err(_) => (String::new(), format!("nid {nid}").into_bytes()),
        };
        report.damaged.push((coll, name, what));
    }
    report.damaged.sort();
    Ok(report)
}

fn push(problems: &mut Vec<String>, p: String) {
    if problems.len() < MAX_LISTED {
        problems.push(p);
    }
}
