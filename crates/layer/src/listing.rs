//! ListObjects: one ordered walk of the bucket's name index from the marker. A common prefix is recorded
//! and skipped with one seek past it; an object's size, ETag and mtime come from its name entry's listing
//! tag, so a page of 1,000 keys is one walk and no point lookup. Entries without a tag (written before tags
//! existed) are statted together in one batch.

use crate::error::{LayerError, LayerResult};
use crate::meta::{ListTag, ListedFields};
use crate::records::ATTR_META;
use crate::semantics::S3Semantics;
use crate::*;
use mosaic_store::{Snapshot, Store};

/// Names fetched per step of a listing walk.
const LIST_STEP_NAMES: usize = 1001;
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
        // Strictly after start_after: the smallest key greater than it is start_after + "\0".
        let mut from: Vec<u8> = if q.start_after.is_empty() {
            prefix.to_vec()
        } else {
            let mut f = q.start_after.as_bytes().to_vec();
            f.push(0);
            f
        };
        let mut returned = 0usize;
        // Objects of the page without a listing tag, statted together once the names are known: their
        // index in `page.objects` and handle.
        let mut untagged: Vec<(usize, S::Obj)> = Vec::new();
        // Every step returns a key or prefix, or ends the walk, except the one skip of a prefix that a
        // continuation already returned: at most max_keys + 2 steps, each of at most LIST_STEP_NAMES names.
        'outer: for _ in 0..max_keys + 2 {
            let want = (max_keys - returned + 1).min(LIST_STEP_NAMES);
            let batch = snap.list_entries(&coll, prefix, &from, want).await?;
            if batch.is_empty() {
                break;
            }
            let batch_len = batch.len();
            for entry in batch {
                let key = String::from_utf8(entry.name.clone())
                    .map_err(|_| LayerError::Corrupt(format!("a stored key of bucket {bucket} is not UTF-8")))?;
                if returned == max_keys {
                    page.next_marker =
                        page.objects.last().map(|o| o.key.clone()).max(page.common_prefixes.last().cloned());
                    break 'outer;
                }
                if let Some(d) = delim
                    && let Some(pos) = key[q.prefix.len()..].find(d)
                {
                    let cp = key[..q.prefix.len() + pos + d.len()].to_string();
                    // Skip everything under this common prefix with one seek.
                    from = match prefix_end(cp.as_bytes()) {
                        Some(f) => f,
                        None => break 'outer,
                    };
                    // A continuation that ended on this prefix has already returned it.
                    if cp.as_str() <= q.start_after.as_str() {
                        continue 'outer;
                    }
                    page.common_prefixes.push(cp);
                    returned += 1;
                    continue 'outer;
                }
                let tag = entry.tag.as_deref().and_then(ListTag::decode);
                if tag.is_none() {
                    untagged.push((page.objects.len(), entry.obj.clone()));
                }
                let tag = tag.unwrap_or_default();
                page.objects.push(ListedObject {
                    key,
                    size_bytes: tag.size_bytes,
                    etag: tag.etag,
                    last_modified_unix_ms: tag.last_modified_unix_ms,
                });
                returned += 1;
                from = entry.name;
                from.push(0);
            }
            if batch_len < want {
                break;
            }
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
                        (f.etag, f.last_modified_unix_ms)
                    }
                    None => (String::new(), (info.mtime_ns / 1_000_000) as i64),
                };
            }
        }
        Ok(page)
    }
}
