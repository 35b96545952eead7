//! The page cache of paper 001 (NVStore): the newest content of recently written blocks, bounded in bytes.
//!
//! - A *dirty* page holds a block's whole current content while fragments of it are still in the KV
//!   store: an unaligned write into a cached page, or into a block that held nothing before (appends),
//!   merges into the page in memory and reads nothing.
//! - A *fragment* page holds only the byte ranges written since the page entered the cache (the base is
//!   not known); once the ranges cover the block it becomes dirty.
//! - A *clean* page holds a block's content as its device block has it (after lazy sync or a
//!   read-modify-write).
//!
//! Reads of blocks whose pages are clean or dirty come from memory (no device read, no fragment merge),
//! and lazy sync writes a dirty page without reading the base block. Data not written recently is read
//! through the kernel's page cache (`EngineConfig::page_cache_reads`), which this cache does not repeat.
//!
//! Consistency follows `meta_cache.rs`: the committer applies its group's page changes, tagged with the
//! group's epoch, before it writes the group's batch, and readers use a page only if their epoch is at
//! least the page's. Evicting any page loses nothing: the KV store and the device hold the same content.

use crate::keys::Nid;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 16;
const PAGE_BYTES: usize = 4096;
/// Bytes counted per page beyond its data (map entry, ranges).
const PAGE_OVERHEAD_BYTES: usize = 96;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageState {
    Clean,
    Dirty,
    Fragment,
}

#[derive(Clone)]
struct Page {
    state: PageState,
    /// Shared with the readers that took it: a reader's bytes are the page's, without a copy, and a write
    /// into a page a reader still holds writes into a copy.
    data: Bytes,
    /// Fragment pages: the byte ranges of `data` that are known, sorted and disjoint.
    known: Vec<(u16, u16)>,
    from_epoch: u64,
    referenced: bool,
}

/// A change the committer makes to the cache for one committed transaction, in op order.
#[derive(Debug)]
pub(crate) enum PageChange {
    /// Bytes written into a block as a fragment; `block_was_empty`: the block held no data before the
    /// write (it lies at or past the object's old end), so its other bytes are zeros.
    Fragment { nid: Nid, lblock: u64, offset: u16, data: Vec<u8>, block_was_empty: bool },
    /// A block's whole content, now also its device block's.
    Clean { nid: Nid, lblock: u64, data: Vec<u8> },
    /// Lazy sync wrote a block's current content to a new device block: a dirty page becomes clean.
    Synced { nid: Nid, lblock: u64 },
    /// Blocks [first, end) changed in ways the cache does not follow (whole-block writes, removal,
    /// truncation, clone_range): their pages go.
    Forget { nid: Nid, first: u64, end: u64 },
}

struct Shard {
    pages: BTreeMap<(Nid, u64), Page>,
    bytes: usize,
    /// The clock hand of eviction (second chance): the key after the last one looked at.
    hand: (Nid, u64),
}

pub(crate) struct PageCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity_bytes: usize,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

fn page_bytes(p: &Page) -> usize {
    PAGE_BYTES + PAGE_OVERHEAD_BYTES + p.known.len() * 4
}

impl PageCache {
    /// `capacity_bytes` 0 turns the cache off.
    pub(crate) fn new(capacity_bytes: usize) -> Self {
        PageCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { pages: BTreeMap::new(), bytes: 0, hand: (0, 0) })).collect(),
            shard_capacity_bytes: capacity_bytes / SHARDS,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn enabled(&self) -> bool {
        self.shard_capacity_bytes >= PAGE_BYTES + PAGE_OVERHEAD_BYTES
    }

    fn shard(&self, nid: Nid) -> &Mutex<Shard> {
        &self.shards[(nid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize % SHARDS]
    }

    /// The whole content of block `lblock` of `nid` as a reader at `epoch` may see it: clean or dirty
    /// pages only.
    pub(crate) fn get(&self, nid: Nid, lblock: u64, epoch: u64) -> Option<(PageState, Bytes)> {
        if !self.enabled() {
            return None;
        }
        let mut s = self.shard(nid).lock();
        let found = match s.pages.get_mut(&(nid, lblock)) {
            Some(p) if p.state != PageState::Fragment && p.from_epoch <= epoch => {
                p.referenced = true;
                Some((p.state, p.data.clone()))
            }
            _ => None,
        };
        drop(s);
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The committer, before writing the batch of group `epoch`: applies its changes in order.
    pub(crate) fn apply(&self, changes: &[PageChange], epoch: u64) {
        if !self.enabled() {
            return;
        }
        for c in changes {
            match c {
                PageChange::Fragment { nid, lblock, offset, data, block_was_empty } => {
                    self.write_fragment(*nid, *lblock, *offset, data, *block_was_empty, epoch)
                }
                PageChange::Clean { nid, lblock, data } => {
                    let page = Page {
                        state: PageState::Clean,
                        data: Bytes::copy_from_slice(data),
                        known: Vec::new(),
                        from_epoch: epoch,
                        referenced: false,
                    };
                    self.insert(*nid, *lblock, page);
                }
                PageChange::Synced { nid, lblock } => {
                    let mut s = self.shard(*nid).lock();
                    if let Some(p) = s.pages.get_mut(&(*nid, *lblock))
                        && p.state == PageState::Dirty
                    {
                        // Same content, now also on the device: readers of any epoch the page serves
                        // still see the right bytes.
                        p.state = PageState::Clean;
                    }
                }
                PageChange::Forget { nid, first, end } => {
                    let mut s = self.shard(*nid).lock();
                    let keys: Vec<(Nid, u64)> = s.pages.range((*nid, *first)..(*nid, *end)).map(|(k, _)| *k).collect();
                    for k in keys {
                        let p = s.pages.remove(&k).expect("listed");
                        s.bytes -= page_bytes(&p);
                    }
                }
            }
        }
    }

    fn write_fragment(&self, nid: Nid, lblock: u64, offset: u16, data: &[u8], block_was_empty: bool, epoch: u64) {
        let (start, end) = (offset as usize, offset as usize + data.len());
        debug_assert!(end <= PAGE_BYTES);
        let mut s = self.shard(nid).lock();
        let Some(page) = s.pages.get_mut(&(nid, lblock)) else {
            drop(s);
            let mut data_page = BytesMut::zeroed(PAGE_BYTES);
            data_page[start..end].copy_from_slice(data);
            let data_page = data_page.freeze();
            let (state, known) = if block_was_empty || (start == 0 && end == PAGE_BYTES) {
                (PageState::Dirty, Vec::new())
            } else {
                (PageState::Fragment, vec![(start as u16, end as u16)])
            };
            self.insert(nid, lblock, Page { state, data: data_page, known, from_epoch: epoch, referenced: false });
            return;
        };
        // The committer is the only writer: in place unless a reader still holds the page's bytes.
        let before = page_bytes(page);
        let mut content = match std::mem::take(&mut page.data).try_into_mut() {
            Ok(unshared) => unshared,
            Err(shared) => BytesMut::from(&shared[..]),
        };
        debug_assert_eq!(content.len(), PAGE_BYTES);
        content[start..end].copy_from_slice(data);
        page.data = content.freeze();
        page.from_epoch = epoch;
        match page.state {
            PageState::Clean | PageState::Dirty => page.state = PageState::Dirty,
            PageState::Fragment => {
                page.known = add_range(&page.known, (start as u16, end as u16));
                if page.known == [(0, PAGE_BYTES as u16)] {
                    page.state = PageState::Dirty;
                    page.known.clear();
                }
            }
        }
        let after = page_bytes(page);
        s.bytes = s.bytes + after - before;
        while s.bytes > self.shard_capacity_bytes {
            evict_one(&mut s);
        }
    }

    fn insert(&self, nid: Nid, lblock: u64, page: Page) {
        let size = page_bytes(&page);
        let mut s = self.shard(nid).lock();
        if let Some(old) = s.pages.insert((nid, lblock), page) {
            s.bytes -= page_bytes(&old);
        }
        s.bytes += size;
        while s.bytes > self.shard_capacity_bytes {
            evict_one(&mut s);
        }
    }

    /// After a failed batch write: nothing applied for it may be served.
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            let mut s = s.lock();
            s.pages.clear();
            s.bytes = 0;
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    pub(crate) fn dirty_pages(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().pages.values().filter(|p| p.state == PageState::Dirty).count() as u64).sum()
    }
}

/// Second chance: from the hand on, a referenced page loses its mark, the first unmarked page goes.
fn evict_one(s: &mut Shard) {
    debug_assert!(!s.pages.is_empty(), "bytes counted means pages present");
    loop {
        let next = s.pages.range(s.hand..).next().map(|(k, _)| *k).or_else(|| s.pages.keys().next().copied());
        let Some(key) = next else { return };
        s.hand = (key.0, key.1.wrapping_add(1));
        let page = s.pages.get_mut(&key).expect("just found");
        if page.referenced {
            page.referenced = false;
            continue;
        }
        let p = s.pages.remove(&key).expect("just found");
        s.bytes -= page_bytes(&p);
        return;
    }
}

/// `ranges` (sorted, disjoint) with `r` added and neighbours merged.
fn add_range(ranges: &[(u16, u16)], r: (u16, u16)) -> Vec<(u16, u16)> {
    let mut all: Vec<(u16, u16)> = ranges.to_vec();
    all.push(r);
    all.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(all.len());
    for (a, b) in all {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(nid: Nid, lblock: u64, offset: u16, data: &[u8], empty: bool) -> PageChange {
        PageChange::Fragment { nid, lblock, offset, data: data.to_vec(), block_was_empty: empty }
    }

    #[test]
    fn pages_follow_fragments_and_are_seen_from_their_epoch_on() {
        let c = PageCache::new(1 << 20);
        // An append into an empty block: a dirty page, zeros around the bytes.
        c.apply(&[frag(1, 0, 10, b"abc", true)], 5);
        assert_eq!(c.get(1, 0, 4), None, "an older reader reads its snapshot");
        let (state, data) = c.get(1, 0, 5).unwrap();
        assert_eq!(state, PageState::Dirty);
        assert_eq!(&data[8..14], b"\0\0abc\0");
        // Into a block with unknown content: a fragment page, not served until its ranges cover it.
        c.apply(&[frag(2, 0, 0, &[7; 2048], false)], 6);
        assert_eq!(c.get(2, 0, 6), None);
        c.apply(&[frag(2, 0, 2048, &[8; 2048], false)], 7);
        let (state, data) = c.get(2, 0, 7).unwrap();
        assert_eq!((state, data[0], data[4095]), (PageState::Dirty, 7, 8));
        c.apply(&[PageChange::Synced { nid: 2, lblock: 0 }], 8);
        assert_eq!(c.get(2, 0, 7).unwrap().0, PageState::Clean, "syncing keeps the content and its epoch");
        c.apply(&[PageChange::Forget { nid: 2, first: 0, end: u64::MAX }], 9);
        assert_eq!(c.get(2, 0, 9), None);
        assert_eq!(c.dirty_pages(), 1);
    }

    /// A reader's bytes are the page's own (no copy), and a later write into the page never changes them:
    /// it writes into a copy while a reader holds the bytes, and in place once none does.
    #[test]
    fn bytes_a_reader_holds_never_change() {
        let c = PageCache::new(1 << 20);
        c.apply(&[frag(1, 0, 0, &[1; PAGE_BYTES], true)], 1);
        let held = c.get(1, 0, 1).unwrap().1;
        let again = c.get(1, 0, 1).unwrap().1;
        assert_eq!(held.as_ptr(), again.as_ptr(), "one page, shared");
        drop(again);
        c.apply(&[frag(1, 0, 100, &[2; 10], false)], 2);
        assert!(held.iter().all(|&b| b == 1), "a held page changed under its reader");
        let (state, now) = c.get(1, 0, 2).unwrap();
        assert_eq!((state, now[99], now[100], now[110]), (PageState::Dirty, 1, 2, 1));
        drop(held);
        let at = now.as_ptr();
        drop(now);
        c.apply(&[frag(1, 0, 0, &[3; 1], false)], 3);
        let last = c.get(1, 0, 3).unwrap().1;
        assert_eq!((last[0], last[100]), (3, 2));
        assert_eq!(last.as_ptr(), at, "an unshared page is written in place");
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let capacity = SHARDS * 3 * (PAGE_BYTES + PAGE_OVERHEAD_BYTES);
        let c = PageCache::new(capacity);
        for lb in 0..1000u64 {
            c.apply(&[PageChange::Clean { nid: lb % 40, lblock: lb, data: vec![lb as u8; PAGE_BYTES] }], 1);
            assert!(c.bytes() <= capacity);
        }
        assert!(c.get(999 % 40, 999, 1).is_some(), "the newest page is kept");
        let off = PageCache::new(0);
        off.apply(&[frag(1, 0, 0, b"x", true)], 1);
        assert_eq!(off.get(1, 0, 1), None);
    }

    #[test]
    fn ranges_merge() {
        assert_eq!(add_range(&[(0, 10), (20, 30)], (10, 20)), [(0, 30)]);
        assert_eq!(add_range(&[(5, 10)], (0, 3)), [(0, 3), (5, 10)]);
        assert_eq!(add_range(&[(0, 10)], (2, 4)), [(0, 10)]);
    }
}
