//! ListObjects: one ordered walk of the bucket's name index from the marker. A common prefix is recorded
//! and skipped with one seek past it; an object's size, ETag and mtime come from its name entry's listing
//! tag, so a page of 1,000 keys is one walk and no point lookup. Entries without a tag (written before tags
//! existed) are statted together in one batch.

use crate::error::{LayerError, LayerResult};
use crate::meta::{ListTag, ListedFields};
use crate::records::ATTR_META;
use crate::semantics::S3Semantics;
use crate::versions;
use crate::*;
use mosaic_store::{Snapshot, Store};

/// Names fetched per step of a listing walk.
const LIST_STEP_NAMES: usize = 1001;
/// Steps of one listing page that return nothing (beyond one per key returned); past them the page ends
/// early, truncated, so that a page's work is bounded however many versions lie in the way.
const LIST_SKIP_STEPS_MAX: usize = 1000;
/// Most keys one listing page returns (S3's limit).
pub const MAX_LIST_KEYS: usize = 1000;

/// The smallest key greater than every key starting with `prefix`, or None if there is none.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last != 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The smallest name after `key` that is not one of its noncurrent versions (`key \0 ...`): keys hold
/// no NUL, so the next possible key is `key \x01`.
pub(crate) fn key_successor(key: &[u8]) -> Vec<u8> {
    let mut f = key.to_vec();
    f.push(1);
    f
}

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn list_objects_impl(&self, bucket: &str, q: &ListQuery) -> LayerResult<ListPage> {
        let snap = self.store.snapshot();
        let coll = self.bucket_coll(&snap, bucket).await?;
        let mut page = ListPage::default();
        let max_keys = q.max_keys.min(MAX_LIST_KEYS);
        if max_keys == 0 {
            return Ok(page);
        }
        let prefix = q.prefix.as_bytes();
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        // Strictly after start_after and its noncurrent versions.
        let mut from: Vec<u8> =
            if q.start_after.is_empty() { prefix.to_vec() } else { key_successor(q.start_after.as_bytes()) };
        let mut returned = 0usize;
        // Names passed over (noncurrent versions, delete markers): later steps fetch that many more.
        let mut skipped = 0usize;
        // The last key the walk passed, returned or not: where a page cut short by the step limit ends.
        let mut last_seen: Option<String> = None;
        // Objects of the page without a listing tag, statted together once the names are known: their
        // index in `page.objects` and handle.
        let mut untagged: Vec<(usize, S::Obj)> = Vec::new();
        // Every step returns a key or prefix, ends the walk, or passes at least one name that is not listed
        // (a prefix a continuation already returned, a noncurrent version, a delete marker): bounded, each
        // step of at most LIST_STEP_NAMES names.
        let mut ended = false;
        'outer: for _ in 0..max_keys + 2 + LIST_SKIP_STEPS_MAX {
            let want = (max_keys - returned + 1).saturating_add(skipped).min(LIST_STEP_NAMES);
            let batch = snap.list_entries(&coll, prefix, &from, want).await?;
            let batch_len = batch.len();
            for entry in batch {
                // Noncurrent versions follow their key in the name index: not listed.
                if entry.name.contains(&0) {
                    skipped += 1;
                    from = entry.name;
                    from.push(0);
                    continue;
                }
                let key = String::from_utf8(entry.name.clone())
                    .map_err(|_| LayerError::Corrupt(format!("a stored key of bucket {bucket} is not UTF-8")))?;
                let tag = entry.tag.as_deref().and_then(ListTag::decode);
                // A key whose current version is a delete marker is not listed (untagged entries are
                // older than delete markers).
                if tag.as_ref().is_some_and(|t| t.delete_marker) {
                    skipped += 1;
                    from = key_successor(&entry.name);
                    last_seen = Some(key);
                    continue;
                }
                if returned == max_keys {
                    page.next_marker =
                        page.objects.last().map(|o| o.key.clone()).max(page.common_prefixes.last().cloned());
                    ended = true;
                    break 'outer;
                }
                if let Some(d) = delim
                    && let Some(pos) = key[q.prefix.len()..].find(d)
                {
                    let cp = key[..q.prefix.len() + pos + d.len()].to_string();
                    // Skip everything under this common prefix with one seek.
                    from = match prefix_end(cp.as_bytes()) {
                        Some(f) => f,
                        None => {
                            ended = true;
                            break 'outer;
                        }
                    };
                    last_seen = Some(cp.clone());
                    // A continuation that ended on this prefix has already returned it.
                    if cp.as_str() <= q.start_after.as_str() {
                        continue 'outer;
                    }
                    page.common_prefixes.push(cp);
                    returned += 1;
                    continue 'outer;
                }
                if tag.is_none() {
                    untagged.push((page.objects.len(), entry.obj.clone()));
                }
                let tag = tag.unwrap_or_default();
                last_seen = Some(key.clone());
                page.objects.push(ListedObject {
                    key,
                    size_bytes: tag.size_bytes,
                    etag: tag.etag,
                    last_modified_unix_ms: tag.last_modified_unix_ms,
                });
                returned += 1;
                from = key_successor(&entry.name);
            }
            if batch_len < want {
                ended = true;
                break;
            }
        }
        if !ended {
            // The step limit cut the walk short (a long run of versions or delete markers): the page ends
            // where the walk got to, and the client continues from there.
            page.next_marker = last_seen;
        }
        debug_assert!(page.objects.len() + page.common_prefixes.len() <= max_keys);
        if !untagged.is_empty() {
            let objs: Vec<S::Obj> = untagged.iter().map(|(_, o)| o.clone()).collect();
            for ((i, _), (info, meta)) in untagged.iter().zip(snap.stat_many(&objs, ATTR_META).await?) {
                let o = &mut page.objects[*i];
                o.size_bytes = info.size_bytes;
                (o.etag, o.last_modified_unix_ms) = match meta {
                    Some(raw) => {
                        let f = ListedFields::decode(&raw)?;
                        if f.sse.is_some() {
                            // Stored encrypted: the store's size counts the packages' tags.
                            o.size_bytes = f.size_bytes;
                        }
                        (f.etag, f.last_modified_unix_ms)
                    }
                    None => (String::new(), (info.mtime_ns / 1_000_000) as i64),
                };
            }
        }
        Ok(page)
    }

    /// ListObjectVersions: the same ordered walk, where each key's versions follow it newest first (see
    /// `versions`), so a page is one walk whatever the mix of keys and versions.
    pub(crate) async fn list_object_versions_impl(&self, bucket: &str, q: &VersionQuery) -> LayerResult<VersionPage> {
        let snap = self.store.snapshot();
        let coll = self.bucket_coll(&snap, bucket).await?;
        let mut page = VersionPage::default();
        let max_keys = q.max_keys.min(MAX_LIST_KEYS);
        if max_keys == 0 {
            return Ok(page);
        }
        let prefix = q.prefix.as_bytes();
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        let mut from = self.versions_start(&snap, &coll, bucket, q).await?;
        let mut returned = 0usize;
        // Whether the last thing returned is a common prefix (else a version): the markers name it.
        let mut last_is_prefix = false;
        // Every step returns an entry or common prefix, or ends the walk (or skips a prefix returned by the
        // previous page, once).
        'outer: for _ in 0..max_keys + 2 {
            let want = (max_keys - returned + 1).min(LIST_STEP_NAMES);
            let batch = snap.list_entries(&coll, prefix, &from, want).await?;
            let batch_len = batch.len();
            for entry in batch {
                let Some((key, suffix)) = versions::parse_name(&entry.name) else {
                    return Err(LayerError::Corrupt(format!("a stored name of bucket {bucket} is damaged")));
                };
                let key = String::from_utf8(key.to_vec())
                    .map_err(|_| LayerError::Corrupt(format!("a stored key of bucket {bucket} is not UTF-8")))?;
                if returned == max_keys {
                    break 'outer;
                }
                if let Some(d) = delim
                    && let Some(pos) = key[q.prefix.len()..].find(d)
                {
                    let cp = key[..q.prefix.len() + pos + d.len()].to_string();
                    from = match prefix_end(cp.as_bytes()) {
                        Some(f) => f,
                        None => break 'outer,
                    };
                    if cp.as_str() <= q.key_marker.as_str() {
                        continue 'outer;
                    }
                    last_is_prefix = true;
                    page.common_prefixes.push(cp);
                    returned += 1;
                    continue 'outer;
                }
                let mut tag = match entry.tag.as_deref().and_then(ListTag::decode) {
                    Some(t) => t,
                    // Written before listing tags existed: the metadata record is the truth.
                    None => ListTag::of(&crate::semantics::read_meta(&snap, &entry.obj, bucket, &key).await?),
                };
                let version_id = match suffix {
                    None => tag.version_id.take(),
                    Some(s) => versions::id_of_suffix(s),
                };
                last_is_prefix = false;
                page.versions.push(ListedVersion {
                    key,
                    version_id,
                    is_latest: suffix.is_none(),
                    delete_marker: tag.delete_marker,
                    size_bytes: tag.size_bytes,
                    etag: tag.etag,
                    last_modified_unix_ms: tag.last_modified_unix_ms,
                });
                returned += 1;
                from = entry.name;
                from.push(0);
            }
            if batch_len < want {
                return Ok(page);
            }
        }
        // Cut by the page size: the markers name the last thing returned.
        if last_is_prefix {
            page.next_key_marker = page.common_prefixes.last().cloned();
        } else if let Some(v) = page.versions.last() {
            page.next_key_marker = Some(v.key.clone());
            page.next_version_id_marker = Some(v.version_id.clone().unwrap_or_else(|| "null".into()));
        }
        Ok(page)
    }

    /// Where a versions page starts: the prefix, or just after the marker's key (all its versions), or
    /// just after the version the markers name.
    async fn versions_start(
        &self,
        snap: &S::Snapshot,
        coll: &S::Coll,
        bucket: &str,
        q: &VersionQuery,
    ) -> LayerResult<Vec<u8>> {
        if q.key_marker.is_empty() {
            return Ok(q.prefix.as_bytes().to_vec());
        }
        let after_key = key_successor(q.key_marker.as_bytes());
        let Some(v) = q.version_id_marker.as_deref().filter(|v| !v.is_empty()) else { return Ok(after_key) };
        match self.locate(snap, coll, bucket, &q.key_marker, v).await? {
            Some(found) => {
                let mut from = found.name;
                from.push(0);
                Ok(from)
            }
            // Deleted since the previous page: its key's versions after it cannot be told apart; go on
            // after the key.
            None => Ok(after_key),
        }
    }
}
