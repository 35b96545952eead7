//! The metadata cache of paper 001: name-index entries, onodes and attributes, bounded in bytes, least recently used
//! out first. It holds the newest committed value of each cached key, tagged with the commit epoch from
//! which that value holds; a reader pinned at epoch `r` may use an entry only if its tag is at most `r`
//! (older readers read their snapshot).
//!
//! Why it is consistent:
//! - The committer installs every name and onode its group changes (with the group's epoch) before it
//!   writes the group's batch, so once a batch is in the database no entry of its keys is older than it.
//!   Epochs are published after the write, so no reader can use those entries before the batch is durable.
//! - A reader fills a missing entry only if its snapshot is exactly the newest committed state: the last
//!   installed epoch equalled the published one when the reader started, and nothing was installed since
//!   (checked under the shard's lock, which installs also take).
//! - If a batch write fails, the cache is emptied and the drive goes read-only.

use crate::keys::{CF_ATTRS, CF_NAMES, CF_ONODES};
use lru::LruCache;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 16;
/// Bytes counted per entry beyond its key and value (the map's own bookkeeping, roughly).
const ENTRY_OVERHEAD_BYTES: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Table {
    Names = 0,
    Onodes = 1,
    /// Object attributes: a GET reads the layout and the metadata record of the object it found.
    Attrs = 2,
}

const TABLES: usize = 3;

fn table(cf: &str) -> Option<Table> {
    match cf {
        CF_NAMES => Some(Table::Names),
        CF_ONODES => Some(Table::Onodes),
        CF_ATTRS => Some(Table::Attrs),
        _ => None,
    }
}

struct Entry {
    /// None: the key is known to be absent.
    value: Option<Vec<u8>>,
    /// The first commit epoch at which `value` is the key's state.
    from_epoch: u64,
}

struct Shard {
    /// One map per table, keyed by the raw key, so a lookup borrows the caller's key (no allocation).
    maps: [LruCache<Vec<u8>, Entry>; TABLES],
    bytes: usize,
}

impl Shard {
    fn map(&mut self, t: Table) -> &mut LruCache<Vec<u8>, Entry> {
        &mut self.maps[t as usize]
    }
}

pub(crate) struct MetaCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity_bytes: usize,
    /// The epoch of the last group whose changes were installed (it may not be published yet).
    installed_epoch: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

fn entry_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD_BYTES
}

impl MetaCache {
    /// `capacity_bytes` 0 turns the cache off.
    pub(crate) fn new(capacity_bytes: usize, published_epoch: u64) -> Self {
        MetaCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard { maps: std::array::from_fn(|_| LruCache::unbounded()), bytes: 0 }))
                .collect(),
            shard_capacity_bytes: capacity_bytes / SHARDS,
            installed_epoch: AtomicU64::new(published_epoch),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shard_capacity_bytes > 0
    }

    fn shard(&self, t: Table, key: &[u8]) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        // A fixed, fast hash: the shard only spreads the keys (SipHash here was about 1% of a small GET).
        let h = foldhash::fast::FixedState::with_seed(0).hash_one((t, key));
        &self.shards[h as usize % SHARDS]
    }

    /// The entry of `key` in `cf` as a reader at `epoch` may see it: Some(value or absent), or None (not
    /// cached, newer than the reader, or a column family the cache does not hold).
    pub(crate) fn get(&self, cf: &str, key: &[u8], epoch: u64) -> Option<Option<Vec<u8>>> {
        let t = table(cf)?;
        if !self.enabled() {
            return None;
        }
        let mut s = self.shard(t, key).lock();
        let found = match s.map(t).get(key) {
            Some(e) if e.from_epoch <= epoch => Some(e.value.clone()),
            _ => None,
        };
        drop(s);
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// What a reader records when it starts: `Some(epoch)` if its snapshot will be the newest committed
    /// state (the installed epoch equals the published one), so that it may fill entries.
    pub(crate) fn fill_epoch(&self, installed_before_publish_read: u64, published: u64) -> Option<u64> {
        (installed_before_publish_read == published).then_some(published)
    }

    pub(crate) fn installed_epoch(&self) -> u64 {
        self.installed_epoch.load(Ordering::SeqCst)
    }

    /// A reader's fill: inserts `value` read from a snapshot of exactly `epoch`, unless a group has been
    /// installed since (then the value may be stale).
    pub(crate) fn fill(&self, cf: &str, key: &[u8], value: &Option<Vec<u8>>, epoch: u64) {
        let Some(t) = table(cf) else { return };
        if !self.enabled() {
            return;
        }
        let mut s = self.shard(t, key).lock();
        if self.installed_epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        self.insert(&mut s, t, key, value.clone(), epoch);
    }

    /// The committer, before writing group `epoch`'s batch: from now on entries may be from this group.
    pub(crate) fn begin_install(&self, epoch: u64) {
        let prev = self.installed_epoch.swap(epoch, Ordering::SeqCst);
        // Equal after a failed batch write, whose epoch the next group takes (the cache was cleared).
        assert!(prev <= epoch, "groups are installed in epoch order ({prev} then {epoch})");
    }

    /// The committer: the group being installed sets `key` in `cf` to `value` (None: deleted).
    pub(crate) fn install(&self, cf: &str, key: &[u8], value: Option<Vec<u8>>) {
        let Some(t) = table(cf) else { return };
        if !self.enabled() {
            return;
        }
        let epoch = self.installed_epoch.load(Ordering::SeqCst);
        let mut s = self.shard(t, key).lock();
        self.insert(&mut s, t, key, value, epoch);
    }

    fn insert(&self, s: &mut Shard, t: Table, key: &[u8], value: Option<Vec<u8>>, epoch: u64) {
        let size = entry_bytes(key, &value);
        if size > self.shard_capacity_bytes {
            // Never cached: drop any older entry so that it cannot be served.
            if let Some(old) = s.map(t).pop(key) {
                s.bytes -= entry_bytes(key, &old.value);
            }
            return;
        }
        if let Some(old) = s.map(t).put(key.to_vec(), Entry { value, from_epoch: epoch }) {
            s.bytes -= entry_bytes(key, &old.value);
        }
        s.bytes += size;
        while s.bytes > self.shard_capacity_bytes {
            // The least recently used entry is not tracked across the tables' maps: evict from the largest
            // map, which keeps every map bounded and the shard within its bytes.
            let victim = (0..TABLES).max_by_key(|&t| s.maps[t].len()).expect("at least one table");
            let (k, e) = s.maps[victim].pop_lru().expect("bytes counted means entries present");
            s.bytes -= entry_bytes(&k, &e.value);
        }
        debug_assert!(s.bytes <= self.shard_capacity_bytes);
    }

    /// After a failed batch write: nothing installed for it may be served.
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            let mut s = s.lock();
            for m in &mut s.maps {
                m.clear();
            }
            s.bytes = 0;
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_seen_only_by_readers_at_or_after_their_epoch() {
        let c = MetaCache::new(1 << 20, 1);
        c.begin_install(2);
        c.install(CF_ONODES, b"k", Some(b"v2".to_vec()));
        assert_eq!(c.get(CF_ONODES, b"k", 1), None, "a reader of epoch 1 reads its snapshot");
        assert_eq!(c.get(CF_ONODES, b"k", 2), Some(Some(b"v2".to_vec())));
        c.begin_install(3);
        c.install(CF_ONODES, b"k", None);
        assert_eq!(c.get(CF_ONODES, b"k", 3), Some(None), "a removal is cached as absent");
        c.install(crate::keys::CF_FRAGS, b"k", Some(b"f".to_vec()));
        assert_eq!(c.get(crate::keys::CF_FRAGS, b"k", 3), None, "other column families are not cached");
        c.install(CF_ATTRS, b"k", Some(b"a".to_vec()));
        assert_eq!(c.get(CF_ATTRS, b"k", 3), Some(Some(b"a".to_vec())), "attributes are, apart from onodes");
        assert_eq!(c.get(CF_ONODES, b"k", 3), Some(None));
    }

    #[test]
    fn a_fill_is_refused_once_a_group_was_installed_after_the_readers_start() {
        let c = MetaCache::new(1 << 20, 5);
        let fill_epoch = c.fill_epoch(c.installed_epoch(), 5).unwrap();
        c.begin_install(6);
        c.fill(CF_NAMES, b"n", &Some(b"old".to_vec()), fill_epoch);
        assert_eq!(c.get(CF_NAMES, b"n", 6), None, "a value from before group 6 is not cached");
        // A reader that started while a group was installed but not published may not fill at all.
        assert_eq!(c.fill_epoch(6, 5), None);
        c.fill(CF_NAMES, b"n", &Some(b"new".to_vec()), 6);
        assert_eq!(c.get(CF_NAMES, b"n", 6), Some(Some(b"new".to_vec())));
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_evicts_the_least_recently_used() {
        let capacity = SHARDS * 4 * (ENTRY_OVERHEAD_BYTES + 16);
        let c = MetaCache::new(capacity, 1);
        c.begin_install(2);
        for i in 0..10_000u32 {
            c.install(CF_ONODES, &i.to_be_bytes(), Some(vec![7u8; 12]));
            assert!(c.bytes() <= capacity);
        }
        assert!(c.get(CF_ONODES, &9_999u32.to_be_bytes(), 2).is_some(), "the newest entry is kept");
        assert!(c.get(CF_ONODES, &0u32.to_be_bytes(), 2).is_none(), "the oldest entry was evicted");
        // An entry larger than a shard is never cached, and replaces nothing stale.
        c.install(CF_ONODES, &9_999u32.to_be_bytes(), Some(vec![0u8; capacity]));
        assert_eq!(c.get(CF_ONODES, &9_999u32.to_be_bytes(), 2), None);
        let off = MetaCache::new(0, 1);
        off.begin_install(2);
        off.install(CF_ONODES, b"k", Some(vec![1]));
        assert_eq!(off.get(CF_ONODES, b"k", 2), None);
    }
}
