//! Per-drive IO of the server under test (`--drive-metrics`): the papers' counters (IO count, IO size,
//! sequential run length, write amplification) for a set as a whole and for each drive, read from the
//! server's Prometheus endpoint at the start and at the end of the measured phase. Any store exporting
//! Mosaic's `mosaic_engine_*{drive="..."}` gauges can be measured; others are run without it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most drives one report holds (16 per set, several sets); more are refused as a malformed scrape.
pub const DRIVES_MAX: usize = 1024;
/// Largest metrics page read.
const SCRAPE_MAX_BYTES: usize = 16 << 20;

/// The gauges read, by the field of [`DriveIo`] they fill.
const GAUGES: [&str; 7] = [
    "mosaic_engine_device_bytes_written",
    "mosaic_engine_device_bytes_read",
    "mosaic_engine_cached_bytes_read",
    "mosaic_engine_device_write_ios",
    "mosaic_engine_device_read_ios",
    "mosaic_engine_write_runs",
    "mosaic_engine_user_bytes_written",
];
/// KV bytes are exported as three gauges; their sum is the KV's writes.
const KV_GAUGES: [&str; 3] =
    ["mosaic_engine_kv_wal_bytes", "mosaic_engine_kv_flush_bytes", "mosaic_engine_kv_compaction_bytes"];

/// What one drive (or the set, summed) did during the measured phase.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DriveIo {
    pub drive: String,
    pub device_bytes_written: u64,
    pub device_bytes_read: u64,
    /// Bytes read through the kernel's page cache (from memory when cached; not in the device's counts).
    pub cached_bytes_read: u64,
    pub device_write_ios: u64,
    pub device_read_ios: u64,
    /// Sequential write runs that ended in the phase (paper 000's chains).
    pub write_runs: u64,
    /// RocksDB's writes: WAL, flushes, compaction.
    pub kv_bytes_written: u64,
    /// Bytes the drive was asked to store (shards and metadata the set gave it).
    pub user_bytes_written: u64,
}

impl DriveIo {
    pub fn mean_write_io_bytes(&self) -> f64 {
        ratio(self.device_bytes_written, self.device_write_ios)
    }
    pub fn mean_read_io_bytes(&self) -> f64 {
        ratio(self.device_bytes_read, self.device_read_ios)
    }
    /// Counting the run still open at the end as one: a drive that wrote one long run ended none.
    pub fn mean_write_run_bytes(&self) -> f64 {
        let runs = if self.device_bytes_written > 0 { self.write_runs.max(1) } else { 0 };
        ratio(self.device_bytes_written, runs)
    }
    /// Device plus KV bytes written per byte the drive was given.
    pub fn drive_write_amplification(&self) -> f64 {
        ratio(self.device_bytes_written + self.kv_bytes_written, self.user_bytes_written)
    }
    fn add(&mut self, o: &DriveIo) {
        self.device_bytes_written += o.device_bytes_written;
        self.device_bytes_read += o.device_bytes_read;
        self.cached_bytes_read += o.cached_bytes_read;
        self.device_write_ios += o.device_write_ios;
        self.device_read_ios += o.device_read_ios;
        // The set's runs: each drive's, its open run counted (as `mean_write_run_bytes` counts it).
        self.write_runs += if o.device_bytes_written > 0 { o.write_runs.max(1) } else { o.write_runs };
        self.kv_bytes_written += o.kv_bytes_written;
        self.user_bytes_written += o.user_bytes_written;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The drives' IO over the measured phase.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DriveIoReport {
    pub drives: Vec<DriveIo>,
    /// Every drive summed.
    pub total: DriveIo,
    /// Object bytes the clients PUT in the phase.
    pub client_bytes_written: u64,
    /// Bytes written to every drive (device plus KV) per byte the clients PUT: erasure coding's
    /// (k+m)/k included.
    pub write_amplification: f64,
}

/// Every drive's gauges at one instant, by drive label.
pub type Sample = BTreeMap<String, DriveIo>;

/// Reads the metrics page.
pub async fn scrape(url: &str, timeout: Duration) -> Result<Sample, String> {
    let client = reqwest::Client::builder().timeout(timeout).build().map_err(|e| e.to_string())?;
    let resp = client.get(url).send().await.map_err(|e| format!("reading {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("reading {url}: HTTP {}", resp.status()));
    }
    let body = resp.bytes().await.map_err(|e| format!("reading {url}: {e}"))?;
    if body.len() > SCRAPE_MAX_BYTES {
        return Err(format!("{url} returned more than {SCRAPE_MAX_BYTES} bytes"));
    }
    parse(&String::from_utf8_lossy(&body))
}

/// Parses Prometheus text: `name{...,drive="0.3",...} value` lines of the gauges read; others are skipped.
pub fn parse(text: &str) -> Result<Sample, String> {
    let mut out = Sample::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else { continue };
        let is_kv = KV_GAUGES.contains(&name);
        if !is_kv && !GAUGES.contains(&name) {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once('}') else { continue };
        let Some(drive) = label(labels, "drive") else { continue };
        let v: f64 = value.trim().parse().map_err(|_| format!("bad value in metrics line `{line}`"))?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("bad value in metrics line `{line}`"));
        }
        if !out.contains_key(drive) && out.len() >= DRIVES_MAX {
            return Err(format!("more than {DRIVES_MAX} drives in the metrics"));
        }
        let d =
            out.entry(drive.to_string()).or_insert_with(|| DriveIo { drive: drive.to_string(), ..Default::default() });
        let v = v as u64;
        match name {
            "mosaic_engine_device_bytes_written" => d.device_bytes_written = v,
            "mosaic_engine_device_bytes_read" => d.device_bytes_read = v,
            "mosaic_engine_cached_bytes_read" => d.cached_bytes_read = v,
            "mosaic_engine_device_write_ios" => d.device_write_ios = v,
            "mosaic_engine_device_read_ios" => d.device_read_ios = v,
            "mosaic_engine_write_runs" => d.write_runs = v,
            "mosaic_engine_user_bytes_written" => d.user_bytes_written = v,
            _ => d.kv_bytes_written += v,
        }
    }
    Ok(out)
}

/// The value of label `key` in `a="x",b="y"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// What each drive did between two samples. A drive missing from either (offline, replaced) reports what
/// the later sample holds, or nothing; a counter that went back (the drive was reopened) counts from zero.
pub fn delta(before: &Sample, after: &Sample, client_bytes_written: u64) -> DriveIoReport {
    let zero = DriveIo::default();
    let mut drives = Vec::new();
    let mut total = DriveIo { drive: "all".into(), ..Default::default() };
    for (name, a) in after {
        let b = before.get(name).unwrap_or(&zero);
        let sub = |x: u64, y: u64| if x >= y { x - y } else { x };
        let d = DriveIo {
            drive: name.clone(),
            device_bytes_written: sub(a.device_bytes_written, b.device_bytes_written),
            device_bytes_read: sub(a.device_bytes_read, b.device_bytes_read),
            cached_bytes_read: sub(a.cached_bytes_read, b.cached_bytes_read),
            device_write_ios: sub(a.device_write_ios, b.device_write_ios),
            device_read_ios: sub(a.device_read_ios, b.device_read_ios),
            write_runs: sub(a.write_runs, b.write_runs),
            kv_bytes_written: sub(a.kv_bytes_written, b.kv_bytes_written),
            user_bytes_written: sub(a.user_bytes_written, b.user_bytes_written),
        };
        total.add(&d);
        drives.push(d);
    }
    let write_amplification = ratio(total.device_bytes_written + total.kv_bytes_written, client_bytes_written);
    DriveIoReport { drives, total, client_bytes_written, write_amplification }
}

/// The report as a markdown table: one row per drive and one for the set.
pub fn markdown(r: &DriveIoReport) -> String {
    use std::fmt::Write;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut s = String::from(
        "| drive | written MiB | read MiB | cached read MiB | write IOs | read IOs | KiB/write | KiB/read | KiB/run | KV MiB | drive WA |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for d in r.drives.iter().chain(std::iter::once(&r.total)) {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            d.drive,
            mib(d.device_bytes_written),
            mib(d.device_bytes_read),
            mib(d.cached_bytes_read),
            d.device_write_ios,
            d.device_read_ios,
            d.mean_write_io_bytes() / 1024.0,
            d.mean_read_io_bytes() / 1024.0,
            d.mean_write_run_bytes() / 1024.0,
            mib(d.kv_bytes_written),
            d.drive_write_amplification()
        );
    }
    let _ = writeln!(
        s,
        "\nClients PUT {:.1} MiB; the drives wrote {:.2}x that (device plus KV, parity included).",
        mib(r.client_bytes_written),
        r.write_amplification
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# TYPE mosaic_engine_device_bytes_written gauge\n\
        mosaic_engine_device_bytes_written{drive=\"0.0\"} 8192\n\
        mosaic_engine_device_bytes_written{drive=\"0.1\"} 4096\n\
        mosaic_engine_device_write_ios{drive=\"0.0\"} 2\n\
        mosaic_engine_cached_bytes_read{drive=\"0.0\"} 65536\n\
        mosaic_engine_write_runs{drive=\"0.0\"} 1\n\
        mosaic_engine_kv_wal_bytes{drive=\"0.0\"} 100\n\
        mosaic_engine_kv_flush_bytes{drive=\"0.0\"} 20\n\
        mosaic_engine_user_bytes_written{drive=\"0.0\"} 4096\n\
        mosaic_engine_queue_depth{drive=\"0.0\",class=\"foreground\"} 3\n\
        mosaic_set_degraded_reads{set=\"0\"} 7\n";

    #[test]
    fn parses_the_drive_gauges_and_skips_the_rest() {
        let s = parse(PAGE).unwrap();
        assert_eq!(s.len(), 2);
        let d = &s["0.0"];
        assert_eq!((d.device_bytes_written, d.device_write_ios, d.write_runs), (8192, 2, 1));
        assert_eq!(d.kv_bytes_written, 120, "the KV's gauges add up");
        assert_eq!(d.cached_bytes_read, 65536);
        assert_eq!(s["0.1"].device_bytes_written, 4096);
    }

    #[test]
    fn reports_the_phase_per_drive_and_for_the_set() {
        let before = parse(PAGE).unwrap();
        let after = parse(
            &PAGE.replace("} 8192", "} 16384").replace("write_ios{drive=\"0.0\"} 2", "write_ios{drive=\"0.0\"} 4"),
        )
        .unwrap();
        let r = delta(&before, &after, 4096);
        assert_eq!(r.drives.len(), 2);
        assert_eq!(r.drives[0].device_bytes_written, 8192);
        assert_eq!(r.drives[0].device_write_ios, 2);
        assert_eq!(r.drives[0].mean_write_io_bytes(), 4096.0);
        assert_eq!(r.drives[0].mean_write_run_bytes(), 8192.0, "no run ended: the open one counts");
        assert_eq!(r.drives[1].device_bytes_written, 0);
        assert_eq!(r.total.device_bytes_written, 8192);
        assert_eq!(r.write_amplification, 2.0);
        assert!(markdown(&r).contains("| all | 0.0 |"), "{}", markdown(&r));
    }

    #[test]
    fn a_reopened_drive_counts_from_zero() {
        let before = parse(&PAGE.replace("} 8192", "} 1000000")).unwrap();
        let r = delta(&before, &parse(PAGE).unwrap(), 0);
        assert_eq!(r.drives[0].device_bytes_written, 8192);
        assert_eq!(r.write_amplification, 0.0, "no client bytes: no ratio");
    }

    #[test]
    fn refuses_malformed_values_and_too_many_drives() {
        assert!(parse("mosaic_engine_device_read_ios{drive=\"0.0\"} x\n").is_err());
        assert!(parse("mosaic_engine_device_read_ios{drive=\"0.0\"} -1\n").is_err());
        let many: String =
            (0..=DRIVES_MAX).map(|i| format!("mosaic_engine_device_read_ios{{drive=\"{i}\"}} 1\n")).collect();
        assert!(parse(&many).unwrap_err().contains("more than"));
        let at_limit: String =
            (0..DRIVES_MAX).map(|i| format!("mosaic_engine_device_read_ios{{drive=\"{i}\"}} 1\n")).collect();
        assert_eq!(parse(&at_limit).unwrap().len(), DRIVES_MAX);
    }
}
