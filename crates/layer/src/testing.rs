//! The semantics suite: every S3 behaviour this layer owns, checked through [`S3Semantics`] on a store,
//! without HTTP. Each store implementation runs it (`run_suite`) from its own tests, so that one drive, an
//! erasure set and a cluster are held to exactly the same semantics. Not an API: hidden from the docs.

use crate::*;
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use mosaic_store::Store;
use std::sync::Arc;

/// Runs every case, each on a fresh store from `new_store`.
pub async fn run_suite<S: Store>(mut new_store: impl FnMut() -> Arc<S>) {
    macro_rules! case {
        ($case:ident) => {{
            let layer = open(new_store(), SemanticsConfig::default()).await;
            $case(&layer).await;
            layer.shutdown().await.expect(concat!(stringify!($case), ": the store closes"));
        }};
    }
    case!(buckets);
    case!(put_get_round_trip);
    case!(ranges_and_part_numbers);
    case!(overwrite_is_atomic);
    case!(conditional_writes_and_reads);
    case!(delete);
    case!(multipart_assembly);
    case!(multipart_errors);
    case!(listing_with_delimiters_and_markers);
    case!(tags);
    case!(acls);
    case!(cors_and_policy);
    case!(append);
    case!(copy);
    case!(keys_and_limits);
    case!(versioning_basics);
    case!(versioning_against_a_model);
    case!(object_lock);
    case!(lifecycle);
    let plain = open(new_store(), SemanticsConfig::default()).await;
    orphan_bucket_collection(&plain).await;
    plain.shutdown().await.expect("the store closes");
    let cfg = SemanticsConfig { sse_keys: Some(test_sse_keys()), ..Default::default() };
    let encrypting = open(new_store(), cfg).await;
    encryption(&encrypting).await;
    encrypting.shutdown().await.expect("the store closes");
    let cfg = SemanticsConfig { sse_keys: Some(test_sse_keys()), min_part_bytes: 1, ..Default::default() };
    let tiny_parts = open(new_store(), cfg).await;
    uploads_of_many_parts(&tiny_parts, crate::parts::RECORD_PARTS_MAX as u32 + 20, false).await;
    tiny_parts.shutdown().await.expect("the store closes");
    let small = open(new_store(), SemanticsConfig { max_object_bytes: 100_000, ..Default::default() }).await;
    object_size_limit(&small).await;
    small.shutdown().await.expect("the store closes");
}

async fn open<S: Store>(store: Arc<S>, cfg: SemanticsConfig) -> S3Semantics<S> {
    S3Semantics::open(store, cfg).await.expect("the layer opens on a fresh store")
}

/// Deterministic bytes of a length, different per seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A body of `data` in chunks of `chunk` bytes (as an HTTP body arrives).
pub fn body(data: &[u8], chunk: usize) -> PutBody {
    let chunks: Vec<LayerResult<Bytes>> = data.chunks(chunk.max(1)).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    PutBody { stream: Box::pin(futures::stream::iter(chunks)), finish: None }
}

fn md5_hex(data: &[u8]) -> String {
    hex::encode(Md5::digest(data))
}

async fn put<L: ObjectLayer>(l: &L, bucket: &str, key: &str, data: &[u8]) -> ObjectMeta {
    l.put_object(bucket, key, body(data, 64 << 10), PutOptions::default()).await.expect("put")
}

async fn get_all<L: ObjectLayer>(l: &L, bucket: &str, key: &str) -> LayerResult<Vec<u8>> {
    let got = l.get_object(bucket, key, None, None, None, &Precondition::default()).await?;
    collect(got.body).await
}

async fn collect(mut body: ByteStream) -> LayerResult<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

async fn buckets<L: ObjectLayer>(l: &L) {
    assert_eq!(l.bucket_info("bk1").await, Err(LayerError::NoSuchBucket));
    l.create_bucket("bk1", None).await.unwrap();
    assert_eq!(l.create_bucket("bk1", None).await, Err(LayerError::BucketExists));
    assert!(matches!(l.create_bucket("Bad_Name", None).await, Err(LayerError::InvalidBucketName(_))));
    l.create_bucket("bk2", None).await.unwrap();
    let info = l.bucket_info("bk1").await.unwrap();
    assert!(info.created_unix_ms > 1_600_000_000_000, "a real creation time: {info:?}");
    let names: Vec<String> = l.list_buckets().await.unwrap().into_iter().map(|b| b.name).collect();
    assert_eq!(names, ["bk1", "bk2"]);
    put(l, "bk1", "k", b"x").await;
    assert_eq!(l.delete_bucket("bk1").await, Err(LayerError::BucketNotEmpty));
    // An abandoned upload does not keep a bucket alive.
    l.create_multipart("bk2", "k", PutOptions::default()).await.unwrap();
    l.delete_bucket("bk2").await.unwrap();
    assert_eq!(l.delete_bucket("bk2").await, Err(LayerError::NoSuchBucket));
    assert_eq!(
        l.put_object("bk2", "k", body(b"x", 1), PutOptions::default()).await.err(),
        Some(LayerError::NoSuchBucket)
    );
    l.delete_object("bk1", "k", None).await.unwrap();
    l.delete_bucket("bk1").await.unwrap();
    assert!(l.list_buckets().await.unwrap().is_empty());
}

async fn put_get_round_trip<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    // Empty, tiny, inline-sized, around unit boundaries, and several staging buffers' worth.
    for (i, len) in
        [0usize, 1, 100, 4095, 4096, 4097, 16 * 1024, 65_536 + 17, 3 * 4096 + 5, (9 << 20) + 5].iter().enumerate()
    {
        let data = pattern(i as u64, *len);
        let key = format!("obj-{len}");
        let mut opts = PutOptions { content_type: Some("x/y".into()), ..Default::default() };
        opts.user_metadata.insert("k".into(), "v".into());
        let meta = l.put_object("bkt", &key, body(&data, 7919), opts).await.unwrap();
        assert_eq!((meta.size_bytes, meta.etag.as_str()), (*len as u64, md5_hex(&data).as_str()), "{key}");
        assert_eq!(get_all(l, "bkt", &key).await.unwrap(), data, "{key}");
        let head = l.head_object("bkt", &key, None, &Precondition::default()).await.unwrap();
        assert_eq!((head.size_bytes, head.etag, head.content_type.as_deref()), (*len as u64, meta.etag, Some("x/y")));
        assert_eq!(head.user_metadata.get("k").map(String::as_str), Some("v"));
    }
    assert_eq!(get_all(l, "bkt", "missing").await, Err(LayerError::NoSuchKey));
    assert_eq!(l.head_object("nob", "k", None, &Precondition::default()).await.err(), Some(LayerError::NoSuchBucket));
}

async fn ranges_and_part_numbers<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let data = pattern(9, 3 << 20);
    put(l, "bkt", "k", &data).await;
    let read = |r: RangeRequest| async move {
        let got = l.get_object("bkt", "k", None, Some(r), None, &Precondition::default()).await?;
        let range = got.range.expect("a range");
        Ok::<_, LayerError>((range, collect(got.body).await?))
    };
    let (r, bytes) = read(RangeRequest::FromTo { first: 10, last: Some(19) }).await.unwrap();
    assert_eq!((r, bytes.as_slice()), (ByteRange { start: 10, end: 20 }, &data[10..20]));
    let (_, bytes) = read(RangeRequest::FromTo { first: 4090, last: Some(1 << 30) }).await.unwrap();
    assert_eq!(bytes, &data[4090..]);
    let (_, bytes) = read(RangeRequest::Suffix { len: 5000 }).await.unwrap();
    assert_eq!(bytes, &data[data.len() - 5000..]);
    assert_eq!(read(RangeRequest::FromTo { first: 3 << 20, last: None }).await.err(), Some(LayerError::InvalidRange));
    // A simple object is part 1 of 1.
    let got = l.get_object("bkt", "k", None, None, Some(1), &Precondition::default()).await.unwrap();
    assert_eq!(collect(got.body).await.unwrap(), data);
    assert_eq!(
        l.get_object("bkt", "k", None, None, Some(2), &Precondition::default()).await.err(),
        Some(LayerError::InvalidPartNumber)
    );
    let both =
        l.get_object("bkt", "k", None, Some(RangeRequest::Suffix { len: 1 }), Some(1), &Precondition::default()).await;
    assert!(matches!(both.err(), Some(LayerError::InvalidArgument(_))));
}

/// Readers see the old object or the new one, whole: a GET that began before an overwrite streams the old
/// version to its end, and later GETs see the new one.
async fn overwrite_is_atomic<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let (old, new) = (pattern(1, 6 << 20), pattern(2, (5 << 20) + 3));
    put(l, "bkt", "k", &old).await;
    let during = l.get_object("bkt", "k", None, None, None, &Precondition::default()).await.unwrap();
    put(l, "bkt", "k", &new).await;
    put(l, "bkt", "small", b"before").await;
    assert_eq!(collect(during.body).await.unwrap(), old, "the earlier GET streams the old version whole");
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), new);
    // An overwrite that fails (its body breaks off) leaves the old object as it was.
    let broken = PutBody {
        stream: Box::pin(futures::stream::iter(vec![
            Ok(Bytes::from(vec![7u8; 5 << 20])),
            Err(LayerError::IncompleteBody("the client went away".into())),
        ])),
        finish: None,
    };
    assert!(l.put_object("bkt", "k", broken, PutOptions::default()).await.is_err());
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), new);
    // So does one whose finisher refuses the body (a checksum that does not match).
    let refused = PutBody {
        stream: Box::pin(futures::stream::iter(vec![Ok(Bytes::from_static(b"after"))])),
        finish: Some(Box::new(|| Err(LayerError::BadDigest("x-amz-checksum-crc32".into())))),
    };
    assert!(matches!(
        l.put_object("bkt", "small", refused, PutOptions::default()).await,
        Err(LayerError::BadDigest(_))
    ));
    assert_eq!(get_all(l, "bkt", "small").await.unwrap(), b"before");
}

async fn conditional_writes_and_reads<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let only_new = PutOptions { if_none_match_any: true, ..Default::default() };
    let m = l.put_object("bkt", "k", body(b"one", 3), only_new.clone()).await.unwrap();
    assert_eq!(l.put_object("bkt", "k", body(b"two", 3), only_new).await.err(), Some(LayerError::PreconditionFailed));
    let wrong = PutOptions { if_match: Some("\"0123\"".into()), ..Default::default() };
    assert_eq!(l.put_object("bkt", "k", body(b"two", 3), wrong).await.err(), Some(LayerError::PreconditionFailed));
    let right = PutOptions { if_match: Some(format!("\"{}\"", m.etag)), ..Default::default() };
    let m2 = l.put_object("bkt", "k", body(b"two", 3), right).await.unwrap();
    let any = PutOptions { if_match: Some("*".into()), ..Default::default() };
    l.put_object("bkt", "k", body(b"three", 5), any.clone()).await.unwrap();
    // If-Match on a missing key: NoSuchKey, with * or an ETag (S3's answer; s3-tests test_put_object_if_match).
    assert_eq!(l.put_object("bkt", "missing", body(b"x", 1), any).await.err(), Some(LayerError::NoSuchKey));
    let some = PutOptions { if_match: Some("\"0123\"".into()), ..Default::default() };
    assert_eq!(l.put_object("bkt", "missing", body(b"x", 1), some).await.err(), Some(LayerError::NoSuchKey));
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"three");
    // If-None-Match with an ETag: refused only when the object has that ETag; a missing key is written.
    let three = l.head_object("bkt", "k", None, &Precondition::default()).await.unwrap().etag;
    let not = |etag: &str| PutOptions { if_none_match: Some(etag.to_string()), ..Default::default() };
    let refused = l.put_object("bkt", "k", body(b"four", 4), not(&format!("\"{three}\""))).await.err();
    assert_eq!(refused, Some(LayerError::PreconditionFailed));
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"three");
    l.put_object("bkt", "k", body(b"four", 4), not("\"0123\"")).await.unwrap();
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"four");
    l.put_object("bkt", "new", body(b"n", 1), not(&three)).await.unwrap();
    assert_eq!(get_all(l, "bkt", "new").await.unwrap(), b"n");
    assert!(l.head_object("bkt", "missing", None, &Precondition::default()).await.is_err());
    // Reads: If-None-Match of the current ETag is NotModified; If-Match of an old one fails.
    let cur = l.head_object("bkt", "k", None, &Precondition::default()).await.unwrap();
    let pre = Precondition { if_none_match: Some(format!("\"{}\"", cur.etag)), ..Default::default() };
    assert_eq!(l.get_object("bkt", "k", None, None, None, &pre).await.err(), Some(LayerError::NotModified));
    let pre = Precondition { if_match: Some(m2.etag), ..Default::default() };
    assert_eq!(l.head_object("bkt", "k", None, &pre).await.err(), Some(LayerError::PreconditionFailed));
}

async fn delete<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    l.delete_object("bkt", "never", None).await.unwrap();
    put(l, "bkt", "k", &pattern(3, 100_000)).await;
    l.delete_object("bkt", "k", None).await.unwrap();
    assert_eq!(get_all(l, "bkt", "k").await, Err(LayerError::NoSuchKey));
    assert_eq!(l.delete_object("nob", "k", None).await, Err(LayerError::NoSuchBucket));
    let page = l.list_objects("bkt", &ListQuery { max_keys: 10, ..Default::default() }).await.unwrap();
    assert!(page.objects.is_empty());
}

async fn multipart_assembly<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let opts = PutOptions { content_type: Some("a/b".into()), ..Default::default() };
    let id = l.create_multipart("bkt", "big", opts).await.unwrap();
    // Aligned parts are cloned; a part of odd size makes every later boundary unaligned (copied).
    let parts_data = [pattern(1, 5 << 20), pattern(2, (5 << 20) + 1), pattern(3, 5 << 20), pattern(4, 12_345)];
    let mut completes = Vec::new();
    for (i, d) in parts_data.iter().enumerate().rev() {
        let p = l.upload_part("bkt", "big", &id, i as u32 + 1, body(d, 1 << 20)).await.unwrap();
        assert_eq!((p.size_bytes, p.etag.as_str()), (d.len() as u64, md5_hex(d).as_str()));
        completes.push(CompletePart { part_number: p.part_number, etag: format!("\"{}\"", p.etag) });
    }
    completes.reverse();
    let listed = l.list_parts("bkt", "big", &id).await.unwrap();
    assert_eq!(listed.iter().map(|p| p.part_number).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let uploads = l.list_uploads("bkt", "bi").await.unwrap();
    assert_eq!((uploads.len(), uploads[0].upload_id.as_str(), uploads[0].key.as_str()), (1, id.as_str(), "big"));
    assert!(l.list_uploads("bkt", "x").await.unwrap().is_empty());
    let pre = Precondition::default();
    let meta = l.complete_multipart("bkt", "big", &id, completes.clone(), &pre, Vec::new()).await.unwrap();
    let first_id = id.clone();
    // A repeated completion (an SDK retrying after a timeout) is answered again; other parts are not.
    let again = l.complete_multipart("bkt", "big", &id, completes.clone(), &pre, Vec::new()).await.unwrap();
    assert_eq!((again.etag.as_str(), again.size_bytes), (meta.etag.as_str(), meta.size_bytes));
    let fewer = completes[..3].to_vec();
    let e = l.complete_multipart("bkt", "big", &id, fewer, &pre, Vec::new()).await.err();
    assert_eq!(e, Some(LayerError::NoSuchUpload));
    let e = l.complete_multipart("bkt", "other", &id, completes.clone(), &pre, Vec::new()).await.err();
    assert_eq!(e, Some(LayerError::NoSuchUpload));
    let whole: Vec<u8> = parts_data.concat();
    let md5s: Vec<u8> = parts_data.iter().flat_map(|d| Md5::digest(d).to_vec()).collect();
    assert_eq!(meta.etag, format!("{}-4", md5_hex(&md5s)));
    assert_eq!(get_all(l, "bkt", "big").await.unwrap(), whole);
    let head = l.head_object("bkt", "big", None, &Precondition::default()).await.unwrap();
    assert_eq!(
        (head.etag, head.content_type.as_deref(), head.size_bytes),
        (meta.etag, Some("a/b"), whole.len() as u64)
    );
    // Part numbers read back exactly their parts.
    let mut start = 0;
    for (i, d) in parts_data.iter().enumerate() {
        let got = l.get_object("bkt", "big", None, None, Some(i as u32 + 1), &Precondition::default()).await.unwrap();
        assert_eq!(got.range, Some(ByteRange { start, end: start + d.len() as u64 }));
        assert_eq!(&collect(got.body).await.unwrap(), d);
        start += d.len() as u64;
    }
    assert!(l.list_uploads("bkt", "").await.unwrap().is_empty(), "the upload is gone");
    assert_eq!(l.list_parts("bkt", "big", &id).await.err(), Some(LayerError::NoSuchUpload));
    // UploadPartCopy: a range of an object becomes a part.
    let id = l.create_multipart("bkt", "copied", PutOptions::default()).await.unwrap();
    let range = Some(RangeRequest::FromTo { first: 100, last: Some(100 + (5 << 20) - 1) });
    let p1 =
        l.upload_part_copy("bkt", "copied", &id, 1, "bkt", "big", None, range, &Precondition::default()).await.unwrap();
    let p2 = l.upload_part("bkt", "copied", &id, 2, body(b"tail", 4)).await.unwrap();
    // A copy range past the source's end is refused (a GET's range would be cut instead).
    let past = Some(RangeRequest::FromTo { first: 0, last: Some(whole.len() as u64) });
    let refused = l.upload_part_copy("bkt", "copied", &id, 3, "bkt", "big", None, past, &Precondition::default()).await;
    assert_eq!(refused.err(), Some(LayerError::InvalidRange));
    let parts = vec![CompletePart { part_number: 1, etag: p1.etag }, CompletePart { part_number: 2, etag: p2.etag }];
    l.complete_multipart("bkt", "copied", &id, parts, &Precondition::default(), Vec::new()).await.unwrap();
    let mut expected = whole[100..100 + (5 << 20)].to_vec();
    expected.extend_from_slice(b"tail");
    assert_eq!(get_all(l, "bkt", "copied").await.unwrap(), expected);
    // Once the key holds another object, the first upload is unknown again.
    put(l, "bkt", "big", b"other").await;
    let e = l.complete_multipart("bkt", "big", &first_id, completes, &pre, Vec::new()).await.err();
    assert_eq!(e, Some(LayerError::NoSuchUpload));
}

async fn multipart_errors<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    assert_eq!(l.upload_part("bkt", "k", "nope", 1, body(b"x", 1)).await.err(), Some(LayerError::NoSuchUpload));
    let id = l.create_multipart("bkt", "k", PutOptions::default()).await.unwrap();
    assert_eq!(l.upload_part("bkt", "other", &id, 1, body(b"x", 1)).await.err(), Some(LayerError::NoSuchUpload));
    for bad in [0, MAX_PARTS + 1] {
        assert!(matches!(
            l.upload_part("bkt", "k", &id, bad, body(b"x", 1)).await,
            Err(LayerError::InvalidArgument(_))
        ));
    }
    let small = l.upload_part("bkt", "k", &id, 1, body(b"small", 5)).await.unwrap();
    let last = l.upload_part("bkt", "k", &id, 2, body(b"last", 4)).await.unwrap();
    let part = |n: u32, e: &str| CompletePart { part_number: n, etag: e.to_string() };
    let none = Precondition::default();
    let complete = |parts: Vec<CompletePart>| l.complete_multipart("bkt", "k", &id, parts, &none, Vec::new());
    assert_eq!(complete(vec![]).await.err().map(|e| matches!(e, LayerError::InvalidArgument(_))), Some(true));
    assert_eq!(
        complete(vec![part(2, &last.etag), part(1, &small.etag)]).await.err(),
        Some(LayerError::InvalidPartOrder)
    );
    assert!(matches!(complete(vec![part(1, "0011")]).await, Err(LayerError::InvalidPart(_))));
    assert!(matches!(complete(vec![part(3, &last.etag)]).await, Err(LayerError::InvalidPart(_))));
    assert_eq!(complete(vec![part(1, &small.etag), part(2, &last.etag)]).await.err(), Some(LayerError::EntityTooSmall));
    // The upload survived every refused completion; an abort ends it.
    assert_eq!(l.list_parts("bkt", "k", &id).await.unwrap().len(), 2);
    l.abort_multipart("bkt", "k", &id).await.unwrap();
    assert_eq!(l.abort_multipart("bkt", "k", &id).await, Err(LayerError::NoSuchUpload));
    assert_eq!(complete(vec![part(1, &small.etag)]).await.err(), Some(LayerError::NoSuchUpload));
    assert_eq!(get_all(l, "bkt", "k").await, Err(LayerError::NoSuchKey));
}

async fn listing_with_delimiters_and_markers<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let keys = ["a", "a/1", "a/2", "a/b/1", "a/b/2", "b/1", "c", "c/", "c/x", "d!", "e/f/g"];
    for (i, k) in keys.iter().enumerate() {
        put(l, "bkt", k, &pattern(i as u64, i * 10)).await;
    }
    let q = |prefix: &str, delimiter: Option<&str>, start_after: &str, max_keys: usize| ListQuery {
        prefix: prefix.into(),
        delimiter: delimiter.map(str::to_string),
        start_after: start_after.into(),
        max_keys,
    };
    let list = |q: ListQuery| async move { l.list_objects("bkt", &q).await.unwrap() };
    let names = |p: &ListPage| p.objects.iter().map(|o| o.key.clone()).collect::<Vec<_>>();
    let all = list(q("", None, "", 1000)).await;
    assert_eq!(names(&all), keys);
    assert_eq!(all.next_marker, None);
    assert!(all.objects.iter().enumerate().all(|(i, o)| o.size_bytes == i as u64 * 10 && !o.etag.is_empty()));
    let top = list(q("", Some("/"), "", 1000)).await;
    assert_eq!(
        (names(&top), top.common_prefixes.clone()),
        (vec!["a".into(), "c".into(), "d!".into()], vec!["a/".to_string(), "b/".into(), "c/".into(), "e/".into()])
    );
    let under_a = list(q("a/", Some("/"), "", 1000)).await;
    assert_eq!(
        (names(&under_a), under_a.common_prefixes.clone()),
        (vec!["a/1".into(), "a/2".into()], vec!["a/b/".to_string()])
    );
    // Paging two at a time through keys and prefixes visits each exactly once, in order.
    let mut seen = Vec::new();
    let mut marker = String::new();
    for _ in 0..10 {
        let page = list(q("", Some("/"), &marker, 2)).await;
        assert!(page.objects.len() + page.common_prefixes.len() <= 2);
        let mut items: Vec<String> = names(&page);
        items.extend(page.common_prefixes.clone());
        items.sort();
        seen.extend(items);
        match page.next_marker {
            Some(m) => marker = m,
            None => break,
        }
    }
    assert_eq!(seen, ["a", "a/", "b/", "c", "c/", "d!", "e/"]);
    // A marker inside a prefix that was returned skips the rest of it.
    assert_eq!(names(&list(q("", Some("/"), "a/1", 1000)).await), ["c", "d!"]);
    assert!(list(q("", None, "", 0)).await.objects.is_empty());
    assert_eq!(names(&list(q("c", None, "c", 1000)).await), ["c/", "c/x"]);
    assert_eq!(l.list_objects("nob", &q("", None, "", 10)).await.err(), Some(LayerError::NoSuchBucket));
}

async fn tags<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    put(l, "bkt", "k", b"x").await;
    assert!(l.get_tags("bkt", "k", None).await.unwrap().is_empty());
    let t = vec![("a".to_string(), "1".to_string()), ("b".into(), "".into())];
    l.put_tags("bkt", "k", None, t.clone()).await.unwrap();
    assert_eq!(l.get_tags("bkt", "k", None).await.unwrap(), t);
    let too_many: Vec<(String, String)> = (0..=MAX_TAGS).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(matches!(l.put_tags("bkt", "k", None, too_many).await, Err(LayerError::InvalidTag(_))));
    assert!(matches!(
        l.put_tags("bkt", "k", None, vec![("".into(), "v".into())]).await,
        Err(LayerError::InvalidTag(_))
    ));
    // A copy carries the source's tags unless the request replaces them (x-amz-tagging-directive); an
    // overwrite drops them; removing them leaves none.
    l.copy_object("bkt", "k", None, &Precondition::default(), "bkt", "c", None).await.unwrap();
    assert_eq!(l.get_tags("bkt", "c", None).await.unwrap(), t);
    let copy = |dst: &'static str, tags: CopyTags| async move {
        let (src, pre) = (("bkt", "k", None), Precondition::default());
        l.copy_object_with(src, &pre, ("bkt", dst), None, tags, ObjectAccess::default(), CopyKeys::default()).await
    };
    let other = vec![("z".to_string(), "9".to_string())];
    copy("c", CopyTags::Replace(other.clone())).await.unwrap();
    assert_eq!(l.get_tags("bkt", "c", None).await.unwrap(), other);
    assert_eq!(l.head_object("bkt", "c", None, &Precondition::default()).await.unwrap().tag_count, 1);
    copy("c", CopyTags::Replace(Vec::new())).await.unwrap();
    assert!(l.get_tags("bkt", "c", None).await.unwrap().is_empty());
    assert_eq!(l.head_object("bkt", "c", None, &Precondition::default()).await.unwrap().tag_count, 0);
    // Onto itself with its metadata replaced: its tags stay unless replaced.
    let replace = Some(PutOptions { content_type: Some("text/x".into()), ..Default::default() });
    l.copy_object("bkt", "k", None, &Precondition::default(), "bkt", "k", replace).await.unwrap();
    assert_eq!(l.get_tags("bkt", "k", None).await.unwrap(), t);
    let eleven: Vec<(String, String)> = (0..=MAX_TAGS).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(matches!(copy("c", CopyTags::Replace(eleven)).await, Err(LayerError::InvalidTag(_))));
    let dup = vec![("a".to_string(), "1".to_string()), ("a".into(), "2".into())];
    assert!(matches!(copy("c", CopyTags::Replace(dup)).await, Err(LayerError::InvalidTag(_))));
    l.put_tags("bkt", "k", None, Vec::new()).await.unwrap();
    assert!(l.get_tags("bkt", "k", None).await.unwrap().is_empty());
    l.put_tags("bkt", "k", None, t).await.unwrap();
    put(l, "bkt", "k", b"y").await;
    assert!(l.get_tags("bkt", "k", None).await.unwrap().is_empty());
    assert_eq!(l.put_tags("bkt", "missing", None, Vec::new()).await, Err(LayerError::NoSuchKey));
    // Tags given with the write (x-amz-tagging) come with the object; the count follows every change.
    let with_tags = PutOptions { tags: vec![("a".into(), "1".into()), ("b".into(), "2".into())], ..Default::default() };
    l.put_object("bkt", "t", body(b"x", 1), with_tags.clone()).await.unwrap();
    assert_eq!(l.get_tags("bkt", "t", None).await.unwrap(), with_tags.tags);
    let count = |key: &'static str| async move {
        l.head_object("bkt", key, None, &Precondition::default()).await.unwrap().tag_count
    };
    assert_eq!(count("t").await, 2);
    l.put_tags("bkt", "t", None, vec![("c".into(), "3".into())]).await.unwrap();
    assert_eq!(count("t").await, 1);
    l.copy_object("bkt", "t", None, &Precondition::default(), "bkt", "t2", None).await.unwrap();
    assert_eq!(count("t2").await, 1);
    let id = l.create_multipart("bkt", "mt", with_tags.clone()).await.unwrap();
    let p = l.upload_part("bkt", "mt", &id, 1, body(b"part", 4)).await.unwrap();
    let done = vec![CompletePart { part_number: 1, etag: p.etag }];
    l.complete_multipart("bkt", "mt", &id, done, &Precondition::default(), Vec::new()).await.unwrap();
    assert_eq!(l.get_tags("bkt", "mt", None).await.unwrap(), with_tags.tags);
    assert_eq!(count("mt").await, 2);
    let dup = PutOptions { tags: vec![("a".into(), "1".into()), ("a".into(), "2".into())], ..Default::default() };
    assert!(matches!(l.put_object("bkt", "d", body(b"x", 1), dup).await, Err(LayerError::InvalidTag(_))));
}

fn grant(grantee: Grantee, permission: Permission) -> AclGrant {
    AclGrant { grantee, permission }
}

async fn acls<L: ObjectLayer>(l: &L) {
    let public =
        vec![grant(Grantee::User("me".into()), Permission::FullControl), grant(Grantee::AllUsers, Permission::Read)];
    let opts = BucketOptions { acl: Some(public.clone()), ..Default::default() };
    l.create_bucket("bkt", Some(&opts)).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().acl, Some(public.clone()));
    l.put_bucket_acl("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().acl, None);
    let too_many: Vec<_> =
        (0..=MAX_ACL_GRANTS).map(|i| grant(Grantee::User(format!("u{i}")), Permission::Read)).collect();
    assert!(matches!(l.put_bucket_acl("bkt", Some(too_many.clone())).await, Err(LayerError::InvalidArgument(_))));
    assert_eq!(l.put_bucket_acl("nobkt", None).await, Err(LayerError::NoSuchBucket));

    // An object keeps the owner and ACL it was written with; an ACL change keeps the owner and the data.
    let theirs = ObjectAccess { owner_id: Some("you".into()), acl: Some(public.clone()) };
    let with = PutOptions { access: theirs.clone(), ..Default::default() };
    l.put_object("bkt", "k", body(b"data", 2), with.clone()).await.unwrap();
    let head = |key: &'static str, v: Option<String>| async move {
        l.head_object("bkt", key, v.as_deref(), &Precondition::default()).await.unwrap()
    };
    assert_eq!(head("k", None).await.access, theirs);
    let readers = vec![grant(Grantee::AuthenticatedUsers, Permission::Read)];
    l.put_object_acl("bkt", "k", None, Some(readers.clone())).await.unwrap();
    let after = head("k", None).await;
    assert_eq!(after.access, ObjectAccess { owner_id: Some("you".into()), acl: Some(readers.clone()) });
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"data");
    assert!(matches!(l.put_object_acl("bkt", "k", None, Some(too_many)).await, Err(LayerError::InvalidArgument(_))));
    assert_eq!(l.put_object_acl("bkt", "nokey", None, None).await, Err(LayerError::NoSuchKey));
    // An overwrite takes the new write's access, not the old version's.
    put(l, "bkt", "k", b"new").await;
    assert!(head("k", None).await.access.is_default());

    // A copy never takes the source's access: the request's, or the default.
    l.put_object("bkt", "src", body(b"s", 1), with.clone()).await.unwrap();
    l.copy_object("bkt", "src", None, &Precondition::default(), "bkt", "c1", None).await.unwrap();
    assert!(head("c1", None).await.access.is_default());
    let mine = ObjectAccess { owner_id: None, acl: Some(readers.clone()) };
    let pre = Precondition::default();
    let (src, keys) = (("bkt", "src", None), CopyKeys::default());
    l.copy_object_with(src, &pre, ("bkt", "c2"), None, CopyTags::Source, mine.clone(), keys).await.unwrap();
    assert_eq!(head("c2", None).await.access, mine);

    // A multipart upload's access comes with the object it completes.
    let id = l.create_multipart("bkt", "mp", with.clone()).await.unwrap();
    let p = l.upload_part("bkt", "mp", &id, 1, body(b"part", 4)).await.unwrap();
    let done = vec![CompletePart { part_number: 1, etag: p.etag }];
    l.complete_multipart("bkt", "mp", &id, done, &Precondition::default(), Vec::new()).await.unwrap();
    assert_eq!(head("mp", None).await.access, theirs);

    // In a versioned bucket an ACL change touches the version named, no other.
    l.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    let v1 = put(l, "bkt", "v", b"1").await.version_id;
    let v2 = put(l, "bkt", "v", b"2").await.version_id;
    l.put_object_acl("bkt", "v", v1.as_deref(), Some(public.clone())).await.unwrap();
    assert_eq!(head("v", v1.clone()).await.access.acl, Some(public));
    assert_eq!(head("v", v2).await.access.acl, None);
    assert_eq!(get_version(l, "bkt", "v", v1.as_deref().unwrap()).await.unwrap(), b"1");
}

async fn cors_and_policy<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().cors, None);
    let rules = vec![CorsRule {
        id: Some("web".into()),
        allowed_origins: vec!["https://*.example.com".into()],
        allowed_methods: vec!["GET".into(), "PUT".into()],
        allowed_headers: vec!["*".into()],
        expose_headers: vec!["ETag".into()],
        max_age_s: Some(600),
    }];
    l.put_bucket_cors("bkt", Some(rules.clone())).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().cors, Some(rules.clone()));
    let mut bad = rules.clone();
    bad[0].allowed_methods.push("PATCH".into());
    assert!(matches!(l.put_bucket_cors("bkt", Some(bad)).await, Err(LayerError::InvalidArgument(_))));
    assert_eq!(l.bucket_info("bkt").await.unwrap().cors, Some(rules), "a refused change leaves the rules");
    l.put_bucket_cors("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().cors, None);
    // The policy document is kept as put, within its size limit.
    let doc = format!("{{\"Id\":\"{}\"}}", "x".repeat(MAX_BUCKET_POLICY_BYTES - 9));
    assert_eq!(doc.len(), MAX_BUCKET_POLICY_BYTES);
    l.put_bucket_policy("bkt", Some(doc.clone())).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().policy, Some(doc.clone()));
    let past = format!("{doc} ");
    assert!(matches!(l.put_bucket_policy("bkt", Some(past)).await, Err(LayerError::InvalidArgument(_))));
    l.put_bucket_policy("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().policy, None);
    let block = PublicAccessBlock { block_public_acls: true, restrict_public_buckets: true, ..Default::default() };
    l.put_public_access_block("bkt", Some(block)).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().public_access_block, Some(block));
    l.put_public_access_block("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().public_access_block, None);
    let enforced = Some(ObjectOwnership::BucketOwnerEnforced);
    l.put_object_ownership("bkt", enforced).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().object_ownership, enforced);
    let opts = BucketOptions { object_ownership: Some(ObjectOwnership::ObjectWriter), ..Default::default() };
    l.create_bucket("owned", Some(&opts)).await.unwrap();
    assert_eq!(l.bucket_info("owned").await.unwrap().object_ownership, Some(ObjectOwnership::ObjectWriter));
    assert_eq!(l.put_bucket_cors("nobkt", None).await, Err(LayerError::NoSuchBucket));
}

async fn append<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let at = |offset: u64| PutOptions { write_offset: Some(offset), ..Default::default() };
    assert_eq!(l.put_object("bkt", "log", body(b"x", 1), at(5)).await.err(), Some(LayerError::NoSuchKey));
    let mut expected = Vec::new();
    let mut etag = String::new();
    for i in 0..40u64 {
        let rec = pattern(i, 2048 + i as usize);
        let m = l.put_object("bkt", "log", body(&rec, 1000), at(expected.len() as u64)).await.unwrap();
        etag = if etag.is_empty() {
            md5_hex(&rec)
        } else {
            let mut h = Md5::new();
            h.update(etag.as_bytes());
            h.update(Md5::digest(&rec));
            hex::encode(h.finalize())
        };
        expected.extend_from_slice(&rec);
        assert_eq!((m.size_bytes, m.etag.as_str()), (expected.len() as u64, etag.as_str()), "append {i}");
    }
    assert_eq!(get_all(l, "bkt", "log").await.unwrap(), expected);
    assert_eq!(l.put_object("bkt", "log", body(b"x", 1), at(3)).await.err(), Some(LayerError::InvalidWriteOffset));
    let listed = l.list_objects("bkt", &ListQuery { max_keys: 10, ..Default::default() }).await.unwrap();
    assert_eq!((listed.objects[0].size_bytes, listed.objects[0].etag.as_str()), (expected.len() as u64, etag.as_str()));
}

async fn copy<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    l.create_bucket("ckt", None).await.unwrap();
    let data = pattern(5, (4 << 20) + 77);
    let mut opts = PutOptions::default();
    opts.user_metadata.insert("m".into(), "1".into());
    let src = l.put_object("bkt", "src", body(&data, 1 << 20), opts).await.unwrap();
    let copied = l.copy_object("bkt", "src", None, &Precondition::default(), "ckt", "dst", None).await.unwrap();
    assert_eq!(copied.etag, src.etag);
    assert_eq!(get_all(l, "ckt", "dst").await.unwrap(), data);
    assert_eq!(
        l.head_object("ckt", "dst", None, &Precondition::default())
            .await
            .unwrap()
            .user_metadata
            .get("m")
            .map(String::as_str),
        Some("1")
    );
    let replace = PutOptions { content_type: Some("t/u".into()), ..Default::default() };
    let m = l.copy_object("bkt", "src", None, &Precondition::default(), "ckt", "dst2", Some(replace)).await.unwrap();
    assert!(m.user_metadata.is_empty() && m.content_type.as_deref() == Some("t/u"));
    // The copy is independent of its source.
    put(l, "bkt", "src", b"changed").await;
    assert_eq!(get_all(l, "ckt", "dst").await.unwrap(), data);
    assert!(matches!(
        l.copy_object("bkt", "src", None, &Precondition::default(), "bkt", "src", None).await,
        Err(LayerError::InvalidRequest(_))
    ));
    let self_replace = PutOptions { content_type: Some("new/type".into()), ..Default::default() };
    l.copy_object("bkt", "src", None, &Precondition::default(), "bkt", "src", Some(self_replace)).await.unwrap();
    assert_eq!(get_all(l, "bkt", "src").await.unwrap(), b"changed");
    let pre = Precondition { if_match: Some("\"nope\"".into()), for_copy_source: true, ..Default::default() };
    assert_eq!(
        l.copy_object("bkt", "src", None, &pre, "ckt", "x", None).await.err(),
        Some(LayerError::PreconditionFailed)
    );
    assert_eq!(
        l.copy_object("bkt", "missing", None, &Precondition::default(), "ckt", "x", None).await.err(),
        Some(LayerError::NoSuchKey)
    );
    assert_eq!(
        l.copy_object("bkt", "src", None, &Precondition::default(), "nob", "x", None).await.err(),
        Some(LayerError::NoSuchBucket)
    );
}

async fn keys_and_limits<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    let longest = "k".repeat(MAX_KEY_BYTES);
    put(l, "bkt", &longest, b"at the limit").await;
    assert_eq!(get_all(l, "bkt", &longest).await.unwrap(), b"at the limit");
    let too_long = "k".repeat(MAX_KEY_BYTES + 1);
    assert_eq!(
        l.put_object("bkt", &too_long, body(b"x", 1), PutOptions::default()).await.err(),
        Some(LayerError::KeyTooLong)
    );
    assert!(matches!(
        l.put_object("bkt", "", body(b"x", 1), PutOptions::default()).await,
        Err(LayerError::InvalidKey(_))
    ));
    let mut big = PutOptions::default();
    big.user_metadata.insert("k".into(), "v".repeat(MAX_USER_METADATA_BYTES));
    assert_eq!(l.put_object("bkt", "m", body(b"x", 1), big).await.err(), Some(LayerError::MetadataTooLarge));
    // Keys are bytes in order, unicode included.
    for k in ["ü/ñ", "z", "\u{7f}"] {
        put(l, "bkt", k, k.as_bytes()).await;
        assert_eq!(get_all(l, "bkt", k).await.unwrap(), k.as_bytes());
    }
}

async fn object_size_limit<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    put(l, "bkt", "at", &pattern(1, 100_000)).await;
    let past = l.put_object("bkt", "past", body(&pattern(1, 100_001), 4096), PutOptions::default()).await;
    assert_eq!(past.err(), Some(LayerError::EntityTooLarge));
    assert_eq!(get_all(l, "bkt", "past").await, Err(LayerError::NoSuchKey));
}

async fn get_version<L: ObjectLayer>(l: &L, bucket: &str, key: &str, v: &str) -> LayerResult<Vec<u8>> {
    let got = l.get_object(bucket, key, Some(v), None, None, &Precondition::default()).await?;
    collect(got.body).await
}

async fn all_versions<L: ObjectLayer>(l: &L, bucket: &str, page_keys: usize) -> Vec<ListedVersion> {
    let mut q = VersionQuery { max_keys: page_keys, ..Default::default() };
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let page = l.list_object_versions(bucket, &q).await.expect("list versions");
        assert!(page.versions.len() <= page_keys, "a page holds at most max-keys entries");
        out.extend(page.versions);
        match page.next_key_marker {
            Some(k) => {
                q.key_marker = k;
                q.version_id_marker = page.next_version_id_marker;
            }
            None => return out,
        }
    }
    panic!("the versions listing did not end");
}

async fn versioning_basics<L: ObjectLayer>(l: &L) {
    l.create_bucket("bkt", None).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().versioning, Versioning::Unversioned);
    assert!(l.put_bucket_versioning("bkt", Versioning::Unversioned).await.is_err(), "never back to unversioned");
    assert_eq!(l.put_bucket_versioning("nob", Versioning::Enabled).await, Err(LayerError::NoSuchBucket));
    // An object from before versioning is the null version, kept when versioning starts.
    let plain = put(l, "bkt", "k", b"plain").await;
    assert_eq!(plain.version_id, None);
    l.put_bucket_versioning("bkt", Versioning::Enabled).await.unwrap();
    assert_eq!(l.bucket_info("bkt").await.unwrap().versioning, Versioning::Enabled);
    let v1 = put(l, "bkt", "k", b"one").await.version_id.expect("a version id");
    let v2 = put(l, "bkt", "k", b"two").await.version_id.expect("a version id");
    assert!(v2 != v1);
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"two");
    assert_eq!(get_version(l, "bkt", "k", &v1).await.unwrap(), b"one");
    assert_eq!(get_version(l, "bkt", "k", "null").await.unwrap(), b"plain");
    assert_eq!(get_version(l, "bkt", "k", &"0".repeat(32)).await, Err(LayerError::NoSuchVersion));
    assert!(matches!(get_version(l, "bkt", "k", "bad").await, Err(LayerError::InvalidArgument(_))));
    // A delete makes a delete marker: GET answers 404 with it, GET of the marker by id 405.
    let d = l.delete_object("bkt", "k", None).await.unwrap();
    assert!(d.delete_marker);
    let marker = d.version_id.clone().expect("the marker's version id");
    assert_eq!(get_all(l, "bkt", "k").await, Err(LayerError::DeleteMarker { version_id: d.version_id, named: false }));
    assert!(matches!(get_version(l, "bkt", "k", &marker).await, Err(LayerError::DeleteMarker { named: true, .. })));
    let listed = l.list_objects("bkt", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    assert!(listed.objects.is_empty(), "a key whose current version is a delete marker is not listed");
    assert_eq!(l.delete_bucket("bkt").await, Err(LayerError::BucketNotEmpty), "versions keep a bucket");
    // Removing the marker by id brings the newest version back.
    l.delete_object("bkt", "k", Some(&marker)).await.unwrap();
    assert_eq!(get_all(l, "bkt", "k").await.unwrap(), b"two");
    // Copy and tags address versions.
    let copied = l.copy_object("bkt", "k", Some(&v1), &Precondition::default(), "bkt", "c", None).await.unwrap();
    assert!(copied.version_id.is_some());
    assert_eq!(get_all(l, "bkt", "c").await.unwrap(), b"one");
    l.put_tags("bkt", "k", Some(&v1), vec![("t".into(), "1".into())]).await.unwrap();
    assert_eq!(l.get_tags("bkt", "k", Some(&v1)).await.unwrap(), vec![("t".to_string(), "1".to_string())]);
    assert!(l.get_tags("bkt", "k", None).await.unwrap().is_empty(), "tags belong to one version");
    // Suspended: new writes are the null version, replacing the old null version; others stay.
    l.put_bucket_versioning("bkt", Versioning::Suspended).await.unwrap();
    let n = put(l, "bkt", "k", b"null-two").await;
    assert_eq!(n.version_id, None);
    assert_eq!(get_version(l, "bkt", "k", "null").await.unwrap(), b"null-two");
    let ids: Vec<Option<String>> =
        all_versions(l, "bkt", 1000).await.into_iter().filter(|v| v.key == "k").map(|v| v.version_id).collect();
    assert_eq!(ids, vec![None, Some(v2.clone()), Some(v1.clone())], "newest first, one null version");
    // Deleting every version empties the key, and the bucket can go.
    for v in ["null", v2.as_str(), v1.as_str()] {
        l.delete_object("bkt", "k", Some(v)).await.unwrap();
    }
    for v in all_versions(l, "bkt", 1000).await {
        l.delete_object("bkt", &v.key, Some(v.version_id.as_deref().unwrap_or("null"))).await.unwrap();
    }
    assert!(all_versions(l, "bkt", 1000).await.is_empty());
    l.delete_bucket("bkt").await.unwrap();
}

/// One version of the model: its id (None: null) and body (None: a delete marker).
#[derive(Clone, Debug)]
struct ModelVersion {
    id: Option<String>,
    data: Option<Vec<u8>>,
}

/// Random puts, deletes, deletes of versions and versioning changes on a few keys, against a model of
/// each key's versions (newest first): after every step the listing of versions, every version's body
/// and the plain listing agree with the model.
async fn versioning_against_a_model<L: ObjectLayer>(l: &L) {
    const KEYS: [&str; 3] = ["a", "a/b", "ab"];
    l.create_bucket("bkt", None).await.unwrap();
    let mut model: std::collections::BTreeMap<&str, Vec<ModelVersion>> = Default::default();
    let mut state = Versioning::Unversioned;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for step in 0..120u64 {
        let key = KEYS[next(KEYS.len() as u64) as usize];
        let versions = model.entry(key).or_default();
        let null = state != Versioning::Enabled;
        match next(10) {
            0 => {
                state = if next(3) == 0 { Versioning::Suspended } else { Versioning::Enabled };
                l.put_bucket_versioning("bkt", state).await.unwrap();
            }
            1..=4 => {
                let data = pattern(step, (next(3) * 3000) as usize);
                let m = put(l, "bkt", key, &data).await;
                assert_eq!(m.version_id.is_none(), null, "step {step}");
                if null {
                    versions.retain(|v| v.id.is_some());
                }
                versions.insert(0, ModelVersion { id: m.version_id, data: Some(data) });
            }
            5..=6 => {
                let d = l.delete_object("bkt", key, None).await.unwrap();
                if state == Versioning::Unversioned {
                    versions.clear();
                } else {
                    assert!(d.delete_marker, "step {step}");
                    if null {
                        versions.retain(|v| v.id.is_some());
                    }
                    versions.insert(0, ModelVersion { id: d.version_id, data: None });
                }
            }
            _ => {
                if versions.is_empty() {
                    continue;
                }
                let i = next(versions.len() as u64) as usize;
                let id = versions[i].id.clone().unwrap_or_else(|| "null".into());
                l.delete_object("bkt", key, Some(&id)).await.unwrap();
                versions.remove(i);
            }
        }
        // The whole bucket's versions, in pages of 2 (markers inside a key's versions).
        let listed = all_versions(l, "bkt", 2).await;
        let expected: Vec<(String, Option<String>, bool, bool)> = model
            .iter()
            .flat_map(|(k, vs)| {
                vs.iter().enumerate().map(move |(i, v)| (k.to_string(), v.id.clone(), i == 0, v.data.is_none()))
            })
            .collect();
        let got: Vec<(String, Option<String>, bool, bool)> =
            listed.iter().map(|v| (v.key.clone(), v.version_id.clone(), v.is_latest, v.delete_marker)).collect();
        assert_eq!(got, expected, "step {step}: the versions listing");
        for (k, vs) in &model {
            for v in vs {
                let id = v.id.clone().unwrap_or_else(|| "null".into());
                match &v.data {
                    Some(data) => assert_eq!(&get_version(l, "bkt", k, &id).await.unwrap(), data, "step {step}"),
                    None => {
                        assert!(matches!(get_version(l, "bkt", k, &id).await, Err(LayerError::DeleteMarker { .. })))
                    }
                }
            }
            let current = get_all(l, "bkt", k).await;
            match vs.first().and_then(|v| v.data.as_ref()) {
                Some(data) => assert_eq!(&current.unwrap(), data, "step {step}: the current version of {k}"),
                None => assert!(current.is_err(), "step {step}: {k} has no current object"),
            }
        }
        let plain = l.list_objects("bkt", &ListQuery { max_keys: 1, ..Default::default() }).await.unwrap();
        let first_visible = model.iter().find(|(_, vs)| vs.first().is_some_and(|v| v.data.is_some())).map(|(k, _)| *k);
        assert_eq!(plain.objects.first().map(|o| o.key.as_str()), first_visible, "step {step}: the plain listing");
    }
}

async fn object_lock<L: ObjectLayer>(l: &L) {
    let lock_opts = BucketOptions { object_lock: true, ..Default::default() };
    l.create_bucket("locked", Some(&lock_opts)).await.unwrap();
    let info = l.bucket_info("locked").await.unwrap();
    assert_eq!(info.versioning, Versioning::Enabled, "object lock comes with versioning");
    assert!(info.object_lock.is_some_and(|c| c.enabled));
    assert!(matches!(
        l.put_bucket_versioning("locked", Versioning::Suspended).await,
        Err(LayerError::InvalidBucketState(_))
    ));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let with_lock = |mode: Option<LockMode>, hold: bool| PutOptions {
        lock: LockRequest {
            retention: mode.map(|m| Retention { mode: m, retain_until_ms: now + 3_600_000 }),
            legal_hold: hold,
        },
        ..Default::default()
    };
    let put_locked = |key: &'static str, opts: PutOptions| async move {
        l.put_object("locked", key, body(b"worm", 4), opts).await.unwrap().version_id.unwrap()
    };
    let del = |key: &'static str, v: String, bypass: bool| async move {
        let opts = DeleteOptions { version_id: Some(v), bypass_governance: bypass, ..Default::default() };
        l.delete_object_with("locked", key, &opts).await
    };

    // COMPLIANCE: nobody removes the version, bypass or not; it can be extended, never shortened.
    let c = put_locked("c", with_lock(Some(LockMode::Compliance), false)).await;
    assert!(matches!(del("c", c.clone(), true).await, Err(LayerError::ObjectLocked(_))));
    let shorter = LockChange::Retention(Some(Retention { mode: LockMode::Compliance, retain_until_ms: now + 60_000 }));
    assert!(matches!(l.change_object_lock("locked", "c", None, shorter, true).await, Err(LayerError::ObjectLocked(_))));
    let longer =
        LockChange::Retention(Some(Retention { mode: LockMode::Compliance, retain_until_ms: now + 7_200_000 }));
    l.change_object_lock("locked", "c", None, longer, false).await.unwrap();
    assert!(matches!(
        l.change_object_lock("locked", "c", None, LockChange::Retention(None), true).await,
        Err(LayerError::ObjectLocked(_))
    ));
    // A delete without a version id only adds a delete marker; the locked version stays.
    assert!(l.delete_object("locked", "c", None).await.unwrap().delete_marker);
    assert_eq!(get_version(l, "locked", "c", &c).await.unwrap(), b"worm");

    // GOVERNANCE: removed only with the bypass.
    let g = put_locked("g", with_lock(Some(LockMode::Governance), false)).await;
    assert!(matches!(del("g", g.clone(), false).await, Err(LayerError::ObjectLocked(_))));
    del("g", g, true).await.unwrap();

    // A legal hold holds until it is taken off, whatever the retention.
    let h = put_locked("h", with_lock(None, true)).await;
    assert!(matches!(del("h", h.clone(), true).await, Err(LayerError::ObjectLocked(_))));
    l.change_object_lock("locked", "h", Some(&h), LockChange::LegalHold(false), false).await.unwrap();
    del("h", h, false).await.unwrap();

    // A default retention applies to versions that name none.
    let cfg =
        LockConfig { enabled: true, default_retention: Some(DefaultRetention { mode: LockMode::Governance, days: 1 }) };
    l.put_object_lock_config("locked", cfg).await.unwrap();
    let d = put_locked("d", PutOptions::default()).await;
    let meta = l.head_object("locked", "d", Some(&d), &Precondition::default()).await.unwrap();
    let r = meta.retention.expect("the default retention");
    assert_eq!(r.mode, LockMode::Governance);
    assert!((r.retain_until_ms - now - 86_400_000).abs() < 600_000, "{r:?}");
    assert!(matches!(del("d", d, false).await, Err(LayerError::ObjectLocked(_))));

    // A lock asked for where object lock is off is refused; lock needs versioning enabled.
    l.create_bucket("plain", None).await.unwrap();
    let asked = l.put_object("plain", "k", body(b"x", 1), with_lock(None, true)).await;
    assert!(matches!(asked, Err(LayerError::InvalidRequest(_))));
    assert!(matches!(l.put_object_lock_config("plain", cfg).await, Err(LayerError::InvalidBucketState(_))));
    l.put_bucket_versioning("plain", Versioning::Enabled).await.unwrap();
    l.put_object_lock_config("plain", cfg).await.unwrap();
    assert!(l.bucket_info("plain").await.unwrap().object_lock.is_some());

    // A legal hold set while a removal of the version races it: never both.
    for round in 0..20 {
        let key = "race";
        let v = l.put_object("locked", key, body(b"r", 1), PutOptions::default()).await.unwrap().version_id.unwrap();
        l.change_object_lock("locked", key, Some(&v), LockChange::Retention(None), true).await.unwrap();
        let opts = DeleteOptions { version_id: Some(v.clone()), ..Default::default() };
        let (held, deleted) = futures::join!(
            l.change_object_lock("locked", key, Some(&v), LockChange::LegalHold(true), false),
            l.delete_object_with("locked", key, &opts)
        );
        assert!(!(held.is_ok() && deleted.is_ok()), "round {round}: a held version was removed");
        if held.is_ok() {
            assert_eq!(get_version(l, "locked", key, &v).await.unwrap(), b"r", "round {round}");
            l.change_object_lock("locked", key, Some(&v), LockChange::LegalHold(false), false).await.unwrap();
        }
    }
}

async fn lifecycle<L: ObjectLayer>(l: &L) {
    // Long beside the test's own run time: objects are put after `now` is taken, and with days of a
    // second an object put half a second late (a loaded machine) had not expired at `now + 1.5 days`.
    const DAY_MS: i64 = 600_000;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let after_days = |d: f64| now + (d * DAY_MS as f64) as i64;
    let keys = |b: &'static str| async move {
        let page = l.list_objects(b, &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
        page.objects.into_iter().map(|o| o.key).collect::<Vec<_>>()
    };
    let rule = |id: &str, f: &dyn Fn(&mut LifecycleRule)| {
        let mut r = LifecycleRule { id: id.into(), enabled: true, ..Default::default() };
        f(&mut r);
        r
    };

    // Unversioned: current versions expire by prefix, size and tags; a second pass finds nothing to do.
    l.create_bucket("plain", None).await.unwrap();
    for k in ["logs/a", "logs/b", "keep/a", "big/a", "tagged/a", "tagged/b"] {
        let size = if k.starts_with("big/") { 5000 } else { 10 };
        put(l, "plain", k, &pattern(1, size)).await;
    }
    l.put_tags("plain", "tagged/a", None, vec![("expire".into(), "yes".into())]).await.unwrap();
    let rules = vec![
        rule("logs", &|r| {
            r.filter.prefix = "logs/".into();
            r.expiration_days = Some(1);
        }),
        rule("big", &|r| {
            r.filter.size_greater_than = Some(1000);
            r.expiration_days = Some(3);
        }),
        rule("tagged", &|r| {
            r.filter.tags = vec![("expire".into(), "yes".into())];
            r.expiration_days = Some(1);
        }),
        rule("off", &|r| {
            r.enabled = false;
            r.expiration_days = Some(1);
        }),
    ];
    l.put_bucket_lifecycle("plain", Some(rules.clone())).await.unwrap();
    assert_eq!(l.bucket_info("plain").await.unwrap().lifecycle, Some(rules));
    // x-amz-expiration: the earliest enabled rule that matches prefix, size and tags, in calendar days.
    let hint = |k: &'static str| async move {
        let m = l.head_object("plain", k, None, &Precondition::default()).await.unwrap();
        let e = l.expiration_of("plain", k, &m).await.unwrap();
        e.map(|e| (e.rule_id, (e.date_unix_ms - crate::expiry_after_days(m.last_modified_unix_ms, 0)) / 86_400_000))
    };
    assert_eq!(hint("logs/a").await, Some(("logs".to_string(), 1)));
    assert_eq!(hint("big/a").await, Some(("big".to_string(), 3)));
    assert_eq!(hint("tagged/a").await, Some(("tagged".to_string(), 1)));
    assert_eq!(hint("tagged/b").await, None, "no tag, no match; the disabled rule does not count");
    assert_eq!(hint("keep/a").await, None);
    assert_eq!(l.lifecycle_pass(after_days(0.5), DAY_MS).await.unwrap().expired_current, 0);
    assert_eq!(keys("plain").await.len(), 6);
    let r = l.lifecycle_pass(after_days(1.5), DAY_MS).await.unwrap();
    assert_eq!(r.expired_current, 3);
    assert_eq!(keys("plain").await, ["big/a", "keep/a", "tagged/b"]);
    let r = l.lifecycle_pass(after_days(3.5), DAY_MS).await.unwrap();
    assert_eq!(r.expired_current, 1);
    assert_eq!(
        l.lifecycle_pass(after_days(3.5), DAY_MS).await.unwrap(),
        LifecycleReport { buckets: 1, ..Default::default() }
    );
    assert_eq!(keys("plain").await, ["keep/a", "tagged/b"]);

    // Versioned: an expiring current version gets one delete marker (never a second one); noncurrent
    // versions go after their days beyond the newest one kept; a delete marker left alone goes; uploads
    // are aborted.
    l.create_bucket("ver", None).await.unwrap();
    l.put_bucket_versioning("ver", Versioning::Enabled).await.unwrap();
    for i in 0..4 {
        put(l, "ver", "k", &pattern(i, 10)).await;
    }
    put(l, "ver", "gone", b"x").await;
    l.create_multipart("ver", "upload", PutOptions::default()).await.unwrap();
    let rules = vec![
        rule("nc", &|r| {
            r.noncurrent_days = Some(1);
            r.newer_noncurrent_versions = Some(1);
            r.abort_upload_days = Some(2);
        }),
        rule("gone", &|r| {
            r.filter.prefix = "gone".into();
            r.expiration_days = Some(1);
            r.noncurrent_days = Some(2);
        }),
        rule("markers", &|r| r.expired_delete_marker = true),
    ];
    l.put_bucket_lifecycle("ver", Some(rules)).await.unwrap();
    let r = l.lifecycle_pass(after_days(1.5), DAY_MS).await.unwrap();
    assert_eq!((r.expired_noncurrent, r.expired_current, r.aborted_uploads), (2, 1, 0), "{r:?}");
    let versions = |key: &'static str| async move {
        all_versions(l, "ver", 1000)
            .await
            .into_iter()
            .filter(|v| v.key == key)
            .map(|v| v.delete_marker)
            .collect::<Vec<_>>()
    };
    assert_eq!(versions("k").await, [false, false], "the current version and the newest noncurrent one");
    assert_eq!(versions("gone").await, [true, false], "one delete marker over the expired version");
    let r = l.lifecycle_pass(after_days(1.6), DAY_MS).await.unwrap();
    assert_eq!((r.expired_current, r.removed_delete_markers), (0, 0), "{r:?}");
    assert_eq!(versions("gone").await, [true, false], "never a second delete marker");
    // The version under the marker goes a day after it became noncurrent; then the marker is alone and goes.
    let r = l.lifecycle_pass(after_days(3.0), DAY_MS).await.unwrap();
    assert_eq!((r.expired_noncurrent, r.aborted_uploads), (1, 1), "{r:?}");
    l.lifecycle_pass(after_days(3.1), DAY_MS).await.unwrap();
    assert!(versions("gone").await.is_empty());
    assert!(l.list_uploads("ver", "").await.unwrap().is_empty());

    // A locked version is left alone, pass after pass.
    let locked = BucketOptions { object_lock: true, ..Default::default() };
    l.create_bucket("wormy", Some(&locked)).await.unwrap();
    let hold = PutOptions { lock: LockRequest { retention: None, legal_hold: true }, ..Default::default() };
    l.put_object("wormy", "k", body(b"old", 3), hold).await.unwrap();
    put(l, "wormy", "k", b"new").await;
    l.put_bucket_lifecycle("wormy", Some(vec![rule("nc", &|r| r.noncurrent_days = Some(1))])).await.unwrap();
    for _ in 0..2 {
        let r = l.lifecycle_pass(after_days(5.0), DAY_MS).await.unwrap();
        assert!(r.skipped >= 1, "{r:?}");
    }
    assert_eq!(all_versions(l, "wormy", 1000).await.len(), 2);

    // Bad rules are refused; removing the configuration stops the rules.
    let none = rule("none", &|_| {});
    assert!(l.put_bucket_lifecycle("plain", Some(vec![none])).await.is_err());
    l.put_bucket_lifecycle("plain", None).await.unwrap();
    assert!(l.bucket_info("plain").await.unwrap().lifecycle.is_none());
}

/// A customer key (SSE-C) made from a seed.
pub fn customer_key(seed: u8) -> CustomerKey {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = [seed; 32];
    let md5 = b64.encode(Md5::digest(key));
    CustomerKey::from_headers(Some("AES256"), Some(&b64.encode(key)), Some(&md5)).unwrap().unwrap()
}

/// Uploads of `parts` parts (with more than `RECORD_PARTS_MAX`, their sizes and salts are kept apart from the
/// metadata record), encrypted and, with `plain_too`, plain (the layer needs SSE keys and `min_part_bytes` of 1): each
/// completes, and a repeated completion answers it again; it reads back whole, by part number and by
/// range; a change of its record (tags) keeps its parts; a copy reads back.
/// The suite on every store runs the encrypted one alone: its part table holds sizes and salts, a plain
/// one's only sizes.
pub async fn uploads_of_many_parts<L: ObjectLayer>(l: &L, parts: u32, plain_too: bool) {
    l.create_bucket("many", None).await.unwrap();
    let uploads = [("sealed", Some(SseRequest::S3)), ("plain", None)];
    for (key, sse) in uploads.into_iter().take(if plain_too { 2 } else { 1 }) {
        let opts = PutOptions { sse, ..Default::default() };
        let id = l.create_multipart("many", key, opts).await.unwrap();
        let mut done = Vec::new();
        let mut bodies = Vec::new();
        for p in 1..=parts {
            let data = pattern(u64::from(p), 1 + (p as usize * 7) % 23);
            let info = l.upload_part("many", key, &id, p, body(&data, 64)).await.unwrap();
            done.push(CompletePart { part_number: p, etag: info.etag });
            bodies.push(data);
        }
        let pre = Precondition::default();
        let meta = l
            .complete_multipart("many", key, &id, done.clone(), &pre, vec![])
            .await
            .unwrap_or_else(|e| panic!("{key}: {e:?}"));
        assert!(meta.etag.ends_with(&format!("-{parts}")), "{key}: {}", meta.etag);
        let again = l.complete_multipart("many", key, &id, done, &pre, vec![]).await.unwrap();
        assert_eq!(again.etag, meta.etag, "{key}: a repeated completion");
        read_parts(l, key, &bodies).await;
        l.put_tags("many", key, None, vec![("k".into(), "v".into())]).await.unwrap();
        read_parts(l, key, &bodies).await;
        let copy = format!("{key}-copy");
        l.copy_object("many", key, None, &pre, "many", &copy, None).await.unwrap();
        assert_eq!(get_all(l, "many", &copy).await.unwrap(), bodies.concat(), "{copy}");
    }
}

/// Reads a multipart object whole, by part number (first, middle, last) and its last bytes by range.
async fn read_parts<L: ObjectLayer>(l: &L, key: &str, bodies: &[Vec<u8>]) {
    let all = bodies.concat();
    let pre = Precondition::default();
    assert_eq!(get_all(l, "many", key).await.unwrap(), all, "{key}: whole");
    let head = l.head_object("many", key, None, &pre).await.unwrap();
    assert_eq!(head.part_sizes.len(), bodies.len(), "{key}: its parts");
    for p in [1, bodies.len() / 2, bodies.len()] {
        let got = l.get_object("many", key, None, None, Some(p as u32), &pre).await.unwrap();
        assert_eq!(collect(got.body).await.unwrap(), bodies[p - 1], "{key}: part {p}");
    }
    let range = RangeRequest::FromTo { first: all.len() as u64 - 100, last: None };
    let got = l.get_object("many", key, None, Some(range), None, &pre).await.unwrap();
    assert_eq!(collect(got.body).await.unwrap(), all[all.len() - 100..], "{key}: its last bytes");
}

fn encrypted(sse: SseRequest) -> PutOptions {
    PutOptions { sse: Some(sse), ..Default::default() }
}

async fn get_keyed<L: ObjectLayer>(
    l: &L,
    key: &str,
    range: Option<RangeRequest>,
    c: Option<&CustomerKey>,
) -> LayerResult<Vec<u8>> {
    let got = l.get_object_sse("enc", key, None, range, None, &Precondition::default(), c).await?;
    collect(got.body).await
}

/// SSE-S3, SSE-KMS and SSE-C: bodies of every size around the package size read back whole and by any
/// range; the ETag and sizes are the plaintext's; keys are required, checked, and never interchangeable.
async fn encryption<L: ObjectLayer>(l: &L) {
    l.create_bucket("enc", None).await.unwrap();
    let pkg = mosaic_crypt::PACKAGE_PLAIN_BYTES;
    let c1 = customer_key(1);
    let modes = [SseRequest::S3, SseRequest::Kms { key_id: "k1".into() }, SseRequest::Customer(c1.clone())];
    for (m, mode) in modes.iter().enumerate() {
        let c = matches!(mode, SseRequest::Customer(_)).then_some(&c1);
        for len in [0, 1, pkg - 1, pkg, pkg + 1, 3 * pkg + 17] {
            let data = pattern(len as u64 + m as u64, len);
            let key = format!("o{m}-{len}");
            let meta = l.put_object("enc", &key, body(&data, 10_000), encrypted(mode.clone())).await.unwrap();
            assert_eq!((meta.size_bytes, meta.etag.as_str()), (len as u64, md5_hex(&data).as_str()));
            assert_eq!(get_keyed(l, &key, None, c).await.unwrap(), data, "{key}");
            let head = l.head_object_sse("enc", &key, None, &Precondition::default(), c).await.unwrap();
            assert_eq!(head.size_bytes, len as u64);
            for (a, b) in [(0, 1), (pkg - 1, pkg + 1), (pkg, 2 * pkg), (5, len), (len.saturating_sub(3), len)] {
                let b = b.min(len);
                if a >= b {
                    continue;
                }
                let r = Some(RangeRequest::FromTo { first: a as u64, last: Some(b as u64 - 1) });
                assert_eq!(get_keyed(l, &key, r, c).await.unwrap(), &data[a..b], "{key} {a}-{b}");
            }
        }
    }
    let listed = l.list_objects("enc", &ListQuery { max_keys: 1000, ..Default::default() }).await.unwrap();
    assert!(listed.objects.iter().any(|o| o.key == "o0-65537" && o.size_bytes == 65_537));
    // SSE-C: the key is required, and only the right one opens the object.
    let is_request_error = |r: LayerResult<Vec<u8>>| matches!(r, Err(LayerError::InvalidRequest(_)));
    assert!(is_request_error(get_keyed(l, "o2-1", None, None).await));
    assert!(is_request_error(get_keyed(l, "o2-1", None, Some(&customer_key(2))).await));
    let pre = Precondition::default();
    assert!(matches!(l.head_object("enc", "o2-1", None, &pre).await, Err(LayerError::InvalidRequest(_))));
    // An SSE-C key for an object stored without one is refused too.
    put(l, "enc", "plain", b"plain").await;
    assert!(is_request_error(get_keyed(l, "plain", None, Some(&c1)).await));
    // Unknown KMS keys are refused.
    let e = l.put_object("enc", "x", body(b"x", 1), encrypted(SseRequest::Kms { key_id: "nope".into() })).await;
    assert_eq!(e.err(), Some(LayerError::KmsKeyNotFound("nope".into())));
    // Copies between modes re-encrypt: SSE-C to SSE-S3, SSE-S3 to SSE-C, and to plain.
    let src = pattern(9, 3 * pkg + 5);
    l.put_object("enc", "src", body(&src, 4096), encrypted(SseRequest::Customer(c1.clone()))).await.unwrap();
    let c2 = customer_key(2);
    let tags = vec![("t".to_string(), "1".to_string())];
    l.put_tags("enc", "src", None, tags.clone()).await.unwrap();
    let copy = |from: &'static str, to: &'static str, keys: CopyKeys| {
        let (from, to) = (("enc", from, None), ("enc", to));
        l.copy_object_with(from, &pre, to, None, CopyTags::Source, Default::default(), keys)
    };
    let keys = CopyKeys { source: Some(c1.clone()), dest: Some(SseRequest::S3) };
    let copied = copy("src", "c-s3", keys).await;
    assert_eq!(copied.unwrap().sse.map(|s| s.mode), Some(SseMode::S3));
    assert_eq!(get_keyed(l, "c-s3", None, None).await.unwrap(), src);
    // A copy that is read and written again carries the source's tags too.
    assert_eq!(l.get_tags("enc", "c-s3", None).await.unwrap(), tags);
    let keys = CopyKeys { source: None, dest: Some(SseRequest::Customer(c2.clone())) };
    copy("c-s3", "c-c2", keys).await.unwrap();
    assert_eq!(get_keyed(l, "c-c2", None, Some(&c2)).await.unwrap(), src);
    let keys = CopyKeys { source: Some(c2.clone()), dest: None };
    let plain = copy("c-c2", "c-plain", keys);
    assert_eq!(plain.await.unwrap().sse, None);
    assert_eq!(get_all(l, "enc", "c-plain").await.unwrap(), src);
    let keys = CopyKeys { source: None, dest: None };
    let no_key = copy("c-c2", "c-x", keys).await;
    assert!(matches!(no_key, Err(LayerError::InvalidRequest(_))));
    encrypted_multipart(l, &c1, &src).await;
    // A bucket's default encryption applies to writes that ask for none.
    let default = BucketEncryption { mode: SseMode::Kms, kms_key_id: Some("k1".into()), bucket_key_enabled: false };
    l.put_bucket_encryption("enc", Some(default.clone())).await.unwrap();
    assert_eq!(l.bucket_info("enc").await.unwrap().encryption, Some(default));
    let meta = put(l, "enc", "defaulted", b"by default").await;
    assert_eq!(meta.sse.map(|s| (s.mode, s.kms_key_id)), Some((SseMode::Kms, Some("k1".into()))));
    assert_eq!(get_all(l, "enc", "defaulted").await.unwrap(), b"by default");
    let append = PutOptions { write_offset: Some(0), ..Default::default() };
    assert!(matches!(l.put_object("enc", "app", body(b"x", 1), append).await, Err(LayerError::InvalidArgument(_))));
    let bad = BucketEncryption { mode: SseMode::Customer, kms_key_id: None, bucket_key_enabled: false };
    assert!(matches!(l.put_bucket_encryption("enc", Some(bad)).await, Err(LayerError::InvalidArgument(_))));
    l.put_bucket_encryption("enc", None).await.unwrap();
    assert_eq!(put(l, "enc", "plain-again", b"p").await.sse, None);
}

/// An SSE-C multipart upload: every part needs the upload's key; ranges and part numbers cross parts.
async fn encrypted_multipart<L: ObjectLayer>(l: &L, c1: &CustomerKey, src: &[u8]) {
    let pre = Precondition::default();
    let id = l.create_multipart("enc", "mp", encrypted(SseRequest::Customer(c1.clone()))).await.unwrap();
    let parts_data = [pattern(21, 5 << 20), pattern(22, (5 << 20) + 3), pattern(23, (5 << 20) + 1000)];
    let other = customer_key(3);
    let refused = l.upload_part_sse("enc", "mp", &id, 1, body(&parts_data[0], 1 << 20), Some(&other)).await;
    assert!(matches!(refused, Err(LayerError::InvalidRequest(_))));
    let refused = l.upload_part("enc", "mp", &id, 1, body(&parts_data[0], 1 << 20)).await;
    assert!(matches!(refused, Err(LayerError::InvalidRequest(_))));
    let mut completes = Vec::new();
    for (i, d) in parts_data.iter().enumerate() {
        let p = l.upload_part_sse("enc", "mp", &id, i as u32 + 1, body(d, 1 << 20), Some(c1)).await.unwrap();
        assert_eq!((p.size_bytes, p.etag.as_str()), (d.len() as u64, md5_hex(d).as_str()));
        completes.push(CompletePart { part_number: p.part_number, etag: p.etag });
    }
    // A part copied from an encrypted source, into the encrypted upload.
    let keys = CopyKeys { source: Some(c1.clone()), dest: Some(SseRequest::Customer(c1.clone())) };
    let p4 = l.upload_part_copy_sse("enc", "mp", &id, 4, "enc", "src", None, None, &pre, keys).await.unwrap();
    completes.push(CompletePart { part_number: 4, etag: p4.etag });
    let meta = l.complete_multipart("enc", "mp", &id, completes, &pre, Vec::new()).await.unwrap();
    let whole = [&parts_data.concat()[..], src].concat();
    assert_eq!(meta.size_bytes, whole.len() as u64);
    assert_eq!(get_keyed(l, "mp", None, Some(c1)).await.unwrap(), whole);
    let p = 5u64 << 20;
    for (a, b) in [(p - 10, p + 10), (0, 2 * p + 4), (2 * p, 2 * p + 1003), (1, whole.len() as u64)] {
        let r = Some(RangeRequest::FromTo { first: a, last: Some(b - 1) });
        assert_eq!(get_keyed(l, "mp", r, Some(c1)).await.unwrap(), &whole[a as usize..b as usize], "{a}-{b}");
    }
    let got = l.get_object_sse("enc", "mp", None, None, Some(2), &pre, Some(c1)).await.unwrap();
    assert_eq!(collect(got.body).await.unwrap(), parts_data[1]);
}

/// The keys an encrypting layer of the tests is opened with: a fresh master key and KMS key "k1".
pub fn test_sse_keys() -> Arc<SseKeys> {
    Arc::new(SseKeys::new(mosaic_crypt::MasterKeys::generate().unwrap(), ["k1".to_string()].into()).unwrap())
}

/// A damaged byte of an encrypted body is an error, never other bytes. The damage is an overwrite in
/// place through the store, which a drive takes at any offset (an erasure set only at its stripes).
/// A bucket's collection left without its record (a creation cut short, as when two nodes create one
/// bucket at once) is finished by the next CreateBucket; one that holds objects is not taken over.
async fn orphan_bucket_collection<S: Store>(l: &S3Semantics<S>) {
    use mosaic_store::{Op, Snapshot, Txn};
    let create = |b: &str| Txn::new().op(Op::CreateCollection { name: crate::records::bucket_collection(b) });
    l.store().commit(create("orphan")).await.unwrap();
    assert!(l.bucket_info("orphan").await.is_err(), "no record: no bucket");
    l.create_bucket("orphan", None).await.unwrap();
    assert!(l.bucket_info("orphan").await.is_ok());
    put(l, "orphan", "k", b"x").await;
    assert_eq!(l.create_bucket("orphan", None).await, Err(LayerError::BucketExists));
    assert_eq!(get_all(l, "orphan", "k").await.unwrap(), b"x");
    l.store().commit(create("full")).await.unwrap();
    let coll = l.store().snapshot().collection(&crate::records::bucket_collection("full")).await.unwrap().unwrap();
    let write = Op::Write { coll, name: b"stray".to_vec(), offset: 0, data: b"y".to_vec() };
    l.store().commit(Txn::new().op(write)).await.unwrap();
    assert!(matches!(l.create_bucket("full", None).await, Err(LayerError::Corrupt(_))), "not an orphan");
}

pub async fn encryption_detects_damage<S: Store>(l: &S3Semantics<S>) {
    use mosaic_store::{Op, Snapshot, Txn};
    let data = pattern(77, 200_000);
    l.create_bucket("enc", None).await.unwrap();
    l.put_object("enc", "victim", body(&data, 50_000), encrypted(SseRequest::S3)).await.unwrap();
    let snapshot = l.store().snapshot();
    let coll = snapshot.collection("b/enc").await.unwrap().unwrap();
    // The stored byte flipped: a fixed value would leave it as it was once in 256 runs (ciphertext is random).
    let info = snapshot.lookup(&coll, b"victim").await.unwrap().unwrap();
    let stored = snapshot.read(&info.obj, 70_000, 1).await.unwrap()[0];
    let txn = Txn::new().op(Op::Write { coll, name: b"victim".to_vec(), offset: 70_000, data: vec![!stored] });
    l.store().commit(txn).await.unwrap();
    let first_package = Some(RangeRequest::FromTo { first: 0, last: Some(1000) });
    assert_eq!(get_keyed(l, "victim", first_package, None).await.unwrap(), &data[..1001], "other packages read");
    let r = get_keyed(l, "victim", None, None).await;
    assert!(matches!(r, Err(LayerError::Corrupt(_))), "{r:?}");
}
