//! Corruption while stopped: bytes of some objects are flipped in the data file of a stopped server; after a
//! restart, reads of the damaged objects fail with an error (never wrong bytes), every other object reads
//! back exactly, and `mosaic admin scrub` names exactly the damaged objects.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom, Write};
use support::{admin, s3_client, start_with_root, stop};

const AK: &str = "corruptkey";
const SK: &str = "corruptsecret-0123456789";
const BLOCK: usize = 4096;

/// Offset in the data file of the block holding `needle` (block-aligned search).
fn find_block(file: &[u8], needle: &[u8]) -> Option<usize> {
    (0..file.len() / BLOCK).map(|b| b * BLOCK).find(|&off| file[off..].starts_with(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_fail_reads_and_scrub_names_exactly_the_damaged_objects() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let mut rng = StdRng::seed_from_u64(7);
    let s = start_with_root(&data, AK, SK, &[]);
    let c = s3_client(&s.s3, AK, SK);
    c.create_bucket().bucket("corrupt").send().await.unwrap();
    let mut objects = Vec::new();
    for i in 0..10 {
        // Large enough to live in data blocks, not inline in the KV store.
        let mut body = vec![0u8; 64 * 1024 + i * 1000];
        rng.fill(&mut body[..]);
        let key = format!("obj{i}");
        c.put_object().bucket("corrupt").key(&key).body(ByteStream::from(body.clone())).send().await.unwrap();
        objects.push((key, body));
    }
    assert_eq!(stop(s).0, 0);

    // Flip one byte inside the blocks of three objects (the second block of one of them).
    let path = data.join("drive0").join("data");
    let mut file = Vec::new();
    std::fs::File::open(&path).unwrap().read_to_end(&mut file).unwrap();
    let damaged: BTreeSet<String> = ["obj1", "obj4", "obj8"].into_iter().map(String::from).collect();
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for (key, body) in &objects {
        if !damaged.contains(key) {
            continue;
        }
        let block_in_object = if key == "obj8" { 1 } else { 0 };
        let needle = &body[block_in_object * BLOCK..block_in_object * BLOCK + 64];
        let at = find_block(&file, needle).unwrap_or_else(|| panic!("{key}'s data not found in the data file"));
        f.seek(SeekFrom::Start((at + 100) as u64)).unwrap();
        f.write_all(&[file[at + 100] ^ 0x40]).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let s = start_with_root(&data, AK, SK, &[]);
    let c = s3_client(&s.s3, AK, SK);
    for (key, body) in &objects {
        let got = c.get_object().bucket("corrupt").key(key).send().await;
        if damaged.contains(key) {
            // An error status, or at worst a body that breaks off: never the bytes as if nothing happened.
            match got {
                Err(e) => {
                    assert_eq!(aws_sdk_s3::error::ProvideErrorMetadata::code(&e), Some("InternalError"), "{key}: {e:?}")
                }
                Ok(o) => assert!(o.body.collect().await.is_err(), "{key}: damaged data was served"),
            }
        } else {
            let got = got.unwrap_or_else(|e| panic!("{key}: {e:?}")).body.collect().await.unwrap().to_vec();
            assert!(got == *body, "{key} changed");
        }
    }
    let out = admin(&s, AK, SK, &["scrub"]);
    assert_eq!(out.status.code(), Some(1), "scrub exits 1 when it finds damage");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: BTreeSet<String> =
        v["damaged"].as_array().unwrap().iter().map(|d| d["key"].as_str().unwrap().to_string()).collect();
    assert_eq!(found, damaged, "{v}");
    assert_eq!(stop(s).0, 0);
}
