//! CORS: preflight requests (OPTIONS) answered by the bucket's rules, and the Access-Control-* headers
//! added to the answers of requests that name an Origin. The first rule that matches the origin, the method
//! (a request's own, or the one Access-Control-Request-Method names) and every requested header wins.

use mosaic_layer::CorsRule;
use s3s::dto;

/// Longest Access-Control-Request-Headers list considered.
const MAX_REQUESTED_HEADERS: usize = 64;

/// Whether `pattern` (at most one `*`, which matches any run of characters) matches `value`.
pub fn wildcard_matches(pattern: &str, value: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == value,
        Some((prefix, suffix)) => {
            value.len() >= prefix.len() + suffix.len() && value.starts_with(prefix) && value.ends_with(suffix)
        }
    }
}

/// The first rule allowing `origin` to send `method` with `headers` (lowercase names).
pub fn find_rule<'a>(rules: &'a [CorsRule], origin: &str, method: &str, headers: &[String]) -> Option<&'a CorsRule> {
    rules.iter().find(|r| {
        r.allowed_origins.iter().any(|o| wildcard_matches(o, origin))
            && r.allowed_methods.iter().any(|m| m == method)
            && headers.iter().all(|h| r.allowed_headers.iter().any(|a| wildcard_matches(&a.to_ascii_lowercase(), h)))
    })
}

/// The headers a preflight asks for (Access-Control-Request-Headers), lowercase; None: too many.
pub fn requested_headers(value: Option<&str>) -> Option<Vec<String>> {
    let v: Vec<String> =
        value.unwrap_or("").split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect();
    (v.len() <= MAX_REQUESTED_HEADERS).then_some(v)
}

/// The Access-Control-* headers a matching rule puts on an answer to `origin`.
pub fn rule_headers(rule: &CorsRule, origin: &str, preflight_headers: Option<&[String]>) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    };
    let any_origin = rule.allowed_origins.iter().any(|o| o == "*");
    set("access-control-allow-origin", if any_origin { "*".to_string() } else { origin.to_string() });
    set("access-control-allow-methods", rule.allowed_methods.join(", "));
    if !rule.expose_headers.is_empty() {
        set("access-control-expose-headers", rule.expose_headers.join(", "));
    }
    if let Some(asked) = preflight_headers.filter(|a| !a.is_empty()) {
        set("access-control-allow-headers", asked.join(", "));
    }
    if let (Some(age), true) = (rule.max_age_s, preflight_headers.is_some()) {
        set("access-control-max-age", age.to_string());
    }
    if !any_origin {
        set("access-control-allow-credentials", "true".to_string());
        set("vary", "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".to_string());
    }
    h
}

/// The layer's rules of an S3 CORSConfiguration.
pub fn from_dto(cfg: dto::CORSConfiguration) -> Vec<CorsRule> {
    cfg.cors_rules
        .into_iter()
        .map(|r| CorsRule {
            id: r.id,
            allowed_origins: r.allowed_origins,
            allowed_methods: r.allowed_methods,
            allowed_headers: r.allowed_headers.unwrap_or_default(),
            expose_headers: r.expose_headers.unwrap_or_default(),
            max_age_s: r.max_age_seconds,
        })
        .collect()
}

/// The S3 CORSRules of the layer's rules.
pub fn to_dto(rules: Vec<CorsRule>) -> Vec<dto::CORSRule> {
    rules
        .into_iter()
        .map(|r| dto::CORSRule {
            id: r.id,
            allowed_origins: r.allowed_origins,
            allowed_methods: r.allowed_methods,
            allowed_headers: (!r.allowed_headers.is_empty()).then_some(r.allowed_headers),
            expose_headers: (!r.expose_headers.is_empty()).then_some(r.expose_headers),
            max_age_seconds: r.max_age_s,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(origin: &str, method: &str) -> CorsRule {
        CorsRule { allowed_origins: vec![origin.into()], allowed_methods: vec![method.into()], ..Default::default() }
    }

    #[test]
    fn origins_match_with_one_wildcard() {
        assert!(wildcard_matches("*", "anything"));
        assert!(wildcard_matches("*suffix", "foo.suffix"));
        assert!(!wildcard_matches("*suffix", "foo.suffix.get"));
        assert!(wildcard_matches("start*end", "startend"));
        assert!(wildcard_matches("start*end", "start12end"));
        assert!(!wildcard_matches("start*end", "0start12end"));
        assert!(!wildcard_matches("ab*ba", "aba"), "prefix and suffix may not overlap");
        assert!(wildcard_matches("prefix*", "prefix"));
        assert!(!wildcard_matches("prefix*", "bla.prefix"));
        assert!(wildcard_matches("exact", "exact") && !wildcard_matches("exact", "exactly"));
    }

    #[test]
    fn the_first_rule_allowing_origin_method_and_headers_wins() {
        let mut with_headers = rule("*", "GET");
        with_headers.allowed_headers = vec!["x-amz-*".into(), "Content-Type".into()];
        let rules = vec![rule("*.put", "PUT"), with_headers, rule("*", "DELETE")];
        assert_eq!(find_rule(&rules, "a.put", "PUT", &[]), Some(&rules[0]));
        assert_eq!(find_rule(&rules, "a.put", "GET", &[]), Some(&rules[1]));
        let asked = requested_headers(Some("X-Amz-Date, content-type")).unwrap();
        assert_eq!(find_rule(&rules, "o", "GET", &asked), Some(&rules[1]));
        let other = requested_headers(Some("x-custom")).unwrap();
        assert_eq!(find_rule(&rules, "o", "GET", &other), None);
        assert_eq!(find_rule(&rules, "o", "POST", &[]), None);
        let many = vec!["h"; MAX_REQUESTED_HEADERS + 1].join(",");
        assert_eq!(requested_headers(Some(&many)), None);
        assert_eq!(requested_headers(Some(&vec!["h"; MAX_REQUESTED_HEADERS].join(","))).map(|v| v.len()), Some(64));
    }

    #[test]
    fn headers_name_the_origin_unless_any_is_allowed() {
        let mut r = rule("https://*.example.com", "GET");
        r.max_age_s = Some(60);
        let h = rule_headers(&r, "https://a.example.com", Some(&["x-amz-date".to_string()]));
        assert_eq!(h["access-control-allow-origin"], "https://a.example.com");
        assert_eq!(h["access-control-allow-headers"], "x-amz-date");
        assert_eq!(h["access-control-max-age"], "60");
        let h = rule_headers(&rule("*", "GET"), "o", None);
        assert_eq!(h["access-control-allow-origin"], "*");
        assert!(!h.contains_key("access-control-max-age"));
    }
}
