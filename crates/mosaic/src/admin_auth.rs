//! Authentication of admin requests with the root credentials: HMAC-SHA256 over method, path and a
//! timestamp, accepted within a five-minute window.

use hmac::{KeyInit, Mac};
use sha2::Sha256;

pub const HEADER_KEY: &str = "x-mosaic-access-key";
pub const HEADER_DATE: &str = "x-mosaic-date";
pub const HEADER_SIGNATURE: &str = "x-mosaic-signature";
pub const MAX_SKEW_SECS: i64 = 300;

pub fn sign(secret: &str, method: &str, path: &str, unix_s: i64) -> String {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{method}\n{path}\n{unix_s}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

pub fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Checks a request's admin headers against the root credentials.
pub fn verify(
    access_key: &str,
    secret: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    date: Option<&str>,
    signature: Option<&str>,
) -> Result<(), &'static str> {
    let (Some(key), Some(date), Some(sig)) = (key, date, signature) else {
        return Err("missing admin authentication headers");
    };
    if key != access_key {
        return Err("unknown access key");
    }
    let t: i64 = date.parse().map_err(|_| "bad date header")?;
    if (now_s() - t).abs() > MAX_SKEW_SECS {
        return Err("request time too far from server time");
    }
    let want = sign(secret, method, path, t);
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{method}\n{path}\n{t}").as_bytes());
    let raw = hex::decode(sig).map_err(|_| "bad signature")?;
    mac.verify_slice(&raw).map_err(|_| "bad signature")?;
    debug_assert_eq!(want, sig);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_and_verify() {
        let t = now_s();
        let s = sign("secret", "GET", "/admin/v1/info", t);
        let ts = t.to_string();
        assert!(verify("ak", "secret", "GET", "/admin/v1/info", Some("ak"), Some(&ts), Some(&s)).is_ok());
        assert!(verify("ak", "secret", "POST", "/admin/v1/info", Some("ak"), Some(&ts), Some(&s)).is_err());
        assert!(verify("ak", "other", "GET", "/admin/v1/info", Some("ak"), Some(&ts), Some(&s)).is_err());
        assert!(verify("ak", "secret", "GET", "/admin/v1/info", Some("bk"), Some(&ts), Some(&s)).is_err());
        let old = (t - 1000).to_string();
        let s_old = sign("secret", "GET", "/admin/v1/info", t - 1000);
        assert!(verify("ak", "secret", "GET", "/admin/v1/info", Some("ak"), Some(&old), Some(&s_old)).is_err());
        assert!(verify("ak", "secret", "GET", "/x", None, None, None).is_err());
    }
}
