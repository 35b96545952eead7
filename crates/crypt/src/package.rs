//! The package format of an encrypted stream: packages of [`PACKAGE_PLAIN_BYTES`] plaintext, each stored
//! as its ciphertext and a tag; the nonce is the package's index and a last-package flag.

use crate::keys::Key;
use crate::{CryptError, CryptResult};
use aws_lc_rs::aead::{Aad, LessSafeKey, NONCE_LEN, Nonce, Tag};

pub const PACKAGE_PLAIN_BYTES: usize = 64 << 10;
pub const TAG_BYTES: usize = 16;
pub const PACKAGE_STORED_BYTES: usize = PACKAGE_PLAIN_BYTES + TAG_BYTES;
/// Bytes of a stream's salt (random per stream; stored in its object's metadata).
pub const SALT_BYTES: usize = 16;
const PACKAGE_AAD: &[u8] = b"mosaic sse package v1";

/// Packages of a stream of `plain` bytes: at least one (an empty stream has one empty package).
pub fn package_count(plain: u64) -> u64 {
    plain.div_ceil(PACKAGE_PLAIN_BYTES as u64).max(1)
}

/// Stored bytes of a stream of `plain` bytes.
pub fn stored_len(plain: u64) -> u64 {
    plain + package_count(plain) * TAG_BYTES as u64
}

fn nonce(seq: u64, last: bool) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&seq.to_be_bytes());
    n[11] = last as u8;
    Nonce::assume_unique_for_key(n)
}

/// The key of one stream: derived from the object key and the stream's salt.
pub struct StreamKey {
    aead: LessSafeKey,
}

impl StreamKey {
    pub fn new(object_key: &Key, salt: &[u8; SALT_BYTES]) -> Self {
        let mut label = b"mosaic sse stream\0".to_vec();
        label.extend_from_slice(salt);
        StreamKey { aead: object_key.derive(&label).aead() }
    }

    /// Encrypts `plain` as packages `first_seq..` appended to `out`: every package is full but the last
    /// one, which is flagged the stream's last when `ends_stream`. Empty `plain` makes one empty package,
    /// and only as the stream's last.
    pub fn seal_packages(&self, first_seq: u64, plain: &[u8], ends_stream: bool, out: &mut Vec<u8>) {
        assert!(!plain.is_empty() || ends_stream, "an empty package only ends a stream");
        assert!(ends_stream || plain.len().is_multiple_of(PACKAGE_PLAIN_BYTES), "packages inside a stream are full");
        let count = (plain.len() as u64).div_ceil(PACKAGE_PLAIN_BYTES as u64).max(1) as usize;
        let start = out.len();
        out.reserve(plain.len() + count * TAG_BYTES);
        for i in 0..count {
            let piece =
                &plain[(i * PACKAGE_PLAIN_BYTES).min(plain.len())..((i + 1) * PACKAGE_PLAIN_BYTES).min(plain.len())];
            let at = out.len();
            out.extend_from_slice(piece);
            let last = ends_stream && i + 1 == count;
            let tag: Tag = self
                .aead
                .seal_in_place_separate_tag(nonce(first_seq + i as u64, last), Aad::from(PACKAGE_AAD), &mut out[at..])
                .expect("a package is far below AES-GCM's length limit");
            out.extend_from_slice(tag.as_ref());
        }
        debug_assert_eq!(out.len() - start, plain.len() + count * TAG_BYTES);
    }

    /// Encrypts one package in place (at most [`PACKAGE_PLAIN_BYTES`]; shorter or empty only as the
    /// stream's last) and returns its tag, which is stored right after it.
    pub fn seal_package(&self, seq: u64, last: bool, package: &mut [u8]) -> [u8; TAG_BYTES] {
        assert!(package.len() <= PACKAGE_PLAIN_BYTES, "a package holds at most {PACKAGE_PLAIN_BYTES} bytes");
        assert!(last || package.len() == PACKAGE_PLAIN_BYTES, "packages inside a stream are full");
        let tag = self
            .aead
            .seal_in_place_separate_tag(nonce(seq, last), Aad::from(PACKAGE_AAD), package)
            .expect("a package is far below AES-GCM's length limit");
        tag.as_ref().try_into().expect("AES-GCM tags are 16 bytes")
    }

    /// Decrypts in place whole stored packages `first_seq..` of a stream of `stream_packages` packages,
    /// moving the plaintext to the front of `buf`; returns its length. Any package that does not verify
    /// (wrong key, damage, a package moved, dropped or cut off) fails the whole call.
    pub fn open_packages(&self, first_seq: u64, stream_packages: u64, buf: &mut [u8]) -> CryptResult<usize> {
        let mut plain_len = 0;
        let mut pos = 0;
        let mut seq = first_seq;
        while pos < buf.len() {
            let n = (buf.len() - pos).min(PACKAGE_STORED_BYTES);
            let plain = self.open_package(seq, stream_packages, &mut buf[pos..pos + n])?;
            buf.copy_within(pos..pos + plain, plain_len);
            plain_len += plain;
            pos += n;
            seq += 1;
        }
        debug_assert!(plain_len <= buf.len());
        Ok(plain_len)
    }

    /// Decrypts stored package `seq` of a stream of `stream_packages` in place: its plaintext is then the
    /// first (returned) bytes of `package`. A package of the wrong size for its place is malformed.
    pub fn open_package(&self, seq: u64, stream_packages: u64, package: &mut [u8]) -> CryptResult<usize> {
        let n = package.len();
        check_package_len(seq, stream_packages, n)?;
        let last = seq + 1 == stream_packages;
        let plain = self
            .aead
            .open_in_place(nonce(seq, last), Aad::from(PACKAGE_AAD), package)
            .map_err(|_| CryptError::Authentication)?
            .len();
        debug_assert_eq!(plain + TAG_BYTES, n);
        Ok(plain)
    }

    /// Decrypts stored package `seq` of a stream of `stream_packages` from `stored` (left as it is) into
    /// `plain`, which is exactly as long as the package's plaintext: for stored bytes that are shared, so
    /// that they need not be copied first. On an error `plain` holds no plaintext to use.
    pub fn open_package_into(
        &self,
        seq: u64,
        stream_packages: u64,
        stored: &[u8],
        plain: &mut [u8],
    ) -> CryptResult<()> {
        let n = stored.len();
        check_package_len(seq, stream_packages, n)?;
        assert_eq!(plain.len() + TAG_BYTES, n, "the plaintext buffer fits the package");
        let last = seq + 1 == stream_packages;
        let (ciphertext, tag) = stored.split_at(n - TAG_BYTES);
        self.aead
            .open_separate_gather(nonce(seq, last), Aad::from(PACKAGE_AAD), ciphertext, tag, plain)
            .map_err(|_| CryptError::Authentication)
    }
}

/// A package's stored size must fit its place: full inside the stream, a tag up to full as its last.
fn check_package_len(seq: u64, stream_packages: u64, n: usize) -> CryptResult<()> {
    let last = seq + 1 == stream_packages;
    let fits = if last { (TAG_BYTES..=PACKAGE_STORED_BYTES).contains(&n) } else { n == PACKAGE_STORED_BYTES };
    if seq >= stream_packages || !fits {
        return Err(CryptError::Malformed(format!("package {seq} of {stream_packages} has {n} bytes")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> StreamKey {
        StreamKey::new(&Key::from_bytes([3; 32]), &[9; SALT_BYTES])
    }

    fn seal_all(k: &StreamKey, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        k.seal_packages(0, plain, true, &mut out);
        out
    }

    #[test]
    fn sizes() {
        assert_eq!(stored_len(0), 16);
        assert_eq!(stored_len(1), 17);
        let p = PACKAGE_PLAIN_BYTES as u64;
        assert_eq!(stored_len(p), p + 16);
        assert_eq!(stored_len(p + 1), p + 1 + 32);
        assert_eq!(package_count(3 * p), 3);
    }

    #[test]
    fn tampering_is_detected_never_garbage() {
        let k = key();
        let plain: Vec<u8> = (0..PACKAGE_PLAIN_BYTES * 2 + 100).map(|i| i as u8).collect();
        let sealed = seal_all(&k, &plain);
        let n = package_count(plain.len() as u64);
        let mut ok = sealed.clone();
        assert_eq!(k.open_packages(0, n, &mut ok).unwrap(), plain.len());
        assert_eq!(&ok[..plain.len()], &plain[..]);
        // One flipped bit anywhere.
        for at in [0, 100, PACKAGE_PLAIN_BYTES + 3, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[at] ^= 0x10;
            assert_eq!(k.open_packages(0, n, &mut bad), Err(CryptError::Authentication), "at {at}");
        }
        // Cut off after the first two packages: the second is not flagged last.
        let mut cut = sealed[..2 * PACKAGE_STORED_BYTES].to_vec();
        assert_eq!(k.open_packages(0, 2, &mut cut), Err(CryptError::Authentication));
        // Packages swapped.
        let mut swapped = sealed.clone();
        swapped[..PACKAGE_STORED_BYTES].copy_from_slice(&sealed[PACKAGE_STORED_BYTES..2 * PACKAGE_STORED_BYTES]);
        swapped[PACKAGE_STORED_BYTES..2 * PACKAGE_STORED_BYTES].copy_from_slice(&sealed[..PACKAGE_STORED_BYTES]);
        assert_eq!(k.open_packages(0, n, &mut swapped), Err(CryptError::Authentication));
        // Another stream's key (another salt).
        let other = StreamKey::new(&Key::from_bytes([3; 32]), &[8; SALT_BYTES]);
        assert_eq!(other.open_packages(0, n, &mut sealed.clone()), Err(CryptError::Authentication));
        // Shorter than a tag, or more packages than the stream has.
        assert!(matches!(k.open_packages(0, n, &mut [0u8; 5]), Err(CryptError::Malformed(_))));
        assert!(matches!(k.open_packages(5, 3, &mut sealed.clone()), Err(CryptError::Malformed(_))));
    }

    #[test]
    fn opening_into_another_buffer_matches_opening_in_place() {
        let k = key();
        let plain: Vec<u8> = (0..PACKAGE_PLAIN_BYTES + 1000).map(|i| (i * 13) as u8).collect();
        let sealed = seal_all(&k, &plain);
        let (first, second) = sealed.split_at(PACKAGE_STORED_BYTES);
        let mut out = vec![0u8; PACKAGE_PLAIN_BYTES];
        k.open_package_into(0, 2, first, &mut out).unwrap();
        assert_eq!(out, plain[..PACKAGE_PLAIN_BYTES]);
        let mut out = vec![0u8; 1000];
        k.open_package_into(1, 2, second, &mut out).unwrap();
        assert_eq!(out, plain[PACKAGE_PLAIN_BYTES..]);
        let mut bad = second.to_vec();
        bad[7] ^= 1;
        assert_eq!(k.open_package_into(1, 2, &bad, &mut out), Err(CryptError::Authentication));
        assert_eq!(
            k.open_package_into(0, 2, second, &mut out),
            Err(CryptError::Malformed("package 0 of 2 has 1016 bytes".into()))
        );
        assert_eq!(k.open_package_into(0, 1, second, &mut out), Err(CryptError::Authentication), "not flagged last");
    }

    #[test]
    fn empty_stream_is_one_empty_package() {
        let k = key();
        let sealed = seal_all(&k, b"");
        assert_eq!(sealed.len(), TAG_BYTES);
        assert_eq!(k.open_packages(0, 1, &mut sealed.clone()).unwrap(), 0);
    }

    proptest! {
        /// Any plaintext, sealed in pieces as a stream would be, opens whole and by any package range.
        #[test]
        fn round_trip_and_ranges(len in 0usize..300_000, cut in 0usize..5, from in 0u64..6) {
            let k = key();
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            // Sealed in two calls, split at a package boundary.
            let split = (cut * PACKAGE_PLAIN_BYTES).min(len / PACKAGE_PLAIN_BYTES * PACKAGE_PLAIN_BYTES);
            let split = if split == len && len > 0 { split - PACKAGE_PLAIN_BYTES } else { split };
            let mut sealed = Vec::new();
            if split > 0 {
                k.seal_packages(0, &plain[..split], false, &mut sealed);
            }
            k.seal_packages((split / PACKAGE_PLAIN_BYTES) as u64, &plain[split..], true, &mut sealed);
            prop_assert_eq!(sealed.len() as u64, stored_len(len as u64));
            let n = package_count(len as u64);
            let first = from.min(n - 1);
            let mut tail = sealed[first as usize * PACKAGE_STORED_BYTES..].to_vec();
            let got = k.open_packages(first, n, &mut tail).unwrap();
            let start = (first as usize * PACKAGE_PLAIN_BYTES).min(len);
            prop_assert_eq!(&tail[..got], &plain[start..]);
        }
    }
}
