//! Capabilities (paper 003): every drive command carries a short-lived token, signed with a key only the
//! cluster's nodes derive, that names the drive, the part of it the holder may reach and the operations it
//! may run there. The drive's node checks it before it runs the command (`mosaic_remote::server`), so a
//! command can reach only what its issuer planned: a placement group's erasure set reaches its own
//! collections at its own shard position on each drive and nothing else, and a token seen on the way
//! (without TLS) opens nothing else and nothing after it expires.
//!
//! The issuer is the frontend that plans the command (DESIGN.md section 5), which holds the cluster
//! secret; the key is derived from the secret for this purpose only, so a capability is never a valid
//! call signature and the other way round.
//!
//! `scope` is a prefix of the drive's collection names (a placement group's slot, `pg00007.2/`); the drive
//! resolves every collection a command names, by name or by id, and every object it names, by the snapshot
//! that found it, and refuses what lies outside the scope.

use crate::rpc::Secret;
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The version of capabilities this build issues and the only one it accepts.
pub const CAPABILITY_VERSION: u8 = 1;
/// How long a capability lasts after it is issued.
pub const LIFETIME_MS: u64 = 5 * 60 * 1000;
/// How far the clocks of two nodes may differ (the same bound as a call's signature).
pub const CLOCK_SKEW_MS: u64 = 5 * 60 * 1000;
/// Longest drive name and scope a capability names.
pub const MAX_NAME_BYTES: usize = 1024;

/// The operations a capability allows, as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ops(u8);

impl Ops {
    /// Asking a drive for its geometry and readiness (names no collection).
    pub const CONNECT: Ops = Ops(1);
    /// Snapshot reads: collections, names, attributes, bytes.
    pub const READ: Ops = Ops(2);
    /// Staging units for a later commit.
    pub const STAGE: Ops = Ops(4);
    /// Committing transactions.
    pub const COMMIT: Ops = Ops(8);
    /// Everything a placement group's erasure set does on its drives.
    pub const SET: Ops = Ops(Self::READ.0 | Self::STAGE.0 | Self::COMMIT.0);

    pub const fn union(self, other: Ops) -> Ops {
        Ops(self.0 | other.0)
    }

    pub const fn contains(self, other: Ops) -> bool {
        self.0 & other.0 == other.0
    }
}

/// A capability as it travels with a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub version: u8,
    /// The node that issued it (for logs; the key is the cluster's).
    pub issuer: u64,
    pub drive: String,
    /// The drive's collections it reaches: those whose name starts with this.
    pub scope: String,
    pub ops: Ops,
    pub expires_unix_ms: u64,
    pub mac: [u8; 32],
}

impl Capability {
    /// Whether it allows every operation of `ops`.
    pub fn allows(&self, ops: Ops) -> bool {
        self.ops.contains(ops)
    }

    /// Whether the drive's collection `name` lies in its scope.
    pub fn covers(&self, name: &str) -> bool {
        name.starts_with(&self.scope)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilityError {
    #[error("a capability of version {0}; this build accepts version {CAPABILITY_VERSION}")]
    Version(u8),
    #[error("a capability whose signature fails (issued with another cluster's key, or altered)")]
    Signature,
    #[error("a capability for drive {got}, used on drive {want}")]
    Drive { got: String, want: String },
    #[error("a capability that expired {0} ms ago")]
    Expired(u64),
    #[error("a capability that lasts {0} ms from now, longer than any this cluster issues")]
    TooLong(u64),
    #[error("a capability whose drive or scope is over {MAX_NAME_BYTES} bytes")]
    TooLarge,
}

/// The key capabilities are signed with: derived from the cluster secret, for capabilities only.
#[derive(Clone)]
pub struct CapabilityKey([u8; 32]);

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

impl CapabilityKey {
    pub fn of(secret: &Secret) -> Self {
        CapabilityKey(secret.derive(b"mosaic capability key, version 1"))
    }

    fn mac(&self, c: &Capability) -> hmac::Hmac<Sha256> {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(&[c.version]);
        mac.update(&c.issuer.to_be_bytes());
        // Lengths first, so that no two (drive, scope) pairs sign the same bytes.
        for field in [c.drive.as_bytes(), c.scope.as_bytes()] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac.update(&[c.ops.0]);
        mac.update(&c.expires_unix_ms.to_be_bytes());
        mac
    }

    /// A capability of node `issuer` for `ops` on the collections of `drive` under `scope`, issued at
    /// `now_unix_ms`.
    pub fn issue(&self, issuer: u64, drive: &str, scope: &str, ops: Ops, now_unix_ms: u64) -> Capability {
        let mut c = Capability {
            version: CAPABILITY_VERSION,
            issuer,
            drive: drive.to_string(),
            scope: scope.to_string(),
            ops,
            expires_unix_ms: now_unix_ms.saturating_add(LIFETIME_MS),
            mac: [0; 32],
        };
        c.mac = self.mac(&c).finalize().into_bytes().into();
        debug_assert!(
            self.verify(&c, drive, now_unix_ms).is_ok() || drive.len() > MAX_NAME_BYTES || scope.len() > MAX_NAME_BYTES
        );
        c
    }

    /// Whether `c` is a capability this cluster issued for `drive`, in force at `now_unix_ms`.
    pub fn verify(&self, c: &Capability, drive: &str, now_unix_ms: u64) -> Result<(), CapabilityError> {
        if c.version != CAPABILITY_VERSION {
            return Err(CapabilityError::Version(c.version));
        }
        if c.drive.len() > MAX_NAME_BYTES || c.scope.len() > MAX_NAME_BYTES {
            return Err(CapabilityError::TooLarge);
        }
        self.mac(c).verify_slice(&c.mac).map_err(|_| CapabilityError::Signature)?;
        if c.drive != drive {
            return Err(CapabilityError::Drive { got: c.drive.clone(), want: drive.to_string() });
        }
        if now_unix_ms > c.expires_unix_ms.saturating_add(CLOCK_SKEW_MS) {
            return Err(CapabilityError::Expired(now_unix_ms - c.expires_unix_ms));
        }
        let lasts_ms = c.expires_unix_ms.saturating_sub(now_unix_ms);
        if lasts_ms > LIFETIME_MS + CLOCK_SKEW_MS {
            return Err(CapabilityError::TooLong(lasts_ms));
        }
        Ok(())
    }
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn an_issued_capability_verifies_on_its_drive_until_it_expires() {
        let key = CapabilityKey::of(&Secret::generate());
        let c = key.issue(3, "d0", "pg00007.2/", Ops::SET, NOW);
        assert_eq!(key.verify(&c, "d0", NOW), Ok(()));
        assert!(c.allows(Ops::READ) && c.allows(Ops::SET) && !c.allows(Ops::CONNECT));
        assert!(c.covers("pg00007.2/bucket") && !c.covers("pg00007.1/bucket") && !c.covers("pg00017.2/"));
        // At the limits of its life, allowing for clocks that differ.
        let last_ms = c.expires_unix_ms + CLOCK_SKEW_MS;
        assert_eq!(key.verify(&c, "d0", last_ms), Ok(()));
        assert_eq!(key.verify(&c, "d0", last_ms + 1), Err(CapabilityError::Expired(CLOCK_SKEW_MS + 1)));
        assert_eq!(key.verify(&c, "d0", NOW - CLOCK_SKEW_MS), Ok(()));
        assert!(matches!(key.verify(&c, "d0", NOW - CLOCK_SKEW_MS - 1), Err(CapabilityError::TooLong(_))));
        assert!(matches!(key.verify(&c, "d1", NOW), Err(CapabilityError::Drive { .. })));
    }

    #[test]
    fn an_altered_or_foreign_capability_is_refused() {
        let key = CapabilityKey::of(&Secret::generate());
        let c = key.issue(3, "d0", "pg00007.2/", Ops::READ, NOW);
        let other = CapabilityKey::of(&Secret::generate());
        assert_eq!(other.verify(&c, "d0", NOW), Err(CapabilityError::Signature));
        let alter: [fn(&mut Capability); 6] = [
            |c| c.ops = Ops::SET,
            |c| c.scope = "pg00007.".into(),
            |c| c.scope = String::new(),
            |c| c.expires_unix_ms += 1,
            |c| c.issuer = 4,
            |c| c.mac[31] ^= 1,
        ];
        for f in alter {
            let mut forged = c.clone();
            f(&mut forged);
            assert_eq!(key.verify(&forged, "d0", NOW), Err(CapabilityError::Signature), "{forged:?}");
        }
        // A drive name moved into the scope signs other bytes.
        let split = key.issue(3, "d0pg", "00007.2/", Ops::READ, NOW);
        let moved = Capability { drive: "d0".into(), scope: "pg00007.2/".into(), ..split };
        assert_eq!(key.verify(&moved, "d0", NOW), Err(CapabilityError::Signature));
        let newer = Capability { version: CAPABILITY_VERSION + 1, ..c.clone() };
        assert_eq!(key.verify(&newer, "d0", NOW), Err(CapabilityError::Version(CAPABILITY_VERSION + 1)));
        let huge = key.issue(3, "d0", &"x".repeat(MAX_NAME_BYTES + 1), Ops::READ, NOW);
        assert_eq!(key.verify(&huge, "d0", NOW), Err(CapabilityError::TooLarge));
    }

    #[test]
    fn the_key_is_not_the_secret() {
        let secret = Secret::generate();
        let key = CapabilityKey::of(&secret);
        assert_ne!(key.0, secret.derive(b"another purpose"));
        assert_eq!(key.0, CapabilityKey::of(&Secret::parse(&secret.to_hex()).unwrap()).0);
    }
}
