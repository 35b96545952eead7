//! Who may do what: the root key may do everything; access keys beside it may read and/or write the
//! buckets they were granted, and an owning key (`owner`) may also create buckets and do everything in the
//! buckets it created (the bucket's record names its owner), nothing else. The [`KeyRing`] answers s3s's
//! two questions: the secret of an access key (SigV4) and whether an authenticated request is allowed.
//! Changes are persisted by the caller before they take effect, so an acknowledged grant or revocation
//! survives a restart.

use crate::acl::Requester;
use crate::policy::{Decision, Policy, Request as PolicyRequest};
use mosaic_layer::{AclGrant, ObjectAccess, Permission, PublicAccessBlock};
use parking_lot::{Mutex, RwLock};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Result, s3_error};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
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
    /// Canonical user id -> access key, of every key and the root key (ACLs name keys by these ids).
    ids: RwLock<Arc<HashMap<String, String>>>,
    /// Serializes changes: each is persisted, then published.
    change: Mutex<()>,
}

/// The display name of the root key in ACLs and listings (its access key is not shown to others).
pub const ROOT_DISPLAY_NAME: &str = "root";

fn ids_of(root_access_key: &str, keys: &KeySet) -> HashMap<String, String> {
    let mut ids: HashMap<String, String> = keys.keys.keys().map(|k| (crate::acl::canonical_id(k), k.clone())).collect();
    ids.insert(crate::acl::canonical_id(root_access_key), root_access_key.to_string());
    ids
}

impl KeyRing {
    pub fn new(root_access_key: &str, root_secret_key: &str, keys: KeySet) -> KeyRing {
        KeyRing {
            root_access_key: root_access_key.to_string(),
            root_secret_key: root_secret_key.to_string(),
            ids: RwLock::new(Arc::new(ids_of(root_access_key, &keys))),
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
        *self.ids.write() = Arc::new(ids_of(&self.root_access_key, &next));
        *self.keys.write() = Arc::new(next);
        Ok(out)
    }

    /// The canonical user id of the bucket owner `owner` (None: the root key).
    pub fn owner_id(&self, owner: Option<&str>) -> String {
        crate::acl::canonical_id(owner.unwrap_or(&self.root_access_key))
    }

    /// Whether a canonical user id names a key.
    pub fn knows_id(&self, id: &str) -> bool {
        self.ids.read().contains_key(id)
    }

    /// The display name of a canonical user id: the access key, "root" for the root key.
    pub fn display_name(&self, id: &str) -> Option<String> {
        let key = self.ids.read().get(id).cloned()?;
        Some(if self.is_root(&key) { ROOT_DISPLAY_NAME.to_string() } else { key })
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
        | "GetBucketLifecycleConfiguration"
        | "GetObjectAcl"
        | "GetBucketAcl" => Need::Read,
        "PutObject"
        | "PostObject"
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
        | "PutObjectLegalHold"
        | "PutObjectAcl" => Need::Write,
        "ListBuckets" => Need::Nothing,
        _ => Need::Root,
    }
}

/// The bucket, key and version of an x-amz-copy-source header ("bucket/key", "/bucket/key", URL-encoded,
/// maybe ?versionId=).
pub fn copy_source(header: &str) -> Option<(String, String, Option<String>)> {
    let (path, query) = header.split_once('?').unwrap_or((header, ""));
    let (bucket, key) = path.trim_start_matches('/').split_once('/')?;
    let (bucket, key) = (urlencoding_decode(bucket)?, urlencoding_decode(key)?);
    let version = query.split('&').find_map(|kv| kv.strip_prefix("versionId=")).and_then(urlencoding_decode);
    (!bucket.is_empty() && !key.is_empty()).then_some((bucket, key, version))
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

/// What the access check needs to know of a bucket.
#[derive(Clone, Debug, Default)]
pub struct BucketFacts {
    /// The owning access key; None: the root key.
    pub owner: Option<String>,
    pub acl: Option<Vec<AclGrant>>,
    pub policy: Option<String>,
    pub public_access_block: Option<PublicAccessBlock>,
}

/// What the access check needs to know of buckets and objects: owners, ACLs, policies, tags. Asked only for
/// requests of keys other than the root key, so the root key's requests cost nothing.
#[async_trait::async_trait]
pub trait AccessFacts: Send + Sync {
    /// None: no such bucket.
    async fn bucket_facts(&self, bucket: &str) -> Option<BucketFacts>;
    /// A version's owner and ACL; None: no such object (or version).
    async fn object_access(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Option<ObjectAccess>;
    /// A version's tags (for s3:ExistingObjectTag conditions); empty when it has none or is missing.
    async fn object_tags(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Vec<(String, String)>;
}

#[async_trait::async_trait]
impl AccessFacts for dyn mosaic_layer::ObjectLayer {
    async fn bucket_facts(&self, bucket: &str) -> Option<BucketFacts> {
        let b = self.bucket_info(bucket).await.ok()?;
        Some(BucketFacts { owner: b.owner, acl: b.acl, policy: b.policy, public_access_block: b.public_access_block })
    }

    async fn object_access(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Option<ObjectAccess> {
        self.object_meta_unchecked(bucket, key, version_id).await.ok().map(|m| m.access)
    }

    async fn object_tags(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Vec<(String, String)> {
        self.get_tags(bucket, key, version_id).await.unwrap_or_default()
    }
}

/// The client's address, put into a request's extensions by the HTTP side (for aws:SourceIp).
#[derive(Clone, Copy, Debug)]
pub struct PeerIp(pub std::net::IpAddr);

/// Marks a request that came over TLS (for aws:SecureTransport and SSE-C).
#[derive(Clone, Copy, Debug)]
pub struct SecureTransport;

/// One request as the access check sees it.
struct Asked<'a> {
    access_key: Option<&'a str>,
    op: &'a str,
    bucket: Option<&'a str>,
    key: Option<&'a str>,
    version: Option<&'a str>,
    /// Policy condition keys (lowercase) and their values.
    context: &'a HashMap<String, Vec<String>>,
}

/// The condition keys of a request: its x-amz-* headers as s3:x-amz-*, the listing parameters, tags asked
/// for, the client's address, the time, and whether the transport is secure.
fn policy_context(r: &RequestParts<'_>) -> HashMap<String, Vec<String>> {
    let mut c: HashMap<String, Vec<String>> = HashMap::new();
    let mut add = |k: String, v: String| c.entry(k).or_default().push(v);
    for (name, value) in r.headers {
        if name.as_str().starts_with("x-amz-")
            && let Ok(v) = value.to_str()
        {
            add(format!("s3:{}", name.as_str()), v.to_string());
        }
    }
    for kv in r.uri.query().unwrap_or("").split('&') {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if matches!(k, "prefix" | "delimiter" | "max-keys" | "versionId") {
            let v = urlencoding_decode(&v.replace('+', " ")).unwrap_or_default();
            add(format!("s3:{}", k.to_ascii_lowercase()), v);
        }
    }
    if let Some(t) = r.headers.get("x-amz-tagging").and_then(|v| v.to_str().ok()) {
        for pair in t.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = urlencoding_decode(&k.replace('+', " ")).unwrap_or_default();
            let v = urlencoding_decode(&v.replace('+', " ")).unwrap_or_default();
            add("s3:requestobjecttagkeys".into(), k.clone());
            add(format!("s3:requestobjecttag/{}", k.to_ascii_lowercase()), v);
        }
    }
    if let Some(PeerIp(ip)) = r.peer {
        add("aws:sourceip".into(), ip.to_string());
    }
    let now = time::OffsetDateTime::now_utc();
    if let Ok(t) = now.format(&time::format_description::well_known::Rfc3339) {
        add("aws:currenttime".into(), t);
    }
    add("aws:epochtime".into(), now.unix_timestamp().to_string());
    add("aws:securetransport".into(), r.secure.to_string());
    c
}

/// What an operation needs by ACL: a permission on its bucket or on its object; None: ACLs cannot grant it
/// (bucket configuration is its owner's alone).
#[derive(Debug, PartialEq, Eq)]
enum AclNeed {
    Bucket(Permission),
    Object(Permission),
    None,
}

fn acl_need(op: &str) -> AclNeed {
    use Permission::*;
    match op {
        "ListObjects" | "ListObjectsV2" | "ListObjectVersions" | "ListMultipartUploads" | "HeadBucket" => {
            AclNeed::Bucket(Read)
        }
        "PutObject"
        | "PostObject"
        | "DeleteObject"
        | "DeleteObjects"
        | "CopyObject"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "UploadPartCopy"
        | "CompleteMultipartUpload"
        | "AbortMultipartUpload"
        | "ListParts" => AclNeed::Bucket(Write),
        "GetBucketAcl" => AclNeed::Bucket(ReadAcp),
        "PutBucketAcl" => AclNeed::Bucket(WriteAcp),
        "GetObject" | "HeadObject" | "GetObjectAttributes" => AclNeed::Object(Read),
        "GetObjectAcl" => AclNeed::Object(ReadAcp),
        "PutObjectAcl" => AclNeed::Object(WriteAcp),
        _ => AclNeed::None,
    }
}

/// The versionId of a request's query string.
fn version_id_of(uri: &http::Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| kv.strip_prefix("versionId=")).and_then(urlencoding_decode)
}

/// The access check of s3s over a key ring and what the store knows of owners, ACLs and policies.
pub struct Access<O: ?Sized> {
    pub keys: Arc<KeyRing>,
    pub facts: Arc<O>,
}

/// Operations on a policy itself, which a bucket's owner keeps whatever its policy denies (so that a
/// policy cannot lock its owner out).
const POLICY_OPS: [&str; 4] = ["GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy", "GetBucketPolicyStatus"];

impl<O: AccessFacts + ?Sized> Access<O> {
    /// Whether a request of someone other than the root key may proceed: the bucket policy first (an
    /// explicit Deny refuses, an Allow admits), then the key's grants, the bucket's ownership, the ACLs.
    async fn allows(&self, a: &Asked<'_>) -> bool {
        let need = need(a.op);
        if need == Need::Nothing {
            return true;
        }
        let Some(b) = a.bucket else { return false };
        if a.op == "CreateBucket" {
            return a.access_key.is_some_and(|k| self.keys.may_create_buckets(k));
        }
        // No such bucket: let the operation answer NoSuchBucket, as S3 does to anyone.
        let Some(facts) = self.facts.bucket_facts(b).await else { return true };
        let is_owner = a.access_key.is_some() && facts.owner.as_deref() == a.access_key;
        let requester_id = a.access_key.map(crate::acl::canonical_id);
        let block = facts.public_access_block.unwrap_or_default();
        if let Some(text) = &facts.policy {
            match self.policy_decision(a, b, text, requester_id.as_deref(), block.restrict_public_buckets).await {
                Decision::Deny if !(is_owner && POLICY_OPS.contains(&a.op)) => return false,
                Decision::Allow => return true,
                _ => {}
            }
        }
        if let Some(k) = a.access_key {
            let grant = self.keys.grant(k, b);
            if (need == Need::Read && grant.read) || (need == Need::Write && grant.write) || is_owner {
                return true;
            }
        }
        let owner_id = self.keys.owner_id(facts.owner.as_deref());
        let who = Requester { id: requester_id.as_deref() };
        // IgnorePublicAcls: grants to everyone or every signed request count for nothing.
        let effective = |g: Vec<AclGrant>| -> Vec<AclGrant> {
            if block.ignore_public_acls { g.into_iter().filter(|g| !g.is_public()).collect() } else { g }
        };
        let bucket_grants = effective(facts.acl.unwrap_or_else(|| crate::acl::private(&owner_id)));
        match acl_need(a.op) {
            AclNeed::Bucket(p) => crate::acl::allows(&bucket_grants, who, p),
            AclNeed::Object(p) => {
                let Some(key) = a.key else { return false };
                match self.facts.object_access(b, key, a.version).await {
                    Some(access) => {
                        let object_owner = access.owner_id.unwrap_or(owner_id);
                        who.id == Some(object_owner.as_str())
                            || crate::acl::allows(
                                &effective(access.acl.unwrap_or_else(|| crate::acl::private(&object_owner))),
                                who,
                                p,
                            )
                    }
                    // Missing: who may list the bucket (or the key's name by policy) learns so (404); others
                    // are refused.
                    None => {
                        crate::acl::allows(&bucket_grants, who, Permission::Read)
                            || self.may_list_name(a, b, key, facts.policy.as_deref(), requester_id.as_deref()).await
                    }
                }
            }
            AclNeed::None => false,
        }
    }

    /// Whether the bucket policy lets the requester list `key` (s3:ListBucket with s3:prefix = the key).
    async fn may_list_name(
        &self,
        a: &Asked<'_>,
        bucket: &str,
        key: &str,
        policy: Option<&str>,
        requester_id: Option<&str>,
    ) -> bool {
        let Some(text) = policy else { return false };
        let mut context = a.context.clone();
        context.insert("s3:prefix".into(), vec![key.to_string()]);
        let listing = Asked { op: "ListObjects", key: None, version: None, context: &context, ..*a };
        self.policy_decision(&listing, bucket, text, requester_id, false).await == Decision::Allow
    }

    /// What a bucket's policy says of a request. A stored policy this build cannot read denies (it was
    /// checked when it was put, so this is damage or a newer format: fail closed). With
    /// RestrictPublicBuckets, a public policy admits no one (its Denies still hold).
    async fn policy_decision(
        &self,
        a: &Asked<'_>,
        bucket: &str,
        text: &str,
        requester_id: Option<&str>,
        restrict_public: bool,
    ) -> Decision {
        let policy = match Policy::parse(text, bucket) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(bucket, error = %e, "a stored bucket policy does not parse: denying");
                return Decision::Deny;
            }
        };
        let resource = match a.key {
            Some(k) => format!("arn:aws:s3:::{bucket}/{k}"),
            // DeleteObjects names its keys in the body: judged as any object of the bucket.
            None if a.op == "DeleteObjects" => format!("arn:aws:s3:::{bucket}/*"),
            None => format!("arn:aws:s3:::{bucket}"),
        };
        let action = crate::policy::action_of(a.op, a.version.is_some());
        let mut context;
        let mut ctx = a.context;
        if let Some(k) = a.key
            && text.to_ascii_lowercase().contains("s3:existingobjecttag")
        {
            context = a.context.clone();
            for (tk, tv) in self.facts.object_tags(bucket, k, a.version).await {
                context.entry(format!("s3:existingobjecttag/{}", tk.to_ascii_lowercase())).or_default().push(tv);
            }
            ctx = &context;
        }
        let principal = requester_id.zip(a.access_key);
        match policy.evaluate(&PolicyRequest { principal, action: &action, resource: &resource, context: ctx }) {
            Decision::Allow if restrict_public && policy.is_public() => Decision::Silent,
            d => d,
        }
    }
}

#[async_trait::async_trait]
impl<O: AccessFacts + ?Sized + 'static> S3Access for Access<O> {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let peer = cx.extensions_mut().get::<PeerIp>().copied();
        let secure = cx.extensions_mut().get::<SecureTransport>().is_some();
        let op = cx.s3_op().name();
        // A POST upload names its key in the form, which s3s reads after this check: it is checked with
        // its key in `post_object` below.
        if op == "PostObject" {
            return Ok(());
        }
        let (bucket, key) = match cx.s3_path() {
            S3Path::Root => (None, None),
            S3Path::Bucket { bucket } => (Some(bucket.to_string()), None),
            S3Path::Object { bucket, key } => (Some(bucket.to_string()), Some(key.to_string())),
        };
        let parts = RequestParts { headers: cx.headers(), uri: cx.uri(), peer, secure };
        let access_key = cx.credentials().map(|c| c.access_key.clone());
        self.decide(access_key.as_deref(), op, bucket.as_deref(), key.as_deref(), &parts).await
    }

    async fn post_object(&self, req: &mut s3s::S3Request<s3s::dto::PostObjectInput>) -> S3Result<()> {
        let parts = RequestParts {
            headers: &req.headers,
            uri: &req.uri,
            peer: req.extensions.get::<PeerIp>().copied(),
            secure: req.extensions.get::<SecureTransport>().is_some(),
        };
        let access_key = req.credentials.as_ref().map(|c| c.access_key.clone());
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        self.decide(access_key.as_deref(), "PostObject", Some(&bucket), Some(&key), &parts).await
    }
}

/// What an access decision reads of a request beside its operation, bucket and key.
struct RequestParts<'a> {
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    peer: Option<PeerIp>,
    /// Whether it came over TLS.
    secure: bool,
}

impl<O: AccessFacts + ?Sized + 'static> Access<O> {
    /// Whether `access_key` (None: anonymous) may do `op` on the bucket and key.
    async fn decide(
        &self,
        access_key: Option<&str>,
        op: &str,
        bucket: Option<&str>,
        key: Option<&str>,
        parts: &RequestParts<'_>,
    ) -> S3Result<()> {
        let policy_op = POLICY_OPS.contains(&op);
        if access_key.is_some_and(|k| self.keys.is_root(k)) {
            // The root key needs no grant, but a bucket policy's explicit Deny holds for it too (as for an
            // account's root user), except on the policy itself, so that a policy cannot lock it out.
            let Some(b) = bucket.filter(|_| !policy_op) else { return Ok(()) };
            let Some(text) = self.facts.bucket_facts(b).await.and_then(|f| f.policy) else { return Ok(()) };
            let context = policy_context(parts);
            let version = version_id_of(parts.uri);
            let asked = Asked { access_key, op, bucket: Some(b), key, version: version.as_deref(), context: &context };
            let root_id = access_key.map(crate::acl::canonical_id);
            return match self.policy_decision(&asked, b, &text, root_id.as_deref(), false).await {
                Decision::Deny => Err(s3_error!(AccessDenied, "Access Denied by the bucket policy")),
                _ => Ok(()),
            };
        }
        let context = policy_context(parts);
        let version = version_id_of(parts.uri);
        let asked = Asked { access_key, op, bucket, key, version: version.as_deref(), context: &context };
        if !self.allows(&asked).await {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        }
        if matches!(op, "CopyObject" | "UploadPartCopy") {
            let header = parts.headers.get("x-amz-copy-source").and_then(|v| v.to_str().ok()).unwrap_or("");
            let readable = match copy_source(header) {
                Some((b, k, v)) => {
                    let source =
                        Asked { op: "GetObject", bucket: Some(&b), key: Some(&k), version: v.as_deref(), ..asked };
                    self.allows(&source).await
                }
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
    fn copy_sources() {
        let s = |b: &str, k: &str, v: Option<&str>| Some((b.to_string(), k.to_string(), v.map(str::to_string)));
        assert_eq!(copy_source("b/k"), s("b", "k", None));
        assert_eq!(copy_source("/b/k%2Fx?versionId=1"), s("b", "k/x", Some("1")));
        assert_eq!(copy_source("my%2Dbucket/k"), s("my-bucket", "k", None));
        assert_eq!(copy_source(""), None);
        assert_eq!(copy_source("b"), None);
        assert_eq!(copy_source("b/"), None);
        assert_eq!(copy_source("%zz/k"), None);
        assert_eq!(copy_source("%C3/k"), None);
    }

    #[test]
    fn acls_grant_object_and_bucket_operations_only() {
        assert_eq!(acl_need("GetObject"), AclNeed::Object(Permission::Read));
        assert_eq!(acl_need("PutObjectAcl"), AclNeed::Object(Permission::WriteAcp));
        assert_eq!(acl_need("PutObject"), AclNeed::Bucket(Permission::Write));
        assert_eq!(acl_need("ListObjectsV2"), AclNeed::Bucket(Permission::Read));
        assert_eq!(acl_need("PutBucketLifecycleConfiguration"), AclNeed::None);
        assert_eq!(acl_need("DeleteBucket"), AclNeed::None);
    }

    #[test]
    fn version_ids_come_from_the_query() {
        let u = |s: &str| s.parse::<http::Uri>().unwrap();
        assert_eq!(version_id_of(&u("/b/k?versionId=abc&x=1")).as_deref(), Some("abc"));
        assert_eq!(version_id_of(&u("/b/k?acl&versionId=a%2Bb")).as_deref(), Some("a+b"));
        assert_eq!(version_id_of(&u("/b/k")), None);
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
