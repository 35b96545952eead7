//! aws-sdk-s3 against an in-process Mosaic: every operation, with the SDK's default request checksums
//! (aws-chunked uploads with a trailing CRC) and with checksums only when required.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, CompletedMultipartUpload, CompletedPart, Delete, MetadataDirective,
    ObjectIdentifier, Tag, Tagging,
};
use common::*;

async fn get_bytes(c: &aws_sdk_s3::Client, b: &str, k: &str) -> Vec<u8> {
    c.get_object().bucket(b).key(k).send().await.unwrap().body.collect().await.unwrap().into_bytes().to_vec()
}

async fn buckets(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("alpha").send().await.unwrap();
    // As S3 in us-east-1 (the region served): creating again a bucket one owns succeeds.
    c.create_bucket().bucket("alpha").send().await.unwrap();
    let e = c.create_bucket().bucket("Bad_Name").send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidBucketName");
    c.head_bucket().bucket("alpha").send().await.unwrap();
    let e = c.head_bucket().bucket("missing").send().await.unwrap_err();
    assert_eq!(status(&e), 404);
    let listed = c.list_buckets().send().await.unwrap();
    let names: Vec<_> = listed.buckets().iter().filter_map(|b| b.name()).collect();
    assert_eq!(names, vec!["alpha"]);
    c.get_bucket_location().bucket("alpha").send().await.unwrap();
    c.put_object().bucket("alpha").key("k").body(ByteStream::from_static(b"x")).send().await.unwrap();
    let e = c.delete_bucket().bucket("alpha").send().await.unwrap_err();
    assert_eq!(code(&e), "BucketNotEmpty");
    c.delete_object().bucket("alpha").key("k").send().await.unwrap();
    c.delete_bucket().bucket("alpha").send().await.unwrap();
    let e = c.delete_bucket().bucket("alpha").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchBucket");
    s.stop().await;
}

async fn objects(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    for (i, len) in
        [0usize, 1, 4095, 4096, 16 * 1024, 20_000, (1 << 20) + 3, 9 << 20, (25 << 20) + 5].into_iter().enumerate()
    {
        let data = body(len, i as u8);
        let key = format!("obj/{len}");
        let put = c
            .put_object()
            .bucket("bkt")
            .key(&key)
            .content_type("text/plain")
            .cache_control("no-cache")
            .metadata("color", "blue")
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(put.e_tag().unwrap(), format!("\"{}\"", md5_hex(&data)));
        let got = c.get_object().bucket("bkt").key(&key).send().await.unwrap();
        assert_eq!(got.content_length(), Some(len as i64));
        assert_eq!(got.content_type(), Some("text/plain"));
        assert_eq!(got.cache_control(), Some("no-cache"));
        assert_eq!(got.metadata().unwrap().get("color").map(String::as_str), Some("blue"));
        assert_eq!(got.body.collect().await.unwrap().into_bytes().as_ref(), data.as_slice(), "len {len}");
        let head = c.head_object().bucket("bkt").key(&key).send().await.unwrap();
        assert_eq!(head.content_length(), Some(len as i64));
        if len > 10 {
            let r = c.get_object().bucket("bkt").key(&key).range("bytes=3-9").send().await.unwrap();
            assert_eq!(r.content_range(), Some(format!("bytes 3-9/{len}").as_str()));
            assert_eq!(r.body.collect().await.unwrap().into_bytes().as_ref(), &data[3..10]);
            let r = c.get_object().bucket("bkt").key(&key).range("bytes=-5").send().await.unwrap();
            assert_eq!(r.body.collect().await.unwrap().into_bytes().as_ref(), &data[len - 5..]);
            let r = c.get_object().bucket("bkt").key(&key).range("bytes=7-").send().await.unwrap();
            assert_eq!(r.body.collect().await.unwrap().into_bytes().as_ref(), &data[7..]);
        }
    }
    let e = c.get_object().bucket("bkt").key("obj/1").range("bytes=5-9").send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidRange");
    let e = c.get_object().bucket("bkt").key("missing").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchKey");
    let e = c.get_object().bucket("nobucket").key("k").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchBucket");
    // Overwrite replaces atomically.
    c.put_object().bucket("bkt").key("obj/1").body(ByteStream::from_static(b"new")).send().await.unwrap();
    assert_eq!(get_bytes(&c, "bkt", "obj/1").await, b"new");
    // response-* overrides
    let r = c
        .get_object()
        .bucket("bkt")
        .key("obj/1")
        .response_content_type("application/x-test")
        .response_content_disposition("attachment")
        .send()
        .await
        .unwrap();
    assert_eq!(r.content_type(), Some("application/x-test"));
    assert_eq!(r.content_disposition(), Some("attachment"));
    // Key at the limit and past it.
    let long = "k".repeat(1024);
    c.put_object().bucket("bkt").key(&long).body(ByteStream::from_static(b"x")).send().await.unwrap();
    let e = c
        .put_object()
        .bucket("bkt")
        .key("k".repeat(1025))
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "KeyTooLongError");
    // Metadata at the limit and past it.
    let e = c
        .put_object()
        .bucket("bkt")
        .key("m")
        .metadata("big", "v".repeat(2100))
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "MetadataTooLarge");
    s.stop().await;
}

async fn conditionals(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    let put = c.put_object().bucket("bkt").key("k").body(ByteStream::from_static(b"v1")).send().await.unwrap();
    let etag = put.e_tag().unwrap().to_string();
    c.get_object().bucket("bkt").key("k").if_match(&etag).send().await.unwrap();
    let e = c.get_object().bucket("bkt").key("k").if_match("\"nope\"").send().await.unwrap_err();
    assert_eq!(status(&e), 412);
    let e = c.get_object().bucket("bkt").key("k").if_none_match(&etag).send().await.unwrap_err();
    assert_eq!(status(&e), 304);
    // A 304 names what the client has, for its cache.
    let headers = e.raw_response().expect("a response").headers();
    assert_eq!(headers.get("etag"), Some(etag.as_str()));
    assert!(headers.get("last-modified").is_some_and(|v| v.ends_with("GMT")), "{headers:?}");
    let e = c.head_object().bucket("bkt").key("k").if_none_match(&etag).send().await.unwrap_err();
    assert_eq!(status(&e), 304);
    let future = aws_sdk_s3::primitives::DateTime::from_secs(4_000_000_000);
    let past = aws_sdk_s3::primitives::DateTime::from_secs(1_000_000_000);
    let e = c.get_object().bucket("bkt").key("k").if_modified_since(future).send().await.unwrap_err();
    assert_eq!(status(&e), 304);
    c.get_object().bucket("bkt").key("k").if_modified_since(past).send().await.unwrap();
    let e = c.get_object().bucket("bkt").key("k").if_unmodified_since(past).send().await.unwrap_err();
    assert_eq!(status(&e), 412);
    // Conditional writes.
    let e = c
        .put_object()
        .bucket("bkt")
        .key("k")
        .if_none_match("*")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 412);
    c.put_object()
        .bucket("bkt")
        .key("new")
        .if_none_match("*")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    let e = c
        .put_object()
        .bucket("bkt")
        .key("k")
        .if_match("\"nope\"")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 412);
    c.put_object().bucket("bkt").key("k").if_match(&etag).body(ByteStream::from_static(b"v2")).send().await.unwrap();
    assert_eq!(get_bytes(&c, "bkt", "k").await, b"v2");
    // If-Match on a missing key is NoSuchKey; If-None-Match with an ETag refuses only that ETag.
    for cond in ["*", "\"nope\""] {
        let put = c.put_object().bucket("bkt").key("absent").if_match(cond).body(ByteStream::from_static(b"x"));
        let e = put.send().await.unwrap_err();
        assert_eq!((status(&e), code(&e).as_str()), (404, "NoSuchKey"), "If-Match {cond}");
    }
    let v2 = c.head_object().bucket("bkt").key("k").send().await.unwrap().e_tag.unwrap();
    let put = c.put_object().bucket("bkt").key("k").if_none_match(&v2).body(ByteStream::from_static(b"v3"));
    assert_eq!(status(&put.send().await.unwrap_err()), 412);
    let put = c.put_object().bucket("bkt").key("k").if_none_match("\"other\"").body(ByteStream::from_static(b"v3"));
    put.send().await.unwrap();
    assert_eq!(get_bytes(&c, "bkt", "k").await, b"v3");
    s.stop().await;
}

async fn copy_delete_tags(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    c.create_bucket().bucket("dst").send().await.unwrap();
    let data = body(3 << 20, 9);
    c.put_object()
        .bucket("bkt")
        .key("src")
        .metadata("a", "1")
        .body(ByteStream::from(data.clone()))
        .send()
        .await
        .unwrap();
    let before = s.engine.stats().device_bytes_written;
    c.copy_object().bucket("dst").key("dst").copy_source("bkt/src").send().await.unwrap();
    assert_eq!(s.engine.stats().device_bytes_written, before, "CopyObject must not copy data");
    assert_eq!(get_bytes(&c, "dst", "dst").await, data);
    let h = c.head_object().bucket("dst").key("dst").send().await.unwrap();
    assert_eq!(h.metadata().unwrap().get("a").map(String::as_str), Some("1"));
    c.copy_object()
        .bucket("dst")
        .key("dst2")
        .copy_source("bkt/src")
        .metadata_directive(MetadataDirective::Replace)
        .metadata("b", "2")
        .content_type("x/y")
        .send()
        .await
        .unwrap();
    let h = c.head_object().bucket("dst").key("dst2").send().await.unwrap();
    assert_eq!(h.metadata().unwrap().get("b").map(String::as_str), Some("2"));
    assert!(h.metadata().unwrap().get("a").is_none());
    assert_eq!(h.content_type(), Some("x/y"));
    let e = c
        .copy_object()
        .bucket("dst")
        .key("x")
        .copy_source("bkt/src")
        .copy_source_if_match("\"bad\"")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 412);
    let e = c.copy_object().bucket("dst").key("x").copy_source("bkt/missing").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchKey");
    // Overwriting the source later leaves the copy intact (copy-on-write).
    c.put_object().bucket("bkt").key("src").body(ByteStream::from_static(b"changed")).send().await.unwrap();
    assert_eq!(get_bytes(&c, "dst", "dst").await, data);
    // Tagging.
    let tagging = Tagging::builder().tag_set(Tag::builder().key("t").value("v").build().unwrap()).build().unwrap();
    c.put_object_tagging().bucket("dst").key("dst").tagging(tagging).send().await.unwrap();
    let t = c.get_object_tagging().bucket("dst").key("dst").send().await.unwrap();
    assert_eq!(t.tag_set().len(), 1);
    c.delete_object_tagging().bucket("dst").key("dst").send().await.unwrap();
    assert!(c.get_object_tagging().bucket("dst").key("dst").send().await.unwrap().tag_set().is_empty());
    // DeleteObjects, verbose and quiet; deleting a missing key succeeds.
    let ids = |keys: &[&str]| {
        Delete::builder()
            .set_objects(Some(keys.iter().map(|k| ObjectIdentifier::builder().key(*k).build().unwrap()).collect()))
    };
    let r = c.delete_objects().bucket("dst").delete(ids(&["dst", "nope"]).build().unwrap()).send().await.unwrap();
    assert_eq!(r.deleted().len(), 2);
    let r = c.delete_objects().bucket("dst").delete(ids(&["dst2"]).quiet(true).build().unwrap()).send().await.unwrap();
    assert!(r.deleted().is_empty());
    let e = c.head_object().bucket("dst").key("dst2").send().await.unwrap_err();
    assert_eq!(status(&e), 404);
    // 1,000 keys is the limit of one DeleteObjects request.
    let keys: Vec<String> = (0..1001).map(|i| format!("x{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    c.delete_objects().bucket("dst").delete(ids(&refs[..1000]).quiet(true).build().unwrap()).send().await.unwrap();
    let e = c.delete_objects().bucket("dst").delete(ids(&refs).build().unwrap()).send().await.unwrap_err();
    assert_eq!(code(&e), "MalformedXML");
    c.delete_object().bucket("dst").key("never-existed").send().await.unwrap();
    let check = s.engine.check().unwrap();
    assert!(check.is_clean(), "{check:?}");
    s.stop().await;
}

async fn listing(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    let mut keys = Vec::new();
    for d in ["a", "b", "c"] {
        for i in 0..5 {
            keys.push(format!("{d}/{i}"));
        }
    }
    keys.push("top1".into());
    keys.push("top2".into());
    keys.push("sp ace+ü".into());
    for k in &keys {
        c.put_object().bucket("bkt").key(k).body(ByteStream::from_static(b"x")).send().await.unwrap();
    }
    keys.sort();
    // Flat, paginated by 4.
    let mut got = Vec::new();
    let mut token = None;
    loop {
        let r =
            c.list_objects_v2().bucket("bkt").max_keys(4).set_continuation_token(token.clone()).send().await.unwrap();
        got.extend(r.contents().iter().map(|o| o.key().unwrap().to_string()));
        if r.is_truncated() == Some(true) {
            token = r.next_continuation_token().map(str::to_string);
        } else {
            break;
        }
    }
    assert_eq!(got, keys);
    // Delimiter, paginated by 2: common prefixes count toward max-keys and are not repeated.
    let mut prefixes = Vec::new();
    let mut objects = Vec::new();
    let mut token = None;
    loop {
        let r = c
            .list_objects_v2()
            .bucket("bkt")
            .delimiter("/")
            .max_keys(2)
            .set_continuation_token(token.clone())
            .send()
            .await
            .unwrap();
        prefixes.extend(r.common_prefixes().iter().map(|p| p.prefix().unwrap().to_string()));
        objects.extend(r.contents().iter().map(|o| o.key().unwrap().to_string()));
        if r.is_truncated() == Some(true) {
            token = r.next_continuation_token().map(str::to_string);
        } else {
            break;
        }
    }
    assert_eq!(prefixes, vec!["a/", "b/", "c/"]);
    assert_eq!(objects, vec!["sp ace+ü", "top1", "top2"]);
    let r = c.list_objects_v2().bucket("bkt").prefix("b/").start_after("b/2").send().await.unwrap();
    let ks: Vec<_> = r.contents().iter().map(|o| o.key().unwrap()).collect();
    assert_eq!(ks, vec!["b/3", "b/4"]);
    // v1 with marker.
    let r = c.list_objects().bucket("bkt").marker("c/3").send().await.unwrap();
    let ks: Vec<_> = r.contents().iter().map(|o| o.key().unwrap()).collect();
    assert_eq!(ks, vec!["c/4", "sp ace+ü", "top1", "top2"]);
    // A tampered token is refused; an empty one is no token, echoed.
    let e = c.list_objects_v2().bucket("bkt").continuation_token("garbage!").send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidArgument");
    let r = c.list_objects_v2().bucket("bkt").continuation_token("").send().await.unwrap();
    assert_eq!((r.continuation_token(), r.contents().len()), (Some(""), keys.len()));
    // An empty delimiter groups nothing and is not echoed (v1 and v2).
    let r = c.list_objects_v2().bucket("bkt").delimiter("").send().await.unwrap();
    assert_eq!((r.delimiter(), r.contents().len(), r.common_prefixes().len()), (None, keys.len(), 0));
    let r = c.list_objects().bucket("bkt").delimiter("").send().await.unwrap();
    assert_eq!((r.delimiter(), r.contents().len(), r.common_prefixes().len()), (None, keys.len(), 0));
    s.stop().await;
}

async fn multipart(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    let parts_data = [body(5 << 20, 1), body(5 << 20, 2), body(1234, 3)];
    let up = c.create_multipart_upload().bucket("bkt").key("big").metadata("m", "1").send().await.unwrap();
    let id = up.upload_id().unwrap().to_string();
    let listed = c.list_multipart_uploads().bucket("bkt").send().await.unwrap();
    assert_eq!(listed.uploads().len(), 1);
    let mut done = Vec::new();
    for (i, d) in parts_data.iter().enumerate() {
        let n = i as i32 + 1;
        let r = c
            .upload_part()
            .bucket("bkt")
            .key("big")
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from(d.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.e_tag().unwrap(), format!("\"{}\"", md5_hex(d)));
        done.push(CompletedPart::builder().part_number(n).e_tag(r.e_tag().unwrap()).build());
    }
    let lp = c.list_parts().bucket("bkt").key("big").upload_id(&id).send().await.unwrap();
    assert_eq!(lp.parts().len(), 3);
    // Out of order parts are refused.
    let bad = CompletedMultipartUpload::builder().set_parts(Some(vec![done[1].clone(), done[0].clone()])).build();
    let e = c
        .complete_multipart_upload()
        .bucket("bkt")
        .key("big")
        .upload_id(&id)
        .multipart_upload(bad)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "InvalidPartOrder");
    let before = s.engine.stats().device_bytes_written;
    let all = CompletedMultipartUpload::builder().set_parts(Some(done.clone())).build();
    let r = c
        .complete_multipart_upload()
        .bucket("bkt")
        .key("big")
        .upload_id(&id)
        .multipart_upload(all)
        .send()
        .await
        .unwrap();
    assert!(r.e_tag().unwrap().ends_with("-3\""), "{:?}", r.e_tag());
    assert_eq!(s.engine.stats().device_bytes_written, before, "completion must clone, not copy");
    // A retried completion (the SDK's answer lost) is answered again.
    let all = CompletedMultipartUpload::builder().set_parts(Some(done.clone())).build();
    let again =
        c.complete_multipart_upload().bucket("bkt").key("big").upload_id(&id).multipart_upload(all).send().await;
    assert_eq!(again.unwrap().e_tag(), r.e_tag());
    let whole: Vec<u8> = parts_data.concat();
    assert_eq!(get_bytes(&c, "bkt", "big").await, whole);
    let p2 = c.get_object().bucket("bkt").key("big").part_number(2).send().await.unwrap();
    assert_eq!(p2.parts_count(), Some(3));
    assert_eq!(p2.body.collect().await.unwrap().into_bytes().as_ref(), parts_data[1].as_slice());
    let e = c.get_object().bucket("bkt").key("big").part_number(4).send().await.unwrap_err();
    assert_eq!((status(&e), code(&e)), (400, "InvalidPart".to_string()));
    assert!(c.list_multipart_uploads().bucket("bkt").send().await.unwrap().uploads().is_empty());
    // Too-small part, then abort.
    let up = c.create_multipart_upload().bucket("bkt").key("small").send().await.unwrap();
    let id = up.upload_id().unwrap().to_string();
    let mut done = Vec::new();
    for n in 1..=2 {
        let r = c
            .upload_part()
            .bucket("bkt")
            .key("small")
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from_static(b"tiny"))
            .send()
            .await
            .unwrap();
        done.push(CompletedPart::builder().part_number(n).e_tag(r.e_tag().unwrap()).build());
    }
    let all = CompletedMultipartUpload::builder().set_parts(Some(done)).build();
    let e = c
        .complete_multipart_upload()
        .bucket("bkt")
        .key("small")
        .upload_id(&id)
        .multipart_upload(all)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "EntityTooSmall");
    c.abort_multipart_upload().bucket("bkt").key("small").upload_id(&id).send().await.unwrap();
    let e = c.list_parts().bucket("bkt").key("small").upload_id(&id).send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchUpload");
    // UploadPartCopy with a range.
    let up = c.create_multipart_upload().bucket("bkt").key("copied").send().await.unwrap();
    let id = up.upload_id().unwrap().to_string();
    let r = c
        .upload_part_copy()
        .bucket("bkt")
        .key("copied")
        .upload_id(&id)
        .part_number(1)
        .copy_source("bkt/big")
        .copy_source_range("bytes=100-199")
        .send()
        .await
        .unwrap();
    let etag = r.copy_part_result().unwrap().e_tag().unwrap().to_string();
    let all = CompletedMultipartUpload::builder()
        .set_parts(Some(vec![CompletedPart::builder().part_number(1).e_tag(etag).build()]))
        .build();
    c.complete_multipart_upload()
        .bucket("bkt")
        .key("copied")
        .upload_id(&id)
        .multipart_upload(all)
        .send()
        .await
        .unwrap();
    assert_eq!(get_bytes(&c, "bkt", "copied").await, whole[100..200].to_vec());
    let check = s.engine.check().unwrap();
    assert!(check.is_clean(), "{check:?}");
    s.stop().await;
}

async fn checksums_and_append(default_checksums: bool) {
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    for algo in
        [ChecksumAlgorithm::Crc32, ChecksumAlgorithm::Crc32C, ChecksumAlgorithm::Crc64Nvme, ChecksumAlgorithm::Sha256]
    {
        let data = body(100_000, 5);
        let key = format!("sum/{}", algo.as_str());
        c.put_object()
            .bucket("bkt")
            .key(&key)
            .checksum_algorithm(algo.clone())
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        let h = c.head_object().bucket("bkt").key(&key).checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
        let stored = match algo {
            ChecksumAlgorithm::Crc32 => h.checksum_crc32(),
            ChecksumAlgorithm::Crc32C => h.checksum_crc32_c(),
            ChecksumAlgorithm::Crc64Nvme => h.checksum_crc64_nvme(),
            _ => h.checksum_sha256(),
        };
        assert!(stored.is_some(), "{algo:?} not stored");
        let g = c.get_object().bucket("bkt").key(&key).checksum_mode(ChecksumMode::Enabled).send().await.unwrap();
        assert_eq!(g.body.collect().await.unwrap().into_bytes().as_ref(), data.as_slice());
    }
    // A wrong checksum in a header is refused and nothing is stored.
    let e = c
        .put_object()
        .bucket("bkt")
        .key("wrong")
        .checksum_crc32("AAAAAA==")
        .body(ByteStream::from_static(b"hello"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "BadDigest");
    let e = c.head_object().bucket("bkt").key("wrong").send().await.unwrap_err();
    assert_eq!(status(&e), 404);
    // Append (S3 Express semantics): the offset must equal the size.
    c.put_object().bucket("bkt").key("log").body(ByteStream::from(vec![1u8; 2048])).send().await.unwrap();
    c.put_object()
        .bucket("bkt")
        .key("log")
        .write_offset_bytes(2048)
        .body(ByteStream::from(vec![2u8; 2048]))
        .send()
        .await
        .unwrap();
    let e = c
        .put_object()
        .bucket("bkt")
        .key("log")
        .write_offset_bytes(1)
        .body(ByteStream::from(vec![3u8; 10]))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(&e), "InvalidWriteOffset");
    let got = get_bytes(&c, "bkt", "log").await;
    assert_eq!(got.len(), 4096);
    assert!(got[..2048].iter().all(|b| *b == 1) && got[2048..].iter().all(|b| *b == 2));
    // A listing shows what HEAD shows after the append (size, ETag, time), and after a copy.
    c.copy_object().bucket("bkt").key("log-copy").copy_source("bkt/log").send().await.unwrap();
    let listed = c.list_objects_v2().bucket("bkt").prefix("log").send().await.unwrap();
    let listed = listed.contents();
    assert_eq!(listed.len(), 2);
    for o in listed {
        let head = c.head_object().bucket("bkt").key(o.key().unwrap()).send().await.unwrap();
        assert_eq!((o.size(), o.e_tag()), (Some(4096), head.e_tag()), "{o:?}");
        // HEAD's Last-Modified is an HTTP date: whole seconds.
        assert_eq!(o.last_modified().unwrap().secs(), head.last_modified().unwrap().secs(), "{o:?}");
    }
    s.stop().await;
}

async fn auth() {
    let s = TestServer::start().await;
    let bad = client_with(&s.url(), ACCESS_KEY, "wrong-secret-key-wrong-secret-key", true);
    let e = bad.list_buckets().send().await.unwrap_err();
    assert_eq!(code(&e), "SignatureDoesNotMatch");
    let unknown = client_with(&s.url(), "NOBODY", SECRET_KEY, true);
    let e = unknown.list_buckets().send().await.unwrap_err();
    assert_eq!(status(&e), 403);
    // Anonymous requests see no bucket and are refused private ones; every error carries a request id.
    let r = reqwest::get(format!("{}/", s.url())).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("<Bucket>"), "{text}");
    s.client(true).create_bucket().bucket("private").send().await.unwrap();
    let r = reqwest::get(format!("{}/private", s.url())).await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.headers().get("x-amz-request-id").is_some());
    let text = r.text().await.unwrap();
    assert!(text.contains("<Code>AccessDenied</Code>") && text.contains("<RequestId>"), "{text}");
    s.stop().await;
}

async fn bucket_tags_and_object_attributes(default_checksums: bool) {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, ObjectAttributes, Tag, Tagging};
    let s = TestServer::start().await;
    let c = s.client(default_checksums);
    c.create_bucket().bucket("tagged").send().await.unwrap();
    let e = c.get_bucket_tagging().bucket("tagged").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchTagSet");
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build().unwrap();
    let tagging = Tagging::builder().tag_set(tag("team", "storage")).tag_set(tag("tier", "hot")).build().unwrap();
    c.put_bucket_tagging().bucket("tagged").tagging(tagging).send().await.unwrap();
    let got = c.get_bucket_tagging().bucket("tagged").send().await.unwrap();
    let pairs: Vec<(&str, &str)> = got.tag_set().iter().map(|t| (t.key(), t.value())).collect();
    assert_eq!(pairs, [("team", "storage"), ("tier", "hot")]);
    let twice = Tagging::builder().tag_set(tag("a", "1")).tag_set(tag("a", "2")).build().unwrap();
    let e = c.put_bucket_tagging().bucket("tagged").tagging(twice).send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidTag");
    let mut many = Tagging::builder();
    for i in 0..=mosaic_layer::MAX_BUCKET_TAGS {
        many = many.tag_set(tag(&format!("k{i}"), "v"));
    }
    let e = c.put_bucket_tagging().bucket("tagged").tagging(many.build().unwrap()).send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidTag");
    c.delete_bucket_tagging().bucket("tagged").send().await.unwrap();
    let e = c.get_bucket_tagging().bucket("tagged").send().await.unwrap_err();
    assert_eq!(code(&e), "NoSuchTagSet");

    // GetObjectAttributes: what was asked for, parts of a multipart object paged.
    c.put_object().bucket("tagged").key("small").body(b"foo".to_vec().into()).send().await.unwrap();
    let all = [
        ObjectAttributes::Etag,
        ObjectAttributes::ObjectSize,
        ObjectAttributes::StorageClass,
        ObjectAttributes::ObjectParts,
    ];
    let a = c
        .get_object_attributes()
        .bucket("tagged")
        .key("small")
        .set_object_attributes(Some(all.to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(a.object_size(), Some(3));
    // S3 answers this ETag (alone of all) without quotes.
    assert_eq!(a.e_tag(), Some("acbd18db4cc2f85cedef654fccc4a4d8"));
    assert!(a.object_parts().is_none(), "a simple PUT has no parts");
    let only_size = c
        .get_object_attributes()
        .bucket("tagged")
        .key("small")
        .object_attributes(ObjectAttributes::ObjectSize)
        .send()
        .await
        .unwrap();
    assert!(only_size.e_tag().is_none());
    let id = c.create_multipart_upload().bucket("tagged").key("mp").send().await.unwrap().upload_id.unwrap();
    let mut done = CompletedMultipartUpload::builder();
    for n in 1..=3 {
        let body = vec![n as u8; if n < 3 { 5 << 20 } else { 10 }];
        let p = c.upload_part().bucket("tagged").key("mp").upload_id(&id).part_number(n).body(body.into()).send().await;
        done = done.parts(CompletedPart::builder().part_number(n).e_tag(p.unwrap().e_tag.unwrap()).build());
    }
    c.complete_multipart_upload()
        .bucket("tagged")
        .key("mp")
        .upload_id(&id)
        .multipart_upload(done.build())
        .send()
        .await
        .unwrap();
    let a = c
        .get_object_attributes()
        .bucket("tagged")
        .key("mp")
        .set_object_attributes(Some(all.to_vec()))
        .max_parts(2)
        .send()
        .await
        .unwrap();
    let parts = a.object_parts().unwrap();
    assert_eq!(parts.total_parts_count(), Some(3));
    assert_eq!(parts.is_truncated(), Some(true));
    let sizes: Vec<_> = parts.parts().iter().map(|p| (p.part_number(), p.size())).collect();
    assert_eq!(sizes, [(Some(1), Some(5 << 20)), (Some(2), Some(5 << 20))]);
    let e =
        c.get_object_attributes().bucket("tagged").key("none").object_attributes(ObjectAttributes::Etag).send().await;
    assert_eq!(status(&e.unwrap_err()), 404);
    s.stop().await;
}

macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_default_checksums() {
                super::$name(true).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_checksums_when_required() {
                super::$name(false).await;
            }
        }
    };
}

both_modes!(buckets);
both_modes!(objects);
both_modes!(conditionals);
both_modes!(copy_delete_tags);
both_modes!(listing);
both_modes!(multipart);
both_modes!(checksums_and_append);
both_modes!(bucket_tags_and_object_attributes);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication() {
    auth().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presigned_urls() {
    use aws_sdk_s3::presigning::PresigningConfig;
    use std::time::{Duration, SystemTime};
    let s = TestServer::start().await;
    let c = s.client(true);
    c.create_bucket().bucket("pre").send().await.unwrap();
    let http = reqwest::Client::new();
    // PUT through a presigned URL, then GET through another.
    let put = c
        .put_object()
        .bucket("pre")
        .key("doc.txt")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    let r = http.put(put.uri()).body("presigned body").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let get = c
        .get_object()
        .bucket("pre")
        .key("doc.txt")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    let r = http.get(get.uri()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "presigned body");
    // A tampered URL (another key) is refused.
    let tampered = get.uri().replace("doc.txt", "other.txt");
    let r = http.get(&tampered).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("SignatureDoesNotMatch"));
    // An expired URL is refused.
    let old = PresigningConfig::builder()
        .start_time(SystemTime::now() - Duration::from_secs(3600))
        .expires_in(Duration::from_secs(60))
        .build()
        .unwrap();
    let expired = c.get_object().bucket("pre").key("doc.txt").presigned(old).await.unwrap();
    let r = http.get(expired.uri()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("AccessDenied"));
    // A body sent chunked without Content-Length (curl -T -): read whole up to 64 MiB, refused past that.
    let chunked = |total: usize| {
        let chunks = (0..total.div_ceil(1 << 20)).map(move |i| {
            let n = (total - i * (1 << 20)).min(1 << 20);
            Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'c'; n]))
        });
        reqwest::Body::wrap_stream(futures::stream::iter(chunks))
    };
    let r = http.put(put.uri()).body(chunked(3 << 20)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let head = c.head_object().bucket("pre").key("doc.txt").send().await.unwrap();
    assert_eq!(head.content_length(), Some(3 << 20));
    let r = http.put(put.uri()).body(chunked((64 << 20) + 1)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 411);
    assert!(r.text().await.unwrap().contains("MissingContentLength"));
    // Valid for more than 7 days, or for none: refused before the signature is looked at.
    for expires in ["604801", "-7", "x"] {
        let long = get.uri().replace("X-Amz-Expires=300", &format!("X-Amz-Expires={expires}"));
        let r = http.get(&long).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{expires}");
        assert!(r.text().await.unwrap().contains("AuthorizationQueryParametersError"));
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_host_style() {
    use aws_sdk_s3::presigning::PresigningConfig;
    use std::time::Duration;
    let s = TestServer::start_full(256 << 20, Some("s3.mosaic.test")).await;
    // Path style to the IP address keeps working with a domain configured.
    let path_style = s.client(true);
    path_style.create_bucket().bucket("vhost").send().await.unwrap();
    path_style
        .put_object()
        .bucket("vhost")
        .key("dir/k")
        .body(ByteStream::from_static(b"by host"))
        .send()
        .await
        .unwrap();
    // A virtual-host-style client; its requests are routed to the test server by name.
    let port = s.addr.port();
    let creds = aws_sdk_s3::config::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test");
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(format!("http://s3.mosaic.test:{port}"))
        .credentials_provider(creds)
        .force_path_style(false)
        .build();
    let vhost = aws_sdk_s3::Client::from_conf(conf);
    let get = vhost
        .get_object()
        .bucket("vhost")
        .key("dir/k")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    assert!(get.uri().starts_with(&format!("http://vhost.s3.mosaic.test:{port}/dir/k")), "{}", get.uri());
    let http = reqwest::Client::builder().resolve("vhost.s3.mosaic.test", s.addr).build().unwrap();
    let r = http.get(get.uri()).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, "by host");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_full_is_an_s3_error_and_recoverable() {
    let s = TestServer::start_with(24 << 20).await;
    let c = s.client(true);
    c.create_bucket().bucket("full").send().await.unwrap();
    let mut stored = Vec::new();
    let err = loop {
        let key = format!("k{}", stored.len());
        let data = body(2 << 20, stored.len() as u8);
        match c.put_object().bucket("full").key(&key).body(ByteStream::from(data.clone())).send().await {
            Ok(_) => stored.push((key, data)),
            Err(e) => break e,
        }
        assert!(stored.len() < 100, "the drive never filled up");
    };
    assert_eq!(status(&err), 507);
    assert_eq!(code(&err), "InsufficientStorage");
    // Nothing stored before is damaged.
    for (k, d) in &stored {
        assert_eq!(&get_bytes(&c, "full", k).await, d);
    }
    // Deleting makes room again.
    for (k, _) in stored.iter().take(3) {
        c.delete_object().bucket("full").key(k).send().await.unwrap();
    }
    c.put_object().bucket("full").key("after").body(ByteStream::from(body(2 << 20, 7))).send().await.unwrap();
    assert!(s.engine.check().unwrap().is_clean());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_pages_tag_counts_attributes_and_policy_status() {
    use aws_sdk_s3::types::{BucketCannedAcl, ObjectAttributes, Tag, Tagging};
    let s = TestServer::start().await;
    let c = s.client(true);
    for b in ["pga", "pgb", "pgc", "qga"] {
        c.create_bucket().bucket(b).send().await.unwrap();
    }
    // ListBuckets in pages of two, and by prefix.
    let first = c.list_buckets().max_buckets(2).send().await.unwrap();
    let names = |o: &aws_sdk_s3::operation::list_buckets::ListBucketsOutput| {
        o.buckets().iter().filter_map(|b| b.name().map(str::to_string)).collect::<Vec<_>>()
    };
    assert_eq!(names(&first), ["pga", "pgb"]);
    let token = first.continuation_token().unwrap().to_string();
    let second = c.list_buckets().max_buckets(2).continuation_token(token).send().await.unwrap();
    assert_eq!(names(&second), ["pgc", "qga"]);
    assert_eq!(second.continuation_token(), None);
    let q = c.list_buckets().prefix("q").send().await.unwrap();
    assert_eq!(names(&q), ["qga"]);
    let e = c.list_buckets().max_buckets(0).send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidArgument");
    let e = c.list_buckets().continuation_token("not a token").send().await.unwrap_err();
    assert_eq!(code(&e), "InvalidArgument");

    // The tag count (HEAD's header is checked through boto3, whose responses show raw headers).
    c.put_object().bucket("pga").key("k").body(ByteStream::from_static(b"abc")).send().await.unwrap();
    let tags = Tagging::builder()
        .tag_set(Tag::builder().key("a").value("1").build().unwrap())
        .tag_set(Tag::builder().key("b").value("2").build().unwrap())
        .build()
        .unwrap();
    c.put_object_tagging().bucket("pga").key("k").tagging(tags).send().await.unwrap();
    let raw = c.get_object().bucket("pga").key("k").send().await.unwrap();
    assert_eq!(raw.tag_count(), Some(2));
    // GetObjectAttributes takes several attributes in one header value, as botocore sends them.
    let attrs = c
        .get_object_attributes()
        .bucket("pga")
        .key("k")
        .object_attributes(ObjectAttributes::ObjectSize)
        .object_attributes(ObjectAttributes::Etag)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.object_size(), Some(3));
    assert!(attrs.e_tag().is_some());

    // Policy status: public by ACL without any policy.
    let st = c.get_bucket_policy_status().bucket("pgb").send().await.unwrap();
    assert_eq!(st.policy_status().and_then(|p| p.is_public()), Some(false));
    c.put_bucket_acl().bucket("pgb").acl(BucketCannedAcl::PublicRead).send().await.unwrap();
    let st = c.get_bucket_policy_status().bucket("pgb").send().await.unwrap();
    assert_eq!(st.policy_status().and_then(|p| p.is_public()), Some(true));
    s.stop().await;
}
