//! S3 access control lists over the layer's stored grants: canonical user ids of access keys, canned ACLs,
//! the x-amz-grant-* headers, the AccessControlPolicy document, and what a list of grants allows whom.
//!
//! A canonical user id is derived from an access key (a SHA-256, hex, as long as AWS's), so it names a key
//! without revealing it. Grants by e-mail address are refused (keys have none).

use mosaic_layer::{AclGrant, Grantee, Permission};
use s3s::dto::{self, AccessControlPolicy, Grants, Owner};
use s3s::{S3Result, s3_error};
use sha2::{Digest, Sha256};

/// AWS's canonical id of anonymous requesters (the owner of what they write).
pub const ANONYMOUS_ID: &str = "65a011a29cdf8ec533ec3d1ccaae921c";
const ALL_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
const AUTHENTICATED_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";
const LOG_DELIVERY_URI: &str = "http://acs.amazonaws.com/groups/s3/LogDelivery";
/// Longest x-amz-grant-* header accepted.
const MAX_GRANT_HEADER_BYTES: usize = 8 * 1024;

/// The canonical user id of an access key.
pub fn canonical_id(access_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"mosaic canonical id\0");
    h.update(access_key.as_bytes());
    hex::encode(h.finalize())
}

/// Who asks: a canonical id, or nobody (an anonymous request).
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    pub id: Option<&'a str>,
}

/// Whether `grants` give `requester` the permission `wanted`.
pub fn allows(grants: &[AclGrant], requester: Requester<'_>, wanted: Permission) -> bool {
    grants.iter().any(|g| {
        g.permission.gives(wanted)
            && match &g.grantee {
                Grantee::AllUsers => true,
                Grantee::AuthenticatedUsers => requester.id.is_some(),
                Grantee::User(id) => requester.id == Some(id.as_str()),
                Grantee::LogDelivery => false,
            }
    })
}

/// The private ACL: the owner's full control.
pub fn private(owner_id: &str) -> Vec<AclGrant> {
    vec![AclGrant { grantee: Grantee::User(owner_id.to_string()), permission: Permission::FullControl }]
}

/// What is stored for a list of grants: nothing for the private ACL (the default), else the list.
pub fn stored(grants: Vec<AclGrant>, owner_id: &str) -> Option<Vec<AclGrant>> {
    (grants != private(owner_id)).then_some(grants)
}

/// A canned ACL as grants. `bucket_owner_id` is the bucket's owner, for the bucket-owner-* ACLs of objects.
/// The owner's full control comes last (as RGW lists it; clients that sort grants by display name expect
/// the groups, which have none, not to come first).
pub fn canned(name: &str, owner_id: &str, bucket_owner_id: &str) -> S3Result<Vec<AclGrant>> {
    let mut g = Vec::new();
    let mut add = |grantee, permission| g.push(AclGrant { grantee, permission });
    match name {
        "private" => {}
        "public-read" => add(Grantee::AllUsers, Permission::Read),
        "public-read-write" => {
            add(Grantee::AllUsers, Permission::Read);
            add(Grantee::AllUsers, Permission::Write);
        }
        "authenticated-read" => add(Grantee::AuthenticatedUsers, Permission::Read),
        "bucket-owner-read" if bucket_owner_id != owner_id => {
            add(Grantee::User(bucket_owner_id.to_string()), Permission::Read)
        }
        "bucket-owner-full-control" if bucket_owner_id != owner_id => {
            add(Grantee::User(bucket_owner_id.to_string()), Permission::FullControl)
        }
        "bucket-owner-read" | "bucket-owner-full-control" => {}
        "log-delivery-write" => {
            add(Grantee::LogDelivery, Permission::Write);
            add(Grantee::LogDelivery, Permission::ReadAcp);
        }
        other => return Err(s3_error!(InvalidArgument, "unknown canned ACL: {other}")),
    }
    g.extend(private(owner_id));
    Ok(g)
}

/// The grants of the x-amz-grant-* headers (read, write, read-acp, write-acp, full-control), or None when
/// none is given. `known` says whether a canonical id names a key.
pub fn from_headers(
    headers: [(Option<&str>, Permission); 5],
    known: &dyn Fn(&str) -> bool,
) -> S3Result<Option<Vec<AclGrant>>> {
    let mut out = Vec::new();
    let mut any = false;
    for (value, permission) in headers {
        let Some(value) = value else { continue };
        any = true;
        if value.len() > MAX_GRANT_HEADER_BYTES {
            return Err(s3_error!(InvalidArgument, "an x-amz-grant header has at most {MAX_GRANT_HEADER_BYTES} bytes"));
        }
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (kind, v) = item
                .split_once('=')
                .ok_or_else(|| s3_error!(InvalidArgument, "a grantee is type=\"value\": {item}"))?;
            let v = v.trim().trim_matches('"');
            let grantee = match kind.trim().to_ascii_lowercase().as_str() {
                "id" => user(v, known)?,
                "uri" => group(v)?,
                "emailaddress" => return Err(unresolvable_email(v)),
                _ => return Err(s3_error!(InvalidArgument, "unknown grantee type in {item}")),
            };
            out.push(AclGrant { grantee, permission });
        }
    }
    Ok(any.then_some(out))
}

/// The grants of an AccessControlPolicy document. Its owner, when named, must be the resource's.
pub fn from_policy(
    policy: AccessControlPolicy,
    owner_id: &str,
    known: &dyn Fn(&str) -> bool,
) -> S3Result<Vec<AclGrant>> {
    if let Some(id) = policy.owner.as_ref().and_then(|o| o.id.as_deref())
        && id != owner_id
    {
        return Err(s3_error!(AccessDenied, "the owner of an ACL cannot be changed"));
    }
    let mut out = Vec::new();
    for g in policy.grants.unwrap_or_default() {
        let (Some(grantee), Some(permission)) = (g.grantee, g.permission) else {
            return Err(s3_error!(MalformedACLError, "a grant needs a grantee and a permission"));
        };
        let permission = match permission.as_str() {
            "READ" => Permission::Read,
            "WRITE" => Permission::Write,
            "READ_ACP" => Permission::ReadAcp,
            "WRITE_ACP" => Permission::WriteAcp,
            "FULL_CONTROL" => Permission::FullControl,
            other => return Err(s3_error!(MalformedACLError, "unknown permission {other}")),
        };
        let grantee = match grantee.type_.as_str() {
            "CanonicalUser" => user(grantee.id.as_deref().unwrap_or(""), known)?,
            "Group" => group(grantee.uri.as_deref().unwrap_or(""))?,
            "AmazonCustomerByEmail" => return Err(unresolvable_email(grantee.email_address.as_deref().unwrap_or(""))),
            other => return Err(s3_error!(MalformedACLError, "unknown grantee type {other}")),
        };
        out.push(AclGrant { grantee, permission });
    }
    Ok(out)
}

fn user(id: &str, known: &dyn Fn(&str) -> bool) -> S3Result<Grantee> {
    if !known(id) {
        return Err(s3_error!(InvalidArgument, "no user has the canonical id {id:?}"));
    }
    Ok(Grantee::User(id.to_string()))
}

fn group(uri: &str) -> S3Result<Grantee> {
    match uri {
        ALL_USERS_URI => Ok(Grantee::AllUsers),
        AUTHENTICATED_USERS_URI => Ok(Grantee::AuthenticatedUsers),
        LOG_DELIVERY_URI => Ok(Grantee::LogDelivery),
        other => Err(s3_error!(InvalidArgument, "unknown group {other:?}")),
    }
}

fn unresolvable_email(email: &str) -> s3s::S3Error {
    s3_error!(UnresolvableGrantByEmailAddress, "grants by e-mail address are not supported ({email})")
}

/// The Owner and Grants of a GetBucketAcl or GetObjectAcl answer. `name_of` gives a canonical id's
/// display name.
/// Group grants come first (they have no display name; clients that sort grants by it expect that).
pub fn to_dto(grants: &[AclGrant], owner_id: &str, name_of: &dyn Fn(&str) -> Option<String>) -> (Owner, Grants) {
    let owner = Owner { id: Some(owner_id.to_string()), display_name: name_of(owner_id) };
    let (groups, users): (Vec<&AclGrant>, Vec<&AclGrant>) =
        grants.iter().partition(|g| !matches!(g.grantee, Grantee::User(_)));
    let grants = groups
        .into_iter()
        .chain(users)
        .map(|g| {
            let grantee = match &g.grantee {
                Grantee::User(id) => dto::Grantee {
                    display_name: name_of(id),
                    email_address: None,
                    id: Some(id.clone()),
                    type_: dto::Type::from_static(dto::Type::CANONICAL_USER),
                    uri: None,
                },
                Grantee::AllUsers | Grantee::AuthenticatedUsers | Grantee::LogDelivery => dto::Grantee {
                    display_name: None,
                    email_address: None,
                    id: None,
                    type_: dto::Type::from_static(dto::Type::GROUP),
                    uri: Some(group_uri(&g.grantee).to_string()),
                },
            };
            let permission = match g.permission {
                Permission::Read => dto::Permission::READ,
                Permission::Write => dto::Permission::WRITE,
                Permission::ReadAcp => dto::Permission::READ_ACP,
                Permission::WriteAcp => dto::Permission::WRITE_ACP,
                Permission::FullControl => dto::Permission::FULL_CONTROL,
            };
            dto::Grant { grantee: Some(grantee), permission: Some(dto::Permission::from_static(permission)) }
        })
        .collect();
    (owner, grants)
}

fn group_uri(g: &Grantee) -> &'static str {
    match g {
        Grantee::AllUsers => ALL_USERS_URI,
        Grantee::AuthenticatedUsers => AUTHENTICATED_USERS_URI,
        _ => LOG_DELIVERY_URI,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const YOU: &str = "you";

    fn known(id: &str) -> bool {
        id == ME || id == YOU
    }

    #[test]
    fn canonical_ids_are_stable_and_distinct() {
        let a = canonical_id("AKIAEXAMPLE");
        assert_eq!(a.len(), 64);
        assert_eq!(a, canonical_id("AKIAEXAMPLE"));
        assert_ne!(a, canonical_id("AKIAEXAMPLF"));
        // Pinned: clients and the s3-tests configuration derive it the same way.
        assert_eq!(canonical_id("k"), "c0dd152023e0c6cf9a4a225bd0b2a3f9e8c37385eff4f256bd226a1d3bd428c1");
    }

    #[test]
    fn canned_acls_give_what_they_say() {
        let anon = Requester { id: None };
        let you = Requester { id: Some(YOU) };
        let me = Requester { id: Some(ME) };
        let pr = canned("public-read", ME, ME).unwrap();
        assert!(allows(&pr, anon, Permission::Read) && !allows(&pr, anon, Permission::Write));
        assert!(allows(&pr, me, Permission::WriteAcp));
        let prw = canned("public-read-write", ME, ME).unwrap();
        assert!(allows(&prw, anon, Permission::Write) && !allows(&prw, anon, Permission::ReadAcp));
        let ar = canned("authenticated-read", ME, ME).unwrap();
        assert!(allows(&ar, you, Permission::Read) && !allows(&ar, anon, Permission::Read));
        let bor = canned("bucket-owner-read", ME, YOU).unwrap();
        assert!(allows(&bor, you, Permission::Read) && !allows(&bor, you, Permission::Write));
        let bofc = canned("bucket-owner-full-control", ME, YOU).unwrap();
        assert!(allows(&bofc, you, Permission::WriteAcp));
        assert_eq!(canned("bucket-owner-full-control", ME, ME).unwrap(), private(ME));
        assert!(!allows(&canned("private", ME, ME).unwrap(), you, Permission::Read));
        assert!(canned("everyone-may", ME, ME).is_err());
        assert_eq!(stored(canned("private", ME, ME).unwrap(), ME), None);
        assert!(stored(pr, ME).is_some());
    }

    #[test]
    fn grant_headers_parse_and_refuse_unknown_grantees() {
        let g = from_headers(
            [
                (Some("id=\"you\", uri=\"http://acs.amazonaws.com/groups/global/AllUsers\""), Permission::Read),
                (None, Permission::Write),
                (None, Permission::ReadAcp),
                (None, Permission::WriteAcp),
                (Some("id=me"), Permission::FullControl),
            ],
            &known,
        )
        .unwrap()
        .unwrap();
        assert_eq!(g.len(), 3);
        assert!(allows(&g, Requester { id: None }, Permission::Read));
        assert!(allows(&g, Requester { id: Some(ME) }, Permission::WriteAcp));
        let none = [
            (None, Permission::Read),
            (None, Permission::Write),
            (None, Permission::ReadAcp),
            (None, Permission::WriteAcp),
            (None, Permission::FullControl),
        ];
        assert_eq!(from_headers(none, &known).unwrap(), None);
        let bad = |v: &'static str| {
            let mut h = none;
            h[0].0 = Some(v);
            from_headers(h, &known).unwrap_err().code().as_str().to_string()
        };
        assert_eq!(bad("id=\"nobody\""), "InvalidArgument");
        assert_eq!(bad("emailAddress=\"a@b.c\""), "UnresolvableGrantByEmailAddress");
        assert_eq!(bad("uri=\"http://example.com/group\""), "InvalidArgument");
        assert_eq!(bad("nonsense"), "InvalidArgument");
        let long = Box::leak(format!("id=\"{}\"", "x".repeat(MAX_GRANT_HEADER_BYTES)).into_boxed_str());
        assert_eq!(bad(long), "InvalidArgument");
    }

    #[test]
    fn policies_round_trip_through_the_dto() {
        let grants = vec![
            AclGrant { grantee: Grantee::User(ME.into()), permission: Permission::FullControl },
            AclGrant { grantee: Grantee::User(YOU.into()), permission: Permission::ReadAcp },
            AclGrant { grantee: Grantee::AuthenticatedUsers, permission: Permission::Read },
        ];
        let (owner, dto_grants) = to_dto(&grants, ME, &|id| Some(format!("name of {id}")));
        // Groups first, users after, each in their order.
        let grants = vec![grants[2].clone(), grants[0].clone(), grants[1].clone()];
        assert_eq!(owner.display_name.as_deref(), Some("name of me"));
        let policy = AccessControlPolicy { grants: Some(dto_grants), owner: Some(owner) };
        assert_eq!(from_policy(policy.clone(), ME, &known).unwrap(), grants);
        assert_eq!(from_policy(policy, YOU, &known).unwrap_err().code().as_str(), "AccessDenied");
    }
}
