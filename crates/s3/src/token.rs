//! ListObjectsV2 continuation tokens: the last key returned, versioned and base64-encoded so clients
//! treat it as opaque and a tampered token is refused rather than misread.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

const TOKEN_VERSION: u8 = 1;
/// A token never holds more than a key (1024 bytes) plus its header.
const MAX_TOKEN_BYTES: usize = 2048;

pub fn encode(last_key: &str) -> String {
    debug_assert!(last_key.len() <= mosaic_layer::MAX_KEY_BYTES, "tokens carry S3 keys");
    let mut raw = vec![TOKEN_VERSION];
    raw.extend_from_slice(last_key.as_bytes());
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &raw) as u32;
    raw.extend_from_slice(&crc.to_be_bytes());
    B64.encode(raw)
}

#[derive(Debug, PartialEq, Eq)]
pub struct BadToken;

pub fn decode(token: &str) -> Result<String, BadToken> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(BadToken);
    }
    let raw = B64.decode(token).map_err(|_| BadToken)?;
    if raw.len() < 5 || raw[0] != TOKEN_VERSION {
        return Err(BadToken);
    }
    let (body, crc) = raw.split_at(raw.len() - 4);
    let want = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32;
    if want.to_be_bytes() != crc {
        return Err(BadToken);
    }
    String::from_utf8(body[1..].to_vec()).map_err(|_| BadToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_key_fits_in_a_token() {
        let key = "k".repeat(mosaic_layer::MAX_KEY_BYTES);
        assert_eq!(decode(&encode(&key)), Ok(key));
    }

    #[test]
    fn round_trip_and_tamper() {
        for k in ["", "a", "dir/ü/k"] {
            assert_eq!(decode(&encode(k)).unwrap(), k);
        }
        let t = encode("key");
        let mut bad = t.clone().into_bytes();
        bad[2] = if bad[2] == b'A' { b'B' } else { b'A' };
        assert_eq!(decode(std::str::from_utf8(&bad).unwrap()), Err(BadToken));
        assert_eq!(decode("!!"), Err(BadToken));
        assert_eq!(decode(&"A".repeat(5000)), Err(BadToken));
    }
}
