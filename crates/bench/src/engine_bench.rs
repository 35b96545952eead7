//! Paper 001's workloads on one engine drive: within-block (2 KiB at offset 0 of each block, appending),
//! cross-block (4 KiB at offset 2048 of each block), and aligned writes of a given size. Every write is
//! its own durable transaction, submitted by `queue_depth` threads at once (group commit batches them).

use crate::report::{Latency, latency, rss_bytes_max};
use hdrhistogram::Histogram;
use mosaic_engine::{
    AlignedBuf, BLOCK_SIZE_BYTES, Device, Engine, EngineConfig, FileDevice, IoEngine, Op, SimDevice, Transaction,
    WriteMode,
};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    WithinBlock,
    CrossBlock,
    Aligned,
}

#[derive(Clone, Debug)]
pub enum Target {
    /// A regular file (created and preallocated if missing) or a block device.
    Path(PathBuf),
    /// The simulated in-memory device.
    Sim,
}

#[derive(Clone, Debug)]
pub struct EngineBenchOptions {
    pub workload: Workload,
    pub target: Target,
    /// Size of the device (file) to create, when it does not exist; and of the simulated device.
    pub device_bytes: u64,
    pub io_size_bytes: u64,
    pub object_size_bytes: u64,
    pub total_bytes: u64,
    pub queue_depth: usize,
    pub mode: WriteMode,
    /// How a file device issues IO.
    pub io_engine: IoEngine,
}

#[derive(Serialize, Clone, Debug)]
pub struct EngineBenchResult {
    pub workload: Workload,
    pub mode: String,
    pub target: String,
    /// What the engine's caches and memtables may hold by configuration (compare with rss_bytes_max).
    pub memory_budget_bytes: u64,
    /// Block-map entries after the run, and their key and value bytes per MiB of data they map.
    pub block_map_entries: u64,
    pub block_map_bytes_per_mib: f64,
    /// How the device's IO was issued: io_uring, pread or memory (simulated).
    pub io_path: String,
    pub io_size_bytes: u64,
    pub object_size_bytes: u64,
    pub queue_depth: usize,
    pub ops: u64,
    pub seconds: f64,
    pub throughput_mib_s: f64,
    pub ops_per_s: f64,
    pub user_bytes: u64,
    pub device_bytes_written: u64,
    /// IOs the drive issued in the timed phase, and their mean sizes (paper 000's IO size).
    pub device_write_ios: u64,
    pub device_read_ios: u64,
    pub mean_write_io_bytes: f64,
    /// Mean length of the sequential write runs that ended in the timed phase (paper 000's chains).
    pub mean_write_run_bytes: f64,
    pub kv_bytes_written: u64,
    pub kv_wal_bytes: u64,
    pub kv_flush_bytes: u64,
    pub kv_compaction_bytes: u64,
    pub write_amplification: f64,
    pub rmw_on_write_path: u64,
    pub rmw_in_lazy_sync: u64,
    pub fragments_outstanding: u64,
    pub groups_committed: u64,
    /// Groups the committer held open for more writers (`EngineConfig::commit_gather`).
    pub groups_gathered: u64,
    /// After the timed phase, lazy sync is let run until no block is over its thresholds; these count the
    /// whole run including that deferred work (what the workload really costs).
    pub lazy_sync_seconds: f64,
    pub device_bytes_written_with_lazy_sync: u64,
    pub kv_bytes_written_with_lazy_sync: u64,
    pub write_amplification_with_lazy_sync: f64,
    pub fragments_outstanding_after_lazy_sync: u64,
    #[serde(flatten)]
    pub latency: Latency,
    pub rss_bytes_max: u64,
}

/// One write of the workload: (object index, offset, length).
fn plan(o: &EngineBenchOptions) -> Result<Vec<(u64, u64, u64)>, String> {
    let bs = BLOCK_SIZE_BYTES;
    let (step, len, first) = match o.workload {
        Workload::WithinBlock => (bs, 2048, 0),
        Workload::CrossBlock => (bs, 4096, 2048),
        Workload::Aligned => {
            if o.io_size_bytes == 0 || !o.io_size_bytes.is_multiple_of(bs) {
                return Err(format!("--io-size must be a positive multiple of {bs}"));
            }
            (o.io_size_bytes, o.io_size_bytes, 0)
        }
    };
    if o.object_size_bytes < step + first + len {
        return Err("--object-size is too small for this workload".into());
    }
    let per_object = (o.object_size_bytes - first - len) / step + 1;
    let total_ops = o.total_bytes / len;
    if total_ops == 0 {
        return Err("--total is smaller than one write".into());
    }
    Ok((0..total_ops).map(|i| (i / per_object, first + (i % per_object) * step, len)).collect())
}

/// Incompressible bytes, so that KV compression cannot flatter the fragment log.
fn payload(len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn run_engine_bench(o: &EngineBenchOptions, progress: &dyn Fn(u64, u64)) -> Result<EngineBenchResult, String> {
    let writes = plan(o)?;
    let kv_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (device, target): (Arc<dyn Device>, String) = match &o.target {
        Target::Sim => (Arc::new(SimDevice::new(o.device_bytes)), "sim".into()),
        Target::Path(p) => {
            let dev = if p.exists() {
                FileDevice::open_with(p, o.io_engine)
            } else {
                FileDevice::create_with(p, o.device_bytes, o.io_engine)
            };
            (Arc::new(dev.map_err(|e| format!("cannot open {}: {e}", p.display()))?), p.display().to_string())
        }
    };
    let io_path = device.io_path().to_string();
    let cfg = EngineConfig { write_mode: o.mode, ..Default::default() };
    let engine = Engine::format(kv_dir.path(), device, cfg).map_err(|e| e.to_string())?;
    let coll = engine
        .submit(Transaction::new().op(Op::CreateCollection { name: "bench".into() }))
        .map_err(|e| e.to_string())?
        .created_collections[0];
    let before = engine.stats();
    // Aligned memory, as the S3 layer stages from: the device writes it without a bounce copy.
    let data = Arc::new(AlignedBuf::copy_of(&payload(writes[0].2, 7)));
    let writes = Arc::new(writes);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let qd = o.queue_depth.max(1);
    let aligned = o.workload == Workload::Aligned;
    let mut handles = Vec::new();
    // Each thread owns the objects i with i % qd == t, so every object's writes stay in order.
    for t in 0..qd {
        let (engine, writes, data, next) = (engine.clone(), writes.clone(), data.clone(), next.clone());
        handles.push(std::thread::spawn(move || -> Result<Histogram<u64>, String> {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
            for &(obj, offset, len) in writes.iter().filter(|w| w.0 as usize % qd == t) {
                let name = format!("obj-{obj:08}").into_bytes();
                let bytes = &data.as_slice()[..len as usize];
                let t0 = Instant::now();
                // Aligned writes take the engine's large-write path (as the S3 layer's PUT does): whole
                // blocks staged on this thread, then a transaction that references them.
                let op = if aligned {
                    let staged = engine.stage(bytes, true).map_err(|e| e.to_string())?;
                    Op::WriteStaged { coll, name, offset, staged }
                } else {
                    Op::Write { coll, name, offset, data: bytes.to_vec() }
                };
                engine.submit(Transaction::new().op(op)).map_err(|e| e.to_string())?;
                h.record(t0.elapsed().as_micros().max(1) as u64).map_err(|e| e.to_string())?;
                next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(h)
        }));
    }
    let total = writes.len() as u64;
    while handles.iter().any(|h| !h.is_finished()) {
        progress(next.load(std::sync::atomic::Ordering::Relaxed) as u64, total);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    for h in handles {
        let part = h.join().map_err(|_| "a bench thread panicked".to_string())??;
        hist.add(part).map_err(|e| e.to_string())?;
    }
    let seconds = started.elapsed().as_secs_f64();
    progress(total, total);
    let after = engine.stats();
    let sync_started = Instant::now();
    engine.sync_fragments(false).map_err(|e| e.to_string())?;
    let lazy_sync_seconds = sync_started.elapsed().as_secs_f64();
    let synced = engine.stats();
    let block_map = engine.block_map_size().map_err(|e| e.to_string())?;
    let memory_budget_bytes = engine.memory_budget_bytes();
    engine.close().map_err(|e| e.to_string())?;
    let dev_synced = synced.device_bytes_written - before.device_bytes_written;
    let kv_synced = synced.kv_bytes_written() - before.kv_bytes_written();
    let user = after.user_bytes_written - before.user_bytes_written;
    let dev = after.device_bytes_written - before.device_bytes_written;
    let kv = after.kv_bytes_written() - before.kv_bytes_written();
    Ok(EngineBenchResult {
        workload: o.workload,
        mode: match o.mode {
            WriteMode::FragmentLog => "fragment-log".into(),
            WriteMode::Rmw => "rmw".into(),
        },
        target,
        io_path,
        io_size_bytes: writes[0].2,
        object_size_bytes: o.object_size_bytes,
        queue_depth: qd,
        ops: total,
        seconds,
        throughput_mib_s: user as f64 / (1 << 20) as f64 / seconds,
        ops_per_s: total as f64 / seconds,
        user_bytes: user,
        device_bytes_written: dev,
        device_write_ios: after.device_write_ios - before.device_write_ios,
        device_read_ios: after.device_read_ios - before.device_read_ios,
        mean_write_io_bytes: dev as f64 / (after.device_write_ios - before.device_write_ios).max(1) as f64,
        mean_write_run_bytes: dev as f64 / (after.write_runs() - before.write_runs()).max(1) as f64,
        kv_bytes_written: kv,
        kv_wal_bytes: after.kv_wal_bytes - before.kv_wal_bytes,
        kv_flush_bytes: after.kv_flush_bytes - before.kv_flush_bytes,
        kv_compaction_bytes: after.kv_compaction_bytes - before.kv_compaction_bytes,
        write_amplification: (dev + kv) as f64 / user.max(1) as f64,
        rmw_on_write_path: after.rmw_on_write_path - before.rmw_on_write_path,
        rmw_in_lazy_sync: after.rmw_in_lazy_sync - before.rmw_in_lazy_sync,
        fragments_outstanding: after.fragments_outstanding,
        groups_committed: after.groups_committed - before.groups_committed,
        groups_gathered: after.groups_gathered - before.groups_gathered,
        lazy_sync_seconds,
        device_bytes_written_with_lazy_sync: dev_synced,
        kv_bytes_written_with_lazy_sync: kv_synced,
        write_amplification_with_lazy_sync: (dev_synced + kv_synced) as f64
            / (after.user_bytes_written - before.user_bytes_written).max(1) as f64,
        fragments_outstanding_after_lazy_sync: synced.fragments_outstanding,
        memory_budget_bytes,
        block_map_entries: block_map.entries,
        block_map_bytes_per_mib: block_map.bytes as f64 / (block_map.blocks.max(1) * BLOCK_SIZE_BYTES) as f64
            * (1 << 20) as f64,
        latency: latency(&hist),
        rss_bytes_max: rss_bytes_max(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(workload: Workload) -> EngineBenchOptions {
        EngineBenchOptions {
            workload,
            target: Target::Sim,
            device_bytes: 64 << 20,
            io_size_bytes: 16384,
            object_size_bytes: 64 << 10,
            total_bytes: 256 << 10,
            queue_depth: 2,
            mode: WriteMode::FragmentLog,
            io_engine: IoEngine::Auto,
        }
    }

    #[test]
    fn plans_follow_the_paper() {
        let w = plan(&opts(Workload::WithinBlock)).unwrap();
        assert_eq!(w[0], (0, 0, 2048));
        assert_eq!(w[1], (0, 4096, 2048));
        let c = plan(&opts(Workload::CrossBlock)).unwrap();
        assert_eq!(c[0], (0, 2048, 4096));
        assert_eq!(c[1], (0, 6144, 4096));
        let a = plan(&opts(Workload::Aligned)).unwrap();
        assert_eq!(a[1], (0, 16384, 16384));
        assert!(plan(&EngineBenchOptions { io_size_bytes: 1000, ..opts(Workload::Aligned) }).is_err());
    }

    #[test]
    fn runs_on_the_simulated_device() {
        let r = run_engine_bench(&opts(Workload::WithinBlock), &|_, _| {}).unwrap();
        assert_eq!(r.user_bytes, 256 << 10);
        assert_eq!(r.rmw_on_write_path, 0);
        assert!(r.groups_committed > 0 && r.groups_gathered <= r.groups_committed, "{r:?}");
        let r =
            run_engine_bench(&EngineBenchOptions { mode: WriteMode::Rmw, ..opts(Workload::WithinBlock) }, &|_, _| {})
                .unwrap();
        assert!(r.rmw_on_write_path > 0);
        // Read-modify-write writes whole blocks (the block it changes is read from the page cache here).
        assert!(r.device_write_ios > 0, "{r:?}");
        assert!(r.mean_write_io_bytes >= 4096.0, "{r:?}");
        assert_eq!(r.device_bytes_written, (r.mean_write_io_bytes * r.device_write_ios as f64) as u64);
    }
}
