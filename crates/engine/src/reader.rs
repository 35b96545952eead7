//! Reads through a consistent snapshot: name lookup, stat, attributes, ordered listing, and data reads
//! that merge fragments over base blocks on the fly and verify every block's checksum.
//!
//! A reader pins the commit epoch it started in: blocks freed by later commits are not reused until it is
//! dropped, so a long GET streams exactly the object it looked up even while the name is overwritten.

use crate::engine::{BLOCK_SIZE_BYTES, Inner};
use crate::error::{EngineError, Result};
use crate::keys::*;
use rocksdb::{DB, Direction, IteratorMode, SnapshotWithThreadMode};
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A raw (key, value) pair from RocksDB.
type RawEntry = (Box<[u8]>, Box<[u8]>);

/// Reads of at most this many blocks try the page cache first.
const PAGE_READ_MAX_BLOCKS: u64 = 64;

/// Largest single device read issued for a contiguous physical run.
const MAX_READ_RUN_BYTES: u64 = 4 << 20;

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

pub struct Reader {
    // Field order matters: the snapshot must be released before the database handle it borrows.
    snap: ManuallyDrop<SnapshotWithThreadMode<'static, DB>>,
    db: Arc<DB>,
    inner: Arc<Inner>,
    epoch: u64,
    /// Set when this reader's snapshot is exactly the newest committed state: it may fill the metadata
    /// cache (meta_cache.rs).
    fill_epoch: Option<u64>,
    /// Held while this reader serves a high-priority object (see `prioritize`).
    prioritized: Option<crate::qos::PriorityGuard>,
}

// SAFETY: the snapshot is a read-only handle to a RocksDB snapshot, which RocksDB allows to be used from
// any thread; the database it refers to is kept alive by `db`.
unsafe impl Send for Reader {}
// SAFETY: as above; all methods take &self and RocksDB reads are thread-safe.
unsafe impl Sync for Reader {}

impl Drop for Reader {
    fn drop(&mut self) {
        // SAFETY: dropped exactly once, before `db`.
        unsafe { ManuallyDrop::drop(&mut self.snap) };
        let mut r = self.inner.readers.lock();
        if let Some(c) = r.get_mut(&self.epoch) {
            *c -= 1;
            if *c == 0 {
                r.remove(&self.epoch);
            }
        }
    }
}

impl Reader {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        let (epoch, fill_epoch) = {
            let mut r = inner.readers.lock();
            // Read before the published epoch: see meta_cache.rs.
            let installed = inner.meta_cache.installed_epoch();
            let e = inner.epoch.load(Ordering::SeqCst);
            *r.entry(e).or_insert(0) += 1;
            (e, inner.meta_cache.fill_epoch(installed, e))
        };
        let db = inner.db.clone();
        let snap = db.snapshot();
        // SAFETY: the snapshot borrows the DB behind `db`, an Arc that this Reader holds and drops after
        // the snapshot (see Drop), so the borrow never outlives the database.
        let snap: SnapshotWithThreadMode<'static, DB> = unsafe { std::mem::transmute(snap) };
        Reader { snap: ManuallyDrop::new(snap), db, inner, epoch, fill_epoch, prioritized: None }
    }

    /// Marks this reader's work as prioritized (it reads a high-priority object) until it drops: background
    /// work waits for it (bounded, see `qos`).
    pub fn prioritize(&mut self) {
        if self.prioritized.is_none() {
            self.prioritized = Some(crate::qos::PriorityGuard::new(self.inner.clone()));
        }
    }

    fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let cache = &self.inner.meta_cache;
        if let Some(v) = cache.get(cf, key, self.epoch) {
            return Ok(v);
        }
        let v = self.snap.get_cf(crate::kv::cf(&self.db, cf)?, key)?;
        if let Some(e) = self.fill_epoch {
            cache.fill(cf, key, &v, e);
        }
        Ok(v)
    }

    /// Entries in [start, end) of a column family, at most `limit`.
    pub(crate) fn scan(&self, cf: &str, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<RawEntry>> {
        let mut out = Vec::new();
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let it =
            self.snap.iterator_cf_opt(crate::kv::cf(&self.db, cf)?, ro, IteratorMode::From(start, Direction::Forward));
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
    fn read_from_pages(&self, nid: Nid, lb0: u64, lb1: u64, offset: u64, out: &mut [u8]) -> bool {
        if lb1 - lb0 > PAGE_READ_MAX_BLOCKS {
            return false;
        }
        let mut pages = Vec::with_capacity((lb1 - lb0) as usize);
        for lb in lb0..lb1 {
            match self.inner.page_cache.get(nid, lb, self.epoch) {
                Some((_, data)) => pages.push(data),
                None => return false,
            }
        }
        for (lb, data) in (lb0..lb1).zip(&pages) {
            copy_clipped(out, offset, lb * BLOCK_SIZE_BYTES, data);
        }
        true
    }

    /// The block-map runs of `nid` that map any block in [first, end): the run that starts before
    /// `first` and reaches into the range (one backward seek), then a forward scan.
    pub(crate) fn runs_overlapping(&self, nid: Nid, first: u64, end: u64) -> Result<Vec<(u64, BlockRun)>> {
        let mut out = Vec::new();
        if first > 0 {
            let lower = block_key(nid, first.saturating_sub(MAX_RUN_BLOCKS - 1));
            let mut ro = rocksdb::ReadOptions::default();
            ro.set_iterate_lower_bound(lower.to_vec());
            let key = block_key(nid, first - 1);
            let cf = crate::kv::cf(&self.db, CF_BLOCKS)?;
            if let Some(item) = self.snap.iterator_cf_opt(cf, ro, IteratorMode::From(&key, Direction::Reverse)).next() {
                let (k, v) = item?;
                if k.as_ref() >= &lower[..] {
                    let (start, run) = (u64_at(&k, 8)?, BlockRun::decode(&v)?);
                    if start + run.len_blocks() > first {
                        out.push((start, run));
                    }
                }
            }
        }
        for (k, v) in self.scan(CF_BLOCKS, &block_key(nid, first), &block_key(nid, end), usize::MAX)? {
            out.push((u64_at(&k, 8)?, BlockRun::decode(&v)?));
        }
        Ok(out)
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

    /// Every collection, by name.
    pub fn collections(&self) -> Result<Vec<(String, CollectionId)>> {
        let p = collection_prefix(REGISTRY_COLLECTION);
        let end = prefix_end(&p).expect("prefix 0");
        self.scan(CF_NAMES, &p, &end, usize::MAX)?
            .into_iter()
            .map(|(k, v)| Ok((String::from_utf8_lossy(&k[4..]).into_owned(), u32_at(&v, 0)?)))
            .collect()
    }

    pub fn lookup(&self, coll: CollectionId, name: &[u8]) -> Result<Option<ObjectInfo>> {
        let Some(raw) = self.get(CF_NAMES, &name_key(coll, name))? else { return Ok(None) };
        self.stat(decode_name_entry(&raw)?.0).map(Some)
    }

    pub fn stat(&self, nid: Nid) -> Result<ObjectInfo> {
        let raw = self.get(CF_ONODES, &nid_key(nid))?.ok_or(EngineError::NotFound)?;
        Ok(ObjectInfo::from_onode(nid, Onode::decode(&raw)?))
    }

    pub fn attr(&self, nid: Nid, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get(CF_ATTRS, &nid_sub_key(nid, key))
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
        ro.set_snapshot(&self.snap);
        let values = self.db.batched_multi_get_cf_opt(crate::kv::cf(&self.db, cf)?, sorted, true, &ro);
        let mut out = vec![None; keys.len()];
        for (i, v) in order.into_iter().zip(values) {
            out[i] = v?.map(|p| p.to_vec());
        }
        Ok(out)
    }

    pub fn attrs(&self, nid: Nid) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.sub_entries(CF_ATTRS, nid, &[], usize::MAX)
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
        self.scan(CF_NAMES, &start, &end, limit)?
            .into_iter()
            .map(|(k, v)| {
                let (nid, tag) = decode_name_entry(&v)?;
                Ok(NameEntry { name: k[4..].to_vec(), nid, tag: tag.map(<[u8]>::to_vec) })
            })
            .collect()
    }

    /// What lazy sync needs to merge one block: its merged content, the base block it was merged over and
    /// the fragment keys it absorbed. None when there is nothing to merge (object gone, wholly in the KV
    /// store, block past the end, no fragments).
    pub(crate) fn merge_input(&self, nid: Nid, lb: u64, inline_max_bytes: u64) -> Result<Option<MergeInput>> {
        let bs = BLOCK_SIZE_BYTES;
        let Some(raw) = self.get(CF_ONODES, &nid_key(nid))? else { return Ok(None) };
        let size = Onode::decode(&raw)?.size_bytes;
        let has_blocks = !self.scan(CF_BLOCKS, &nid_key(nid), &nid_key(nid + 1), 1)?.is_empty();
        if (size <= inline_max_bytes && !has_blocks) || lb * bs >= size {
            return Ok(None);
        }
        let frags = self.scan(CF_FRAGS, &frag_key(nid, lb, 0), &frag_key(nid, lb + 1, 0), usize::MAX)?;
        if frags.is_empty() {
            return Ok(None);
        }
        let mut content = vec![0u8; bs as usize];
        let run = self.runs_overlapping(nid, lb, lb + 1)?.into_iter().next();
        let base = run.as_ref().map(|(start, r)| r.physical_start + (lb - start));
        match self.inner.page_cache.get(nid, lb, self.epoch) {
            // The block's whole current content is in memory: no base read, no merge (paper 001's lazy
            // page sync of a dirty page).
            Some((_, page)) => content.copy_from_slice(&page),
            None => {
                if let Some((start, r)) = &run {
                    crate::plan::read_verified_block(&self.inner, nid, *start, r, lb, &mut content)?;
                }
                crate::plan::apply_fragments(&mut content, nid, lb, frags.iter().map(|(_, v)| &v[..]))?;
            }
        }
        let keys = frags.into_iter().map(|(k, _)| k.to_vec()).collect();
        Ok(Some(MergeInput { content, base, frag_keys: keys }))
    }

    /// Reads up to `len` bytes at `offset`; shorter at the end of the object.
    pub fn read(&self, nid: Nid, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.inner.counters.object_reads.fetch_add(1, Ordering::Relaxed);
        let info = self.stat(nid)?;
        let end = offset.saturating_add(len).min(info.size_bytes);
        if offset >= end {
            return Ok(Vec::new());
        }
        let bs = BLOCK_SIZE_BYTES;
        let mut out = vec![0u8; (end - offset) as usize];
        let (lb0, lb1) = (offset / bs, (end - 1) / bs + 1);
        if self.read_from_pages(nid, lb0, lb1, offset, &mut out) {
            return Ok(out);
        }
        let runs = self.runs_overlapping(nid, lb0, lb1)?;
        for seg in read_segments(&runs, lb0, lb1) {
            let buf = self.read_verified_segment(&info.name, &seg)?;
            copy_clipped(&mut out, offset, seg.first_lb * bs, buf.as_slice());
        }
        for (k, v) in self.scan(CF_FRAGS, &frag_key(nid, lb0, 0), &frag_key(nid, lb1, 0), usize::MAX)? {
            let lb = u64_at(&k, 8)?;
            let (off, data) = decode_frag(&v)
                .map_err(|e| EngineError::Corrupt(format!("object {}: {e}", String::from_utf8_lossy(&info.name))))?;
            copy_clipped(&mut out, offset, lb * bs + off as u64, data);
        }
        Ok(out)
    }
}

impl Reader {
    /// Reads one segment (physically contiguous blocks, whole checksum units) and checks every unit. A
    /// cached read that fails a checksum is dropped from the page cache and read again from the device,
    /// which is the truth: only a mismatch there is an error.
    fn read_verified_segment(&self, name: &[u8], seg: &Segment) -> Result<crate::aligned::AlignedBuf> {
        let bs = BLOCK_SIZE_BYTES;
        let len_bytes = (seg.blocks * bs) as usize;
        if self.inner.cfg.page_cache_reads {
            let buf = self.inner.read_run(seg.first_physical, len_bytes, true)?;
            if first_bad_unit(buf.as_slice(), &seg.units).is_none() {
                return Ok(buf);
            }
            self.inner.device.forget_cached(seg.first_physical * bs, len_bytes as u64);
            self.inner.counters.cache_rereads.fetch_add(1, Ordering::Relaxed);
        }
        let buf = self.inner.read_run(seg.first_physical, len_bytes, false)?;
        if let Some(u) = first_bad_unit(buf.as_slice(), &seg.units) {
            self.inner.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::Checksum {
                object: String::from_utf8_lossy(name).into_owned(),
                block: seg.first_lb + u.first,
                physical: seg.first_physical + u.first,
            });
        }
        Ok(buf)
    }
}

/// Physically contiguous blocks read with one device IO: whole checksum units (relative to the segment).
struct Segment {
    first_lb: u64,
    first_physical: u64,
    blocks: u64,
    units: Vec<ChecksumUnit>,
}

/// The device reads that cover logical blocks [lb0, lb1) of these runs: each run's blocks widened to whole
/// checksum units, and runs that continue one another logically and physically joined, up to
/// MAX_READ_RUN_BYTES per read.
fn read_segments(runs: &[(u64, BlockRun)], lb0: u64, lb1: u64) -> Vec<Segment> {
    let max_blocks = MAX_READ_RUN_BYTES / BLOCK_SIZE_BYTES;
    let mut out: Vec<Segment> = Vec::new();
    for (start, run) in runs {
        let (from, to) = (lb0.max(*start) - start, lb1.min(start + run.len_blocks()) - start);
        if from >= to {
            continue;
        }
        for unit in run.units(from, to) {
            let (lb, physical) = (start + unit.first, run.physical_start + unit.first);
            match out.last_mut() {
                Some(seg)
                    if seg.first_lb + seg.blocks == lb
                        && seg.first_physical + seg.blocks == physical
                        && seg.blocks + unit.blocks <= max_blocks =>
                {
                    seg.units.push(ChecksumUnit { first: seg.blocks, ..unit });
                    seg.blocks += unit.blocks;
                }
                _ => out.push(Segment {
                    first_lb: lb,
                    first_physical: physical,
                    blocks: unit.blocks,
                    units: vec![ChecksumUnit { first: 0, ..unit }],
                }),
            }
        }
    }
    out
}

/// The first checksum unit of a segment whose contents do not match.
fn first_bad_unit(buf: &[u8], units: &[ChecksumUnit]) -> Option<ChecksumUnit> {
    let bs = BLOCK_SIZE_BYTES as usize;
    units.iter().copied().find(|u| {
        let bytes = &buf[u.first as usize * bs..(u.first + u.blocks) as usize * bs];
        crate::checksum::crc32c(bytes) != u.crc32c
    })
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

pub(crate) struct SnapIter<'a> {
    reader: &'a Reader,
}

impl<'a> SnapIter<'a> {
    pub(crate) fn iter(&self, cf: &str) -> Result<rocksdb::DBIteratorWithThreadMode<'a, DB>> {
        Ok(self.reader.snap.iterator_cf(crate::kv::cf(&self.reader.db, cf)?, IteratorMode::Start))
    }
}
