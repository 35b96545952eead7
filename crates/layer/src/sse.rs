//! Encryption at rest of objects: SSE-S3 (the server's master key), SSE-KMS (a key of the local key
//! provider, named by id) and SSE-C (the customer's key, given with every request and never stored).
//! `mosaic_crypt` holds the formats; this module applies them: it seals a fresh object key per version,
//! encrypts bodies as they stream into the store, and maps a plaintext range to the packages that hold it.
//!
//! An encrypted object is one stream per part (a simple PUT is one stream), each with its own salt; its
//! metadata keeps the plaintext size and part sizes, so listings and ranges speak plaintext, while the
//! store holds each stream's packages back to back.

use crate::error::{LayerError, LayerResult};
use crate::ingest::Ingested;
use crate::objects::body_stream;
use crate::semantics::S3Semantics;
use crate::{ByteStream, PutBody};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use md5::{Digest, Md5};
use mosaic_crypt::{
    CryptError, Key, MasterKeys, PACKAGE_PLAIN_BYTES, PACKAGE_STORED_BYTES, SALT_BYTES, StreamKey, TAG_BYTES,
    package_count, stored_len,
};
use mosaic_store::Snapshot;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Longest SSE-KMS key id.
pub const MAX_KMS_KEY_ID_BYTES: usize = 256;
/// Most SSE-KMS key ids the local key provider knows.
pub const MAX_KMS_KEYS: usize = 1024;
/// Plaintext gathered before a batch of packages is encrypted (whole packages, about 1 MiB).
const ENCRYPT_BATCH_BYTES: usize = 16 * PACKAGE_PLAIN_BYTES;
/// Stored bytes of one read of an encrypted body: whole packages, about 1 MiB.
const DECRYPT_CHUNK_BYTES: u64 = 16 * PACKAGE_STORED_BYTES as u64;

/// A customer's key (SSE-C) as a request gives it; Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct CustomerKey {
    key: Key,
    md5_b64: String,
}

impl std::fmt::Debug for CustomerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomerKey(md5 {})", self.md5_b64)
    }
}

impl CustomerKey {
    /// The SSE-C headers of a request (algorithm, base64 key, base64 MD5 of the key): None when none is
    /// given; all three are required together, the algorithm is AES256, the key 256 bits, the MD5 right.
    pub fn from_headers(
        algorithm: Option<&str>,
        key_b64: Option<&str>,
        md5_b64: Option<&str>,
    ) -> LayerResult<Option<Self>> {
        if algorithm.is_none() && key_b64.is_none() && md5_b64.is_none() {
            return Ok(None);
        }
        let bad = |why: &str| Err(LayerError::InvalidArgument(why.to_string()));
        match algorithm {
            Some("AES256") => {}
            Some(_) => return bad("The server-side encryption algorithm of a customer key must be AES256"),
            None => {
                return bad(
                    "Requests specifying Server Side Encryption with Customer provided keys must provide a valid encryption algorithm",
                );
            }
        }
        let Some(key_b64) = key_b64 else {
            return bad(
                "Requests specifying Server Side Encryption with Customer provided keys must provide an appropriate secret key",
            );
        };
        let Some(md5_b64) = md5_b64 else {
            return bad(
                "Requests specifying Server Side Encryption with Customer provided keys must provide the client calculated MD5 of the secret key",
            );
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let raw = b64.decode(key_b64.trim()).unwrap_or_default();
        let Ok(bytes) = <[u8; 32]>::try_from(raw.as_slice()) else {
            return bad("The secret key was invalid for the specified algorithm");
        };
        if b64.encode(Md5::digest(bytes)) != md5_b64.trim() {
            return bad("The calculated MD5 hash of the key did not match the hash that was provided");
        }
        Ok(Some(CustomerKey { key: Key::from_bytes(bytes), md5_b64: md5_b64.trim().to_string() }))
    }

    /// The base64 MD5 of the key (what responses echo).
    pub fn md5_b64(&self) -> &str {
        &self.md5_b64
    }
}

/// The encryption a write asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseRequest {
    /// SSE-S3: `x-amz-server-side-encryption: AES256`.
    S3,
    /// SSE-KMS with a key of the local provider.
    Kms { key_id: String },
    /// SSE-C.
    Customer(CustomerKey),
}

/// How an object is encrypted, as S3 names it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SseMode {
    #[serde(rename = "AES256")]
    S3,
    #[serde(rename = "aws:kms")]
    Kms,
    #[serde(rename = "SSE-C")]
    Customer,
}

/// An encrypted object's keys as its metadata keeps them: the sealed object key and one salt per stream.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SseMeta {
    pub mode: SseMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// SSE-C: the base64 MD5 of the customer's key (echoed in responses; a wrong key is told by it first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer_key_md5: Option<String>,
    /// SSE-S3 and SSE-KMS: the master key that sealed the object key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_key_id: Option<u32>,
    /// The object key sealed under its key-encryption key, hex.
    pub sealed_key: String,
    /// One salt (hex) per stream: one for a simple PUT, one per part in order for a multipart object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub salts: Vec<String>,
}

/// A bucket's default encryption (PutBucketEncryption): SSE-S3 or SSE-KMS for writes that ask for none.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BucketEncryption {
    pub mode: SseMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    #[serde(default)]
    pub bucket_key_enabled: bool,
}

impl BucketEncryption {
    pub fn validate(&self) -> LayerResult<()> {
        match (self.mode, &self.kms_key_id) {
            (SseMode::Customer, _) => {
                Err(LayerError::InvalidArgument("a bucket's default encryption is AES256 or aws:kms".into()))
            }
            (SseMode::S3, Some(_)) => Err(LayerError::InvalidArgument("a KMS key id needs aws:kms".into())),
            (_, Some(id)) => validate_kms_key_id(id),
            _ => Ok(()),
        }
    }

    /// The request a write without encryption headers makes in this bucket.
    pub fn request(&self) -> LayerResult<SseRequest> {
        match self.mode {
            SseMode::S3 => Ok(SseRequest::S3),
            SseMode::Kms => Ok(SseRequest::Kms {
                key_id: self.kms_key_id.clone().ok_or_else(|| {
                    LayerError::InvalidArgument("the bucket's default aws:kms encryption names no key".into())
                })?,
            }),
            SseMode::Customer => Err(LayerError::InvalidArgument("SSE-C cannot be a bucket default".into())),
        }
    }
}

fn validate_kms_key_id(id: &str) -> LayerResult<()> {
    if id.is_empty() || id.len() > MAX_KMS_KEY_ID_BYTES || id.chars().any(|c| c.is_control()) {
        return Err(LayerError::InvalidArgument(format!("a KMS key id is 1 to {MAX_KMS_KEY_ID_BYTES} bytes")));
    }
    Ok(())
}

/// The server's keys for SSE-S3 and SSE-KMS: master keys, and the ids of the KMS keys it serves (each
/// derived from the master key that seals with it, so the provider keeps no other secret). The master keys
/// may be extended while serving (a rotation, or a cluster's keys as its map holds them), never shrunk.
#[derive(Debug)]
pub struct SseKeys {
    master: parking_lot::RwLock<MasterKeys>,
    pub kms_key_ids: BTreeSet<String>,
}

impl SseKeys {
    pub fn new(master: MasterKeys, kms_key_ids: BTreeSet<String>) -> LayerResult<Self> {
        if kms_key_ids.len() > MAX_KMS_KEYS {
            return Err(LayerError::InvalidArgument(format!("at most {MAX_KMS_KEYS} KMS keys")));
        }
        kms_key_ids.iter().try_for_each(|id| validate_kms_key_id(id))?;
        Ok(SseKeys { master: parking_lot::RwLock::new(master), kms_key_ids })
    }

    /// The master keys served now.
    pub fn master_keys(&self) -> MasterKeys {
        self.master.read().clone()
    }

    /// Serves `newer` from now on: it must hold every key served now, alike (a key that opens an object is
    /// never dropped); it may hold more, and seal with a newer one.
    pub fn extend_master(&self, newer: MasterKeys) -> LayerResult<()> {
        let mut master = self.master.write();
        if !newer.extends(&master) {
            return Err(LayerError::InvalidArgument(
                "new SSE master keys must hold every key served now, and seal with the same or a newer one".into(),
            ));
        }
        *master = newer;
        debug_assert!(master.get(master.current().0).is_some());
        Ok(())
    }

    /// The key that seals new objects, and its id.
    fn sealing(&self) -> (u32, Key) {
        let master = self.master.read();
        let (id, key) = master.current();
        (id, key.clone())
    }

    fn master(&self, id: u32) -> LayerResult<Key> {
        self.master.read().get(id).cloned().ok_or_else(|| {
            LayerError::Corrupt(format!("the object was sealed with master key {id}, which this server does not have"))
        })
    }
}

fn s3_kek(master: &Key) -> Key {
    master.derive(b"mosaic sse-s3 kek")
}

fn kms_kek(master: &Key, key_id: &str) -> Key {
    master.derive(&[b"mosaic sse-kms kek\0".as_slice(), key_id.as_bytes()].concat())
}

fn customer_kek(c: &CustomerKey) -> Key {
    c.key.derive(b"mosaic sse-c kek")
}

fn crypt_error(e: CryptError) -> LayerError {
    match e {
        CryptError::Random => LayerError::Internal(e.to_string()),
        _ => LayerError::Corrupt(format!("encrypted data: {e}")),
    }
}

/// The error of a read whose SSE-C key is missing, wrong, or given for an object stored without one.
fn key_mismatch(why: &str) -> LayerError {
    LayerError::InvalidRequest(why.to_string())
}

/// Seals a fresh object key for a write asking for `req`; returns the metadata (without salts) and the key.
pub(crate) fn seal_new(keys: Option<&SseKeys>, req: &SseRequest) -> LayerResult<(SseMeta, Key)> {
    let object_key = Key::random().map_err(crypt_error)?;
    let server = || keys.ok_or_else(|| LayerError::InvalidArgument("server-side encryption is not configured".into()));
    let (mode, kek, kms_key_id, customer_key_md5, master_key_id) = match req {
        SseRequest::S3 => {
            let (id, master) = server()?.sealing();
            (SseMode::S3, s3_kek(&master), None, None, Some(id))
        }
        SseRequest::Kms { key_id } => {
            validate_kms_key_id(key_id)?;
            let keys = server()?;
            if !keys.kms_key_ids.contains(key_id) {
                return Err(LayerError::KmsKeyNotFound(key_id.clone()));
            }
            let (id, master) = keys.sealing();
            (SseMode::Kms, kms_kek(&master, key_id), Some(key_id.clone()), None, Some(id))
        }
        SseRequest::Customer(c) => (SseMode::Customer, customer_kek(c), None, Some(c.md5_b64.clone()), None),
    };
    let sealed = mosaic_crypt::seal_key(&kek, &object_key).map_err(crypt_error)?;
    let meta = SseMeta {
        mode,
        kms_key_id,
        customer_key_md5,
        master_key_id,
        sealed_key: hex::encode(sealed),
        salts: Vec::new(),
    };
    Ok((meta, object_key))
}

/// Opens an object's key for a read or a part: SSE-C needs the customer's key, the others the server's.
pub(crate) fn open_object_key(
    keys: Option<&SseKeys>,
    meta: &SseMeta,
    customer: Option<&CustomerKey>,
) -> LayerResult<Key> {
    let kek = match (meta.mode, customer) {
        (SseMode::Customer, None) => {
            return Err(key_mismatch(
                "The object was stored using a form of Server Side Encryption. The correct parameters must be provided to retrieve the object.",
            ));
        }
        (SseMode::Customer, Some(c)) => {
            if meta.customer_key_md5.as_deref() != Some(c.md5_b64()) {
                return Err(key_mismatch("The provided encryption key does not match the object's"));
            }
            customer_kek(c)
        }
        (_, Some(_)) => {
            return Err(key_mismatch("The object was not stored with a customer-provided encryption key"));
        }
        (mode, None) => {
            let keys =
                keys.ok_or_else(|| LayerError::Corrupt("an encrypted object, and no server keys to open it".into()))?;
            let master = keys.master(meta.master_key_id.unwrap_or(0))?;
            match mode {
                SseMode::Kms => kms_kek(&master, meta.kms_key_id.as_deref().unwrap_or_default()),
                _ => s3_kek(&master),
            }
        }
    };
    let sealed = hex::decode(&meta.sealed_key).map_err(|_| LayerError::Corrupt("a damaged sealed key".into()))?;
    match mosaic_crypt::open_key(&kek, &sealed) {
        Ok(k) => Ok(k),
        Err(CryptError::Authentication) if meta.mode == SseMode::Customer => {
            Err(key_mismatch("The provided encryption key does not match the object's"))
        }
        Err(e) => Err(crypt_error(e)),
    }
}

/// A fresh salt for a stream, hex.
pub(crate) fn new_salt() -> String {
    hex::encode(rand::random::<[u8; SALT_BYTES]>())
}

fn stream_key(object_key: &Key, salt_hex: &str) -> LayerResult<StreamKey> {
    let salt: [u8; SALT_BYTES] = hex::decode(salt_hex)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| LayerError::Corrupt("a damaged stream salt".into()))?;
    Ok(StreamKey::new(object_key, &salt))
}

/// What an encrypted body turned out to be, known once it has ended.
#[derive(Clone, Debug)]
pub(crate) struct Plaintext {
    pub(crate) size_bytes: u64,
    pub(crate) md5_hex: String,
}

pub(crate) type PlaintextSlot = Arc<Mutex<Option<Plaintext>>>;

/// An encrypting body: `out` holds sealed packages (each with its tag) followed by the open package's
/// plaintext from `open_at`, which is sealed in place once it is full and more bytes follow (or the body
/// ends): each byte is copied once, into the buffer that is then passed on.
struct Encrypting {
    inner: ByteStream,
    key: StreamKey,
    out: BytesMut,
    open_at: usize,
    seq: u64,
    done: bool,
    md5: Md5,
    size_bytes: u64,
    max_bytes: u64,
    slot: PlaintextSlot,
}

impl Encrypting {
    fn seal_open(&mut self, last: bool) {
        let tag = self.key.seal_package(self.seq, last, &mut self.out[self.open_at..]);
        self.out.extend_from_slice(&tag);
        self.seq += 1;
        self.open_at = self.out.len();
    }

    fn push(&mut self, mut rest: &[u8]) {
        while !rest.is_empty() {
            let open = self.out.len() - self.open_at;
            if open == PACKAGE_PLAIN_BYTES {
                // Full, and more bytes follow: not the last package.
                self.seal_open(false);
                continue;
            }
            let n = rest.len().min(PACKAGE_PLAIN_BYTES - open);
            self.out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
    }
}

/// Encrypts a body as it streams (stream `salt_hex` of `object_key`): sealed packages are passed on in
/// batches of about 1 MiB, the plaintext's MD5 and size go into the returned slot once it ends; more than
/// `max_bytes` of plaintext fails it.
pub(crate) fn encrypt_body(
    body: PutBody,
    object_key: &Key,
    salt_hex: &str,
    max_bytes: u64,
) -> LayerResult<(PutBody, PlaintextSlot)> {
    let slot = PlaintextSlot::default();
    let state = Encrypting {
        inner: body.stream,
        key: stream_key(object_key, salt_hex)?,
        out: BytesMut::new(),
        open_at: 0,
        seq: 0,
        done: false,
        md5: Md5::new(),
        size_bytes: 0,
        max_bytes,
        slot: slot.clone(),
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        while st.open_at < ENCRYPT_BATCH_BYTES {
            match st.inner.next().await {
                Some(Ok(chunk)) => {
                    st.size_bytes += chunk.len() as u64;
                    if st.size_bytes > st.max_bytes {
                        st.done = true;
                        return Some((Err(LayerError::EntityTooLarge), st));
                    }
                    st.md5.update(&chunk);
                    if st.out.capacity() - st.out.len() < chunk.len() + TAG_BYTES {
                        st.out.reserve(ENCRYPT_BATCH_BYTES + PACKAGE_STORED_BYTES);
                    }
                    st.push(&chunk);
                }
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.seal_open(true);
                    st.done = true;
                    let md5_hex = hex::encode(std::mem::take(&mut st.md5).finalize());
                    *st.slot.lock() = Some(Plaintext { size_bytes: st.size_bytes, md5_hex });
                    let rest = st.out.split().freeze();
                    return Some((Ok(rest), st));
                }
            }
        }
        let sealed = st.out.split_to(st.open_at).freeze();
        st.open_at = 0;
        Some((Ok(sealed), st))
    });
    let stream: ByteStream = Box::pin(sync_wrapper::SyncStream::new(stream));
    Ok((PutBody { stream, finish: body.finish }, slot))
}

/// Where each stream of an encrypted object lies: its plaintext size and its stored offset.
fn streams(meta_size: u64, part_sizes: &[u64]) -> Vec<(u64, u64)> {
    let sizes: Vec<u64> = if part_sizes.is_empty() { vec![meta_size] } else { part_sizes.to_vec() };
    let mut stored = 0;
    sizes
        .into_iter()
        .map(|len| {
            let at = stored;
            stored += stored_len(len);
            (len, at)
        })
        .collect()
}

/// Stored size of an encrypted object of these streams.
pub(crate) fn stored_size(meta_size: u64, part_sizes: &[u64]) -> u64 {
    streams(meta_size, part_sizes).last().map_or(0, |(len, at)| at + stored_len(*len))
}

/// The plaintext [start, end) of an encrypted object, read from whole packages and decrypted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decrypt_range<Sn: Snapshot>(
    snap: Arc<Sn>,
    obj: Sn::Obj,
    sse: &SseMeta,
    object_key: &Key,
    size_bytes: u64,
    part_sizes: &[u64],
    start: u64,
    end: u64,
) -> LayerResult<ByteStream> {
    debug_assert!(start <= end && end <= size_bytes);
    let layout = streams(size_bytes, part_sizes);
    if layout.len() != sse.salts.len() {
        return Err(LayerError::Corrupt(format!("{} streams and {} salts", layout.len(), sse.salts.len())));
    }
    let mut pieces = Vec::new();
    let mut plain_at = 0u64;
    for ((len, stored_at), salt) in layout.into_iter().zip(&sse.salts) {
        let (a, b) = (start.max(plain_at), end.min(plain_at + len));
        if a < b {
            let (ra, rb) = (a - plain_at, b - plain_at);
            let first = ra / PACKAGE_PLAIN_BYTES as u64;
            let last = (rb - 1) / PACKAGE_PLAIN_BYTES as u64;
            let s0 = stored_at + first * PACKAGE_STORED_BYTES as u64;
            let s1 = stored_at + ((last + 1) * PACKAGE_STORED_BYTES as u64).min(stored_len(len));
            let skip = (ra - first * PACKAGE_PLAIN_BYTES as u64) as usize;
            let key = stream_key(object_key, salt)?;
            let stored = body_stream(snap.clone(), obj.clone(), s0, s1, DECRYPT_CHUNK_BYTES);
            pieces.push(decrypt_stream(stored, key, first, package_count(len), skip, b - a));
        }
        plain_at += len;
    }
    Ok(Box::pin(futures::stream::iter(pieces).flatten()))
}

/// Where a decrypting stream is: the next package, plaintext still to skip and to pass on.
struct Decrypting {
    seq: u64,
    skip: usize,
    left: u64,
    failed: bool,
}

/// Decrypts a stream of stored chunks (each whole packages, the first being package `first`), skipping
/// `skip` plaintext bytes and passing on `take`. Packages are decrypted in place and passed on as slices
/// of their chunk (no copy); the first error ends the stream.
fn decrypt_stream(stored: ByteStream, key: StreamKey, first: u64, packages: u64, skip: usize, take: u64) -> ByteStream {
    let state = Decrypting { seq: first, skip, left: take, failed: false };
    let s = stored
        .scan(state, move |st, chunk| {
            if st.failed {
                return futures::future::ready(None);
            }
            let out = chunk.and_then(|chunk| open_chunk(&key, st, packages, chunk));
            st.failed = out.is_err();
            futures::future::ready(Some(out))
        })
        .flat_map(|r| {
            let items: Vec<LayerResult<Bytes>> = match r {
                Ok(pieces) => pieces.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(items)
        });
    Box::pin(sync_wrapper::SyncStream::new(s))
}

/// The plaintext pieces of one chunk of whole packages, after the state's skip and within its limit.
fn open_chunk(key: &StreamKey, st: &mut Decrypting, packages: u64, chunk: Bytes) -> LayerResult<Vec<Bytes>> {
    // A chunk this stream owns is decrypted in place; one the store shares (its read buffer) is decrypted
    // into a plaintext buffer, so that its bytes are read once and never copied first.
    let (frozen, plain) = match chunk.try_into_mut() {
        Ok(mut unique) => {
            let plain = open_in_place(key, st, packages, &mut unique)?;
            (unique.freeze(), plain)
        }
        Err(shared) => open_into_buffer(key, st, packages, &shared)?,
    };
    let mut out = Vec::with_capacity(plain.len());
    for (at, len) in plain {
        let from = st.skip.min(len);
        let n = ((len - from) as u64).min(st.left) as usize;
        st.skip -= from;
        st.left -= n as u64;
        if n > 0 {
            out.push(frozen.slice(at + from..at + from + n));
        }
    }
    Ok(out)
}

/// Opens the packages of `buf` in place; returns where each plaintext is in `buf` and its length.
fn open_in_place(
    key: &StreamKey,
    st: &mut Decrypting,
    packages: u64,
    buf: &mut [u8],
) -> LayerResult<Vec<(usize, usize)>> {
    let mut plain = Vec::with_capacity(buf.len().div_ceil(PACKAGE_STORED_BYTES));
    let mut pos = 0;
    while pos < buf.len() {
        let n = (buf.len() - pos).min(PACKAGE_STORED_BYTES);
        let len = key.open_package(st.seq, packages, &mut buf[pos..pos + n]).map_err(crypt_error)?;
        plain.push((pos, len));
        pos += n;
        st.seq += 1;
    }
    Ok(plain)
}

/// Opens the packages of `stored` one after another into a plaintext buffer; returns the buffer and where
/// each plaintext is in it, with its length. Nothing of the buffer is handed out unless every package
/// opened.
fn open_into_buffer(
    key: &StreamKey,
    st: &mut Decrypting,
    packages: u64,
    stored: &[u8],
) -> LayerResult<(Bytes, Vec<(usize, usize)>)> {
    let count = stored.len().div_ceil(PACKAGE_STORED_BYTES);
    let total = stored.len().saturating_sub(count * TAG_BYTES);
    let mut buffer = PlainBuffer::take(total);
    let mut plain = Vec::with_capacity(count);
    let mut at = 0;
    for package in stored.chunks(PACKAGE_STORED_BYTES) {
        let len = package.len().saturating_sub(TAG_BYTES);
        let out =
            buffer.buf.get_mut(at..at + len).ok_or_else(|| LayerError::Corrupt("a package past its chunk".into()))?;
        key.open_package_into(st.seq, packages, package, out).map_err(crypt_error)?;
        plain.push((at, len));
        at += len;
        st.seq += 1;
    }
    debug_assert_eq!(at, total);
    Ok((Bytes::from_owner(buffer), plain))
}

/// Most plaintext buffers kept for reuse, and the size of each: a decrypted chunk's plaintext.
const PLAIN_POOL_BUFFERS: usize = 32;
const PLAIN_BUFFER_BYTES: usize = (DECRYPT_CHUNK_BYTES as usize / PACKAGE_STORED_BYTES) * PACKAGE_PLAIN_BYTES;
/// AES-GCM opens into initialized memory, and a fresh buffer would be zeroed first: a pass over every
/// byte, about 5% of an encrypted GET's CPU. So plaintext buffers come back here when the last piece
/// sent from one is dropped (at most PLAIN_POOL_BUFFERS of them: 32 MiB).
static PLAIN_POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A plaintext buffer whose first `len` bytes are the output of decryption (all of them written before
/// any is read); the rest is stale bytes never exposed.
struct PlainBuffer {
    buf: Vec<u8>,
    len: usize,
}

impl PlainBuffer {
    fn take(len: usize) -> PlainBuffer {
        let pooled = (len <= PLAIN_BUFFER_BYTES).then(|| PLAIN_POOL.lock().pop()).flatten();
        let mut buf = pooled.unwrap_or_default();
        if buf.len() < len {
            // Zeroed once, when the buffer is made; reused buffers are overwritten by decryption alone.
            buf.resize(len.max(PLAIN_BUFFER_BYTES), 0);
        }
        debug_assert!(buf.len() >= len);
        PlainBuffer { buf, len }
    }
}

impl AsRef<[u8]> for PlainBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for PlainBuffer {
    fn drop(&mut self) {
        if self.buf.len() != PLAIN_BUFFER_BYTES {
            return;
        }
        let mut pool = PLAIN_POOL.lock();
        if pool.len() < PLAIN_POOL_BUFFERS {
            pool.push(std::mem::take(&mut self.buf));
        }
    }
}

impl<S: mosaic_store::Store> S3Semantics<S> {
    /// The encryption of a new version: what the write asks for, else the bucket's default; its object
    /// key sealed.
    pub(crate) async fn seal_for_write(
        &self,
        bucket: &str,
        asked: Option<&SseRequest>,
    ) -> LayerResult<Option<(SseMeta, Key)>> {
        let req = match asked {
            Some(r) => Some(r.clone()),
            None => self.bucket_state(bucket).await?.encryption.as_ref().map(|e| e.request()).transpose()?,
        };
        req.map(|r| seal_new(self.cfg.sse_keys.as_deref(), &r)).transpose()
    }

    /// The object key that `sse` (an object's or an upload's) seals, opened (None: stored unencrypted);
    /// an SSE-C key given for an object without one is refused, as S3 does.
    pub(crate) fn check_read_key(
        &self,
        sse: Option<&SseMeta>,
        customer: Option<&CustomerKey>,
    ) -> LayerResult<Option<Key>> {
        match sse {
            None if customer.is_some() => {
                Err(key_mismatch("The encryption parameters are not applicable to this object"))
            }
            None => Ok(None),
            Some(sse) => open_object_key(self.cfg.sse_keys.as_deref(), sse, customer).map(Some),
        }
    }

    /// Streams a body into the store, encrypted as stream `salt` of the object key when one is given;
    /// returns it and its plaintext's size and MD5 (the ETag).
    pub(crate) async fn ingest_encrypting(
        &self,
        body: PutBody,
        stream: Option<(&Key, &str)>,
        max_bytes: u64,
        target: &crate::ingest::StageFor<S::Coll>,
    ) -> LayerResult<(Ingested<S::Staged>, Plaintext)> {
        let Some((object_key, salt)) = stream else {
            let ing = self.ingest(body, 0, max_bytes, target, true).await?;
            let plain = Plaintext { size_bytes: ing.size_bytes, md5_hex: ing.md5_hex.clone() };
            return Ok((ing, plain));
        };
        let (body, slot) = encrypt_body(body, object_key, salt, max_bytes)?;
        let ing = self.ingest(body, 0, stored_len(max_bytes), target, false).await?;
        let plain = slot.lock().take().ok_or_else(|| LayerError::Internal("a body ended unsealed".into()))?;
        assert_eq!(ing.size_bytes, stored_len(plain.size_bytes), "an encrypted body's stored size");
        Ok((ing, plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_buffers_are_reused_within_a_bound() {
        // Other tests decrypt concurrently: this one checks bounds, not exact pool contents.
        let held: Vec<PlainBuffer> = (0..PLAIN_POOL_BUFFERS + 8).map(|_| PlainBuffer::take(1000)).collect();
        assert!(held.iter().all(|b| b.as_ref().len() == 1000 && b.buf.len() == PLAIN_BUFFER_BYTES));
        drop(held);
        assert!(PLAIN_POOL.lock().len() <= PLAIN_POOL_BUFFERS);
        // Larger than a chunk's plaintext: made for the one use, never pooled.
        let big = PlainBuffer::take(PLAIN_BUFFER_BYTES + 1);
        assert_eq!(big.as_ref().len(), PLAIN_BUFFER_BYTES + 1);
        drop(big);
        assert!(PLAIN_POOL.lock().iter().all(|b| b.len() == PLAIN_BUFFER_BYTES));
        let reused = PlainBuffer::take(PLAIN_BUFFER_BYTES);
        assert_eq!(reused.as_ref().len(), PLAIN_BUFFER_BYTES);
    }

    const KEY: &str = "pO3upElrwuEXSoFwCfnZPdSsmt/xWeFa0N9KgDijwVs=";
    const MD5: &str = "DWygnHRtgiJ77HCm+1rvHw==";

    #[test]
    fn customer_key_headers() {
        let ok = CustomerKey::from_headers(Some("AES256"), Some(KEY), Some(MD5)).unwrap().unwrap();
        assert_eq!(ok.md5_b64(), MD5);
        assert!(!format!("{ok:?}").contains(KEY));
        assert_eq!(CustomerKey::from_headers(None, None, None).unwrap(), None);
        for (a, k, m) in [
            (Some("AES192"), Some(KEY), Some(MD5)),
            (None, Some(KEY), Some(MD5)),
            (Some("AES256"), None, Some(MD5)),
            (Some("AES256"), Some(KEY), None),
            (Some("AES256"), Some(KEY), Some("AAAAAAAAAAAAAAAAAAAAAA==")),
            (Some("AES256"), Some("c2hvcnQ="), Some(MD5)),
            (Some("AES256"), Some("not base64!"), Some(MD5)),
        ] {
            assert!(matches!(CustomerKey::from_headers(a, k, m), Err(LayerError::InvalidArgument(_))), "{a:?} {m:?}");
        }
    }

    #[test]
    fn keys_seal_and_open_by_mode() {
        let keys = SseKeys::new(MasterKeys::generate().unwrap(), ["k1".to_string()].into()).unwrap();
        let c = CustomerKey::from_headers(Some("AES256"), Some(KEY), Some(MD5)).unwrap().unwrap();
        let other = CustomerKey { key: Key::from_bytes([1; 32]), md5_b64: MD5.into() };
        for req in [SseRequest::S3, SseRequest::Kms { key_id: "k1".into() }, SseRequest::Customer(c.clone())] {
            let (meta, key) = seal_new(Some(&keys), &req).unwrap();
            let customer = matches!(req, SseRequest::Customer(_)).then_some(&c);
            assert_eq!(open_object_key(Some(&keys), &meta, customer).unwrap(), key);
            if customer.is_some() {
                assert!(matches!(open_object_key(Some(&keys), &meta, None), Err(LayerError::InvalidRequest(_))));
                // Same MD5 claimed, another key: the seal tells.
                assert!(matches!(
                    open_object_key(Some(&keys), &meta, Some(&other)),
                    Err(LayerError::InvalidRequest(_))
                ));
            } else {
                assert!(matches!(open_object_key(Some(&keys), &meta, Some(&c)), Err(LayerError::InvalidRequest(_))));
            }
        }
        assert_eq!(
            seal_new(Some(&keys), &SseRequest::Kms { key_id: "nope".into() }).unwrap_err(),
            LayerError::KmsKeyNotFound("nope".into())
        );
        assert!(matches!(seal_new(None, &SseRequest::S3), Err(LayerError::InvalidArgument(_))));
        let too_many: BTreeSet<String> = (0..=MAX_KMS_KEYS).map(|i| i.to_string()).collect();
        assert!(SseKeys::new(MasterKeys::generate().unwrap(), too_many).is_err());
    }

    #[test]
    fn master_keys_extend_while_serving_and_never_shrink() {
        let first = MasterKeys::generate().unwrap();
        let keys = SseKeys::new(first.clone(), BTreeSet::new()).unwrap();
        let (old_meta, old_key) = seal_new(Some(&keys), &SseRequest::S3).unwrap();
        let mut pending = first.clone();
        pending.add_pending().unwrap();
        keys.extend_master(pending.clone()).unwrap();
        let (meta, _) = seal_new(Some(&keys), &SseRequest::S3).unwrap();
        assert_eq!(meta.master_key_id, Some(1), "a pending key does not seal");
        let sealing = pending.clone().sealing_with(2).unwrap();
        keys.extend_master(sealing).unwrap();
        let (meta, key) = seal_new(Some(&keys), &SseRequest::S3).unwrap();
        assert_eq!(meta.master_key_id, Some(2));
        assert_eq!(open_object_key(Some(&keys), &meta, None).unwrap(), key);
        assert_eq!(open_object_key(Some(&keys), &old_meta, None).unwrap(), old_key, "older objects still open");
        // Going back (the set before) or taking another node's key 2 would lose a key: refused.
        assert!(keys.extend_master(pending).is_err() && keys.extend_master(first.clone()).is_err());
        let mut apart = first;
        apart.rotate().unwrap();
        assert!(keys.extend_master(apart).is_err());
        assert_eq!(keys.master_keys().current().0, 2);
    }

    #[test]
    fn stream_layout() {
        let p = PACKAGE_PLAIN_BYTES as u64;
        assert_eq!(streams(10, &[]), vec![(10, 0)]);
        assert_eq!(streams(0, &[p, 3]), vec![(p, 0), (3, p + 16)]);
        assert_eq!(stored_size(p + 3, &[p, 3]), p + 16 + 3 + 16);
        assert_eq!(stored_size(0, &[]), 16);
    }
}
