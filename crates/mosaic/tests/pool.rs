//! A server of more drives than one set holds: 18 drives make two 5+4 sets, pooled, each object on the set
//! its key hashes to. Through the aws SDK: PUT of every size class, copies (between sets too), multipart,
//! paged listing over both sets, deletes, a bucket refused while not empty; everything reads back
//! exactly, and again after a restart.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::{Server, admin, s3_client, start_with_root, stop};

const AK: &str = "pooltestkey";
const SK: &str = "pooltestsecret-0123456789";
const BUCKET: &str = "pooled";

fn server(data: &Path, drives: &[PathBuf]) -> Server {
    let list: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
    start_with_root(data, AK, SK, &[("MOSAIC_DRIVES", &list.join(",")), ("MOSAIC_DRIVE_SIZE", "96MiB")])
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7919) % 251) as u8).collect()
}

async fn get(c: &aws_sdk_s3::Client, key: &str) -> Vec<u8> {
    let r = c.get_object().bucket(BUCKET).key(key).send().await.unwrap_or_else(|e| panic!("GET {key}: {e:?}"));
    r.body.collect().await.unwrap().into_bytes().to_vec()
}

async fn list_all(c: &aws_sdk_s3::Client) -> Vec<String> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let r = c.list_objects_v2().bucket(BUCKET).max_keys(7).set_continuation_token(token).send().await.unwrap();
        keys.extend(r.contents().iter().filter_map(|o| o.key().map(str::to_string)));
        match r.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => return keys,
        }
    }
}

async fn verify(c: &aws_sdk_s3::Client, model: &BTreeMap<String, Vec<u8>>, phase: &str) {
    for (k, v) in model {
        assert!(get(c, k).await == *v, "{phase}: {k} reads back exactly");
    }
    let want: Vec<String> = model.keys().cloned().collect();
    assert_eq!(list_all(c).await, want, "{phase}: the listing merges both sets in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eighteen_drives_serve_as_a_pool_of_two_sets() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("store");
    let drives: Vec<PathBuf> = (0..18).map(|d| root.path().join(format!("drive{d:02}"))).collect();
    let s = server(&data, &drives);
    let out = admin(&s, AK, SK, &["drives"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sets = v["sets"].as_array().unwrap();
    assert_eq!(sets.len(), 2, "{v}");
    assert!(sets.iter().all(|s| s["erasure"] == "5+4" && s["ready"] == true), "{v}");
    assert_eq!(v["drives"].as_array().unwrap().len(), 18);

    let c = s3_client(&s.s3, AK, SK);
    c.create_bucket().bucket(BUCKET).send().await.unwrap();
    let mut model = BTreeMap::new();
    for i in 0..24 {
        let len = [0, 100, 20_000, 300_000, 2 << 20][i % 5] + i;
        let key = format!("obj/{i:03}");
        let data = pattern(i, len);
        c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(data.clone())).send().await.unwrap();
        model.insert(key, data);
    }
    // Copies: with 12 pairs, some cross from one set to the other (placement is by key).
    for i in 0..12 {
        let (src, dst) = (format!("obj/{i:03}"), format!("copy/{i:03}"));
        let r = c.copy_object().bucket(BUCKET).key(&dst).copy_source(format!("{BUCKET}/{src}"));
        r.send().await.unwrap_or_else(|e| panic!("copy {src}: {e:?}"));
        model.insert(dst, model[&src].clone());
    }
    // A multipart upload (5 MiB + a tail).
    {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let key = "big/multipart";
        let parts = [pattern(100, 5 << 20), pattern(101, 12_345)];
        let up = c.create_multipart_upload().bucket(BUCKET).key(key).send().await.unwrap();
        let id = up.upload_id().unwrap().to_string();
        let mut done = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let n = i as i32 + 1;
            let r = c.upload_part().bucket(BUCKET).key(key).upload_id(&id).part_number(n);
            let r = r.body(ByteStream::from(p.clone())).send().await.unwrap();
            done.push(CompletedPart::builder().part_number(n).set_e_tag(r.e_tag().map(str::to_string)).build());
        }
        let complete = CompletedMultipartUpload::builder().set_parts(Some(done)).build();
        let r = c.complete_multipart_upload().bucket(BUCKET).key(key).upload_id(&id).multipart_upload(complete);
        r.send().await.unwrap();
        model.insert(key.to_string(), parts.concat());
    }
    for i in (0..24).step_by(5) {
        let key = format!("obj/{i:03}");
        c.delete_object().bucket(BUCKET).key(&key).send().await.unwrap();
        model.remove(&key);
    }
    verify(&c, &model, "serving").await;
    let refused = c.delete_bucket().bucket(BUCKET).send().await.unwrap_err();
    assert_eq!(refused.into_service_error().meta().code(), Some("BucketNotEmpty"));

    let (code, _) = stop(s);
    assert_eq!(code, 0);
    let s = server(&data, &drives);
    let c = s3_client(&s.s3, AK, SK);
    verify(&c, &model, "after a restart").await;
    for k in model.keys() {
        c.delete_object().bucket(BUCKET).key(k).send().await.unwrap();
    }
    c.delete_bucket().bucket(BUCKET).send().await.unwrap();
    let buckets = c.list_buckets().send().await.unwrap();
    assert!(buckets.buckets().is_empty());
    let (code, _) = stop(s);
    assert_eq!(code, 0);
}
