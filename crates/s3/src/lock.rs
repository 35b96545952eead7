//! Object lock on the wire: the lock headers of writes, retention and legal-hold bodies, and bucket lock
//! configurations, to and from the layer's types.

use mosaic_layer::{DefaultRetention, LockConfig, LockMode, LockRequest, MAX_RETENTION_DAYS, ObjectMeta, Retention};
use s3s::dto::{self, Timestamp};
use s3s::{S3Result, s3_error};

const DAYS_PER_YEAR: i64 = 365;

fn mode_of(m: &dto::ObjectLockRetentionMode) -> S3Result<LockMode> {
    match m.as_str() {
        "GOVERNANCE" => Ok(LockMode::Governance),
        "COMPLIANCE" => Ok(LockMode::Compliance),
        other => Err(s3_error!(MalformedXML, "unknown object lock mode {other:?}")),
    }
}

fn mode_dto(m: LockMode) -> dto::ObjectLockRetentionMode {
    dto::ObjectLockRetentionMode::from_static(match m {
        LockMode::Governance => dto::ObjectLockRetentionMode::GOVERNANCE,
        LockMode::Compliance => dto::ObjectLockRetentionMode::COMPLIANCE,
    })
}

fn unix_ms(t: &Timestamp) -> i64 {
    (time::OffsetDateTime::from(t.clone()).unix_timestamp_nanos() / 1_000_000) as i64
}

fn timestamp(ms: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

fn legal_hold_of(s: &dto::ObjectLockLegalHoldStatus) -> S3Result<bool> {
    match s.as_str() {
        "ON" => Ok(true),
        "OFF" => Ok(false),
        other => Err(s3_error!(MalformedXML, "unknown legal hold status {other:?}")),
    }
}

/// The x-amz-object-lock-* headers of a write. Mode and date come together or not at all.
pub fn lock_request(
    mode: &Option<dto::ObjectLockMode>,
    until: &Option<Timestamp>,
    hold: &Option<dto::ObjectLockLegalHoldStatus>,
) -> S3Result<LockRequest> {
    let retention = match (mode, until) {
        (None, None) => None,
        (Some(m), Some(u)) => {
            let mode = mode_of(&dto::ObjectLockRetentionMode::from(m.as_str().to_string()))
                .map_err(|_| s3_error!(InvalidArgument, "unknown x-amz-object-lock-mode"))?;
            Some(Retention { mode, retain_until_ms: unix_ms(u) })
        }
        _ => {
            return Err(s3_error!(
                InvalidArgument,
                "x-amz-object-lock-mode and x-amz-object-lock-retain-until-date must both be given"
            ));
        }
    };
    let legal_hold = match hold {
        Some(h) => legal_hold_of(h).map_err(|_| s3_error!(InvalidArgument, "unknown x-amz-object-lock-legal-hold"))?,
        None => false,
    };
    Ok(LockRequest { retention, legal_hold })
}

/// A PutObjectRetention body; an empty one removes the retention.
pub fn retention_of(r: &Option<dto::ObjectLockRetention>) -> S3Result<Option<Retention>> {
    let Some(r) = r else { return Ok(None) };
    match (&r.mode, &r.retain_until_date) {
        (None, None) => Ok(None),
        (Some(m), Some(u)) => Ok(Some(Retention { mode: mode_of(m)?, retain_until_ms: unix_ms(u) })),
        _ => Err(s3_error!(MalformedXML, "a retention needs both Mode and RetainUntilDate")),
    }
}

pub fn retention_dto(r: Option<Retention>) -> Option<dto::ObjectLockRetention> {
    r.map(|r| dto::ObjectLockRetention {
        mode: Some(mode_dto(r.mode)),
        retain_until_date: Some(timestamp(r.retain_until_ms)),
    })
}

pub fn legal_hold_on(h: &Option<dto::ObjectLockLegalHold>) -> S3Result<bool> {
    match h.as_ref().and_then(|h| h.status.as_ref()) {
        Some(s) => legal_hold_of(s),
        None => Err(s3_error!(MalformedXML, "a legal hold needs a Status")),
    }
}

pub fn legal_hold_dto(on: bool) -> dto::ObjectLockLegalHold {
    dto::ObjectLockLegalHold {
        status: Some(dto::ObjectLockLegalHoldStatus::from_static(if on {
            dto::ObjectLockLegalHoldStatus::ON
        } else {
            dto::ObjectLockLegalHoldStatus::OFF
        })),
    }
}

/// A PutObjectLockConfiguration body: Enabled, with an optional default retention in days or years.
pub fn config_of(c: &Option<dto::ObjectLockConfiguration>) -> S3Result<LockConfig> {
    let c = c.as_ref().ok_or_else(|| s3_error!(MalformedXML, "missing ObjectLockConfiguration"))?;
    let enabled = c.object_lock_enabled.as_ref().is_some_and(|e| e.as_str() == "Enabled");
    if !enabled {
        return Err(s3_error!(MalformedXML, "ObjectLockEnabled must be Enabled"));
    }
    let default_retention = match c.rule.as_ref().and_then(|r| r.default_retention.as_ref()) {
        None => None,
        Some(d) => {
            let mode =
                mode_of(d.mode.as_ref().ok_or_else(|| s3_error!(MalformedXML, "a default retention needs a Mode"))?)?;
            let days = match (d.days, d.years) {
                (Some(_), Some(_)) => return Err(s3_error!(MalformedXML, "give Days or Years, not both")),
                (Some(d), None) => i64::from(d),
                (None, Some(y)) => i64::from(y).saturating_mul(DAYS_PER_YEAR),
                (None, None) => return Err(s3_error!(MalformedXML, "a default retention needs Days or Years")),
            };
            if !(1..=i64::from(MAX_RETENTION_DAYS)).contains(&days) {
                return Err(crate::errors::invalid_retention_period());
            }
            Some(DefaultRetention { mode, days: days as u32 })
        }
    };
    Ok(LockConfig { enabled, default_retention })
}

pub fn config_dto(c: LockConfig) -> dto::ObjectLockConfiguration {
    dto::ObjectLockConfiguration {
        object_lock_enabled: Some(dto::ObjectLockEnabled::from_static(dto::ObjectLockEnabled::ENABLED)),
        rule: c.default_retention.map(|d| dto::ObjectLockRule {
            default_retention: Some(dto::DefaultRetention {
                days: Some(d.days as i32),
                mode: Some(mode_dto(d.mode)),
                years: None,
            }),
        }),
    }
}

/// The lock headers of a GET or HEAD.
pub struct LockHeaders {
    pub mode: Option<dto::ObjectLockMode>,
    pub until: Option<Timestamp>,
    pub legal_hold: Option<dto::ObjectLockLegalHoldStatus>,
}

pub fn headers_of(m: &ObjectMeta) -> LockHeaders {
    LockHeaders {
        mode: m.retention.map(|r| dto::ObjectLockMode::from(mode_dto(r.mode).as_str().to_string())),
        until: m.retention.map(|r| timestamp(r.retain_until_ms)),
        legal_hold: m
            .legal_hold
            .then(|| dto::ObjectLockLegalHoldStatus::from_static(dto::ObjectLockLegalHoldStatus::ON)),
    }
}
