//! Keys: 32-byte secrets that zero themselves when dropped, derivation of one key from another by label,
//! sealing of an object key under a key-encryption key, and the set of master keys.

use crate::{CryptError, CryptResult};
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use std::collections::BTreeMap;

pub const KEY_BYTES: usize = 32;
/// Format version of a sealed key (its first byte).
const SEALED_VERSION: u8 = 1;
/// A sealed key: version, nonce, the key's ciphertext, tag.
pub const SEALED_KEY_BYTES: usize = 1 + NONCE_LEN + KEY_BYTES + 16;
/// Associated data of a sealed key, so that it cannot be taken for anything else sealed with the same key.
const SEALED_AAD: &[u8] = b"mosaic sealed object key v1";
/// Most master keys a set holds (each rotation adds one; old ones stay to open older objects).
pub const MAX_MASTER_KEYS: usize = 1024;

/// A 256-bit secret. Debug never shows it; dropping it overwrites it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_BYTES]);

impl Key {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Key(bytes)
    }

    /// A key from the system's random number generator.
    pub fn random() -> CryptResult<Self> {
        let mut k = [0u8; KEY_BYTES];
        SystemRandom::new().fill(&mut k).map_err(|_| CryptError::Random)?;
        Ok(Key(k))
    }

    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// Another key, HMAC-SHA256 of `label` under this one: independent keys for independent uses.
    pub fn derive(&self, label: &[u8]) -> Key {
        let tag = aws_lc_rs::hmac::sign(&aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &self.0), label);
        let mut k = [0u8; KEY_BYTES];
        k.copy_from_slice(tag.as_ref());
        Key(k)
    }

    pub(crate) fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte key fits AES-256-GCM"))
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // Volatile writes: the compiler may not drop them as dead stores.
        for b in self.0.iter_mut() {
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Seals `object_key` under `kek`: [`SEALED_KEY_BYTES`] bytes with a random nonce.
pub fn seal_key(kek: &Key, object_key: &Key) -> CryptResult<Vec<u8>> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).map_err(|_| CryptError::Random)?;
    let mut body = object_key.0.to_vec();
    let tag = kek
        .aead()
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(SEALED_AAD), &mut body)
        .map_err(|_| CryptError::Malformed("sealing failed".into()))?;
    let mut out = Vec::with_capacity(SEALED_KEY_BYTES);
    out.push(SEALED_VERSION);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&body);
    out.extend_from_slice(tag.as_ref());
    debug_assert_eq!(out.len(), SEALED_KEY_BYTES);
    Ok(out)
}

/// Opens a key sealed by [`seal_key`]; a wrong `kek` or a damaged seal is `Authentication`.
pub fn open_key(kek: &Key, sealed: &[u8]) -> CryptResult<Key> {
    let (&version, rest) = sealed.split_first().ok_or_else(|| CryptError::Malformed("empty sealed key".into()))?;
    if version != SEALED_VERSION {
        return Err(CryptError::UnknownVersion(version));
    }
    if sealed.len() != SEALED_KEY_BYTES {
        return Err(CryptError::Malformed(format!("a sealed key of {} bytes", sealed.len())));
    }
    let (nonce, body) = rest.split_at(NONCE_LEN);
    let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("split at the nonce length");
    let mut body = body.to_vec();
    let plain = kek
        .aead()
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(SEALED_AAD), &mut body)
        .map_err(|_| CryptError::Authentication)?;
    let key: [u8; KEY_BYTES] = (&*plain).try_into().map_err(|_| CryptError::Malformed("key length".into()))?;
    body.iter_mut().for_each(|b| *b = 0);
    Ok(Key(key))
}

/// The master keys by id: one seals new objects (the newest, unless a newer one is still pending: known,
/// to open what other nodes seal with it, and not sealing yet); the others stay to open what they sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterKeys {
    keys: BTreeMap<u32, Key>,
    /// The id of the key that seals (one of `keys`).
    sealing: u32,
}

impl MasterKeys {
    /// One fresh random key, id 1.
    pub fn generate() -> CryptResult<Self> {
        let mut keys = BTreeMap::new();
        keys.insert(1, Key::random()?);
        Ok(MasterKeys { keys, sealing: 1 })
    }

    /// From (id, key) pairs; ids are unique and at least one key is given. The newest seals.
    pub fn from_keys(pairs: impl IntoIterator<Item = (u32, Key)>) -> CryptResult<Self> {
        Self::from_keys_sealing(pairs, None)
    }

    /// From (id, key) pairs with key `sealing` sealing (one of them; None: the newest).
    pub fn from_keys_sealing(pairs: impl IntoIterator<Item = (u32, Key)>, sealing: Option<u32>) -> CryptResult<Self> {
        let mut keys = BTreeMap::new();
        for (id, key) in pairs {
            if keys.insert(id, key).is_some() {
                return Err(CryptError::Malformed(format!("master key id {id} given twice")));
            }
        }
        if keys.is_empty() || keys.len() > MAX_MASTER_KEYS {
            return Err(CryptError::Malformed(format!("1 to {MAX_MASTER_KEYS} master keys, not {}", keys.len())));
        }
        let sealing = sealing.unwrap_or_else(|| *keys.keys().next_back().expect("not empty"));
        if !keys.contains_key(&sealing) {
            return Err(CryptError::Malformed(format!("the sealing master key {sealing} is not in the set")));
        }
        Ok(MasterKeys { keys, sealing })
    }

    /// The same keys with key `id` sealing: it must be one of them and no older than the one sealing now
    /// (a set never goes back to an older key).
    pub fn sealing_with(mut self, id: u32) -> CryptResult<Self> {
        if !self.keys.contains_key(&id) || id < self.sealing {
            return Err(CryptError::Malformed(format!(
                "master key {id} cannot seal: the set holds {:?} and seals with {}",
                self.keys.keys().collect::<Vec<_>>(),
                self.sealing
            )));
        }
        self.sealing = id;
        Ok(self)
    }

    /// Adds a new random key that does not seal yet (`sealing_with` makes it seal); returns its id.
    pub fn add_pending(&mut self) -> CryptResult<u32> {
        if self.keys.len() >= MAX_MASTER_KEYS {
            return Err(CryptError::Malformed(format!("at most {MAX_MASTER_KEYS} master keys")));
        }
        let id = self.keys.keys().next_back().map_or(1, |n| n + 1);
        self.keys.insert(id, Key::random()?);
        debug_assert!(self.sealing < id && self.keys.contains_key(&self.sealing));
        Ok(id)
    }

    /// Adds a new random key, which seals from now on; returns its id.
    pub fn rotate(&mut self) -> CryptResult<u32> {
        let id = self.add_pending()?;
        self.sealing = id;
        Ok(id)
    }

    /// The key that seals new objects.
    pub fn current(&self) -> (u32, &Key) {
        let key = self.keys.get(&self.sealing).expect("the sealing key is in the set");
        (self.sealing, key)
    }

    /// The newest key when it does not seal yet.
    pub fn pending(&self) -> Option<u32> {
        self.keys.keys().next_back().copied().filter(|id| *id != self.sealing)
    }

    pub fn get(&self, id: u32) -> Option<&Key> {
        self.keys.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Key)> {
        self.keys.iter().map(|(id, k)| (*id, k))
    }

    /// Whether this set holds every key of `older` alike (it may hold more, and seal with a newer one):
    /// what a node may take in place of `older` without losing a key that opens something.
    pub fn extends(&self, older: &MasterKeys) -> bool {
        self.sealing >= older.sealing && older.keys.iter().all(|(id, k)| self.keys.get(id) == Some(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_key_opens_with_its_kek_only() {
        let (kek, other, obj) = (Key::random().unwrap(), Key::random().unwrap(), Key::random().unwrap());
        let sealed = seal_key(&kek, &obj).unwrap();
        assert_eq!(sealed.len(), SEALED_KEY_BYTES);
        assert_eq!(open_key(&kek, &sealed).unwrap(), obj);
        assert_eq!(open_key(&other, &sealed), Err(CryptError::Authentication));
        for i in 1..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(open_key(&kek, &bad), Err(CryptError::Authentication), "byte {i}");
        }
        let mut v2 = sealed.clone();
        v2[0] = 2;
        assert_eq!(open_key(&kek, &v2), Err(CryptError::UnknownVersion(2)));
        assert!(matches!(open_key(&kek, &sealed[..20]), Err(CryptError::Malformed(_))));
        assert!(matches!(open_key(&kek, &[]), Err(CryptError::Malformed(_))));
        // Two seals of one key differ (fresh nonces).
        assert_ne!(seal_key(&kek, &obj).unwrap(), sealed);
    }

    #[test]
    fn derivation_separates_labels() {
        let k = Key::from_bytes([7; 32]);
        assert_eq!(k.derive(b"a"), k.derive(b"a"));
        assert_ne!(k.derive(b"a"), k.derive(b"b"));
        assert_ne!(k.derive(b"a"), k);
        assert_eq!(format!("{k:?}"), "Key(..)");
    }

    #[test]
    fn rotation_keeps_old_keys_and_seals_with_the_newest() {
        let mut m = MasterKeys::generate().unwrap();
        assert_eq!(m.current().0, 1);
        let first = m.current().1.clone();
        assert_eq!(m.rotate().unwrap(), 2);
        assert_eq!(m.current().0, 2);
        assert_eq!(m.get(1), Some(&first));
        assert!(MasterKeys::from_keys([]).is_err());
        assert!(MasterKeys::from_keys([(1, first.clone()), (1, first.clone())]).is_err());
        let many = MasterKeys::from_keys((0..MAX_MASTER_KEYS as u32).map(|i| (i, first.clone()))).unwrap();
        let mut full = many.clone();
        assert!(full.rotate().is_err(), "the limit holds");
        assert!(MasterKeys::from_keys((0..=MAX_MASTER_KEYS as u32).map(|i| (i, first.clone()))).is_err());
    }

    #[test]
    fn a_pending_key_opens_and_seals_only_once_told() {
        let old = MasterKeys::generate().unwrap();
        let mut m = old.clone();
        assert_eq!((m.add_pending().unwrap(), m.current().0, m.pending()), (2, 1, Some(2)));
        assert!(m.extends(&old) && !old.extends(&m) && m.get(2).is_some());
        let sealing = m.clone().sealing_with(2).unwrap();
        assert_eq!((sealing.current().0, sealing.pending()), (2, None));
        assert!(sealing.extends(&m) && !m.extends(&sealing), "a set never goes back to an older sealing key");
        assert!(sealing.clone().sealing_with(1).is_err() && m.clone().sealing_with(3).is_err());
        // Another node's key 2 (made apart) is not an extension: it would lose what this key 2 sealed.
        let mut apart = old.clone();
        apart.add_pending().unwrap();
        assert!(!apart.extends(&m) && !m.extends(&apart));
        let mut full =
            MasterKeys::from_keys((0..MAX_MASTER_KEYS as u32).map(|i| (i, Key::from_bytes([1; 32])))).unwrap();
        assert!(full.add_pending().is_err(), "the limit holds");
    }
}
