//! Every on-disk record decoder of the engine on arbitrary bytes: never a panic, and whatever decodes
//! encodes back to a record that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic_engine::fuzzing::{
    BlockEntry, BlockRun, Onode, Superblock, decode_frag, decode_name_entry, encode_frag, encode_name_entry,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = Onode::decode(data) {
        assert_eq!(Onode::decode(&o.encode()).ok(), Some(o));
    }
    if let Ok(b) = BlockEntry::decode(data) {
        assert_eq!(BlockEntry::decode(&b.encode()).ok(), Some(b));
    }
    if let Ok(r) = BlockRun::decode(data) {
        // A block-map run: its encoding is its input, a run of one block with its own checksum is a block
        // entry, and a cut on a checksum-unit boundary keeps the units it covers.
        assert_eq!(r.encode(), data);
        let one = r.len_blocks() == 1 && r.unit_blocks == 1;
        assert_eq!(BlockEntry::decode(data).is_ok(), one);
        let n = r.len_blocks();
        let cut = n / 2 / r.unit_blocks * r.unit_blocks;
        if cut > 0 {
            let tail = r.slice(cut, n).expect("a cut on a unit boundary");
            assert_eq!(BlockRun::decode(&tail.encode()).ok(), Some(tail.clone()));
            assert_eq!(tail.unit_of(0).crc32c, r.unit_of(cut).crc32c);
            assert_eq!(tail.physical_start, r.physical_start + cut);
        }
    }
    if let Ok(s) = Superblock::decode(data) {
        assert_eq!(Superblock::decode(&s.encode()).ok(), Some(s));
    }
    if let Ok((offset, payload)) = decode_frag(data) {
        let again = encode_frag(offset, payload);
        assert_eq!(decode_frag(&again).ok(), Some((offset, payload)));
    }
    if let Ok((nid, tag)) = decode_name_entry(data) {
        let again = encode_name_entry(nid, tag);
        assert_eq!(decode_name_entry(&again).ok(), Some((nid, tag)));
    }
});
