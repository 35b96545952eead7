//! Bucket policies in the IAM policy language: parsing (a malformed document is refused when it is put, never
//! half-applied) and evaluation of one request against one bucket's policy. An explicit Deny beats every
//! Allow; a policy that says nothing about a request leaves it to grants, ownership and ACLs.
//!
//! Supported: Effect, Principal and NotPrincipal ("*", {"AWS": "*" | ARN | canonical id | access key},
//! {"CanonicalUser": id}), Action and NotAction (with `*` and `?` wildcards), Resource and NotResource
//! (ARNs of the bucket and its objects, wildcards), Condition with the String*, Numeric*, Date*, Bool,
//! IpAddress/NotIpAddress and Null operators, each optionally ...IfExists, ForAnyValue:/ForAllValues: on
//! multi-valued keys.

use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;

/// Largest policy document (S3's limit).
pub const MAX_POLICY_BYTES: usize = 20 * 1024;
/// Most statements in a policy.
pub const MAX_STATEMENTS: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Principals {
    Any,
    /// Canonical ids, access keys or ARNs naming them.
    Some(Vec<String>),
}

#[derive(Clone, Debug)]
struct Statement {
    allow: bool,
    principals: Principals,
    not_principal: bool,
    /// Lowercase patterns.
    actions: Vec<String>,
    not_action: bool,
    resources: Vec<String>,
    not_resource: bool,
    conditions: Vec<Condition>,
}

#[derive(Clone, Debug)]
struct Condition {
    op: Op,
    if_exists: bool,
    quantifier: Quantifier,
    /// Lowercase.
    key: String,
    values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quantifier {
    /// A single-valued key (the usual case); on several values it behaves as ForAnyValue.
    Single,
    ForAnyValue,
    ForAllValues,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    StringLike,
    StringNotLike,
    NumericEquals,
    NumericNotEquals,
    NumericLessThan,
    NumericLessThanEquals,
    NumericGreaterThan,
    NumericGreaterThanEquals,
    DateEquals,
    DateNotEquals,
    DateLessThan,
    DateLessThanEquals,
    DateGreaterThan,
    DateGreaterThanEquals,
    Bool,
    IpAddress,
    NotIpAddress,
    Null,
}

impl Op {
    fn parse(name: &str) -> Option<Op> {
        use Op::*;
        Some(match name {
            "StringEquals" => StringEquals,
            "StringNotEquals" => StringNotEquals,
            "StringEqualsIgnoreCase" => StringEqualsIgnoreCase,
            "StringNotEqualsIgnoreCase" => StringNotEqualsIgnoreCase,
            "StringLike" => StringLike,
            "StringNotLike" => StringNotLike,
            "NumericEquals" => NumericEquals,
            "NumericNotEquals" => NumericNotEquals,
            "NumericLessThan" => NumericLessThan,
            "NumericLessThanEquals" => NumericLessThanEquals,
            "NumericGreaterThan" => NumericGreaterThan,
            "NumericGreaterThanEquals" => NumericGreaterThanEquals,
            "DateEquals" => DateEquals,
            "DateNotEquals" => DateNotEquals,
            "DateLessThan" => DateLessThan,
            "DateLessThanEquals" => DateLessThanEquals,
            "DateGreaterThan" => DateGreaterThan,
            "DateGreaterThanEquals" => DateGreaterThanEquals,
            "Bool" => Bool,
            "IpAddress" => IpAddress,
            "NotIpAddress" => NotIpAddress,
            "Null" => Null,
            _ => return None,
        })
    }

    /// Operators that hold when the values differ: on several request values they must hold for all.
    fn is_negated(self) -> bool {
        matches!(self, Op::StringNotEquals | Op::StringNotEqualsIgnoreCase | Op::StringNotLike | Op::NotIpAddress)
    }
}

/// A parsed bucket policy.
#[derive(Clone, Debug)]
pub struct Policy {
    statements: Vec<Statement>,
}

/// What a policy says of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// No statement applies.
    Silent,
}

/// A request as a policy sees it.
pub struct Request<'a> {
    /// The requester's canonical id and access key; None: anonymous.
    pub principal: Option<(&'a str, &'a str)>,
    /// "s3:GetObject" and the like.
    pub action: &'a str,
    /// "arn:aws:s3:::bucket" or "arn:aws:s3:::bucket/key".
    pub resource: &'a str,
    /// Condition keys (lowercase) and their values.
    pub context: &'a HashMap<String, Vec<String>>,
}

fn malformed(m: impl Into<String>) -> String {
    m.into()
}

/// The strings of a policy field that may be one string or a list of them.
fn strings(v: &Value, field: &str) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| malformed(format!("{field} lists strings"))))
            .collect(),
        _ => Err(malformed(format!("{field} is a string or a list of strings"))),
    }
}

/// Condition values may be strings, numbers or booleans, alone or in a list.
fn condition_values(v: &Value) -> Result<Vec<String>, String> {
    let one = |x: &Value| match x {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(malformed("condition values are strings, numbers or booleans")),
    };
    match v {
        Value::Array(a) => a.iter().map(one).collect(),
        x => Ok(vec![one(x)?]),
    }
}

fn principals(v: &Value) -> Result<Principals, String> {
    match v {
        Value::String(s) if s == "*" => Ok(Principals::Any),
        Value::Object(m) if !m.is_empty() => {
            let mut ids = Vec::new();
            for (kind, ids_of_kind) in m {
                let list = strings(ids_of_kind, "Principal")?;
                match kind.as_str() {
                    "AWS" if list.iter().any(|p| p == "*") => return Ok(Principals::Any),
                    "AWS" | "CanonicalUser" => ids.extend(list),
                    // Services and federated users never sign requests here: such a statement matches no one.
                    "Service" | "Federated" => {}
                    other => return Err(malformed(format!("unknown principal type {other}"))),
                }
            }
            Ok(Principals::Some(ids))
        }
        _ => Err(malformed("Principal is \"*\" or an object of principal types")),
    }
}

impl Policy {
    /// Parses and checks a policy put on `bucket`: every resource must be the bucket or inside it.
    pub fn parse(text: &str, bucket: &str) -> Result<Policy, String> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(malformed(format!("a policy has at most {MAX_POLICY_BYTES} bytes")));
        }
        let doc: Value = serde_json::from_str(text).map_err(|e| malformed(format!("invalid JSON: {e}")))?;
        let obj = doc.as_object().ok_or_else(|| malformed("a policy is a JSON object"))?;
        if let Some(v) = obj.get("Version")
            && v != "2012-10-17"
            && v != "2008-10-17"
        {
            return Err(malformed("Version is 2012-10-17 or 2008-10-17"));
        }
        let raw = match obj.get("Statement") {
            Some(Value::Array(a)) => a.clone(),
            Some(s @ Value::Object(_)) => vec![s.clone()],
            _ => return Err(malformed("Statement is missing")),
        };
        if raw.is_empty() || raw.len() > MAX_STATEMENTS {
            return Err(malformed(format!("a policy has 1 to {MAX_STATEMENTS} statements")));
        }
        let statements = raw.iter().map(|s| Self::statement(s, bucket)).collect::<Result<_, _>>()?;
        Ok(Policy { statements })
    }

    fn statement(v: &Value, bucket: &str) -> Result<Statement, String> {
        let s = v.as_object().ok_or_else(|| malformed("a statement is a JSON object"))?;
        let allow = match s.get("Effect").and_then(Value::as_str) {
            Some("Allow") => true,
            Some("Deny") => false,
            _ => return Err(malformed("Effect is Allow or Deny")),
        };
        let (principals, not_principal) = match (s.get("Principal"), s.get("NotPrincipal")) {
            (Some(p), None) => (principals(p)?, false),
            // An Allow to everyone but someone is too broad to grant knowingly (S3 refuses it too).
            (None, Some(_)) if allow => return Err(malformed("NotPrincipal may only be used with Deny")),
            (None, Some(p)) => (principals(p)?, true),
            _ => return Err(malformed("a statement names exactly one of Principal and NotPrincipal")),
        };
        let (actions, not_action) = match (s.get("Action"), s.get("NotAction")) {
            (Some(a), None) => (strings(a, "Action")?, false),
            (None, Some(a)) => (strings(a, "NotAction")?, true),
            _ => return Err(malformed("a statement names exactly one of Action and NotAction")),
        };
        for a in &actions {
            if !(a == "*" || a.to_ascii_lowercase().starts_with("s3:")) {
                return Err(malformed(format!("Policy has invalid action {a}")));
            }
        }
        let (resources, not_resource) = match (s.get("Resource"), s.get("NotResource")) {
            (Some(r), None) => (strings(r, "Resource")?, false),
            (None, Some(r)) => (strings(r, "NotResource")?, true),
            _ => return Err(malformed("a statement names exactly one of Resource and NotResource")),
        };
        for r in &resources {
            let path = r.strip_prefix("arn:aws:s3:::").ok_or_else(|| malformed("Policy has invalid resource"))?;
            let b = path.split('/').next().unwrap_or("");
            if !wildcard(b, bucket) {
                return Err(malformed("Policy has invalid resource"));
            }
        }
        let conditions = match s.get("Condition") {
            None => Vec::new(),
            Some(c) => conditions(c)?,
        };
        Ok(Statement {
            allow,
            principals,
            not_principal,
            actions: actions.iter().map(|a| a.to_ascii_lowercase()).collect(),
            not_action,
            resources,
            not_resource,
            conditions,
        })
    }

    /// What the policy says of `req`: Deny if any statement denies it, else Allow if any allows it.
    pub fn evaluate(&self, req: &Request<'_>) -> Decision {
        let mut decision = Decision::Silent;
        for s in self.statements.iter().filter(|s| s.applies(req)) {
            if !s.allow {
                return Decision::Deny;
            }
            decision = Decision::Allow;
        }
        decision
    }

    /// Whether the policy lets anyone in (GetBucketPolicyStatus): an Allow for every principal with no
    /// condition narrowing it.
    pub fn is_public(&self) -> bool {
        self.statements
            .iter()
            .any(|s| s.allow && !s.not_principal && s.principals == Principals::Any && s.conditions.is_empty())
    }
}

fn conditions(v: &Value) -> Result<Vec<Condition>, String> {
    let ops = v.as_object().ok_or_else(|| malformed("Condition is an object"))?;
    let mut out = Vec::new();
    for (name, keys) in ops {
        let (quantifier, rest) = if let Some(r) = name.strip_prefix("ForAnyValue:") {
            (Quantifier::ForAnyValue, r)
        } else if let Some(r) = name.strip_prefix("ForAllValues:") {
            (Quantifier::ForAllValues, r)
        } else {
            (Quantifier::Single, name.as_str())
        };
        let (op_name, if_exists) = match rest.strip_suffix("IfExists") {
            Some(base) => (base, true),
            None => (rest, false),
        };
        let op = Op::parse(op_name).ok_or_else(|| malformed(format!("unknown condition operator {name}")))?;
        let keys = keys.as_object().ok_or_else(|| malformed(format!("{name} maps keys to values")))?;
        for (key, values) in keys {
            let values = condition_values(values)?;
            if op == Op::IpAddress || op == Op::NotIpAddress {
                for v in &values {
                    parse_cidr(v).ok_or_else(|| malformed(format!("{v} is not an IP address or range")))?;
                }
            }
            out.push(Condition { op, if_exists, quantifier, key: key.to_ascii_lowercase(), values });
        }
    }
    Ok(out)
}

impl Statement {
    fn applies(&self, req: &Request<'_>) -> bool {
        let principal = self.principal_matches(req.principal) != self.not_principal;
        let action = self.actions.iter().any(|a| wildcard(a, &req.action.to_ascii_lowercase())) != self.not_action;
        let resource = self.resources.iter().any(|r| wildcard(r, req.resource)) != self.not_resource;
        principal && action && resource && self.conditions.iter().all(|c| c.holds(req.context))
    }

    fn principal_matches(&self, who: Option<(&str, &str)>) -> bool {
        match (&self.principals, who) {
            (Principals::Any, _) => true,
            (Principals::Some(_), None) => false,
            (Principals::Some(list), Some((id, key))) => list.iter().any(|p| {
                // An ARN names an account or user by the id after "iam::" or after "user/".
                let named = p
                    .rsplit_once(":user/")
                    .map(|(_, u)| u)
                    .or_else(|| p.strip_prefix("arn:aws:iam::").and_then(|r| r.split(':').next()));
                let named = named.unwrap_or(p);
                named == id || named == key
            }),
        }
    }
}

impl Condition {
    fn holds(&self, context: &HashMap<String, Vec<String>>) -> bool {
        let values = context.get(&self.key).filter(|v| !v.is_empty());
        if self.op == Op::Null {
            // Null: true means the key must be absent.
            let absent = values.is_none();
            return self.values.iter().any(|v| v.eq_ignore_ascii_case("true") == absent);
        }
        let Some(values) = values else {
            // A missing key: ...IfExists holds; ForAllValues holds vacuously; others fail.
            return self.if_exists || self.quantifier == Quantifier::ForAllValues;
        };
        let one = |v: &String| self.values.iter().any(|want| compare(self.op, v, want));
        match self.quantifier {
            Quantifier::ForAllValues => values.iter().all(|v| self.values.iter().any(|w| compare(self.op, v, w))),
            _ if self.op.is_negated() => values.iter().all(|v| self.values.iter().all(|w| compare(self.op, v, w))),
            _ => values.iter().any(one),
        }
    }
}

fn compare(op: Op, got: &str, want: &str) -> bool {
    use Op::*;
    let num = || Some((got.parse::<f64>().ok()?, want.parse::<f64>().ok()?));
    let date = || Some((parse_date(got)?, parse_date(want)?));
    match op {
        StringEquals => got == want,
        StringNotEquals => got != want,
        StringEqualsIgnoreCase => got.eq_ignore_ascii_case(want),
        StringNotEqualsIgnoreCase => !got.eq_ignore_ascii_case(want),
        StringLike => wildcard(want, got),
        StringNotLike => !wildcard(want, got),
        NumericEquals => num().is_some_and(|(a, b)| a == b),
        NumericNotEquals => num().is_some_and(|(a, b)| a != b),
        NumericLessThan => num().is_some_and(|(a, b)| a < b),
        NumericLessThanEquals => num().is_some_and(|(a, b)| a <= b),
        NumericGreaterThan => num().is_some_and(|(a, b)| a > b),
        NumericGreaterThanEquals => num().is_some_and(|(a, b)| a >= b),
        DateEquals => date().is_some_and(|(a, b)| a == b),
        DateNotEquals => date().is_some_and(|(a, b)| a != b),
        DateLessThan => date().is_some_and(|(a, b)| a < b),
        DateLessThanEquals => date().is_some_and(|(a, b)| a <= b),
        DateGreaterThan => date().is_some_and(|(a, b)| a > b),
        DateGreaterThanEquals => date().is_some_and(|(a, b)| a >= b),
        Bool => got.eq_ignore_ascii_case(want),
        IpAddress => ip_in(got, want),
        NotIpAddress => !ip_in(got, want),
        Null => false,
    }
}

/// Seconds since the epoch of an ISO 8601 date-time or a number of seconds.
fn parse_date(s: &str) -> Option<i64> {
    if let Ok(n) = s.parse::<i64>() {
        return Some(n);
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp())
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, bits) = match s.split_once('/') {
        Some((a, b)) => (a.parse::<IpAddr>().ok()?, b.parse::<u8>().ok()?),
        None => {
            let a = s.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((addr, bits))
}

fn ip_in(got: &str, cidr: &str) -> bool {
    let (Ok(ip), Some((net, bits))) = (got.parse::<IpAddr>(), parse_cidr(cidr)) else { return false };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// IAM wildcard matching: `*` any run of characters, `?` any one character.
pub fn wildcard(pattern: &str, value: &str) -> bool {
    let (p, v): (Vec<char>, Vec<char>) = (pattern.chars().collect(), value.chars().collect());
    let (mut pi, mut vi) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = vi;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            vi = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The IAM action of an S3 operation (as s3s names operations).
pub fn action_of(op: &str, has_version: bool) -> String {
    let a = match op {
        "HeadObject" | "GetObject" if has_version => "GetObjectVersion",
        "HeadObject" | "GetObject" => "GetObject",
        "GetObjectAcl" if has_version => "GetObjectVersionAcl",
        "PutObjectAcl" if has_version => "PutObjectVersionAcl",
        "GetObjectTagging" if has_version => "GetObjectVersionTagging",
        "PutObjectTagging" if has_version => "PutObjectVersionTagging",
        "DeleteObjectTagging" if has_version => "DeleteObjectVersionTagging",
        "DeleteObject" if has_version => "DeleteObjectVersion",
        "DeleteObjects" => "DeleteObject",
        "CopyObject"
        | "PostObject"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "UploadPartCopy"
        | "CompleteMultipartUpload" => "PutObject",
        "ListObjects" | "ListObjectsV2" | "HeadBucket" => "ListBucket",
        "ListObjectVersions" => "ListBucketVersions",
        "ListMultipartUploads" => "ListBucketMultipartUploads",
        "ListParts" => "ListMultipartUploadParts",
        "GetBucketCors" => "GetBucketCORS",
        "PutBucketCors" | "DeleteBucketCors" => "PutBucketCORS",
        "GetBucketLifecycleConfiguration" => "GetLifecycleConfiguration",
        "PutBucketLifecycleConfiguration" | "DeleteBucketLifecycle" => "PutLifecycleConfiguration",
        "DeleteBucketTagging" => "PutBucketTagging",
        "GetObjectLockConfiguration" => "GetBucketObjectLockConfiguration",
        "PutObjectLockConfiguration" => "PutBucketObjectLockConfiguration",
        "PutPublicAccessBlock" | "DeletePublicAccessBlock" => "PutBucketPublicAccessBlock",
        "GetPublicAccessBlock" => "GetBucketPublicAccessBlock",
        "PutBucketOwnershipControls" | "DeleteBucketOwnershipControls" => "PutBucketOwnershipControls",
        other => other,
    };
    format!("s3:{a}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in pairs {
            m.entry(k.to_ascii_lowercase()).or_default().push(v.to_string());
        }
        m
    }

    fn decide(policy: &str, who: Option<(&str, &str)>, action: &str, resource: &str, c: &[(&str, &str)]) -> Decision {
        let p = Policy::parse(policy, "bkt").unwrap();
        let context = ctx(c);
        p.evaluate(&Request { principal: who, action, resource, context: &context })
    }

    const READ_ALL: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*",
        "Action":["s3:GetObject","s3:List*"],"Resource":["arn:aws:s3:::bkt","arn:aws:s3:::bkt/*"]}]}"#;

    #[test]
    fn allow_deny_and_silence() {
        let get = |a, r| decide(READ_ALL, None, a, r, &[]);
        assert_eq!(get("s3:GetObject", "arn:aws:s3:::bkt/k"), Decision::Allow);
        assert_eq!(get("s3:ListBucket", "arn:aws:s3:::bkt"), Decision::Allow);
        assert_eq!(get("s3:PutObject", "arn:aws:s3:::bkt/k"), Decision::Silent);
        let deny = r#"{"Statement":[
            {"Effect":"Allow","Principal":{"AWS":"*"},"Action":"s3:*","Resource":"arn:aws:s3:::bkt/*"},
            {"Effect":"Deny","Principal":{"AWS":["me"]},"Action":"s3:DeleteObject","Resource":"arn:aws:s3:::bkt/*"}]}"#;
        assert_eq!(decide(deny, Some(("me", "AK")), "s3:DeleteObject", "arn:aws:s3:::bkt/x", &[]), Decision::Deny);
        assert_eq!(decide(deny, Some(("you", "AK2")), "s3:DeleteObject", "arn:aws:s3:::bkt/x", &[]), Decision::Allow);
        let not_principal = r#"{"Statement":{"Effect":"Deny","NotPrincipal":{"AWS":"arn:aws:iam::me:root"},
            "Action":"s3:*","Resource":"arn:aws:s3:::bkt/*"}}"#;
        assert_eq!(
            decide(not_principal, Some(("me", "K")), "s3:GetObject", "arn:aws:s3:::bkt/k", &[]),
            Decision::Silent
        );
        assert_eq!(decide(not_principal, None, "s3:GetObject", "arn:aws:s3:::bkt/k", &[]), Decision::Deny);
    }

    #[test]
    fn conditions_narrow_statements() {
        let p = |cond: &str| {
            format!(
                r#"{{"Statement":{{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket",
                "Resource":"arn:aws:s3:::bkt","Condition":{cond}}}}}"#
            )
        };
        let list = |cond: &str, c: &[(&str, &str)]| decide(&p(cond), None, "s3:ListBucket", "arn:aws:s3:::bkt", c);
        let prefix = r#"{"StringEquals":{"s3:prefix":"photos/"}}"#;
        assert_eq!(list(prefix, &[("s3:prefix", "photos/")]), Decision::Allow);
        assert_eq!(list(prefix, &[("s3:prefix", "docs/")]), Decision::Silent);
        assert_eq!(list(prefix, &[]), Decision::Silent, "a missing key fails the condition");
        let like = r#"{"StringLike":{"s3:prefix":["photos/*","docs/??"]}}"#;
        assert_eq!(list(like, &[("s3:prefix", "docs/ab")]), Decision::Allow);
        let max = r#"{"NumericLessThanEquals":{"s3:max-keys":"10"}}"#;
        assert_eq!(list(max, &[("s3:max-keys", "10")]), Decision::Allow);
        assert_eq!(list(max, &[("s3:max-keys", "11")]), Decision::Silent);
        let ip = r#"{"IpAddress":{"aws:SourceIp":"127.0.0.0/8"}}"#;
        assert_eq!(list(ip, &[("aws:SourceIp", "127.1.2.3")]), Decision::Allow);
        assert_eq!(list(ip, &[("aws:SourceIp", "10.0.0.1")]), Decision::Silent);
        let secure = r#"{"Bool":{"aws:SecureTransport":"false"}}"#;
        assert_eq!(list(secure, &[("aws:SecureTransport", "false")]), Decision::Allow);
        let if_exists = r#"{"StringEqualsIfExists":{"s3:delimiter":"/"}}"#;
        assert_eq!(list(if_exists, &[]), Decision::Allow);
        assert_eq!(list(if_exists, &[("s3:delimiter", "|")]), Decision::Silent);
        let null = r#"{"Null":{"s3:x-amz-acl":"true"}}"#;
        assert_eq!(list(null, &[]), Decision::Allow);
        assert_eq!(list(null, &[("s3:x-amz-acl", "private")]), Decision::Silent);
        let before = r#"{"DateLessThan":{"aws:CurrentTime":"2030-01-01T00:00:00Z"}}"#;
        assert_eq!(list(before, &[("aws:CurrentTime", "2026-11-24T00:00:00Z")]), Decision::Allow);
        let all_tags = r#"{"ForAllValues:StringEquals":{"s3:RequestObjectTagKeys":["a","b"]}}"#;
        assert_eq!(
            list(all_tags, &[("s3:RequestObjectTagKeys", "a"), ("s3:RequestObjectTagKeys", "b")]),
            Decision::Allow
        );
        assert_eq!(list(all_tags, &[("s3:RequestObjectTagKeys", "c")]), Decision::Silent);
        let not_eq = r#"{"StringNotEquals":{"s3:x-amz-server-side-encryption":"AES256"}}"#;
        assert_eq!(list(not_eq, &[("s3:x-amz-server-side-encryption", "aws:kms")]), Decision::Allow);
        assert_eq!(list(not_eq, &[("s3:x-amz-server-side-encryption", "AES256")]), Decision::Silent);
    }

    #[test]
    fn malformed_policies_are_refused() {
        let bad = [
            "not json",
            "[]",
            r#"{"Statement":[]}"#,
            r#"{"Version":"2020-01-01","Statement":{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::bkt"}}"#,
            r#"{"Statement":{"Effect":"Maybe","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::bkt"}}"#,
            r#"{"Statement":{"Effect":"Allow","Action":"s3:*","Resource":"arn:aws:s3:::bkt"}}"#,
            r#"{"Statement":{"Effect":"Allow","NotPrincipal":{"AWS":"x"},"Action":"s3:*","Resource":"arn:aws:s3:::bkt"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::other"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"ec2:*","Resource":"arn:aws:s3:::bkt"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::bkt","Condition":{"StringMaybe":{"a":"b"}}}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::bkt","Condition":{"IpAddress":{"aws:SourceIp":"nope"}}}}"#,
        ];
        for b in bad {
            assert!(Policy::parse(b, "bkt").is_err(), "{b}");
        }
        let big = format!(r#"{{"Id":"{}","Statement":[]}}"#, "x".repeat(MAX_POLICY_BYTES));
        assert!(Policy::parse(&big, "bkt").is_err());
        let stmt = r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::bkt/*"}"#;
        let at = format!(r#"{{"Statement":[{}]}}"#, vec![stmt; MAX_STATEMENTS].join(","));
        let past = format!(r#"{{"Statement":[{}]}}"#, vec![stmt; MAX_STATEMENTS + 1].join(","));
        if at.len() <= MAX_POLICY_BYTES {
            Policy::parse(&at, "bkt").unwrap();
        }
        assert!(Policy::parse(&past, "bkt").is_err());
    }

    #[test]
    fn wildcards_and_public_status() {
        assert!(wildcard("s3:get*", "s3:getobject"));
        assert!(wildcard("arn:aws:s3:::b/a?c", "arn:aws:s3:::b/abc"));
        assert!(!wildcard("arn:aws:s3:::b/a?c", "arn:aws:s3:::b/ac"));
        assert!(wildcard("*", ""));
        assert!(wildcard("a*b*c", "axxbyyc") && !wildcard("a*b*c", "axxbyy"));
        assert!(Policy::parse(READ_ALL, "bkt").unwrap().is_public());
        let narrowed = r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject",
            "Resource":"arn:aws:s3:::bkt/*","Condition":{"IpAddress":{"aws:SourceIp":"10.0.0.0/8"}}}}"#;
        assert!(!Policy::parse(narrowed, "bkt").unwrap().is_public());
        assert_eq!(action_of("GetObject", true), "s3:GetObjectVersion");
        assert_eq!(action_of("ListObjectsV2", false), "s3:ListBucket");
        assert_eq!(action_of("PutBucketPolicy", false), "s3:PutBucketPolicy");
    }
}
