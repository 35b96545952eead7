//! Encryption at rest end to end, through aws-sdk-s3 against a real `mosaic server`: SSE-S3, SSE-KMS and
//! SSE-C objects read back whole and by range, keys are required and checked, copies and multipart
//! uploads re-encrypt, a bucket's default applies; no plaintext of an encrypted object reaches any file
//! of the data directory; the master key survives a restart and a rotation; SSE-C is refused over plain
//! HTTP unless the server allows it.

mod support;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    CompletedMultipartUpload, CompletedPart, ServerSideEncryption, ServerSideEncryptionByDefault,
    ServerSideEncryptionConfiguration, ServerSideEncryptionRule,
};
use base64::Engine;
use md5::{Digest, Md5};
use support::{s3_client, start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";
const ENV: [(&str, &str); 2] = [("MOSAIC_KMS_KEYS", "k1,k2"), ("MOSAIC_SSE_C_OVER_HTTP", "true")];

/// An SSE-C key: (base64 key, base64 MD5 of it).
fn customer(seed: u8) -> (String, String) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = [seed; 32];
    (b64.encode(key), b64.encode(Md5::digest(key)))
}

/// Bytes no file holds by chance: a marker repeated through the body, with a counter so that no two
/// 64-byte windows are equal (nothing compresses it away).
fn marked(marker: &str, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while v.len() < len {
        v.extend_from_slice(format!("{marker}-{i:016}|").as_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

/// Whether any file under `dir` contains `needle`.
fn found_in_files(dir: &std::path::Path, needle: &[u8]) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).unwrap().windows(needle.len()).any(|w| w == needle) {
                return true;
            }
        }
    }
    false
}

async fn body(o: aws_sdk_s3::operation::get_object::GetObjectOutput) -> Vec<u8> {
    o.body.collect().await.unwrap().to_vec()
}

fn error_of<E: ProvideErrorMetadata>(e: &E) -> String {
    e.code().unwrap_or("?").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_objects_read_back_and_never_reach_the_disk_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let s = start_with_root(&data_dir, ROOT_AK, ROOT_SK, &ENV);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    c.create_bucket().bucket("enc").send().await.unwrap();
    let plain = marked("PLAINCONTROL", 1 << 20);
    let secret = marked("SSES3SECRET", 1 << 20);
    c.put_object().bucket("enc").key("plain").body(ByteStream::from(plain.clone())).send().await.unwrap();
    let put = c
        .put_object()
        .bucket("enc")
        .key("s3")
        .server_side_encryption(ServerSideEncryption::Aes256)
        .body(ByteStream::from(secret.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(put.server_side_encryption(), Some(&ServerSideEncryption::Aes256));
    assert_eq!(put.e_tag(), Some(format!("\"{}\"", hex::encode(Md5::digest(&secret))).as_str()));
    let got = c.get_object().bucket("enc").key("s3").range("bytes=65530-200000").send().await.unwrap();
    assert_eq!(got.server_side_encryption(), Some(&ServerSideEncryption::Aes256));
    assert_eq!(body(got).await, &secret[65530..200001]);
    let head = c.head_object().bucket("enc").key("s3").send().await.unwrap();
    assert_eq!(head.content_length(), Some(1 << 20));

    // SSE-KMS with a served key id; an unknown one is refused.
    let kms = marked("SSEKMSSECRET", 300_000);
    let put = c
        .put_object()
        .bucket("enc")
        .key("kms")
        .server_side_encryption(ServerSideEncryption::AwsKms)
        .ssekms_key_id("k2")
        .body(ByteStream::from(kms.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(put.ssekms_key_id(), Some("k2"));
    assert_eq!(body(c.get_object().bucket("enc").key("kms").send().await.unwrap()).await, kms);
    let unknown = c
        .put_object()
        .bucket("enc")
        .key("x")
        .server_side_encryption(ServerSideEncryption::AwsKms)
        .ssekms_key_id("k3")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_of(&unknown), "KMS.NotFoundException");

    // SSE-C: required, checked, and a multipart upload needs it with every part.
    let (key_a, md5_a) = customer(1);
    let (key_b, md5_b) = customer(2);
    let ssec = marked("SSECSECRET", 200_000);
    c.put_object()
        .bucket("enc")
        .key("c")
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key_a)
        .sse_customer_key_md5(&md5_a)
        .body(ByteStream::from(ssec.clone()))
        .send()
        .await
        .unwrap();
    let no_key = c.get_object().bucket("enc").key("c").send().await.unwrap_err();
    assert_eq!(error_of(&no_key), "InvalidRequest");
    let get_c = |k: &str, m: &str| {
        c.get_object()
            .bucket("enc")
            .key("c")
            .sse_customer_algorithm("AES256")
            .sse_customer_key(k)
            .sse_customer_key_md5(m)
    };
    assert_eq!(error_of(&get_c(&key_b, &md5_b).send().await.unwrap_err()), "InvalidRequest");
    let got = get_c(&key_a, &md5_a).range("bytes=100-199").send().await.unwrap();
    assert_eq!(got.sse_customer_key_md5(), Some(md5_a.as_str()));
    assert_eq!(body(got).await, &ssec[100..200]);
    let upload = c
        .create_multipart_upload()
        .bucket("enc")
        .key("mp")
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key_a)
        .sse_customer_key_md5(&md5_a)
        .send()
        .await
        .unwrap();
    let id = upload.upload_id().unwrap();
    let parts_data = [marked("MPPARTONE", 5 << 20), marked("MPPARTTWO", 1000)];
    let mut parts = Vec::new();
    for (i, d) in parts_data.iter().enumerate() {
        let p = c
            .upload_part()
            .bucket("enc")
            .key("mp")
            .upload_id(id)
            .part_number(i as i32 + 1)
            .sse_customer_algorithm("AES256")
            .sse_customer_key(&key_a)
            .sse_customer_key_md5(&md5_a)
            .body(ByteStream::from(d.clone()))
            .send()
            .await
            .unwrap();
        parts.push(CompletedPart::builder().part_number(i as i32 + 1).e_tag(p.e_tag().unwrap()).build());
    }
    let without_key =
        c.upload_part().bucket("enc").key("mp").upload_id(id).part_number(3).body(ByteStream::from_static(b"x"));
    assert_eq!(error_of(&without_key.send().await.unwrap_err()), "InvalidRequest");
    c.complete_multipart_upload()
        .bucket("enc")
        .key("mp")
        .upload_id(id)
        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key_a)
        .sse_customer_key_md5(&md5_a)
        .send()
        .await
        .unwrap();
    let whole = c
        .get_object()
        .bucket("enc")
        .key("mp")
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key_a)
        .sse_customer_key_md5(&md5_a)
        .send()
        .await
        .unwrap();
    assert_eq!(body(whole).await, parts_data.concat());

    // A copy from SSE-C to SSE-S3 reads and writes again.
    c.copy_object()
        .bucket("enc")
        .key("c-copy")
        .copy_source("enc/c")
        .copy_source_sse_customer_algorithm("AES256")
        .copy_source_sse_customer_key(&key_a)
        .copy_source_sse_customer_key_md5(&md5_a)
        .server_side_encryption(ServerSideEncryption::Aes256)
        .send()
        .await
        .unwrap();
    assert_eq!(body(c.get_object().bucket("enc").key("c-copy").send().await.unwrap()).await, ssec);

    // The bucket's default encryption.
    let rule = ServerSideEncryptionRule::builder()
        .apply_server_side_encryption_by_default(
            ServerSideEncryptionByDefault::builder()
                .sse_algorithm(ServerSideEncryption::AwsKms)
                .kms_master_key_id("k1")
                .build()
                .unwrap(),
        )
        .build();
    let config = ServerSideEncryptionConfiguration::builder().rules(rule).build().unwrap();
    c.put_bucket_encryption().bucket("enc").server_side_encryption_configuration(config).send().await.unwrap();
    let defaulted = marked("DEFAULTSECRET", 100_000);
    let put = c.put_object().bucket("enc").key("d").body(ByteStream::from(defaulted.clone())).send().await.unwrap();
    assert_eq!((put.server_side_encryption(), put.ssekms_key_id()), (Some(&ServerSideEncryption::AwsKms), Some("k1")));

    // On disk: the control's plaintext is there (the scan works), no encrypted body's is.
    let (code, _) = stop(s);
    assert_eq!(code, 0);
    assert!(found_in_files(&data_dir, b"PLAINCONTROL-0000000000000007|"), "the scan finds plaintext");
    for marker in ["SSES3SECRET", "SSEKMSSECRET", "SSECSECRET", "MPPARTONE", "MPPARTTWO", "DEFAULTSECRET"] {
        let needle = format!("{marker}-0000000000000007|");
        assert!(!found_in_files(&data_dir, needle.as_bytes()), "{marker} is on disk in the clear");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data_dir.join("sse-keys")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // The master key survives a restart; a rotation keeps the old objects readable and seals new ones.
    let (code, out, err) = support::run(&["sse", "rotate", "--data", data_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("master key 2"), "{out}");
    let s = start_with_root(&data_dir, ROOT_AK, ROOT_SK, &ENV);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    assert_eq!(body(c.get_object().bucket("enc").key("s3").send().await.unwrap()).await, secret);
    assert_eq!(body(c.get_object().bucket("enc").key("kms").send().await.unwrap()).await, kms);
    assert_eq!(body(c.get_object().bucket("enc").key("d").send().await.unwrap()).await, defaulted);
    let fresh = marked("AFTERROTATION", 70_000);
    c.put_object()
        .bucket("enc")
        .key("s3")
        .server_side_encryption(ServerSideEncryption::Aes256)
        .body(ByteStream::from(fresh.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(body(c.get_object().bucket("enc").key("s3").send().await.unwrap()).await, fresh);

    // A rotation of the running server seals at once, and what it sealed opens after a restart.
    let rotated = support::json(support::admin(&s, ROOT_AK, ROOT_SK, &["sse", "rotate"]));
    assert_eq!(rotated["sealing"], 3, "{rotated}");
    let online = marked("ONLINEROTATION", 50_000);
    let put = c.put_object().bucket("enc").key("online").body(ByteStream::from(online.clone()));
    put.server_side_encryption(ServerSideEncryption::Aes256).send().await.unwrap();
    let keys_file = std::fs::read_to_string(data_dir.join("sse-keys")).unwrap();
    assert!(keys_file.contains("key=3:") && keys_file.contains("key=1:"), "saved before it sealed");
    stop(s);
    let s = start_with_root(&data_dir, ROOT_AK, ROOT_SK, &ENV);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    for (key, want) in [("online", &online), ("s3", &fresh), ("kms", &kms), ("d", &defaulted)] {
        assert_eq!(&body(c.get_object().bucket("enc").key(key).send().await.unwrap()).await, want, "{key}");
    }
    stop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_keys_are_refused_over_plain_http_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let s = start_with_root(dir.path(), ROOT_AK, ROOT_SK, &[]);
    let c = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    c.create_bucket().bucket("bkt").send().await.unwrap();
    let (key, md5) = customer(1);
    let e = c
        .put_object()
        .bucket("bkt")
        .key("k")
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key)
        .sse_customer_key_md5(&md5)
        .body(ByteStream::from_static(b"secret"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_of(&e), "InvalidRequest");
    assert!(e.message().unwrap_or("").contains("secure connection"), "{e:?}");
    // Without KMS keys configured, SSE-KMS is refused; SSE-S3 works with the generated master key.
    let e = c
        .put_object()
        .bucket("bkt")
        .key("k")
        .server_side_encryption(ServerSideEncryption::AwsKms)
        .ssekms_key_id("k1")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(error_of(&e), "KMS.NotFoundException");
    c.put_object()
        .bucket("bkt")
        .key("k")
        .server_side_encryption(ServerSideEncryption::Aes256)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    stop(s);
}
