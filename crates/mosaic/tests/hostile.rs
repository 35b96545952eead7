//! Hostile requests against the real server process: malformed and truncated HTTP, huge and too many
//! headers, slow-loris connections, bodies shorter or longer than Content-Length, invalid UTF-8 and path
//! tricks in keys, stale signatures. Each gets an error (never a 5xx), nothing partial is stored, other
//! clients are not stalled, memory stays bounded, and the server keeps serving.

mod support;

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::{s3_client, start_with_root, stop};

const AK: &str = "hostilekey";
const SK: &str = "hostilesecret-0123456789";

/// Sends raw bytes, closes the write side, returns everything the server answered. The read timeout only
/// guards against a hang (a failure), it does not synchronize anything.
fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of every response in `text`.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ").filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok()).collect()
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// A presigned request's path and query, for writing it by hand.
async fn presigned_path(req: aws_sdk_s3::presigning::PresignedRequest) -> String {
    let uri: http::Uri = req.uri().parse().unwrap();
    uri.path_and_query().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_errors_and_the_server_stays_up() {
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), AK, SK, &[]);
    let addr = s.s3.clone();
    let c = s3_client(&addr, AK, SK);
    c.create_bucket().bucket("hostile").send().await.unwrap();
    let pid = s.child.id();
    let rss_before = rss_kib(pid);

    // Malformed HTTP.
    let huge_header = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let many_headers =
        format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", (0..500).map(|i| format!("X-H{i}: v\r\n")).collect::<String>());
    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        ("garbage", b"GARBAGE\r\n\r\n".to_vec(), &[400]),
        ("binary", vec![0u8, 1, 2, 0xff, b'\r', b'\n', b'\r', b'\n'], &[400]),
        ("bad version", b"GET / HTTP/7.0\r\nHost: x\r\n\r\n".to_vec(), &[400, 505]),
        ("huge header", huge_header.into_bytes(), &[431, 400]),
        ("too many headers", many_headers.into_bytes(), &[431, 400]),
        ("invalid utf-8 key", b"GET /hostile/%FF%FE HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), &[400, 403]),
        ("dot segments", b"GET /hostile/../hostile/x HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), &[400, 403]),
        ("NUL in path", b"GET /hostile/a%00b HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), &[400, 403]),
        ("unsigned write", b"PUT /hostile/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".to_vec(), &[403]),
    ];
    for (name, bytes, want) in cases {
        let answer = raw(&addr, &bytes);
        let st = statuses(&answer);
        assert!(st.first().is_some_and(|s| want.contains(s)), "{name}: {:?}", answer.lines().next());
    }
    // Truncated requests: the connection just ends.
    for bytes in [&b"GET /hostile HTTP/1.1\r\nHost: x"[..], b"PUT /hostile/k HTTP/1.1\r\nContent-Len"] {
        let answer = raw(&addr, bytes);
        assert!(statuses(&answer).iter().all(|s| *s < 500), "{answer}");
    }

    // A body shorter than its Content-Length stores nothing; a longer one stores exactly Content-Length
    // bytes and the rest is a malformed next request.
    let pc = PresigningConfig::expires_in(Duration::from_secs(300)).unwrap();
    let short =
        presigned_path(c.put_object().bucket("hostile").key("short").presigned(pc.clone()).await.unwrap()).await;
    let answer = raw(
        &addr,
        format!("PUT {short} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 100000\r\n\r\n0123456789").as_bytes(),
    );
    assert!(statuses(&answer).iter().all(|s| *s < 500), "{answer}");
    let e = c.head_object().bucket("hostile").key("short").send().await.unwrap_err();
    assert_eq!(e.raw_response().map(|r| r.status().as_u16()), Some(404), "a short body stored something");
    let long = presigned_path(c.put_object().bucket("hostile").key("long").presigned(pc.clone()).await.unwrap()).await;
    let answer = raw(
        &addr,
        format!("PUT {long} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 5\r\n\r\nhelloEXTRA-BYTES").as_bytes(),
    );
    assert_eq!(statuses(&answer).first(), Some(&200), "{answer}");
    let got = c.get_object().bucket("hostile").key("long").send().await.unwrap().body.collect().await.unwrap().to_vec();
    assert_eq!(got, b"hello");

    // Keys are names, not paths: dot segments and percent signs are stored literally; NUL is refused.
    for key in ["a/../b", "./x", "%2F", "x%00y", "..", "a//b"] {
        c.put_object().bucket("hostile").key(key).body(ByteStream::from_static(b"v")).send().await.unwrap();
        let got =
            c.get_object().bucket("hostile").key(key).send().await.unwrap().body.collect().await.unwrap().to_vec();
        assert_eq!(got, b"v", "{key}");
    }
    assert!(c.head_object().bucket("hostile").key("b").send().await.is_err(), "a/../b must not alias b");
    let e =
        c.put_object().bucket("hostile").key("nul\0key").body(ByteStream::from_static(b"v")).send().await.unwrap_err();
    assert_eq!(e.raw_response().map(|r| r.status().as_u16()), Some(400));

    // A signature from an hour ago is refused even though it is otherwise valid.
    let stale = presigned_path(
        c.get_object()
            .bucket("hostile")
            .key("long")
            .presigned(
                PresigningConfig::builder()
                    .start_time(std::time::SystemTime::now() - Duration::from_secs(3600))
                    .expires_in(Duration::from_secs(60))
                    .build()
                    .unwrap(),
            )
            .await
            .unwrap(),
    )
    .await;
    let answer = raw(&addr, format!("GET {stale} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes());
    assert_eq!(statuses(&answer).first(), Some(&403), "{answer}");
    // Replaying a valid signature on another key fails.
    let replayed =
        presigned_path(c.get_object().bucket("hostile").key("long").presigned(pc.clone()).await.unwrap()).await;
    let answer = raw(
        &addr,
        format!("GET {} HTTP/1.1\r\nHost: {addr}\r\n\r\n", replayed.replace("/hostile/long", "/hostile/short"))
            .as_bytes(),
    );
    assert!(answer.contains("SignatureDoesNotMatch"), "{answer}");

    // Slow-loris: connections that never finish their headers do not stall a normal client.
    let slow: Vec<TcpStream> = (0..64)
        .map(|_| {
            let mut t = TcpStream::connect(&addr).unwrap();
            t.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
            t
        })
        .collect();
    let normal = async {
        c.put_object().bucket("hostile").key("during").body(ByteStream::from_static(b"ok")).send().await.unwrap();
        c.get_object().bucket("hostile").key("during").send().await.unwrap().body.collect().await.unwrap().to_vec()
    };
    let got = tokio::time::timeout(Duration::from_secs(20), normal).await.expect("a normal client was stalled");
    assert_eq!(got, b"ok");
    drop(slow);

    // Memory stayed bounded through all of it, and the server still serves.
    let rss_after = rss_kib(pid);
    assert!(rss_after < rss_before + 128 * 1024, "RSS grew from {rss_before} KiB to {rss_after} KiB");
    assert_eq!(c.list_objects_v2().bucket("hostile").send().await.unwrap().key_count(), Some(8));
    assert_eq!(stop(s).0, 0);
}
