//! Access control lists end to end: canned ACLs and grants on buckets and objects through aws-sdk-s3, a
//! second key that owns what it writes, and anonymous requests (plain HTTP, unsigned) served only where an
//! ACL lets everyone in. ACLs survive a restart. CORS rules answer preflights (OPTIONS) and mark the answers
//! to cross-origin requests.

mod support;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    AccessControlPolicy, BucketCannedAcl, Grant, Grantee, ObjectCannedAcl, Owner, Permission, Type,
};
use sha2::{Digest, Sha256};
use support::{s3_client, start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";

/// The canonical user id of an access key, derived as the server does (pinned in crates/s3/src/acl.rs).
fn canonical_id(access_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"mosaic canonical id\0");
    h.update(access_key.as_bytes());
    hex::encode(h.finalize())
}

async fn get(c: &aws_sdk_s3::Client, b: &str, k: &str) -> Result<Vec<u8>, String> {
    match c.get_object().bucket(b).key(k).send().await {
        Ok(o) => Ok(o.body.collect().await.map_err(|e| e.to_string())?.to_vec()),
        Err(e) => Err(e.code().unwrap_or("?").to_string()),
    }
}

async fn put(c: &aws_sdk_s3::Client, b: &str, k: &str, acl: Option<ObjectCannedAcl>) -> Result<(), String> {
    c.put_object()
        .bucket(b)
        .key(k)
        .set_acl(acl)
        .body(ByteStream::from_static(b"data"))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| e.code().unwrap_or("?").to_string())
}

/// An unsigned request: (status, body).
async fn anonymous(method: reqwest::Method, url: String) -> (u16, String) {
    let r = reqwest::Client::new().request(method, url).body("anon").send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A second key that owns the buckets it creates (`mosaic admin key create --owner`): its access key and a
/// client signing with it.
fn owning_key(s: &support::Server) -> (String, aws_sdk_s3::Client) {
    let out = support::admin(s, ROOT_AK, ROOT_SK, &["key", "create", "--owner"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let access_key = created["access_key"].as_str().unwrap().to_string();
    let client = s3_client(&s.s3, &access_key, created["secret_key"].as_str().unwrap());
    (access_key, client)
}

fn grant_to(id: &str, p: Permission) -> Grant {
    Grant::builder()
        .grantee(Grantee::builder().r#type(Type::CanonicalUser).id(id).build().unwrap())
        .permission(p)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_let_in_exactly_whom_they_name() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let (alt_ak, alt) = owning_key(&s);
    let (root_id, alt_id) = (canonical_id(ROOT_AK), canonical_id(&alt_ak));
    let url = |path: &str| format!("http://{}/{path}", s.s3);

    // The default: private, the owner's full control, shown by canonical id.
    root.create_bucket().bucket("bkt").send().await.unwrap();
    put(&root, "bkt", "private", None).await.unwrap();
    let acl = root.get_bucket_acl().bucket("bkt").send().await.unwrap();
    assert_eq!(acl.owner().and_then(|o| o.id()), Some(root_id.as_str()));
    assert_eq!(acl.owner().and_then(|o| o.display_name()), Some("root"));
    assert_eq!(acl.grants().len(), 1);
    assert_eq!(acl.grants()[0].permission(), Some(&Permission::FullControl));
    assert_eq!(get(&alt, "bkt", "private").await, Err("AccessDenied".into()));
    assert_eq!(anonymous(reqwest::Method::GET, url("bkt/private")).await.0, 403);
    assert_eq!(anonymous(reqwest::Method::GET, url("bkt")).await.0, 403);
    assert!(alt.list_objects_v2().bucket("bkt").send().await.is_err());

    // public-read on the bucket: everyone lists, nobody else writes; objects stay private.
    root.put_bucket_acl().bucket("bkt").acl(BucketCannedAcl::PublicRead).send().await.unwrap();
    let (status, body) = anonymous(reqwest::Method::GET, url("bkt")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<Key>private</Key>"), "{body}");
    assert_eq!(alt.list_objects_v2().bucket("bkt").send().await.unwrap().key_count(), Some(1));
    assert_eq!(put(&alt, "bkt", "new", None).await, Err("AccessDenied".into()));
    assert_eq!(anonymous(reqwest::Method::GET, url("bkt/private")).await.0, 403);
    // Who may list learns that a key is missing.
    let (status, body) = anonymous(reqwest::Method::GET, url("bkt/missing")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("NoSuchKey"), "{body}");

    // A public-read object is everyone's to read, even in a private bucket.
    root.create_bucket().bucket("closed").send().await.unwrap();
    put(&root, "closed", "open", Some(ObjectCannedAcl::PublicRead)).await.unwrap();
    put(&root, "closed", "shut", None).await.unwrap();
    let (status, body) = anonymous(reqwest::Method::GET, url("closed/open")).await;
    assert_eq!((status, body.as_str()), (200, "data"));
    assert_eq!(anonymous(reqwest::Method::GET, url("closed/shut")).await.0, 403);
    assert_eq!(anonymous(reqwest::Method::GET, url("closed/missing")).await.0, 403);
    assert_eq!(get(&alt, "closed", "open").await, Ok(b"data".to_vec()));
    assert_eq!(anonymous(reqwest::Method::PUT, url("closed/open")).await.0, 403);
    let (status, body) = anonymous(reqwest::Method::GET, url("nobucket/k")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("NoSuchBucket"), "{body}");

    // public-read-write: others write, and own what they write.
    root.create_bucket().bucket("shared").acl(BucketCannedAcl::PublicReadWrite).send().await.unwrap();
    put(&alt, "shared", "alts", None).await.unwrap();
    assert_eq!(anonymous(reqwest::Method::PUT, url("shared/anons")).await.0, 200);
    let acl = alt.get_object_acl().bucket("shared").key("alts").send().await.unwrap();
    assert_eq!(acl.owner().and_then(|o| o.id()), Some(alt_id.as_str()));
    assert_eq!(acl.owner().and_then(|o| o.display_name()), Some(alt_ak.as_str()));
    assert_eq!(get(&alt, "shared", "alts").await, Ok(b"data".to_vec()));
    assert_eq!(get(&root, "shared", "alts").await, Ok(b"data".to_vec()), "the root key reads everything");

    // Grants by canonical id: READ lets alt read, READ_ACP only lets it read the ACL.
    let policy = |p: Permission| {
        AccessControlPolicy::builder()
            .owner(Owner::builder().id(&root_id).build())
            .grants(grant_to(&root_id, Permission::FullControl))
            .grants(grant_to(&alt_id, p))
            .build()
    };
    let set = |p: Permission| root.put_object_acl().bucket("bkt").key("private").access_control_policy(policy(p));
    set(Permission::Read).send().await.unwrap();
    assert_eq!(get(&alt, "bkt", "private").await, Ok(b"data".to_vec()));
    assert!(alt.get_object_acl().bucket("bkt").key("private").send().await.is_err());
    set(Permission::ReadAcp).send().await.unwrap();
    assert_eq!(get(&alt, "bkt", "private").await, Err("AccessDenied".into()));
    let seen = alt.get_object_acl().bucket("bkt").key("private").send().await.unwrap();
    assert_eq!(seen.grants().len(), 2);
    let e = alt.put_object_acl().bucket("bkt").key("private").acl(ObjectCannedAcl::PublicRead).send().await;
    assert_eq!(e.unwrap_err().code(), Some("AccessDenied"));

    // Refused: an unknown user, an e-mail grantee, a canned ACL with grant headers, another owner.
    let e = root.put_bucket_acl().bucket("bkt").grant_read("id=\"nobody\"").send().await.unwrap_err();
    assert_eq!(e.code(), Some("InvalidArgument"));
    let e = root.put_bucket_acl().bucket("bkt").grant_read("emailAddress=\"a@b.c\"").send().await.unwrap_err();
    assert_eq!(e.code(), Some("UnresolvableGrantByEmailAddress"));
    let both = root.put_bucket_acl().bucket("bkt").acl(BucketCannedAcl::Private).grant_read(format!("id=\"{alt_id}\""));
    assert_eq!(both.send().await.unwrap_err().code(), Some("InvalidRequest"));
    let foreign = AccessControlPolicy::builder()
        .owner(Owner::builder().id(&alt_id).build())
        .grants(grant_to(&alt_id, Permission::FullControl))
        .build();
    let e = root.put_bucket_acl().bucket("bkt").access_control_policy(foreign).send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    // Configuration stays the owner's: an ACL cannot hand it out.
    root.put_bucket_acl().bucket("shared").acl(BucketCannedAcl::PublicReadWrite).send().await.unwrap();
    let e = alt.delete_bucket().bucket("shared").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    assert!(alt.put_bucket_acl().bucket("shared").acl(BucketCannedAcl::Private).send().await.is_err());

    // Everything above survives a restart.
    stop(s);
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    let url = |path: &str| format!("http://{}/{path}", s.s3);
    let (status, body) = anonymous(reqwest::Method::GET, url("closed/open")).await;
    assert_eq!((status, body.as_str()), (200, "data"));
    assert_eq!(anonymous(reqwest::Method::GET, url("bkt")).await.0, 200);
    assert_eq!(anonymous(reqwest::Method::GET, url("closed/shut")).await.0, 403);
    stop(s);
}

async fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = reqwest::Client::new().request(m, url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_rules_answer_preflights_and_mark_cross_origin_answers() {
    use aws_sdk_s3::types::{CorsConfiguration, CorsRule};
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    root.create_bucket().bucket("web").acl(BucketCannedAcl::PublicRead).send().await.unwrap();
    put(&root, "web", "page", Some(ObjectCannedAcl::PublicRead)).await.unwrap();
    let obj = format!("http://{}/web/page", s.s3);

    // No rules: a preflight is refused; without Origin or method it is malformed.
    let pre = [("Origin", "https://app.example.com"), ("Access-Control-Request-Method", "GET")];
    assert_eq!(request("OPTIONS", &obj, &pre).await.status(), 403);
    assert_eq!(request("OPTIONS", &obj, &[("Origin", "https://app.example.com")]).await.status(), 400);
    assert_eq!(request("OPTIONS", &obj, &[]).await.status(), 400);
    let e = root.get_bucket_cors().bucket("web").send().await.unwrap_err();
    assert_eq!(e.code(), Some("NoSuchCORSConfiguration"));

    let rule = CorsRule::builder()
        .allowed_origins("https://*.example.com")
        .allowed_methods("GET")
        .allowed_methods("PUT")
        .allowed_headers("x-amz-*")
        .expose_headers("ETag")
        .max_age_seconds(600)
        .build()
        .unwrap();
    let cfg = CorsConfiguration::builder().cors_rules(rule).build().unwrap();
    root.put_bucket_cors().bucket("web").cors_configuration(cfg).send().await.unwrap();
    let got = root.get_bucket_cors().bucket("web").send().await.unwrap();
    assert_eq!(got.cors_rules()[0].allowed_origins(), ["https://*.example.com"]);
    assert_eq!(got.cors_rules()[0].max_age_seconds(), Some(600));

    // A matching preflight: the origin, the methods, the headers asked for, the max age.
    let with_headers = [
        ("Origin", "https://app.example.com"),
        ("Access-Control-Request-Method", "PUT"),
        ("Access-Control-Request-Headers", "X-Amz-Date, x-amz-content-sha256"),
    ];
    let r = request("OPTIONS", &obj, &with_headers).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some("https://app.example.com"));
    assert_eq!(header(&r, "access-control-allow-methods").as_deref(), Some("GET, PUT"));
    assert_eq!(header(&r, "access-control-allow-headers").as_deref(), Some("x-amz-date, x-amz-content-sha256"));
    assert_eq!(header(&r, "access-control-max-age").as_deref(), Some("600"));
    // Another origin, a method or a header the rule does not name: refused.
    let r =
        request("OPTIONS", &obj, &[("Origin", "https://evil.test"), ("Access-Control-Request-Method", "GET")]).await;
    assert_eq!(r.status(), 403);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let delete = [("Origin", "https://app.example.com"), ("Access-Control-Request-Method", "DELETE")];
    assert_eq!(request("OPTIONS", &obj, &delete).await.status(), 403);
    let custom = [
        ("Origin", "https://app.example.com"),
        ("Access-Control-Request-Method", "GET"),
        ("Access-Control-Request-Headers", "x-custom"),
    ];
    assert_eq!(request("OPTIONS", &obj, &custom).await.status(), 403);
    let r = request("OPTIONS", &format!("http://{}/nobucket/k", s.s3), &pre).await;
    assert_eq!(r.status(), 404);

    // The real request from an allowed origin carries the headers (errors too); others' do not.
    let r = request("GET", &obj, &[("Origin", "https://app.example.com")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some("https://app.example.com"));
    assert_eq!(header(&r, "access-control-expose-headers").as_deref(), Some("ETag"));
    let r = request("GET", &format!("{obj}-missing"), &[("Origin", "https://app.example.com")]).await;
    assert_eq!(r.status(), 404);
    assert!(header(&r, "access-control-allow-origin").is_some());
    let r = request("GET", &obj, &[("Origin", "https://evil.test")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    assert_eq!(header(&request("GET", &obj, &[]).await, "access-control-allow-origin"), None);

    // Refused configurations leave the rules as they were; deleting them ends CORS.
    let bad = CorsRule::builder().allowed_origins("*").allowed_methods("PATCH").build().unwrap();
    let e = root
        .put_bucket_cors()
        .bucket("web")
        .cors_configuration(CorsConfiguration::builder().cors_rules(bad).build().unwrap())
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("InvalidArgument"));
    assert_eq!(request("OPTIONS", &obj, &pre).await.status(), 200);
    root.delete_bucket_cors().bucket("web").send().await.unwrap();
    assert_eq!(request("OPTIONS", &obj, &pre).await.status(), 403);
    stop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_policies_allow_deny_and_narrow_by_condition() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let (alt_ak, alt) = owning_key(&s);
    let alt_id = canonical_id(&alt_ak);
    let url = |path: &str| format!("http://{}/{path}", s.s3);
    root.create_bucket().bucket("pol").send().await.unwrap();
    for k in ["public/a", "public/secret", "private/b"] {
        put(&root, "pol", k, None).await.unwrap();
    }
    assert_eq!(get(&alt, "pol", "public/a").await, Err("AccessDenied".into()));
    let e = root.get_bucket_policy().bucket("pol").send().await.unwrap_err();
    assert_eq!(e.code(), Some("NoSuchBucketPolicy"));

    let policy = format!(
        r#"{{"Version":"2012-10-17","Statement":[
        {{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pol/public/*"}},
        {{"Effect":"Deny","Principal":{{"AWS":["{alt_id}"]}},"Action":"s3:GetObject","Resource":"arn:aws:s3:::pol/public/secret"}},
        {{"Effect":"Allow","Principal":{{"AWS":"{alt_ak}"}},"Action":"s3:ListBucket","Resource":"arn:aws:s3:::pol",
          "Condition":{{"StringEquals":{{"s3:prefix":"public/"}}}}}}]}}"#
    );
    root.put_bucket_policy().bucket("pol").policy(&policy).send().await.unwrap();
    let got = root.get_bucket_policy().bucket("pol").send().await.unwrap();
    assert_eq!(got.policy(), Some(policy.as_str()), "kept exactly as put");
    let status = root.get_bucket_policy_status().bucket("pol").send().await.unwrap();
    assert_eq!(status.policy_status().and_then(|p| p.is_public()), Some(true));

    // Allowed to everyone under public/; an explicit Deny beats that Allow for alt.
    let (status, body) = anonymous(reqwest::Method::GET, url("pol/public/a")).await;
    assert_eq!((status, body.as_str()), (200, "data"));
    assert_eq!(anonymous(reqwest::Method::GET, url("pol/private/b")).await.0, 403);
    assert_eq!(get(&alt, "pol", "public/a").await, Ok(b"data".to_vec()));
    assert_eq!(get(&alt, "pol", "public/secret").await, Err("AccessDenied".into()));
    assert_eq!(anonymous(reqwest::Method::GET, url("pol/public/secret")).await.0, 200);
    assert_eq!(put(&alt, "pol", "public/new", None).await, Err("AccessDenied".into()));
    // The condition narrows listing to one prefix.
    let listed = alt.list_objects_v2().bucket("pol").prefix("public/").send().await.unwrap();
    assert_eq!(listed.key_count(), Some(2));
    let e = alt.list_objects_v2().bucket("pol").prefix("private/").send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    assert!(alt.list_objects_v2().bucket("pol").send().await.is_err());

    // The client's address as a condition (the test talks over loopback).
    let by_ip = |op: &str, cidr: &str| {
        format!(
            r#"{{"Statement":{{"Effect":"Allow","Principal":"*","Action":"s3:GetObject",
            "Resource":"arn:aws:s3:::pol/*","Condition":{{"{op}":{{"aws:SourceIp":"{cidr}"}}}}}}}}"#
        )
    };
    root.put_bucket_policy().bucket("pol").policy(by_ip("IpAddress", "127.0.0.0/8")).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, url("pol/private/b")).await.0, 200);
    root.put_bucket_policy().bucket("pol").policy(by_ip("IpAddress", "10.0.0.0/8")).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, url("pol/private/b")).await.0, 403);

    // Malformed or foreign policies are refused and leave the policy in force.
    for bad in [
        "{not json",
        r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}}"#,
        r#"{"Statement":{"Effect":"Sometimes","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pol/*"}}"#,
    ] {
        let e = root.put_bucket_policy().bucket("pol").policy(bad).send().await.unwrap_err();
        assert_eq!(e.code(), Some("MalformedPolicy"), "{bad}");
    }
    assert_eq!(anonymous(reqwest::Method::GET, url("pol/private/b")).await.0, 403);
    // Only the owner (or the root key) manages a bucket's policy.
    let e = alt.put_bucket_policy().bucket("pol").policy(by_ip("IpAddress", "0.0.0.0/0")).send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));

    // A Deny binds the bucket's owner too, but never takes its policy from it.
    alt.create_bucket().bucket("alts").send().await.unwrap();
    put(&alt, "alts", "k", None).await.unwrap();
    let deny_all = r#"{"Statement":{"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::alts","arn:aws:s3:::alts/*"]}}"#;
    alt.put_bucket_policy().bucket("alts").policy(deny_all).send().await.unwrap();
    assert_eq!(get(&alt, "alts", "k").await, Err("AccessDenied".into()));
    // The root key too (as an account's root user), but it keeps the policy itself in hand.
    assert_eq!(get(&root, "alts", "k").await, Err("AccessDenied".into()), "a Deny binds the root key");
    root.get_bucket_policy().bucket("alts").send().await.unwrap();
    alt.get_bucket_policy().bucket("alts").send().await.unwrap();
    alt.delete_bucket_policy().bucket("alts").send().await.unwrap();
    assert_eq!(get(&alt, "alts", "k").await, Ok(b"data".to_vec()));

    // Policies survive a restart.
    stop(s);
    let s = start_with_root(&data, ROOT_AK, ROOT_SK, &[]);
    assert_eq!(anonymous(reqwest::Method::GET, format!("http://{}/pol/private/b", s.s3)).await.0, 403);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    root.put_bucket_policy().bucket("pol").policy(by_ip("IpAddress", "127.0.0.1/32")).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, format!("http://{}/pol/private/b", s.s3)).await.0, 200);
    stop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_access_block_refuses_and_ignores_public_grants() {
    use aws_sdk_s3::types::PublicAccessBlockConfiguration as Block;
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let url = |path: &str| format!("http://{}/{path}", s.s3);
    root.create_bucket().bucket("pab").acl(BucketCannedAcl::PublicRead).send().await.unwrap();
    put(&root, "pab", "open", Some(ObjectCannedAcl::PublicRead)).await.unwrap();
    let e = root.get_public_access_block().bucket("pab").send().await.unwrap_err();
    assert_eq!(e.code(), Some("NoSuchPublicAccessBlockConfiguration"));
    assert_eq!(anonymous(reqwest::Method::GET, url("pab/open")).await.0, 200);
    let public_policy =
        r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::pab/*"}}"#;

    // IgnorePublicAcls: the public grants stay but count for nothing.
    let set = |b: Block| root.put_public_access_block().bucket("pab").public_access_block_configuration(b);
    set(Block::builder().ignore_public_acls(true).build()).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, url("pab/open")).await.0, 403);
    assert_eq!(anonymous(reqwest::Method::GET, url("pab")).await.0, 403);
    let got = root.get_public_access_block().bucket("pab").send().await.unwrap();
    let cfg = got.public_access_block_configuration().unwrap();
    assert_eq!((cfg.ignore_public_acls(), cfg.block_public_acls()), (Some(true), Some(false)));

    // BlockPublicAcls and BlockPublicPolicy: public ACLs and policies are refused, private ones are not.
    set(Block::builder().block_public_acls(true).block_public_policy(true).build()).send().await.unwrap();
    assert_eq!(put(&root, "pab", "k", Some(ObjectCannedAcl::PublicRead)).await, Err("AccessDenied".into()));
    put(&root, "pab", "k", Some(ObjectCannedAcl::Private)).await.unwrap();
    let e = root.put_bucket_acl().bucket("pab").acl(BucketCannedAcl::PublicReadWrite).send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    let e = root.put_bucket_policy().bucket("pab").policy(public_policy).send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessDenied"));
    assert_eq!(anonymous(reqwest::Method::GET, url("pab/open")).await.0, 200, "existing grants still count");

    // RestrictPublicBuckets: a public policy admits no one.
    root.delete_public_access_block().bucket("pab").send().await.unwrap();
    root.put_bucket_policy().bucket("pab").policy(public_policy).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, url("pab/k")).await.0, 200);
    set(Block::builder().restrict_public_buckets(true).build()).send().await.unwrap();
    assert_eq!(anonymous(reqwest::Method::GET, url("pab/k")).await.0, 403);
    assert_eq!(get(&root, "pab", "k").await, Ok(b"data".to_vec()));
    stop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_controls_decide_who_owns_what_others_write() {
    use aws_sdk_s3::types::{ObjectOwnership, OwnershipControls, OwnershipControlsRule};
    let d = tempfile::tempdir().unwrap();
    let s = start_with_root(&d.path().join("store"), ROOT_AK, ROOT_SK, &[]);
    let root = s3_client(&s.s3, ROOT_AK, ROOT_SK);
    let (alt_ak, alt) = owning_key(&s);
    let (root_id, alt_id) = (canonical_id(ROOT_AK), canonical_id(&alt_ak));
    let owner_of = |key: &'static str| {
        let alt = alt.clone();
        async move {
            let acl = alt.get_object_acl().bucket("own").key(key).send().await.unwrap();
            acl.owner().and_then(|o| o.id()).unwrap_or_default().to_string()
        }
    };
    root.create_bucket().bucket("own").acl(BucketCannedAcl::PublicReadWrite).send().await.unwrap();
    let e = root.get_bucket_ownership_controls().bucket("own").send().await.unwrap_err();
    assert_eq!(e.code(), Some("OwnershipControlsNotFoundError"));
    let everyone = r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"*","Resource":["arn:aws:s3:::own","arn:aws:s3:::own/*"]}}"#;
    root.put_bucket_policy().bucket("own").policy(everyone).send().await.unwrap();
    let controls = |o: ObjectOwnership| {
        OwnershipControls::builder()
            .rules(OwnershipControlsRule::builder().object_ownership(o).build().unwrap())
            .build()
            .unwrap()
    };

    // Without controls (as ObjectWriter), the writer owns what it writes.
    put(&alt, "own", "w", None).await.unwrap();
    assert_eq!(owner_of("w").await, alt_id);
    // BucketOwnerPreferred: bucket-owner-full-control hands the object to the bucket's owner.
    let set = |o| root.put_bucket_ownership_controls().bucket("own").ownership_controls(controls(o));
    set(ObjectOwnership::BucketOwnerPreferred).send().await.unwrap();
    put(&alt, "own", "p", Some(ObjectCannedAcl::BucketOwnerFullControl)).await.unwrap();
    assert_eq!(owner_of("p").await, root_id);
    put(&alt, "own", "q", Some(ObjectCannedAcl::Private)).await.unwrap();
    assert_eq!(owner_of("q").await, alt_id);
    // BucketOwnerEnforced needs a private bucket ACL, then disables ACLs: everything is the owner's.
    let e = set(ObjectOwnership::BucketOwnerEnforced).send().await.unwrap_err();
    assert_eq!(e.code(), Some("InvalidBucketAclWithObjectOwnership"));
    root.put_bucket_acl().bucket("own").acl(BucketCannedAcl::Private).send().await.unwrap();
    set(ObjectOwnership::BucketOwnerEnforced).send().await.unwrap();
    put(&alt, "own", "e", None).await.unwrap();
    assert_eq!(owner_of("e").await, root_id);
    assert_eq!(
        put(&alt, "own", "e2", Some(ObjectCannedAcl::PublicRead)).await,
        Err("AccessControlListNotSupported".into())
    );
    let e = root.put_bucket_acl().bucket("own").acl(BucketCannedAcl::Private).send().await.unwrap_err();
    assert_eq!(e.code(), Some("AccessControlListNotSupported"));
    let got = root.get_bucket_ownership_controls().bucket("own").send().await.unwrap();
    let rule = &got.ownership_controls().unwrap().rules()[0];
    assert_eq!(rule.object_ownership(), &ObjectOwnership::BucketOwnerEnforced);
    root.delete_bucket_ownership_controls().bucket("own").send().await.unwrap();
    assert!(root.get_bucket_ownership_controls().bucket("own").send().await.is_err());
    stop(s);
}
