"""HTTPS with the clients' defaults against a certificate made in the test: boto3 (verify=CA), the aws cli
(--ca-bundle) and rclone (--ca-cert); SSE-C is accepted over TLS (the HTTPS server does not allow it over
plain HTTP); a client that does not trust the certificate is refused."""

import os

import boto3
import botocore.exceptions
import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from conftest import ACCESS_KEY, SECRET_KEY, aws, rclone, rclone_env


def client(server, verify):
    return boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1", verify=verify, config=Config(s3={"addressing_style": "path"}))


def test_boto3_over_https(tls_server, tmp_path):
    s3 = client(tls_server, tls_server.ca)
    s3.create_bucket(Bucket="tls-boto3")
    big = os.urandom(9 * 1024 * 1024 + 7)
    (tmp_path / "big").write_bytes(big)
    s3.upload_file(str(tmp_path / "big"), "tls-boto3", "big",
                   Config=TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024))
    assert s3.get_object(Bucket="tls-boto3", Key="big")["Body"].read() == big
    key = os.urandom(32)
    sse_c = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    s3.put_object(Bucket="tls-boto3", Key="customer", Body=b"over tls", **sse_c)
    assert s3.get_object(Bucket="tls-boto3", Key="customer", **sse_c)["Body"].read() == b"over tls"
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "tls-boto3", "Key": "big"}, ExpiresIn=300)
    assert url.startswith("https://")
    r = requests.get(url, verify=tls_server.ca)
    assert r.status_code == 200 and r.content == big
    with pytest.raises(botocore.exceptions.SSLError):
        client(tls_server, True).list_buckets()
    for k in ("big", "customer"):
        s3.delete_object(Bucket="tls-boto3", Key=k)
    s3.delete_bucket(Bucket="tls-boto3")


def test_aws_cli_over_https(tls_server, aws_env, tmp_path):
    ep = tls_server.endpoint
    ca = ("--ca-bundle", tls_server.ca)
    aws(aws_env, ep, *ca, "s3", "mb", "s3://tls-cli")
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.txt": os.urandom(1000), "b.bin": os.urandom(9 * 1024 * 1024 + 1)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    aws(aws_env, ep, *ca, "s3", "sync", str(src), "s3://tls-cli/data")
    dst = tmp_path / "dst"
    aws(aws_env, ep, *ca, "s3", "cp", "--recursive", "s3://tls-cli/data", str(dst))
    for name, data in files.items():
        assert (dst / name).read_bytes() == data
    key = tmp_path / "sse-c.key"
    key.write_bytes(os.urandom(32))
    sse_c = ("--sse-c", "AES256", "--sse-c-key", f"fileb://{key}")
    aws(aws_env, ep, *ca, "s3", "cp", str(src / "a.txt"), "s3://tls-cli/secret", *sse_c)
    aws(aws_env, ep, *ca, "s3", "cp", "s3://tls-cli/secret", str(tmp_path / "secret"), *sse_c)
    assert (tmp_path / "secret").read_bytes() == files["a.txt"]
    refused = aws(aws_env, ep, "s3", "ls", "s3://tls-cli", check=False)
    assert refused.returncode != 0 and "SSL" in refused.stderr, refused.stderr
    aws(aws_env, ep, *ca, "s3", "rb", "--force", "s3://tls-cli")


def test_rclone_over_https(tls_server, tmp_path):
    env = rclone_env(tls_server.endpoint, tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}.bin").write_bytes(os.urandom(100_000 * i))
    ca = ("--ca-cert", tls_server.ca)
    rclone(env, *ca, "mkdir", "mosaic:tls-rclone")
    rclone(env, *ca, "copy", str(src), "mosaic:tls-rclone/tree")
    rclone(env, *ca, "check", str(src), "mosaic:tls-rclone/tree")
    back = tmp_path / "back"
    rclone(env, *ca, "copy", "mosaic:tls-rclone/tree", str(back))
    rclone(env, "check", str(src), str(back))
    rclone(env, *ca, "purge", "mosaic:tls-rclone")
