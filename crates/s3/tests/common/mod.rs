//! An in-process Mosaic (engine on the simulated device, real HTTP on 127.0.0.1:0) and SDK clients for it.

#![allow(dead_code)]

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_layer::{S3Semantics, SemanticsConfig};
use std::net::SocketAddr;
use std::sync::Arc;

pub const ACCESS_KEY: &str = "MOSAICTESTACCESSKEY1";
pub const SECRET_KEY: &str = "mosaic-test-secret-key-0123456789abcdef";

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub engine: Engine,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(256 << 20).await
    }

    pub async fn start_with(device_bytes: u64) -> TestServer {
        Self::start_full(device_bytes, None).await
    }

    /// With `domain`, virtual-host-style requests (bucket.DOMAIN) are served too.
    pub async fn start_full(device_bytes: u64, domain: Option<&str>) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let device = SimDevice::new(device_bytes);
        let engine = Engine::format(dir.path(), Arc::new(device), EngineConfig::default()).unwrap();
        let store = Arc::new(DriveStore::new(engine.clone()));
        let layer = Arc::new(S3Semantics::open(store, SemanticsConfig::default()).await.unwrap());
        let service = mosaic_s3::build_service(layer, ACCESS_KEY, SECRET_KEY, domain).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async move {
                let _ = rx.await;
            };
            mosaic_s3::serve(listener, service, Default::default(), None, stop, std::time::Duration::from_secs(5))
                .await
                .unwrap();
        });
        TestServer { addr, stop: Some(tx), task: Some(task), engine, _dir: dir }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client with the SDK's defaults (request checksums whenever supported, aws-chunked with a
    /// trailing checksum) or with checksums only when required.
    pub fn client(&self, default_checksums: bool) -> aws_sdk_s3::Client {
        client_with(&self.url(), ACCESS_KEY, SECRET_KEY, default_checksums)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
        self.engine.close().unwrap();
    }
}

pub fn client_with(url: &str, ak: &str, sk: &str, default_checksums: bool) -> aws_sdk_s3::Client {
    let creds = Credentials::new(ak, sk, None, None, "test");
    let (req, resp) = if default_checksums {
        (RequestChecksumCalculation::WhenSupported, ResponseChecksumValidation::WhenSupported)
    } else {
        (RequestChecksumCalculation::WhenRequired, ResponseChecksumValidation::WhenRequired)
    };
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(creds)
        .force_path_style(true)
        .request_checksum_calculation(req)
        .response_checksum_validation(resp)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// Deterministic bytes.
pub fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed as u64) as u8).collect()
}

pub fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(data))
}

/// The S3 error code of an SDK error.
pub fn code<E: aws_sdk_s3::error::ProvideErrorMetadata + std::fmt::Debug>(
    e: &aws_sdk_s3::error::SdkError<E>,
) -> String {
    match e {
        aws_sdk_s3::error::SdkError::ServiceError(s) => s.err().code().unwrap_or("").to_string(),
        other => format!("{other:?}"),
    }
}

pub fn status<E>(e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> u16 {
    match e {
        aws_sdk_s3::error::SdkError::ServiceError(s) => s.raw().status().as_u16(),
        _ => 0,
    }
}
