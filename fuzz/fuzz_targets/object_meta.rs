//! The object metadata record (versioned JSON in the `s3.meta` attribute) and the listing tag of a name
//! entry on arbitrary bytes: never a panic, and whatever decodes re-encodes to a record that decodes to
//! the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic_layer::{ListTag, ObjectMeta};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ObjectMeta::decode(data) {
        assert_eq!(ObjectMeta::decode(&m.encode()).ok(), Some(m.clone()));
        assert_eq!(ListTag::decode(&ListTag::of(&m).encode()), Some(ListTag::of(&m)));
    }
    if let Some(t) = ListTag::decode(data) {
        assert_eq!(ListTag::decode(&t.encode()), Some(t));
    }
});
