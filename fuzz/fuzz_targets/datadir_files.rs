//! The data directory's small files on arbitrary input: the marker, the root credentials, the access-keys
//! file, the SSE master keys, a cluster node's identity and the microstores. Never a panic; whatever parses re-encodes to a file that parses to the same value; a file whose
//! checksum line does not match its body is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic::datadir_format::{
    encode_cluster_node, encode_credentials, encode_keys, encode_master_keys, encode_microstores, parse_cluster_node, parse_credentials, parse_keys, parse_marker,
    parse_master_keys, parse_microstores, validate_credentials,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    let _ = parse_marker(&text);
    if let Ok(c) = parse_credentials(&text) {
        assert!(validate_credentials(&c).is_ok());
        assert_eq!(parse_credentials(&encode_credentials(&c)).as_ref(), Ok(&c));
    }
    if let Ok(keys) = parse_keys(&text) {
        let again = encode_keys(&keys).expect("a parsed key set encodes");
        assert_eq!(parse_keys(&again).as_ref(), Ok(&keys));
    }

    // The same bytes as the body of a correctly sealed file reach the field parsers behind the checksum.
    let body = text.replace("crc32c=", "");
    let sealed = format!("{body}crc32c={:08x}\n", mosaic_engine::crc32c(body.as_bytes()));
    let _ = parse_marker(&sealed);
    if let Ok(c) = parse_credentials(&sealed) {
        assert_eq!(parse_credentials(&encode_credentials(&c)).as_ref(), Ok(&c));
    }
    if let Ok(keys) = parse_keys(&sealed) {
        assert_eq!(parse_keys(&encode_keys(&keys).expect("encodes")).as_ref(), Ok(&keys));
    }
    for text in [&text[..], &sealed[..]] {
        if let Ok(m) = parse_master_keys(text) {
            assert_eq!(parse_master_keys(&encode_master_keys(&m)).as_ref(), Ok(&m));
        }
        if let Ok(c) = parse_microstores(text) {
            assert_eq!(parse_microstores(&encode_microstores(&c).expect("encodes")).as_ref(), Ok(&c));
        }
        if let Ok(n) = parse_cluster_node(text) {
            assert_eq!(parse_cluster_node(&encode_cluster_node(&n)).as_ref(), Ok(&n));
        }
    }
});
