//! Running the `mosaic` binary from tests: a clean environment, a server on ephemeral ports that is
//! waited for by its "serving" log line (never by sleeping), and SIGTERM to stop it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub fn mosaic() -> Command {
    clean(Command::new(env!("CARGO_BIN_EXE_mosaic")))
}

/// The binary run inside network namespace `ns` (`ip netns exec` enters it and execs the binary, so the
/// child is the server itself and signals reach it).
pub fn mosaic_in_netns(ns: &str) -> Command {
    let mut c = clean(Command::new("ip"));
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_mosaic")]);
    c
}

/// `c` without the test's own MOSAIC_ settings.
fn clean(mut c: Command) -> Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("MOSAIC_") {
            c.env_remove(k);
        }
    }
    // MOSAIC_TEST_LOG_LEVEL=LEVEL sets the servers' log level (with MOSAIC_TEST_LOGS, for a failure that
    // needs their debug lines).
    if let Some(level) = std::env::var_os("MOSAIC_TEST_LOG_LEVEL") {
        c.env("MOSAIC_LOG_LEVEL", level);
    }
    c
}

pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = mosaic().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

pub struct Server {
    pub child: Child,
    pub s3: String,
    pub admin: String,
    /// A cluster node's cluster address.
    pub cluster: Option<String>,
    pub stdout: std::sync::mpsc::Receiver<String>,
    /// The server's log lines after "mosaic is serving" (JSON).
    pub log: std::sync::mpsc::Receiver<String>,
}

/// A test that fails still ends its server (a child process outlives its handle otherwise, holding its
/// ports and its deleted data directory). After `stop` or `kill9` the child is reaped and this does nothing.
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server on ephemeral ports and waits for its "serving" log line.
pub fn start(data: &Path) -> Server {
    start_with_env(data, &[])
}

/// Like [`start`], with extra environment variables.
pub fn start_with_env(data: &Path, env: &[(&str, &str)]) -> Server {
    start_with_args(data, env, &[])
}

/// Like [`start`], with extra environment variables and arguments.
pub fn start_with_args(data: &Path, env: &[(&str, &str)], args: &[&str]) -> Server {
    let mut command = mosaic();
    command.envs(env.iter().copied()).args(["server", "--data", data.to_str().unwrap()]);
    command.args(["--s3-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]);
    command.args(["--log-format", "json", "--drive-size", "256MiB"]).args(args);
    spawn_server(command)
}

/// Spawns `command` (a `mosaic server` with `--log-format json`) and waits for its "serving" log line.
pub fn spawn_server(mut command: Command) -> Server {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let serving: serde_json::Value = loop {
        let Some(Ok(line)) = lines.next() else { panic!("server exited before serving:\n{}", seen.join("\n")) };
        seen.push(line.clone());
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        if v["message"] == "mosaic is serving" {
            break v;
        }
    };
    let s3 = serving["s3"].as_str().unwrap().to_string();
    let admin = serving["admin"].as_str().unwrap().to_string();
    let cluster = serving["cluster"].as_str().map(str::to_string);
    // Keep draining stderr so the server never blocks on a full pipe. With MOSAIC_TEST_LOGS=DIR set, each
    // server's log is copied to DIR/<pid>.log too (for a failure that needs the servers' side).
    let (log_tx, log) = std::sync::mpsc::channel();
    let mut copy = std::env::var_os("MOSAIC_TEST_LOGS")
        .and_then(|dir| std::fs::File::create(Path::new(&dir).join(format!("{}.log", child.id()))).ok());
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Some(f) = copy.as_mut() {
                use std::io::Write;
                let _ = writeln!(f, "{line}");
            }
            let _ = log_tx.send(line);
        }
    });
    Server { child, s3, admin, cluster, stdout: rx, log }
}

/// The longest wait for a log line.
pub const LOGGED_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// Reads the server's log until a line with this message, and returns that line.
pub fn logged(s: &Server, message: &str) -> serde_json::Value {
    loop {
        // Bounded: a line that never comes fails the test instead of hanging it.
        let line = match s.log.recv_timeout(LOGGED_WITHIN) {
            Ok(line) => line,
            Err(e) => panic!("the server did not log {message:?} ({e})"),
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && v["message"] == message
        {
            return v;
        }
    }
}

/// Reads printed lines until one starts with `label` and returns the rest of it.
pub fn printed(s: &Server, label: &str) -> String {
    loop {
        let line = s.stdout.recv().expect("stdout ended before the line was printed");
        if let Some(v) = line.trim().strip_prefix(label) {
            return v.trim().to_string();
        }
    }
}

/// Sends SIGTERM; returns the exit code and everything printed on stdout that was not read yet.
pub fn stop(mut s: Server) -> (i32, String) {
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let code = s.child.wait().unwrap().code().unwrap_or(-1);
    let rest: Vec<String> = s.stdout.iter().collect();
    (code, rest.join("\n"))
}

/// Kills the server with SIGKILL (no drain, no close) and reaps it.
pub fn kill9(mut s: Server) {
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGKILL) };
    let _ = s.child.wait();
}

/// Starts a server whose root credentials are `access_key`/`secret_key`, with extra environment.
pub fn start_with_root(data: &Path, access_key: &str, secret_key: &str, env: &[(&str, &str)]) -> Server {
    let mut all = vec![("MOSAIC_ACCESS_KEY", access_key), ("MOSAIC_SECRET_KEY", secret_key)];
    all.extend_from_slice(env);
    start_with_env(data, &all)
}

/// An aws-sdk-s3 client for a server's S3 address: path style, no retries (a retried error would hide a
/// failure), and an operation timeout that only guards against a hang.
pub fn s3_client(endpoint: &str, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let creds = aws_sdk_s3::config::Credentials::new(access_key, secret_key, None, None, "test");
    let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
        .operation_timeout(std::time::Duration::from_secs(60))
        .build();
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(format!("http://{endpoint}"))
        .credentials_provider(creds)
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .timeout_config(timeouts)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// `mosaic admin --json ARGS` against the server, authenticated with the given root credentials.
pub fn admin(s: &Server, access_key: &str, secret_key: &str, args: &[&str]) -> std::process::Output {
    mosaic()
        .env("MOSAIC_ACCESS_KEY", access_key)
        .env("MOSAIC_SECRET_KEY", secret_key)
        .args(["admin", "--json", "--admin", &s.admin])
        .args(args)
        .output()
        .expect("running mosaic admin")
}

/// The JSON `mosaic admin --json` printed, once it succeeded.
pub fn json(out: std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "mosaic admin failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `cluster status` on `s` once `done` holds for it (asked again until then, at most two minutes).
pub fn status_when(s: &Server, ak: &str, sk: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let status = json(admin(s, ak, sk, &["cluster", "status"]));
        if done(&status) {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "the cluster did not get there in two minutes: {status}");
    }
}

/// Test data: `len` bytes that differ with `seed` (so a read of the wrong object or version is caught).
pub fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(131).wrapping_add(seed * 7919) % 253) as u8).collect()
}

/// The secret the tests' clusters are started with.
pub fn cluster_secret() -> String {
    "0123456789abcdef".repeat(4)
}
