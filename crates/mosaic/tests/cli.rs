//! The `mosaic` binary as a user runs it: help and version, configuration errors, a server started on an
//! empty directory, restarted on its data, refused on a foreign directory, and stopped by SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use support::{mosaic, printed, run, s3_client, start, stop};

#[test]
fn help_and_version() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mosaic "));
    for (args, must) in [
        (vec!["--help"], vec!["server", "admin", "bench"]),
        (
            vec!["server", "--help"],
            vec![
                "--data",
                "--s3-address",
                "--admin-address",
                "--config",
                "--domain",
                "--drive-size",
                "--drive",
                "--erasure",
                "--heal-rate",
                "--scan-interval",
                "--log-format",
                "--log-level",
                "--shutdown-timeout-secs",
                "--max-connections",
                "--kv-cache-size",
                "--inline-max-size",
                "--read-cache",
                "--scrub-rate",
                "--meta-cache-size",
                "--page-cache-size",
                "--io-engine",
                "MOSAIC_DATA_DIR",
            ],
        ),
        (
            vec!["admin", "--help"],
            vec!["--admin", "--json", "--data", "info", "check", "scrub", "drives", "drive", "heal"],
        ),
        (vec!["admin", "check", "--help"], vec!["--json"]),
        (vec!["bench", "--help"], vec!["engine"]),
        (
            vec!["bench", "engine", "--help"],
            vec![
                "--workload",
                "--io-size",
                "--object-size",
                "--total",
                "--queue-depth",
                "--mode",
                "--json",
                "--device",
            ],
        ),
    ] {
        let (code, out, _) = run(&args);
        assert_eq!(code, 0, "{args:?}");
        for m in must {
            assert!(out.contains(m), "{args:?} help lacks {m}:\n{out}");
        }
    }
}

#[test]
fn bad_values_get_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let data = data.to_str().unwrap();
    for (args, says) in [
        (vec!["server", "--data", data, "--s3-address", "nowhere"], "s3_address"),
        (vec!["server", "--data", data, "--admin-address", "1.2.3.4"], "admin_address"),
        (vec!["server", "--data", data, "--drive-size", "1KiB"], "drive_size"),
        (vec!["server", "--data", data, "--log-format", "xml"], "log_format"),
        (vec!["server", "--data", data, "--max-connections", "0"], "max_connections"),
        (vec!["server", "--data", data, "--shutdown-timeout-secs", "x"], "shutdown-timeout-secs"),
        (vec!["server", "--data", data, "--inline-max-size", "9GiB"], "inline_max_size"),
        (vec!["server", "--data", data, "--kv-cache-size", "lots"], "kv_cache_size"),
        (vec!["server", "--data", data, "--read-cache", "mmap"], "read_cache"),
        (vec!["server", "--data", data, "--scrub-rate", "quick"], "scrub_rate"),
        (vec!["server", "--data", data, "--meta-cache-size", "65GiB"], "meta_cache_size"),
        (vec!["server", "--data", data, "--page-cache-size", "lots"], "page_cache_size"),
        (vec!["server", "--data", data, "--io-engine", "aio"], "io_engine"),
        (vec!["bench", "engine", "--io-engine", "aio"], "aio"),
        (vec!["server", "--data", data, "--domain", "under_score.test"], "domain"),
        (vec!["bench", "engine", "--workload", "aligned", "--io-size", "1000"], "io-size"),
        (vec!["bench", "engine", "--workload", "nope"], "nope"),
        (vec!["bench", "engine", "--workload", "aligned", "--total", "lots"], "--total"),
        (vec!["bench", "engine", "--workload", "aligned", "--object-size", "1"], "object-size"),
        (vec!["bench", "engine", "--workload", "aligned", "--queue-depth", "0"], "--queue-depth"),
        (vec!["bench", "engine", "--workload", "aligned", "--mode", "fast"], "fast"),
        (vec!["bench", "engine", "--workload", "aligned", "--device-size", "x"], "--device-size"),
        (vec!["bench", "engine", "--workload", "aligned", "--device", "/nonexistent-dir/dev"], "/nonexistent-dir/dev"),
        (vec!["admin", "--admin", "127.0.0.1:1", "--data", data, "info"], "credentials"),
    ] {
        let (code, _, err) = run(&args);
        assert_ne!(code, 0, "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let cfg = d.path().join("bad.toml");
    std::fs::write(&cfg, "s3_adress = \"127.0.0.1:1\"\n").unwrap();
    let (code, _, err) = run(&["server", "--data", data, "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("s3_adress"), "{err}");
    // Environment values are checked like flags.
    let out = mosaic().args(["server", "--data", data]).env("MOSAIC_S3_ADDRESS", "bad").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("s3_address"));
    assert!(!Path::new(data).exists(), "a refused start must not create the data directory");
    // The admin client names an unreachable admin port.
    let out = mosaic()
        .args(["admin", "--admin", "127.0.0.1:1", "info", "--json"])
        .env("MOSAIC_ACCESS_KEY", "a-key")
        .env("MOSAIC_SECRET_KEY", "a-secret-key")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the admin port at http://127.0.0.1:1"));
    let out = mosaic()
        .args(["admin", "info"])
        .env("MOSAIC_ADMIN", "127.0.0.1:1")
        .env("MOSAIC_ACCESS_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MOSAIC_SECRET_KEY"));
}

#[test]
fn refuses_a_foreign_directory() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("thesis.tex"), "precious").unwrap();
    let (code, _, err) = run(&[
        "server",
        "--data",
        d.path().to_str().unwrap(),
        "--s3-address",
        "127.0.0.1:0",
        "--admin-address",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("refusing") && err.contains("thesis.tex"), "{err}");
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1, "nothing may be written into a foreign directory");
}

fn http_get(url: &str) -> (u16, String) {
    let r =
        reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap().get(url).send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

#[test]
fn server_lifecycle() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let s = start(&data);
    let ak = printed(&s, "access key:");
    let sk = printed(&s, "secret key:");
    assert_eq!(http_get(&format!("http://{}/health/live", s.admin)).0, 200);
    assert_eq!(http_get(&format!("http://{}/health/ready", s.admin)).0, 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = s3_client(&s.s3, &ak, &sk);
    rt.block_on(async {
        c.create_bucket().bucket("keep").send().await.unwrap();
        c.put_object().bucket("keep").key("k").body(b"persisted".to_vec().into()).send().await.unwrap();
    });
    let (code, metrics) = http_get(&format!("http://{}/metrics", s.admin));
    assert_eq!(code, 200);
    assert!(metrics.contains("mosaic_s3_requests_total") && metrics.contains("mosaic_engine_free_blocks"), "{metrics}");
    let admin_addr = s.admin.clone();
    let admin = |args: &[&str]| {
        let out = mosaic()
            .args(["admin", "--admin", &admin_addr, "--data", data.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, info) = admin(&["info", "--json"]);
    assert_eq!(code, 0, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let uuid = info["drives"][0]["uuid"].as_str().unwrap().to_string();
    // The drive takes what it stores, not its maximum: the file starts at one growth step.
    let drive = &info["drives"][0];
    assert_eq!((drive["state"].as_str(), info["sets"][0]["erasure"].as_str()), (Some("online"), Some("1+0")));
    assert_eq!(drive["max_bytes"].as_u64(), Some(256 << 20), "{drive}");
    assert_eq!(drive["allocated_bytes"].as_u64(), Some(65 << 20), "{drive}");
    let used = drive["used_bytes"].as_u64().unwrap();
    assert!((1 << 20..4 << 20).contains(&used), "{drive}");
    assert_eq!(std::fs::metadata(data.join("drive0/data")).unwrap().len(), 65 << 20);
    // A reader that goes away (`mosaic admin info | head -1`) ends the command quietly, never a panic.
    for args in [&["admin", "--admin", &admin_addr, "--data", data.to_str().unwrap(), "info"][..], &["--help"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = mosaic().args(args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        use std::os::unix::process::ExitStatusExt;
        assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{args:?}: {:?}", out.status);
    }
    assert_eq!(admin(&["check"]).0, 0);
    assert_eq!(admin(&["scrub", "--json"]).0, 0);
    // Wrong credentials are refused by the admin port.
    let out = mosaic()
        .args(["admin", "--admin", &s.admin, "info"])
        .env("MOSAIC_ACCESS_KEY", "nobody")
        .env("MOSAIC_SECRET_KEY", "wrong-secret")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(stop(s).0, 0, "SIGTERM must stop the server cleanly");

    // Credentials are stored with mode 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.join("credentials")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // A second start reuses the data and prints no new credentials.
    let s = start(&data);
    let admin_addr = s.admin.clone();
    let admin = |args: &[&str]| {
        let out = mosaic()
            .args(["admin", "--admin", &admin_addr, "--data", data.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, info) = admin(&["info", "--json"]);
    assert_eq!(code, 0);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["drives"][0]["uuid"].as_str().unwrap(), uuid);
    let c = s3_client(&s.s3, &ak, &sk);
    let got = rt.block_on(async {
        c.get_object().bucket("keep").key("k").send().await.unwrap().body.collect().await.unwrap().into_bytes()
    });
    assert_eq!(got.as_ref(), b"persisted");
    let (code, printed_later) = stop(s);
    assert_eq!(code, 0);
    assert!(!printed_later.contains("secret key"), "credentials printed on a second start");
}

#[test]
fn credentials_from_the_environment() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("store");
    let mut child = mosaic()
        .args([
            "server",
            "--data",
            data.to_str().unwrap(),
            "--s3-address",
            "127.0.0.1:0",
            "--admin-address",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--drive-size",
            "128MiB",
        ])
        .env("MOSAIC_ACCESS_KEY", "envadmin")
        .env("MOSAIC_SECRET_KEY", "env-secret-123")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let admin = loop {
        let line = lines.next().expect("server exited").unwrap();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && v["message"] == "mosaic is serving"
        {
            break v["admin"].as_str().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let out = mosaic()
        .args(["admin", "--admin", &admin, "info"])
        .env("MOSAIC_ACCESS_KEY", "envadmin")
        .env("MOSAIC_SECRET_KEY", "env-secret-123")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!data.join("credentials").exists(), "environment credentials must not be written to disk");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Runs `mosaic server` on `data` with `drives` and extra arguments until it serves (then stops it) or
/// exits; returns the exit code (0 once served and stopped) and stderr.
fn serve_once(data: &Path, drives: &[std::path::PathBuf], extra: &[&str]) -> (i32, String) {
    let list: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();
    let mut args = vec![
        "server".to_string(),
        "--data".into(),
        data.display().to_string(),
        "--s3-address".into(),
        "127.0.0.1:0".into(),
        "--admin-address".into(),
        "127.0.0.1:0".into(),
        "--drive-size".into(),
        "128MiB".into(),
    ];
    for d in list {
        args.extend(["--drive".into(), d]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = mosaic().args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok) {
        err.push_str(&line);
        err.push('\n');
        if line.contains("mosaic is serving") {
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
    }
    (child.wait().unwrap().code().unwrap_or(-1), err)
}

#[test]
fn drives_are_checked_against_the_layout() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("store");
    let drives: Vec<_> = (0..3).map(|d| root.path().join(format!("d{d}"))).collect();
    // A geometry that does not fit the drives, a drive named twice, more drives than one set holds.
    let (code, err) = serve_once(&data, &drives, &["--erasure", "4+2"]);
    assert_ne!(code, 0);
    assert!(err.contains("erasure 4+2 needs sets of 6 drives"), "{err}");
    let twice = [drives[0].clone(), drives[1].clone(), drives[0].clone()];
    let (code, err) = serve_once(&data, &twice, &[]);
    assert!(code != 0 && err.contains("named twice"), "{err}");
    let many: Vec<_> = (0..17).map(|d| root.path().join(format!("m{d}"))).collect();
    let (code, err) = serve_once(&root.path().join("many"), &many, &[]);
    assert!(code != 0 && err.contains("17 drives"), "{err}");
    assert!(!root.path().join("m0").exists(), "nothing formatted for a refused drive list");

    // A 2+1 store (the default for three drives); its layout is recorded on every drive.
    let (code, err) = serve_once(&data, &drives, &[]);
    assert_eq!(code, 0, "{err}");
    let layout = std::fs::read_to_string(data.join("layout")).unwrap();
    for d in &drives {
        assert_eq!(std::fs::read_to_string(d.join("layout")).unwrap(), layout, "{}", d.display());
    }
    // The same drives in another order, or one drive fewer: refused, naming the store's drives.
    let swapped = [drives[1].clone(), drives[0].clone(), drives[2].clone()];
    let (code, err) = serve_once(&data, &swapped, &[]);
    assert!(code != 0 && err.contains("same drives in the same order"), "{err}");
    let (code, err) = serve_once(&data, &drives[..2], &[]);
    assert!(code != 0 && err.contains("same drives in the same order"), "{err}");
    // A drive of another store where one of ours was: refused.
    let other = root.path().join("other");
    let other_drives: Vec<_> = (0..3).map(|d| root.path().join(format!("o{d}"))).collect();
    assert_eq!(serve_once(&other, &other_drives, &[]).0, 0);
    std::fs::rename(&drives[1], root.path().join("ours1")).unwrap();
    std::fs::rename(&other_drives[1], &drives[1]).unwrap();
    let (code, err) = serve_once(&data, &drives, &[]);
    assert!(code != 0 && err.contains("belongs to another store"), "{err}");
    // Our drive back in its place: the store opens whole.
    std::fs::remove_dir_all(&drives[1]).unwrap();
    std::fs::rename(root.path().join("ours1"), &drives[1]).unwrap();
    assert_eq!(serve_once(&data, &drives, &[]).0, 0);
}
