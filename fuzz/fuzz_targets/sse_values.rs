//! Encryption at rest on arbitrary input: SSE-C headers, sealed object keys and stored packages. Never a
//! panic; a customer key is accepted only with its right MD5; arbitrary bytes never open as a sealed key or
//! a package (a forgery would need the key), and what was sealed opens to itself.
#![no_main]

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use md5::{Digest, Md5};
use mosaic_crypt::{Key, PACKAGE_STORED_BYTES, StreamKey, open_key, seal_key};
use mosaic_layer::CustomerKey;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut fields = text.splitn(3, '\n');
    let (a, k, m) = (fields.next(), fields.next(), fields.next());
    if let Ok(Some(c)) = CustomerKey::from_headers(a, k, m) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let raw = b64.decode(k.unwrap_or_default().trim()).expect("an accepted key is base64");
        assert_eq!(raw.len(), 32);
        assert_eq!(c.md5_b64(), b64.encode(Md5::digest(&raw)));
    }

    let kek = Key::from_bytes([7; 32]);
    assert!(open_key(&kek, data).is_err(), "arbitrary bytes opened as a sealed key");
    if data.len() >= 32 {
        let obj = Key::from_bytes(data[..32].try_into().expect("32 bytes"));
        assert_eq!(open_key(&kek, &seal_key(&kek, &obj).expect("seals")).ok(), Some(obj));
    }

    let stream = StreamKey::new(&kek, &[1; 16]);
    let packages = (data.len().div_ceil(PACKAGE_STORED_BYTES) as u64).max(1);
    if !data.is_empty() {
        assert!(stream.open_packages(0, packages, &mut data.to_vec()).is_err(), "arbitrary bytes opened as packages");
    }
    let mut sealed = Vec::new();
    stream.seal_packages(0, data, true, &mut sealed);
    let n = mosaic_crypt::package_count(data.len() as u64);
    let plain = stream.open_packages(0, n, &mut sealed).expect("what was sealed opens");
    assert_eq!(&sealed[..plain], data);
});
