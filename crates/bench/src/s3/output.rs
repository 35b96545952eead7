//! What a run leaves behind: a summary table on the terminal, and with `--out DIR` the JSON, a Markdown
//! report and two SVG plots (throughput over time, latency CDF per operation).

use super::{OpResult, S3BenchResult};
use crate::plot::{LineChart, Series, line_chart};
use std::fmt::Write;
use std::path::Path;

/// Every operation of a result, tenants' prefixed with their number and workload.
pub fn flat_operations(r: &S3BenchResult) -> Vec<(String, OpResult)> {
    if r.tenants.is_empty() {
        return r.operations.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    r.tenants
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.operations.iter().map(move |(k, v)| (format!("t{} {} {k}", i + 1, t.workload), v.clone())))
        .collect()
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The per-operation table in Markdown.
pub fn operations_table(r: &S3BenchResult) -> String {
    let mut s = String::from(
        "| operation | ops | ops/s | MiB/s | p50 ms | p90 ms | p99 ms | p999 ms | max ms | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, o) in flat_operations(r) {
        let l = &o.latency;
        let _ = writeln!(
            s,
            "| {name} | {} | {:.1} | {:.2} | {} | {} | {} | {} | {} | {} |",
            o.ops,
            o.ops_per_s,
            o.mib_per_s,
            ms(l.latency_us_p50),
            ms(l.latency_us_p90),
            ms(l.latency_us_p99),
            ms(l.latency_us_p999),
            ms(l.latency_us_max),
            o.errors
        );
    }
    s
}

fn error_lines(r: &S3BenchResult) -> String {
    let mut s = String::new();
    for (name, o) in flat_operations(r) {
        for (class, n) in &o.error_classes {
            let _ = writeln!(s, "- {name}: {n} x {class}");
        }
    }
    if let Some(e) = &r.first_error {
        let _ = writeln!(s, "- first error: `{e}`");
    }
    s
}

/// Extra lines of the list, priority and append workloads.
pub fn workload_lines(r: &S3BenchResult) -> String {
    let mut s = String::new();
    if let Some(l) = &r.list {
        let _ = writeln!(
            s,
            "- listing {} objects{} under {} prefix(es): flat {:.0} keys/s ({} keys), with delimiter {:.0} keys/s ({} keys)",
            l.objects,
            if l.versions > 1 {
                format!(" x {} versions (ListObjectVersions; every version counts)", l.versions)
            } else {
                String::new()
            },
            l.prefixes,
            l.keys_per_s_flat,
            l.keys_listed_flat,
            l.keys_per_s_delimited,
            l.keys_listed_delimited
        );
    }
    if let Some(p) = &r.priority {
        let _ = writeln!(
            s,
            "- prioritized reader: {} reads every {:.0} ms, {} over the {:.0} ms deadline or failed; writers {:.1} MiB/s",
            p.reads, p.interval_ms, p.deadline_misses, p.deadline_ms, p.writer_mib_per_s
        );
    }
    for (i, t) in r.tenants.iter().enumerate() {
        if let Some(rate) = t.config.rate_ops_per_s {
            let _ = writeln!(
                s,
                "- tenant {} {}: open loop, {rate} op/s offered, {:.1} done (latency counts from each operation's due time)",
                i + 1,
                t.workload,
                t.total.ops_per_s
            );
        }
    }
    if let Some(v) = &r.verification {
        let _ = writeln!(s, "- read back after the run: {} objects, {} wrong or unreadable", v.objects, v.errors);
        if let Some(e) = &v.first_error {
            let _ = writeln!(s, "  - first: `{e}`");
        }
    }
    s
}

pub fn markdown(r: &S3BenchResult) -> String {
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(s, "# mosaic bench s3: {}\n", r.workload);
    let _ = writeln!(s, "- endpoint: {}", r.endpoint);
    let _ = writeln!(s, "- started: {}", r.started_at);
    let _ = writeln!(
        s,
        "- concurrency {}, objects {}, sizes {}-{} B, seed {}, warm-up {} s (excluded), measured {:.1} s (limit {} s{})",
        c.concurrency,
        c.objects,
        c.size_min_bytes,
        c.size_max_bytes,
        c.seed,
        c.warmup_s,
        r.seconds,
        c.duration_s,
        c.ops_limit.map(|n| format!(", {n} ops")).unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "- total: {} ops, {:.1} ops/s, {:.2} MiB/s, {} errors; plan digest {}\n",
        r.total.ops, r.total.ops_per_s, r.total.mib_per_s, r.total.errors, r.plan_digest
    );
    s.push_str(&operations_table(r));
    let extra = workload_lines(r);
    if !extra.is_empty() {
        let _ = write!(s, "\n{extra}");
    }
    if let Some(d) = &r.drive_io {
        let _ = write!(s, "\n## Drive IO over the measured phase\n\n{}", super::drive_io::markdown(d));
    }
    let errors = error_lines(r);
    if !errors.is_empty() {
        let _ = write!(s, "\n## Errors\n\n{errors}");
    }
    s.push_str("\n![throughput over time](throughput.svg)\n\n![latency CDF](latency-cdf.svg)\n");
    s
}

pub fn throughput_svg(r: &S3BenchResult) -> String {
    let runs: Vec<(String, &S3BenchResult)> = if r.tenants.is_empty() {
        vec![(r.workload.clone(), r)]
    } else {
        r.tenants.iter().enumerate().map(|(i, t)| (format!("t{} {}", i + 1, t.workload), t)).collect()
    };
    // Byte rate tells more for large objects, operation rate for small and empty ones.
    let bytes = runs.iter().any(|(_, t)| t.config.size_max_bytes >= 1024 * 1024);
    let series = runs
        .iter()
        .map(|(name, t)| Series {
            name: name.clone(),
            points: t.timeline.iter().map(|p| (p.t_s, if bytes { p.mib_per_s } else { p.ops_per_s })).collect(),
        })
        .collect();
    line_chart(&LineChart {
        title: &format!("{}: throughput over time", r.workload),
        x_label: "seconds since warm-up",
        y_label: if bytes { "MiB/s" } else { "operations/s" },
        log_x: false,
        series,
    })
}

pub fn latency_svg(title: &str, ops: &[(String, OpResult)]) -> String {
    let series = ops
        .iter()
        .filter(|(_, o)| !o.latency_cdf_us.is_empty())
        .map(|(name, o)| Series {
            name: name.clone(),
            points: o.latency_cdf_us.iter().map(|&(us, q)| (us as f64 / 1000.0, q)).collect(),
        })
        .collect();
    line_chart(&LineChart {
        title,
        x_label: "latency (ms, log scale)",
        y_label: "fraction of operations",
        log_x: true,
        series,
    })
}

/// Writes result.json, report.md, throughput.svg and latency-cdf.svg into `dir`.
pub fn write_outputs(dir: &Path, r: &S3BenchResult) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    let files = [
        ("result.json", json + "\n"),
        ("report.md", markdown(r)),
        ("throughput.svg", throughput_svg(r)),
        ("latency-cdf.svg", latency_svg(&format!("{}: latency CDF", r.workload), &flat_operations(r))),
    ];
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}
