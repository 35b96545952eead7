//! The metadata cache of paper 001: name-index entries, onodes and attributes, bounded in bytes, evicted by
//! S3-FIFO (an entry seen once goes before one read again). It holds the newest committed value of each cached key, tagged with the commit epoch from
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
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 16;
/// Bytes counted per entry beyond its key and value (the map's own bookkeeping, roughly).
const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Entries a shard's map is sized for at first (it grows as needed, within its bytes).
const SHARD_INITIAL_ENTRIES: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Table {
    Names = 0,
    Onodes = 1,
    /// Object attributes: a GET reads the layout and the metadata record of the object it found.
    Attrs = 2,
}

fn table(cf: &str) -> Option<Table> {
    match cf {
        CF_NAMES => Some(Table::Names),
        CF_ONODES => Some(Table::Onodes),
        CF_ATTRS => Some(Table::Attrs),
        _ => None,
    }
}

/// A cached value, shared with its readers: a hit costs a reference count, not a copy.
pub(crate) type Value = Arc<[u8]>;

/// A cached key: its table and its raw key.
#[derive(PartialEq, Eq, Hash)]
struct Key {
    table: Table,
    bytes: Box<[u8]>,
}

/// A lookup's key, borrowed from the caller (no allocation). Hashes as `Key` does: the same fields in the
/// same order, `&[u8]` and `Box<[u8]>` both hashing as `[u8]`.
#[derive(Hash)]
struct KeyRef<'a> {
    table: Table,
    bytes: &'a [u8],
}

impl quick_cache::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, k: &Key) -> bool {
        self.table == k.table && self.bytes == &*k.bytes
    }
}

#[derive(Clone)]
struct Entry {
    /// None: the key is known to be absent.
    value: Option<Value>,
    /// The first commit epoch at which `value` is the key's state.
    from_epoch: u64,
}

fn entry_bytes(key: &[u8], value: Option<&[u8]>) -> usize {
    key.len() + value.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD_BYTES
}

/// An entry weighs its bytes (never 0, so that every entry can be evicted).
#[derive(Clone)]
struct Bytes;

impl quick_cache::Weighter<Key, Entry> for Bytes {
    fn weight(&self, key: &Key, entry: &Entry) -> u64 {
        entry_bytes(&key.bytes, entry.value.as_deref()) as u64
    }
}

/// One shard: a map bounded in bytes that evicts by S3-FIFO (a hit only marks its entry; no list moves,
/// which made the former LRU list the largest item of a small GET's metadata work).
type Shard = quick_cache::unsync::Cache<Key, Entry, Bytes>;

pub(crate) struct MetaCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity_bytes: usize,
    /// The epoch of the last group whose changes were installed (it may not be published yet).
    installed_epoch: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

impl MetaCache {
    /// `capacity_bytes` 0 turns the cache off.
    pub(crate) fn new(capacity_bytes: usize, published_epoch: u64) -> Self {
        let shard_capacity_bytes = capacity_bytes / SHARDS;
        let initial = SHARD_INITIAL_ENTRIES.min(shard_capacity_bytes / ENTRY_OVERHEAD_BYTES + 1);
        MetaCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::with_weighter(initial, shard_capacity_bytes.max(1) as u64, Bytes)))
                .collect(),
            shard_capacity_bytes,
            installed_epoch: AtomicU64::new(published_epoch),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shard_capacity_bytes > 0
    }

    fn shard(&self, key: &KeyRef<'_>) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        // A fixed, fast hash: the shard only spreads the keys (SipHash here was about 1% of a small GET).
        let h = foldhash::fast::FixedState::with_seed(0).hash_one(key);
        &self.shards[h as usize % SHARDS]
    }

    /// The entry of `key` in `cf` as a reader at `epoch` may see it: Some(value or absent), or None (not
    /// cached, newer than the reader, or a column family the cache does not hold).
    pub(crate) fn get(&self, cf: &str, key: &[u8], epoch: u64) -> Option<Option<Value>> {
        let table = table(cf)?;
        if !self.enabled() {
            return None;
        }
        let k = KeyRef { table, bytes: key };
        let found = match self.shard(&k).lock().get(&k) {
            Some(e) if e.from_epoch <= epoch => Some(e.value.clone()),
            _ => None,
        };
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
    pub(crate) fn fill(&self, cf: &str, key: &[u8], value: Option<&[u8]>, epoch: u64) {
        let Some(table) = table(cf) else { return };
        if !self.enabled() {
            return;
        }
        let k = KeyRef { table, bytes: key };
        let mut s = self.shard(&k).lock();
        if self.installed_epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        self.insert(&mut s, &k, value, epoch);
    }

    /// The committer, before writing group `epoch`'s batch: from now on entries may be from this group.
    pub(crate) fn begin_install(&self, epoch: u64) {
        let prev = self.installed_epoch.swap(epoch, Ordering::SeqCst);
        // Equal after a failed batch write, whose epoch the next group takes (the cache was cleared).
        assert!(prev <= epoch, "groups are installed in epoch order ({prev} then {epoch})");
    }

    /// The committer: the group being installed sets `key` in `cf` to `value` (None: deleted).
    pub(crate) fn install(&self, cf: &str, key: &[u8], value: Option<&[u8]>) {
        let Some(table) = table(cf) else { return };
        if !self.enabled() {
            return;
        }
        let epoch = self.installed_epoch.load(Ordering::SeqCst);
        let k = KeyRef { table, bytes: key };
        let mut s = self.shard(&k).lock();
        self.insert(&mut s, &k, value, epoch);
    }

    /// The committer: the group being installed destroys the object `key` belongs to. Its entry is dropped
    /// rather than kept as a deletion; a reader that misses reads its snapshot, and only a reader of the
    /// newest state fills it back (as for any key).
    pub(crate) fn forget(&self, cf: &str, key: &[u8]) {
        let Some(table) = table(cf) else { return };
        if !self.enabled() {
            return;
        }
        let k = KeyRef { table, bytes: key };
        let mut s = self.shard(&k).lock();
        s.remove(&k);
        debug_assert!(s.peek(&k).is_none(), "a forgotten entry is gone");
    }

    fn insert(&self, s: &mut Shard, k: &KeyRef<'_>, value: Option<&[u8]>, epoch: u64) {
        if entry_bytes(k.bytes, value) > self.shard_capacity_bytes {
            // Never cached: drop any older entry so that it cannot be served.
            s.remove(k);
            return;
        }
        let key = Key { table: k.table, bytes: k.bytes.into() };
        s.insert(key, Entry { value: value.map(Value::from), from_epoch: epoch });
        // Safety of the cache rests on this: after an install no older value of the key is left to serve
        // (the map replaces an entry in place, and drops it when the new one is too heavy to keep).
        // A release assert: a broken invariant here serves stale metadata, which could lose data.
        assert!(s.peek(k).is_none_or(|e| e.from_epoch == epoch), "a cache install left an older entry");
        debug_assert!(s.weight() <= self.shard_capacity_bytes as u64);
    }

    /// After a failed batch write: nothing installed for it may be served.
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().weight() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(v: &[u8]) -> Option<Option<Value>> {
        Some(Some(Value::from(v)))
    }

    #[test]
    fn entries_are_seen_only_by_readers_at_or_after_their_epoch() {
        let c = MetaCache::new(1 << 20, 1);
        c.begin_install(2);
        c.install(CF_ONODES, b"k", Some(&b"v2"[..]));
        assert_eq!(c.get(CF_ONODES, b"k", 1), None, "a reader of epoch 1 reads its snapshot");
        assert_eq!(c.get(CF_ONODES, b"k", 2), hit(b"v2"));
        c.begin_install(3);
        c.install(CF_ONODES, b"k", None);
        assert_eq!(c.get(CF_ONODES, b"k", 3), Some(None), "a removal is cached as absent");
        c.install(crate::keys::CF_FRAGS, b"k", Some(&b"f"[..]));
        assert_eq!(c.get(crate::keys::CF_FRAGS, b"k", 3), None, "other column families are not cached");
        c.install(CF_ATTRS, b"k", Some(&b"a"[..]));
        assert_eq!(c.get(CF_ATTRS, b"k", 3), hit(b"a"), "attributes are, apart from onodes");
        assert_eq!(c.get(CF_ONODES, b"k", 3), Some(None));
    }

    #[test]
    fn a_forgotten_entry_is_read_from_the_snapshot_and_filled_only_from_the_newest() {
        let c = MetaCache::new(1 << 20, 1);
        c.begin_install(2);
        c.install(CF_ATTRS, b"nid-attr", Some(&b"a"[..]));
        let before = c.bytes();
        c.begin_install(3);
        c.forget(CF_ATTRS, b"nid-attr");
        assert!(c.bytes() < before, "the entry's bytes are freed");
        assert_eq!(c.get(CF_ATTRS, b"nid-attr", 2), None, "a reader of epoch 2 reads its snapshot");
        assert_eq!(c.get(CF_ATTRS, b"nid-attr", 3), None, "nothing kept as a deletion");
        c.fill(CF_ATTRS, b"nid-attr", Some(&b"a"[..]), 2);
        assert_eq!(c.get(CF_ATTRS, b"nid-attr", 3), None, "a reader from before the group fills nothing");
        c.fill(CF_ATTRS, b"nid-attr", None, 3);
        assert_eq!(c.get(CF_ATTRS, b"nid-attr", 3), Some(None), "the newest state fills it back");
        c.forget(crate::keys::CF_FRAGS, b"k");
        c.forget(CF_ONODES, b"never-cached");
        assert_eq!(c.get(CF_ONODES, b"never-cached", 3), None);
    }

    #[test]
    fn a_fill_is_refused_once_a_group_was_installed_after_the_readers_start() {
        let c = MetaCache::new(1 << 20, 5);
        let fill_epoch = c.fill_epoch(c.installed_epoch(), 5).unwrap();
        c.begin_install(6);
        c.fill(CF_NAMES, b"n", Some(&b"old"[..]), fill_epoch);
        assert_eq!(c.get(CF_NAMES, b"n", 6), None, "a value from before group 6 is not cached");
        // A reader that started while a group was installed but not published may not fill at all.
        assert_eq!(c.fill_epoch(6, 5), None);
        c.fill(CF_NAMES, b"n", Some(&b"new"[..]), 6);
        assert_eq!(c.get(CF_NAMES, b"n", 6), hit(b"new"));
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_evicts_what_was_not_used() {
        let capacity = SHARDS * 4 * (ENTRY_OVERHEAD_BYTES + 16);
        let c = MetaCache::new(capacity, 1);
        c.begin_install(2);
        let read_all_along = 1_000_000u32.to_be_bytes();
        c.install(CF_ONODES, &read_all_along, Some(&[1u8; 12][..]));
        for i in 0..10_000u32 {
            c.install(CF_ONODES, &i.to_be_bytes(), Some(&[7u8; 12][..]));
            assert!(c.bytes() <= capacity);
            assert!(c.get(CF_ONODES, &read_all_along, 2).is_some(), "an entry read all along is kept");
        }
        assert!(c.get(CF_ONODES, &9_999u32.to_be_bytes(), 2).is_some(), "the newest entry is kept");
        let kept = (0..10_000u32).filter(|i| c.get(CF_ONODES, &i.to_be_bytes(), 2).is_some()).count();
        assert!(kept < capacity / (ENTRY_OVERHEAD_BYTES + 16), "entries seen once were evicted: {kept} kept");
        // An entry larger than a shard is never cached, and replaces nothing stale.
        c.install(CF_ONODES, &9_999u32.to_be_bytes(), Some(&vec![0u8; capacity][..]));
        assert_eq!(c.get(CF_ONODES, &9_999u32.to_be_bytes(), 2), None);
        let off = MetaCache::new(0, 1);
        off.begin_install(2);
        off.install(CF_ONODES, b"k", Some(&[1u8][..]));
        assert_eq!(off.get(CF_ONODES, b"k", 2), None);
    }
}
