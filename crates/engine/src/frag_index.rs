//! Lazy sync's index of outstanding fragments: how many and how many bytes each block holds, kept in
//! memory (rebuilt from the fragment log at open) and changed by each committed group's deltas.

use crate::keys::Nid;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy)]
pub(crate) enum FragDelta {
    Add(Nid, u64, u64),
    ClearBlock(Nid, u64),
    ClearObject(Nid),
    /// Every block from this logical block on.
    ClearFrom(Nid, u64),
}

/// Per-block fragment accounting for lazy sync.
#[derive(Default)]
pub(crate) struct FragIndex {
    pub(crate) blocks: BTreeMap<(Nid, u64), (u32, u64)>,
    pub(crate) total_count: u64,
    pub(crate) total_bytes: u64,
}

impl FragIndex {
    /// Fragments of one block (committed groups only).
    pub(crate) fn count(&self, nid: Nid, lb: u64) -> u32 {
        self.blocks.get(&(nid, lb)).map_or(0, |e| e.0)
    }

    pub(crate) fn apply(&mut self, d: &FragDelta) {
        match *d {
            FragDelta::Add(nid, lb, bytes) => {
                let e = self.blocks.entry((nid, lb)).or_default();
                e.0 += 1;
                e.1 += bytes;
                self.total_count += 1;
                self.total_bytes += bytes;
            }
            FragDelta::ClearBlock(nid, lb) => {
                if let Some((c, b)) = self.blocks.remove(&(nid, lb)) {
                    self.total_count -= c as u64;
                    self.total_bytes -= b;
                }
            }
            FragDelta::ClearObject(nid) | FragDelta::ClearFrom(nid, _) => {
                let first = if let FragDelta::ClearFrom(_, lb) = *d { lb } else { 0 };
                let keys: Vec<_> = self.blocks.range((nid, first)..=(nid, u64::MAX)).map(|(k, _)| *k).collect();
                for k in keys {
                    let (c, b) = self.blocks.remove(&k).expect("present");
                    self.total_count -= c as u64;
                    self.total_bytes -= b;
                }
            }
        }
    }
}
