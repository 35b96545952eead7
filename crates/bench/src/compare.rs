//! `mosaic bench compare A.json B.json ...`: results side by side, each as a ratio to the first, and one
//! plot of every operation's throughput.

use crate::plot::bar_chart;
use crate::s3::S3BenchResult;
use crate::s3::output::flat_operations;
use std::fmt::Write;
use std::path::Path;

pub struct Named {
    pub name: String,
    pub result: S3BenchResult,
}

pub fn load(path: &Path) -> Result<Named, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let result: S3BenchResult =
        serde_json::from_str(&text).map_err(|e| format!("{} is not a mosaic bench s3 result: {e}", path.display()))?;
    // result.json inside a run directory is named after the directory.
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("result");
    let name = if stem == "result" {
        path.parent().and_then(|p| p.file_name()).and_then(|s| s.to_str()).unwrap_or(stem).to_string()
    } else {
        stem.to_string()
    };
    Ok(Named { name, result })
}

fn ratio(v: f64, base: f64) -> String {
    if base > 0.0 && v.is_finite() { format!("{:.2}x", v / base) } else { "-".into() }
}

/// The comparison table in Markdown (also readable as plain text).
pub fn table(runs: &[Named]) -> String {
    let mut s = String::new();
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let _ = writeln!(s, "| operation | metric | {} |", names.join(" | "));
    let _ = writeln!(s, "|---|---|{}", "---:|".repeat(runs.len()));
    let mut ops: Vec<String> = Vec::new();
    for r in runs {
        for (k, _) in flat_operations(&r.result) {
            if !ops.contains(&k) {
                ops.push(k);
            }
        }
    }
    type Metric = fn(&crate::s3::OpResult) -> f64;
    let metrics: [(&str, Metric, bool); 5] = [
        ("ops/s", |o| o.ops_per_s, true),
        ("MiB/s", |o| o.mib_per_s, true),
        ("p50 ms", |o| o.latency.latency_us_p50 as f64 / 1000.0, false),
        ("p99 ms", |o| o.latency.latency_us_p99 as f64 / 1000.0, false),
        ("errors", |o| o.errors as f64, false),
    ];
    for op in &ops {
        let per_run: Vec<Option<crate::s3::OpResult>> = runs
            .iter()
            .map(|r| flat_operations(&r.result).into_iter().find(|(k, _)| k == op).map(|(_, v)| v))
            .collect();
        for (metric, f, show_ratio) in metrics {
            let base = per_run.first().cloned().flatten().map(|o| f(&o)).unwrap_or(0.0);
            let cells: Vec<String> = per_run
                .iter()
                .enumerate()
                .map(|(i, o)| match o {
                    None => "-".into(),
                    Some(o) if i == 0 || !show_ratio => format!("{:.2}", f(o)),
                    Some(o) => format!("{:.2} ({})", f(o), ratio(f(o), base)),
                })
                .collect();
            let _ = writeln!(s, "| {op} | {metric} | {} |", cells.join(" | "));
        }
    }
    for (label, f) in [
        (
            "list keys/s flat",
            (|r: &S3BenchResult| r.list.as_ref().map(|l| l.keys_per_s_flat)) as fn(&S3BenchResult) -> Option<f64>,
        ),
        ("list keys/s delimited", |r| r.list.as_ref().map(|l| l.keys_per_s_delimited)),
        ("priority deadline misses", |r| r.priority.as_ref().map(|p| p.deadline_misses as f64)),
    ] {
        let vals: Vec<Option<f64>> = runs.iter().map(|r| f(&r.result)).collect();
        if vals.iter().any(Option::is_some) {
            let base = vals.first().copied().flatten().unwrap_or(0.0);
            let cells: Vec<String> = vals
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    None => "-".into(),
                    Some(v) if i == 0 => format!("{v:.0}"),
                    Some(v) => format!("{v:.0} ({})", ratio(*v, base)),
                })
                .collect();
            let _ = writeln!(s, "| {} | {label} | {} |", runs[0].result.workload, cells.join(" | "));
        }
    }
    s
}

/// One grouped bar chart: operations per second of every operation, a bar per run.
pub fn plot(runs: &[Named]) -> String {
    let mut ops: Vec<String> = Vec::new();
    for r in runs {
        for (k, _) in flat_operations(&r.result) {
            if !ops.contains(&k) {
                ops.push(k);
            }
        }
    }
    let series: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let fo = flat_operations(&r.result);
            let v = ops.iter().map(|op| fo.iter().find(|(k, _)| k == op).map_or(0.0, |(_, o)| o.ops_per_s)).collect();
            (r.name.clone(), v)
        })
        .collect();
    let title = format!("{}: operations per second", runs.first().map_or("", |r| r.result.workload.as_str()));
    bar_chart(&title, "operations/s", &ops, &series)
}
