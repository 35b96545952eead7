//! LayerError -> S3 error code, HTTP status and message.

use mosaic_layer::LayerError;
use s3s::{S3Error, S3ErrorCode, s3_error};

pub fn to_s3(e: LayerError) -> S3Error {
    let mut e = translate(e);
    // A message may name a key or an internal name, and XML 1.0 cannot carry every character (a NUL
    // makes the whole answer unreadable to a client): those are written escaped.
    if let Some(m) = e.message().filter(|m| m.chars().any(|c| !xml_char(c))) {
        let safe = xml_safe(m);
        e.set_message(safe);
    }
    e
}

/// Whether XML 1.0 can carry `c` in text.
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// `m` with every character XML 1.0 cannot carry written as its escape (`\u{0}`).
fn xml_safe(m: &str) -> String {
    m.chars().map(|c| if xml_char(c) { c.to_string() } else { c.escape_unicode().to_string() }).collect()
}

fn translate(e: LayerError) -> S3Error {
    use LayerError as L;
    match e {
        L::NoSuchBucket => s3_error!(NoSuchBucket),
        L::BucketExists => s3_error!(BucketAlreadyOwnedByYou),
        L::BucketNotEmpty => s3_error!(BucketNotEmpty),
        L::InvalidBucketName(m) => s3_error!(InvalidBucketName, "{m}"),
        L::NoSuchKey => {
            // What the key's 404 is not: a delete marker (RGW says so too; clients checking the header
            // find it either way).
            let mut e = s3_error!(NoSuchKey);
            let mut h = http::HeaderMap::new();
            h.insert("x-amz-delete-marker", http::HeaderValue::from_static("false"));
            e.set_headers(h);
            e
        }
        L::InvalidKey(m) => s3_error!(InvalidArgument, "{m}"),
        L::KeyTooLong => s3_error!(KeyTooLongError),
        L::MetadataTooLarge => s3_error!(MetadataTooLarge),
        L::NoSuchUpload => s3_error!(NoSuchUpload),
        L::InvalidPart(m) => s3_error!(InvalidPart, "{m}"),
        L::InvalidPartOrder => s3_error!(InvalidPartOrder),
        L::EntityTooSmall => s3_error!(EntityTooSmall),
        L::EntityTooLarge => s3_error!(EntityTooLarge),
        L::PreconditionFailed => s3_error!(PreconditionFailed),
        L::ConditionalConflict => {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("ConditionalRequestConflict".into()),
                "The object changed while the conditional write was checked; fetch its ETag and retry",
            );
            e.set_status_code(http::StatusCode::CONFLICT);
            e
        }
        L::NotModified => {
            let mut e = S3Error::new(S3ErrorCode::Custom("NotModified".into()));
            e.set_status_code(http::StatusCode::NOT_MODIFIED);
            e
        }
        L::InvalidRange => s3_error!(InvalidRange),
        L::InvalidWriteOffset => {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("InvalidWriteOffset".into()),
                "The write offset does not match the size of the object",
            );
            e.set_status_code(http::StatusCode::BAD_REQUEST);
            e
        }
        L::BadDigest(m) => s3_error!(BadDigest, "{m}"),
        L::IncompleteBody(m) => s3_error!(IncompleteBody, "{m}"),
        L::InvalidArgument(m) if m.starts_with("InvalidDigest") => s3_error!(InvalidDigest, "{m}"),
        L::InvalidArgument(m) => s3_error!(InvalidArgument, "{m}"),
        L::StorageFull => {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("InsufficientStorage".into()),
                "The drive does not have enough free space for this request",
            );
            e.set_status_code(http::StatusCode::INSUFFICIENT_STORAGE);
            e
        }
        L::Unavailable(m) | L::Switching(m) => s3_error!(ServiceUnavailable, "{m}"),
        L::Corrupt(m) => {
            tracing::error!(error = %m, "damaged data detected");
            s3_error!(InternalError, "stored data failed its integrity check")
        }
        L::Internal(m) => {
            tracing::error!(error = %m, "internal error");
            s3_error!(InternalError)
        }
        L::Conflict => s3_error!(OperationAborted, "a conflicting operation is in progress, retry"),
        L::NoSuchVersion => s3_error!(NoSuchVersion, "The specified version does not exist"),
        L::DeleteMarker { version_id, named } => {
            let mut e = if named {
                s3_error!(MethodNotAllowed, "The specified method is not allowed against a delete marker")
            } else {
                s3_error!(NoSuchKey)
            };
            let mut h = http::HeaderMap::new();
            h.insert("x-amz-delete-marker", http::HeaderValue::from_static("true"));
            if let Ok(v) = http::HeaderValue::from_str(version_id.as_deref().unwrap_or("null")) {
                h.insert("x-amz-version-id", v);
            }
            e.set_headers(h);
            e
        }
        L::MalformedXml(m) => s3_error!(MalformedXML, "{m}"),
        L::InvalidRetentionPeriod => invalid_retention_period(),
        L::ObjectLocked(m) => s3_error!(AccessDenied, "{m}"),
        L::InvalidRequest(m) => s3_error!(InvalidRequest, "{m}"),
        L::InvalidBucketState(m) => s3_error!(InvalidBucketState, "{m}"),
        L::InvalidTag(m) => s3_error!(InvalidTag, "{m}"),
        L::InvalidPartNumber => invalid_part_number(),
        L::KmsKeyNotFound(id) => kms_not_found(&id),
    }
}

/// S3's InvalidRetentionPeriod (400), which s3s has no code for.
pub fn invalid_retention_period() -> S3Error {
    let mut e = S3Error::with_message(
        S3ErrorCode::Custom("InvalidRetentionPeriod".into()),
        "The default retention period must be a positive number of days or years, at most 100 years",
    );
    e.set_status_code(http::StatusCode::BAD_REQUEST);
    e
}

/// A partNumber past an object's last part: 400 InvalidPart, as ceph/s3-tests expects (AWS answers 416
/// InvalidPartNumber; SDKs treat both as a failed request).
pub fn invalid_part_number() -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::InvalidPart, "The requested part number is not satisfiable");
    e.set_status_code(http::StatusCode::BAD_REQUEST);
    e
}

/// An SSE-KMS key id the local key provider does not serve: 400 KMS.NotFoundException, as AWS answers.
pub fn kms_not_found(key_id: &str) -> S3Error {
    let mut e = S3Error::with_message(
        S3ErrorCode::Custom("KMS.NotFoundException".into()),
        format!("Key '{key_id}' does not exist"),
    );
    e.set_status_code(http::StatusCode::BAD_REQUEST);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_only_what_xml_can() {
        let e = to_s3(LayerError::Unavailable("object bucket/a\0b \u{1}c\td é \u{FFFE}".into()));
        assert_eq!(e.message(), Some("object bucket/a\\u{0}b \\u{1}c\td é \\u{fffe}"));
        let plain = to_s3(LayerError::InvalidKey("a key with é and \"quotes\"".into()));
        assert_eq!(plain.message(), Some("a key with é and \"quotes\""));
    }
}
