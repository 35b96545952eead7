//! Uncommitted KV changes layered over the database. Deletes are point deletes only: RocksDB range
//! tombstones in the memtable made every iterator creation cost O(tombstones) (measured: a read-modify-write
//! run at queue depth 16 became CPU-bound in the committer), so callers scan and delete keys one by one. The committer plans every transaction of a group
//! against "database + changes of the group so far + changes of this transaction", so transactions of one
//! group never conflict, and a transaction that fails leaves nothing behind.

use crate::error::Result;
use crate::keys::prefix_end;
use crate::meta_cache::MetaCache;
use rocksdb::{DB, Direction, IteratorMode, WriteBatch};
use std::collections::BTreeMap;

#[derive(Default, Clone)]
pub struct CfChanges {
    /// Final state of each touched key: Some(value) = put, None = delete.
    points: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

#[derive(Default, Clone)]
pub struct Overlay {
    cfs: BTreeMap<&'static str, CfChanges>,
}

impl Overlay {
    pub fn put(&mut self, cf: &'static str, key: &[u8], value: Vec<u8>) {
        self.cfs.entry(cf).or_default().points.insert(key.to_vec(), Some(value));
    }

    pub fn delete(&mut self, cf: &'static str, key: &[u8]) {
        self.cfs.entry(cf).or_default().points.insert(key.to_vec(), None);
    }

    /// Keys this overlay puts in [start, end).
    pub fn keys_in(&self, cf: &str, start: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
        match self.cfs.get(cf) {
            Some(c) => c
                .points
                .range(start.to_vec()..end.to_vec())
                .filter(|(_, v)| v.is_some())
                .map(|(k, _)| k.clone())
                .collect(),
            None => Vec::new(),
        }
    }

    /// Moves `newer`'s changes on top of these.
    pub fn absorb(&mut self, newer: Overlay) {
        for (cf, c) in newer.cfs {
            self.cfs.entry(cf).or_default().points.extend(c.points);
        }
    }

    /// Looks a key up in the overlays only, for keys the database cannot hold (objects created in this
    /// group): Some(v) or None.
    pub fn lookup_owned(&self, cf: &str, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.lookup(cf, key).map(|v| v.cloned())
    }

    /// Looks a key up in this overlay only: Some(Some(v)) put, Some(None) deleted, None untouched.
    fn lookup(&self, cf: &str, key: &[u8]) -> Option<Option<&Vec<u8>>> {
        self.cfs.get(cf)?.points.get(key).map(|v| v.as_ref())
    }

    /// The final state of every key of `cf` this overlay touches.
    pub fn changes<'s>(&'s self, cf: &str) -> impl Iterator<Item = (&'s Vec<u8>, &'s Option<Vec<u8>>)> + 's {
        self.cfs.get(cf).into_iter().flat_map(|c| c.points.iter())
    }

    /// Writes the final state of every touched key into `batch`.
    pub fn into_batch(self, db: &DB, batch: &mut WriteBatch) -> Result<usize> {
        let mut bytes = 0;
        for (cf, c) in self.cfs {
            let h = crate::kv::cf(db, cf)?;
            for (k, v) in c.points {
                bytes += k.len();
                match v {
                    Some(v) => {
                        bytes += v.len();
                        batch.put_cf(h, &k, &v)
                    }
                    None => batch.delete_cf(h, &k),
                }
            }
        }
        Ok(bytes)
    }
}

/// Database plus overlays, newest last.
pub struct View<'a> {
    pub db: &'a DB,
    pub layers: Vec<&'a Overlay>,
    pub top: Overlay,
    /// The metadata cache and the committed epoch the database holds (the committer plans against the
    /// newest state, so it may use and fill the cache at that epoch).
    cache: Option<(&'a MetaCache, u64)>,
}

impl<'a> View<'a> {
    pub fn with_cache(db: &'a DB, group: &'a Overlay, cache: &'a MetaCache, committed_epoch: u64) -> Self {
        View { db, layers: vec![group], top: Overlay::default(), cache: Some((cache, committed_epoch)) }
    }

    /// Like `get`, but without asking the database: for keys of objects created in this group.
    pub fn get_overlay_only(&self, cf: &'static str, key: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.top.lookup_owned(cf, key) {
            return v;
        }
        for l in self.layers.iter().rev() {
            if let Some(v) = l.lookup_owned(cf, key) {
                return v;
            }
        }
        None
    }

    pub fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.top.lookup(cf, key) {
            return Ok(v.cloned());
        }
        for l in self.layers.iter().rev() {
            if let Some(v) = l.lookup(cf, key) {
                return Ok(v.cloned());
            }
        }
        if let Some((cache, epoch)) = self.cache
            && let Some(v) = cache.get(cf, key, epoch)
        {
            return Ok(v.map(|v| v.to_vec()));
        }
        let v = self.db.get_cf(crate::kv::cf(self.db, cf)?, key)?;
        if let Some((cache, epoch)) = self.cache {
            cache.fill(cf, key, v.as_deref(), epoch);
        }
        Ok(v)
    }

    /// Every live (key, value) in [start, end), in key order, with at most `limit` results.
    pub fn scan(&self, cf: &'static str, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut all_layers: Vec<&Overlay> = self.layers.clone();
        all_layers.push(&self.top);
        // Keys from the database that no overlay deletes or replaces.
        let h = crate::kv::cf(self.db, cf)?;
        // The upper bound keeps the iterator from walking tombstones past `end`.
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let it = self.db.iterator_cf_opt(h, ro, IteratorMode::From(start, Direction::Forward));
        let touched = |k: &[u8]| all_layers.iter().any(|l| l.lookup(cf, k).is_some());
        let mut db_taken = 0usize;
        for item in it {
            let (k, v) = item?;
            if k.as_ref() >= end {
                break;
            }
            if touched(&k) {
                continue;
            }
            merged.insert(k.to_vec(), v.to_vec());
            db_taken += 1;
            if db_taken >= limit {
                break;
            }
        }
        // Puts of the overlays, newest wins: resolve each touched key through the view.
        for l in &all_layers {
            if let Some(c) = l.cfs.get(cf) {
                for (k, _) in c.points.range(start.to_vec()..end.to_vec()) {
                    match self.get(cf, k)? {
                        Some(v) => merged.insert(k.clone(), v),
                        None => merged.remove(k),
                    };
                }
            }
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// The live entry with the greatest key in [lower, key], or None. With `overlay_only` the database is
    /// not asked (keys of objects created by the transaction being planned).
    pub fn floor(
        &self,
        cf: &'static str,
        key: &[u8],
        lower: &[u8],
        overlay_only: bool,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if lower > key {
            return Ok(None);
        }
        let mut all_layers: Vec<&Overlay> = self.layers.clone();
        all_layers.push(&self.top);
        let mut touched = std::collections::BTreeSet::new();
        for l in &all_layers {
            if let Some(c) = l.cfs.get(cf) {
                touched.extend(c.points.range(lower.to_vec()..=key.to_vec()).map(|(k, _)| k.clone()));
            }
        }
        // The greatest key the overlays leave live (their newest state decides).
        let mut from_overlays = None;
        for k in touched.iter().rev() {
            if let Some(v) = self.get(cf, k)? {
                from_overlays = Some((k.clone(), v));
                break;
            }
        }
        if overlay_only {
            return Ok(from_overlays);
        }
        // The greatest database key that no overlay touches.
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_lower_bound(lower.to_vec());
        let it = self.db.iterator_cf_opt(crate::kv::cf(self.db, cf)?, ro, IteratorMode::From(key, Direction::Reverse));
        let mut from_db = None;
        for item in it {
            let (k, v) = item?;
            if k.as_ref() < lower {
                break;
            }
            if !touched.contains(k.as_ref()) {
                from_db = Some((k.to_vec(), v.to_vec()));
                break;
            }
        }
        Ok(match (from_overlays, from_db) {
            (Some(a), Some(b)) => Some(if a.0 > b.0 { a } else { b }),
            (a, b) => a.or(b),
        })
    }

    /// Every live entry in [start, end); more than `cap` is an error naming `what` (every scan is bounded
    /// by an invariant or a limit, never by the data alone).
    pub fn scan_capped(
        &self,
        cf: &'static str,
        start: &[u8],
        end: &[u8],
        cap: usize,
        what: &str,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let out = self.scan(cf, start, end, cap.saturating_add(1))?;
        if out.len() > cap {
            return Err(crate::error::EngineError::Limit(format!("more than {cap} {what}")));
        }
        Ok(out)
    }

    /// Every live entry whose key starts with `prefix`, bounded as `scan_capped`.
    pub fn scan_prefix(
        &self,
        cf: &'static str,
        prefix: &[u8],
        cap: usize,
        what: &str,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let end = prefix_end(prefix).unwrap_or_else(|| vec![0xFF; prefix.len() + 1]);
        self.scan_capped(cf, prefix, &end, cap, what)
    }
}
