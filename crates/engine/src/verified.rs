//! Segments kept verified: a large read pins its blocks in the kernel's page cache and checks them
//! (`BlockIo::map_verified_segment`); this keeps such pins after the read, bounded in bytes, so that a read
//! of the same blocks while they stay here needs neither the pin nor the checksum pass: the bytes cannot
//! have changed since they were checked. Pinned pages are not evicted (so not read again from the
//! device), and no writer touches a block while it is live: a block is written only after the allocator
//! has it back, and the engine forgets every entry over a block before it gives the block back
//! (`forget`, from the commit pipeline's release of deferred frees). ZFS's ARC serves verified data from
//! memory the same way; here the memory stays the kernel's page cache.
//!
//! Entries are keyed by their first physical block and never overlap (an insert drops what it overlaps).
//! Least recently used entries go first when the bytes pass the bound; an entry a read still holds stays
//! pinned through that read's own reference.

use crate::device::CachedMapping;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) struct VerifiedPins {
    max_bytes: u64,
    max_entries: usize,
    block_bytes: u64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// First physical block -> the entry.
    entries: BTreeMap<u64, Entry>,
    /// Last use -> first physical block (the eviction order).
    by_use: BTreeMap<u64, u64>,
    bytes: u64,
    clock: u64,
}

struct Entry {
    blocks: u64,
    pin: Arc<CachedMapping>,
    used: u64,
}

impl VerifiedPins {
    /// At most `max_bytes` in at most `max_entries` kept (0 keeps nothing), for blocks of `block_bytes`.
    pub(crate) fn new(max_bytes: u64, max_entries: usize, block_bytes: u64) -> Self {
        assert!(block_bytes > 0);
        let max_bytes = if max_entries == 0 { 0 } else { max_bytes };
        VerifiedPins { max_bytes, max_entries, block_bytes, inner: Mutex::new(Inner::default()) }
    }

    /// The pin of exactly these blocks, when one is kept; counts as a use.
    pub(crate) fn get(&self, first_physical: u64, blocks: u64) -> Option<Arc<CachedMapping>> {
        if self.max_bytes == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let e = inner.entries.get_mut(&first_physical).filter(|e| e.blocks == blocks)?;
        inner.clock += 1;
        inner.by_use.remove(&e.used);
        e.used = inner.clock;
        inner.by_use.insert(e.used, first_physical);
        Some(e.pin.clone())
    }

    /// Keeps `pin` (verified blocks from `first_physical`), dropping entries it overlaps and the least
    /// recently used ones past the bound. A pin larger than the bound is not kept.
    pub(crate) fn insert(&self, first_physical: u64, blocks: u64, pin: Arc<CachedMapping>) {
        let bytes = blocks * self.block_bytes;
        debug_assert_eq!(pin.as_slice().len() as u64, bytes);
        if bytes > self.max_bytes {
            return;
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.forget(first_physical, blocks, self.block_bytes);
        while inner.bytes + bytes > self.max_bytes || inner.entries.len() >= self.max_entries {
            let Some((_, oldest)) = inner.by_use.pop_first() else { break };
            let e = inner.entries.remove(&oldest).expect("every use names an entry");
            inner.bytes -= e.blocks * self.block_bytes;
        }
        inner.clock += 1;
        inner.by_use.insert(inner.clock, first_physical);
        inner.entries.insert(first_physical, Entry { blocks, pin, used: inner.clock });
        inner.bytes += bytes;
        inner.check(self.block_bytes, self.max_bytes);
    }

    /// Forgets every entry over a block of `[first_physical, first_physical + blocks)`: they are being
    /// given back to the allocator (or their cached copy is suspect).
    pub(crate) fn forget(&self, first_physical: u64, blocks: u64) {
        if self.max_bytes == 0 {
            return;
        }
        let mut g = self.inner.lock();
        g.forget(first_physical, blocks, self.block_bytes);
        g.check(self.block_bytes, self.max_bytes);
    }

    /// Forgets everything (the drive failed).
    pub(crate) fn clear(&self) {
        *self.inner.lock() = Inner::default();
    }

    /// Bytes kept now.
    pub(crate) fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }
}

impl Inner {
    /// Removes the entries overlapping the range.
    fn forget(&mut self, first: u64, blocks: u64, block_bytes: u64) {
        let end = first.saturating_add(blocks);
        let mut gone = Vec::new();
        // Entries do not overlap, so those that reach into the range start before its end and, walked
        // backwards, stop at the first that ends at or before its start.
        for (&start, e) in self.entries.range(..end).rev() {
            if start + e.blocks <= first {
                break;
            }
            gone.push(start);
        }
        for start in gone {
            let e = self.entries.remove(&start).expect("just seen");
            self.by_use.remove(&e.used);
            self.bytes -= e.blocks * block_bytes;
        }
    }

    fn check(&self, block_bytes: u64, max_bytes: u64) {
        debug_assert_eq!(self.entries.len(), self.by_use.len());
        debug_assert_eq!(self.entries.values().map(|e| e.blocks * block_bytes).sum::<u64>(), self.bytes);
        debug_assert!(self.bytes <= max_bytes);
        debug_assert!(
            self.entries.iter().zip(self.entries.keys().skip(1)).all(|((s, e), next)| s + e.blocks <= *next),
            "entries do not overlap"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapped::FileMap;
    use proptest::prelude::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    const BLOCK: u64 = 4096;
    const FILE_BLOCKS: u64 = 40;

    fn file() -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..FILE_BLOCKS * BLOCK).map(|i| (i / BLOCK) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        (dir, std::fs::File::open(&path).unwrap())
    }

    #[derive(Clone, Debug)]
    enum Step {
        Insert(u64, u64),
        Forget(u64, u64),
        Get(u64, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        let range = (0..FILE_BLOCKS - 8, 1..8u64);
        prop_oneof![
            range.clone().prop_map(|(s, n)| Step::Insert(s, n)),
            range.clone().prop_map(|(s, n)| Step::Forget(s, n)),
            range.prop_map(|(s, n)| Step::Get(s, n)),
        ]
    }

    /// The model: entries (start, blocks) from least to most recently used.
    fn model_insert(m: &mut Vec<(u64, u64)>, s: u64, n: u64, max_blocks: u64, max_entries: usize) {
        if n > max_blocks {
            return;
        }
        m.retain(|&(a, b)| a + b <= s || a >= s + n);
        while m.iter().map(|e| e.1).sum::<u64>() + n > max_blocks || m.len() >= max_entries {
            m.remove(0);
        }
        m.push((s, n));
    }

    proptest! {
        /// Against a model: what is kept, what a get finds (the right bytes), the bytes counted, and both
        /// bounds, whatever the order of inserts, forgets and gets.
        #[test]
        fn kept_segments_follow_the_model(steps in proptest::collection::vec(step(), 1..60)) {
            let (_dir, f) = file();
            let map = FileMap::new(f.as_raw_fd());
            let (max_blocks, max_entries) = (16u64, 4usize);
            let pins = VerifiedPins::new(max_blocks * BLOCK, max_entries, BLOCK);
            let mut model: Vec<(u64, u64)> = Vec::new();
            for st in steps {
                match st {
                    Step::Insert(s, n) => {
                        let pin = map.pin(s * BLOCK, (n * BLOCK) as usize).expect("a range of the file pins");
                        pins.insert(s, n, Arc::new(pin));
                        model_insert(&mut model, s, n, max_blocks, max_entries);
                    }
                    Step::Forget(s, n) => {
                        pins.forget(s, n);
                        model.retain(|&(a, b)| a + b <= s || a >= s + n);
                    }
                    Step::Get(s, n) => {
                        let got = pins.get(s, n);
                        let at = model.iter().position(|&e| e == (s, n));
                        prop_assert_eq!(got.is_some(), at.is_some());
                        if let (Some(pin), Some(i)) = (got, at) {
                            prop_assert_eq!(pin.as_slice()[0] as u64, s);
                            prop_assert_eq!(pin.as_slice()[(n * BLOCK - 1) as usize] as u64, s + n - 1);
                            let e = model.remove(i);
                            model.push(e);
                        }
                    }
                }
                prop_assert_eq!(pins.bytes(), model.iter().map(|e| e.1).sum::<u64>() * BLOCK);
                prop_assert!(pins.bytes() <= max_blocks * BLOCK);
                prop_assert!(pins.inner.lock().entries.len() <= max_entries);
            }
        }
    }

    /// Keeping nothing is allowed: a cache of 0 bytes or 0 entries finds nothing and counts nothing.
    #[test]
    fn an_empty_bound_keeps_nothing() {
        let (_dir, f) = file();
        let map = FileMap::new(f.as_raw_fd());
        for pins in [VerifiedPins::new(0, 10, BLOCK), VerifiedPins::new(1 << 20, 0, BLOCK)] {
            pins.insert(0, 2, Arc::new(map.pin(0, 2 * BLOCK as usize).unwrap()));
            assert!(pins.get(0, 2).is_none());
            assert_eq!(pins.bytes(), 0);
        }
        // One entry larger than the bound is not kept; one at the bound is.
        let pins = VerifiedPins::new(4 * BLOCK, 10, BLOCK);
        pins.insert(0, 5, Arc::new(map.pin(0, 5 * BLOCK as usize).unwrap()));
        assert_eq!(pins.bytes(), 0);
        pins.insert(0, 4, Arc::new(map.pin(0, 4 * BLOCK as usize).unwrap()));
        assert_eq!(pins.bytes(), 4 * BLOCK);
        pins.clear();
        assert_eq!(pins.bytes(), 0);
    }
}
