//! The erasure codes side by side on one set geometry: encoding k data shards, rebuilding the data a read
//! lost (two data shards of a 4+2 set), and heal's rebuild of one shard from borrowed reads. Throughput is
//! in bytes of object (k shards) per second.
//!
//! `cargo bench -p mosaic-erasure --bench codec`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mosaic_erasure::{CODEC_REED_SOLOMON, CODEC_REED_SOLOMON_GF8, Codec, codec_by_id, gf8_supported};
use std::sync::Arc;

const K: usize = 4;
const M: usize = 2;
/// One shard of a 1 MiB read chunk on 4+2 (256 KiB) and of a 4 MiB stripe run (1 MiB).
const SHARD_SIZES: [usize; 2] = [256 << 10, 1 << 20];

fn codes() -> Vec<(&'static str, Arc<dyn Codec>)> {
    let mut out = vec![("gf16", codec_by_id(CODEC_REED_SOLOMON, K, M).expect("GF(2^16) code"))];
    if gf8_supported() {
        out.push(("gf8", codec_by_id(CODEC_REED_SOLOMON_GF8, K, M).expect("GF(2^8) code")));
    }
    out
}

fn shards(len: usize) -> Vec<Vec<u8>> {
    (0..K).map(|i| (0..len).map(|b| (b.wrapping_mul(31) ^ i.wrapping_mul(7919)) as u8).collect()).collect()
}

fn encoded(codec: &dyn Codec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity = vec![vec![0u8; len]; M];
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
    codec.encode(&refs, &mut prefs).expect("encode");
    data.iter().cloned().chain(parity).collect()
}

fn codecs(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec_4_2");
    for len in SHARD_SIZES {
        group.throughput(Throughput::Bytes((K * len) as u64));
        let data = shards(len);
        for (name, codec) in codes() {
            let whole = encoded(&*codec, &data);
            let mut parity = vec![vec![0u8; len]; M];
            group.bench_with_input(BenchmarkId::new(format!("encode/{name}"), len), &len, |b, _| {
                let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                b.iter(|| {
                    let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
                    codec.encode(&refs, &mut prefs).expect("encode")
                })
            });
            // A degraded read: data shards 0 and 1 lost, rebuilt from 2, 3 and the parity.
            // The shards read stay; the two lost ones are made anew each time, as a read makes them.
            let mut s: Vec<Option<Vec<u8>>> = whole.iter().cloned().map(Some).collect();
            group.bench_with_input(BenchmarkId::new(format!("read_two_lost/{name}"), len), &len, |b, _| {
                b.iter(|| {
                    (s[0], s[1]) = (None, None);
                    codec.reconstruct_data(&mut s).expect("rebuild")
                })
            });
            assert_eq!(s[0].as_deref(), Some(&whole[0][..]));
            // Heal: shard 0 rebuilt from borrowed reads of the others.
            let mut out = vec![0u8; len];
            group.bench_with_input(BenchmarkId::new(format!("heal_one/{name}"), len), &len, |b, _| {
                let refs: Vec<Option<&[u8]>> =
                    whole.iter().enumerate().map(|(i, v)| (i != 0).then_some(v.as_slice())).collect();
                b.iter(|| codec.rebuild_one(&refs, 0, &mut out).expect("rebuild"))
            });
            assert_eq!(out, whole[0]);
        }
    }
    group.finish();
}

criterion_group!(benches, codecs);
criterion_main!(benches);
