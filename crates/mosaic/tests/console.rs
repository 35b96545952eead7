//! The web console's API end to end through the `mosaic` binary (what the page calls; the browser test in
//! tests/console drives the page itself): sign-in, the session cookie and CSRF token, buckets, folders,
//! uploads (one call and multipart), links that fetch the bytes from the S3 port, metadata, deletes, and a
//! granted key that sees only its bucket.

mod support;

use mosaic_layer::testing::pattern;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";

/// A browser: its session cookie, and the CSRF token of its session.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: String,
    csrf: String,
}

impl Browser {
    fn new(admin: &str) -> Browser {
        let http = reqwest::Client::new();
        Browser { http, base: format!("http://{admin}"), cookie: String::new(), csrf: String::new() }
    }

    async fn sign_in(&mut self, ak: &str, sk: &str) -> (StatusCode, Value) {
        let body = json!({ "access_key": ak, "secret_key": sk });
        let resp = self.request("POST", "login", &[]).json(&body).send().await.unwrap();
        let status = resp.status();
        if let Some(c) = resp.headers().get("set-cookie") {
            self.cookie = c.to_str().unwrap().split(';').next().unwrap().to_string();
        }
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if status == StatusCode::OK {
            self.csrf = v["csrf"].as_str().unwrap().to_string();
        }
        (status, v)
    }

    fn request(&self, method: &str, call: &str, params: &[(&str, &str)]) -> reqwest::RequestBuilder {
        let url = format!("{}/console/api/{call}", self.base);
        let r = self.http.request(method.parse().unwrap(), url).query(params).header("x-mosaic-csrf", &self.csrf);
        if self.cookie.is_empty() { r } else { r.header("cookie", &self.cookie) }
    }

    async fn call(
        &self,
        method: &str,
        call: &str,
        params: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.request(method, call, params);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    async fn upload(&self, bucket: &str, key: &str, data: Vec<u8>) -> (StatusCode, Value) {
        let resp = self.request("PUT", "object", &[("bucket", bucket), ("key", key)]).body(data).send().await.unwrap();
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    async fn ok(&self, method: &str, call: &str, params: &[(&str, &str)], body: Option<Value>) -> Value {
        let (status, v) = self.call(method, call, params, body).await;
        assert_eq!(status, StatusCode::OK, "{method} {call} {params:?}: {v}");
        v
    }

    async fn buckets(&self) -> Vec<String> {
        let v = self.ok("GET", "buckets", &[], None).await;
        v["buckets"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect()
    }
}

async fn fetch(url: &str) -> (StatusCode, Vec<u8>, reqwest::header::HeaderMap) {
    let resp = reqwest::get(url).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, resp.bytes().await.unwrap().to_vec(), headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_browses_uploads_shares_and_keeps_keys_to_their_grants() {
    let dir = tempfile::tempdir().unwrap();
    let s = start_with_root(dir.path(), ROOT_AK, ROOT_SK, &[]);

    // The page is served, kept to its origin; nothing of the API without a session.
    let page = reqwest::get(format!("http://{}/", s.admin)).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    assert!(page.text().await.unwrap().contains("/console/app.js"));
    let mut b = Browser::new(&s.admin);
    assert_eq!(b.call("GET", "buckets", &[], None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(b.sign_in(ROOT_AK, "wrong").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(b.sign_in("nobody", ROOT_SK).await.0, StatusCode::UNAUTHORIZED);
    let login = b
        .http
        .post(format!("{}/console/api/login", b.base))
        .json(&json!({ "access_key": ROOT_AK, "secret_key": ROOT_SK }))
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Max-Age="),
        "{cookie}"
    );
    let (status, me) = b.sign_in(ROOT_AK, ROOT_SK).await;
    assert_eq!((status, me["root"].as_bool()), (StatusCode::OK, Some(true)));

    // Every change needs the session's CSRF token (a forged one, or none, is refused).
    let bucket_url = format!("{}/console/api/bucket", b.base);
    let forged = b.http.post(&bucket_url).query(&[("bucket", "photos")]).header("cookie", &b.cookie);
    assert_eq!(forged.header("x-mosaic-csrf", "0".repeat(64)).send().await.unwrap().status(), StatusCode::FORBIDDEN);
    let missing = b.http.post(&bucket_url).query(&[("bucket", "photos")]).header("cookie", &b.cookie);
    assert_eq!(missing.send().await.unwrap().status(), StatusCode::FORBIDDEN);
    assert!(b.buckets().await.is_empty(), "a refused change changed nothing");

    // Buckets, folders, uploads.
    b.ok("POST", "bucket", &[("bucket", "photos")], None).await;
    b.ok("POST", "bucket", &[("bucket", "private")], None).await;
    let (status, v) = b.call("POST", "bucket", &[("bucket", "Bad_Name!")], None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(b.buckets().await, vec!["photos", "private"]);
    let small = pattern(1, 3000);
    assert_eq!(b.upload("photos", "top.bin", small.clone()).await.0, StatusCode::OK);
    for (i, key) in ["trip/a.jpg", "trip/b.jpg", "trip/day 2/c.jpg"].iter().enumerate() {
        assert_eq!(b.upload("photos", key, pattern(10 + i as u64, 100 + i)).await.0, StatusCode::OK);
    }
    let root = b.ok("GET", "objects", &[("bucket", "photos"), ("prefix", "")], None).await;
    assert_eq!(root["folders"], json!(["trip/"]));
    assert_eq!(root["objects"][0]["key"], "top.bin");
    assert_eq!(root["objects"][0]["size"], 3000);
    let trip = b.ok("GET", "objects", &[("bucket", "photos"), ("prefix", "trip/")], None).await;
    assert_eq!(trip["folders"], json!(["trip/day 2/"]));
    assert_eq!(trip["objects"].as_array().unwrap().len(), 2);
    // Paging: one object per page, in order, until there is no next page.
    let (mut token, mut seen) = (String::new(), Vec::new());
    loop {
        let page = b
            .ok("GET", "objects", &[("bucket", "photos"), ("prefix", "trip/"), ("max", "1"), ("token", &token)], None)
            .await;
        seen.extend(page["objects"].as_array().unwrap().iter().map(|o| o["key"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(t) => token = t.to_string(),
            None => break,
        }
    }
    assert_eq!(seen, vec!["trip/a.jpg", "trip/b.jpg"]);

    // A 20 MiB file in multipart parts, then downloaded from the S3 port by its link, byte for byte.
    let big = pattern(2, 20 << 20);
    let id = b.ok("POST", "upload", &[("bucket", "photos"), ("key", "big.bin")], None).await["upload_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut parts = Vec::new();
    for (i, chunk) in big.chunks(8 << 20).enumerate() {
        let n = (i + 1).to_string();
        let resp = b
            .request("PUT", "upload", &[("bucket", "photos"), ("key", "big.bin"), ("upload_id", &id), ("part", &n)])
            .body(chunk.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let v: Value = resp.json().await.unwrap();
        parts.push(json!({ "part": i + 1, "etag": v["etag"] }));
    }
    b.ok(
        "POST",
        "complete",
        &[("bucket", "photos"), ("key", "big.bin"), ("upload_id", &id)],
        Some(json!({ "parts": parts })),
    )
    .await;
    let usage = b.ok("GET", "usage", &[("bucket", "photos")], None).await;
    assert_eq!(usage, json!({ "bucket": "photos", "objects": 5, "bytes": 3000 + 303 + (20 << 20), "complete": true }));
    let too_big = b.upload("photos", "over.bin", vec![0; (16 << 20) + 1]).await;
    assert_eq!(too_big.0, StatusCode::PAYLOAD_TOO_LARGE, "{}", too_big.1);
    let link = b.ok("POST", "link", &[("bucket", "photos"), ("key", "big.bin"), ("download", "1")], None).await;
    let (status, got, headers) = fetch(link["url"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(got == big, "the download is the upload");
    assert_eq!(headers["content-disposition"].to_str().unwrap(), "attachment; filename*=UTF-8''big.bin");
    let shared =
        b.ok("POST", "link", &[("bucket", "photos"), ("key", "trip/day 2/c.jpg"), ("expires_s", "600")], None).await;
    let (status, got, _) = fetch(shared["url"].as_str().unwrap()).await;
    assert_eq!((status, got), (StatusCode::OK, pattern(12, 102)));
    let (status, _) =
        b.call("POST", "link", &[("bucket", "photos"), ("key", "top.bin"), ("expires_s", "999999999")], None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a link lasts at most a week");

    // The bytes in and out of the S3 port are counted (the console plots them).
    let metrics = reqwest::get(format!("http://{}/metrics", s.admin)).await.unwrap().text().await.unwrap();
    let counted = |name: &str| -> u64 {
        metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0) as u64
    };
    assert!(counted("mosaic_s3_received_bytes_total") >= 20 << 20, "{metrics}");
    assert!(counted("mosaic_s3_sent_bytes_total") >= 20 << 20);

    // Metadata and checksums.
    let info = b.ok("GET", "object", &[("bucket", "photos"), ("key", "top.bin")], None).await;
    assert_eq!(info["headers"]["content-length"], "3000");
    assert!(info["headers"]["etag"].as_str().is_some_and(|e| e.len() > 2));
    assert!(info["headers"]["x-amz-checksum-crc32c"].as_str().is_some_and(|c| c.len() == 8), "{info}");

    // A key granted one bucket sees and reaches only that bucket, and no admin page.
    let key = b.ok("POST", "admin/keys", &[], None).await;
    let (ak, sk) = (key["access_key"].as_str().unwrap().to_string(), key["secret_key"].as_str().unwrap().to_string());
    b.ok("POST", &format!("admin/keys/{ak}/allow/photos/read-write"), &[], None).await;
    let mut alice = Browser::new(&s.admin);
    assert_eq!(alice.sign_in(&ak, &sk).await.0, StatusCode::OK);
    assert_eq!(alice.buckets().await, vec!["photos"]);
    assert_eq!(
        alice.call("GET", "objects", &[("bucket", "private"), ("prefix", "")], None).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(alice.upload("private", "x", b"x".to_vec()).await.0, StatusCode::FORBIDDEN);
    assert_eq!(alice.call("GET", "admin/keys", &[], None).await.0, StatusCode::FORBIDDEN);
    assert_eq!(alice.upload("photos", "from-alice", b"hi".to_vec()).await.0, StatusCode::OK);

    // Deletes: several at once; a bucket that is not empty is refused with the reason.
    let (status, v) = b.call("DELETE", "bucket", &[("bucket", "photos")], None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(v["error"].as_str().unwrap().contains("BucketNotEmpty"), "{v}");
    let keys = ["top.bin", "trip/a.jpg", "trip/b.jpg", "trip/day 2/c.jpg", "big.bin", "from-alice"];
    let v = b.ok("POST", "delete", &[("bucket", "photos")], Some(json!({ "keys": keys }))).await;
    assert_eq!(v["deleted"], 6);
    b.ok("DELETE", "bucket", &[("bucket", "photos")], None).await;
    b.ok("DELETE", "bucket", &[("bucket", "private")], None).await;
    assert!(b.buckets().await.is_empty());

    // A deleted key's session ends; signing out ends one.
    b.ok("DELETE", &format!("admin/keys/{ak}"), &[], None).await;
    assert_eq!(alice.call("GET", "buckets", &[], None).await.0, StatusCode::UNAUTHORIZED);
    b.ok("POST", "logout", &[], None).await;
    assert_eq!(b.call("GET", "buckets", &[], None).await.0, StatusCode::UNAUTHORIZED);

    // Bad sign-in bodies are refused clearly; failed sign-ins are limited per address (the two above
    // count too): past the limit even the right secret waits.
    let (status, v) = b.call("POST", "login", &[], Some(json!({ "access_key": 7 }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    for _ in 2..10 {
        assert_eq!(b.sign_in(ROOT_AK, "wrong").await.0, StatusCode::UNAUTHORIZED);
    }
    let (status, v) = b.sign_in(ROOT_AK, ROOT_SK).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(stop(s).0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_age_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start_with_root(dir.path(), ROOT_AK, ROOT_SK, &[("MOSAIC_CONSOLE_SESSION_MAX_SECS", "1")]);
    let mut b = Browser::new(&s.admin);
    // Taken before the sign-in: the server starts the session's clock while answering it, after this.
    let signed_in = std::time::Instant::now();
    let (status, _) = b.sign_in(ROOT_AK, ROOT_SK).await;
    assert_eq!(status, StatusCode::OK);
    // Used all along, the session still ends one second after sign-in (a clock, not a synchronization).
    loop {
        let (status, v) = b.call("GET", "me", &[], None).await;
        if status == StatusCode::UNAUTHORIZED {
            assert!(v["error"].as_str().unwrap().contains("ended"), "{v}");
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(signed_in.elapsed() < std::time::Duration::from_secs(10), "the session outlived its age");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(signed_in.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(b.call("POST", "bucket", &[("bucket", "late")], None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(stop(s).0, 0);
}
