//! Object metadata as stored with each object (one versioned JSON attribute), the options of a write, and
//! the evaluation of conditional requests.

use crate::acl::ObjectAccess;
use crate::error::{LayerError, LayerResult};
use crate::names::MAX_USER_METADATA_BYTES;
use crate::parts::RECORD_PARTS_MAX;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const META_VERSION: u8 = 1;
/// The version of an encrypted object's record: builds that know no encryption refuse it rather than
/// serve its ciphertext as the object.
pub const META_VERSION_ENCRYPTED: u8 = 2;
/// The version of a record whose object keeps its part table apart (more than `RECORD_PARTS_MAX` parts,
/// see `parts`), encrypted or not: builds that would read it without its parts refuse it.
pub const META_VERSION_PARTS_APART: u8 = 3;

/// User metadata (`x-amz-meta-mosaic-priority`) whose value `high` marks an object high-priority (paper
/// 003's prioritized objects): its reads and writes run in the drive's foreground-high class and hold
/// background work back.
pub const PRIORITY_METADATA_KEY: &str = "mosaic-priority";

/// Whether user metadata asks for high priority.
pub fn wants_high_priority(user_metadata: &BTreeMap<String, String>) -> bool {
    user_metadata.get(PRIORITY_METADATA_KEY).is_some_and(|v| v.trim().eq_ignore_ascii_case("high"))
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    pub version: u8,
    pub size_bytes: u64,
    /// Hex MD5 of the body, or for multipart the MD5 of the part MD5s followed by "-N"; no quotes.
    pub etag: String,
    pub last_modified_unix_ms: i64,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    pub expires: Option<String>,
    pub user_metadata: BTreeMap<String, String>,
    /// Checksums by algorithm ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256") plus "TYPE".
    pub checksums: BTreeMap<String, String>,
    /// Sizes of the parts of a multipart object, in order; empty for a simple PUT.
    pub part_sizes: Vec<u64>,
    /// The checksum of each part (base64) in the algorithm of the object's checksum, in order; empty for a
    /// simple PUT and for uploads whose parts carried none. Answers GET/HEAD `partNumber` and
    /// GetObjectAttributes' parts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub part_checksums: Vec<String>,
    /// How many parts the object has when its part table (sizes, and salts when encrypted) is kept apart
    /// (record version 3, see `parts`); 0 when the record holds them. A record read alone (`decode`) has
    /// this set and `part_sizes` (and salts) empty until the table is read (`read_meta` does).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub parts_apart: usize,
    /// The multipart upload that made this object: a repeated CompleteMultipartUpload of it (an SDK retrying
    /// after a timeout) is answered again. Optional, so records without it (older builds) read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    /// The version id; None is the "null" version (unversioned and suspended buckets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// When the version was made (ns since the epoch, strictly increasing per key), which orders a key's
    /// versions; 0 where no versioning applied (older builds, unversioned buckets): then the mtime orders.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version_ns: u64,
    /// A delete marker: no body, GET answers 404 (405 by version id).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete_marker: bool,
    /// Object lock: until when (and how strictly) the version cannot be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<crate::lock::Retention>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub legal_hold: bool,
    /// How many tags the version has (x-amz-tagging-count), kept with the tags in one transaction.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub tag_count: usize,
    /// The version's owner (when not the bucket's) and ACL; absent: the bucket owner's, private.
    #[serde(default, skip_serializing_if = "ObjectAccess::is_default")]
    pub access: ObjectAccess,
    /// Encryption at rest: the sealed object key and the streams' salts (record version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sse: Option<crate::sse::SseMeta>,
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ObjectMeta {
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(self.parts_apart == 0 || self.part_sizes.is_empty() || self.part_sizes.len() == self.parts_apart);
        let mut m = self.clone();
        if m.part_sizes.len() > RECORD_PARTS_MAX {
            m.parts_apart = std::mem::take(&mut m.part_sizes).len();
            if let Some(sse) = &mut m.sse {
                sse.salts = Vec::new();
            }
        }
        m.version = match (m.parts_apart > 0, m.sse.is_some()) {
            (true, _) => META_VERSION_PARTS_APART,
            (false, true) => META_VERSION_ENCRYPTED,
            (false, false) => META_VERSION,
        };
        serde_json::to_vec(&m).expect("metadata serializes")
    }

    pub fn decode(raw: &[u8]) -> LayerResult<Self> {
        let m: ObjectMeta =
            serde_json::from_slice(raw).map_err(|e| LayerError::Corrupt(format!("object metadata: {e}")))?;
        let expected = match (m.parts_apart > 0, m.sse.is_some()) {
            (true, _) => META_VERSION_PARTS_APART,
            (false, true) => META_VERSION_ENCRYPTED,
            (false, false) => META_VERSION,
        };
        if m.version != expected {
            return Err(LayerError::Corrupt(format!("object metadata version {}", m.version)));
        }
        if m.parts_apart > 0
            && (!m.part_sizes.is_empty()
                || m.sse.as_ref().is_some_and(|s| !s.salts.is_empty())
                || m.parts_apart <= RECORD_PARTS_MAX
                || m.parts_apart > crate::MAX_PARTS as usize)
        {
            return Err(LayerError::Corrupt(format!("object metadata with {} parts kept apart", m.parts_apart)));
        }
        Ok(ObjectMeta { version: META_VERSION, ..m })
    }

    /// Whether the part sizes are kept apart and not read yet.
    pub(crate) fn parts_unread(&self) -> bool {
        self.parts_apart > 0 && self.part_sizes.len() != self.parts_apart
    }

    /// The chunks of the part table to keep apart, when the object has more than `RECORD_PARTS_MAX` parts.
    pub(crate) fn part_table(&self) -> LayerResult<Option<Vec<Vec<u8>>>> {
        if self.part_sizes.len() <= RECORD_PARTS_MAX {
            return Ok(None);
        }
        crate::parts::encode(&self.part_sizes, self.sse.as_ref().map(|s| &s.salts[..])).map(Some)
    }

    /// How many attributes hold the part table kept apart (0: the record holds it).
    pub(crate) fn part_table_chunks(&self) -> usize {
        match self.parts_apart {
            0 => 0,
            n => crate::parts::chunk_count(n, self.sse.is_some()),
        }
    }

    /// Fills in the part sizes (and salts) kept apart from the table's chunks joined in order; refuses a
    /// table that does not match the record.
    pub(crate) fn read_part_table(&mut self, raw: &[u8]) -> LayerResult<()> {
        let (sizes, salts) = crate::parts::decode(raw, self.parts_apart, self.sse.is_some())?;
        if sizes.iter().sum::<u64>() != self.size_bytes {
            return Err(LayerError::Corrupt("the part table's sizes do not add up to the object".into()));
        }
        self.part_sizes = sizes;
        if let (Some(sse), Some(salts)) = (&mut self.sse, salts) {
            sse.salts = salts;
        }
        debug_assert!(!self.parts_unread());
        Ok(())
    }

    /// Whether the object's body is stored encrypted (its stored size is then not its size).
    pub fn is_encrypted(&self) -> bool {
        self.sse.is_some()
    }
}

/// What a listing shows of an object, kept in the listing tag of its name entry so that a listing page is
/// one scan of the name index. Version 1: a version byte, size and mtime (8 bytes each, big-endian), the
/// ETag. Version 2 (objects of versioned buckets) adds, after the mtime, a flags byte (1 = delete marker),
/// the version id's length (one byte, 0 = null) and the version id, then the ETag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListTag {
    pub size_bytes: u64,
    pub last_modified_unix_ms: i64,
    pub etag: String,
    pub version_id: Option<String>,
    pub delete_marker: bool,
}

const LIST_TAG_V1: u8 = 1;
const LIST_TAG_V2: u8 = 2;
const LIST_TAG_FLAG_DELETE_MARKER: u8 = 1;

impl ListTag {
    pub fn of(meta: &ObjectMeta) -> Self {
        ListTag {
            size_bytes: meta.size_bytes,
            last_modified_unix_ms: meta.last_modified_unix_ms,
            etag: meta.etag.clone(),
            version_id: meta.version_id.clone(),
            delete_marker: meta.delete_marker,
        }
    }

    /// Version 1 where nothing of versioning applies (what unversioned buckets have always written).
    pub fn encode(&self) -> Vec<u8> {
        let vid = self.version_id.as_deref().unwrap_or("");
        assert!(vid.len() < 256, "version ids are short");
        let v2 = !vid.is_empty() || self.delete_marker;
        let mut v = Vec::with_capacity(19 + vid.len() + self.etag.len());
        v.push(if v2 { LIST_TAG_V2 } else { LIST_TAG_V1 });
        v.extend_from_slice(&self.size_bytes.to_be_bytes());
        v.extend_from_slice(&self.last_modified_unix_ms.to_be_bytes());
        if v2 {
            v.push(if self.delete_marker { LIST_TAG_FLAG_DELETE_MARKER } else { 0 });
            v.push(vid.len() as u8);
            v.extend_from_slice(vid.as_bytes());
        }
        v.extend_from_slice(self.etag.as_bytes());
        v
    }

    /// None for a tag this build does not know (another version, damaged): the caller falls back to the
    /// metadata record, which is the truth.
    pub fn decode(raw: &[u8]) -> Option<Self> {
        let version = *raw.first()?;
        if !(version == LIST_TAG_V1 || version == LIST_TAG_V2) || raw.len() < 17 {
            return None;
        }
        let mut tag = ListTag {
            size_bytes: u64::from_be_bytes(raw[1..9].try_into().ok()?),
            last_modified_unix_ms: i64::from_be_bytes(raw[9..17].try_into().ok()?),
            ..Default::default()
        };
        let mut rest = &raw[17..];
        if version == LIST_TAG_V2 {
            let (&flags, after) = rest.split_first()?;
            let (&vid_len, after) = after.split_first()?;
            if flags & !LIST_TAG_FLAG_DELETE_MARKER != 0 || after.len() < vid_len as usize {
                return None;
            }
            tag.delete_marker = flags & LIST_TAG_FLAG_DELETE_MARKER != 0;
            let (vid, after) = after.split_at(vid_len as usize);
            if !vid.is_empty() {
                tag.version_id = Some(String::from_utf8(vid.to_vec()).ok()?);
            }
            rest = after;
        }
        tag.etag = String::from_utf8(rest.to_vec()).ok()?;
        Some(tag)
    }
}

/// The fields of the metadata record a listing shows, decoded without the rest (user metadata, checksums).
#[derive(Deserialize)]
pub(crate) struct ListedFields {
    pub version: u8,
    pub etag: String,
    pub last_modified_unix_ms: i64,
    pub size_bytes: u64,
    /// Present for encrypted objects, whose stored size is not their size.
    #[serde(default)]
    pub sse: Option<serde::de::IgnoredAny>,
}

impl ListedFields {
    pub(crate) fn decode(raw: &[u8]) -> LayerResult<Self> {
        let m: ListedFields =
            serde_json::from_slice(raw).map_err(|e| LayerError::Corrupt(format!("object metadata: {e}")))?;
        if m.version != META_VERSION && m.version != META_VERSION_ENCRYPTED {
            return Err(LayerError::Corrupt(format!("object metadata version {}", m.version)));
        }
        Ok(m)
    }
}

/// What a client says about an object it writes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    pub expires: Option<String>,
    pub user_metadata: BTreeMap<String, String>,
    /// If-None-Match: * on a write: fail if the key exists.
    pub if_none_match_any: bool,
    /// If-None-Match with an ETag on a write: fail if the current object has this ETag.
    pub if_none_match: Option<String>,
    /// If-Match on a write: fail unless the current ETag is this (or, `*`, unless the key exists); a
    /// missing key fails with NoSuchKey.
    pub if_match: Option<String>,
    /// S3 append: write at this offset, which must equal the current size.
    pub write_offset: Option<u64>,
    /// Checksum algorithm named at CreateMultipartUpload, and its type (COMPOSITE or FULL_OBJECT).
    pub checksum_algorithm: Option<String>,
    pub checksum_type: Option<String>,
    /// Object lock asked for by the write (x-amz-object-lock-*); the bucket's default applies otherwise.
    #[serde(default)]
    pub lock: crate::lock::LockRequest,
    /// Tags given with the write (x-amz-tagging).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<(String, String)>,
    /// The writer (when not the bucket's owner) and the ACL (x-amz-acl, x-amz-grant-*).
    #[serde(default, skip_serializing_if = "ObjectAccess::is_default")]
    pub access: ObjectAccess,
    /// Encryption asked for by the write (never stored: an SSE-C key stays in memory for the request).
    #[serde(skip)]
    pub sse: Option<crate::sse::SseRequest>,
    /// A multipart upload's sealed object key, made at CreateMultipartUpload; set by the layer only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sse_sealed: Option<crate::sse::SseMeta>,
}

impl PutOptions {
    pub fn validate(&self) -> LayerResult<()> {
        let user: usize = self.user_metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        if user > MAX_USER_METADATA_BYTES {
            return Err(LayerError::MetadataTooLarge);
        }
        crate::objects::validate_object_tags(&self.tags)?;
        crate::acl::validate_acl(self.access.acl.as_deref().unwrap_or_default())
    }

    /// What a write of an object like `meta` says (a copy that keeps the source's metadata).
    pub fn from_meta(meta: &ObjectMeta) -> Self {
        PutOptions {
            content_type: meta.content_type.clone(),
            content_encoding: meta.content_encoding.clone(),
            content_disposition: meta.content_disposition.clone(),
            content_language: meta.content_language.clone(),
            cache_control: meta.cache_control.clone(),
            expires: meta.expires.clone(),
            user_metadata: meta.user_metadata.clone(),
            ..Default::default()
        }
    }

    pub fn into_meta(self, size_bytes: u64, etag: String, now_ms: i64) -> ObjectMeta {
        ObjectMeta {
            version: META_VERSION,
            size_bytes,
            etag,
            last_modified_unix_ms: now_ms,
            content_type: self.content_type,
            content_encoding: self.content_encoding,
            content_disposition: self.content_disposition,
            content_language: self.content_language,
            cache_control: self.cache_control,
            expires: self.expires,
            user_metadata: self.user_metadata,
            checksums: BTreeMap::new(),
            part_sizes: Vec::new(),
            part_checksums: Vec::new(),
            parts_apart: 0,
            upload_id: None,
            version_id: None,
            version_ns: 0,
            delete_marker: false,
            retention: self.lock.retention,
            legal_hold: self.lock.legal_hold,
            tag_count: self.tags.len(),
            access: self.access,
            sse: None,
        }
    }
}

/// Conditional request headers (RFC 7232 as S3 applies them). Times are Unix seconds, as HTTP dates are.
#[derive(Clone, Debug, Default)]
pub struct Precondition {
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
    pub if_modified_since_unix_s: Option<i64>,
    pub if_unmodified_since_unix_s: Option<i64>,
    /// Copy-source conditions fail with PreconditionFailed where GET would answer NotModified.
    pub for_copy_source: bool,
}

fn etag_matches(header: &str, etag: &str) -> bool {
    header.split(',').map(|t| t.trim().trim_start_matches("W/").trim_matches('"')).any(|t| t == "*" || t == etag)
}

impl Precondition {
    pub fn check(&self, meta: &ObjectMeta) -> LayerResult<()> {
        let modified_s = meta.last_modified_unix_ms.div_euclid(1000);
        if let Some(m) = &self.if_match {
            if !etag_matches(m, &meta.etag) {
                return Err(LayerError::PreconditionFailed);
            }
        } else if let Some(t) = self.if_unmodified_since_unix_s
            && modified_s > t
        {
            return Err(LayerError::PreconditionFailed);
        }
        let not_modified = if self.for_copy_source { LayerError::PreconditionFailed } else { LayerError::NotModified };
        if let Some(m) = &self.if_none_match {
            if etag_matches(m, &meta.etag) {
                return Err(not_modified);
            }
        } else if let Some(t) = self.if_modified_since_unix_s
            && modified_s <= t
        {
            return Err(not_modified);
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.if_match.is_none()
            && self.if_none_match.is_none()
            && self.if_modified_since_unix_s.is_none()
            && self.if_unmodified_since_unix_s.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ObjectMeta {
        ObjectMeta { etag: "abc".into(), last_modified_unix_ms: 10_000, version: META_VERSION, ..Default::default() }
    }

    #[test]
    fn a_part_table_past_the_record_limit_is_kept_apart_and_read_back() {
        let n = crate::MAX_PARTS as usize;
        let sizes: Vec<u64> = (0..n as u64).map(|i| (5 << 30) - i * 977).collect();
        let salts: Vec<String> = (0..n).map(|i| format!("{i:032x}")).collect();
        let sse = crate::sse::SseMeta {
            mode: crate::sse::SseMode::S3,
            kms_key_id: None,
            customer_key_md5: None,
            master_key_id: Some(1),
            sealed_key: "00".into(),
            salts: salts.clone(),
        };
        for m in [
            ObjectMeta { size_bytes: sizes.iter().sum(), part_sizes: sizes.clone(), ..meta() },
            ObjectMeta { size_bytes: sizes.iter().sum(), part_sizes: sizes.clone(), sse: Some(sse), ..meta() },
        ] {
            let record = m.encode();
            assert!(record.len() < 1024, "the record stays small ({} bytes)", record.len());
            let table = m.part_table().unwrap().expect("kept apart");
            let mut read = ObjectMeta::decode(&record).unwrap();
            assert!(read.parts_unread() && read.part_sizes.is_empty());
            assert_eq!(read.part_table_chunks(), table.len());
            // A record read alone and written again (a change of tags) keeps saying where its parts are.
            assert_eq!(ObjectMeta::decode(&read.encode()).unwrap(), read);
            read.read_part_table(&table.concat()).unwrap();
            assert_eq!(read, ObjectMeta { parts_apart: n, ..m.clone() });
            assert_eq!(read.encode(), record);
            let mut wrong_total = ObjectMeta { size_bytes: 1, ..ObjectMeta::decode(&record).unwrap() };
            assert!(wrong_total.read_part_table(&table.concat()).is_err(), "sizes that do not add up");
        }
        // Up to the limit, sizes and salts stay in the record (its version unchanged).
        let few = ObjectMeta { part_sizes: vec![5 << 20; RECORD_PARTS_MAX], ..meta() };
        assert!(few.part_table().unwrap().is_none());
        assert_eq!(ObjectMeta::decode(&few.encode()).unwrap().part_sizes.len(), RECORD_PARTS_MAX);
        assert_eq!(few.encode()[..12], *br#"{"version":1"#);
        // A version 3 record must say how many parts it keeps apart, more than the limit.
        let forged = String::from_utf8(few.encode()).unwrap().replacen(r#""version":1"#, r#""version":3"#, 1);
        assert!(ObjectMeta::decode(forged.as_bytes()).is_err());
    }

    #[test]
    fn conditions() {
        let m = meta();
        let p = |f: fn(&mut Precondition)| {
            let mut p = Precondition::default();
            f(&mut p);
            p.check(&m)
        };
        assert_eq!(p(|p| p.if_match = Some("\"abc\"".into())), Ok(()));
        assert_eq!(p(|p| p.if_match = Some("\"x\"".into())), Err(LayerError::PreconditionFailed));
        assert_eq!(p(|p| p.if_match = Some("*".into())), Ok(()));
        assert_eq!(p(|p| p.if_none_match = Some("\"abc\"".into())), Err(LayerError::NotModified));
        assert_eq!(p(|p| p.if_none_match = Some("\"x\"".into())), Ok(()));
        assert_eq!(p(|p| p.if_modified_since_unix_s = Some(10)), Err(LayerError::NotModified));
        assert_eq!(p(|p| p.if_modified_since_unix_s = Some(9)), Ok(()));
        assert_eq!(p(|p| p.if_unmodified_since_unix_s = Some(9)), Err(LayerError::PreconditionFailed));
        // If-Match true overrides If-Unmodified-Since false.
        assert_eq!(
            p(|p| {
                p.if_match = Some("abc".into());
                p.if_unmodified_since_unix_s = Some(1)
            }),
            Ok(())
        );
        assert_eq!(
            p(|p| {
                p.for_copy_source = true;
                p.if_none_match = Some("abc".into())
            }),
            Err(LayerError::PreconditionFailed)
        );
    }

    #[test]
    fn metadata_limit() {
        let mut o = PutOptions::default();
        o.user_metadata.insert("k".into(), "v".repeat(2047));
        assert!(o.validate().is_ok());
        o.user_metadata.insert("k".into(), "v".repeat(2048));
        assert_eq!(o.validate(), Err(LayerError::MetadataTooLarge));
    }

    #[test]
    fn list_tag_round_trip_and_garbage() {
        let t = ListTag::of(&meta());
        assert_eq!(ListTag::decode(&t.encode()), Some(t.clone()));
        assert_eq!(ListTag::decode(&[]), None);
        assert_eq!(ListTag::decode(&t.encode()[..16]), None);
        let mut other = t.encode();
        other[0] = 3;
        assert_eq!(ListTag::decode(&other), None);
        let versioned = ListTag { version_id: Some("v".repeat(32)), delete_marker: true, ..t.clone() };
        assert_eq!(versioned.encode()[0], LIST_TAG_V2);
        assert_eq!(ListTag::decode(&versioned.encode()), Some(versioned.clone()));
        for cut in 17..versioned.encode().len() - versioned.etag.len() {
            assert_eq!(ListTag::decode(&versioned.encode()[..cut]), None, "cut at {cut}");
        }
        let mut unknown_flag = versioned.encode();
        unknown_flag[17] = 2;
        assert_eq!(ListTag::decode(&unknown_flag), None);
        let mut bad_utf8 = t.encode();
        bad_utf8.push(0xff);
        assert_eq!(ListTag::decode(&bad_utf8), None);
    }

    #[test]
    fn decode_rejects_garbage() {
        assert!(ObjectMeta::decode(b"{").is_err());
        assert!(ObjectMeta::decode(&meta().encode()).is_ok());
    }
}
