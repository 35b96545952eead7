"""A real `mosaic server` process on ephemeral ports for client tests (boto3, aws cli, rclone)."""

import json
import os
import signal
import subprocess
import tempfile
import threading

import pytest

MOSAIC = os.environ.get("MOSAIC_BIN", "mosaic")
ACCESS_KEY = "PYTESTACCESSKEY00001"
SECRET_KEY = "pytest-secret-key-0123456789abcdefghij"


REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


class Server:
    """tls: (cert, key) files to serve HTTPS with; else plain HTTP, where SSE-C is allowed for the tests."""

    def __init__(self, data_dir, tls=None, extra_env=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOSAIC_")}
        env.update(extra_env or {})
        env["MOSAIC_ACCESS_KEY"] = ACCESS_KEY
        env["MOSAIC_SECRET_KEY"] = SECRET_KEY
        extra = ["--tls-cert", tls[0], "--tls-key", tls[1]] if tls else ["--sse-c-over-http"]
        self.proc = subprocess.Popen(
            [MOSAIC, "server", "--data", data_dir, "--s3-address", "127.0.0.1:0",
             "--admin-address", "127.0.0.1:0", "--log-format", "json", "--drive-size", "512MiB",
             # SSE-KMS with a local key.
             "--kms-key", "py-kms-key", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        self.s3 = self.admin = None
        for line in self.proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("message") == "mosaic is serving":
                self.s3, self.admin = event["s3"], event["admin"]
                break
        if self.s3 is None:
            raise RuntimeError("mosaic server exited before serving")
        # Keep draining the log so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.endpoint = f"{'https' if tls else 'http'}://{self.s3}"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def server():
    with tempfile.TemporaryDirectory() as d:
        s = Server(os.path.join(d, "data"))
        yield s
        assert s.stop() == 0


@pytest.fixture(scope="session")
def tls_server():
    """A server on HTTPS with a certificate made here (scripts/test-cert.sh); `ca` is the file to trust."""
    with tempfile.TemporaryDirectory() as d:
        certs = os.path.join(d, "certs")
        subprocess.run([os.path.join(REPO, "scripts", "test-cert.sh"), certs], check=True)
        s = Server(os.path.join(d, "data"), tls=(os.path.join(certs, "server.pem"), os.path.join(certs, "server.key")))
        s.ca = os.path.join(certs, "ca.pem")
        yield s
        assert s.stop() == 0


@pytest.fixture(scope="session")
def s3(server):
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def bucket(s3, request):
    name = "py-" + request.node.name.replace("_", "-").lower()[:50]
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=o["Key"])
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def aws_env(server, tmp_path):
    """Environment for the aws cli: our credentials and a private config file (never the user's ~/.aws)."""
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n  multipart_threshold = 8MB\n  multipart_chunksize = 5MB\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")})
    return env


def aws(env, endpoint, *args, check=True):
    r = subprocess.run(["aws", "--endpoint-url", endpoint, *args], env=env, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"aws {' '.join(args)} failed: {r.stderr}")
    return r


def rclone_env(endpoint, tmp_path):
    """rclone's remote "mosaic:" for an endpoint, in a private config (never the user's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RCLONE_", "AWS_"))}
    env.update({
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_MOSAIC_TYPE": "s3",
        "RCLONE_CONFIG_MOSAIC_PROVIDER": "Other",
        "RCLONE_CONFIG_MOSAIC_ENDPOINT": endpoint,
        "RCLONE_CONFIG_MOSAIC_ACCESS_KEY_ID": ACCESS_KEY,
        "RCLONE_CONFIG_MOSAIC_SECRET_ACCESS_KEY": SECRET_KEY,
        "RCLONE_CONFIG_MOSAIC_REGION": "us-east-1",
        "RCLONE_CONFIG_MOSAIC_FORCE_PATH_STYLE": "true",
    })
    return env


def rclone(env, *args):
    r = subprocess.run(["rclone", *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"rclone {' '.join(args)}: {r.stderr}"
    return r
