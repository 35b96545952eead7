//! Checksums of multipart objects for the algorithm named at CreateMultipartUpload: COMPOSITE (checksum
//! of the part checksums, "-N"), or FULL_OBJECT for CRCs (the parts' CRCs combined into the CRC of the
//! whole object, as if it had been sent in one piece).

use crate::checksum::{Algo, checksum_b64};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use mosaic_layer::{CompletePart, PartInfo};

pub fn composite_checksum(listed: &[PartInfo], parts: &[CompletePart], full_object: bool) -> Vec<(String, String)> {
    for algo in Algo::ALL {
        // Each part's checksum and size, in the order completed.
        let mut each = Vec::with_capacity(parts.len());
        for p in parts {
            let part = listed.iter().find(|l| l.part_number == p.part_number);
            let v = part
                .and_then(|l| l.checksums.iter().find(|(a, _)| a == algo.name()))
                .and_then(|(_, v)| B64.decode(v).ok())
                .filter(|raw| raw.len() == algo.digest_len());
            match (v, part) {
                (Some(raw), Some(l)) => each.push((raw, l.size_bytes)),
                _ => break,
            }
        }
        if each.len() != parts.len() || parts.is_empty() {
            continue;
        }
        if let (true, Some(crc)) = (full_object, algo.crc()) {
            let value = |raw: &[u8]| raw.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            let mut whole = value(&each[0].0);
            for (raw, size) in &each[1..] {
                whole = crc_fast::checksum_combine(crc, whole, value(raw), *size);
            }
            let bytes = whole.to_be_bytes();
            let encoded = B64.encode(&bytes[8 - algo.digest_len()..]);
            return vec![(algo.name().to_string(), encoded), ("TYPE".to_string(), "FULL_OBJECT".to_string())];
        }
        let concat: Vec<u8> = each.into_iter().flat_map(|(raw, _)| raw).collect();
        return vec![
            (algo.name().to_string(), format!("{}-{}", checksum_b64(algo, &concat), parts.len())),
            ("TYPE".to_string(), "COMPOSITE".to_string()),
        ];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_object_crcs_combine_into_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let cuts = [0usize, 100_000, 250_000, data.len()];
        for algo in [Algo::Crc32, Algo::Crc32c, Algo::Crc64Nvme] {
            let mut listed = Vec::new();
            let mut parts = Vec::new();
            for (i, w) in cuts.windows(2).enumerate() {
                let n = i as u32 + 1;
                let sum = checksum_b64(algo, &data[w[0]..w[1]]);
                listed.push(PartInfo {
                    part_number: n,
                    size_bytes: (w[1] - w[0]) as u64,
                    etag: String::new(),
                    last_modified_unix_ms: 0,
                    checksums: vec![(algo.name().to_string(), sum)],
                });
                parts.push(CompletePart { part_number: n, etag: String::new() });
            }
            let got = composite_checksum(&listed, &parts, true);
            assert_eq!(got[0], (algo.name().to_string(), checksum_b64(algo, &data)), "{algo:?}");
            assert_eq!(got[1].1, "FULL_OBJECT");
            assert!(composite_checksum(&listed, &parts, false)[0].1.ends_with("-3"));
        }
    }
}
