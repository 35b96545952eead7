//! The S3 layer's own records in the store: a bucket's record, a multipart upload's record and a part's
//! record (JSON attributes with a version), where they live (collection and object names), and the
//! attribute keys. A record of an unknown version is refused and a damaged one is an error naming it,
//! never a default.

use crate::Versioning;
use crate::error::{LayerError, LayerResult};
use crate::meta::PutOptions;
use mosaic_store::with_locator;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Collection of the layer's own state: one object per bucket, holding its record.
pub(crate) const SYS_COLLECTION: &str = "sys";
/// Collection of multipart uploads: one object per upload (its record) and per part (data and record).
pub(crate) const MPU_COLLECTION: &str = "mpu";
/// A bucket's objects live in the collection of this prefix plus the bucket's name.
pub(crate) const BUCKET_PREFIX: &str = "b/";

pub(crate) const ATTR_META: &[u8] = b"s3.meta";
/// The ETag alone, what conditional writes assert on.
pub(crate) const ATTR_ETAG: &[u8] = b"s3.etag";
pub(crate) const ATTR_TAGS: &[u8] = b"s3.tags";
pub(crate) const ATTR_BUCKET: &[u8] = b"bucket";
pub(crate) const ATTR_UPLOAD: &[u8] = b"s3.upload";
pub(crate) const ATTR_PART: &[u8] = b"s3.part";
/// The current version's place among its key's versions (its name suffix, see `versions`): what a new
/// version asserts unchanged.
pub(crate) const ATTR_VERSION: &[u8] = b"s3.vid";

/// The version every record of this build writes and the only one it reads.
pub(crate) const RECORD_VERSION: u8 = 1;

pub(crate) fn bucket_collection(bucket: &str) -> String {
    format!("{BUCKET_PREFIX}{bucket}")
}

/// Where a bucket's objects live in the store, as (collection, name prefix) pairs: its own collection, and
/// its multipart uploads and parts in the uploads' collection. A store that places a bucket's data on some
/// of its devices (a microstore's sets) places what these name.
pub fn bucket_scopes(bucket: &str) -> Vec<(String, Vec<u8>)> {
    vec![(bucket_collection(bucket), Vec::new()), (MPU_COLLECTION.to_string(), format!("{bucket}/").into_bytes())]
}

/// A bucket's record, on the store's home group (an empty locator: see `mosaic_store::locator`), where
/// the store keeps its collections too, so that a bucket and its record are made in one transaction.
pub(crate) fn bucket_record_name(bucket: &str) -> Vec<u8> {
    with_locator(format!("bucket/{bucket}").as_bytes(), b"")
}

/// An upload's record, placed with the object it becomes (its key is the locator).
pub(crate) fn upload_name(bucket: &str, upload_id: &str, key: &str) -> Vec<u8> {
    with_locator(format!("{bucket}/{upload_id}").as_bytes(), key.as_bytes())
}

/// A part, placed with the object it becomes, so that completion clones it there without moving data.
pub(crate) fn part_name(bucket: &str, upload_id: &str, part: u32, key: &str) -> Vec<u8> {
    with_locator(format!("{bucket}/{upload_id}/{part:05}").as_bytes(), key.as_bytes())
}

/// The prefix of every part name of an upload.
pub(crate) fn parts_prefix(bucket: &str, upload_id: &str) -> Vec<u8> {
    format!("{bucket}/{upload_id}/").into_bytes()
}

/// A record with a version byte that is checked on decode.
pub(crate) trait Record: Serialize + DeserializeOwned {
    /// What the record is, for errors ("the record of bucket b").
    const KIND: &'static str;
    fn version(&self) -> u8;

    fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.version(), RECORD_VERSION);
        let raw = serde_json::to_vec(self).expect("records serialize");
        debug_assert!(Self::decode(&raw, "").is_ok(), "a {} decodes back before it is written", Self::KIND);
        raw
    }

    /// Decodes the record of `whose` (named in errors).
    fn decode(raw: &[u8], whose: &str) -> LayerResult<Self> {
        let r: Self = serde_json::from_slice(raw)
            .map_err(|e| LayerError::Corrupt(format!("the {} record{whose} is damaged: {e}", Self::KIND)))?;
        if r.version() != RECORD_VERSION {
            return Err(LayerError::Corrupt(format!(
                "the {} record{whose} has version {}; this build reads version {RECORD_VERSION}",
                Self::KIND,
                r.version()
            )));
        }
        Ok(r)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct BucketRecord {
    pub(crate) version: u8,
    pub(crate) created_unix_ms: i64,
    /// Absent in records of older builds and of buckets never versioned.
    #[serde(default, skip_serializing_if = "Versioning::is_unversioned")]
    pub(crate) versioning: Versioning,
    /// The access key that created the bucket and owns it; None for the root key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// Object lock, once enabled (never disabled again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) object_lock: Option<crate::lock::LockConfig>,
    /// Bucket tags, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tags: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lifecycle: Option<Vec<crate::lifecycle::LifecycleRule>>,
    /// The bucket's ACL; absent: private (the owner's full control only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) acl: Option<Vec<crate::acl::AclGrant>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cors: Option<Vec<crate::cors::CorsRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) public_access_block: Option<crate::acl::PublicAccessBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) object_ownership: Option<crate::acl::ObjectOwnership>,
    /// Default encryption of writes that ask for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) encryption: Option<crate::sse::BucketEncryption>,
}

impl Record for BucketRecord {
    const KIND: &'static str = "bucket";
    fn version(&self) -> u8 {
        self.version
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) struct UploadRecord {
    pub(crate) version: u8,
    pub(crate) key: String,
    pub(crate) initiated_unix_ms: i64,
    pub(crate) opts: PutOptions,
}

impl Record for UploadRecord {
    const KIND: &'static str = "multipart upload";
    fn version(&self) -> u8 {
        self.version
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartRecord {
    pub(crate) version: u8,
    pub(crate) etag: String,
    pub(crate) size_bytes: u64,
    pub(crate) last_modified_unix_ms: i64,
    pub(crate) checksums: Vec<(String, String)>,
    /// The salt of the part's stream, when its upload is encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sse_salt: Option<String>,
}

impl Record for PartRecord {
    const KIND: &'static str = "part";
    fn version(&self) -> u8 {
        self.version
    }
}

/// Object tags as stored: a JSON list of (key, value), without a version of their own (they change with
/// the metadata record's version, `meta::META_VERSION`).
pub(crate) fn decode_tags(raw: &[u8], whose: &str) -> LayerResult<Vec<(String, String)>> {
    serde_json::from_slice(raw).map_err(|e| LayerError::Corrupt(format!("the tags of {whose} are damaged: {e}")))
}

pub(crate) fn encode_tags(tags: &[(String, String)]) -> Vec<u8> {
    serde_json::to_vec(tags).expect("tags serialize")
}

/// Now in ns since the epoch (0 if the clock is before it).
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let b = BucketRecord {
            version: RECORD_VERSION,
            created_unix_ms: 5,
            versioning: Versioning::Enabled,
            owner: Some("k".into()),
            object_lock: Some(crate::lock::LockConfig { enabled: true, default_retention: None }),
            tags: vec![("k".into(), "v".into())],
            lifecycle: Some(vec![crate::lifecycle::LifecycleRule { id: "r".into(), ..Default::default() }]),
            acl: Some(vec![crate::acl::AclGrant {
                grantee: crate::acl::Grantee::AllUsers,
                permission: crate::acl::Permission::Read,
            }]),
            cors: Some(vec![crate::cors::CorsRule {
                allowed_origins: vec!["*".into()],
                allowed_methods: vec!["GET".into()],
                max_age_s: Some(5),
                ..Default::default()
            }]),
            policy: Some("{}".into()),
            public_access_block: Some(crate::acl::PublicAccessBlock { block_public_acls: true, ..Default::default() }),
            object_ownership: Some(crate::acl::ObjectOwnership::BucketOwnerPreferred),
            encryption: Some(crate::sse::BucketEncryption {
                mode: crate::sse::SseMode::Kms,
                kms_key_id: Some("k1".into()),
                bucket_key_enabled: true,
            }),
        };
        assert_eq!(BucketRecord::decode(&b.encode(), " of bucket b").unwrap(), b);
        let p = PartRecord {
            version: RECORD_VERSION,
            etag: "e".into(),
            size_bytes: 3,
            last_modified_unix_ms: 4,
            checksums: vec![("CRC32".into(), "x".into())],
            sse_salt: Some("00".repeat(16)),
        };
        assert_eq!(PartRecord::decode(&p.encode(), "").unwrap(), p);
        let u = UploadRecord {
            version: RECORD_VERSION,
            key: "k".into(),
            initiated_unix_ms: 1,
            opts: PutOptions::default(),
        };
        assert_eq!(UploadRecord::decode(&u.encode(), "").unwrap(), u);
    }

    /// An unknown version is refused, and damage is an error that names the record: never a default value
    /// (a damaged bucket record once read as created at time 0).
    #[test]
    fn unknown_versions_and_damage_are_errors_naming_the_record() {
        let future = br#"{"version":2,"created_unix_ms":5}"#;
        let e = BucketRecord::decode(future, " of bucket photos").unwrap_err();
        assert_eq!(
            e,
            LayerError::Corrupt("the bucket record of bucket photos has version 2; this build reads version 1".into())
        );
        for damaged in [&b"{"[..], b"", b"\xff", br#"{"version":1}"#] {
            let e = BucketRecord::decode(damaged, " of bucket photos").unwrap_err();
            let LayerError::Corrupt(what) = e else { panic!("{e:?}") };
            assert!(what.starts_with("the bucket record of bucket photos is damaged"), "{what}");
        }
        let e = PartRecord::decode(
            br#"{"version":0,"etag":"","size_bytes":0,"last_modified_unix_ms":0,"checksums":[]}"#,
            " 3",
        )
        .unwrap_err();
        assert!(matches!(e, LayerError::Corrupt(w) if w.contains("part record 3 has version 0")));
        assert!(decode_tags(b"[1]", "b/k").is_err());
    }
}
