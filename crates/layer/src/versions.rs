//! Versioning: where a key's versions live in the name index, and the steps that keep them.
//!
//! A key's current version (object or delete marker) lives at the key's own name, so reading the latest
//! is one lookup as in an unversioned bucket. Its noncurrent versions live at `key \0 suffix \0 key`:
//! keys hold no NUL, so they sort right after the key and before any longer key (one ordered walk lists
//! a key with its versions), and the name's locator (after its last NUL) is the key, so every version is
//! placed where the key is and one transaction can move a version between current and noncurrent. The
//! suffix is 16 hex digits of the version's time inverted (newest first) followed by 16 hex random
//! digits (the version id is the whole suffix) or by `null` (the null version).
//!
//! A new version is made under the key's lock (in-process; writers of one key take turns between
//! reading the current version and committing) and its transaction asserts that the current version is
//! still the one read, so that no version is ever dropped by a race the lock does not cover.

use crate::Versioning;
use crate::error::{LayerError, LayerResult};
use crate::meta::ObjectMeta;
use crate::records::*;
use crate::semantics::{S3Semantics, StoreTxn, read_meta};
use mosaic_store::{HeldShared, ObjectInfo, Op, SharedLocks, Snapshot, Store};
use std::hash::{Hash, Hasher};

/// Lock stripes for writers of versioned keys (two keys may share a stripe; that only serializes them).
const KEY_LOCK_STRIPES: usize = 1024;
/// Most versions of one key walked to find its null version or the next newest version.
pub const MAX_VERSIONS_SCANNED: usize = 100_000;
/// Names fetched per step of a walk over one key's versions.
const VERSION_STEP_NAMES: usize = 256;
const SUFFIX_TIME_HEX: usize = 16;
const SUFFIX_ID_HEX: usize = 16;
const NULL: &str = "null";

pub(crate) struct KeyLocks {
    stripes: Vec<tokio::sync::Mutex<()>>,
    /// Other processes' writers of the same keys (a cluster's nodes), when there are any.
    shared: Option<std::sync::Arc<dyn SharedLocks>>,
}

/// A key's lock: this process's stripe, and the shared lock when other processes write the key too.
pub(crate) struct KeyLock<'a> {
    _local: tokio::sync::MutexGuard<'a, ()>,
    _shared: Option<Box<dyn HeldShared>>,
}

impl KeyLocks {
    pub(crate) fn new(shared: Option<std::sync::Arc<dyn SharedLocks>>) -> Self {
        KeyLocks { stripes: (0..KEY_LOCK_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(), shared }
    }

    /// Holds `key` of `bucket` while its current version is read and replaced (the replacement also
    /// asserts the version it read, so a lock lost on the way turns into a conflict, never a lost version).
    pub(crate) async fn lock(&self, bucket: &str, key: &str) -> LayerResult<KeyLock<'_>> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (bucket, key).hash(&mut h);
        let local = self.stripes[(h.finish() as usize) % self.stripes.len()].lock().await;
        let shared = match &self.shared {
            Some(locks) => Some(locks.lock(vec![shared_key(bucket, key)]).await?),
            None => None,
        };
        Ok(KeyLock { _local: local, _shared: shared })
    }
}

/// A versioned key's shared-lock key: its own namespace, apart from the store's objects (a store locks
/// the objects a commit changes under keys of its own, and the two are held at once).
fn shared_key(bucket: &str, key: &str) -> u64 {
    let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme);
    h.update(b"layer.version-key\0");
    h.update(bucket.as_bytes());
    h.update(&[0]);
    h.update(key.as_bytes());
    h.finalize()
}

/// Buckets' states, and a generation counting the changes of any bucket's record.
#[derive(Default)]
pub(crate) struct BucketCache {
    /// Each bucket's state and when it was read.
    states: std::collections::HashMap<String, (BucketState, std::time::Instant)>,
    generation: u64,
}

/// A bucket's record as cached for requests (versioning, lock and encryption for writes, the rest for
/// access checks).
pub(crate) type BucketState = std::sync::Arc<crate::BucketInfo>;

/// A version's identity: when it was made and its id (None: the null version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) ns: u64,
    pub(crate) id: Option<String>,
}

impl Stamp {
    /// The stamp of a stored version. Versions written without one (unversioned buckets, older builds)
    /// are null versions made at their mtime.
    pub(crate) fn of(meta: &ObjectMeta) -> Stamp {
        let ns = if meta.version_ns != 0 {
            meta.version_ns
        } else {
            (meta.last_modified_unix_ms.max(0) as u64).saturating_mul(1_000_000)
        };
        Stamp { ns, id: meta.version_id.clone() }
    }

    /// The stamp a version attribute (its suffix) names; None for one this build would not write, then
    /// the metadata record says.
    pub(crate) fn of_suffix(suffix: &[u8]) -> Option<Stamp> {
        let s = std::str::from_utf8(suffix).ok()?;
        let ns = !u64::from_str_radix(s.get(..16)?, 16).ok()?;
        let id = match s.get(16..)? {
            NULL => None,
            _ => Some(s.to_string()),
        };
        let stamp = Stamp { ns, id };
        let valid = stamp.suffix() == s && stamp.id.as_deref().is_none_or(|id| validate_version_id(id).is_ok());
        valid.then_some(stamp)
    }

    /// A new version after `current` (strictly later, whatever the clock says); `null` or with a fresh id.
    pub(crate) fn next(current: Option<&Stamp>, null: bool) -> Stamp {
        let now = now_ns();
        let ns = current.map_or(now, |c| now.max(c.ns.saturating_add(1)));
        let id = (!null).then(|| format!("{:016x}{:016x}", !ns, rand::random::<u64>()));
        Stamp { ns, id }
    }

    /// The version's name suffix among its key's versions.
    pub(crate) fn suffix(&self) -> String {
        match &self.id {
            Some(id) => id.clone(),
            None => format!("{:016x}{NULL}", !self.ns),
        }
    }

    pub(crate) fn apply(&self, meta: &mut ObjectMeta) {
        meta.version_id = self.id.clone();
        meta.version_ns = self.ns;
    }
}

/// A version id a client names: "null" or one this layer made (32 lowercase hex digits).
pub(crate) fn validate_version_id(id: &str) -> LayerResult<()> {
    let hex = id.len() == SUFFIX_TIME_HEX + SUFFIX_ID_HEX && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if id == NULL || hex { Ok(()) } else { Err(LayerError::InvalidArgument("Invalid version id specified".into())) }
}

/// The name of a noncurrent version of `key`.
pub(crate) fn noncurrent_name(key: &str, suffix: &str) -> Vec<u8> {
    debug_assert!(!key.contains('\0') && !suffix.contains('\0'));
    let mut n = Vec::with_capacity(key.len() * 2 + suffix.len() + 2);
    n.extend_from_slice(key.as_bytes());
    n.push(0);
    n.extend_from_slice(suffix.as_bytes());
    n.push(0);
    n.extend_from_slice(key.as_bytes());
    n
}

/// The prefix of every noncurrent version name of `key`.
pub(crate) fn versions_prefix(key: &str) -> Vec<u8> {
    let mut p = key.as_bytes().to_vec();
    p.push(0);
    p
}

/// A name of a bucket collection: its key and, for a noncurrent version, its suffix. None for a name that
/// is neither (damaged).
pub(crate) fn parse_name(name: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let Some(first) = name.iter().position(|&b| b == 0) else { return Some((name, None)) };
    let key = &name[..first];
    let rest = &name[first + 1..];
    let second = rest.iter().position(|&b| b == 0)?;
    (&rest[second + 1..] == key).then_some((key, Some(&rest[..second])))
}

/// The version id of a noncurrent version's suffix (None: null).
pub(crate) fn id_of_suffix(suffix: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(suffix).ok()?;
    (!s.ends_with(NULL)).then(|| s.to_string())
}

/// Moves a version to another name of its key: a rename (its data, attributes and listing tag go with the
/// name; nothing is copied).
pub(crate) fn push_move_version<C: Clone, St>(txn: &mut mosaic_store::Txn<C, St>, coll: &C, from: &[u8], to: &[u8]) {
    txn.push(Op::Rename { coll: coll.clone(), from: from.to_vec(), to_coll: coll.clone(), to: to.to_vec() });
}

/// Whether a stored version is the one a client names ("null" names the null version).
fn is_version(meta_id: Option<&str>, named: &str) -> bool {
    match meta_id {
        Some(id) => id == named,
        None => named == NULL,
    }
}

/// A version found by id: its name and what the store holds of it.
pub(crate) struct Located<O> {
    pub(crate) name: Vec<u8>,
    pub(crate) info: ObjectInfo<O>,
    pub(crate) meta: ObjectMeta,
    pub(crate) current: bool,
}

/// What a new current version of a key needs: its stamp, and the key's lock until it commits.
pub(crate) struct NewVersion<'a> {
    pub(crate) stamp: Stamp,
    /// The index of the assertion that the current version is unchanged (None: unversioned).
    pub(crate) asserted_at: Option<usize>,
    /// Where the current version was moved to be kept as a noncurrent one, if it was.
    pub(crate) kept: Option<Vec<u8>>,
    pub(crate) _lock: Option<KeyLock<'a>>,
}

impl NewVersion<'_> {
    /// A store error of the new version's transaction: a failed assertion of the current version is a
    /// conflict with a writer outside this process's key lock.
    pub(crate) fn is_conflict(&self, e: &mosaic_store::StoreError) -> bool {
        self.asserted_at.is_some_and(|i| e.is_op(i, mosaic_store::ErrorKind::AssertionFailed))
    }
}

impl<S: Store> S3Semantics<S> {
    /// The bucket's versioning state.
    pub(crate) async fn versioning(&self, bucket: &str) -> LayerResult<Versioning> {
        Ok(self.bucket_state(bucket).await?.versioning)
    }

    /// What every write of a bucket asks: its versioning and object lock (cached, refreshed when the
    /// bucket's record changes).
    pub(crate) async fn bucket_state(&self, bucket: &str) -> LayerResult<BucketState> {
        let generation = {
            let cache = self.bucket_cache.read();
            if let Some((v, read_at)) = cache.states.get(bucket)
                && self.cfg.bucket_state_ttl.is_none_or(|ttl| read_at.elapsed() < ttl)
            {
                return Ok(v.clone());
            }
            cache.generation
        };
        let read_at = std::time::Instant::now();
        let state = BucketState::new(crate::buckets::info_of(bucket, self.bucket_record(bucket).await?));
        let mut cache = self.bucket_cache.write();
        // A record changed since it was read here: the state read may be stale, so it is not kept.
        if cache.generation == generation {
            cache.states.insert(bucket.to_string(), (state.clone(), read_at));
        }
        Ok(state)
    }

    /// Drops a bucket's cached state; called after every change of its record (or of the bucket).
    pub(crate) fn forget_bucket_state(&self, bucket: &str) {
        let mut cache = self.bucket_cache.write();
        cache.generation += 1;
        cache.states.remove(bucket);
    }

    /// Prepares `txn` for a new current version of `key`: keeps the current version as a noncurrent one
    /// or lets the new one replace it, as the bucket's versioning says, after an assertion that the current
    /// version is still the one read. The caller then resets the key's name and writes the new version
    /// there, and keeps the returned lock until its commit ends.
    pub(crate) async fn push_new_version(
        &self,
        txn: &mut StoreTxn<S>,
        coll: &S::Coll,
        bucket: &str,
        key: &str,
    ) -> LayerResult<NewVersion<'_>> {
        let versioning = self.versioning(bucket).await?;
        if versioning == Versioning::Unversioned {
            return Ok(NewVersion { stamp: Stamp { ns: 0, id: None }, asserted_at: None, kept: None, _lock: None });
        }
        let lock = self.key_locks.lock(bucket, key).await?;
        let snap = self.store.snapshot();
        let name = key.as_bytes().to_vec();
        let current = match snap.lookup(coll, &name).await? {
            Some(info) => {
                let raw_vid = snap.attr(&info.obj, ATTR_VERSION).await?;
                // The version attribute names the stamp; only versions written without one (unversioned
                // buckets, older builds) need their metadata record read.
                let stamp = match raw_vid.as_deref().and_then(Stamp::of_suffix) {
                    Some(stamp) => stamp,
                    None => Stamp::of(&read_meta(&snap, &info.obj, bucket, key).await?),
                };
                Some((raw_vid, stamp))
            }
            None => None,
        };
        let expected = current.as_ref().and_then(|(raw, _)| raw.clone());
        let asserted_at =
            txn.push(Op::AssertAttr { coll: coll.clone(), name: name.clone(), key: ATTR_VERSION.to_vec(), expected });
        let null = versioning == Versioning::Suspended;
        let mut kept = None;
        if let Some((_, cur)) = &current {
            // A null version is replaced by a new null version; every other version is kept. The caller
            // replaces the key's name (reset or clone), which removes what is there.
            if !(null && cur.id.is_none()) {
                let to = noncurrent_name(key, &cur.suffix());
                push_move_version(txn, coll, &name, &to);
                kept = Some(to);
            }
        }
        if null && let Some(old_null) = self.noncurrent_null(&snap, coll, key).await? {
            txn.push(Op::Remove { coll: coll.clone(), name: old_null });
        }
        let stamp = Stamp::next(current.as_ref().map(|(_, s)| s), null);
        Ok(NewVersion { stamp, asserted_at: Some(asserted_at), kept, _lock: Some(lock) })
    }

    /// The name of the key's noncurrent null version, if it has one.
    async fn noncurrent_null(&self, snap: &S::Snapshot, coll: &S::Coll, key: &str) -> LayerResult<Option<Vec<u8>>> {
        let prefix = versions_prefix(key);
        let mut from = prefix.clone();
        let mut seen = 0usize;
        loop {
            let batch = snap.list_entries(coll, &prefix, &from, VERSION_STEP_NAMES).await?;
            let n = batch.len();
            for e in batch {
                if let Some((_, Some(suffix))) = parse_name(&e.name)
                    && suffix.ends_with(NULL.as_bytes())
                {
                    return Ok(Some(e.name));
                }
                from = e.name;
                from.push(0);
            }
            seen += n;
            if n < VERSION_STEP_NAMES {
                return Ok(None);
            }
            if seen >= MAX_VERSIONS_SCANNED {
                return Err(LayerError::InvalidArgument(format!(
                    "key {key} has more than {MAX_VERSIONS_SCANNED} versions; delete some by version id"
                )));
            }
        }
    }

    /// The newest noncurrent version of a key: the one that becomes current when the current is deleted.
    pub(crate) async fn newest_noncurrent(
        &self,
        snap: &S::Snapshot,
        coll: &S::Coll,
        key: &str,
    ) -> LayerResult<Option<Vec<u8>>> {
        let prefix = versions_prefix(key);
        Ok(snap.list_entries(coll, &prefix, &prefix, 1).await?.into_iter().next().map(|e| e.name))
    }

    /// Finds a version of `key` by id in `snap`: the current version if it is the one named, else the
    /// noncurrent one.
    pub(crate) async fn locate(
        &self,
        snap: &S::Snapshot,
        coll: &S::Coll,
        bucket: &str,
        key: &str,
        version_id: &str,
    ) -> LayerResult<Option<Located<S::Obj>>> {
        validate_version_id(version_id)?;
        let name = key.as_bytes().to_vec();
        if let Some(info) = snap.lookup(coll, &name).await? {
            let meta = read_meta(snap, &info.obj, bucket, key).await?;
            if is_version(meta.version_id.as_deref(), version_id) {
                return Ok(Some(Located { name, info, meta, current: true }));
            }
        }
        let name = if version_id == NULL {
            match self.noncurrent_null(snap, coll, key).await? {
                Some(n) => n,
                None => return Ok(None),
            }
        } else {
            noncurrent_name(key, version_id)
        };
        match snap.lookup(coll, &name).await? {
            Some(info) => {
                let meta = read_meta(snap, &info.obj, bucket, key).await?;
                Ok(Some(Located { name, info, meta, current: false }))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_versions_after_their_key_newest_first_and_parse_back() {
        let older = Stamp { ns: 10, id: Some(format!("{:016x}{:016x}", !10u64, 7)) };
        let newer = Stamp { ns: 11, id: None };
        let (n_old, n_new) = (noncurrent_name("k", &older.suffix()), noncurrent_name("k", &newer.suffix()));
        let mut names = vec![b"k\x01".to_vec(), n_old.clone(), b"k".to_vec(), n_new.clone(), b"ka".to_vec()];
        names.sort();
        assert_eq!(names, vec![b"k".to_vec(), n_new.clone(), n_old.clone(), b"k\x01".to_vec(), b"ka".to_vec()]);
        assert_eq!(parse_name(b"k"), Some((&b"k"[..], None)));
        assert_eq!(parse_name(&n_old), Some((&b"k"[..], Some(older.suffix().as_bytes()))));
        assert_eq!(id_of_suffix(older.suffix().as_bytes()), older.id);
        assert_eq!(id_of_suffix(newer.suffix().as_bytes()), None);
        assert_eq!(mosaic_store::locator(&n_old), b"k", "a version is placed with its key");
        assert_eq!(parse_name(b"k\0x\0other"), None);
        assert_eq!(parse_name(b"k\0x"), None);
    }

    #[test]
    fn a_version_attribute_names_its_stamp() {
        for null in [false, true] {
            let stamp = Stamp::next(Some(&Stamp { ns: 1_700_000_000_000_000_000, id: None }), null);
            assert_eq!(Stamp::of_suffix(stamp.suffix().as_bytes()), Some(stamp));
        }
        let id = format!("{:016x}{:016x}", !5u64, 9);
        for bad in [&b""[..], b"null", b"0123", &id.as_bytes()[..31], id.to_uppercase().as_bytes(), b"\xff\xfe"] {
            assert_eq!(Stamp::of_suffix(bad), None, "{}", bad.escape_ascii());
        }
        let mut null_upper = format!("{:016X}null", !5u64);
        assert_eq!(Stamp::of_suffix(null_upper.as_bytes()), None, "a suffix this build would not write");
        null_upper.make_ascii_lowercase();
        assert_eq!(Stamp::of_suffix(null_upper.as_bytes()), Some(Stamp { ns: 5, id: None }));
    }

    #[test]
    fn new_stamps_are_strictly_later_and_ids_are_valid() {
        let far = Stamp { ns: u64::MAX / 2, id: None };
        let next = Stamp::next(Some(&far), false);
        assert_eq!(next.ns, far.ns + 1, "a clock behind the current version does not reorder versions");
        let id = next.id.clone().unwrap();
        assert!(validate_version_id(&id).is_ok());
        assert!(Stamp::next(None, true).id.is_none());
        assert!(validate_version_id("null").is_ok());
        for bad in ["", "NULL", "abc", &"g".repeat(32), &"a".repeat(33), &"A".repeat(32)] {
            assert!(validate_version_id(bad).is_err(), "{bad}");
        }
    }
}
