//! The envelope of everything the cluster writes to disk or sends between nodes: a kind, a version, the
//! body's length and its CRC32C, then the body (JSON: the control plane is small and read by people too).
//! A reader refuses a kind it did not ask for, a version it does not know, a short or long body and a
//! checksum that fails.
//!
//! `magic(4) kind(1) version(1) length_bytes(4, BE) crc32c(4, BE) body`

use serde::Serialize;
use serde::de::DeserializeOwned;

const MAGIC: &[u8; 4] = b"MOSC";
const HEADER_BYTES: usize = 14;
/// Largest body a frame carries (a map of 2^20 placement groups of 16 drives fits).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// What a frame holds; each kind has its own version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Map = 1,
    RaftEntry = 2,
    RaftVote = 3,
    RaftLogId = 4,
    Snapshot = 5,
    Rpc = 6,
}

impl Kind {
    /// The version this build writes and the only one it reads.
    fn version(self) -> u8 {
        1
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not a Mosaic cluster frame")]
    Magic,
    #[error("a frame of kind {got} where kind {want} was expected")]
    Kind { got: u8, want: u8 },
    #[error("a frame of version {got} (kind {kind}); this build reads version {want}")]
    Version { kind: u8, got: u8, want: u8 },
    #[error("a frame of {got} bytes where its header says {want}")]
    Length { got: usize, want: usize },
    #[error("a frame body of {0} bytes is over the limit of {MAX_BODY_BYTES}")]
    TooLarge(usize),
    #[error("a frame fails its checksum")]
    Checksum,
    #[error("a frame body does not parse: {0}")]
    Body(String),
}

fn crc32c(body: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
}

/// `value` in a frame of `kind`.
pub fn encode<T: Serialize>(kind: Kind, value: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(value).map_err(|e| FrameError::Body(e.to_string()))?;
    if body.len() > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.push(kind as u8);
    out.push(kind.version());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    debug_assert_eq!(out.len(), HEADER_BYTES + body.len());
    Ok(out)
}

/// The value in a frame of `kind`, checked whole before it is parsed.
pub fn decode<T: DeserializeOwned>(kind: Kind, raw: &[u8]) -> Result<T, FrameError> {
    if raw.len() < HEADER_BYTES || &raw[..4] != MAGIC {
        return Err(FrameError::Magic);
    }
    if raw[4] != kind as u8 {
        return Err(FrameError::Kind { got: raw[4], want: kind as u8 });
    }
    if raw[5] != kind.version() {
        return Err(FrameError::Version { kind: raw[4], got: raw[5], want: kind.version() });
    }
    let length_bytes = u32::from_be_bytes(raw[6..10].try_into().expect("4 bytes")) as usize;
    if length_bytes > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(length_bytes));
    }
    let body = &raw[HEADER_BYTES..];
    if body.len() != length_bytes {
        return Err(FrameError::Length { got: body.len(), want: length_bytes });
    }
    if crc32c(body) != u32::from_be_bytes(raw[10..14].try_into().expect("4 bytes")) {
        return Err(FrameError::Checksum);
    }
    serde_json::from_slice(body).map_err(|e| FrameError::Body(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let raw = encode(Kind::Map, &vec![1u32, 2, 3]).unwrap();
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &raw).unwrap(), vec![1, 2, 3]);
        assert_eq!(decode::<Vec<u32>>(Kind::Rpc, &raw), Err(FrameError::Kind { got: 1, want: 6 }));

        let mut newer = raw.clone();
        newer[5] = 2;
        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &newer), Err(FrameError::Version { got: 2, .. })));

        let mut flipped = raw.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &flipped), Err(FrameError::Checksum));

        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &raw[..raw.len() - 1]), Err(FrameError::Length { .. })));
        assert_eq!(decode::<Vec<u32>>(Kind::Map, b"MOS"), Err(FrameError::Magic));
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &[0u8; 20]), Err(FrameError::Magic));

        let mut huge = raw.clone();
        huge[6..10].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &huge), Err(FrameError::TooLarge(_))));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = decode::<Vec<u32>>(Kind::Map, &raw);
        }
    }
}
