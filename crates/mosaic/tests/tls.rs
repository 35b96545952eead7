//! HTTPS end to end against a real `mosaic server` with a certificate made in the test
//! (scripts/test-cert.sh): S3 through aws-sdk-s3 and the admin CLI over TLS, SSE-C accepted over TLS
//! without being allowed over HTTP, aws:SecureTransport true in policies, plain HTTP refused on the TLS
//! port; SIGHUP serves a renewed certificate to new connections while open ones keep going, and a broken
//! renewal keeps the previous certificate. Three nodes whose calls to each other go over TLS (--cluster-ca)
//! serve what one wrote from the others; the cluster port refuses plain HTTP, and a node that trusts
//! another authority cannot join.

mod support;

use aws_sdk_s3::primitives::ByteStream;
use base64::Engine;
use md5::{Digest, Md5};
use std::path::{Path, PathBuf};
use support::{Server, cluster_secret, logged, run, start_with_args, start_with_root, stop};

const ROOT_AK: &str = "rootkey";
const ROOT_SK: &str = "rootsecret-0123456789";

/// Makes (once per directory) a test CA and a server certificate NAME.pem/NAME.key signed by it.
fn make_cert(dir: &Path, name: &str) {
    // The package's directory as cargo gives it to this run (a binary built from another checkout into a
    // shared target directory may be reused), else as it was at build time.
    let root = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let script = Path::new(&root).join("../../scripts/test-cert.sh");
    let out = std::process::Command::new(script).arg(dir).arg(name).output().expect("running test-cert.sh");
    assert!(out.status.success(), "test-cert.sh failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Replaces a file in one step (a reader sees the old or the new, never half of one).
fn replace(path: &Path, from: &Path) {
    let tmp = path.with_extension("tmp");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn pem_der(path: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(path).unwrap();
    let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
}

fn sdk_client(endpoint: &str, ca: &Path) -> aws_sdk_s3::Client {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    let trust = TrustStore::empty().with_native_roots(false).with_pem_certificate(std::fs::read(ca).unwrap());
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .tls_context(TlsContext::builder().with_trust_store(trust).build().unwrap())
        .build_https();
    let creds = aws_sdk_s3::config::Credentials::new(ROOT_AK, ROOT_SK, None, None, "test");
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(format!("https://{endpoint}"))
        .credentials_provider(creds)
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .http_client(http)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// A client trusting only the test CA, reporting the certificate each response came over.
fn https(ca: &Path) -> reqwest::blocking::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .tls_info(true)
        .build()
        .unwrap()
}

/// The leaf certificate (DER) a response came over.
fn served_cert(client: &reqwest::blocking::Client, url: &str) -> Vec<u8> {
    let resp = client.get(url).send().unwrap();
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>().expect("a TLS response");
    info.peer_certificate().expect("the server's certificate").to_vec()
}

struct Tls {
    _dir: tempfile::TempDir,
    certs: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

fn tls_files() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_cert(&certs, "first");
    make_cert(&certs, "second");
    let (cert, key) = (dir.path().join("tls.pem"), dir.path().join("tls.key"));
    replace(&cert, &certs.join("first.pem"));
    replace(&key, &certs.join("first.key"));
    Tls { ca: certs.join("ca.pem"), certs, cert, key, _dir: dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_admin_sse_c_and_policies_over_https() {
    let t = tls_files();
    let data = tempfile::tempdir().unwrap();
    let env = [("MOSAIC_TLS_CERT", t.cert.to_str().unwrap()), ("MOSAIC_TLS_KEY", t.key.to_str().unwrap())];
    let s = start_with_root(data.path(), ROOT_AK, ROOT_SK, &env);
    let c = sdk_client(&s.s3, &t.ca);
    c.create_bucket().bucket("sec").send().await.unwrap();
    let body: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    c.put_object().bucket("sec").key("big").body(ByteStream::from(body.clone())).send().await.unwrap();
    let got = c.get_object().bucket("sec").key("big").send().await.unwrap();
    assert_eq!(got.body.collect().await.unwrap().to_vec(), body);

    // SSE-C is accepted over TLS although the server does not allow it over plain HTTP.
    let b64 = base64::engine::general_purpose::STANDARD;
    let (key, md5) = (b64.encode([7u8; 32]), b64.encode(Md5::digest([7u8; 32])));
    c.put_object()
        .bucket("sec")
        .key("customer")
        .body(ByteStream::from_static(b"customer secret"))
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key)
        .sse_customer_key_md5(&md5)
        .send()
        .await
        .unwrap();
    let got = c
        .get_object()
        .bucket("sec")
        .key("customer")
        .sse_customer_algorithm("AES256")
        .sse_customer_key(&key)
        .sse_customer_key_md5(&md5)
        .send()
        .await
        .unwrap();
    assert_eq!(&got.body.collect().await.unwrap().to_vec()[..], b"customer secret");

    // aws:SecureTransport is true over TLS: a policy granting anonymous reads only then lets one through.
    let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*",
        "Action":"s3:GetObject","Resource":"arn:aws:s3:::sec/big",
        "Condition":{"Bool":{"aws:SecureTransport":"true"}}}]}"#;
    c.put_bucket_policy().bucket("sec").policy(policy).send().await.unwrap();
    let url = format!("https://{}/sec/big", s.s3);
    let anonymous = tokio::task::spawn_blocking({
        let (ca, url) = (t.ca.clone(), url.clone());
        move || https(&ca).get(&url).send().map(|r| (r.status().as_u16(), r.bytes().unwrap().len()))
    });
    assert_eq!(anonymous.await.unwrap().unwrap(), (200, body.len()));

    // Plain HTTP on the TLS port gets no S3 answer.
    let plain = tokio::task::spawn_blocking({
        let url = format!("http://{}/sec/big", s.s3);
        move || reqwest::blocking::get(url).map(|r| r.status().as_u16())
    });
    assert!(!matches!(plain.await.unwrap(), Ok(200)), "plain HTTP was served on the TLS port");

    // The admin CLI over HTTPS, trusting the test CA.
    let out = support::mosaic()
        .env("MOSAIC_ACCESS_KEY", ROOT_AK)
        .env("MOSAIC_SECRET_KEY", ROOT_SK)
        .args(["admin", "--json", "--admin", &s.admin, "--ca-cert", t.ca.to_str().unwrap(), "info"])
        .output()
        .unwrap();
    assert!(out.status.success(), "admin over HTTPS: {}", String::from_utf8_lossy(&out.stderr));
    let out = support::admin(&s, ROOT_AK, ROOT_SK, &["info"]);
    assert!(!out.status.success(), "the admin port answered plain HTTP");
    assert_eq!(stop(s).0, 0);
}

#[test]
fn sighup_serves_a_renewed_certificate_to_new_connections_only() {
    let t = tls_files();
    let data = tempfile::tempdir().unwrap();
    let env = [("MOSAIC_TLS_CERT", t.cert.to_str().unwrap()), ("MOSAIC_TLS_KEY", t.key.to_str().unwrap())];
    let s = start_with_root(data.path(), ROOT_AK, ROOT_SK, &env);
    let url = format!("https://{}/", s.s3);
    let (first, second) = (pem_der(&t.certs.join("first.pem")), pem_der(&t.certs.join("second.pem")));
    let open = https(&t.ca);
    assert_eq!(served_cert(&open, &url), first);

    replace(&t.cert, &t.certs.join("second.pem"));
    replace(&t.key, &t.certs.join("second.key"));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    logged(&s, "SIGHUP: TLS certificate reloaded");
    assert_eq!(served_cert(&https(&t.ca), &url), second, "a new connection gets the renewed certificate");
    assert_eq!(served_cert(&open, &url), first, "the open connection was kept");

    // A key that does not fit: the server keeps serving the renewed pair.
    replace(&t.key, &t.certs.join("first.key"));
    unsafe { libc::kill(s.child.id() as i32, libc::SIGHUP) };
    let warned = logged(&s, "SIGHUP: TLS certificate not reloaded; serving the previous one");
    assert!(warned["error"].as_str().unwrap().contains("does not fit"), "{warned}");
    assert_eq!(served_cert(&https(&t.ca), &url), second);
    assert_eq!(stop(s).0, 0);
}

#[test]
fn bad_tls_settings_are_refused_at_start() {
    let t = tls_files();
    let data = tempfile::tempdir().unwrap();
    let d = data.path().to_str().unwrap();
    let base = ["server", "--data", d, "--s3-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"];
    let cert = t.cert.to_str().unwrap();
    let (code, _, err) = run(&[&base[..], &["--tls-cert", cert]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("tls_key"), "{err}");
    let wrong_key = t.certs.join("second.key");
    let (code, _, err) = run(&[&base[..], &["--tls-cert", cert, "--tls-key", wrong_key.to_str().unwrap()]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("does not fit"), "{err}");
    let (code, _, err) = run(&[&base[..], &["--tls-cert", cert, "--tls-key", "/nonexistent/key.pem"]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("cannot read /nonexistent/key.pem"), "{err}");
    // The cluster's authority must be certificates: a key file is not (a new data directory: a cluster
    // node's is its own kind).
    let node = tempfile::tempdir().unwrap();
    let key = t.key.to_str().unwrap();
    let (server, addresses) = (&["server", "--data", node.path().to_str().unwrap()], &base[3..]);
    let cluster = ["--cluster-address", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--cluster-ca", key];
    let (code, _, err) = run(&[&server[..], addresses, &cluster[..]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("cluster_ca") && err.contains("CERTIFICATE"), "{err}");
}

/// A cluster node over TLS: two drives, its certificate for every port, `ca` as the cluster's authority.
fn tls_node(dir: &Path, t: &Tls, ca: &Path, join: Option<&str>) -> Server {
    let drives = format!("{},{}", dir.join("d0").display(), dir.join("d1").display());
    let secret = cluster_secret();
    let env = [
        ("MOSAIC_DRIVES", drives.as_str()),
        ("MOSAIC_DRIVE_SIZE", "96MiB"),
        ("MOSAIC_CLUSTER_SECRET", secret.as_str()),
        ("MOSAIC_ACCESS_KEY", ROOT_AK),
        ("MOSAIC_SECRET_KEY", ROOT_SK),
    ];
    let (cert, key, ca) = (t.cert.to_str().unwrap(), t.key.to_str().unwrap(), ca.to_str().unwrap());
    let mut args = vec!["--tls-cert", cert, "--tls-key", key, "--cluster-ca", ca, "--cluster-address", "127.0.0.1:0"];
    if let Some(peer) = join {
        args.extend(["--join", peer]);
    }
    start_with_args(&dir.join("data"), &env, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_call_each_other_over_tls() {
    let t = tls_files();
    let dir = tempfile::tempdir().unwrap();
    let a = tls_node(&dir.path().join("a"), &t, &t.ca, None);
    let out = support::mosaic()
        .env("MOSAIC_ACCESS_KEY", ROOT_AK)
        .env("MOSAIC_SECRET_KEY", ROOT_SK)
        .args(["admin", "--json", "--admin", &a.admin, "--ca-cert", t.ca.to_str().unwrap()])
        .args(["cluster", "init", "--erasure", "2+1", "--groups", "8"])
        .output()
        .unwrap();
    assert!(out.status.success(), "cluster init over HTTPS: {}", String::from_utf8_lossy(&out.stderr));
    let a_cluster = a.cluster.clone().unwrap();
    let b = tls_node(&dir.path().join("b"), &t, &t.ca, Some(&a_cluster));
    let c = tls_node(&dir.path().join("c"), &t, &t.ca, Some(&a_cluster));
    for s in [&a, &b, &c] {
        logged(s, "serving the cluster map");
    }
    // 2+1 sets over three nodes: every object has shards on the other nodes, written and read over TLS.
    let body: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 249) as u8).collect();
    sdk_client(&a.s3, &t.ca).create_bucket().bucket("spread").send().await.unwrap();
    for i in 0..6 {
        let put = sdk_client(&a.s3, &t.ca).put_object().bucket("spread").key(format!("k{i}"));
        put.body(ByteStream::from(body[..body.len() >> i].to_vec())).send().await.unwrap();
    }
    for s in [&b, &c] {
        for i in 0..6 {
            let got = sdk_client(&s.s3, &t.ca).get_object().bucket("spread").key(format!("k{i}")).send().await.unwrap();
            assert!(got.body.collect().await.unwrap().to_vec() == body[..body.len() >> i], "k{i} read back wrong");
        }
    }

    // Plain HTTP on the cluster port gets no answer.
    let plain = tokio::task::spawn_blocking({
        let url = format!("http://{a_cluster}/cluster/status");
        move || reqwest::blocking::Client::new().post(url).send().map(|r| r.status().as_u16())
    });
    assert!(plain.await.unwrap().is_err(), "the cluster port answered plain HTTP");

    // A node that trusts another authority does not accept the cluster's certificates: it cannot join.
    let other = dir.path().join("other-ca");
    make_cert(&other, "node");
    let data = dir.path().join("stranger");
    let drives = format!("{},{}", data.join("d0").display(), data.join("d1").display());
    let refused = support::mosaic()
        .env("MOSAIC_CLUSTER_SECRET", cluster_secret())
        .env("MOSAIC_DRIVES", &drives)
        .args(["server", "--data", data.join("data").to_str().unwrap(), "--drive-size", "96MiB"])
        .args(["--s3-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0", "--cluster-address", "127.0.0.1:0"])
        .args(["--tls-cert", other.join("node.pem").to_str().unwrap()])
        .args(["--tls-key", other.join("node.key").to_str().unwrap()])
        .args(["--cluster-ca", other.join("ca.pem").to_str().unwrap(), "--join", &a_cluster])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("joining the cluster") && err.contains("invalid peer certificate"), "{err}");
    for s in [a, b, c] {
        assert_eq!(stop(s).0, 0);
    }
}
