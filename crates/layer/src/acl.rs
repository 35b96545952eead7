//! Access control lists as S3 keeps them: a bucket's and each object version's list of grants, stored with
//! the bucket record and the object's metadata record. The layer stores and validates them; who a grantee
//! is (canonical user ids) and what a grant allows is the S3 frontend's business.

use crate::error::{LayerError, LayerResult};
use serde::{Deserialize, Serialize};

/// Most grants in one list (S3's limit).
pub const MAX_ACL_GRANTS: usize = 100;
/// Longest canonical user id a grant may name.
pub const MAX_GRANTEE_ID_BYTES: usize = 128;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permission {
    Read,
    Write,
    ReadAcp,
    WriteAcp,
    FullControl,
}

impl Permission {
    /// Whether holding `self` gives `wanted`.
    pub fn gives(self, wanted: Permission) -> bool {
        self == wanted || self == Permission::FullControl
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Grantee {
    /// A canonical user id.
    User(String),
    /// Everyone, anonymous requests included.
    AllUsers,
    /// Every request signed by a known key.
    AuthenticatedUsers,
    /// S3's log delivery group (accepted and kept; Mosaic delivers no logs).
    LogDelivery,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AclGrant {
    pub grantee: Grantee,
    pub permission: Permission,
}

/// Who owns an object version and who else may do what with it. The default (no owner, no list) is the
/// bucket owner's object with the private ACL, which is also what records of older builds read as.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectAccess {
    /// The canonical id of the writer when it is not the bucket's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// The grants; None: the private ACL (the owner's full control only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<Vec<AclGrant>>,
}

impl ObjectAccess {
    pub fn is_default(&self) -> bool {
        self.owner_id.is_none() && self.acl.is_none()
    }
}

/// A bucket's public access block: which public grants and policies are refused or ignored.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublicAccessBlock {
    /// New public ACLs (on the bucket or its objects) are refused.
    pub block_public_acls: bool,
    /// Public ACL grants are ignored when access is decided.
    pub ignore_public_acls: bool,
    /// A public bucket policy is refused.
    pub block_public_policy: bool,
    /// A public policy admits only the bucket's owner and granted keys, no one else.
    pub restrict_public_buckets: bool,
}

/// Who owns the objects others write into a bucket (S3's object ownership controls).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectOwnership {
    /// ACLs are disabled: the bucket's owner owns every object.
    BucketOwnerEnforced,
    /// Objects written with the bucket-owner-full-control ACL become the bucket owner's.
    BucketOwnerPreferred,
    /// The writer owns what it writes (also what buckets without controls do).
    ObjectWriter,
}

impl AclGrant {
    /// Whether the grant is to everyone or to every signed request.
    pub fn is_public(&self) -> bool {
        matches!(self.grantee, Grantee::AllUsers | Grantee::AuthenticatedUsers)
    }
}

/// Checks a list of grants against the limits.
pub fn validate_acl(grants: &[AclGrant]) -> LayerResult<()> {
    if grants.len() > MAX_ACL_GRANTS {
        return Err(LayerError::InvalidArgument(format!("at most {MAX_ACL_GRANTS} grants in an access control list")));
    }
    for g in grants {
        if let Grantee::User(id) = &g.grantee
            && (id.is_empty() || id.len() > MAX_GRANTEE_ID_BYTES)
        {
            return Err(LayerError::InvalidArgument(format!("a grantee id has 1 to {MAX_GRANTEE_ID_BYTES} bytes")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_control_gives_every_permission() {
        use Permission::*;
        for p in [Read, Write, ReadAcp, WriteAcp, FullControl] {
            assert!(FullControl.gives(p));
            assert!(p.gives(p));
        }
        assert!(!Read.gives(Write));
        assert!(!ReadAcp.gives(Read));
    }

    #[test]
    fn limits_hold_at_and_past_them() {
        let g = |id: String| AclGrant { grantee: Grantee::User(id), permission: Permission::Read };
        let at: Vec<_> = (0..MAX_ACL_GRANTS).map(|i| g(format!("u{i}"))).collect();
        validate_acl(&at).unwrap();
        let mut past = at.clone();
        past.push(g("x".into()));
        assert!(validate_acl(&past).is_err());
        validate_acl(&[g("a".repeat(MAX_GRANTEE_ID_BYTES))]).unwrap();
        assert!(validate_acl(&[g("a".repeat(MAX_GRANTEE_ID_BYTES + 1))]).is_err());
        assert!(validate_acl(&[g(String::new())]).is_err());
    }

    #[test]
    fn default_access_is_not_stored() {
        let json = serde_json::to_string(&ObjectAccess::default()).unwrap();
        assert_eq!(json, "{}");
        let back: ObjectAccess = serde_json::from_str("{}").unwrap();
        assert!(back.is_default());
    }
}
