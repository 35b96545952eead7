//! Reading one object's block map, the same way wherever it is read from: a reader's snapshot or the
//! committer's planning view. Also the one rule for which objects live wholly in the KV store.

use crate::error::Result;
use crate::keys::*;

/// Raw block-map entries from one place: a snapshot or a planning view.
pub(crate) trait RunSource {
    /// The entry with the greatest key in [lower, key], if any.
    fn floor_run(&self, key: &[u8], lower: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// The entries in [from, to); more than `cap` is an error.
    fn scan_runs(&self, from: &[u8], to: &[u8], cap: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
}

/// The block-map runs of `nid` that map any block in [first, end) (end u64::MAX: to the object's end), in
/// order: the run that starts before `first` and reaches into the range (one backward seek bounded by the
/// run limit), then a forward scan bounded by the range (runs never overlap).
pub(crate) fn runs_overlapping(src: &impl RunSource, nid: Nid, first: u64, end: u64) -> Result<Vec<(u64, BlockRun)>> {
    let mut out = Vec::new();
    if first > 0 {
        // A run that starts before `first` starts at most MAX_RUN_BLOCKS-1 blocks earlier.
        let lower = block_key(nid, first.saturating_sub(MAX_RUN_BLOCKS - 1));
        if let Some((k, v)) = src.floor_run(&block_key(nid, first - 1), &lower)? {
            let (start, run) = (u64_at(&k, 8)?, BlockRun::decode(&v)?);
            if start + run.len_blocks() > first {
                out.push((start, run));
            }
        }
    }
    let to = if end == u64::MAX { nid_key(nid + 1).to_vec() } else { block_key(nid, end).to_vec() };
    let cap = end.saturating_sub(first).min(MAX_OBJECT_BLOCKS) as usize;
    for (k, v) in src.scan_runs(&block_key(nid, first), &to, cap)? {
        out.push((u64_at(&k, 8)?, BlockRun::decode(&v)?));
    }
    debug_assert!(out.windows(2).all(|w| w[0].0 + w[0].1.len_blocks() <= w[1].0), "runs overlap");
    Ok(out)
}

/// Whether an object lives wholly in the KV store (its bytes are fragments, it has no block): small enough
/// and never given a block. Such objects are no lazy-sync work.
pub(crate) fn lives_in_kv(size_bytes: u64, has_blocks: bool, inline_max_bytes: u64) -> bool {
    size_bytes <= inline_max_bytes && !has_blocks
}
