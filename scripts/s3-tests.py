#!/usr/bin/env python3
"""Runs ceph/s3-tests (test_s3.py) against a fresh `mosaic server` and compares with the passing list.

    s3-tests.py gate             run the tests in tests/s3-tests/passing.txt; exit 1 if any of them fails
    s3-tests.py full [--update]  run every test of test_s3.py; print the counts; with --update, rewrite
                                 passing.txt with the tests that passed (only ever after a full run)

The suite is never copied into the repository: S3TESTS_DIR names it (scripts/s3-tests.sh finds it).
The server runs on ephemeral loopback ports with its data in a temporary directory removed on exit; the
suite's "alt" user is a real second key that owns the buckets it creates.
"""

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSING = os.path.join(ROOT, "tests", "s3-tests", "passing.txt")
MAIN_ACCESS_KEY = "S3TESTSMAINKEY000001"
MAIN_SECRET_KEY = "s3tests-main-secret-0123456789abcdefghij"
KMS_KEY_IDS = ("testkey-1", "testkey-2")
# Bounds: one test that hangs must not hang CI (pytest has no per-test timeout of its own here).
SERVER_START_TIMEOUT_S = 60
SUITE_TIMEOUT_S = 60 * 60


class Server:
    """A `mosaic server` on ephemeral ports; stderr (JSON log) is kept in a file for failures."""

    def __init__(self, mosaic, work, lifecycle_day_s):
        self.log_path = os.path.join(work, "server.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOSAIC_")}
        env["MOSAIC_ACCESS_KEY"] = MAIN_ACCESS_KEY
        env["MOSAIC_SECRET_KEY"] = MAIN_SECRET_KEY
        if lifecycle_day_s:
            env["MOSAIC_LIFECYCLE_DAY"] = f"{lifecycle_day_s}s"
        self.proc = subprocess.Popen(
            [mosaic, "server", "--data", os.path.join(work, "data"), "--s3-address", "127.0.0.1:0",
             "--admin-address", "127.0.0.1:0", "--log-format", "json", "--drive-size", "4GiB",
             # The suite's SSE-KMS key ids, and SSE-C over the plain HTTP it speaks.
             "--kms-key", KMS_KEY_IDS[0], "--kms-key", KMS_KEY_IDS[1], "--sse-c-over-http"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        self.s3 = self.admin = None
        deadline = threading.Timer(SERVER_START_TIMEOUT_S, self.proc.kill)
        deadline.start()
        log = open(self.log_path, "w")
        for line in self.proc.stderr:
            log.write(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("message") == "mosaic is serving":
                self.s3, self.admin = event["s3"], event["admin"]
                break
        deadline.cancel()
        if self.s3 is None:
            raise RuntimeError(f"mosaic server exited before serving; see {self.log_path}")

        def drain():
            for line in self.proc.stderr:
                log.write(line)
            log.close()
        threading.Thread(target=drain, daemon=True).start()

    def admin_cli(self, mosaic, *args):
        env = dict(os.environ, MOSAIC_ACCESS_KEY=MAIN_ACCESS_KEY, MOSAIC_SECRET_KEY=MAIN_SECRET_KEY)
        out = subprocess.run([mosaic, "admin", "--admin", self.admin, "--json", *args], env=env,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"mosaic admin {' '.join(args)}: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def canonical_id(access_key):
    """The canonical user id Mosaic gives an access key in ACLs and listings (crates/s3/src/acl.rs)."""
    return hashlib.sha256(b"mosaic canonical id\0" + access_key.encode()).hexdigest()


def write_config(path, server, alt, tenant):
    host, port = server.s3.rsplit(":", 1)
    # The suite reads sections for IAM users Mosaic does not have; their tests fail and are not in the
    # passing list. Mosaic has no RGW tenants: the tenant user is one more key owning its buckets.
    unknown = "[{name}]\naccess_key = {ak}\nsecret_key = {sk}\ndisplay_name = {name}\nuser_id = {name}\n" \
              "email = {name}@example.com\n"
    with open(path, "w") as f:
        f.write(f"""[DEFAULT]
host = {host}
port = {port}
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = s3t-{{random}}-

[s3 main]
display_name = root
user_id = {canonical_id(MAIN_ACCESS_KEY)}
email = main@example.com
api_name = us-east-1
access_key = {MAIN_ACCESS_KEY}
secret_key = {MAIN_SECRET_KEY}
lc_debug_interval = 2
kms_keyid = {KMS_KEY_IDS[0]}
kms_keyid2 = {KMS_KEY_IDS[1]}

[s3 alt]
display_name = {alt["access_key"]}
user_id = {canonical_id(alt["access_key"])}
email = alt@example.com
access_key = {alt["access_key"]}
secret_key = {alt["secret_key"]}

[s3 tenant]
tenant = testx
display_name = {tenant["access_key"]}
user_id = {canonical_id(tenant["access_key"])}
email = tenant@example.com
access_key = {tenant["access_key"]}
secret_key = {tenant["secret_key"]}
""")
        f.write("\n" + unknown.format(name="iam", ak="UNKNOWNIAMKEY0000001", sk="y" * 40))
        f.write("\n" + unknown.format(name="iam root", ak="UNKNOWNIAMROOTKEY001", sk="z" * 40))
        f.write("\n" + unknown.format(name="iam alt root", ak="UNKNOWNIAMALTROOT001", sk="w" * 40))


def run_pytest(suite, conf, junit, tests, log_path, select=None):
    env = dict(os.environ, S3TEST_CONF=conf)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", junit,
            "-o", "junit_family=xunit1"]
    if tests is None:
        args.append("s3tests/functional/test_s3.py")
    else:
        args += [f"s3tests/functional/test_s3.py::{t}" for t in tests]
    if select:
        args += ["-k", select]
    with open(log_path, "w") as log:
        proc = subprocess.run(args, cwd=suite, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=SUITE_TIMEOUT_S)
    return proc.returncode


def outcomes(junit):
    """test name -> passed | failed | error | skipped. A test whose teardown failed is not passed."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        kinds = {child.tag for child in case}
        if "error" in kinds:
            out[name] = "error"
        elif "failure" in kinds:
            out[name] = "failed"
        elif "skipped" in kinds:
            out[name] = "skipped"
        else:
            out[name] = out.get(name, "passed")
    return out


def read_passing():
    with open(PASSING) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["gate", "full"])
    ap.add_argument("--update", action="store_true", help="full only: rewrite the passing list")
    ap.add_argument("--out", help="keep the junit xml, pytest output and server log in this directory")
    ap.add_argument("--lifecycle-day-s", type=int, default=2)
    ap.add_argument("-k", dest="select", help="full only: run the tests pytest -k selects (never with --update)")
    a = ap.parse_args()
    suite = os.environ.get("S3TESTS_DIR")
    mosaic = os.environ.get("MOSAIC_BIN", "mosaic")
    if not suite or not os.path.isfile(os.path.join(suite, "s3tests", "functional", "test_s3.py")):
        sys.exit("s3-tests: S3TESTS_DIR must name a checkout of ceph/s3-tests (scripts/s3-tests.sh finds one)")
    if a.update and (a.mode != "full" or a.select):
        sys.exit("s3-tests: --update only after a full run")
    tests = read_passing() if a.mode == "gate" else None

    with tempfile.TemporaryDirectory(prefix="mosaic-s3tests-") as work:
        out_dir = a.out or work
        os.makedirs(out_dir, exist_ok=True)
        server = Server(mosaic, work, a.lifecycle_day_s)
        started = time.monotonic()
        try:
            alt = server.admin_cli(mosaic, "key", "create", "--owner")
            tenant = server.admin_cli(mosaic, "key", "create", "--owner")
            conf = os.path.join(work, "s3tests.conf")
            write_config(conf, server, alt, tenant)
            junit = os.path.join(out_dir, "junit.xml")
            run_pytest(suite, conf, junit, tests, os.path.join(out_dir, "pytest.log"), a.select)
        finally:
            code = server.stop()
            if a.out:
                subprocess.run(["cp", server.log_path, os.path.join(out_dir, "server.log")])
        elapsed_s = time.monotonic() - started
        results = outcomes(junit)
        counts = {}
        for r in results.values():
            counts[r] = counts.get(r, 0) + 1
        print(f"s3-tests {a.mode}: {len(results)} tests in {elapsed_s:.0f} s: "
              + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        if code != 0:
            print(f"s3-tests: the server exited with {code} (expected 0 after SIGTERM)")
        if a.mode == "gate":
            missing = [t for t in tests if t not in results]
            broken = sorted(t for t in tests if results.get(t) not in (None, "passed"))
            for t in broken:
                print(f"REGRESSION: {t}: {results[t]}")
            for t in missing:
                print(f"NOT RUN: {t}")
            if broken or missing or code != 0:
                print(f"s3-tests gate: {len(broken) + len(missing)} of {len(tests)} listed tests did not pass"
                      + ("" if a.out else "; rerun with --out DIR to keep the logs"))
                sys.exit(1)
            print(f"s3-tests gate: all {len(tests)} listed tests passed")
        else:
            passed = sorted(t for t, r in results.items() if r == "passed")
            if a.update:
                with open(PASSING, "w") as f:
                    f.write("# ceph/s3-tests test_s3.py tests that Mosaic passes; `make test` fails if one of\n"
                            "# them stops passing. Rewritten by `scripts/s3-tests.sh full --update`.\n")
                    f.write("".join(t + "\n" for t in passed))
                print(f"s3-tests: wrote {len(passed)} tests to {PASSING}")
            elif os.path.exists(PASSING) and not a.select:
                listed = set(read_passing())
                lost = sorted(listed - set(passed))
                gained = sorted(set(passed) - listed)
                print(f"s3-tests: {len(gained)} pass that are not listed, {len(lost)} listed do not pass")
                for t in lost:
                    print(f"REGRESSION: {t}: {results.get(t, 'not run')}")


if __name__ == "__main__":
    main()
