//! Drive faults on a whole server: a 4+2 set of six drives under a mixed load (PUT of every size class,
//! overwrite, delete, multipart, append) while drives fail: device errors injected into one drive, another
//! turned read-only, a third drive's directory deleted under the running server. With up to two drives
//! gone every request works and every acknowledged object reads back exactly; the drives are replaced,
//! heal rebuilds them (proven by failing two of the original drives afterwards and reading everything),
//! and `mosaic admin check` is clean. Past the limit (three drives gone) requests get clean 503s, nothing
//! is damaged, and the store is whole again when the drives return.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::{Server, admin, s3_client, start_with_root, stop};

const AK: &str = "drivetestkey";
const SK: &str = "drivetestsecret-0123456789";
const BUCKET: &str = "drives";
const KEYS: usize = 20;
const PART_BYTES: usize = 5 << 20;

/// The server over `drives` (a 4+2 set), with fault injection.
fn server(data: &Path, drives: &[PathBuf]) -> Server {
    let list: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
    let list = list.join(",");
    start_with_root(
        data,
        AK,
        SK,
        &[("MOSAIC_DRIVES", &list), ("MOSAIC_ERASURE", "4+2"), ("MOSAIC_FAULT_INJECTION", "true")],
    )
}

fn admin_json(s: &Server, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = admin(s, AK, SK, args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("admin {args:?}: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code(), v)
}

fn drive_states(s: &Server) -> Vec<String> {
    let (_, v) = admin_json(s, &["drives"]);
    v["drives"].as_array().unwrap().iter().map(|d| d["state"].as_str().unwrap().to_string()).collect()
}

fn content(rng: &mut StdRng, len: std::ops::Range<usize>) -> Vec<u8> {
    let mut v = vec![0u8; rng.random_range(len)];
    rng.fill(&mut v[..]);
    v
}

/// What every key holds (None: absent). Every operation in these phases must succeed, so the model is exact.
type Model = BTreeMap<String, Option<Vec<u8>>>;

/// `n` random operations; each must succeed.
async fn load(c: &aws_sdk_s3::Client, model: &mut Model, rng: &mut StdRng, n: usize, phase: &str) {
    for i in 0..n {
        let key = format!("k{:02}", rng.random_range(0..KEYS));
        let current = model.get(&key).cloned().flatten();
        let roll = rng.random_range(0..100);
        let next = if roll < 50 {
            let body = match rng.random_range(0..3) {
                0 => content(rng, 0..16 << 10),
                1 => content(rng, 20 << 10..300 << 10),
                _ => content(rng, 1 << 20..3 << 20),
            };
            let r = c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(body.clone())).send().await;
            r.unwrap_or_else(|e| panic!("{phase} op {i}: PUT {key}: {e:?}"));
            Some(body)
        } else if roll < 65 {
            c.delete_object().bucket(BUCKET).key(&key).send().await.unwrap_or_else(|e| panic!("{phase}: DELETE {e:?}"));
            None
        } else if roll < 90 {
            let piece = content(rng, 1..8192);
            let mut next = current.clone().unwrap_or_default();
            let mut req = c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(piece.clone()));
            if current.is_some() {
                req = req.write_offset_bytes(next.len() as i64);
            }
            req.send().await.unwrap_or_else(|e| panic!("{phase} op {i}: append to {key}: {e:?}"));
            next.extend_from_slice(&piece);
            Some(next)
        } else {
            let parts = [content(rng, PART_BYTES..PART_BYTES + 1), content(rng, 1..100_000)];
            multipart(c, &key, &parts).await.unwrap_or_else(|e| panic!("{phase} op {i}: multipart {key}: {e}"));
            Some(parts.concat())
        };
        model.insert(key, next);
    }
}

async fn multipart(c: &aws_sdk_s3::Client, key: &str, parts: &[Vec<u8>]) -> Result<(), String> {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let up = c.create_multipart_upload().bucket(BUCKET).key(key).send().await.map_err(|e| format!("{e:?}"))?;
    let id = up.upload_id().ok_or("no upload id")?.to_string();
    let mut done = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let r = c.upload_part().bucket(BUCKET).key(key).upload_id(&id).part_number(n);
        let r = r.body(ByteStream::from(p.clone())).send().await.map_err(|e| format!("{e:?}"))?;
        done.push(CompletedPart::builder().part_number(n).set_e_tag(r.e_tag().map(str::to_string)).build());
    }
    let complete = CompletedMultipartUpload::builder().set_parts(Some(done)).build();
    let r = c.complete_multipart_upload().bucket(BUCKET).key(key).upload_id(&id).multipart_upload(complete);
    r.send().await.map_err(|e| format!("{e:?}"))?;
    Ok(())
}

/// Every key reads back exactly as the model says, and the listing names exactly the present keys.
async fn verify(c: &aws_sdk_s3::Client, model: &Model, phase: &str) {
    for (key, want) in model {
        match (c.get_object().bucket(BUCKET).key(key).send().await, want) {
            (Ok(o), Some(want)) => {
                let got = o.body.collect().await.unwrap_or_else(|e| panic!("{phase}: {key}: {e:?}")).to_vec();
                assert!(got == *want, "{phase}: {key} reads {} bytes, not its {} bytes", got.len(), want.len());
            }
            (Err(e), None) => {
                let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e);
                assert_eq!(code, Some("NoSuchKey"), "{phase}: {key}: {e:?}");
            }
            (Ok(_), None) => panic!("{phase}: {key} was deleted but reads"),
            (Err(e), Some(_)) => panic!("{phase}: {key}: {e:?}"),
        }
    }
    let mut listed = BTreeSet::new();
    let mut token = None;
    loop {
        let page = c.list_objects_v2().bucket(BUCKET).set_continuation_token(token.take()).max_keys(7).send().await;
        let page = page.unwrap_or_else(|e| panic!("{phase}: listing: {e:?}"));
        for o in page.contents() {
            listed.insert(o.key().unwrap().to_string());
            let size = o.size().unwrap_or(-1);
            let want = model.get(o.key().unwrap()).cloned().flatten().map(|b| b.len() as i64);
            assert_eq!(Some(size), want, "{phase}: {} listed with its size", o.key().unwrap());
        }
        match page.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let present: BTreeSet<String> = model.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k.clone()).collect();
    assert_eq!(listed, present, "{phase}: the listing names exactly the present keys");
}

fn check_clean(s: &Server, phase: &str) {
    let (code, v) = admin_json(s, &["check"]);
    assert_eq!(code, Some(0), "{phase}: admin check: {v}");
    assert_eq!(v["clean"], true, "{phase}: {v}");
}

fn heal(s: &Server, phase: &str) {
    let (code, v) = admin_json(s, &["heal"]);
    assert_eq!(code, Some(0), "{phase}: admin heal: {v}");
    for set in v["sets"].as_array().unwrap() {
        assert_eq!(set["backlog"], 0, "{phase}: {v}");
    }
}

fn fault(s: &Server, slot: usize, what: &str) {
    let (code, v) = admin_json(s, &["drive", "fault", &slot.to_string(), what]);
    assert_eq!(code, Some(0), "{v}");
}

fn replace(s: &Server, slot: usize, path: &Path) {
    let (code, v) = admin_json(s, &["drive", "replace", &slot.to_string(), path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "replace {slot}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_plus_2_server_survives_two_failed_drives_heals_and_refuses_past_the_limit() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("store");
    let mut drives: Vec<PathBuf> = (0..6).map(|d| root.path().join(format!("drive{d}"))).collect();
    let mut rng = StdRng::seed_from_u64(13);
    let mut model: Model = (0..KEYS).map(|i| (format!("k{i:02}"), None)).collect();

    // Healthy, then one drive failing with device errors, then another turned read-only.
    let s = server(&data, &drives);
    let c = s3_client(&s.s3, AK, SK);
    c.create_bucket().bucket(BUCKET).send().await.unwrap();
    load(&c, &mut model, &mut rng, 60, "healthy").await;
    fault(&s, 1, "fail");
    load(&c, &mut model, &mut rng, 40, "drive 1 failing").await;
    fault(&s, 4, "read-only");
    load(&c, &mut model, &mut rng, 40, "drives 1 and 4 failing").await;
    verify(&c, &model, "two drives failing").await;
    let states = drive_states(&s);
    assert_eq!((states[1].as_str(), states[4].as_str()), ("faulty", "faulty"), "{states:?}");
    let ready = http_status(&s.admin, "/health/ready").await;
    assert_eq!(ready, 200, "ready with a write quorum of drives");

    // Both replaced by new drives; heal rebuilds them. Then two of the original drives fail: everything
    // still reads, so the new drives hold what they should.
    drives[1] = root.path().join("drive1-new");
    drives[4] = root.path().join("drive4-new");
    replace(&s, 1, &drives[1]);
    replace(&s, 4, &drives[4]);
    heal(&s, "after replacing");
    assert!(drive_states(&s).iter().all(|d| d == "online"), "{:?}", drive_states(&s));
    check_clean(&s, "after replacing");
    fault(&s, 0, "fail");
    fault(&s, 2, "fail");
    verify(&c, &model, "original drives 0 and 2 failing").await;
    stop(s);

    // A drive's directory deleted under the running server: requests keep working; after a restart the
    // drive is offline and the store runs degraded until it is replaced.
    let s = server(&data, &drives);
    let c = s3_client(&s.s3, AK, SK);
    verify(&c, &model, "restarted").await;
    std::fs::remove_dir_all(&drives[5]).unwrap();
    load(&c, &mut model, &mut rng, 30, "drive 5 deleted").await;
    verify(&c, &model, "drive 5 deleted").await;
    stop(s);
    let s = server(&data, &drives);
    assert_eq!(drive_states(&s)[5], "offline");
    let c = s3_client(&s.s3, AK, SK);
    load(&c, &mut model, &mut rng, 30, "drive 5 offline").await;
    verify(&c, &model, "drive 5 offline").await;
    stop(s);

    // Past the limit: drives 0 and 2 gone as well (three of six). Clean 503s, no panic.
    let aside: Vec<PathBuf> = [0, 2].iter().map(|d| root.path().join(format!("away{d}"))).collect();
    std::fs::rename(&drives[0], &aside[0]).unwrap();
    std::fs::rename(&drives[2], &aside[1]).unwrap();
    let s = server(&data, &drives);
    let c = s3_client(&s.s3, AK, SK);
    assert_eq!(http_status(&s.admin, "/health/ready").await, 503, "not ready without a write quorum");
    for (key, want) in model.iter().take(8) {
        let got = c.get_object().bucket(BUCKET).key(key).send().await;
        let e = got.err().unwrap_or_else(|| panic!("{key} read with three of six drives gone ({want:?})"));
        assert_eq!(status_of(&e), Some(503), "{key}: {e:?}");
    }
    let put = c.put_object().bucket(BUCKET).key("k00").body(ByteStream::from(vec![7u8; 100_000])).send().await;
    assert_eq!(status_of(&put.expect_err("a write past the limit")), Some(503));
    let list = c.list_objects_v2().bucket(BUCKET).send().await;
    assert_eq!(status_of(&list.expect_err("a listing past the limit")), Some(503));
    stop(s);

    // The drives return: everything reads; drive 5 is replaced (same path) and healed.
    std::fs::rename(&aside[0], &drives[0]).unwrap();
    std::fs::rename(&aside[1], &drives[2]).unwrap();
    let s = server(&data, &drives);
    let c = s3_client(&s.s3, AK, SK);
    verify(&c, &model, "drives back").await;
    replace(&s, 5, &drives[5]);
    heal(&s, "drive 5 replaced");
    check_clean(&s, "drive 5 replaced");
    load(&c, &mut model, &mut rng, 20, "whole again").await;
    verify(&c, &model, "whole again").await;
    assert_eq!(stop(s).0, 0);
}

fn status_of<E>(e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// The HTTP status of an unauthenticated GET on the admin port.
async fn http_status(admin: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}
