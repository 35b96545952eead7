//! Key and value encodings of the KV index (DESIGN.md 3.1). Keys are fixed-width big-endian so that one
//! object's entries are adjacent and ordered, and a prefix scan or range delete covers exactly one object or
//! one block. Values begin with a format version byte where they are structured.

use crate::error::{EngineError, Result};

pub const CF_NAMES: &str = "names";
pub const CF_ONODES: &str = "onodes";
pub const CF_BLOCKS: &str = "blocks";
pub const CF_FRAGS: &str = "frags";
pub const CF_ATTRS: &str = "attrs";
pub const CF_OMAP: &str = "omap";
pub const CF_ALLOC: &str = "alloc";
pub const CF_REFS: &str = "refs";
pub const ALL_CFS: [&str; 8] = [CF_NAMES, CF_ONODES, CF_BLOCKS, CF_FRAGS, CF_ATTRS, CF_OMAP, CF_ALLOC, CF_REFS];

/// Collection id 0 is the registry of collections: its names are collection names, its values ids.
pub const REGISTRY_COLLECTION: u32 = 0;
/// The registry's other side: its names are collection ids (big-endian), its values their names.
pub const REVERSE_REGISTRY: u32 = u32::MAX;

/// The key of collection `coll`'s name in the reverse registry.
pub fn reverse_registry_key(coll: u32) -> Vec<u8> {
    name_key(REVERSE_REGISTRY, &coll.to_be_bytes())
}

/// Version of the KV records' formats, stored under `META_FORMAT`. 2: block-map entries may be runs whose
/// checksums cover 16 KiB units (a build that knows only version 1 would misread them, so it must refuse
/// the drive). Version 1 databases (per-block entries, which version 2 reads unchanged) are upgraded in
/// place when opened.
pub const KV_FORMAT_VERSION: u32 = 2;

/// Keys of the default column family holding engine state.
pub const META_UUID: &[u8] = b"uuid";
pub const META_FORMAT: &[u8] = b"format_version";

pub type CollectionId = u32;
pub type Nid = u64;

/// Largest object the engine accepts: S3's 5 TiB.
pub const MAX_OBJECT_BYTES: u64 = 5 << 40;
/// Blocks of the largest object: bounds every scan of one object's block map.
pub const MAX_OBJECT_BLOCKS: u64 = MAX_OBJECT_BYTES / crate::superblock::BLOCK_SIZE_BYTES;
/// Most fragments one block may hold: the write path merges a block before it passes half of this, so a
/// scan of a block's fragments is bounded (lazy sync merges far earlier, at `lazy_sync_frag_count`).
pub const MAX_FRAGS_PER_BLOCK: usize = 4096;
/// Most collections a drive holds (S3 allows a million buckets per account).
pub const MAX_COLLECTIONS: usize = 1 << 20;
/// Most attributes plus omap entries of one object (a clone copies them all in one transaction).
pub const MAX_ATTRS_PER_OBJECT: usize = 1 << 16;

pub fn name_key(coll: CollectionId, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + name.len());
    k.extend_from_slice(&coll.to_be_bytes());
    k.extend_from_slice(name);
    k
}

pub fn collection_prefix(coll: CollectionId) -> [u8; 4] {
    coll.to_be_bytes()
}

/// Bytes of a nid's key, the prefix of every key of its object (`nid_sub_key`, `block_key`).
pub const NID_KEY_BYTES: usize = 8;

pub fn nid_key(nid: Nid) -> [u8; NID_KEY_BYTES] {
    nid.to_be_bytes()
}

pub fn block_key(nid: Nid, lblock: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&nid.to_be_bytes());
    k[8..].copy_from_slice(&lblock.to_be_bytes());
    k
}

pub fn frag_key(nid: Nid, lblock: u64, seq: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(&block_key(nid, lblock));
    k[16..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub fn nid_sub_key(nid: Nid, sub: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + sub.len());
    k.extend_from_slice(&nid.to_be_bytes());
    k.extend_from_slice(sub);
    k
}

/// Version byte in front of a name entry's listing tag.
pub const NAME_TAG_VERSION: u8 = 1;

/// A name index entry: the object's nid (8 bytes, big-endian), then optionally a listing tag: a version
/// byte and bytes the caller owns (the S3 layer keeps size, ETag and mtime there), which ordered listing
/// returns without reading the onode.
pub fn encode_name_entry(nid: Nid, tag: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + tag.map_or(0, <[u8]>::len));
    v.extend_from_slice(&nid.to_be_bytes());
    if let Some(t) = tag {
        v.push(NAME_TAG_VERSION);
        v.extend_from_slice(t);
    }
    debug_assert!(decode_name_entry(&v).is_ok_and(|d| d == (nid, tag)), "a name entry decodes back");
    v
}

pub fn decode_name_entry(raw: &[u8]) -> Result<(Nid, Option<&[u8]>)> {
    let nid = u64_at(raw, 0)?;
    match raw.get(8) {
        None => Ok((nid, None)),
        Some(&NAME_TAG_VERSION) => Ok((nid, Some(&raw[9..]))),
        Some(v) => Err(EngineError::Corrupt(format!("name entry tag version {v}"))),
    }
}

pub fn u64_at(raw: &[u8], at: usize) -> Result<u64> {
    raw.get(at..at + 8)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| EngineError::Corrupt(format!("short record ({} bytes)", raw.len())))
}

pub fn u32_at(raw: &[u8], at: usize) -> Result<u32> {
    raw.get(at..at + 4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| EngineError::Corrupt(format!("short record ({} bytes)", raw.len())))
}

/// The smallest key greater than every key starting with `prefix`, or None if there is none.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last != 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

const ONODE_VERSION: u8 = 1;

/// Object metadata that changes rarely: size and identity. Writes inside the current size do not touch it
/// (paper 001's decoupled onode); the block map carries the per-block state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Onode {
    pub size_bytes: u64,
    pub mtime_ns: u64,
    pub write_count: u32,
    pub flags: u32,
    pub collection: CollectionId,
    pub name: Vec<u8>,
}

pub const ONODE_FLAG_PRIORITY: u32 = 1;

impl Onode {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(29 + self.name.len());
        v.push(ONODE_VERSION);
        v.extend_from_slice(&self.size_bytes.to_be_bytes());
        v.extend_from_slice(&self.mtime_ns.to_be_bytes());
        v.extend_from_slice(&self.write_count.to_be_bytes());
        v.extend_from_slice(&self.flags.to_be_bytes());
        v.extend_from_slice(&self.collection.to_be_bytes());
        v.extend_from_slice(&self.name);
        debug_assert_eq!(Onode::decode(&v).ok().as_ref(), Some(self), "an onode decodes back before it is written");
        v
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        if raw.first() != Some(&ONODE_VERSION) {
            return Err(EngineError::Corrupt("onode has an unknown version".into()));
        }
        Ok(Onode {
            size_bytes: u64_at(raw, 1)?,
            mtime_ns: u64_at(raw, 9)?,
            write_count: u32_at(raw, 17)?,
            flags: u32_at(raw, 21)?,
            collection: u32_at(raw, 25)?,
            name: raw.get(29..).unwrap_or_default().to_vec(),
        })
    }
}

/// One block-map entry: where a logical block lives and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    pub physical_block: u64,
    pub crc32c: u32,
}

impl BlockEntry {
    pub fn encode(&self) -> [u8; 12] {
        let mut v = [0u8; 12];
        v[..8].copy_from_slice(&self.physical_block.to_be_bytes());
        v[8..].copy_from_slice(&self.crc32c.to_be_bytes());
        v
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        if raw.len() != 12 {
            return Err(EngineError::Corrupt(format!("block entry of {} bytes", raw.len())));
        }
        Ok(BlockEntry { physical_block: u64_at(raw, 0)?, crc32c: u32_at(raw, 8)? })
    }
}

/// Most logical blocks one block-map entry maps (4 MiB): bounds the backward search for the entry that
/// covers a block, and the work of splitting one.
pub const MAX_RUN_BLOCKS: u64 = 1024;
/// Blocks one checksum covers in a long run (16 KiB; BlueStore's checksum chunk): the block map of
/// large objects then costs about 70 bytes per MiB instead of 1 KiB, and a read verifies whole units.
pub const RUN_CHECKSUM_UNIT_BLOCKS: u64 = 4;
/// Runs at least this long are built with 16 KiB checksum units; shorter runs keep one per block.
pub const UNIT_CHECKSUM_MIN_RUN_BLOCKS: u64 = 16;

/// A block-map entry in extent form: `len_blocks` logical blocks from the entry key's block on, stored at
/// consecutive physical blocks from `physical_start`, with one crc32c per checksum unit of `unit_blocks`
/// blocks counted from the run's start (the last unit may be shorter).
///
/// Encoding: the physical start (8 bytes) and one crc per block (4 bytes each) when units are single
/// blocks, so a run of one block is exactly a `BlockEntry` (maps written before runs existed read as runs
/// of one); with longer units the physical start, the length (2 bytes) and one crc per unit, which makes
/// the value's length 2 modulo 4.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRun {
    pub physical_start: u64,
    pub len_blocks: u64,
    pub unit_blocks: u64,
    pub crcs: Vec<u32>,
}

/// One checksum unit of a run: blocks [first, first + blocks) (relative to the run) and their crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChecksumUnit {
    pub first: u64,
    pub blocks: u64,
    pub crc32c: u32,
}

impl BlockRun {
    /// A run with one checksum per block.
    pub fn per_block(physical_start: u64, crcs: Vec<u32>) -> BlockRun {
        BlockRun { physical_start, len_blocks: crcs.len() as u64, unit_blocks: 1, crcs }
    }

    /// A run from per-block checksums, with 16 KiB units when it is long (combined without reading).
    pub fn from_block_crcs(physical_start: u64, block_crcs: &[u32]) -> BlockRun {
        let n = block_crcs.len() as u64;
        if n < UNIT_CHECKSUM_MIN_RUN_BLOCKS {
            return BlockRun::per_block(physical_start, block_crcs.to_vec());
        }
        let unit = RUN_CHECKSUM_UNIT_BLOCKS as usize;
        let crcs = block_crcs
            .chunks(unit)
            .map(|c| c.iter().skip(1).fold(c[0], |acc, b| crate::checksum::crc32c_append_block(acc, *b)))
            .collect();
        BlockRun { physical_start, len_blocks: n, unit_blocks: RUN_CHECKSUM_UNIT_BLOCKS, crcs }
    }

    pub fn len_blocks(&self) -> u64 {
        self.len_blocks
    }

    /// The checksum unit that holds block `i` of the run.
    pub fn unit_of(&self, i: u64) -> ChecksumUnit {
        debug_assert!(i < self.len_blocks);
        let u = i / self.unit_blocks;
        let first = u * self.unit_blocks;
        ChecksumUnit { first, blocks: self.unit_blocks.min(self.len_blocks - first), crc32c: self.crcs[u as usize] }
    }

    /// The checksum units that hold blocks [from, to) of the run, in order.
    pub fn units(&self, from: u64, to: u64) -> impl Iterator<Item = ChecksumUnit> + '_ {
        let (first_unit, end_unit) = (from / self.unit_blocks, to.div_ceil(self.unit_blocks));
        (first_unit..end_unit).map(move |u| self.unit_of(u * self.unit_blocks))
    }

    /// Whether a run can be cut at block `i` without recomputing a checksum.
    pub fn cuts_cleanly_at(&self, i: u64) -> bool {
        i.is_multiple_of(self.unit_blocks) || i == self.len_blocks
    }

    /// Blocks [from, to) of the run, when both ends fall on unit boundaries (or the run's end).
    pub fn slice(&self, from: u64, to: u64) -> Option<BlockRun> {
        debug_assert!(from < to && to <= self.len_blocks);
        if !self.cuts_cleanly_at(from) || !self.cuts_cleanly_at(to) {
            return None;
        }
        let crcs = self.crcs[(from / self.unit_blocks) as usize..to.div_ceil(self.unit_blocks) as usize].to_vec();
        Some(BlockRun {
            physical_start: self.physical_start + from,
            len_blocks: to - from,
            unit_blocks: self.unit_blocks,
            crcs,
        })
    }

    /// `next` appended to this run, if it continues it physically, the result stays within
    /// MAX_RUN_BLOCKS and the checksums can be combined without reading: per-block runs join per-block
    /// runs; a unit run takes per-block checksums, which extend its last unit and start new ones.
    pub fn joined(&self, next_block_crcs: &[u32], next_physical_start: u64) -> Option<BlockRun> {
        let n = next_block_crcs.len() as u64;
        if next_physical_start != self.physical_start + self.len_blocks || self.len_blocks + n > MAX_RUN_BLOCKS {
            return None;
        }
        let mut out = self.clone();
        for &c in next_block_crcs {
            if out.unit_blocks == 1 || out.len_blocks.is_multiple_of(out.unit_blocks) {
                out.crcs.push(c);
            } else {
                let last = out.crcs.last_mut().expect("a run has a unit");
                *last = crate::checksum::crc32c_append_block(*last, c);
            }
            out.len_blocks += 1;
        }
        // A per-block run that grew long takes units only when built anew (the next split or rewrite).
        Some(out)
    }

    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(self.len_blocks >= 1 && self.len_blocks <= MAX_RUN_BLOCKS);
        debug_assert_eq!(self.crcs.len() as u64, self.len_blocks.div_ceil(self.unit_blocks));
        let mut v = Vec::with_capacity(10 + 4 * self.crcs.len());
        v.extend_from_slice(&self.physical_start.to_be_bytes());
        if self.unit_blocks > 1 {
            debug_assert_eq!(self.unit_blocks, RUN_CHECKSUM_UNIT_BLOCKS);
            v.extend_from_slice(&(self.len_blocks as u16).to_be_bytes());
        }
        for c in &self.crcs {
            v.extend_from_slice(&c.to_be_bytes());
        }
        debug_assert_eq!(BlockRun::decode(&v).ok().as_ref(), Some(self), "a run decodes back before it is written");
        v
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        let bad = || EngineError::Corrupt(format!("block-map entry of {} bytes", raw.len()));
        if raw.len() < 12 {
            return Err(bad());
        }
        let physical_start = u64_at(raw, 0)?;
        let (len_blocks, unit_blocks, crc_bytes) = match (raw.len() - 8) % 4 {
            0 => (((raw.len() - 8) / 4) as u64, 1, &raw[8..]),
            2 => {
                let n = u16::from_be_bytes([raw[8], raw[9]]) as u64;
                if n == 0 || ((raw.len() - 10) / 4) as u64 != n.div_ceil(RUN_CHECKSUM_UNIT_BLOCKS) {
                    return Err(bad());
                }
                (n, RUN_CHECKSUM_UNIT_BLOCKS, &raw[10..])
            }
            _ => return Err(bad()),
        };
        if len_blocks > MAX_RUN_BLOCKS || physical_start.checked_add(len_blocks).is_none() {
            return Err(bad());
        }
        let crcs = crc_bytes.chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(BlockRun { physical_start, len_blocks, unit_blocks, crcs })
    }
}

/// Applies a block's fragment values, in key (write) order, over its content.
pub(crate) fn apply_fragments<'a>(
    content: &mut [u8],
    nid: Nid,
    lb: u64,
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<()> {
    for v in values {
        let (off, data) = decode_frag(v)?;
        let off = off as usize;
        if off + data.len() > content.len() {
            return Err(EngineError::Corrupt(format!("fragment past its block in nid {nid} block {lb}")));
        }
        content[off..off + data.len()].copy_from_slice(data);
    }
    Ok(())
}

/// A fragment: bytes written inside one block without a read-modify-write. The value carries a crc32c of
/// its header and data so that a flipped bit in the KV store is detected.
pub fn encode_frag(offset_in_block: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&offset_in_block.to_be_bytes());
    v.extend_from_slice(data);
    let crc = crate::checksum::crc32c(&v);
    v.extend_from_slice(&crc.to_be_bytes());
    debug_assert!(decode_frag(&v).is_ok_and(|(o, d)| o == offset_in_block && d == data), "a fragment decodes back");
    v
}

pub fn decode_frag(raw: &[u8]) -> Result<(u32, &[u8])> {
    if raw.len() < 8 {
        return Err(EngineError::Corrupt("short fragment".into()));
    }
    let body = &raw[..raw.len() - 4];
    let stored = u32_at(raw, raw.len() - 4)?;
    if crate::checksum::crc32c(body) != stored {
        return Err(EngineError::Corrupt("fragment checksum mismatch".into()));
    }
    Ok((u32_at(raw, 0)?, &body[4..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onode_round_trip() {
        let o = Onode { size_bytes: 5, mtime_ns: 9, write_count: 2, flags: 1, collection: 3, name: b"a/b".to_vec() };
        assert_eq!(Onode::decode(&o.encode()).unwrap(), o);
        assert!(Onode::decode(&[2, 0]).is_err());
        assert!(Onode::decode(&o.encode()[..10]).is_err());
    }

    #[test]
    fn frag_detects_flips() {
        let raw = encode_frag(100, b"hello");
        assert_eq!(decode_frag(&raw).unwrap(), (100, &b"hello"[..]));
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x10;
            assert!(decode_frag(&bad).is_err());
        }
    }

    #[test]
    fn block_runs_decode_what_they_encode_and_refuse_bad_lengths() {
        let per_block = BlockRun::per_block(300, (0..MAX_RUN_BLOCKS as u32).collect());
        assert_eq!(BlockRun::decode(&per_block.encode()).unwrap(), per_block);
        let one = BlockEntry { physical_block: 9, crc32c: 7 };
        let as_run = BlockRun::decode(&one.encode()).unwrap();
        assert_eq!(
            (as_run.physical_start, as_run.len_blocks, as_run.crcs[0]),
            (9, 1, 7),
            "a block entry is a run of one"
        );
        let units = BlockRun::from_block_crcs(50, &(0..18).collect::<Vec<u32>>());
        assert_eq!((units.unit_blocks, units.crcs.len()), (4, 5));
        assert_eq!(BlockRun::decode(&units.encode()).unwrap(), units);
        let mut past_limit = per_block.encode();
        past_limit.extend_from_slice(&[0; 4]);
        let mut wrong_units = units.encode();
        wrong_units.extend_from_slice(&[0; 4]);
        let zero_len = [&[0u8; 8][..], &[0, 0], &[0; 4]].concat();
        for bad in [&[0u8; 8][..], &[0u8; 13][..], &past_limit[..], &[0xff; 12][..], &wrong_units[..], &zero_len[..]] {
            assert!(BlockRun::decode(bad).is_err(), "{} bytes accepted", bad.len());
        }
    }

    #[test]
    fn unit_checksums_are_the_crc32c_of_their_blocks() {
        let data: Vec<u8> = (0..18 * 4096u32).map(|i| (i % 251) as u8).collect();
        let block_crcs: Vec<u32> = data.chunks(4096).map(crate::checksum::crc32c).collect();
        let run = BlockRun::from_block_crcs(0, &block_crcs);
        for u in run.units(0, 18) {
            let bytes = &data[(u.first * 4096) as usize..((u.first + u.blocks) * 4096) as usize];
            assert_eq!(crate::checksum::crc32c(bytes), u.crc32c, "unit at {}", u.first);
        }
        // Cuts off unit boundaries need the data; on them, slices keep their units.
        assert!(run.slice(1, 8).is_none());
        assert_eq!(run.slice(4, 18).unwrap().units(0, 14).next().unwrap().crc32c, run.unit_of(4).crc32c);
        // Joining per-block checksums extends the short last unit and starts new ones.
        let head = BlockRun::from_block_crcs(0, &block_crcs[..17]);
        let joined = head.joined(&block_crcs[17..], 17).unwrap();
        assert_eq!(joined, run);
        assert!(head.joined(&block_crcs[17..], 99).is_none(), "not physically contiguous");
    }

    #[test]
    fn keys_order_by_object_then_block() {
        assert!(block_key(1, u64::MAX) < block_key(2, 0));
        assert!(frag_key(1, 1, 9) < frag_key(1, 2, 0));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
