//! Lifecycle configurations on the wire, to and from the layer's rules. Transitions to other storage
//! classes are refused: Mosaic has one storage class.

use mosaic_layer::{LifecycleFilter, LifecycleRule};
use s3s::dto::{self, Timestamp};
use s3s::{S3Result, s3_error};

fn unix_ms(t: &Timestamp) -> i64 {
    (time::OffsetDateTime::from(t.clone()).unix_timestamp_nanos() / 1_000_000) as i64
}

fn timestamp(ms: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

fn days(d: Option<i32>, what: &str) -> S3Result<Option<u32>> {
    match d {
        None => Ok(None),
        Some(d) if d > 0 => Ok(Some(d as u32)),
        Some(_) => Err(s3_error!(InvalidArgument, "{what} must be a positive number of days")),
    }
}

/// An Expiration Date: S3 takes only midnight UTC (a date, in ISO 8601).
fn expiration_date(t: Option<&Timestamp>) -> S3Result<Option<i64>> {
    const DAY_MS: i64 = 86_400_000;
    match t.map(unix_ms) {
        Some(ms) if ms.rem_euclid(DAY_MS) != 0 => {
            Err(s3_error!(InvalidArgument, "'Date' must be at midnight GMT (an ISO 8601 date such as 2030-01-01)"))
        }
        other => Ok(other),
    }
}

fn size(s: Option<i64>) -> S3Result<Option<u64>> {
    match s {
        None => Ok(None),
        Some(s) if s >= 0 => Ok(Some(s as u64)),
        Some(_) => Err(s3_error!(InvalidArgument, "object sizes in filters must not be negative")),
    }
}

fn tags_of(t: &[dto::Tag]) -> S3Result<Vec<(String, String)>> {
    t.iter()
        .map(|t| {
            let k = t.key.clone().ok_or_else(|| s3_error!(MalformedXML, "a tag needs a Key"))?;
            Ok((k, t.value.clone().unwrap_or_default()))
        })
        .collect()
}

fn filter_of(r: &dto::LifecycleRule) -> S3Result<LifecycleFilter> {
    let mut f = LifecycleFilter::default();
    match &r.filter {
        None => {
            f.prefix = r.prefix.clone().unwrap_or_default();
            f.prefix_outside_filter = r.prefix.is_some();
        }
        Some(x) => {
            if r.prefix.is_some() {
                return Err(s3_error!(MalformedXML, "a rule takes Prefix or Filter, not both"));
            }
            f.prefix = x.prefix.clone().unwrap_or_default();
            f.tags = x.tag.as_ref().map(|t| tags_of(std::slice::from_ref(t))).transpose()?.unwrap_or_default();
            f.size_greater_than = size(x.object_size_greater_than)?;
            f.size_less_than = size(x.object_size_less_than)?;
            if let Some(and) = &x.and {
                if x.prefix.is_some() || x.tag.is_some() {
                    return Err(s3_error!(MalformedXML, "a Filter takes And or one condition"));
                }
                f.prefix = and.prefix.clone().unwrap_or_default();
                f.tags = tags_of(and.tags.as_deref().unwrap_or_default())?;
                f.size_greater_than = size(and.object_size_greater_than)?;
                f.size_less_than = size(and.object_size_less_than)?;
            }
        }
    }
    Ok(f)
}

/// S3 names a rule given without an ID: unique within the configuration (its position) and across puts.
fn generated_id(index: usize) -> String {
    use sha2::Digest;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let digest = sha2::Sha256::digest(format!("{now}/{index}").as_bytes());
    format!("{}-{index}", hex::encode(&digest[..8]))
}

pub fn rules_of(c: &Option<dto::BucketLifecycleConfiguration>) -> S3Result<Vec<LifecycleRule>> {
    let c = c.as_ref().ok_or_else(|| s3_error!(MalformedXML, "missing LifecycleConfiguration"))?;
    let mut out = Vec::with_capacity(c.rules.len());
    for (index, r) in c.rules.iter().enumerate() {
        let enabled = match r.status.as_str() {
            "Enabled" => true,
            "Disabled" => false,
            other => return Err(s3_error!(MalformedXML, "unknown rule status {other:?}")),
        };
        if r.transitions.as_ref().is_some_and(|t| !t.is_empty())
            || r.noncurrent_version_transitions.as_ref().is_some_and(|t| !t.is_empty())
        {
            return Err(s3_error!(InvalidArgument, "transitions need another storage class; Mosaic has one"));
        }
        let exp = r.expiration.as_ref();
        let nc = r.noncurrent_version_expiration.as_ref();
        out.push(LifecycleRule {
            id: r.id.clone().filter(|i| !i.is_empty()).unwrap_or_else(|| generated_id(index)),
            enabled,
            filter: filter_of(r)?,
            expiration_days: days(exp.and_then(|e| e.days), "Expiration Days")?,
            expiration_date_ms: expiration_date(exp.and_then(|e| e.date.as_ref()))?,
            expired_delete_marker: exp.and_then(|e| e.expired_object_delete_marker).unwrap_or(false),
            noncurrent_days: days(nc.and_then(|n| n.noncurrent_days), "NoncurrentDays")?,
            newer_noncurrent_versions: match nc.and_then(|n| n.newer_noncurrent_versions) {
                None => None,
                Some(n) if n > 0 => Some(n as u32),
                Some(_) => return Err(s3_error!(InvalidArgument, "NewerNoncurrentVersions must be positive")),
            },
            abort_upload_days: days(
                r.abort_incomplete_multipart_upload.as_ref().and_then(|a| a.days_after_initiation),
                "DaysAfterInitiation",
            )?,
        });
    }
    Ok(out)
}

pub fn rules_dto(rules: &[LifecycleRule]) -> Vec<dto::LifecycleRule> {
    rules
        .iter()
        .map(|r| {
            let f = &r.filter;
            let tag = |(k, v): &(String, String)| dto::Tag { key: Some(k.clone()), value: Some(v.clone()) };
            let simple = f.tags.len() <= 1 && f.size_greater_than.is_none() && f.size_less_than.is_none();
            let legacy = f.prefix_outside_filter && f.tags.is_empty() && simple;
            let filter = if simple && f.tags.is_empty() {
                dto::LifecycleRuleFilter { prefix: Some(f.prefix.clone()), ..Default::default() }
            } else if simple && f.prefix.is_empty() {
                dto::LifecycleRuleFilter { tag: f.tags.first().map(tag), ..Default::default() }
            } else {
                dto::LifecycleRuleFilter {
                    and: Some(dto::LifecycleRuleAndOperator {
                        prefix: Some(f.prefix.clone()),
                        tags: Some(f.tags.iter().map(tag).collect()),
                        object_size_greater_than: f.size_greater_than.map(|s| s as i64),
                        object_size_less_than: f.size_less_than.map(|s| s as i64),
                    }),
                    ..Default::default()
                }
            };
            let has_exp = r.expiration_days.is_some() || r.expiration_date_ms.is_some() || r.expired_delete_marker;
            dto::LifecycleRule {
                id: Some(r.id.clone()).filter(|i| !i.is_empty()),
                status: dto::ExpirationStatus::from_static(if r.enabled {
                    dto::ExpirationStatus::ENABLED
                } else {
                    dto::ExpirationStatus::DISABLED
                }),
                filter: (!legacy).then_some(filter),
                expiration: has_exp.then(|| dto::LifecycleExpiration {
                    days: r.expiration_days.map(|d| d as i32),
                    date: r.expiration_date_ms.map(timestamp),
                    expired_object_delete_marker: r.expired_delete_marker.then_some(true),
                }),
                noncurrent_version_expiration: r.noncurrent_days.map(|d| dto::NoncurrentVersionExpiration {
                    noncurrent_days: Some(d as i32),
                    newer_noncurrent_versions: r.newer_noncurrent_versions.map(|n| n as i32),
                }),
                abort_incomplete_multipart_upload: r
                    .abort_upload_days
                    .map(|d| dto::AbortIncompleteMultipartUpload { days_after_initiation: Some(d as i32) }),
                noncurrent_version_transitions: None,
                prefix: legacy.then(|| f.prefix.clone()),
                transitions: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rules: Vec<dto::LifecycleRule>) -> Option<dto::BucketLifecycleConfiguration> {
        Some(dto::BucketLifecycleConfiguration { rules })
    }

    fn rule(id: Option<&str>, prefix: Option<&str>, filter: Option<dto::LifecycleRuleFilter>) -> dto::LifecycleRule {
        dto::LifecycleRule {
            id: id.map(str::to_string),
            status: dto::ExpirationStatus::from_static(dto::ExpirationStatus::ENABLED),
            prefix: prefix.map(str::to_string),
            filter,
            expiration: Some(dto::LifecycleExpiration { days: Some(31), ..Default::default() }),
            abort_incomplete_multipart_upload: None,
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            transitions: None,
        }
    }

    #[test]
    fn a_rule_comes_back_in_the_form_it_was_given_and_with_an_id() {
        let filter = dto::LifecycleRuleFilter { prefix: Some("b/".into()), ..Default::default() };
        let given = config(vec![rule(None, Some("a/"), None), rule(Some("two"), None, Some(filter))]);
        let rules = rules_of(&given).unwrap();
        let back = rules_dto(&rules);
        assert_eq!(back[0].prefix.as_deref(), Some("a/"));
        assert!(back[0].filter.is_none());
        assert!(back[0].id.as_deref().is_some_and(|i| !i.is_empty()), "a generated id");
        assert_eq!(back[1].prefix, None);
        assert_eq!(back[1].filter.as_ref().and_then(|f| f.prefix.as_deref()), Some("b/"));
        assert_eq!(back[1].id.as_deref(), Some("two"));
        let again = rules_of(&given).unwrap();
        assert_eq!(again[0].filter, rules[0].filter);
    }

    #[test]
    fn an_expiration_date_is_a_midnight() {
        let dated = |ms: i64| {
            let mut r = rule(Some("d"), Some("a/"), None);
            r.expiration = Some(dto::LifecycleExpiration { date: Some(timestamp(ms)), ..Default::default() });
            rules_of(&config(vec![r]))
        };
        let midnight = 1_893_456_000_000; // 2030-01-01T00:00:00Z
        assert_eq!(dated(midnight).unwrap()[0].expiration_date_ms, Some(midnight));
        // botocore sends "20200101" as that many seconds after the epoch: 1970-08-22T19:08:21Z.
        let e = dated(20_200_101_000).unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidArgument);
        assert!(dated(midnight + 1).is_err(), "a millisecond past midnight");
    }
}
