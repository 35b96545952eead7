//! Block allocator. Free space is kept twice: as a map of free extents in memory (for allocation) and as a
//! bitmap persisted in the `alloc` column family in the same batch as the block map (for recovery). An
//! allocation changes only memory until its transaction commits; a crash before that leaves the blocks free.
//! A freed block returns to the in-memory map only after the freeing batch is durable and no reader that
//! could still see the old block map is active (see `Engine`), so committed data is never overwritten.
//!
//! Placement (papers 000 and 003): large sequential writes take contiguous runs of at least
//! [`LARGE_RUN_BLOCKS`]; small writes go to a hot region (low addresses) or a cold region (high addresses)
//! by the object's write count, so that rewritten data does not fragment the space of immutable data.

use std::collections::{BTreeMap, BTreeSet};

/// Blocks covered by one persisted bitmap value: 2048 blocks (8 MiB of data) in 256 bytes, so that a
/// small transaction rewrites 256 bytes of allocation state rather than kilobytes.
pub const BITMAP_GROUP_BLOCKS: u64 = 2048;
/// 4 MiB of 4 KiB blocks: the natural transfer size of paper 000.
pub const LARGE_RUN_BLOCKS: u64 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A large sequential write: contiguous runs.
    Large,
    /// Small data that is rewritten often.
    Hot,
    /// Small data written once.
    Cold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
}

pub struct Allocator {
    /// Free extents by start block, coalesced, all below `limit_blocks`.
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    /// Blocks the device holds now: a thin drive file grows toward `total_blocks` in steps (`grow`).
    limit_blocks: u64,
    /// Persisted view: a set bit means the block is referenced by committed metadata.
    bitmap: Vec<u64>,
    dirty_groups: BTreeSet<u64>,
    total_blocks: u64,
    data_start_block: u64,
    large_cursor: u64,
}

impl Allocator {
    /// A fresh allocator where every block from `data_start_block` to `limit_blocks` is free (and the
    /// blocks up to `total_blocks` become free as the device grows).
    pub fn new(total_blocks: u64, data_start_block: u64, limit_blocks: u64) -> Self {
        assert!(data_start_block < limit_blocks && limit_blocks <= total_blocks, "{data_start_block} {limit_blocks}");
        let words = total_blocks.div_ceil(64) as usize;
        let mut a = Allocator {
            free: BTreeMap::new(),
            free_blocks: 0,
            limit_blocks,
            bitmap: vec![0; words],
            dirty_groups: BTreeSet::new(),
            total_blocks,
            data_start_block,
            large_cursor: data_start_block,
        };
        a.insert_free(Extent { start: data_start_block, len: limit_blocks - data_start_block });
        // The superblock area counts as used in the persisted view.
        a.set_bits(0, data_start_block, true);
        a
    }

    /// Rebuilds the allocator from persisted bitmap groups. Blocks marked used beyond `limit_blocks` (none,
    /// unless the device shrank) raise the limit to cover them.
    pub fn from_groups(total_blocks: u64, data_start_block: u64, limit_blocks: u64, groups: &[(u64, Vec<u8>)]) -> Self {
        let words = total_blocks.div_ceil(64) as usize;
        let mut bitmap = vec![0u64; words];
        for (group, raw) in groups {
            let first_word = (group * BITMAP_GROUP_BLOCKS / 64) as usize;
            for (i, chunk) in raw.chunks_exact(8).enumerate() {
                if let Some(w) = bitmap.get_mut(first_word + i) {
                    *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                }
            }
        }
        let last_used = (0..bitmap.len()).rev().find(|w| bitmap[*w] != 0).map_or(0, |w| {
            let word = bitmap[w];
            w as u64 * 64 + 63 - word.leading_zeros() as u64 + 1
        });
        let limit_blocks = limit_blocks.max(last_used).clamp(data_start_block + 1, total_blocks);
        let mut a = Allocator {
            free: BTreeMap::new(),
            free_blocks: 0,
            limit_blocks,
            bitmap,
            dirty_groups: BTreeSet::new(),
            total_blocks,
            data_start_block,
            large_cursor: data_start_block,
        };
        let mut run_start = None;
        for b in data_start_block..limit_blocks {
            let used = a.bit(b);
            match (used, run_start) {
                (false, None) => run_start = Some(b),
                (true, Some(s)) => {
                    a.insert_free(Extent { start: s, len: b - s });
                    run_start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run_start {
            a.insert_free(Extent { start: s, len: limit_blocks - s });
        }
        a
    }

    /// Free blocks the device holds now (not counting the room it may still grow into).
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// Blocks the device holds now.
    pub fn limit_blocks(&self) -> u64 {
        self.limit_blocks
    }

    /// The device now holds `new_limit` blocks: the blocks it gained become free.
    pub fn grow(&mut self, new_limit: u64) {
        assert!(new_limit > self.limit_blocks && new_limit <= self.total_blocks, "grow to {new_limit}");
        let before = self.free_blocks;
        self.insert_free(Extent { start: self.limit_blocks, len: new_limit - self.limit_blocks });
        assert_eq!(self.free_blocks, before + new_limit - self.limit_blocks, "every gained block is free once");
        self.limit_blocks = new_limit;
    }

    pub fn free_extent_count(&self) -> usize {
        self.free.len()
    }

    /// Takes `blocks` blocks out of the free map. Returns None when there is not enough space; nothing is
    /// taken then.
    pub fn allocate(&mut self, blocks: u64, placement: Placement) -> Option<Vec<Extent>> {
        if blocks == 0 {
            return Some(Vec::new());
        }
        if blocks > self.free_blocks {
            return None;
        }
        let mut out = Vec::new();
        let mut needed = blocks;
        while needed > 0 {
            let ext = match placement {
                Placement::Large => self.take_large(needed),
                Placement::Hot => self.take_first_fit(needed),
                Placement::Cold => self.take_last_fit(needed),
            };
            let ext = ext.expect("free_blocks said there was space");
            needed -= ext.len;
            out.push(ext);
        }
        debug_assert_eq!(out.iter().map(|e| e.len).sum::<u64>(), blocks);
        Some(out)
    }

    /// Returns blocks to the free map. Callers guarantee the blocks hold no data that durable metadata or
    /// an active reader references.
    pub fn release(&mut self, ext: Extent) {
        debug_assert!(ext.start >= self.data_start_block && ext.start + ext.len <= self.limit_blocks);
        self.insert_free(ext);
    }

    /// Records in the persisted view that `ext` is referenced (true) or not (false).
    pub fn mark(&mut self, ext: Extent, used: bool) {
        self.set_bits(ext.start, ext.len, used);
    }

    /// Whether `block` is in the free map (available for allocation).
    pub fn is_free(&self, block: u64) -> bool {
        self.free.range(..=block).next_back().is_some_and(|(&s, &l)| block < s + l)
    }

    /// The bitmap groups changed since the last call, encoded for the `alloc` column family.
    pub fn take_dirty_groups(&mut self) -> Vec<(u64, Vec<u8>)> {
        let groups = std::mem::take(&mut self.dirty_groups);
        groups.into_iter().map(|g| (g, self.encode_group(g))).collect()
    }

    /// Every group, for formatting a fresh drive.
    pub fn all_groups(&self) -> Vec<(u64, Vec<u8>)> {
        (0..self.total_blocks.div_ceil(BITMAP_GROUP_BLOCKS)).map(|g| (g, self.encode_group(g))).collect()
    }

    fn encode_group(&self, group: u64) -> Vec<u8> {
        let first = (group * BITMAP_GROUP_BLOCKS / 64) as usize;
        let last = (first + (BITMAP_GROUP_BLOCKS / 64) as usize).min(self.bitmap.len());
        self.bitmap[first..last].iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn bit(&self, block: u64) -> bool {
        self.bitmap[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    fn set_bits(&mut self, start: u64, len: u64, used: bool) {
        for b in start..start + len {
            let w = &mut self.bitmap[(b / 64) as usize];
            if used {
                *w |= 1 << (b % 64);
            } else {
                *w &= !(1 << (b % 64));
            }
        }
        if len > 0 {
            for g in start / BITMAP_GROUP_BLOCKS..=(start + len - 1) / BITMAP_GROUP_BLOCKS {
                self.dirty_groups.insert(g);
            }
        }
    }

    fn insert_free(&mut self, ext: Extent) {
        if ext.len == 0 {
            return;
        }
        let mut start = ext.start;
        let mut len = ext.len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            assert!(ps + pl <= start, "double free of block {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(start..).next() {
            assert!(start + len <= ns, "double free of block {ns}");
            if start + len == ns {
                self.free.remove(&ns);
                len += nl;
            }
        }
        self.free.insert(start, len);
        self.free_blocks += ext.len;
    }

    fn remove_free(&mut self, start: u64, take: u64) -> Extent {
        let len = self.free.remove(&start).expect("extent is free");
        debug_assert!(take <= len);
        if take < len {
            self.free.insert(start + take, len - take);
        }
        self.free_blocks -= take;
        Extent { start, len: take }
    }

    fn remove_free_tail(&mut self, start: u64, take: u64) -> Extent {
        let len = *self.free.get(&start).expect("extent is free");
        debug_assert!(take <= len);
        if take == len {
            return self.remove_free(start, take);
        }
        self.free.insert(start, len - take);
        self.free_blocks -= take;
        Extent { start: start + len - take, len: take }
    }

    fn take_large(&mut self, needed: u64) -> Option<Extent> {
        let want = needed.min(LARGE_RUN_BLOCKS);
        // Next fit from the cursor: runs of a stream land one after another.
        let found = self
            .free
            .range(self.large_cursor..)
            .chain(self.free.range(..self.large_cursor))
            .find(|&(_, &len)| len >= want)
            .map(|(&s, &l)| (s, l));
        let (start, len) = match found {
            Some(f) => f,
            None => return self.take_first_fit(needed),
        };
        let ext = self.remove_free(start, len.min(needed));
        self.large_cursor = ext.start + ext.len;
        Some(ext)
    }

    fn take_first_fit(&mut self, needed: u64) -> Option<Extent> {
        let (&start, &len) = self.free.iter().find(|&(_, &l)| l >= needed).or_else(|| self.free.iter().next())?;
        Some(self.remove_free(start, len.min(needed)))
    }

    fn take_last_fit(&mut self, needed: u64) -> Option<Extent> {
        let (&start, &len) =
            self.free.iter().rev().find(|&(_, &l)| l >= needed).or_else(|| self.free.iter().next_back())?;
        Some(self.remove_free_tail(start, len.min(needed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn large_runs_are_contiguous() {
        let mut a = Allocator::new(100_000, 256, 100_000);
        let e = a.allocate(2048, Placement::Large).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].len, 2048);
    }

    #[test]
    fn hot_and_cold_are_apart() {
        let mut a = Allocator::new(100_000, 256, 100_000);
        let hot = a.allocate(1, Placement::Hot).unwrap()[0];
        let cold = a.allocate(1, Placement::Cold).unwrap()[0];
        assert_eq!(hot.start, 256);
        assert_eq!(cold.start, 99_999);
    }

    #[test]
    fn full_and_release() {
        let mut a = Allocator::new(1000, 10, 1000);
        let all = a.allocate(990, Placement::Cold).unwrap();
        assert!(a.allocate(1, Placement::Hot).is_none());
        for e in all {
            a.release(e);
        }
        assert_eq!(a.free_blocks(), 990);
        assert_eq!(a.free_extent_count(), 1);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut a = Allocator::new(1000, 10, 1000);
        a.release(Extent { start: 20, len: 1 });
    }

    #[test]
    fn bitmap_round_trip() {
        let mut a = Allocator::new(70_000, 256, 70_000);
        let e = a.allocate(5000, Placement::Large).unwrap();
        for x in &e {
            a.mark(*x, true);
        }
        let groups = a.all_groups();
        let b = Allocator::from_groups(70_000, 256, 70_000, &groups);
        assert_eq!(b.free_blocks(), 70_000 - 256 - 5000);
    }

    #[test]
    fn a_thin_device_grows_into_its_capacity() {
        let mut a = Allocator::new(10_000, 16, 1_000);
        assert_eq!((a.free_blocks(), a.limit_blocks()), (984, 1_000));
        assert!(a.allocate(985, Placement::Large).is_none(), "nothing past the limit");
        let cold = a.allocate(1, Placement::Cold).unwrap()[0];
        assert_eq!(cold.start, 999, "cold data at the top of what the device holds");
        a.mark(cold, true);
        a.grow(4_000);
        assert_eq!(a.free_blocks(), 983 + 3_000);
        let big = a.allocate(3_500, Placement::Large).unwrap();
        assert!(big.iter().all(|e| e.start + e.len <= 4_000));
        // Reopened from the bitmap with a smaller limit than a used block: the limit covers it.
        let b = Allocator::from_groups(10_000, 16, 500, &a.all_groups());
        assert_eq!(b.limit_blocks(), 1_000);
        assert!(!b.is_free(999));
    }

    #[test]
    #[should_panic(expected = "grow to")]
    fn growing_past_the_capacity_is_a_bug() {
        Allocator::new(1_000, 16, 100).grow(1_001);
    }

    proptest! {
        #[test]
        fn no_block_is_handed_out_twice(ops in proptest::collection::vec((1u64..300, 0u8..3, any::<bool>()), 1..200)) {
            let mut a = Allocator::new(20_000, 16, 20_000);
            let mut held: Vec<Extent> = Vec::new();
            for (n, p, rel) in ops {
                if rel && !held.is_empty() {
                    let e = held.swap_remove(0);
                    a.release(e);
                } else {
                    let placement = [Placement::Large, Placement::Hot, Placement::Cold][p as usize];
                    if let Some(es) = a.allocate(n, placement) { held.extend(es); }
                }
                let mut seen = std::collections::BTreeSet::new();
                for e in &held {
                    prop_assert!(e.start >= 16 && e.start + e.len <= 20_000);
                    for b in e.start..e.start + e.len { prop_assert!(seen.insert(b)); }
                }
                prop_assert_eq!(a.free_blocks() + seen.len() as u64, 20_000 - 16);
            }
        }
    }
}
