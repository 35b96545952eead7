//! Kill test: a writer issues PutObject, multipart uploads, overwrites, CopyObject, appends and deletes with
//! known contents and remembers every acknowledged one; the server is killed with SIGKILL at a random
//! moment; after a restart every acknowledged write reads back byte-exact with its ETag, every acknowledged
//! delete stays deleted, an operation in flight at the kill is wholly there or wholly absent, listings agree
//! with GETs, and `mosaic admin check` finds no leaked or doubly used space. 20 rounds in the normal suite;
//! MOSAIC_KILL_ROUNDS sets more (the long mode), MOSAIC_KILL_SEED replays one sequence.
//!
//! The power-loss variant runs the server with its data file behind a volatile write cache
//! (`--simulate-power-loss`), so each kill also drops every data write since the last flush: 200 rounds,
//! MOSAIC_POWER_LOSS_ROUNDS for more. Both run again on a 4+2 set of six drives (a tenth and a fifth of the
//! rounds).

mod support;

use aws_sdk_s3::primitives::ByteStream;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Server, admin, kill9, s3_client, start_with_root};

const AK: &str = "killtestkey";
const SK: &str = "killtestsecret-0123456789";
const BUCKET: &str = "kill";
const KEYS: usize = 24;
const PART_BYTES: usize = 5 << 20;

/// An object as acknowledged: its bytes and the ETag the server answered (unknown for an operation whose
/// answer was lost).
#[derive(Clone, Debug, PartialEq)]
struct Obj {
    body: Vec<u8>,
    etag: Option<String>,
}

/// What a key may hold: one state when every operation on it was answered, two when one was in flight at
/// the kill (before and after).
type States = Vec<Option<Obj>>;

#[derive(Default)]
struct Model {
    keys: BTreeMap<String, States>,
    /// Operations answered with success, and operations in flight when the server died.
    acked: u64,
    in_flight_at_kill: u64,
}

/// With `power_loss`, each drive's data file sits behind a volatile write cache: the kill also drops every
/// data write since the last flush, as a power cut does to a disk with write-back caching. With `set`, six
/// drives beside the data directory form a 4+2 set.
fn server(data: &Path, power_loss: bool, set: bool) -> Server {
    let drives: Vec<String> = (0..6).map(|d| data.with_file_name(format!("drive{d}")).display().to_string()).collect();
    let drives = drives.join(",");
    let mut env: Vec<(&str, &str)> = Vec::new();
    if power_loss {
        env.push(("MOSAIC_SIMULATE_POWER_LOSS", "true"));
    }
    if set {
        env.extend([("MOSAIC_DRIVES", drives.as_str()), ("MOSAIC_ERASURE", "4+2")]);
    }
    start_with_root(data, AK, SK, &env)
}

fn content(rng: &mut StdRng, len: std::ops::Range<usize>) -> Vec<u8> {
    let len = rng.random_range(len);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn md5_hex(b: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(b))
}

fn service_error<E>(e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> bool {
    matches!(e, aws_sdk_s3::error::SdkError::ServiceError(_))
}

/// How an operation ended: answered with success (and the ETag), refused by the server (it must not have
/// applied), or unknown (the connection died: it may or may not have applied).
enum Outcome {
    Acked(Option<String>),
    Refused,
    Unknown,
}

fn outcome<T, E>(
    r: Result<T, aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>>,
    etag: impl FnOnce(&T) -> Option<String>,
) -> Outcome {
    match r {
        Ok(o) => Outcome::Acked(etag(&o)),
        Err(e) if service_error(&e) => Outcome::Refused,
        Err(_) => Outcome::Unknown,
    }
}

/// The exact state of a key this writer owns.
fn state_of(model: &Mutex<Model>, key: &str) -> Option<Obj> {
    let m = model.lock().unwrap();
    let states = m.keys.get(key).cloned().unwrap_or_else(|| vec![None]);
    assert_eq!(states.len(), 1, "{key}: a writer only touches keys whose state is known");
    states.into_iter().next().flatten()
}

/// Runs one writer until the server dies; records what every answered operation did.
async fn writer(c: aws_sdk_s3::Client, model: Arc<Mutex<Model>>, seed: u64, worker: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Each worker owns the keys of its parity, so its view of their state is exact.
    let own_key = |rng: &mut StdRng| format!("k{:02}", rng.random_range(0..KEYS / 2) * 2 + worker);
    loop {
        let key = own_key(&mut rng);
        let current = state_of(&model, &key);
        let roll = rng.random_range(0..100);
        let (next, out) = if roll < 35 {
            let body = content(&mut rng, 0..200_000);
            let r = c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(body.clone())).send().await;
            (Some(body), outcome(r, |o| o.e_tag().map(str::to_string)))
        } else if roll < 50 {
            (None, outcome(c.delete_object().bucket(BUCKET).key(&key).send().await, |_| None))
        } else if roll < 65 {
            let src = own_key(&mut rng);
            let Some(src_obj) = state_of(&model, &src) else { continue };
            let r = c.copy_object().bucket(BUCKET).key(&key).copy_source(format!("{BUCKET}/{src}")).send().await;
            let etag = |o: &aws_sdk_s3::operation::copy_object::CopyObjectOutput| {
                o.copy_object_result().and_then(|r| r.e_tag()).map(str::to_string)
            };
            (Some(src_obj.body), outcome(r, etag))
        } else if roll < 85 {
            let piece = content(&mut rng, 1..8192);
            let mut next = current.as_ref().map(|o| o.body.clone()).unwrap_or_default();
            let offset = next.len();
            next.extend_from_slice(&piece);
            let mut req = c.put_object().bucket(BUCKET).key(&key).body(ByteStream::from(piece));
            if current.is_some() {
                req = req.write_offset_bytes(offset as i64);
            }
            (Some(next), outcome(req.send().await, |o| o.e_tag().map(str::to_string)))
        } else {
            let parts = [content(&mut rng, PART_BYTES..PART_BYTES + 1), content(&mut rng, 1..100_000)];
            (Some(parts.concat()), multipart(&c, &key, &parts).await)
        };
        let mut m = model.lock().unwrap();
        match out {
            Outcome::Acked(etag) => {
                m.acked += 1;
                m.keys.insert(key, vec![next.map(|body| Obj { body, etag })]);
            }
            Outcome::Refused => {}
            Outcome::Unknown => {
                m.in_flight_at_kill += 1;
                m.keys.insert(key, vec![current, next.map(|body| Obj { body, etag: None })]);
                // The server is gone: this writer's round is over.
                return;
            }
        }
    }
}

/// A two-part multipart upload. Failures before Complete leave the object untouched: refused, from the
/// key's point of view.
async fn multipart(c: &aws_sdk_s3::Client, key: &str, parts: &[Vec<u8>]) -> Outcome {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let Ok(up) = c.create_multipart_upload().bucket(BUCKET).key(key).send().await else { return Outcome::Refused };
    let Some(id) = up.upload_id().map(str::to_string) else { return Outcome::Refused };
    let mut done = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let r = c.upload_part().bucket(BUCKET).key(key).upload_id(&id).part_number(n);
        let Ok(r) = r.body(ByteStream::from(p.clone())).send().await else { return Outcome::Refused };
        done.push(CompletedPart::builder().part_number(n).set_e_tag(r.e_tag().map(str::to_string)).build());
    }
    let complete = CompletedMultipartUpload::builder().set_parts(Some(done)).build();
    let r = c.complete_multipart_upload().bucket(BUCKET).key(key).upload_id(&id).multipart_upload(complete);
    outcome(r.send().await, |o| o.e_tag().map(str::to_string))
}

/// Reads every key back and checks it holds one of its possible states (byte-exact, with the acknowledged
/// ETag); settles the model to what is there; checks the listing names exactly the keys that exist.
async fn verify(c: &aws_sdk_s3::Client, model: &Mutex<Model>, context: &str) {
    let keys: Vec<(String, States)> = model.lock().unwrap().keys.clone().into_iter().collect();
    let mut present = BTreeSet::new();
    for (key, states) in keys {
        let got = match c.get_object().bucket(BUCKET).key(&key).send().await {
            Ok(o) => {
                let etag = o.e_tag().map(str::to_string);
                let body = o.body.collect().await.expect("reading a body").to_vec();
                Some(Obj { body, etag })
            }
            Err(e) => {
                let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e).map(str::to_string);
                assert_eq!(code.as_deref(), Some("NoSuchKey"), "{context}: GET {key}: {e:?}");
                None
            }
        };
        let matches = |s: &Option<Obj>| match (s, &got) {
            (None, None) => true,
            (Some(want), Some(have)) => {
                want.body == have.body && want.etag.as_ref().is_none_or(|e| Some(e) == have.etag.as_ref())
            }
            _ => false,
        };
        assert!(
            states.iter().any(matches),
            "{context}: {key} holds {} (ETag {:?}), none of the {} possible states ({:?})",
            got.as_ref().map_or("nothing".to_string(), |o| format!("{} bytes md5 {}", o.body.len(), md5_hex(&o.body))),
            got.as_ref().and_then(|o| o.etag.clone()),
            states.len(),
            states
                .iter()
                .map(|s| s.as_ref().map(|o| (o.body.len(), md5_hex(&o.body), o.etag.clone())))
                .collect::<Vec<_>>()
        );
        if got.is_some() {
            present.insert(key.clone());
        }
        model.lock().unwrap().keys.insert(key, vec![got]);
    }
    let mut listed = BTreeSet::new();
    let mut token = None;
    loop {
        let page = c.list_objects_v2().bucket(BUCKET).set_continuation_token(token.take()).max_keys(7).send().await;
        let page = page.unwrap_or_else(|e| panic!("{context}: listing: {e:?}"));
        listed.extend(page.contents().iter().filter_map(|o| o.key().map(str::to_string)));
        match page.next_continuation_token() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(listed, present, "{context}: the listing disagrees with GETs");
}

/// `mosaic admin check` on the running server: no leaked or doubly used space.
fn admin_check(s: &Server, context: &str) {
    let out = admin(s, AK, SK, &["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{context}: admin check failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["clean"], true, "{context}: {v}");
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    rounds(env_u64("MOSAIC_KILL_ROUNDS").unwrap_or(20), false, false);
}

/// The power-loss test at the process level: the same writer, the drive behind a volatile write cache.
#[test]
fn acknowledged_writes_survive_power_loss() {
    rounds(env_u64("MOSAIC_POWER_LOSS_ROUNDS").unwrap_or(200), true, false);
}

/// Both on a 4+2 set of six drives, each losing its unflushed writes at the kill.
#[test]
fn acknowledged_writes_survive_sigkill_and_power_loss_on_a_4_plus_2_set() {
    rounds(env_u64("MOSAIC_KILL_ROUNDS").unwrap_or(20) / 2, false, true);
    rounds(env_u64("MOSAIC_POWER_LOSS_ROUNDS").unwrap_or(200) / 5, true, true);
}

fn rounds(rounds: u64, power_loss: bool, set: bool) {
    let seed = env_u64("MOSAIC_KILL_SEED").unwrap_or_else(rand::random);
    let what = match (power_loss, set) {
        (false, false) => "kill",
        (true, false) => "power-loss",
        (false, true) => "kill (4+2)",
        (true, true) => "power-loss (4+2)",
    };
    eprintln!("{what} test: {rounds} rounds, MOSAIC_KILL_SEED={seed}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // The SDK's clients are built on this runtime.
    let _in_runtime = rt.enter();
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let model = Arc::new(Mutex::new(Model::default()));
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..=rounds {
        let context = format!("seed {seed} round {round}");
        let s = server(&data, power_loss, set);
        let c = s3_client(&s.s3, AK, SK);
        rt.block_on(async {
            if round == 0 {
                c.create_bucket().bucket(BUCKET).send().await.unwrap();
            }
            verify(&c, &model, &context).await;
        });
        admin_check(&s, &context);
        if round == rounds {
            assert_eq!(support::stop(s).0, 0);
            break;
        }
        let writers: Vec<_> = (0..2)
            .map(|w| rt.spawn(writer(s3_client(&s.s3, AK, SK), model.clone(), seed ^ (round << 8) ^ w as u64, w)))
            .collect();
        // The kill lands at a random moment of the writers' work (fault injection, not synchronization).
        let after = Duration::from_millis(rng.random_range(20..400));
        rt.block_on(tokio::time::sleep(after));
        kill9(s);
        for w in writers {
            rt.block_on(w).unwrap();
        }
    }
    let m = model.lock().unwrap();
    let present = m.keys.values().filter(|s| s[0].is_some()).count();
    eprintln!(
        "{what} test: {} acknowledged operations, {} in flight at a kill, {present} objects at the end",
        m.acked, m.in_flight_at_kill
    );
    // The test means something only if writers got work done between kills.
    assert!(m.acked >= rounds * 5, "only {} operations acknowledged in {rounds} rounds", m.acked);
}
