//! Self-verifying object bodies. Every PUT body is a 32-byte header (magic, key hash, payload length, pool
//! offset, and a check over them) followed by bytes of a shared random pool starting at that offset. A GET checks the header names
//! the requested key and the body's true length, and compares every payload byte with the pool while
//! streaming, so a wrong, truncated, stale-but-foreign or corrupted body is caught without keeping any
//! per-object state and without buffering the object. Append streams carry no header: byte `i` of an
//! appended object is `pool[(key_hash + i) % POOL_LEN]`, so the expected content follows from key and length.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use rand::{RngCore, SeedableRng, rngs::StdRng};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub const HEADER_LEN: usize = 32;
const MAGIC: &[u8; 4] = b"MOSB";
/// Large enough that bodies of different keys rarely share content, small enough to stay in cache.
pub const POOL_LEN: usize = 8 * 1024 * 1024 + 4093;
/// Streaming chunk size: bounds memory per request no matter how large the object.
const CHUNK_BYTES: usize = 1024 * 1024;

/// The pool of random bytes all bodies are cut from.
#[derive(Clone)]
pub struct Pool(Bytes);

impl Pool {
    pub fn new(seed: u64) -> Pool {
        let mut v = vec![0u8; POOL_LEN];
        StdRng::seed_from_u64(seed ^ 0x6d6f_7361_6963).fill_bytes(&mut v);
        Pool(Bytes::from(v))
    }
}

/// A stable 64-bit hash of a key (FNV-1a): the same in every run and on every machine.
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// A check over the header's fields, so damage to the header itself is caught too.
fn header_check(h: &[u8]) -> [u8; 4] {
    let sum =
        h[8..HEADER_LEN].iter().fold(0xcbf2_9ce4_8422_2325u64, |x, b| (x ^ *b as u64).wrapping_mul(0x0100_0000_01b3));
    (sum as u32).to_le_bytes()
}

/// What a PUT sends: enough to regenerate and to check the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodySpec {
    pub key_hash: u64,
    pub len: u64,
    pub pool_offset: u64,
}

impl BodySpec {
    fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.key_hash.to_le_bytes());
        h[16..24].copy_from_slice(&self.len.to_le_bytes());
        h[24..32].copy_from_slice(&self.pool_offset.to_le_bytes());
        let check = header_check(&h);
        h[4..8].copy_from_slice(&check);
        h
    }

    /// Bodies shorter than a header are plain pool bytes at the key's own offset.
    fn has_header(&self) -> bool {
        self.len >= HEADER_LEN as u64
    }
}

/// A streaming request body: header then pool slices, never the whole object in memory.
pub struct PoolBody {
    pool: Pool,
    header: Option<Bytes>,
    /// Pool position of the next payload byte, and payload bytes still to send.
    at: u64,
    remaining: u64,
}

impl PoolBody {
    pub fn object(pool: &Pool, spec: BodySpec) -> PoolBody {
        if spec.has_header() {
            PoolBody {
                pool: pool.clone(),
                header: Some(Bytes::copy_from_slice(&spec.header())),
                at: spec.pool_offset,
                remaining: spec.len - HEADER_LEN as u64,
            }
        } else {
            PoolBody { pool: pool.clone(), header: None, at: spec.key_hash, remaining: spec.len }
        }
    }

    /// Bytes `[offset, offset + len)` of the append stream of the key with hash `key_hash`.
    pub fn append(pool: &Pool, key_hash: u64, offset: u64, len: u64) -> PoolBody {
        PoolBody { pool: pool.clone(), header: None, at: key_hash.wrapping_add(offset), remaining: len }
    }

    fn len(&self) -> u64 {
        self.header.as_ref().map_or(0, |h| h.len() as u64) + self.remaining
    }
}

impl Body for PoolBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(h) = self.header.take() {
            return Poll::Ready(Some(Ok(Frame::data(h))));
        }
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let start = (self.at % POOL_LEN as u64) as usize;
        let n = (POOL_LEN - start).min(CHUNK_BYTES).min(self.remaining as usize);
        let chunk = self.pool.0.slice(start..start + n);
        self.at += n as u64;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.header.is_none() && self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len())
    }
}

/// Checks a body chunk by chunk as it arrives.
pub struct Verifier {
    pool: Pool,
    key_hash: u64,
    mode: VerifyMode,
    header: Vec<u8>,
    /// Body bytes seen so far.
    seen: u64,
    /// Pool position of the next payload byte (known once the header is read).
    at: u64,
    expected_len: Option<u64>,
    error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyMode {
    /// A body written by [`PoolBody::object`].
    Object,
    /// An append stream: content fixed by the key, length given.
    Append { len: u64 },
}

impl Verifier {
    pub fn new(pool: &Pool, key: &str, mode: VerifyMode) -> Verifier {
        let key_hash = key_hash(key);
        let (at, expected_len) = match mode {
            VerifyMode::Object => (0, None),
            VerifyMode::Append { len } => (key_hash, Some(len)),
        };
        Verifier { pool: pool.clone(), key_hash, mode, header: Vec::new(), seen: 0, at, expected_len, error: None }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if self.mode == VerifyMode::Object && self.header.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..take]);
            self.seen += take as u64;
            data = &data[take..];
            if self.header.len() == HEADER_LEN {
                self.parse_header();
            }
            if self.error.is_some() {
                return;
            }
        }
        // Compare whole runs against the pool (memcmp), wrapping at its end.
        let mut done = 0usize;
        while done < data.len() {
            let start = ((self.at + done as u64) % POOL_LEN as u64) as usize;
            let n = (POOL_LEN - start).min(data.len() - done);
            if data[done..done + n] != self.pool.0[start..start + n] {
                let i = (0..n).find(|&i| data[done + i] != self.pool.0[start + i]).unwrap_or(0);
                self.error = Some(format!("byte {} differs from what was written", self.seen + (done + i) as u64));
                return;
            }
            done += n;
        }
        self.at += data.len() as u64;
        self.seen += data.len() as u64;
    }

    fn parse_header(&mut self) {
        let h = &self.header;
        let field = |r: std::ops::Range<usize>| u64::from_le_bytes(h[r].try_into().unwrap_or([0; 8]));
        if &h[..4] != MAGIC || h[4..8] != header_check(h) {
            self.error = Some("body does not start with an intact bench header".into());
        } else if field(8..16) != self.key_hash {
            self.error = Some("body belongs to another key".into());
        } else {
            self.expected_len = Some(field(16..24));
            self.at = field(24..32);
        }
    }

    /// The verdict once the body has ended.
    pub fn finish(mut self) -> Result<u64, String> {
        if self.error.is_none() && self.mode == VerifyMode::Object && self.header.len() < HEADER_LEN {
            // Short bodies carry no header: they are pool bytes at the key's own offset.
            let short = std::mem::take(&mut self.header);
            self.at = self.key_hash;
            self.seen = 0;
            self.mode = VerifyMode::Append { len: short.len() as u64 };
            self.expected_len = Some(short.len() as u64);
            self.update(&short);
        }
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.expected_len {
            Some(n) if n != self.seen => Err(format!("body has {} bytes, {} were written", self.seen, n)),
            _ => Ok(self.seen),
        }
    }
}

/// Shared handle: workers clone it freely.
pub type SharedPool = Arc<Pool>;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn collect(b: PoolBody) -> Vec<u8> {
        b.collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default()
    }

    fn verify(pool: &Pool, key: &str, mode: VerifyMode, data: &[u8], chunk: usize) -> Result<u64, String> {
        let mut v = Verifier::new(pool, key, mode);
        for c in data.chunks(chunk.max(1)) {
            v.update(c);
        }
        v.finish()
    }

    #[tokio::test]
    async fn bodies_round_trip_and_damage_is_caught() {
        let pool = Pool::new(7);
        for len in [0u64, 1, 31, 32, 33, 4096, 3 * 1024 * 1024 + 17, POOL_LEN as u64 + 100] {
            let spec = BodySpec { key_hash: key_hash("k"), len, pool_offset: POOL_LEN as u64 - 5 };
            let body = PoolBody::object(&pool, spec);
            assert_eq!(body.size_hint().exact(), Some(len));
            let data = collect(body).await;
            assert_eq!(data.len() as u64, len);
            for chunk in [1, 7, 4096, 1 << 20] {
                assert_eq!(verify(&pool, "k", VerifyMode::Object, &data, chunk), Ok(len));
            }
            if len > 0 {
                let mut bad = data.clone();
                let i = bad.len() - 1;
                bad[i] ^= 1;
                assert!(verify(&pool, "k", VerifyMode::Object, &bad, 4096).is_err(), "flip at len {len}");
                if len > HEADER_LEN as u64 {
                    // Shorter bodies carry no length; the caller checks it against what it wrote.
                    assert!(verify(&pool, "k", VerifyMode::Object, &data[..data.len() - 1], 4096).is_err());
                }
                if len >= HEADER_LEN as u64 {
                    assert!(verify(&pool, "other", VerifyMode::Object, &data, 4096).is_err());
                }
            }
        }
    }

    #[tokio::test]
    async fn append_streams_concatenate() {
        let pool = Pool::new(1);
        let h = key_hash("a");
        let mut all = Vec::new();
        for i in 0..5u64 {
            all.extend(collect(PoolBody::append(&pool, h, i * 2048, 2048)).await);
        }
        assert_eq!(verify(&pool, "a", VerifyMode::Append { len: 5 * 2048 }, &all, 1000), Ok(5 * 2048));
        assert!(verify(&pool, "a", VerifyMode::Append { len: 6 * 2048 }, &all, 1000).is_err());
        assert!(verify(&pool, "b", VerifyMode::Append { len: 5 * 2048 }, &all, 1000).is_err());
    }
}
