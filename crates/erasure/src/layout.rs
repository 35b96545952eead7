//! The geometry of a set (k data + m parity shards over k + m drives) and the layout record every drive
//! keeps with each object: which code, where shard 0 is, how many bytes are encoded as shards and how many
//! follow as a tail kept whole on a few drives, and the version (write id) that a quorum must agree on.
//!
//! An object's bytes [0, encoded) are cut into stripes of k shard units (4 KiB each, so every shard write
//! is aligned O_DIRECT): unit j of a stripe goes to shard j, shards 0..k hold data and k..k+m parity, and
//! shard j of an object lives on drive (rotation + j) mod (k + m). On a drive, an object holds its shard's
//! units back to back, then (on the tail's holders) the tail: bytes [encoded, size), never encoded, so an
//! append or an unaligned end costs no read and no re-encoding.

use crate::codec::CodecId;

/// Bytes of one shard unit.
pub const SHARD_UNIT_BYTES: u64 = 4096;
/// Most drives in one set.
pub const MAX_SET_DRIVES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetGeometry {
    pub data: usize,
    pub parity: usize,
}

impl SetGeometry {
    /// A geometry of `data` + `parity` shards: 1 to 16 drives, parity at most data.
    pub fn new(data: usize, parity: usize) -> Result<Self, String> {
        if data == 0 || data + parity > MAX_SET_DRIVES {
            return Err(format!("a set has 1 to {MAX_SET_DRIVES} drives (asked for {data}+{parity})"));
        }
        if parity > data {
            return Err(format!(
                "parity ({parity}) may not exceed data ({data}): a write quorum would not be a majority"
            ));
        }
        Ok(SetGeometry { data, parity })
    }

    /// The default geometry for `drives` drives: parity 0 for one drive, 1 for 2-3, 2 for 4-5, 3 for 6-7
    /// and 4 for 8 to 16 (as MinIO chooses).
    pub fn default_for(drives: usize) -> Result<Self, String> {
        let parity = match drives {
            0 => return Err("a set needs a drive".into()),
            1 => 0,
            2..=3 => 1,
            4..=5 => 2,
            6..=7 => 3,
            _ => 4,
        };
        Self::new(drives.saturating_sub(parity), parity)
    }

    /// Parses "k+m".
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not an erasure code of the form DATA+PARITY such as 4+2");
        let (k, m) = text.trim().split_once('+').ok_or_else(bad)?;
        Self::new(k.trim().parse().map_err(|_| bad())?, m.trim().parse().map_err(|_| bad())?)
    }

    pub fn drives(&self) -> usize {
        self.data + self.parity
    }

    /// Bytes of one stripe: k shard units.
    pub fn stripe_bytes(&self) -> u64 {
        self.data as u64 * SHARD_UNIT_BYTES
    }

    /// Drives that must commit a write: k, plus one when k = m (so that two writes cannot both succeed on
    /// disjoint halves). Always a strict majority, since m <= k.
    pub fn write_quorum(&self) -> usize {
        self.data + usize::from(self.data == self.parity)
    }

    /// Drives that must agree on an object's version for a read to trust it.
    pub fn read_quorum(&self) -> usize {
        self.data
    }

    /// Drives that keep an object's tail (bytes past its last whole stripe): m + 1, so it survives m failures.
    pub fn tail_copies(&self) -> usize {
        self.parity + 1
    }

    /// The drive holding shard `shard` of an object whose shard 0 is on drive `rotation`.
    pub fn drive_of_shard(&self, rotation: usize, shard: usize) -> usize {
        debug_assert!(rotation < self.drives() && shard < self.drives());
        (rotation + shard) % self.drives()
    }

    /// The shard a drive holds of an object whose shard 0 is on drive `rotation`.
    pub fn shard_on_drive(&self, rotation: usize, drive: usize) -> usize {
        (drive + self.drives() - rotation) % self.drives()
    }

    /// Where shard 0 of the object named `hint` goes: spread by a stable hash of the name.
    pub fn rotation_for(&self, hint: &[u8]) -> usize {
        (crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, hint) as usize) % self.drives()
    }

    /// The drives that keep the tail of an object: those of shards 0..=m.
    pub fn tail_holders(&self, rotation: usize) -> u16 {
        (0..self.tail_copies()).fold(0u16, |mask, s| mask | 1 << self.drive_of_shard(rotation, s))
    }

    /// Every drive of the set as a mask.
    pub fn all_drives(&self) -> u16 {
        ((1u32 << self.drives()) - 1) as u16
    }
}

/// Version of the layout record.
pub const LAYOUT_VERSION: u8 = 1;
const LAYOUT_BYTES: usize = 1 + 4 + 16 + 8 + 8 + 2 + 8 + 4;

/// What every drive keeps with an object (the attribute `ec.layout`), the same on all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectLayout {
    pub codec: CodecId,
    pub data: u8,
    pub parity: u8,
    /// The drive holding shard 0.
    pub rotation: u8,
    /// The version: a new random id for every write, what drives must agree on.
    pub write_id: [u8; 16],
    pub size_bytes: u64,
    /// Bytes [0, encoded) are stripes held as shards; a multiple of the stripe.
    pub encoded_bytes: u64,
    /// Drives keeping the tail [encoded, size), as a bit mask.
    pub tail_holders: u16,
    pub mtime_ns: u64,
}

impl ObjectLayout {
    /// Bytes of the object's shard on every drive (its tail follows on the holders).
    pub fn shard_bytes(&self) -> u64 {
        self.encoded_bytes / self.data as u64
    }

    pub fn tail_bytes(&self) -> u64 {
        self.size_bytes - self.encoded_bytes
    }

    pub fn holds_tail(&self, drive: usize) -> bool {
        self.tail_holders & (1 << drive) != 0
    }

    /// The size of the object on `drive`: its shard, plus the tail on a holder.
    pub fn drive_object_bytes(&self, drive: usize) -> u64 {
        self.shard_bytes() + if self.holds_tail(drive) { self.tail_bytes() } else { 0 }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LAYOUT_BYTES);
        v.push(LAYOUT_VERSION);
        v.extend_from_slice(&[self.codec, self.data, self.parity, self.rotation]);
        v.extend_from_slice(&self.write_id);
        v.extend_from_slice(&self.size_bytes.to_be_bytes());
        v.extend_from_slice(&self.encoded_bytes.to_be_bytes());
        v.extend_from_slice(&self.tail_holders.to_be_bytes());
        v.extend_from_slice(&self.mtime_ns.to_be_bytes());
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v) as u32;
        v.extend_from_slice(&crc.to_be_bytes());
        debug_assert_eq!(v.len(), LAYOUT_BYTES);
        debug_assert_eq!(Self::decode(&v).as_ref(), Ok(self), "a layout decodes back before it is written");
        v
    }

    pub fn decode(raw: &[u8]) -> Result<Self, String> {
        if raw.first() != Some(&LAYOUT_VERSION) {
            return Err(format!(
                "an erasure layout of version {:?}; this build reads version {LAYOUT_VERSION}",
                raw.first()
            ));
        }
        if raw.len() != LAYOUT_BYTES {
            return Err(format!("an erasure layout of {} bytes", raw.len()));
        }
        let (body, crc) = raw.split_at(LAYOUT_BYTES - 4);
        if crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
            != u32::from_be_bytes(crc.try_into().expect("4 bytes"))
        {
            return Err("an erasure layout fails its checksum".into());
        }
        let u64_at = |at: usize| u64::from_be_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let l = ObjectLayout {
            codec: raw[1],
            data: raw[2],
            parity: raw[3],
            rotation: raw[4],
            write_id: raw[5..21].try_into().expect("16 bytes"),
            size_bytes: u64_at(21),
            encoded_bytes: u64_at(29),
            tail_holders: u16::from_be_bytes([raw[37], raw[38]]),
            mtime_ns: u64_at(39),
        };
        let drives = l.data as usize + l.parity as usize;
        let stripe = l.data as u64 * SHARD_UNIT_BYTES;
        if l.data == 0
            || drives > MAX_SET_DRIVES
            || l.rotation as usize >= drives
            || l.encoded_bytes > l.size_bytes
            || !l.encoded_bytes.is_multiple_of(stripe)
            || (l.tail_holders as u32) >> drives != 0
        {
            return Err(format!("an erasure layout that does not hold together: {l:?}"));
        }
        Ok(l)
    }
}

/// Where bytes [from, to) of an object's encoded part lie in its shards: the stripes that cover them
/// ([first_stripe, end_stripe)), and so the byte range [first_stripe, end_stripe) * unit of every shard.
pub fn stripes_covering(geometry: &SetGeometry, from: u64, to: u64) -> (u64, u64) {
    let stripe = geometry.stripe_bytes();
    (from / stripe, to.div_ceil(stripe))
}

/// Splits whole stripes of `data` into k shard buffers (unit j of each stripe to shard j).
pub fn split_into_shards(data: &[u8], k: usize, out: &mut [&mut [u8]]) {
    let unit = SHARD_UNIT_BYTES as usize;
    assert!(data.len().is_multiple_of(unit * k) && out.len() == k, "whole stripes");
    let stripes = data.len() / (unit * k);
    assert!(out.iter().all(|o| o.len() == stripes * unit), "shard buffers of the stripes' length");
    for (s, stripe) in data.chunks_exact(unit * k).enumerate() {
        for (j, piece) in stripe.chunks_exact(unit).enumerate() {
            out[j][s * unit..(s + 1) * unit].copy_from_slice(piece);
        }
    }
}

/// Joins shard ranges (each the same stripes' units of shards 0..k) back into the object's bytes, writing
/// the part of them in [skip, skip + out.len()) into `out`.
pub fn join_shards(shards: &[&[u8]], skip: usize, len: usize, out: &mut Vec<u8>) {
    let unit = SHARD_UNIT_BYTES as usize;
    let k = shards.len();
    let start = out.len();
    let end = skip + len;
    let stripes = shards[0].len() / unit;
    out.reserve(len);
    for s in 0..stripes {
        for (j, shard) in shards.iter().enumerate() {
            let at = (s * k + j) * unit;
            if at + unit <= skip || at >= end {
                continue;
            }
            let (from, to) = (skip.max(at) - at, end.min(at + unit) - at);
            out.extend_from_slice(&shard[s * unit + from..s * unit + to]);
        }
    }
    assert_eq!(out.len() - start, len, "the shards cover the range");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn geometries() {
        let g = |d| SetGeometry::default_for(d).unwrap();
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7, 8, 16].map(|d| (g(d).data, g(d).parity)),
            [(1, 0), (1, 1), (2, 1), (2, 2), (3, 2), (3, 3), (4, 3), (4, 4), (12, 4)]
        );
        assert_eq!(SetGeometry::parse("4+2").unwrap(), SetGeometry { data: 4, parity: 2 });
        for bad in ["4", "4+", "a+b", "2+3", "0+0", "16+1", "4-2"] {
            assert!(SetGeometry::parse(bad).is_err(), "{bad}");
        }
        let s = SetGeometry::new(4, 2).unwrap();
        assert_eq!((s.write_quorum(), s.read_quorum(), s.tail_copies(), s.stripe_bytes()), (4, 4, 3, 16384));
        assert_eq!(SetGeometry::new(2, 2).unwrap().write_quorum(), 3);
        assert_eq!(SetGeometry::new(1, 0).unwrap().write_quorum(), 1);
        assert_eq!(s.tail_holders(5), 0b100011, "shards 0, 1, 2 on drives 5, 0, 1");
        for r in 0..6 {
            for d in 0..6 {
                assert_eq!(s.drive_of_shard(r, s.shard_on_drive(r, d)), d);
            }
            assert_eq!(s.tail_holders(r).count_ones(), 3);
        }
    }

    #[test]
    fn layout_round_trip_and_refusals() {
        let l = ObjectLayout {
            codec: 1,
            data: 4,
            parity: 2,
            rotation: 3,
            write_id: [7; 16],
            size_bytes: 40_000,
            encoded_bytes: 32_768,
            tail_holders: 0b111000,
            mtime_ns: 99,
        };
        let raw = l.encode();
        assert_eq!(ObjectLayout::decode(&raw), Ok(l));
        assert_eq!(
            (l.shard_bytes(), l.tail_bytes(), l.drive_object_bytes(3), l.drive_object_bytes(0)),
            (8192, 7232, 15_424, 8192)
        );
        let mut flipped = raw.clone();
        flipped[25] ^= 1;
        assert!(ObjectLayout::decode(&flipped).unwrap_err().contains("checksum"));
        let mut future = raw.clone();
        future[0] = 2;
        assert!(ObjectLayout::decode(&future).unwrap_err().contains("version"));
        assert!(ObjectLayout::decode(&raw[..20]).is_err());
        let odd = ObjectLayout { encoded_bytes: 4096, ..l };
        assert!(ObjectLayout::decode(&odd.encode_unchecked()).unwrap_err().contains("hold together"));
    }

    impl ObjectLayout {
        /// Encodes without the round-trip assertion, to make records that fail it.
        fn encode_unchecked(&self) -> Vec<u8> {
            let mut v = vec![LAYOUT_VERSION, self.codec, self.data, self.parity, self.rotation];
            v.extend_from_slice(&self.write_id);
            v.extend_from_slice(&self.size_bytes.to_be_bytes());
            v.extend_from_slice(&self.encoded_bytes.to_be_bytes());
            v.extend_from_slice(&self.tail_holders.to_be_bytes());
            v.extend_from_slice(&self.mtime_ns.to_be_bytes());
            let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &v) as u32;
            v.extend_from_slice(&crc.to_be_bytes());
            v
        }
    }

    proptest! {
        /// Splitting into shards and joining any range back gives the bytes of that range.
        #[test]
        fn split_and_join_are_inverse(k in 1usize..7, stripes in 1usize..5, from in 0usize..100_000, len in 0usize..100_000) {
            let unit = SHARD_UNIT_BYTES as usize;
            let data: Vec<u8> = (0..k * unit * stripes).map(|i| (i * 7 + i / 4096) as u8).collect();
            let mut shards = vec![vec![0u8; stripes * unit]; k];
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
            split_into_shards(&data, k, &mut refs);
            let from = from % data.len();
            let to = (from + len).min(data.len());
            let g = SetGeometry { data: k, parity: 0 };
            let (s0, s1) = stripes_covering(&g, from as u64, to as u64);
            let ranges: Vec<&[u8]> = shards.iter().map(|s| &s[s0 as usize * unit..s1 as usize * unit]).collect();
            let mut out = Vec::new();
            join_shards(&ranges, from - s0 as usize * k * unit, to - from, &mut out);
            prop_assert_eq!(&out[..], &data[from..to]);
        }
    }
}
