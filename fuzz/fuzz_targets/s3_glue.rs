//! The request parsing Mosaic owns beside s3s, on arbitrary input: listing continuation tokens, the Host
//! header of virtual-host requests, the bucket of a peeked request head, the bucket of x-amz-copy-source,
//! Range headers resolved against an object size, conditional ETag lists, bucket policies,
//! x-amz-grant-* headers and CORS origin patterns.
//! Never a panic; tokens round-trip; ranges stay inside the object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic_layer::{ObjectMeta, Precondition, RangeRequest};
use mosaic_s3::fuzzing::{
    DomainHost, Policy, acl_from_headers, bucket_of_head, copy_source, cors_wildcard_matches, decode_token, encode_token,
};
use s3s::host::S3Host;

fuzz_target!(|data: &[u8]| {
    let size = data.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) % (1 << 40));
    let text = String::from_utf8_lossy(data.get(8..).unwrap_or_default()).into_owned();

    if let Ok(key) = decode_token(&text) {
        assert_eq!(decode_token(&encode_token(&key)).ok(), Some(key));
    }
    // Tokens carry S3 keys, at most 1,024 bytes (longer ones are refused before any listing).
    if text.len() <= mosaic_layer::MAX_KEY_BYTES {
        assert_eq!(decode_token(&encode_token(&text)).ok(), Some(text.clone()));
    }

    if let Ok(host) = DomainHost::new("s3.example.com") {
        let _ = host.parse_host_header(&text);
        if let Some(bucket) = bucket_of_head(Some(&host), data) {
            assert!(!bucket.is_empty());
        }
    }
    if let Ok(policy) = Policy::parse(&text, "bkt") {
        let _ = policy.is_public();
    }
    let grants = [(Some(text.as_str()), mosaic_layer::Permission::Read); 1];
    let no = (None, mosaic_layer::Permission::Write);
    let _ = acl_from_headers([grants[0], no, no, no, no], &|id| id == "known");
    if let Some((pattern, origin)) = text.split_once('\n') {
        let _ = cors_wildcard_matches(pattern, origin);
    }
    if let Some((bucket, key, _version)) = copy_source(&text) {
        assert!(!bucket.is_empty() && !key.is_empty());
    }

    if let Ok(range) = s3s::dto::Range::parse(&text) {
        let req = match range {
            s3s::dto::Range::Int { first, last } => RangeRequest::FromTo { first, last },
            s3s::dto::Range::Suffix { length } => RangeRequest::Suffix { len: length },
        };
        if let Ok(r) = req.resolve(size) {
            assert!(r.start < r.end && r.end <= size, "{range:?} on {size} bytes -> {r:?}");
        }
    }

    let meta = ObjectMeta { etag: "0123456789abcdef".into(), size_bytes: size, ..Default::default() };
    for pre in [
        Precondition { if_match: Some(text.clone()), ..Default::default() },
        Precondition { if_none_match: Some(text.clone()), ..Default::default() },
        Precondition { if_match: Some(text.clone()), for_copy_source: true, ..Default::default() },
    ] {
        let _ = pre.check(&meta);
    }
});
