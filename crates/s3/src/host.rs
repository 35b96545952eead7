//! Virtual-host-style addressing. s3s's `SingleDomain` compares the Host header with its port included,
//! so `bucket.domain:9000` failed, and a path-style request to `127.0.0.1:9000` was refused once a domain
//! was configured. This parser drops the port first and falls back to path style for any other host.

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

pub struct DomainHost {
    domain: String,
}

impl DomainHost {
    pub fn new(domain: &str) -> Result<Self, String> {
        let d = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !d.is_empty()
            && d.len() <= 253
            && d.split('.')
                .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !valid {
            return Err(format!("invalid domain {domain:?}: expected a DNS name such as s3.example.com"));
        }
        Ok(DomainHost { domain: d })
    }
}

/// Checks a configured domain (the same rules `DomainHost::new` applies).
pub fn validate_domain(domain: &str) -> Result<(), String> {
    DomainHost::new(domain).map(|_| ())
}

/// The host part of a Host header: without a port, lowercased. IPv6 literals keep their brackets.
fn host_only(header: &str) -> String {
    let h = header.trim();
    let h = if h.starts_with('[') {
        h.split_inclusive(']').next().unwrap_or(h)
    } else {
        h.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map(|(h, _)| h).unwrap_or(h)
    };
    h.to_ascii_lowercase()
}

impl DomainHost {
    /// The bucket a Host header names (virtual-host style), if it names one.
    pub fn bucket_of_host(&self, host: &str) -> Option<String> {
        let h = host_only(host);
        let bucket = h.strip_suffix(self.domain.as_str())?.strip_suffix('.')?;
        (!bucket.is_empty()).then(|| bucket.to_string())
    }
}

/// The bucket a request addresses: by virtual host (with a domain), else the first segment of its path
/// (`path` without its query).
pub(crate) fn bucket_of_request(domain: Option<&DomainHost>, host: Option<&str>, path: &str) -> Option<String> {
    if let (Some(d), Some(h)) = (domain, host)
        && let Some(b) = d.bucket_of_host(h)
    {
        return Some(b);
    }
    let first = path.trim_start_matches('/').split('/').next()?;
    (!first.is_empty()).then(|| first.to_string())
}

impl S3Host for DomainHost {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        let h = host_only(host);
        if let Some(bucket) = h.strip_suffix(self.domain.as_str()).and_then(|b| b.strip_suffix('.'))
            && !bucket.is_empty()
        {
            return Ok(VirtualHost::new(self.domain.as_str()).with_bucket(bucket.to_string()));
        }
        // The domain itself, an IP address or any other name: path style.
        Ok(VirtualHost::new(self.domain.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_ignored() {
        assert_eq!(host_only("Bucket.S3.Test:9000"), "bucket.s3.test");
        assert_eq!(host_only("127.0.0.1:9000"), "127.0.0.1");
        assert_eq!(host_only("[::1]:9000"), "[::1]");
        assert_eq!(host_only("s3.test"), "s3.test");
        let d = DomainHost::new("s3.example.com").unwrap();
        assert_eq!(d.bucket_of_host("photos.s3.example.com:9000").as_deref(), Some("photos"));
        assert_eq!(d.bucket_of_host("s3.example.com"), None);
        assert_eq!(d.bucket_of_host("127.0.0.1:9000"), None);
        for bad in ["", "bad domain", "a..b", "x_y.com", "s3.test:9000"] {
            assert!(DomainHost::new(bad).is_err(), "{bad}");
        }
    }
}
