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
        // A block-map run: its encoding is its input, a run of one is a block entry, slices round-trip.
        assert_eq!(r.encode(), data);
        assert_eq!(BlockEntry::decode(data).is_ok(), r.len_blocks() == 1);
        let n = r.len_blocks();
        let tail = r.slice(n / 2, n);
        assert_eq!(BlockRun::decode(&tail.encode()).ok(), Some(tail.clone()));
        assert_eq!(tail.entry(0), r.entry(n / 2));
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
