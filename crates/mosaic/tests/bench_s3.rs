//! `mosaic bench s3` and `mosaic bench compare` end to end against a real `mosaic server`: every workload
//! runs (scaled down) and writes its JSON, report and plots; the same seed issues the same keys and sizes;
//! bad arguments get clear errors.

mod support;

use std::path::Path;
use support::{Server, mosaic, start_with_root, stop};

const AK: &str = "benchkey";
const SK: &str = "benchsecret-0123456789";

fn server(dir: &Path) -> Server {
    start_with_root(&dir.join("store"), AK, SK, &[])
}

/// Runs `mosaic bench s3` with the given arguments and returns the parsed JSON.
fn bench(s: &Server, args: &[&str]) -> serde_json::Value {
    let endpoint = format!("http://{}", s.s3);
    let out = mosaic()
        .args(["bench", "s3", "--endpoint", &endpoint, "--access-key", AK, "--secret-key", SK, "--json"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("bench {args:?} printed no JSON ({e}): {stdout}"))
}

#[test]
fn every_workload_runs_against_mosaic_and_writes_its_report() {
    let d = tempfile::tempdir().unwrap();
    let s = server(d.path());
    let small = ["--duration", "1s", "--warmup", "0s", "--concurrency", "2"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("cosbench-a", vec![]),
        ("cosbench-b", vec![]),
        ("cosbench-c", vec!["--size", "64KiB-256KiB"]),
        ("cosbench-d", vec!["--size", "64KiB-256KiB"]),
        ("write-only", vec!["--size", "256KiB"]),
        ("read-only", vec!["--size", "256KiB"]),
        ("read-write", vec!["--size", "256KiB"]),
        ("read-only", vec!["--size", "4KiB", "--mix", "100/0/0"]),
        ("read-only", vec!["--size", "4KiB-64KiB", "--mix", "100/0/0", "--get-client", "lean"]),
        ("cosbench-a", vec!["--get-client", "lean"]),
        ("list", vec!["--objects", "2500", "--prefixes", "3"]),
        ("list", vec!["--objects", "300", "--prefixes", "3", "--versioning", "--versions", "3"]),
        (
            "list",
            vec!["--objects", "300", "--prefixes", "3", "--versioning", "--versions", "3", "--list-client", "lean"],
        ),
        ("list", vec!["--objects", "2500", "--prefixes", "3", "--list-client", "lean"]),
        ("create", vec![]),
        ("append", vec![]),
        ("append", vec!["--get-client", "lean"]),
        ("tenants", vec!["--tenants", "cosbench-b:1KiB-8KiB,cosbench-d:64KiB-128KiB"]),
        ("tenants", vec!["--tenants", "cosbench-b:1KiB-8KiB@20,cosbench-d:64KiB-128KiB"]),
        ("priority", vec!["--size", "256KiB", "--deadline", "2s"]),
    ];
    for (workload, extra) in cases {
        let out_dir = d.path().join("out").join(workload);
        let mut args = vec!["--workload", workload, "--out", out_dir.to_str().unwrap()];
        args.extend(small);
        if workload != "list" {
            args.extend(["--objects", "8"]);
        }
        args.extend(extra.iter().copied());
        let r = bench(&s, &args);
        assert_eq!(r["workload"], workload);
        if extra.contains(&"--mix") {
            let ops: Vec<&String> = r["operations"].as_object().unwrap().keys().collect();
            assert_eq!(ops, ["GET"], "--mix 100/0/0 reads only");
            assert_eq!(r["config"]["mix"], "100/0/0");
        }
        assert!(r["total"]["ops"].as_u64().unwrap() > 0, "{workload}: no operations: {r}");
        assert_eq!(r["total"]["errors"], 0, "{workload}: {}", r["first_error"]);
        for f in ["result.json", "report.md", "throughput.svg", "latency-cdf.svg"] {
            let text = std::fs::read_to_string(out_dir.join(f)).unwrap();
            assert!(!text.is_empty() && !text.contains("NaN"), "{workload}: {f}");
        }
        match workload {
            "list" if extra.contains(&"--versions") => {
                // ListObjectVersions: each lister walks every version of the 300 keys (900 entries).
                let l = &r["list"];
                assert_eq!((l["versions"].as_u64(), l["keys_listed_flat"].as_u64()), (Some(3), Some(1800)));
                assert_eq!(l["keys_listed_delimited"], 1800);
            }
            "list" => {
                let l = &r["list"];
                // Two listers, each walking all 2,500 keys (3 pages flat), flat and by prefix.
                assert_eq!(l["keys_listed_flat"], 5000);
                assert_eq!(l["keys_listed_delimited"], 5000);
                assert!(r["operations"]["LIST"]["ops"].as_u64().unwrap() >= 6);
            }
            "append" => {
                assert_eq!(r["verification"]["objects"], 8);
                assert_eq!(r["verification"]["errors"], 0);
            }
            "priority" => {
                assert!(r["priority"]["reads"].as_u64().unwrap() > 0);
                assert!(r["operations"]["PUT"]["ops"].as_u64().unwrap() > 0);
            }
            "tenants" => {
                assert_eq!(r["tenants"].as_array().unwrap().len(), 2);
                assert_eq!(r["tenants"][1]["workload"], "cosbench-d");
                assert!(r["tenants"][1]["config"].get("rate_ops_per_s").is_none(), "a closed loop has no rate");
                if extra[1].contains("@20") {
                    // Open loop at 20 op/s for 1 s: operations are due at 0, 50, ..., 950 ms, never sooner.
                    let t1 = &r["tenants"][0];
                    assert_eq!(t1["config"]["rate_ops_per_s"], 20);
                    let ops = t1["total"]["ops"].as_u64().unwrap();
                    assert!((1..=20).contains(&ops), "paced tenant ran {ops} operations in 1 s at 20 op/s");
                    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
                    assert!(report.contains("open loop, 20 op/s offered"), "{report}");
                }
            }
            "cosbench-a" => assert!(r["operations"]["GET"]["ops"].as_u64().unwrap() > 0),
            _ => {}
        }
    }
    // Compare two of them: ratios in the table and one plot.
    let plot = d.path().join("compare.svg");
    let out = mosaic()
        .args(["bench", "compare", "--plot", plot.to_str().unwrap()])
        .arg(d.path().join("out/cosbench-a/result.json"))
        .arg(d.path().join("out/cosbench-b/result.json"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("| GET | ops/s |") && table.contains("x)"), "{table}");
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    // Without --plot, the table only: nothing is written where the command runs.
    let cwd = tempfile::tempdir().unwrap();
    let out = mosaic()
        .current_dir(cwd.path())
        .args(["bench", "compare"])
        .arg(d.path().join("out/cosbench-a/result.json"))
        .arg(d.path().join("out/cosbench-b/result.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("| GET | ops/s |"));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0, "no file where the command ran");
    // The bench removed what it created.
    let (code, _) = stop(s);
    assert_eq!(code, 0);
}

#[test]
fn the_same_seed_issues_the_same_keys_and_sizes() {
    let d = tempfile::tempdir().unwrap();
    let s = server(d.path());
    let run = |seed: &str| {
        let args = [
            "--workload",
            "cosbench-b",
            "--ops",
            "200",
            "--warmup",
            "0s",
            "--concurrency",
            "4",
            "--objects",
            "40",
            "--size",
            "1KiB-16KiB",
            "--seed",
            seed,
        ];
        let r = bench(&s, &args);
        assert_eq!(r["total"]["ops"], 200);
        r["plan_digest"].as_str().unwrap().to_string()
    };
    let a = run("7");
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
    stop(s);
}

#[test]
fn bad_arguments_get_clear_errors() {
    let cases: [(&[&str], &str); 14] = [
        (&["--workload", "cosbench-a", "--list-client", "lean"], "--list-client is for the list workload"),
        (&["--workload", "list", "--versions", "3"], "--versions is for the list workload with --versioning"),
        (&["--workload", "list", "--versioning", "--versions", "101"], "101"),
        (&["--workload", "read-only", "--mix", "90/20/0"], "adding up to 100"),
        (&["--workload", "list", "--mix", "100/0/0"], "does not apply to list"),
        (&["--workload", "nope"], "unknown workload"),
        (&["--workload", "cosbench-a", "--size", "8KiB-1KiB"], "minimum is above the maximum"),
        (&["--workload", "cosbench-a", "--concurrency", "0"], "--concurrency"),
        (&["--workload", "cosbench-a", "--duration", "soon"], "invalid duration"),
        (&["--workload", "tenants", "--tenants", "cosbench-a,list"], "cannot run as a tenant"),
        (&["--workload", "tenants", "--tenants", "cosbench-a@0,cosbench-d"], "rate must be 1 to 100000"),
        (&["--workload", "tenants", "--tenants", "cosbench-a@100001,cosbench-d"], "rate must be 1 to 100000"),
        (&["--workload", "tenants", "--tenants", "cosbench-a:4KiB@fast,cosbench-d"], "invalid rate \"fast\""),
        // Nothing listens on port 1: a clear error, not a hang.
        (&["--workload", "cosbench-a", "--timeout", "2s"], "creating bucket"),
    ];
    for (args, want) in cases {
        let out = mosaic()
            .args(["bench", "s3", "--endpoint", "http://127.0.0.1:1", "--access-key", "a", "--secret-key", "b"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = mosaic().args(["bench", "compare", "/nonexistent/a.json", "/nonexistent/b.json"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading /nonexistent/a.json"));
}

#[test]
fn drive_metrics_report_each_drive_of_a_set_and_the_set_as_a_whole() {
    let d = tempfile::tempdir().unwrap();
    let drives: Vec<String> = (1..=6).map(|i| d.path().join(format!("drive{i}")).display().to_string()).collect();
    let list = drives.join(",");
    let s = start_with_root(&d.path().join("store"), AK, SK, &[("MOSAIC_DRIVES", &list), ("MOSAIC_ERASURE", "4+2")]);
    let metrics = format!("http://{}/metrics", s.admin);
    let out_dir = d.path().join("out");
    let args = [
        "--workload",
        "write-only",
        "--size",
        "1MiB",
        "--objects",
        "8",
        "--ops",
        "40",
        "--warmup",
        "0s",
        "--concurrency",
        "2",
        "--drive-metrics",
        &metrics,
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let r = bench(&s, &args);
    let io = &r["drive_io"];
    assert_eq!(io["drives"].as_array().unwrap().len(), 6, "{io}");
    let client = io["client_bytes_written"].as_u64().unwrap();
    assert_eq!(client, 40 << 20, "every measured PUT counted");
    let written: Vec<u64> =
        io["drives"].as_array().unwrap().iter().map(|d| d["device_bytes_written"].as_u64().unwrap()).collect();
    // Each drive holds one shard of every stripe: about a quarter of what the clients wrote.
    for w in &written {
        assert!(*w >= client / 4, "a drive wrote {w} of {client}: {written:?}");
    }
    assert_eq!(io["total"]["device_bytes_written"].as_u64().unwrap(), written.iter().sum::<u64>());
    // The set wrote at least (k+m)/k of what the clients PUT: parity is visible in the ratio.
    assert!(io["write_amplification"].as_f64().unwrap() >= 1.5, "{io}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("## Drive IO") && report.contains("| all |"), "{report}");
    // A metrics address that does not answer is a clear error, not a hang or a silent gap.
    let out = mosaic()
        .args(["bench", "s3", "--endpoint", &format!("http://{}", s.s3), "--access-key", AK, "--secret-key", SK])
        .args(["--workload", "write-only", "--size", "4KiB", "--ops", "4", "--warmup", "0s", "--timeout", "2s"])
        .args(["--drive-metrics", "http://127.0.0.1:1/metrics"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading http://127.0.0.1:1/metrics"));
    stop(s);
}
