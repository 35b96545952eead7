//! Bucket and key rules (DESIGN.md section 7).

use crate::error::{LayerError, LayerResult};

pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_USER_METADATA_BYTES: usize = 2048;

/// S3 bucket naming rules: 3-63 characters of lowercase letters, digits, '.' and '-', starting and ending
/// with a letter or digit, no "..", not an IP address, no reserved prefixes or suffixes.
pub fn validate_bucket_name(name: &str) -> LayerResult<()> {
    let bad = |why: &str| Err(LayerError::InvalidBucketName(format!("{name:?}: {why}")));
    if !(3..=63).contains(&name.len()) {
        return bad("must be 3 to 63 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
        return bad("only lowercase letters, digits, '.' and '-' are allowed");
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return bad("must start and end with a letter or digit");
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") {
        return bad("adjacent periods or a period next to a hyphen");
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return bad("must not be an IP address");
    }
    if name.starts_with("xn--")
        || name.starts_with("sthree-")
        || name.ends_with("-s3alias")
        || name.ends_with("--ol-s3")
    {
        return bad("reserved prefix or suffix");
    }
    Ok(())
}

/// Keys are 1 to 1024 bytes of UTF-8 (guaranteed by the type) without NUL.
pub fn validate_key(key: &str) -> LayerResult<()> {
    if key.is_empty() {
        return Err(LayerError::InvalidKey("empty key".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(LayerError::KeyTooLong);
    }
    if key.contains('\0') {
        return Err(LayerError::InvalidKey("keys must not contain NUL".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.1", &"a".repeat(63)] {
            assert!(validate_bucket_name(ok).is_ok(), "{ok}");
        }
        for bad in ["ab", &"a".repeat(64), "Abc", "-abc", "abc-", "a..b", "192.168.1.1", "xn--abc", "a_b", "a.-b"] {
            assert!(validate_bucket_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys() {
        assert!(validate_key(&"k".repeat(1024)).is_ok());
        assert_eq!(validate_key(&"k".repeat(1025)), Err(LayerError::KeyTooLong));
        assert!(validate_key("").is_err());
        assert!(validate_key("a\0b").is_err());
    }
}
