//! Who may do what: the root key may do everything; access keys beside it may read and/or write the
//! buckets they were granted, and an owning key (`owner`) may also create buckets and do everything in the
//! buckets it created (the bucket's record names its owner), nothing else. The [`KeyRing`] answers s3s's
//! two questions: the secret of an access key (SigV4) and whether an authenticated request is allowed.
//! Changes are persisted by the caller before they take effect, so an acknowledged grant or revocation
//! survives a restart.

use parking_lot::{Mutex, RwLock};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Result, s3_error};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Limits on the key set.
pub const KEYS_MAX: usize = 10_000;
pub const GRANTS_PER_KEY_MAX: usize = 1_000;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub read: bool,
    pub write: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AccessKey {
    pub secret_key: String,
    pub created_unix_s: u64,
    /// Bucket name -> what the key may do there.
    pub grants: BTreeMap<String, Grant>,
    /// May create buckets, which it then owns. Absent (false) in key files of older builds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owner: bool,
}

/// Every access key beside the root key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    pub keys: BTreeMap<String, AccessKey>,
}

pub struct KeyRing {
    root_access_key: String,
    root_secret_key: String,
    keys: RwLock<Arc<KeySet>>,
    /// Serializes changes: each is persisted, then published.
    change: Mutex<()>,
}

impl KeyRing {
    pub fn new(root_access_key: &str, root_secret_key: &str, keys: KeySet) -> KeyRing {
        KeyRing {
            root_access_key: root_access_key.to_string(),
            root_secret_key: root_secret_key.to_string(),
            keys: RwLock::new(Arc::new(keys)),
            change: Mutex::new(()),
        }
    }

    pub fn snapshot(&self) -> Arc<KeySet> {
        self.keys.read().clone()
    }

    /// Applies `f` to a copy of the key set, persists the copy with `persist`, and only then publishes it.
    pub fn update<T>(
        &self,
        f: impl FnOnce(&mut KeySet) -> Result<T, String>,
        persist: impl FnOnce(&KeySet) -> Result<(), String>,
    ) -> Result<T, String> {
        let _g = self.change.lock();
        let mut next = (*self.snapshot()).clone();
        let out = f(&mut next)?;
        if next.keys.len() > KEYS_MAX {
            return Err(format!("at most {KEYS_MAX} access keys"));
        }
        if let Some((k, _)) = next.keys.iter().find(|(_, v)| v.grants.len() > GRANTS_PER_KEY_MAX) {
            return Err(format!("key {k}: at most {GRANTS_PER_KEY_MAX} bucket grants"));
        }
        persist(&next)?;
        *self.keys.write() = Arc::new(next);
        Ok(out)
    }

    pub fn is_root(&self, access_key: &str) -> bool {
        access_key == self.root_access_key
    }

    fn grant(&self, access_key: &str, bucket: &str) -> Grant {
        self.keys.read().keys.get(access_key).and_then(|k| k.grants.get(bucket)).copied().unwrap_or_default()
    }

    fn may_create_buckets(&self, access_key: &str) -> bool {
        self.keys.read().keys.get(access_key).is_some_and(|k| k.owner)
    }

    /// Whether `access_key` may see `bucket` in ListBuckets: it owns it or was granted something there.
    pub fn sees_bucket(&self, access_key: &str, bucket: &str, owner: Option<&str>) -> bool {
        self.is_root(access_key) || owner == Some(access_key) || self.grant(access_key, bucket) != Grant::default()
    }
}

#[async_trait::async_trait]
impl S3Auth for KeyRing {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if access_key == self.root_access_key {
            return Ok(SecretKey::from(self.root_secret_key.clone()));
        }
        match self.keys.read().keys.get(access_key) {
            Some(k) => Ok(SecretKey::from(k.secret_key.clone())),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }
}

/// What an operation needs on its bucket.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    Read,
    Write,
    /// Listing buckets: any key may, it sees names only.
    Nothing,
    /// Everything else (creating and removing buckets, configuration): the root key only.
    Root,
}

fn need(op: &str) -> Need {
    match op {
        "GetObject"
        | "HeadObject"
        | "GetObjectTagging"
        | "GetObjectAttributes"
        | "ListObjects"
        | "ListObjectsV2"
        | "HeadBucket"
        | "GetBucketLocation"
        | "ListParts"
        | "ListMultipartUploads"
        | "ListObjectVersions"
        | "GetBucketVersioning"
        | "GetObjectRetention"
        | "GetObjectLegalHold"
        | "GetObjectLockConfiguration"
        | "GetBucketTagging"
        | "GetBucketLifecycleConfiguration" => Need::Read,
        "PutObject"
        | "DeleteObject"
        | "DeleteObjects"
        | "CopyObject"
        | "PutObjectTagging"
        | "DeleteObjectTagging"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "UploadPartCopy"
        | "CompleteMultipartUpload"
        | "AbortMultipartUpload"
        | "PutObjectRetention"
        | "PutObjectLegalHold" => Need::Write,
        "ListBuckets" => Need::Nothing,
        _ => Need::Root,
    }
}

/// The bucket of an x-amz-copy-source header ("bucket/key", "/bucket/key", URL-encoded, maybe ?versionId).
pub fn copy_source_bucket(header: &str) -> Option<String> {
    let path = header.split('?').next()?.trim_start_matches('/');
    let bucket = path.split('/').next()?;
    let decoded = urlencoding_decode(bucket)?;
    (!decoded.is_empty()).then_some(decoded)
}

fn urlencoding_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The owner of a bucket (None: the root key, or no such bucket), asked only when a key's grants do not
/// already allow a request.
#[async_trait::async_trait]
pub trait BucketOwners: Send + Sync {
    async fn owner_of(&self, bucket: &str) -> Option<String>;
}

#[async_trait::async_trait]
impl BucketOwners for dyn mosaic_layer::ObjectLayer {
    async fn owner_of(&self, bucket: &str) -> Option<String> {
        self.bucket_info(bucket).await.ok().and_then(|b| b.owner)
    }
}

/// The access check of s3s over a key ring and the buckets' owners.
pub struct Access<O: ?Sized> {
    pub keys: Arc<KeyRing>,
    pub owners: Arc<O>,
}

impl<O: BucketOwners + ?Sized> Access<O> {
    /// Whether `access_key` may do what `need` says in `bucket`: by a grant, or as the bucket's owner.
    async fn allows(&self, access_key: &str, need: Need, bucket: Option<&str>, op: &str) -> bool {
        let granted = match (&need, bucket) {
            (Need::Nothing, _) => return true,
            (Need::Read, Some(b)) => self.keys.grant(access_key, b).read,
            (Need::Write, Some(b)) => self.keys.grant(access_key, b).write,
            _ => false,
        };
        if granted {
            return true;
        }
        match bucket {
            Some(_) if op == "CreateBucket" => self.keys.may_create_buckets(access_key),
            Some(b) => self.owners.owner_of(b).await.as_deref() == Some(access_key),
            None => false,
        }
    }
}

#[async_trait::async_trait]
impl<O: BucketOwners + ?Sized + 'static> S3Access for Access<O> {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let Some(creds) = cx.credentials() else {
            return Err(s3_error!(AccessDenied, "Anonymous access is not allowed: sign the request"));
        };
        let access_key = creds.access_key.clone();
        if self.keys.is_root(&access_key) {
            return Ok(());
        }
        let op = cx.s3_op().name();
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        if !self.allows(&access_key, need(op), bucket.as_deref(), op).await {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        }
        if matches!(op, "CopyObject" | "UploadPartCopy") {
            let source =
                cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok()).and_then(copy_source_bucket);
            let readable = match source {
                Some(b) => self.allows(&access_key, Need::Read, Some(&b), "GetObject").await,
                None => false,
            };
            if !readable {
                return Err(s3_error!(AccessDenied, "Access Denied: no read access to the copy source"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_source_buckets() {
        assert_eq!(copy_source_bucket("b/k").as_deref(), Some("b"));
        assert_eq!(copy_source_bucket("/b/k%2Fx?versionId=1").as_deref(), Some("b"));
        assert_eq!(copy_source_bucket("my%2Dbucket/k").as_deref(), Some("my-bucket"));
        assert_eq!(copy_source_bucket(""), None);
        assert_eq!(copy_source_bucket("%zz/k"), None);
        assert_eq!(copy_source_bucket("%C3/k"), None);
    }

    #[test]
    fn operations_need_what_they_touch() {
        assert_eq!(need("GetObject"), Need::Read);
        assert_eq!(need("PutObject"), Need::Write);
        assert_eq!(need("ListBuckets"), Need::Nothing);
        assert_eq!(need("CreateBucket"), Need::Root);
        assert_eq!(need("DeleteBucket"), Need::Root);
        assert_eq!(need("PutBucketPolicy"), Need::Root);
    }

    #[test]
    fn changes_are_persisted_before_they_are_visible_and_limits_hold() {
        let ring = KeyRing::new("root", "rootsecret", KeySet::default());
        let key = AccessKey { secret_key: "s".repeat(40), created_unix_s: 1, grants: BTreeMap::new(), owner: false };
        let r = ring.update(|s| Ok(s.keys.insert("k1".into(), key.clone())), |_| Err("disk full".into()));
        assert_eq!(r, Err("disk full".into()));
        assert!(ring.snapshot().keys.is_empty(), "a change that was not persisted is not visible");
        ring.update(|s| Ok(s.keys.insert("k1".into(), key.clone())), |_| Ok(())).unwrap();
        assert!(ring.snapshot().keys.contains_key("k1"));
        let too_many = ring.update(
            |s| {
                let k = s.keys.get_mut("k1").ok_or("gone")?;
                for i in 0..=GRANTS_PER_KEY_MAX {
                    k.grants.insert(format!("b{i}"), Grant { read: true, write: false });
                }
                Ok(())
            },
            |_| Ok(()),
        );
        assert!(too_many.unwrap_err().contains("at most"));
        assert!(ring.snapshot().keys["k1"].grants.is_empty());
    }

    #[test]
    fn the_key_count_is_bounded() {
        let ring = KeyRing::new("root", "rootsecret", KeySet::default());
        let key = AccessKey { secret_key: "s".repeat(40), created_unix_s: 1, grants: BTreeMap::new(), owner: false };
        let fill = |n: usize| {
            let key = key.clone();
            move |s: &mut KeySet| {
                for i in s.keys.len()..n {
                    s.keys.insert(format!("k{i}"), key.clone());
                }
                Ok(())
            }
        };
        ring.update(fill(KEYS_MAX), |_| Ok(())).unwrap();
        assert_eq!(ring.snapshot().keys.len(), KEYS_MAX);
        let past = ring.update(fill(KEYS_MAX + 1), |_| Ok(()));
        assert!(past.unwrap_err().contains("at most"));
        assert_eq!(ring.snapshot().keys.len(), KEYS_MAX, "a refused change leaves the set as it was");
    }
}
