//! The on-device superblock: the first 4 KiB of the data device. It names the drive (uuid), the format
//! version and the geometry, and is protected by a crc32c. The same uuid is stored in the metadata
//! database so that a database is never paired with the wrong device.

use crate::error::{EngineError, Result};

pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"MOSAICDR";
pub const FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_BYTES: usize = 4096;
/// The unit of allocation, IO alignment and checksums.
pub const BLOCK_SIZE_BYTES: u64 = 4096;
/// The first 1 MiB of the device holds the superblock and room for its successors.
pub const DATA_START_BLOCK: u64 = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub format_version: u32,
    pub uuid: [u8; 16],
    pub block_size_bytes: u32,
    pub device_size_bytes: u64,
    /// First block available for object data; the blocks before it hold the superblock.
    pub data_start_block: u64,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        let mut out = [0u8; SUPERBLOCK_BYTES];
        out[0..8].copy_from_slice(SUPERBLOCK_MAGIC);
        out[8..12].copy_from_slice(&self.format_version.to_le_bytes());
        out[12..28].copy_from_slice(&self.uuid);
        out[28..32].copy_from_slice(&self.block_size_bytes.to_le_bytes());
        out[32..40].copy_from_slice(&self.device_size_bytes.to_le_bytes());
        out[40..48].copy_from_slice(&self.data_start_block.to_le_bytes());
        let crc = crate::checksum::crc32c(&out[..SUPERBLOCK_BYTES - 4]);
        out[SUPERBLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        if raw.len() < SUPERBLOCK_BYTES || &raw[0..8] != SUPERBLOCK_MAGIC {
            return Err(EngineError::NotADrive("no Mosaic superblock on the data device".into()));
        }
        let stored = u32::from_le_bytes(raw[SUPERBLOCK_BYTES - 4..SUPERBLOCK_BYTES].try_into().expect("4 bytes"));
        if crate::checksum::crc32c(&raw[..SUPERBLOCK_BYTES - 4]) != stored {
            return Err(EngineError::Corrupt("superblock checksum mismatch".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(raw[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
        let format_version = u32_at(8);
        if format_version != FORMAT_VERSION {
            return Err(EngineError::UnsupportedVersion { found: format_version, supported: FORMAT_VERSION });
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&raw[12..28]);
        Ok(Superblock {
            format_version,
            uuid,
            block_size_bytes: u32_at(28),
            device_size_bytes: u64_at(32),
            data_start_block: u64_at(40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            format_version: FORMAT_VERSION,
            uuid: [7; 16],
            block_size_bytes: 4096,
            device_size_bytes: 1 << 30,
            data_start_block: 256,
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let raw = sample().encode();
        for i in 0..64 {
            let mut bad = raw;
            bad[i] ^= 1;
            assert!(Superblock::decode(&bad).is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn wrong_version_is_refused() {
        let mut sb = sample();
        sb.format_version = 99;
        assert!(matches!(Superblock::decode(&sb.encode()), Err(EngineError::UnsupportedVersion { .. })));
    }
}
