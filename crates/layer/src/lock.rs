//! Object lock (WORM): a bucket's lock configuration and default retention, each version's retention and
//! legal hold, and the rules that keep a locked version from being removed.
//!
//! A version's lock lives in its metadata record. Everything that removes a version for good or changes
//! its lock decides on the record it read and asserts, in the same transaction, that the record is still
//! that one: a concurrent change of the lock (a retention extended, a legal hold set) fails the
//! transaction instead of slipping past the check. A delete without a version id only adds a delete
//! marker and is never refused.

use crate::error::{LayerError, LayerResult};
use crate::meta::ObjectMeta;
use crate::records::*;
use crate::semantics::S3Semantics;
use crate::*;
use mosaic_store::Store;
use serde::{Deserialize, Serialize};

/// Longest default retention (S3 allows up to 100 years).
pub const MAX_RETENTION_DAYS: u32 = 36_500;
const MS_PER_DAY: i64 = 86_400_000;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Governance,
    Compliance,
}

/// A version's retention: until when it cannot be removed, and how strictly.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub mode: LockMode,
    pub retain_until_ms: i64,
}

/// A bucket's default retention, applied to new versions that name none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultRetention {
    pub mode: LockMode,
    pub days: u32,
}

/// A bucket's lock configuration. Once enabled, object lock stays enabled.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockConfig {
    pub enabled: bool,
    pub default_retention: Option<DefaultRetention>,
}

impl LockConfig {
    pub fn validate(&self) -> LayerResult<()> {
        if !self.enabled {
            return Err(LayerError::MalformedXml("ObjectLockEnabled must be Enabled".into()));
        }
        if let Some(d) = self.default_retention
            && !(1..=MAX_RETENTION_DAYS).contains(&d.days)
        {
            return Err(LayerError::InvalidRetentionPeriod);
        }
        Ok(())
    }
}

/// What a write says about the lock of the version it makes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockRequest {
    pub retention: Option<Retention>,
    pub legal_hold: bool,
}

impl LockRequest {
    pub fn is_empty(&self) -> bool {
        self.retention.is_none() && !self.legal_hold
    }
}

/// Whether a version may be removed for good now; why not if not. `bypass_governance`: the request asked to
/// bypass GOVERNANCE retention and may.
pub(crate) fn check_removable(meta: &ObjectMeta, bypass_governance: bool, now_ms: i64) -> LayerResult<()> {
    if meta.legal_hold {
        return Err(LayerError::ObjectLocked("the version is under a legal hold".into()));
    }
    match meta.retention {
        Some(r) if r.retain_until_ms > now_ms => match r.mode {
            LockMode::Compliance => Err(LayerError::ObjectLocked("the version is under COMPLIANCE retention".into())),
            LockMode::Governance if !bypass_governance => Err(LayerError::ObjectLocked(
                "the version is under GOVERNANCE retention; bypass it with x-amz-bypass-governance-retention".into(),
            )),
            LockMode::Governance => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Whether a version's retention may change from `old` to `new` (None: removed).
fn check_retention_change(
    old: Option<Retention>,
    new: Option<Retention>,
    bypass_governance: bool,
    now_ms: i64,
) -> LayerResult<()> {
    let Some(old) = old.filter(|o| o.retain_until_ms > now_ms) else { return Ok(()) };
    let extends = new.is_some_and(|n| n.mode == old.mode && n.retain_until_ms >= old.retain_until_ms);
    if extends {
        return Ok(());
    }
    match old.mode {
        LockMode::Compliance => {
            Err(LayerError::ObjectLocked("a COMPLIANCE retention can only be extended until it expires".into()))
        }
        LockMode::Governance if bypass_governance => Ok(()),
        LockMode::Governance => Err(LayerError::ObjectLocked(
            "shortening or removing a GOVERNANCE retention needs x-amz-bypass-governance-retention".into(),
        )),
    }
}

impl<S: Store> S3Semantics<S> {
    /// The lock of a new version in `bucket`: the request's, else the bucket's default retention. A lock
    /// asked for in a bucket without object lock is refused.
    pub(crate) async fn lock_of_new_version(&self, bucket: &str, req: &LockRequest) -> LayerResult<LockRequest> {
        let cfg = self.bucket_state(bucket).await?.object_lock;
        match cfg {
            None if req.is_empty() => Ok(LockRequest::default()),
            None => Err(LayerError::InvalidRequest("Bucket is missing Object Lock Configuration".into())),
            Some(cfg) => {
                let mut out = *req;
                if out.retention.is_none()
                    && let Some(d) = cfg.default_retention
                {
                    let until = now_ms().saturating_add(i64::from(d.days).saturating_mul(MS_PER_DAY));
                    out.retention = Some(Retention { mode: d.mode, retain_until_ms: until });
                }
                Ok(out)
            }
        }
    }

    pub(crate) async fn put_lock_config_impl(&self, bucket: &str, cfg: LockConfig) -> LayerResult<()> {
        cfg.validate()?;
        self.update_bucket_record(bucket, |rec| {
            if rec.object_lock.is_none() && rec.versioning != Versioning::Enabled {
                return Err(LayerError::InvalidBucketState(
                    "object lock needs versioning enabled on the bucket".into(),
                ));
            }
            rec.versioning = Versioning::Enabled;
            rec.object_lock = Some(cfg);
            Ok(())
        })
        .await
    }

    /// Sets or removes a version's retention, or sets its legal hold, under the rules of its current lock.
    pub(crate) async fn change_lock_impl(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        bypass_governance: bool,
    ) -> LayerResult<()> {
        validate_key(key)?;
        if self.bucket_record(bucket).await?.object_lock.is_none() {
            return Err(LayerError::InvalidRequest("Bucket is missing Object Lock Configuration".into()));
        }
        self.change_meta(bucket, key, version_id, |meta| {
            match change {
                LockChange::Retention(r) => {
                    check_retention_change(meta.retention, r, bypass_governance, now_ms())?;
                    meta.retention = r;
                }
                LockChange::LegalHold(on) => meta.legal_hold = on,
            }
            Ok(())
        })
        .await
    }
}

/// A change of a version's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockChange {
    Retention(Option<Retention>),
    LegalHold(bool),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked(mode: LockMode, until: i64, hold: bool) -> ObjectMeta {
        ObjectMeta {
            retention: Some(Retention { mode, retain_until_ms: until }),
            legal_hold: hold,
            ..Default::default()
        }
    }

    #[test]
    fn removal_is_refused_while_locked() {
        let now = 1_000;
        let c = locked(LockMode::Compliance, now + 1, false);
        assert!(check_removable(&c, true, now).is_err(), "COMPLIANCE: nobody, bypass or not");
        assert!(check_removable(&c, true, now + 1).is_ok(), "expired");
        let g = locked(LockMode::Governance, now + 1, false);
        assert!(check_removable(&g, false, now).is_err());
        assert!(check_removable(&g, true, now).is_ok());
        let held = locked(LockMode::Governance, 0, true);
        assert!(check_removable(&held, true, now).is_err(), "a legal hold holds whatever the retention");
        assert!(check_removable(&ObjectMeta::default(), false, now).is_ok());
    }

    #[test]
    fn retention_changes_follow_the_mode() {
        let now = 1_000;
        let r = |mode, until| Some(Retention { mode, retain_until_ms: until });
        let (c, g) = (LockMode::Compliance, LockMode::Governance);
        assert!(check_retention_change(r(c, 2_000), r(c, 3_000), false, now).is_ok(), "extended");
        assert!(check_retention_change(r(c, 2_000), r(c, 1_500), true, now).is_err(), "shortened");
        assert!(check_retention_change(r(c, 2_000), r(g, 3_000), true, now).is_err(), "weakened");
        assert!(check_retention_change(r(c, 2_000), None, true, now).is_err(), "removed");
        assert!(check_retention_change(r(c, 500), None, false, now).is_ok(), "expired");
        assert!(check_retention_change(r(g, 2_000), r(g, 1_500), false, now).is_err());
        assert!(check_retention_change(r(g, 2_000), r(g, 1_500), true, now).is_ok());
        assert!(check_retention_change(r(g, 2_000), r(c, 2_000), true, now).is_ok(), "strengthened with bypass");
        assert!(check_retention_change(None, r(g, 2_000), false, now).is_ok());
    }

    #[test]
    fn configurations_are_validated() {
        let d = |days| LockConfig {
            enabled: true,
            default_retention: Some(DefaultRetention { mode: LockMode::Governance, days }),
        };
        assert!(d(1).validate().is_ok());
        assert!(d(MAX_RETENTION_DAYS).validate().is_ok());
        assert_eq!(d(0).validate(), Err(LayerError::InvalidRetentionPeriod));
        assert_eq!(d(MAX_RETENTION_DAYS + 1).validate(), Err(LayerError::InvalidRetentionPeriod));
        assert!(LockConfig::default().validate().is_err());
    }
}
