//! Reads through a consistent snapshot: name lookup, stat, attributes, ordered listing, and data reads
//! that merge fragments over base blocks on the fly and verify every block's checksum.
//!
//! A reader pins the commit epoch it started in: blocks freed by later commits are not reused until it is
//! dropped, so a long GET streams exactly the object it looked up even while the name is overwritten.

use crate::blockio::{Segment, read_segments};
use crate::blockmap::{RunSource, lives_in_kv};
use crate::core::Core;
use crate::error::{EngineError, Result};
use crate::keys::*;
use crate::superblock::BLOCK_SIZE_BYTES;
use rocksdb::{DB, Direction, IteratorMode, SnapshotWithThreadMode};
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

/// A raw (key, value) pair from RocksDB.
type RawEntry = (Box<[u8]>, Box<[u8]>);

/// A listing reserves room for at most this many entries up front (a page asks for about 1,000).
const LIST_PREALLOC_ENTRIES: usize = 1024;

/// Reads of at most this many blocks try the page cache first.
const PAGE_READ_MAX_BLOCKS: u64 = 64;

/// Reads of one segment at least this long are served in place from the kernel's page cache (pinned and
/// mapped, not copied: `BlockIo::map_verified_segment`); below it a copy costs less than the pin.
const MAP_READ_MIN_BYTES: u64 = 256 << 10;

/// Bytes served in place: the pinned mapping, and the reader's epoch, so that the blocks stay as they are
/// until the bytes are dropped (the caller may keep them after the reader is gone, e.g. in a socket's
/// write queue).
struct InPlace {
    map: Arc<crate::device::CachedMapping>,
    _pin: crate::core::EpochPin,
}

impl AsRef<[u8]> for InPlace {
    fn as_ref(&self) -> &[u8] {
        self.map.as_slice()
    }
}

/// A block merged from a snapshot, with what it was merged from.
pub(crate) struct MergeInput {
    pub(crate) content: Vec<u8>,
    pub(crate) base: Option<u64>,
    pub(crate) frag_keys: Vec<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub nid: Nid,
    pub collection: CollectionId,
    pub name: Vec<u8>,
    pub size_bytes: u64,
    pub mtime_ns: u64,
    pub high_priority: bool,
}

/// One entry of the name index, as `Reader::list_entries` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameEntry {
    pub name: Vec<u8>,
    pub nid: Nid,
    /// What `Op::SetNameTag` last stored for this object, if anything.
    pub tag: Option<Vec<u8>>,
}

impl ObjectInfo {
    fn from_onode(nid: Nid, o: Onode) -> Self {
        ObjectInfo {
            nid,
            collection: o.collection,
            name: o.name,
            size_bytes: o.size_bytes,
            mtime_ns: o.mtime_ns,
            high_priority: o.flags & ONODE_FLAG_PRIORITY != 0,
        }
    }
}

/// A consistent view of the drive: a RocksDB snapshot and a pin of the commit epoch it began in. Readers
/// that begin while no later epoch has been published share one (`SharedView`), so most reads take
/// no RocksDB snapshot and no epoch pin of their own; the view is released when its last reader drops.
pub(crate) struct View {
    // Field order matters: the snapshot must be released before the database handle it borrows.
    snap: ManuallyDrop<SnapshotWithThreadMode<'static, DB>>,
    db: Arc<DB>,
    core: Arc<Core>,
    epoch: u64,
    /// Set when this view's snapshot is exactly the newest committed state: its readers may fill the
    /// metadata cache (meta_cache.rs).
    fill_epoch: Option<u64>,
}

// SAFETY: the snapshot is a read-only handle to a RocksDB snapshot, which RocksDB allows to be used from
// any thread; the database it refers to is kept alive by `db`.
unsafe impl Send for View {}
// SAFETY: as above; all methods take &self and RocksDB reads are thread-safe.
unsafe impl Sync for View {}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: dropped exactly once, before `db`.
        unsafe { ManuallyDrop::drop(&mut self.snap) };
        self.core.epochs.unpin(self.epoch);
    }
}

impl View {
    fn new(core: Arc<Core>) -> Self {
        // The installed epoch is read before the published one: see meta_cache.rs.
        let (epoch, installed) = core.epochs.pin(|| core.meta_cache.installed_epoch());
        let fill_epoch = core.meta_cache.fill_epoch(installed, epoch);
        let db = core.db.clone();
        let snap = db.snapshot();
        // SAFETY: the snapshot borrows the DB behind `db`, an Arc that this View holds and drops after
        // the snapshot (see Drop), so the borrow never outlives the database.
        let snap: SnapshotWithThreadMode<'static, DB> = unsafe { std::mem::transmute(snap) };
        View { snap: ManuallyDrop::new(snap), db, core, epoch, fill_epoch }
    }
}

/// The view that clients' readers share while no later epoch is published. It is held until the committer
/// publishes the next epoch (`release`), so that a stream of reads takes one RocksDB snapshot per commit,
/// not one per read, and so that a kept view never holds back the blocks later commits free.
#[derive(Default)]
pub(crate) struct SharedView(parking_lot::Mutex<Option<Arc<View>>>);

impl SharedView {
    /// The view a reader beginning now reads through: the shared one while its epoch is still the
    /// published one (a reader of it began no earlier than that epoch's publication, and every write
    /// acknowledged since is in a later epoch, as commits answer only once their epoch is published),
    /// else a new one, shared from now on.
    fn current(&self, core: &Arc<Core>) -> Arc<View> {
        let mut shared = self.0.lock();
        if let Some(view) = shared.as_ref()
            && view.epoch == core.epochs.published()
        {
            return view.clone();
        }
        let view = Arc::new(View::new(core.clone()));
        let stale = shared.replace(view.clone());
        drop(shared);
        drop(stale);
        view
    }

    /// Lets the shared view go (its readers keep it while they live): after each publication, and at close.
    pub(crate) fn release(&self) {
        let stale = self.0.lock().take();
        drop(stale);
    }
}

/// A value a reader got: shared with the metadata cache, or read from the snapshot.
enum Value {
    Cached(crate::meta_cache::Value),
    Read(Vec<u8>),
}

impl Value {
    fn into_vec(self) -> Vec<u8> {
        match self {
            Value::Cached(v) => v.to_vec(),
            Value::Read(v) => v,
        }
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Value::Cached(v) => v,
            Value::Read(v) => v,
        }
    }
}

pub struct Reader {
    view: Arc<View>,
    /// Held while this reader serves a high-priority object (see `prioritize`).
    prioritized: OnceLock<crate::qos::PriorityGuard>,
    /// The last object `stat` found: a GET stats its object when it looks the name up and again when it
    /// reads, and a snapshot's answer cannot change, so the second costs no cache lookup. One entry.
    last_stat: parking_lot::Mutex<Option<ObjectInfo>>,
}

impl Reader {
    /// A reader with a view of its own (background work: lazy sync, the scrubber).
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Self::of(Arc::new(View::new(core)))
    }

    /// A reader through the view that `shared` holds, or a new one that it holds from now on.
    pub(crate) fn shared(core: &Arc<Core>, shared: &SharedView) -> Self {
        Self::of(shared.current(core))
    }

    fn of(view: Arc<View>) -> Self {
        Reader { view, prioritized: OnceLock::new(), last_stat: parking_lot::Mutex::new(None) }
    }

    /// Marks this reader's work as prioritized (it reads a high-priority object) until it drops: background
    /// work waits for it (bounded, see `qos`).
    pub fn prioritize(&self) {
        self.prioritized.get_or_init(|| crate::qos::PriorityGuard::new(self.view.core.qos.clone()));
    }

    /// The value of `key` in `cf` through this snapshot: shared with the metadata cache when it holds it.
    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Value>> {
        let cache = &self.view.core.meta_cache;
        if let Some(v) = cache.get(cf, key, self.view.epoch) {
            return Ok(v.map(Value::Cached));
        }
        let v = self.view.snap.get_cf(crate::kv::cf(&self.view.db, cf)?, key)?;
        if let Some(e) = self.view.fill_epoch {
            cache.fill(cf, key, v.as_deref(), e);
        }
        Ok(v.map(Value::Read))
    }

    /// Entries in [start, end) of a column family; more than `cap` is an error naming `what` (every scan
    /// is bounded by an invariant or a limit, never by the data alone).
    pub(crate) fn scan_capped(
        &self,
        cf: &str,
        start: &[u8],
        end: &[u8],
        cap: usize,
        what: &str,
    ) -> Result<Vec<RawEntry>> {
        let out = self.scan(cf, start, end, cap.saturating_add(1))?;
        if out.len() > cap {
            return Err(EngineError::Limit(format!("more than {cap} {what}")));
        }
        Ok(out)
    }

    /// Entries in [start, end) of a column family, at most `limit`.
    pub(crate) fn scan(&self, cf: &str, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<RawEntry>> {
        let mut out = Vec::new();
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let it = self.view.snap.iterator_cf_opt(
            crate::kv::cf(&self.view.db, cf)?,
            ro,
            IteratorMode::From(start, Direction::Forward),
        );
        for item in it {
            let (k, v) = item?;
            if &*k >= end || out.len() >= limit {
                break;
            }
            out.push((k, v));
        }
        Ok(out)
    }

    /// Serves a small read wholly from the page cache when every block of it has a clean or dirty page
    /// this reader may see (a partial hit reads the device as usual).
    fn read_from_pages(&self, nid: Nid, lb0: u64, lb1: u64, offset: u64, end: u64) -> Option<bytes::Bytes> {
        debug_assert!(lb0 * BLOCK_SIZE_BYTES <= offset && offset < end && end <= lb1 * BLOCK_SIZE_BYTES);
        if lb1 - lb0 > PAGE_READ_MAX_BLOCKS {
            return None;
        }
        let clip = |lb: u64| {
            let at = lb * BLOCK_SIZE_BYTES;
            (offset.max(at) - at) as usize..(end.min(at + BLOCK_SIZE_BYTES) - at) as usize
        };
        if lb1 - lb0 == 1 {
            // One block (every small object): the page's own bytes, not a copy.
            let (_, data) = self.view.core.page_cache.get(nid, lb0, self.view.epoch)?;
            return Some(data.slice(clip(lb0)));
        }
        let mut pages = Vec::with_capacity((lb1 - lb0) as usize);
        for lb in lb0..lb1 {
            pages.push(self.view.core.page_cache.get(nid, lb, self.view.epoch)?.1);
        }
        let mut out = Vec::with_capacity((end - offset) as usize);
        for (lb, data) in (lb0..lb1).zip(&pages) {
            out.extend_from_slice(&data[clip(lb)]);
        }
        debug_assert_eq!(out.len() as u64, end - offset);
        Some(out.into())
    }

    /// The block-map runs of `nid` that map any block in [first, end), through this snapshot.
    pub(crate) fn runs_overlapping(&self, nid: Nid, first: u64, end: u64) -> Result<Vec<(u64, BlockRun)>> {
        crate::blockmap::runs_overlapping(self, nid, first, end)
    }

    /// Whole-column-family iteration through this reader's snapshot, for verification.
    pub(crate) fn snapshot_iter_access(&self) -> SnapIter<'_> {
        SnapIter { reader: self }
    }

    pub fn collection(&self, name: &str) -> Result<Option<CollectionId>> {
        match self.get(CF_NAMES, &name_key(REGISTRY_COLLECTION, name.as_bytes()))? {
            Some(raw) => Ok(Some(u32_at(&raw, 0)?)),
            None => Ok(None),
        }
    }

    /// The name of collection `id`, if one has it.
    pub fn collection_name(&self, id: CollectionId) -> Result<Option<String>> {
        let raw = self.get(CF_NAMES, &reverse_registry_key(id))?;
        raw.map(|r| {
            String::from_utf8(r.into_vec())
                .map_err(|_| EngineError::Corrupt(format!("collection {id}'s name is not UTF-8")))
        })
        .transpose()
    }

    /// Collections whose name starts with `prefix`, by name, at most `limit`.
    pub fn collections(&self, prefix: &str, limit: usize) -> Result<Vec<(String, CollectionId)>> {
        let p = name_key(REGISTRY_COLLECTION, prefix.as_bytes());
        let end = prefix_end(&p).unwrap_or_else(|| name_key(REGISTRY_COLLECTION + 1, &[]));
        self.scan(CF_NAMES, &p, &end, limit.min(MAX_COLLECTIONS))?
            .into_iter()
            .map(|(k, v)| Ok((String::from_utf8_lossy(&k[4..]).into_owned(), u32_at(&v, 0)?)))
            .collect()
    }

    pub fn lookup(&self, coll: CollectionId, name: &[u8]) -> Result<Option<ObjectInfo>> {
        let Some(raw) = self.get(CF_NAMES, &name_key(coll, name))? else { return Ok(None) };
        self.stat(decode_name_entry(&raw)?.0).map(Some)
    }

    pub fn stat(&self, nid: Nid) -> Result<ObjectInfo> {
        if let Some(info) = self.last_stat.lock().as_ref().filter(|i| i.nid == nid) {
            return Ok(info.clone());
        }
        let raw = self.get(CF_ONODES, &nid_key(nid))?.ok_or(EngineError::NotFound)?;
        let info = ObjectInfo::from_onode(nid, Onode::decode(&raw)?);
        *self.last_stat.lock() = Some(info.clone());
        debug_assert_eq!(info.nid, nid);
        Ok(info)
    }

    pub fn attr(&self, nid: Nid, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get(CF_ATTRS, &nid_sub_key(nid, key))?.map(Value::into_vec))
    }

    /// The onode facts and one attribute of many objects, in the order given: two batched lookups
    /// (RocksDB MultiGet over sorted keys) instead of two point lookups per object. For listing pages.
    pub fn stat_many(&self, nids: &[Nid], attr_key: &[u8]) -> Result<Vec<(ObjectInfo, Option<Vec<u8>>)>> {
        let onodes = self.multi_get(CF_ONODES, nids.iter().map(|n| nid_key(*n).to_vec()).collect())?;
        let attrs = self.multi_get(CF_ATTRS, nids.iter().map(|n| nid_sub_key(*n, attr_key)).collect())?;
        nids.iter()
            .zip(onodes)
            .zip(attrs)
            .map(|((nid, onode), attr)| {
                let onode = Onode::decode(&onode.ok_or(EngineError::NotFound)?)?;
                Ok((ObjectInfo::from_onode(*nid, onode), attr))
            })
            .collect()
    }

    /// Values of many keys of one column family through this snapshot, in the order given.
    fn multi_get(&self, cf: &str, keys: Vec<Vec<u8>>) -> Result<Vec<Option<Vec<u8>>>> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by(|a, b| keys[*a].cmp(&keys[*b]));
        let sorted: Vec<&[u8]> = order.iter().map(|i| keys[*i].as_slice()).collect();
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_snapshot(&self.view.snap);
        let values = self.view.db.batched_multi_get_cf_opt(crate::kv::cf(&self.view.db, cf)?, sorted, true, &ro);
        let mut out = vec![None; keys.len()];
        for (i, v) in order.into_iter().zip(values) {
            out[i] = v?.map(|p| p.to_vec());
        }
        Ok(out)
    }

    /// Attributes of an object with keys greater than `start_after`, in order, at most `limit`.
    pub fn attrs(&self, nid: Nid, start_after: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut from = start_after.to_vec();
        if !from.is_empty() {
            from.push(0);
        }
        self.sub_entries(CF_ATTRS, nid, &from, limit)
    }

    /// Omap entries with keys greater than `start_after`, in order, at most `limit`.
    pub fn omap(&self, nid: Nid, start_after: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut from = start_after.to_vec();
        if !from.is_empty() {
            from.push(0);
        }
        self.sub_entries(CF_OMAP, nid, &from, limit)
    }

    fn sub_entries(&self, cf: &str, nid: Nid, from: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .scan(cf, &nid_sub_key(nid, from), &nid_key(nid + 1), limit)?
            .into_iter()
            .map(|(k, v)| (k[8..].to_vec(), v.to_vec()))
            .collect())
    }

    /// Names in a collection that start with `prefix` and are >= `from`, in order, at most `limit`.
    /// Costs one seek plus the entries returned, whatever the collection's size.
    pub fn list(&self, coll: CollectionId, prefix: &[u8], from: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Nid)>> {
        Ok(self.list_entries(coll, prefix, from, limit)?.into_iter().map(|e| (e.name, e.nid)).collect())
    }

    /// Names under `prefix` from `from` on, in order, at most `limit`, each with its listing tag: one scan
    /// of the name index, no onode read.
    pub fn list_entries(&self, coll: CollectionId, prefix: &[u8], from: &[u8], limit: usize) -> Result<Vec<NameEntry>> {
        let start = name_key(coll, if from > prefix { from } else { prefix });
        let end = prefix_end(&name_key(coll, prefix)).unwrap_or_else(|| name_key(coll + 1, &[]));
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.clone());
        // A raw iterator lends each key and value: one copy of each into the entry, no boxes between (a
        // listing page is thousands of entries).
        let mut it = self.view.snap.raw_iterator_cf_opt(crate::kv::cf(&self.view.db, CF_NAMES)?, ro);
        it.seek(&start);
        let mut out = Vec::with_capacity(limit.min(LIST_PREALLOC_ENTRIES));
        while out.len() < limit {
            let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
            if k >= &end[..] {
                break;
            }
            let (nid, tag) = decode_name_entry(v)?;
            let name = k.get(4..).ok_or_else(|| EngineError::Corrupt("a name key without its collection".into()))?;
            out.push(NameEntry { name: name.to_vec(), nid, tag: tag.map(<[u8]>::to_vec) });
            it.next();
        }
        it.status()?;
        debug_assert!(out.len() <= limit);
        debug_assert!(out.windows(2).all(|w| w[0].name < w[1].name), "the name index is ordered");
        Ok(out)
    }

    /// What lazy sync needs to merge one block: its merged content, the base block it was merged over and
    /// the fragment keys it absorbed. None when there is nothing to merge (object gone, wholly in the KV
    /// store, block past the end, no fragments).
    pub(crate) fn merge_input(&self, nid: Nid, lb: u64, inline_max_bytes: u64) -> Result<Option<MergeInput>> {
        let bs = BLOCK_SIZE_BYTES;
        let Some(raw) = self.get(CF_ONODES, &nid_key(nid))? else { return Ok(None) };
        let size = Onode::decode(&raw)?.size_bytes;
        let has_blocks = !self.scan(CF_BLOCKS, &nid_key(nid), &nid_key(nid + 1), 1)?.is_empty();
        if lives_in_kv(size, has_blocks, inline_max_bytes) || lb * bs >= size {
            return Ok(None);
        }
        let frags = self.scan_capped(
            CF_FRAGS,
            &frag_key(nid, lb, 0),
            &frag_key(nid, lb + 1, 0),
            MAX_FRAGS_PER_BLOCK,
            "fragments in a block",
        )?;
        if frags.is_empty() {
            return Ok(None);
        }
        let mut content = vec![0u8; bs as usize];
        let run = self.runs_overlapping(nid, lb, lb + 1)?.into_iter().next();
        let base = run.as_ref().map(|(start, r)| r.physical_start + (lb - start));
        match self.view.core.page_cache.get(nid, lb, self.view.epoch) {
            // The block's whole current content is in memory: no base read, no merge (paper 001's lazy
            // page sync of a dirty page).
            Some((_, page)) => content.copy_from_slice(&page),
            None => {
                if let Some((start, r)) = &run {
                    self.view.core.io.read_verified_block(nid, *start, r, lb, &mut content)?;
                }
                apply_fragments(&mut content, nid, lb, frags.iter().map(|(_, v)| &v[..]))?;
            }
        }
        let keys = frags.into_iter().map(|(k, _)| k.to_vec()).collect();
        Ok(Some(MergeInput { content, base, frag_keys: keys }))
    }

    /// Reads up to `len` bytes at `offset`; shorter at the end of the object.
    pub fn read(&self, nid: Nid, offset: u64, len: u64) -> Result<Vec<u8>> {
        // A Bytes built from a Vec gives the Vec back without copying; a device buffer is copied once.
        self.read_bytes(nid, offset, len).map(Vec::from)
    }

    /// Like `read`, as shared bytes: a range that one device read covers and no fragment touches (the common
    /// case of a large read) is the device buffer itself, without copying it.
    pub fn read_bytes(&self, nid: Nid, offset: u64, len: u64) -> Result<bytes::Bytes> {
        self.view.core.io.counters().object_reads.fetch_add(1, Ordering::Relaxed);
        match self.read_bytes_with(nid, offset, len, DeviceWait::Wait)? {
            Some(bytes) => Ok(bytes),
            None => Err(EngineError::Corrupt(format!("nid {nid}: a waiting read came back without data"))),
        }
    }

    /// `read_bytes` of the pieces' total length at `offset`, written into `pieces` in order: a read
    /// scattered straight into its places in the caller's buffer (an erasure set's shard units in the
    /// object's bytes). The bytes written, shorter at the end of the object; on a full read every byte of
    /// every piece was written. A block-aligned range that one segment covers and no fragment touches
    /// (the common case of a large read) goes from the kernel's page cache into the pieces, verified there
    /// and kept verified when large, and is never mapped into this process; any other is read as by
    /// `read_bytes` and copied.
    pub fn read_into(&self, nid: Nid, offset: u64, pieces: &mut [&mut [std::mem::MaybeUninit<u8>]]) -> Result<u64> {
        self.view.core.io.counters().object_reads.fetch_add(1, Ordering::Relaxed);
        let len: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        let info = self.stat(nid)?;
        let end = offset.saturating_add(len).min(info.size_bytes);
        if offset >= end {
            return Ok(0);
        }
        let bs = BLOCK_SIZE_BYTES;
        if end - offset == len && offset.is_multiple_of(bs) && end.is_multiple_of(bs) {
            let (lb0, lb1) = (offset / bs, end / bs);
            let runs = self.runs_overlapping(nid, lb0, lb1)?;
            if let [seg] = read_segments(&runs, lb0, lb1).as_slice()
                && seg.first_lb == lb0
                && seg.blocks() == lb1 - lb0
                && self.scan(CF_FRAGS, &frag_key(nid, lb0, 0), &frag_key(nid, lb1, 0), 1)?.is_empty()
                && self.view.core.io.read_verified_segment_into(seg, pieces, len >= MAP_READ_MIN_BYTES)?
            {
                return Ok(len);
            }
        }
        let bytes = match self.read_bytes_with(nid, offset, len, DeviceWait::Wait)? {
            Some(bytes) => bytes,
            None => return Err(EngineError::Corrupt(format!("nid {nid}: a waiting read came back without data"))),
        };
        let done = mosaic_store::copy_into_pieces(&bytes, pieces);
        debug_assert_eq!(done, bytes.len());
        Ok(done as u64)
    }

    /// `read_bytes` only if it completes from memory (this engine's caches, the KV store, the kernel's page
    /// cache) and is at most `max_bytes` long once clipped to the object: None when it is longer, when any
    /// device read would wait, or when a cached copy fails its checksum. Cheap enough to call on an async
    /// thread; on None the caller reads with `read_bytes` on a thread that may block.
    pub fn read_bytes_resident(&self, nid: Nid, offset: u64, len: u64, max_bytes: u64) -> Result<Option<bytes::Bytes>> {
        let read = self.read_bytes_with(nid, offset, len, DeviceWait::NoWait { max_bytes })?;
        if read.is_some() {
            self.view.core.io.counters().object_reads.fetch_add(1, Ordering::Relaxed);
        }
        Ok(read)
    }

    fn read_bytes_with(&self, nid: Nid, offset: u64, len: u64, wait: DeviceWait) -> Result<Option<bytes::Bytes>> {
        let info = self.stat(nid)?;
        let end = offset.saturating_add(len).min(info.size_bytes);
        if offset >= end {
            return Ok(Some(bytes::Bytes::new()));
        }
        if let DeviceWait::NoWait { max_bytes } = wait
            && end - offset > max_bytes
        {
            return Ok(None);
        }
        let bs = BLOCK_SIZE_BYTES;
        let (lb0, lb1) = (offset / bs, (end - 1) / bs + 1);
        if let Some(bytes) = self.read_from_pages(nid, lb0, lb1, offset, end) {
            return Ok(Some(bytes));
        }
        let runs = self.runs_overlapping(nid, lb0, lb1)?;
        let segments = read_segments(&runs, lb0, lb1);
        let frags_cap = ((lb1 - lb0) as usize).saturating_mul(MAX_FRAGS_PER_BLOCK);
        let (fs, fe) = (frag_key(nid, lb0, 0), frag_key(nid, lb1, 0));
        let frags = self.scan_capped(CF_FRAGS, &fs, &fe, frags_cap, "fragments in the range read")?;
        let read_segment = |seg: &Segment| match wait {
            DeviceWait::Wait => self.view.core.io.read_verified_segment(&info.name, seg).map(Some),
            DeviceWait::NoWait { .. } => self.view.core.io.read_verified_segment_nowait(seg),
        };
        if let [seg] = segments.as_slice()
            && frags.is_empty()
            && seg.first_lb <= lb0
            && seg.first_lb + seg.blocks() >= lb1
        {
            let at = (offset - seg.first_lb * bs) as usize;
            if matches!(wait, DeviceWait::Wait)
                && seg.blocks() * bs >= MAP_READ_MIN_BYTES
                && let Some(map) = self.view.core.io.map_verified_segment(seg)
            {
                let held = InPlace { map, _pin: self.view.core.pin_again(self.view.epoch) };
                return Ok(Some(bytes::Bytes::from_owner(held).slice(at..at + (end - offset) as usize)));
            }
            let Some(buf) = read_segment(seg)? else { return Ok(None) };
            let bytes = bytes::Bytes::from_owner(buf).slice(at..at + (end - offset) as usize);
            debug_assert_eq!(bytes.len() as u64, end - offset);
            return Ok(Some(bytes));
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for seg in &segments {
            let Some(buf) = read_segment(seg)? else { return Ok(None) };
            copy_clipped(&mut out, offset, seg.first_lb * bs, buf.as_slice());
        }
        for (k, v) in frags {
            let lb = u64_at(&k, 8)?;
            let (off, data) = decode_frag(&v)
                .map_err(|e| EngineError::Corrupt(format!("object {}: {e}", String::from_utf8_lossy(&info.name))))?;
            copy_clipped(&mut out, offset, lb * bs + off as u64, data);
        }
        Ok(Some(out.into()))
    }
}

/// Whether a read may wait for the device, or must complete from memory (and be at most `max_bytes`).
#[derive(Clone, Copy)]
enum DeviceWait {
    Wait,
    NoWait { max_bytes: u64 },
}

/// Copies `data` (which starts at object offset `at`) into `out` (which starts at object offset `base`).
fn copy_clipped(out: &mut [u8], base: u64, at: u64, data: &[u8]) {
    let out_end = base + out.len() as u64;
    let start = at.max(base);
    let end = (at + data.len() as u64).min(out_end);
    if start >= end {
        return;
    }
    out[(start - base) as usize..(end - base) as usize]
        .copy_from_slice(&data[(start - at) as usize..(end - at) as usize]);
}

impl RunSource for Reader {
    fn floor_run(&self, key: &[u8], lower: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_lower_bound(lower.to_vec());
        let cf = crate::kv::cf(&self.view.db, CF_BLOCKS)?;
        match self.view.snap.iterator_cf_opt(cf, ro, IteratorMode::From(key, Direction::Reverse)).next() {
            Some(item) => {
                let (k, v) = item?;
                Ok((k.as_ref() >= lower).then(|| (k.to_vec(), v.to_vec())))
            }
            None => Ok(None),
        }
    }

    fn scan_runs(&self, from: &[u8], to: &[u8], cap: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let raw = self.scan_capped(CF_BLOCKS, from, to, cap, "block-map runs")?;
        Ok(raw.into_iter().map(|(k, v)| (k.into_vec(), v.into_vec())).collect())
    }
}

pub(crate) struct SnapIter<'a> {
    reader: &'a Reader,
}

impl<'a> SnapIter<'a> {
    pub(crate) fn iter(&self, cf: &str) -> Result<rocksdb::DBIteratorWithThreadMode<'a, DB>> {
        Ok(self.reader.view.snap.iterator_cf(crate::kv::cf(&self.reader.view.db, cf)?, IteratorMode::Start))
    }
}
