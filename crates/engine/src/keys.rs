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

/// Keys of the default column family holding engine state.
pub const META_UUID: &[u8] = b"uuid";
pub const META_FORMAT: &[u8] = b"format_version";

pub type CollectionId = u32;
pub type Nid = u64;

pub fn name_key(coll: CollectionId, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + name.len());
    k.extend_from_slice(&coll.to_be_bytes());
    k.extend_from_slice(name);
    k
}

pub fn collection_prefix(coll: CollectionId) -> [u8; 4] {
    coll.to_be_bytes()
}

pub fn nid_key(nid: Nid) -> [u8; 8] {
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

/// A block-map entry in extent form: logical blocks from the entry key's block on, stored at consecutive
/// physical blocks from `physical_start`, with one crc32c per block. Encoded as the physical start
/// (8 bytes) and the checksums (4 bytes each), so a run of one block is exactly a `BlockEntry`: maps
/// written before runs existed read as runs of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRun {
    pub physical_start: u64,
    pub crcs: Vec<u32>,
}

impl BlockRun {
    pub fn len_blocks(&self) -> u64 {
        self.crcs.len() as u64
    }

    /// Block `i` of the run as a single entry.
    pub fn entry(&self, i: u64) -> BlockEntry {
        BlockEntry { physical_block: self.physical_start + i, crc32c: self.crcs[i as usize] }
    }

    /// Blocks [from, to) of the run.
    pub fn slice(&self, from: u64, to: u64) -> BlockRun {
        debug_assert!(from < to && to <= self.len_blocks());
        BlockRun { physical_start: self.physical_start + from, crcs: self.crcs[from as usize..to as usize].to_vec() }
    }

    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(!self.crcs.is_empty() && self.len_blocks() <= MAX_RUN_BLOCKS);
        let mut v = Vec::with_capacity(8 + 4 * self.crcs.len());
        v.extend_from_slice(&self.physical_start.to_be_bytes());
        for c in &self.crcs {
            v.extend_from_slice(&c.to_be_bytes());
        }
        v
    }

    pub fn decode(raw: &[u8]) -> Result<Self> {
        let n = raw.len().saturating_sub(8) / 4;
        if raw.len() < 12 || !(raw.len() - 8).is_multiple_of(4) || n as u64 > MAX_RUN_BLOCKS {
            return Err(EngineError::Corrupt(format!("block-map entry of {} bytes", raw.len())));
        }
        let physical_start = u64_at(raw, 0)?;
        if physical_start.checked_add(n as u64).is_none() {
            return Err(EngineError::Corrupt("block-map entry past the end of the address space".into()));
        }
        let crcs = raw[8..].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(BlockRun { physical_start, crcs })
    }
}

/// Every block of the runs, as (logical block, entry), clipped to [first, end).
pub fn run_blocks(runs: &[(u64, BlockRun)], first: u64, end: u64) -> impl Iterator<Item = (u64, BlockEntry)> + '_ {
    runs.iter().flat_map(move |(start, run)| {
        let from = first.max(*start);
        let to = end.min(start + run.len_blocks());
        (from..to).map(move |lb| (lb, run.entry(lb - start)))
    })
}

/// A fragment: bytes written inside one block without a read-modify-write. The value carries a crc32c of
/// its header and data so that a flipped bit in the KV store is detected.
pub fn encode_frag(offset_in_block: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&offset_in_block.to_be_bytes());
    v.extend_from_slice(data);
    let crc = crate::checksum::crc32c(&v);
    v.extend_from_slice(&crc.to_be_bytes());
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
        let run = BlockRun { physical_start: 300, crcs: (0..MAX_RUN_BLOCKS as u32).collect() };
        assert_eq!(BlockRun::decode(&run.encode()).unwrap(), run);
        let one = BlockEntry { physical_block: 9, crc32c: 7 };
        assert_eq!(BlockRun::decode(&one.encode()).unwrap().entry(0), one, "a block entry is a run of one");
        let mut past_limit = run.encode();
        past_limit.extend_from_slice(&[0; 4]);
        for bad in [&[0u8; 8][..], &[0u8; 13][..], &past_limit[..], &[0xff; 12][..]] {
            assert!(BlockRun::decode(bad).is_err(), "{} bytes accepted", bad.len());
        }
        let runs = vec![(10, run.slice(0, 4)), (20, run.slice(4, 6))];
        let got: Vec<u64> = run_blocks(&runs, 12, 21).map(|(lb, e)| lb * 1000 + e.physical_block).collect();
        assert_eq!(got, [12_302, 13_303, 20_304]);
    }

    #[test]
    fn keys_order_by_object_then_block() {
        assert!(block_key(1, u64::MAX) < block_key(2, 0));
        assert!(frag_key(1, 1, 9) < frag_key(1, 2, 0));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
