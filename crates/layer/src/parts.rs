//! The part table of an object with many parts: its part sizes and, when it is encrypted, each part's
//! stream salt, kept apart from the metadata record once the object has more than `RECORD_PARTS_MAX`
//! parts. The record is one attribute (at most 64 KiB on a drive, and copied whole into an erasure set's
//! undo log when it is changed in place), and 10,000 part sizes in JSON are about 80 KB, their salts
//! 350 KB more.
//!
//! Binary, version 1: a version byte, the part count (4 bytes, big-endian), a flags byte (1: salts
//! follow), each size in 5 bytes (parts are at most 5 GiB), each salt in 16 bytes, then a CRC32C of all
//! that; cut into attributes of at most `CHUNK_BYTES` named `s3.parts.0`, `s3.parts.1`, ... 10,000
//! encrypted parts take 210 KB, four attributes.

use crate::error::{LayerError, LayerResult};

/// Most parts whose sizes (and salts) the metadata record keeps itself: 500 encrypted parts make a
/// record of about 22 KB.
pub const RECORD_PARTS_MAX: usize = 500;
const VERSION: u8 = 1;
const FLAG_SALTS: u8 = 1;
const HEADER_BYTES: usize = 6;
const SIZE_BYTES: usize = 5;
const SALT_BYTES: usize = mosaic_crypt::SALT_BYTES;
const CRC_BYTES: usize = 4;
/// Largest attribute of a table.
const CHUNK_BYTES: usize = 60 << 10;
/// Most attributes a table takes (10,000 parts with salts).
const CHUNKS_MAX: usize =
    (HEADER_BYTES + crate::MAX_PARTS as usize * (SIZE_BYTES + SALT_BYTES) + CRC_BYTES).div_ceil(CHUNK_BYTES);

/// The attribute holding chunk `i` of a part table.
pub(crate) fn chunk_attr(i: usize) -> Vec<u8> {
    debug_assert!(i < CHUNKS_MAX);
    format!("s3.parts.{i}").into_bytes()
}

fn table_bytes(count: usize, salted: bool) -> usize {
    HEADER_BYTES + count * (SIZE_BYTES + if salted { SALT_BYTES } else { 0 }) + CRC_BYTES
}

/// How many attributes the table of `count` parts takes.
pub(crate) fn chunk_count(count: usize, salted: bool) -> usize {
    table_bytes(count, salted).div_ceil(CHUNK_BYTES)
}

/// The table's chunks, in order. Salts are hex, as the metadata record keeps them.
pub(crate) fn encode(sizes: &[u64], salts: Option<&[String]>) -> LayerResult<Vec<Vec<u8>>> {
    // Sizes come from stored part records: a damaged one is an error, never a panic.
    if sizes.len() > crate::MAX_PARTS as usize || sizes.iter().any(|s| *s > crate::MAX_PART_BYTES) {
        return Err(LayerError::Corrupt("a part table past 10,000 parts or 5 GiB a part".into()));
    }
    if let Some(s) = salts
        && s.len() != sizes.len()
    {
        return Err(LayerError::Corrupt(format!("{} parts and {} stream salts", sizes.len(), s.len())));
    }
    let mut v = Vec::with_capacity(table_bytes(sizes.len(), salts.is_some()));
    v.push(VERSION);
    v.extend_from_slice(&(sizes.len() as u32).to_be_bytes());
    v.push(if salts.is_some() { FLAG_SALTS } else { 0 });
    for size in sizes {
        v.extend_from_slice(&size.to_be_bytes()[8 - SIZE_BYTES..]);
    }
    for salt in salts.unwrap_or_default() {
        match hex::decode(salt) {
            Ok(b) if b.len() == SALT_BYTES => v.extend_from_slice(&b),
            _ => return Err(LayerError::Corrupt("a damaged stream salt".into())),
        }
    }
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v) as u32;
    v.extend_from_slice(&crc.to_be_bytes());
    debug_assert_eq!(v.len(), table_bytes(sizes.len(), salts.is_some()));
    let chunks: Vec<Vec<u8>> = v.chunks(CHUNK_BYTES).map(<[u8]>::to_vec).collect();
    debug_assert_eq!(chunks.len(), chunk_count(sizes.len(), salts.is_some()));
    Ok(chunks)
}

/// The sizes and (with `salted`) hex salts of a table of `count` parts, from its chunks joined in order.
pub(crate) fn decode(raw: &[u8], count: usize, salted: bool) -> LayerResult<(Vec<u64>, Option<Vec<String>>)> {
    let bad = |why: &str| LayerError::Corrupt(format!("the part table of an object: {why}"));
    if raw.len() != table_bytes(count, salted) {
        return Err(bad("its length differs from the record's part count"));
    }
    let (body, crc) = raw.split_at(raw.len() - CRC_BYTES);
    if crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
        != u32::from_be_bytes(crc.try_into().expect("4 bytes"))
    {
        return Err(bad("checksum mismatch"));
    }
    if body[0] != VERSION {
        return Err(bad(&format!("unknown version {}", body[0])));
    }
    let stored_count = u32::from_be_bytes(body[1..5].try_into().expect("4 bytes")) as usize;
    if stored_count != count || body[5] != if salted { FLAG_SALTS } else { 0 } {
        return Err(bad("it differs from the record"));
    }
    let (sizes, salts) = body[HEADER_BYTES..].split_at(count * SIZE_BYTES);
    let sizes: Vec<u64> =
        sizes.chunks_exact(SIZE_BYTES).map(|c| c.iter().fold(0u64, |n, b| n << 8 | u64::from(*b))).collect();
    let salts = salted.then(|| salts.chunks_exact(SALT_BYTES).map(hex::encode).collect::<Vec<_>>());
    debug_assert!(sizes.len() == count && salts.as_ref().is_none_or(|s| s.len() == count));
    Ok((sizes, salts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_of_the_most_parts_round_trip_in_chunks_within_an_attribute() {
        let n = crate::MAX_PARTS as usize;
        let sizes: Vec<u64> = (0..n as u64).map(|i| crate::MAX_PART_BYTES - i * 977).collect();
        let salts: Vec<String> = (0..n).map(|i| hex::encode([(i % 251) as u8; SALT_BYTES])).collect();
        for salted in [false, true] {
            let chunks = encode(&sizes, salted.then_some(&salts[..])).unwrap();
            assert_eq!(chunks.len(), chunk_count(n, salted));
            assert!(chunks.len() <= CHUNKS_MAX && chunks.iter().all(|c| c.len() <= CHUNK_BYTES));
            let joined = chunks.concat();
            let (got_sizes, got_salts) = decode(&joined, n, salted).unwrap();
            assert_eq!(got_sizes, sizes);
            assert_eq!(got_salts, salted.then(|| salts.clone()));
            // Damage, a cut, another count or a table of the other kind are refused.
            let mut damaged = joined.clone();
            damaged[HEADER_BYTES + 3] ^= 1;
            assert!(decode(&damaged, n, salted).is_err());
            assert!(decode(&joined[..joined.len() - 1], n, salted).is_err());
            assert!(decode(&joined, n - 1, salted).is_err());
            assert!(decode(&joined, n, !salted).is_err());
        }
        assert_eq!(chunk_count(n, true), CHUNKS_MAX);
        let mut bad_salts = salts.clone();
        bad_salts[7] = "not hex".into();
        assert!(encode(&sizes, Some(&bad_salts)).is_err());
        assert!(encode(&sizes, Some(&salts[1..])).is_err());
        assert!(encode(&[crate::MAX_PART_BYTES + 1], None).is_err(), "a size past 5 GiB");
        assert!(encode(&vec![1; n + 1], None).is_err(), "past 10,000 parts");
        // An unknown version with a valid checksum is refused too.
        let mut v = encode(&sizes[..3], None).unwrap().concat();
        v[0] = 2;
        let body_len = v.len() - CRC_BYTES;
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v[..body_len]) as u32;
        v[body_len..].copy_from_slice(&crc.to_be_bytes());
        assert!(decode(&v, 3, false).unwrap_err().to_string().contains("unknown version"));
    }
}
