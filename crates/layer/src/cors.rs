//! A bucket's CORS configuration as stored with its record: which origins may send which methods and
//! headers from a browser. The layer stores and validates it; the S3 frontend answers preflights by it.

use crate::error::{LayerError, LayerResult};
use serde::{Deserialize, Serialize};

/// Most rules in one configuration (S3's limit).
pub const MAX_CORS_RULES: usize = 100;
/// Most origins, methods or headers in one rule.
pub const MAX_CORS_RULE_ITEMS: usize = 100;
/// Longest origin or header name pattern.
pub const MAX_CORS_ITEM_BYTES: usize = 1024;
/// The methods a rule may allow.
pub const CORS_METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CorsRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Origins, each with at most one `*` wildcard.
    pub allowed_origins: Vec<String>,
    pub allowed_methods: Vec<String>,
    /// Request headers a preflight may ask for, each with at most one `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_s: Option<i32>,
}

/// Checks a configuration against S3's rules and Mosaic's limits.
pub fn validate_cors(rules: &[CorsRule]) -> LayerResult<()> {
    let bad = |m: String| Err(LayerError::InvalidArgument(m));
    if rules.is_empty() || rules.len() > MAX_CORS_RULES {
        return bad(format!("a CORS configuration has 1 to {MAX_CORS_RULES} rules"));
    }
    for r in rules {
        if r.allowed_origins.is_empty() || r.allowed_methods.is_empty() {
            return bad("a CORS rule needs at least one AllowedOrigin and one AllowedMethod".into());
        }
        let lists = [&r.allowed_origins, &r.allowed_methods, &r.allowed_headers, &r.expose_headers];
        if lists.iter().any(|l| l.len() > MAX_CORS_RULE_ITEMS) {
            return bad(format!("a CORS rule lists at most {MAX_CORS_RULE_ITEMS} items of each kind"));
        }
        if lists.iter().flat_map(|l| l.iter()).any(|s| s.is_empty() || s.len() > MAX_CORS_ITEM_BYTES) {
            return bad(format!("CORS origins and headers have 1 to {MAX_CORS_ITEM_BYTES} bytes"));
        }
        if let Some(m) = r.allowed_methods.iter().find(|m| !CORS_METHODS.contains(&m.as_str())) {
            return bad(format!("Found unsupported HTTP method in CORS config. Unsupported method is {m}"));
        }
        let wild = |s: &String| s.matches('*').count() > 1;
        if let Some(o) = r.allowed_origins.iter().chain(&r.allowed_headers).find(|s| wild(s)) {
            return bad(format!("{o:?} can not have more than one wildcard"));
        }
        if r.max_age_s.is_some_and(|a| a < 0) {
            return bad("MaxAgeSeconds must not be negative".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> CorsRule {
        CorsRule { allowed_origins: vec!["*".into()], allowed_methods: vec!["GET".into()], ..Default::default() }
    }

    #[test]
    fn rules_are_validated_at_and_past_the_limits() {
        validate_cors(&[rule()]).unwrap();
        validate_cors(&vec![rule(); MAX_CORS_RULES]).unwrap();
        assert!(validate_cors(&vec![rule(); MAX_CORS_RULES + 1]).is_err());
        assert!(validate_cors(&[]).is_err());
        let with = |f: &dyn Fn(&mut CorsRule)| {
            let mut r = rule();
            f(&mut r);
            validate_cors(&[r])
        };
        assert!(with(&|r| r.allowed_methods = vec!["PATCH".into()]).is_err());
        assert!(with(&|r| r.allowed_origins = vec!["a*b*c".into()]).is_err());
        assert!(with(&|r| r.allowed_origins.clear()).is_err());
        assert!(with(&|r| r.allowed_headers = vec!["x".repeat(MAX_CORS_ITEM_BYTES + 1)]).is_err());
        with(&|r| r.allowed_headers = vec!["x".repeat(MAX_CORS_ITEM_BYTES)]).unwrap();
        assert!(with(&|r| r.allowed_headers = vec!["h".into(); MAX_CORS_RULE_ITEMS + 1]).is_err());
        assert!(with(&|r| r.max_age_s = Some(-1)).is_err());
    }
}
