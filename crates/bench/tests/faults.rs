//! A wrong body on GET, an HTTP error and a timeout each show up in the bench's error counts. The store
//! here is a small fake S3 server that misbehaves on purpose in one way per test.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use mosaic_bench::s3::{S3BenchOptions, S3Workload, SizeRange, run_s3_bench};
use std::convert::Infallible;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// GETs return bytes of the right length that were never written.
    WrongBody,
    /// Object requests fail with 500 InternalError.
    ServerError,
    /// Object requests are never answered.
    Hang,
}

const LIST_EMPTY: &str = "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name><KeyCount>0</KeyCount>\
<IsTruncated>false</IsTruncated></ListBucketResult>";
const VERSIONS_EMPTY: &str = "<?xml version=\"1.0\"?><ListVersionsResult><Name>b</Name>\
<IsTruncated>false</IsTruncated></ListVersionsResult>";
const INTERNAL_ERROR: &str =
    "<?xml version=\"1.0\"?><Error><Code>InternalError</Code><Message>injected</Message></Error>";

fn respond(status: u16, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert("etag", hyper::header::HeaderValue::from_static("\"0\""));
    r
}

async fn handle(fault: Fault, req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Path style: /bucket or /bucket/ is the bucket, /bucket/key an object.
    let path = req.uri().path().trim_start_matches('/');
    let is_object = path.split_once('/').is_some_and(|(_, key)| !key.is_empty());
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or("").to_string();
    let listing = query.contains("list-type=2");
    let versions = query.split('&').any(|p| p == "versions" || p.starts_with("versions="));
    // Read the whole request body so the client sees its request through.
    let _ = req.into_body().collect().await;
    Ok(match (is_object, fault) {
        (false, _) if method == Method::GET && listing => respond(200, Bytes::from(LIST_EMPTY)),
        (false, _) if method == Method::GET && versions => respond(200, Bytes::from(VERSIONS_EMPTY)),
        (false, _) if method == Method::DELETE => respond(204, Bytes::new()),
        (false, _) => respond(200, Bytes::new()),
        (true, Fault::Hang) => std::future::pending().await,
        (true, Fault::ServerError) => respond(500, Bytes::from(INTERNAL_ERROR)),
        // As long as what the bench wrote, but not what it wrote.
        (true, Fault::WrongBody) if method == Method::GET => respond(200, Bytes::from(vec![0x5a; 4096])),
        (true, Fault::WrongBody) => respond(200, Bytes::new()),
    })
}

async fn fake_s3(fault: Fault) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| handle(fault, req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

fn options(endpoint: &str, workload: S3Workload) -> S3BenchOptions {
    let mut o = S3BenchOptions::new(endpoint, "ak", "sk", workload);
    o.warmup = Duration::ZERO;
    o.concurrency = 2;
    o.objects = Some(4);
    o.size = Some(SizeRange::fixed(4096));
    o.ops = Some(20);
    o.duration = Duration::from_secs(60);
    o
}

#[tokio::test]
async fn a_wrong_body_on_get_is_a_verify_error() {
    let endpoint = fake_s3(Fault::WrongBody).await;
    let r = run_s3_bench(&options(&endpoint, S3Workload::ReadOnly)).await.unwrap();
    let get = &r.operations["GET"];
    assert!(get.errors > 0, "{r:?}");
    assert_eq!(get.ops, 0, "a wrong body never counts as a good read");
    assert_eq!(get.error_classes["verify"], get.errors);
    assert_eq!(r.total.errors, get.errors);
    assert!(r.first_error.as_deref().unwrap_or("").contains("verify"));
}

#[tokio::test]
async fn an_http_error_is_counted_with_its_status_and_code() {
    let endpoint = fake_s3(Fault::ServerError).await;
    let r = run_s3_bench(&options(&endpoint, S3Workload::WriteOnly)).await.unwrap();
    let put = &r.operations["PUT"];
    assert_eq!(put.errors, 20);
    assert_eq!(put.ops, 0);
    assert_eq!(put.error_classes["http_500_InternalError"], 20);
}

#[tokio::test]
async fn a_timeout_is_counted() {
    let endpoint = fake_s3(Fault::Hang).await;
    let mut o = options(&endpoint, S3Workload::WriteOnly);
    o.ops = Some(4);
    o.timeout = Duration::from_millis(200);
    let r = run_s3_bench(&o).await.unwrap();
    let put = &r.operations["PUT"];
    assert_eq!(put.errors, 4);
    assert_eq!(put.error_classes["timeout"], 4);
}

#[tokio::test]
async fn a_failed_prepare_stops_the_run_with_the_reason() {
    let endpoint = fake_s3(Fault::ServerError).await;
    let e = run_s3_bench(&options(&endpoint, S3Workload::CosbenchA)).await.unwrap_err();
    assert!(e.contains("preparing") && e.contains("http_500_InternalError"), "{e}");
}

/// The ceiling server takes the bench's PUTs and serves its GETs back verified: a small-GET run against it
/// completes with no errors and every body read back exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_serves_a_get_workload_without_errors() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(mosaic_bench::ceiling::serve(listener));
    let mut o = S3BenchOptions::new(&format!("http://{addr}"), "ak", "sk", S3Workload::CosbenchA);
    o.mix = Some(mosaic_bench::s3::Mix { get: 100, put: 0, delete: 0, zipf: false });
    o.objects = Some(50);
    o.ops = Some(500);
    o.warmup = Duration::ZERO;
    o.concurrency = 4;
    o.keep = true;
    o.progress = false;
    let r = run_s3_bench(&o).await.unwrap();
    assert_eq!(r.total.errors, 0, "{r:?}");
    assert_eq!(r.operations["GET"].ops, 500, "every GET read its body back exactly");
    server.abort();
}
