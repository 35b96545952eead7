//! Where an object lives: the member chosen by a hash of its locator. The hash is part of the on-disk
//! format (a store's objects are found where it says), so it is fixed here and pinned by a test: MD5 of
//! the locator, its first 8 bytes as a little-endian number, modulo the number of members. An empty
//! locator names the home member, 0.

use md5::{Digest, Md5};

/// The member (0 .. `members`) that holds objects of `locator`.
pub fn member_of(locator: &[u8], members: usize) -> usize {
    debug_assert!(members > 0);
    if locator.is_empty() || members <= 1 {
        return 0;
    }
    let digest = Md5::digest(locator);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let member = (u64::from_le_bytes(first) % members as u64) as usize;
    debug_assert!(member < members);
    member
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_fixed_forever() {
        // Changing these moves every object of every pool: a format change, never a refactoring.
        let got: Vec<usize> = ["a", "photos/cat.jpg", "logs/2026/11/24.gz", "k-00001"]
            .iter()
            .map(|k| member_of(k.as_bytes(), 7))
            .collect();
        assert_eq!(got, PINNED);
        assert_eq!(member_of(b"", 7), 0);
        assert_eq!(member_of(b"anything", 1), 0);
    }

    const PINNED: [usize; 4] = [3, 4, 4, 5];

    #[test]
    fn keys_spread_evenly_over_members() {
        for members in [2usize, 3, 5, 16] {
            let keys = 20_000 * members;
            let mut counts = vec![0usize; members];
            for i in 0..keys {
                counts[member_of(format!("data/part-{i:08}.parquet").as_bytes(), members)] += 1;
            }
            let fair = (keys / members) as f64;
            for (m, c) in counts.iter().enumerate() {
                let off = (*c as f64 - fair).abs() / fair;
                assert!(off < 0.03, "{members} members: member {m} holds {c} keys, {:.1}% off", off * 100.0);
            }
        }
    }
}
