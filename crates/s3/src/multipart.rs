//! Checksums of multipart objects: COMPOSITE (checksum of the part checksums, "-N") for the algorithm
//! named at CreateMultipartUpload.

use crate::checksum::{Algo, checksum_b64};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use mosaic_layer::{CompletePart, PartInfo};

pub fn composite_checksum(listed: &[PartInfo], parts: &[CompletePart]) -> Vec<(String, String)> {
    for algo in Algo::ALL {
        let mut concat = Vec::new();
        let mut all = true;
        for p in parts {
            let v = listed
                .iter()
                .find(|l| l.part_number == p.part_number)
                .and_then(|l| l.checksums.iter().find(|(a, _)| a == algo.name()))
                .and_then(|(_, v)| B64.decode(v).ok());
            match v {
                Some(raw) => concat.extend(raw),
                None => {
                    all = false;
                    break;
                }
            }
        }
        if all && !parts.is_empty() {
            return vec![
                (algo.name().to_string(), format!("{}-{}", checksum_b64(algo, &concat), parts.len())),
                ("TYPE".to_string(), "COMPOSITE".to_string()),
            ];
        }
    }
    Vec::new()
}
