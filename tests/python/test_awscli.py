"""The aws cli (cp, sync, ls, rm, multipart thresholds, presign) against a real server."""

import os

import requests

from conftest import aws


def test_cp_sync_ls_rm(server, aws_env, tmp_path):
    ep = server.endpoint
    aws(aws_env, ep, "s3", "mb", "s3://cli-bucket")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": os.urandom(1000), "sub/b.bin": os.urandom(9 * 1024 * 1024 + 1), "c.txt": b""}
    for name, data in files.items():
        (src / name).write_bytes(data)
    # The private config sets multipart above 8 MiB with 5 MiB parts: sub/b.bin goes in two parts.
    aws(aws_env, ep, "s3", "sync", str(src), "s3://cli-bucket/data")
    listing = aws(aws_env, ep, "s3", "ls", "--recursive", "s3://cli-bucket/").stdout
    for name in files:
        assert f"data/{name}" in listing
    dst = tmp_path / "dst"
    aws(aws_env, ep, "s3", "cp", "--recursive", "s3://cli-bucket/data", str(dst))
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    # A second sync uploads nothing.
    again = aws(aws_env, ep, "s3", "sync", str(src), "s3://cli-bucket/data").stdout
    assert "upload:" not in again
    url = aws(aws_env, ep, "s3", "presign", "s3://cli-bucket/data/a.txt", "--expires-in", "300").stdout.strip()
    r = requests.get(url)
    assert r.status_code == 200 and r.content == files["a.txt"]
    aws(aws_env, ep, "s3", "rm", "--recursive", "s3://cli-bucket/data")
    assert aws(aws_env, ep, "s3", "ls", "--recursive", "s3://cli-bucket/").stdout.strip() == ""
    aws(aws_env, ep, "s3", "rb", "s3://cli-bucket")
