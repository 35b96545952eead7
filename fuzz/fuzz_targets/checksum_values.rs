//! The checksum values of a request, on arbitrary input: x-amz-checksum-* header values (and the algorithm
//! names of x-amz-checksum-algorithm / x-amz-trailer), Content-MD5, a body streamed through the verifier,
//! and the part checksums a multipart checksum is composed from. Never a panic; a body is accepted exactly
//! when every value it was sent with is well formed and matches it, and the stored checksum is the right one.
#![no_main]

use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use mosaic_layer::{CompletePart, LayerError, PartInfo};
use mosaic_s3::fuzzing::{Algo, Expectations, checksum_b64, composite_checksum, verified_body};

// Selector bits: the algorithm (low 3), send the correct value, send a Content-MD5, lie about the length.
const SEND_CORRECT: u8 = 8;
const SEND_MD5: u8 = 16;
const WRONG_LENGTH: u8 = 32;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut fields = rest.splitn(3, |b| *b == 0);
    let fuzzed_value = String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let fuzzed_md5 = String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let body = fields.next().unwrap_or_default().to_vec();

    if let Some(a) = Algo::parse(&fuzzed_value) {
        assert_eq!(Algo::parse(a.name()), Some(a));
        assert_eq!(Algo::parse(a.header()), Some(a));
    }

    let algo = Algo::ALL[usize::from(sel & 7) % Algo::ALL.len()];
    let correct = checksum_b64(algo, &body);
    let value = if sel & SEND_CORRECT != 0 { correct.clone() } else { fuzzed_value };
    let content_md5 = (sel & SEND_MD5 != 0).then_some(fuzzed_md5);
    let length_lies = sel & WRONG_LENGTH != 0;
    let exp = Expectations {
        content_md5: content_md5.clone(),
        headers: vec![(algo, value.clone())],
        content_length: Some(body.len() as u64 + u64::from(length_lies)),
        ..Default::default()
    };
    let well_formed = exp.validate().is_ok();

    let mid = body.len() / 2;
    let chunks = vec![Ok(bytes::Bytes::copy_from_slice(&body[..mid])), Ok(bytes::Bytes::copy_from_slice(&body[mid..]))];
    let outcome = verified_body(Box::pin(futures::stream::iter(chunks)), exp).and_then(|put| {
        let received: Vec<Result<bytes::Bytes, LayerError>> = futures::executor::block_on(put.stream.collect());
        for chunk in received {
            chunk?;
        }
        (put.finish.expect("a verified body has a finisher"))()
    });
    match outcome {
        Ok(stored) => {
            assert!(well_formed && !length_lies && value == correct, "accepted a body that does not match");
            assert!(stored.contains(&(algo.name().to_string(), correct)), "{stored:?}");
            if let Some(md5) = &content_md5 {
                use base64::Engine as _;
                use md5::Digest as _;
                let want = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body));
                assert_eq!(md5, &want, "accepted a Content-MD5 that does not match");
            }
        }
        Err(_) => assert!(
            !well_formed || length_lies || value != correct || content_md5.is_some(),
            "refused a body that matches every value it was sent with"
        ),
    }

    // The part checksums a multipart upload stored, composed in the order Complete names the parts.
    let parts: Vec<PartInfo> = body
        .chunks(7)
        .enumerate()
        .map(|(i, c)| PartInfo {
            part_number: i as u32 + 1,
            size_bytes: c.len() as u64,
            etag: String::new(),
            last_modified_unix_ms: 0,
            checksums: vec![(algo.name().to_string(), String::from_utf8_lossy(c).into_owned())],
        })
        .collect();
    let order: Vec<CompletePart> =
        parts.iter().rev().map(|p| CompletePart { part_number: p.part_number, etag: String::new() }).collect();
    let composed = composite_checksum(&parts, &order, false);
    if let Some((name, v)) = composed.first() {
        assert_eq!(name, algo.name());
        assert!(v.ends_with(&format!("-{}", order.len())), "{v}");
    }
    // FULL_OBJECT: CRCs combine (never a panic on damaged part values); others stay COMPOSITE.
    let whole = composite_checksum(&parts, &order, true);
    if let Some((name, _)) = whole.first() {
        assert_eq!(name, algo.name());
    }
});
