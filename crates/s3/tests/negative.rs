//! Requests no SDK would send, signed properly so they reach the parsers: a wrong checksum in an
//! aws-chunked trailer, malformed, garbage, deeply nested and oversize XML bodies, and a part number past
//! the limit. Each gets the right S3 error, nothing is stored, and the server keeps serving.

mod common;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use common::{ACCESS_KEY, SECRET_KEY, TestServer, code, status};
use std::time::SystemTime;

/// Sends a SigV4-signed request whose payload hash is `payload_hash` (the body itself is not signed).
async fn send_signed(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let identity = Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(()).unwrap();
    let host = req.uri().authority().unwrap().to_string();
    req.headers_mut().insert("host", host.parse().unwrap());
    let pairs: Vec<(String, String)> =
        req.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string())).collect();
    let signable = SignableRequest::new(
        method,
        url,
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Precomputed(payload_hash.to_string()),
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    instructions.apply_to_request_http1x(&mut req);
    let client = reqwest::Client::new();
    let mut r = client.request(method.parse().unwrap(), url);
    for (k, v) in req.headers() {
        if k != "host" {
            r = r.header(k, v);
        }
    }
    let resp = r.body(body).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn xml_code(body: &str) -> &str {
    body.split("<Code>").nth(1).and_then(|s| s.split("</Code>").next()).unwrap_or("")
}

fn chunked(data: &[u8], trailer: &str) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", data.len()).into_bytes();
    v.extend_from_slice(data);
    v.extend_from_slice(format!("\r\n0\r\n{trailer}\r\n\r\n").as_bytes());
    v
}

#[tokio::test]
async fn a_wrong_trailing_checksum_is_refused_and_nothing_is_stored() {
    let s = TestServer::start().await;
    let c = s.client(false);
    c.create_bucket().bucket("neg").send().await.unwrap();
    let url = format!("{}/neg/obj", s.url());
    let headers = [
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "5"),
        ("x-amz-trailer", "x-amz-checksum-crc32"),
    ];
    // crc32("hello") is 0x3610a686 = NhCmhg==; first a correct trailer, so the path itself is proven to work.
    let (st, body) = send_signed(
        "PUT",
        &url,
        &headers,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        chunked(b"hello", "x-amz-checksum-crc32:NhCmhg=="),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    c.delete_object().bucket("neg").key("obj").send().await.unwrap();
    let (st, body) = send_signed(
        "PUT",
        &url,
        &headers,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        chunked(b"hello", "x-amz-checksum-crc32:AAAAAA=="),
    )
    .await;
    assert_eq!((st, xml_code(&body)), (400, "BadDigest"), "{body}");
    assert!(body.contains("<RequestId>"), "{body}");
    let e = c.head_object().bucket("neg").key("obj").send().await.unwrap_err();
    assert_eq!(status(&e), 404, "a refused upload stores nothing");
    s.stop().await;
}

#[tokio::test]
async fn bad_xml_bodies_get_malformed_xml_and_the_server_keeps_serving() {
    let s = TestServer::start().await;
    let c = s.client(false);
    c.create_bucket().bucket("neg").send().await.unwrap();
    c.put_object().bucket("neg").key("keep").body(b"kept".to_vec().into()).send().await.unwrap();
    let up = c.create_multipart_upload().bucket("neg").key("mp").send().await.unwrap();
    let upload_id = up.upload_id().unwrap().to_string();
    let complete_url = format!("{}/neg/mp?uploadId={upload_id}", s.url());
    let delete_url = format!("{}/neg?delete", s.url());
    let nested = format!("{}{}", "<a>".repeat(100_000), "</a>".repeat(100_000));
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("POST", &complete_url, b"<CompleteMultipartUpload><Part>".to_vec()),
        ("POST", &complete_url, vec![0xff, 0xfe, 0x00, 0x01, b'<']),
        ("POST", &complete_url, nested.clone().into_bytes()),
        ("POST", &delete_url, b"<Delete><Object><Key>a</Key>".to_vec()),
        ("POST", &delete_url, b"not xml at all".to_vec()),
        ("POST", &delete_url, nested.into_bytes()),
    ];
    for (method, url, body) in cases {
        let head: String = String::from_utf8_lossy(&body[..body.len().min(24)]).into();
        let (st, text) = send_signed(method, url, &[], "UNSIGNED-PAYLOAD", body).await;
        assert_eq!((st, xml_code(&text)), (400, "MalformedXML"), "{url} {head:?}: {text}");
    }
    // Past the XML body bound (2 MiB): refused without being parsed.
    let mut big = b"<Delete>".to_vec();
    while big.len() <= 3 << 20 {
        big.extend_from_slice(b"<Object><Key>k</Key></Object>");
    }
    big.extend_from_slice(b"</Delete>");
    let (st, text) = send_signed("POST", &delete_url, &[], "UNSIGNED-PAYLOAD", big).await;
    assert_eq!((st, xml_code(&text)), (400, "MaxMessageLengthExceeded"), "{text}");
    assert!(text.contains("<RequestId>"), "{text}");
    // Still serving, nothing lost; the upload is still there to complete or abort.
    let got = c.get_object().bucket("neg").key("keep").send().await.unwrap();
    assert_eq!(got.body.collect().await.unwrap().to_vec(), b"kept");
    c.abort_multipart_upload().bucket("neg").key("mp").upload_id(&upload_id).send().await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn part_numbers_past_the_limit_are_refused() {
    let s = TestServer::start().await;
    let c = s.client(false);
    c.create_bucket().bucket("neg").send().await.unwrap();
    let up = c.create_multipart_upload().bucket("neg").key("mp").send().await.unwrap();
    let id = up.upload_id().unwrap();
    for n in [0, 10_001] {
        let e = c
            .upload_part()
            .bucket("neg")
            .key("mp")
            .upload_id(id)
            .part_number(n)
            .body(b"x".to_vec().into())
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(&e), "InvalidArgument", "part {n}");
    }
    c.upload_part()
        .bucket("neg")
        .key("mp")
        .upload_id(id)
        .part_number(10_000)
        .body(b"x".to_vec().into())
        .send()
        .await
        .unwrap();
    s.stop().await;
}
