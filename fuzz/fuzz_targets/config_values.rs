//! Human sizes as the command line and the configuration file give them ("64MiB", "8 g", "4096"), on
//! arbitrary text: never a panic; a size that parses is the number times its unit, and its plain byte
//! count parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic::size_format::{format_size, parse_size};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(bytes) = parse_size(&text) {
        assert_eq!(parse_size(&bytes.to_string()), Ok(bytes));
        let digits: String = text.trim().chars().take_while(char::is_ascii_digit).collect();
        let number: u64 = digits.parse().expect("a parsed size starts with its number");
        assert!(number == 0 || bytes % number == 0 && (bytes / number).is_power_of_two(), "{text:?} -> {bytes}");
        assert!(!format_size(bytes).is_empty());
    }
});
