//! What the object-drive protocol costs: the same S3 operations on a 1+0 set whose drive is this process's
//! own and on one whose drive is reached through the protocol on loopback (one drive server). The drive
//! is a simulated device in memory, so the difference is the protocol (encoding, HTTP, copies), not the
//! disk; "remote-tls" is the protocol over TLS (a certificate made by scripts/test-cert.sh, needs openssl).
//! Run: `cargo bench -p mosaic-remote --bench drive_protocol`.
//! The allocator is the server binary's (mimalloc): with the system's, fresh megabyte buffers are page
//! faults that the binary does not pay, and they would dominate the large rows.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use mosaic_cluster::capability::CapabilityKey;
use mosaic_cluster::rpc::{self, RpcClient, Secret};
use mosaic_drive::DriveStore;
use mosaic_engine::{Engine, EngineConfig, SimDevice};
use mosaic_erasure::{ErasureSet, SetConfig, SetGeometry};
use mosaic_layer::testing::{body, pattern};
use mosaic_layer::{ObjectLayer, Precondition, PutOptions, S3Semantics, SemanticsConfig};
use mosaic_remote::server::Guard;
use mosaic_remote::wire::{Fence, GroupPlacement};
use mosaic_remote::{DriveServer, RemoteStore};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DRIVE_BYTES: u64 = 1 << 30;
const SIZES: [usize; 2] = [4 << 10, 1 << 20];

fn set_config() -> SetConfig {
    SetConfig::new(SetGeometry::new(1, 0).expect("1+0"))
}

fn drive(dir: &tempfile::TempDir) -> DriveStore {
    let config = EngineConfig { kv_write_buffer_bytes: 16 << 20, kv_block_cache_bytes: 64 << 20, ..Default::default() };
    DriveStore::new(Engine::format(dir.path(), Arc::new(SimDevice::new(DRIVE_BYTES)), config).expect("a drive"))
}

async fn local_layer(dir: &tempfile::TempDir) -> Arc<dyn ObjectLayer> {
    let set = ErasureSet::open(set_config(), vec![Some(Arc::new(drive(dir)))]).await.expect("a set");
    Arc::new(S3Semantics::open(Arc::new(set), SemanticsConfig::default()).await.expect("a layer"))
}

/// TLS for the drive server and its client: a test authority and a certificate for 127.0.0.1 in `dir`.
fn tls(dir: &std::path::Path) -> rpc::Tls {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-cert.sh");
    let made = std::process::Command::new(script).arg(dir).arg("node").status().expect("running test-cert.sh");
    assert!(made.success(), "test-cert.sh failed");
    let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("node.pem")).expect("a chain").flatten().collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("node.key")).expect("a key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let ca = std::fs::read(dir.join("ca.pem")).expect("the authority");
    let roots = reqwest::Certificate::from_pem_bundle(&ca).expect("PEM");
    rpc::Tls::new(tokio_rustls::TlsAcceptor::from(Arc::new(config)), roots).expect("TLS")
}

async fn remote_layer(dir: &tempfile::TempDir, tls: Option<rpc::Tls>) -> Arc<dyn ObjectLayer> {
    let secret = Secret::generate();
    // Guarded as in a cluster: every command carries a group's placement and a capability for its
    // collections, and the server checks both.
    let fence: mosaic_remote::server::FenceCheck = Arc::new(|_: &Fence| Ok(()));
    let guard = Guard { fence, capabilities: CapabilityKey::of(&secret) };
    let server = DriveServer::new(HashMap::from([("d0".to_string(), Arc::new(drive(dir)))]), Some(guard), None);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("an address").to_string();
    tokio::spawn(rpc::serve(listener, secret.clone(), tls.clone(), server, std::future::pending()));
    let client = RpcClient::new(secret, tls.as_ref()).expect("a client");
    let fence = Fence { node: 1, epoch: 7, placement_epoch: 5, group: None };
    let remote = RemoteStore::connect(client, &address, "d0", Some(fence)).await.expect("the drive answers");
    let remote = remote.for_group(GroupPlacement { pg: 3, served: vec![0, 2, 4], kept: None }, "");
    let set = ErasureSet::open(set_config(), vec![Some(Arc::new(remote))]).await.expect("a set");
    Arc::new(S3Semantics::open(Arc::new(set), SemanticsConfig::default()).await.expect("a layer"))
}

async fn get(layer: &dyn ObjectLayer, key: &str) -> usize {
    let mut got = layer.get_object("bench", key, None, None, None, &Precondition::default()).await.expect("get");
    let mut n = 0;
    while let Some(chunk) = got.body.next().await {
        n += chunk.expect("a chunk").len();
    }
    n
}

fn protocol(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().expect("a dir")).collect();
    let layers = rt.block_on(async {
        let layers = [
            ("local", local_layer(&dirs[0]).await),
            ("remote", remote_layer(&dirs[1], None).await),
            ("remote-tls", remote_layer(&dirs[2], Some(tls(dirs[3].path()))).await),
        ];
        for (_, layer) in &layers {
            layer.create_bucket("bench", None).await.expect("a bucket");
            for size in SIZES {
                let key = format!("o{size}");
                layer
                    .put_object("bench", &key, body(&pattern(1, size), 1 << 20), PutOptions::default())
                    .await
                    .expect("put");
            }
        }
        layers
    });
    let mut group = c.benchmark_group("drive_protocol");
    group.sample_size(30).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for size in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let data = pattern(2, size);
        let key = format!("o{size}");
        for (name, layer) in &layers {
            group.bench_with_input(BenchmarkId::new(format!("get/{name}"), size), &size, |b, _| {
                b.to_async(&rt).iter(|| async { assert_eq!(get(&**layer, &key).await, size) })
            });
            group.bench_with_input(BenchmarkId::new(format!("put/{name}"), size), &size, |b, _| {
                b.to_async(&rt).iter(|| async {
                    layer.put_object("bench", &key, body(&data, 1 << 20), PutOptions::default()).await.expect("put")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, protocol);
criterion_main!(benches);
