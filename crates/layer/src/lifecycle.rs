//! Lifecycle: a bucket's rules (kept in its record) and the pass that applies them: current versions
//! expire by age or date, noncurrent versions by days since they became noncurrent and by count, a delete
//! marker left alone is removed, incomplete multipart uploads are aborted.
//!
//! A pass walks every bucket with rules in order and decides each action on what it read; every action
//! is conditional on that (an expiring current version is deleted only if its ETag is still the one seen,
//! a version is removed by id, an upload by id), so a pass repeated, cut short by a restart or racing a
//! client never deletes twice or deletes what changed: the next pass simply finds less to do. Its writes
//! run in the background IO class. A "day" is configurable (`day_ms`) so that tests run days in seconds.

use crate::error::{LayerError, LayerResult};
use crate::semantics::S3Semantics;
use crate::*;
use mosaic_store::Store;
use serde::{Deserialize, Serialize};

/// Most rules of one bucket (S3's limit).
pub const MAX_LIFECYCLE_RULES: usize = 1000;
/// Longest rule id.
const MAX_RULE_ID_BYTES: usize = 255;
/// Entries of a versions listing per step of a pass.
const PASS_PAGE_KEYS: usize = 1000;
/// Most entries one pass walks in one bucket, so that a pass is bounded; the next pass goes on.
pub const MAX_PASS_ENTRIES_PER_BUCKET: usize = 10_000_000;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LifecycleFilter {
    pub prefix: String,
    /// The prefix was given as the rule's own Prefix (S3's older form, outside a Filter), and is answered
    /// so. Absent in records written before it existed (read as false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefix_outside_filter: bool,
    pub tags: Vec<(String, String)>,
    pub size_greater_than: Option<u64>,
    pub size_less_than: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LifecycleRule {
    pub id: String,
    pub enabled: bool,
    pub filter: LifecycleFilter,
    /// Current versions expire this many days after they were written.
    pub expiration_days: Option<u32>,
    /// ... or on this date.
    pub expiration_date_ms: Option<i64>,
    /// A current delete marker with no other version of its key is removed.
    pub expired_delete_marker: bool,
    /// Noncurrent versions expire this many days after they became noncurrent ...
    pub noncurrent_days: Option<u32>,
    /// ... beyond the newest this many noncurrent versions, which are kept.
    pub newer_noncurrent_versions: Option<u32>,
    /// Incomplete multipart uploads are aborted this many days after they began.
    pub abort_upload_days: Option<u32>,
}

impl LifecycleRule {
    fn validate(&self) -> LayerResult<()> {
        let bad = |m: &str| Err(LayerError::InvalidArgument(format!("lifecycle rule {:?}: {m}", self.id)));
        if self.id.len() > MAX_RULE_ID_BYTES {
            return bad("the ID is longer than 255 characters");
        }
        let acts = self.expiration_days.is_some()
            || self.expiration_date_ms.is_some()
            || self.expired_delete_marker
            || self.noncurrent_days.is_some()
            || self.abort_upload_days.is_some();
        if !acts {
            return bad("a rule needs at least one action");
        }
        if self.expiration_days.is_some() && self.expiration_date_ms.is_some() {
            return bad("Expiration takes Days or Date, not both");
        }
        if self.expired_delete_marker && (self.expiration_days.is_some() || self.expiration_date_ms.is_some()) {
            return bad("ExpiredObjectDeleteMarker cannot be combined with Days or Date");
        }
        for d in [self.expiration_days, self.noncurrent_days, self.abort_upload_days].into_iter().flatten() {
            if d == 0 {
                return bad("days must be positive");
            }
        }
        if self.newer_noncurrent_versions.is_some() && self.noncurrent_days.is_none() {
            return bad("NewerNoncurrentVersions needs NoncurrentDays");
        }
        if self.abort_upload_days.is_some() && !self.filter.tags.is_empty() {
            return bad("AbortIncompleteMultipartUpload cannot be filtered by tags");
        }
        if let (Some(g), Some(l)) = (self.filter.size_greater_than, self.filter.size_less_than)
            && g >= l
        {
            return bad("ObjectSizeGreaterThan must be less than ObjectSizeLessThan");
        }
        crate::objects::validate_tags(&self.filter.tags)
    }

    fn matches(&self, key: &str, size: u64) -> bool {
        key.starts_with(&self.filter.prefix)
            && self.filter.size_greater_than.is_none_or(|g| size > g)
            && self.filter.size_less_than.is_none_or(|l| size < l)
    }
}

pub fn validate_lifecycle(rules: &[LifecycleRule]) -> LayerResult<()> {
    if rules.is_empty() || rules.len() > MAX_LIFECYCLE_RULES {
        return Err(LayerError::MalformedXml(format!(
            "a lifecycle configuration has 1 to {MAX_LIFECYCLE_RULES} rules"
        )));
    }
    for (i, r) in rules.iter().enumerate() {
        r.validate()?;
        if !r.id.is_empty() && rules[..i].iter().any(|o| o.id == r.id) {
            return Err(LayerError::InvalidArgument(format!("the rule ID {:?} is used twice", r.id)));
        }
    }
    Ok(())
}

/// A calendar day, in which S3 states expiry dates (x-amz-expiration), whatever `day_ms` a pass uses.
const CALENDAR_DAY_MS: i64 = 86_400_000;

/// S3's expiry date of a version written at `written_unix_ms` under an Expiration of `days`: that many days
/// later, rounded up to the next midnight UTC.
pub fn expiry_after_days(written_unix_ms: i64, days: u32) -> i64 {
    let at = written_unix_ms.saturating_add(i64::from(days).saturating_mul(CALENDAR_DAY_MS));
    let midnight = at.div_euclid(CALENDAR_DAY_MS).saturating_mul(CALENDAR_DAY_MS);
    let rounded = if midnight == at { at } else { midnight.saturating_add(CALENDAR_DAY_MS) };
    debug_assert!(rounded >= at && rounded.rem_euclid(CALENDAR_DAY_MS) == 0 || rounded == i64::MAX);
    rounded
}

/// What one pass did, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LifecycleReport {
    pub buckets: u64,
    pub expired_current: u64,
    pub expired_noncurrent: u64,
    pub removed_delete_markers: u64,
    pub aborted_uploads: u64,
    /// Actions refused (object lock) or overtaken (the object changed meanwhile): left for later passes.
    pub skipped: u64,
}

/// A version seen by a pass, and the time it became noncurrent (the next newer version's time).
struct Seen {
    v: ListedVersion,
    noncurrent_since_ms: Option<i64>,
    /// Its rank among its key's noncurrent versions, newest 0.
    noncurrent_rank: usize,
    /// The key has no other version than this one.
    alone: bool,
}

impl<S: Store> S3Semantics<S> {
    pub(crate) async fn put_lifecycle_impl(&self, bucket: &str, rules: Option<Vec<LifecycleRule>>) -> LayerResult<()> {
        if let Some(r) = &rules {
            validate_lifecycle(r)?;
        }
        self.update_bucket_record(bucket, |rec| {
            rec.lifecycle = rules.clone();
            Ok(())
        })
        .await
    }

    /// One lifecycle pass over every bucket, at `now_ms`, where a day lasts `day_ms`.
    pub async fn lifecycle_pass(&self, now_ms: i64, day_ms: i64) -> LayerResult<LifecycleReport> {
        assert!(day_ms > 0, "a day has a length");
        let mut report = LifecycleReport::default();
        for b in self.list_buckets_impl().await? {
            let rules: Vec<LifecycleRule> = match self.bucket_record(&b.name).await {
                Ok(rec) => rec.lifecycle.unwrap_or_default(),
                Err(LayerError::NoSuchBucket) => continue,
                Err(e) => return Err(e),
            }
            .into_iter()
            .filter(|r| r.enabled)
            .collect();
            if rules.is_empty() {
                continue;
            }
            report.buckets += 1;
            match self.lifecycle_bucket(&b.name, &rules, now_ms, day_ms, &mut report).await {
                Ok(()) | Err(LayerError::NoSuchBucket) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    async fn lifecycle_bucket(
        &self,
        bucket: &str,
        rules: &[LifecycleRule],
        now_ms: i64,
        day_ms: i64,
        report: &mut LifecycleReport,
    ) -> LayerResult<()> {
        let days = |n: u32| i64::from(n).saturating_mul(day_ms);
        if rules.iter().any(|r| r.abort_upload_days.is_some()) {
            for u in self.list_uploads_impl(bucket, "").await? {
                let due = rules.iter().any(|r| {
                    r.filter.tags.is_empty()
                        && u.key.starts_with(&r.filter.prefix)
                        && r.abort_upload_days.is_some_and(|d| now_ms >= u.initiated_unix_ms.saturating_add(days(d)))
                });
                if due {
                    match self.abort_multipart_impl(bucket, &u.key, &u.upload_id).await {
                        Ok(()) => report.aborted_uploads += 1,
                        Err(LayerError::NoSuchUpload) => report.skipped += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        let mut q = VersionQuery { max_keys: PASS_PAGE_KEYS, ..Default::default() };
        let mut walked = 0usize;
        // One key's versions at a time (newest first), carried across pages.
        let mut group: Vec<ListedVersion> = Vec::new();
        loop {
            let page = self.list_object_versions_impl(bucket, &q).await?;
            walked += page.versions.len();
            let more = page.next_key_marker.is_some() && walked < MAX_PASS_ENTRIES_PER_BUCKET;
            for v in page.versions {
                if group.first().is_some_and(|g| g.key != v.key) {
                    self.lifecycle_key(bucket, rules, std::mem::take(&mut group), now_ms, day_ms, report).await?;
                }
                group.push(v);
            }
            if !more {
                break;
            }
            q.key_marker = page.next_key_marker.unwrap_or_default();
            q.version_id_marker = page.next_version_id_marker;
        }
        if !group.is_empty() {
            self.lifecycle_key(bucket, rules, group, now_ms, day_ms, report).await?;
        }
        Ok(())
    }

    /// x-amz-expiration of a current version: the bucket's rules from its cached state, the version's tags
    /// read only when a matching rule filters by tags and the version has some.
    pub(crate) async fn expiration_of_impl(
        &self,
        bucket: &str,
        key: &str,
        meta: &ObjectMeta,
    ) -> LayerResult<Option<ObjectExpiration>> {
        if meta.delete_marker {
            return Ok(None);
        }
        let state = self.bucket_state(bucket).await?;
        let Some(rules) = state.lifecycle.as_deref() else { return Ok(None) };
        let mut tags: Option<Vec<(String, String)>> = None;
        let mut earliest: Option<ObjectExpiration> = None;
        for r in rules.iter().filter(|r| r.enabled && r.matches(key, meta.size_bytes)) {
            let date_unix_ms = match (r.expiration_days, r.expiration_date_ms) {
                (Some(days), _) => expiry_after_days(meta.last_modified_unix_ms, days),
                (None, Some(date)) => date,
                (None, None) => continue,
            };
            if !r.filter.tags.is_empty() {
                if meta.tag_count == 0 {
                    continue;
                }
                if tags.is_none() {
                    tags = Some(self.get_tags_impl(bucket, key, meta.version_id.as_deref()).await?);
                }
                let have = tags.as_deref().unwrap_or_default();
                if !r.filter.tags.iter().all(|t| have.contains(t)) {
                    continue;
                }
            }
            if earliest.as_ref().is_none_or(|e| date_unix_ms < e.date_unix_ms) {
                earliest = Some(ObjectExpiration { date_unix_ms, rule_id: r.id.clone() });
            }
        }
        Ok(earliest)
    }

    /// Applies the rules to one key's versions (newest first).
    async fn lifecycle_key(
        &self,
        bucket: &str,
        rules: &[LifecycleRule],
        versions: Vec<ListedVersion>,
        now_ms: i64,
        day_ms: i64,
        report: &mut LifecycleReport,
    ) -> LayerResult<()> {
        let days = |n: u32| i64::from(n).saturating_mul(day_ms);
        let alone = versions.len() == 1;
        let mut seen = Vec::with_capacity(versions.len());
        let mut newer_ms: Option<i64> = None;
        let mut rank = 0;
        for v in versions {
            let since = if v.is_latest { None } else { newer_ms };
            newer_ms = Some(v.last_modified_unix_ms);
            let noncurrent_rank = if v.is_latest { 0 } else { rank };
            if !v.is_latest {
                rank += 1;
            }
            seen.push(Seen { v, noncurrent_since_ms: since, noncurrent_rank, alone });
        }
        let mut tags: Option<Vec<(String, String)>> = None;
        for s in seen {
            let v = &s.v;
            let mut due = false;
            for r in rules.iter().filter(|r| r.matches(&v.key, v.size_bytes)) {
                if !r.filter.tags.is_empty() {
                    if v.delete_marker {
                        continue;
                    }
                    if tags.is_none() || !v.is_latest {
                        let id = v.version_id.as_deref().unwrap_or("null");
                        tags = Some(self.get_tags_impl(bucket, &v.key, Some(id)).await.unwrap_or_default());
                    }
                    let have = tags.as_deref().unwrap_or_default();
                    if !r.filter.tags.iter().all(|t| have.contains(t)) {
                        continue;
                    }
                }
                due |= if v.is_latest && !v.delete_marker {
                    r.expiration_days.is_some_and(|d| now_ms >= v.last_modified_unix_ms.saturating_add(days(d)))
                        || r.expiration_date_ms.is_some_and(|d| now_ms >= d)
                } else if v.is_latest {
                    // A delete marker with no version left behind it; Days/Date rules remove it too.
                    s.alone
                        && (r.expired_delete_marker
                            || r.expiration_days
                                .is_some_and(|d| now_ms >= v.last_modified_unix_ms.saturating_add(days(d))))
                } else {
                    let kept = r.newer_noncurrent_versions.is_some_and(|n| s.noncurrent_rank < n as usize);
                    !kept
                        && r.noncurrent_days
                            .is_some_and(|d| s.noncurrent_since_ms.is_some_and(|t| now_ms >= t.saturating_add(days(d))))
                };
            }
            if !due {
                continue;
            }
            self.lifecycle_act(bucket, v, report).await?;
        }
        Ok(())
    }

    async fn lifecycle_act(&self, bucket: &str, v: &ListedVersion, report: &mut LifecycleReport) -> LayerResult<()> {
        let versioning = self.versioning(bucket).await?;
        let (opts, counter) = if v.is_latest && !v.delete_marker && !versioning.is_unversioned() {
            // A new delete marker, only if the current version is still the one seen.
            let o = DeleteOptions { if_match: Some(v.etag.clone()), background: true, ..Default::default() };
            (o, &mut report.expired_current)
        } else {
            let id = v.version_id.clone().unwrap_or_else(|| "null".into());
            let o = DeleteOptions {
                version_id: Some(id),
                if_match: (!v.delete_marker).then(|| v.etag.clone()),
                background: true,
                ..Default::default()
            };
            let counter = match (v.is_latest, v.delete_marker) {
                (true, true) => &mut report.removed_delete_markers,
                (true, false) => &mut report.expired_current,
                (false, _) => &mut report.expired_noncurrent,
            };
            (o, counter)
        };
        match self.delete_object_impl(bucket, &v.key, &opts).await {
            Ok(_) => *counter += 1,
            Err(LayerError::PreconditionFailed | LayerError::ObjectLocked(_) | LayerError::Conflict) => {
                report.skipped += 1
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(f: impl FnOnce(&mut LifecycleRule)) -> LifecycleRule {
        let mut r = LifecycleRule { id: "r".into(), enabled: true, expiration_days: Some(1), ..Default::default() };
        f(&mut r);
        r
    }

    #[test]
    fn rules_are_validated() {
        assert!(validate_lifecycle(&[rule(|_| {})]).is_ok());
        assert!(validate_lifecycle(&[]).is_err());
        assert!(validate_lifecycle(&[rule(|r| r.id = "x".repeat(256))]).is_err());
        assert!(validate_lifecycle(&[rule(|r| r.id = "x".repeat(255))]).is_ok());
        assert!(validate_lifecycle(&[rule(|_| {}), rule(|_| {})]).is_err(), "ids are unique");
        assert!(validate_lifecycle(&[rule(|r| r.expiration_days = None)]).is_err(), "no action");
        assert!(validate_lifecycle(&[rule(|r| r.expiration_days = Some(0))]).is_err());
        assert!(validate_lifecycle(&[rule(|r| r.expiration_date_ms = Some(1))]).is_err(), "days and date");
        assert!(validate_lifecycle(&[rule(|r| r.expired_delete_marker = true)]).is_err());
        assert!(validate_lifecycle(&[rule(|r| r.newer_noncurrent_versions = Some(2))]).is_err());
        let many: Vec<_> = (0..=MAX_LIFECYCLE_RULES).map(|i| rule(|r| r.id = format!("r{i}"))).collect();
        assert!(validate_lifecycle(&many).is_err());
        assert!(validate_lifecycle(&many[..MAX_LIFECYCLE_RULES]).is_ok());
        let sized = rule(|r| {
            r.filter.size_greater_than = Some(10);
            r.filter.size_less_than = Some(10);
        });
        assert!(validate_lifecycle(&[sized]).is_err());
    }

    #[test]
    fn expiry_dates_are_the_next_midnight_after_the_days() {
        const DAY: i64 = CALENDAR_DAY_MS;
        // 2026-11-27 05:13:18 UTC plus one day: midnight at the start of 2026-11-29.
        let written = 1_795_756_398_000;
        assert_eq!(expiry_after_days(written, 1), (written / DAY + 2) * DAY);
        // Written exactly at midnight: that midnight plus the days.
        assert_eq!(expiry_after_days(10 * DAY, 3), 13 * DAY);
        assert_eq!(expiry_after_days(10 * DAY + 1, 3), 14 * DAY);
        assert_eq!(expiry_after_days(i64::MAX - 5, u32::MAX), i64::MAX, "saturates, never wraps");
    }

    #[test]
    fn filters_match_prefix_and_size() {
        let r = rule(|r| {
            r.filter.prefix = "logs/".into();
            r.filter.size_greater_than = Some(10);
            r.filter.size_less_than = Some(100);
        });
        assert!(r.matches("logs/a", 50));
        assert!(!r.matches("data/a", 50));
        assert!(!r.matches("logs/a", 10));
        assert!(!r.matches("logs/a", 100));
    }
}
