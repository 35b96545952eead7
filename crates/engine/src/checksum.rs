//! crc32c over blocks and records, through crc-fast (hardware accelerated where available).

pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(super::crc32c(&[0u8; 32]), 0x8A91_36AA);
    }
}
