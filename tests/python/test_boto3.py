"""boto3 with its defaults (flexible checksums on, aws-chunked uploads) against a real server."""

import base64
import hashlib
import json
import os

import botocore
import pytest
import requests


def test_put_get_head_delete(s3, bucket):
    body = os.urandom(300_000)
    r = s3.put_object(Bucket=bucket, Key="a/b.bin", Body=body, Metadata={"k": "v"}, ContentType="x/y")
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="a/b.bin")
    assert got["Body"].read() == body
    assert got["Metadata"] == {"k": "v"}
    assert got["ContentType"] == "x/y"
    head = s3.head_object(Bucket=bucket, Key="a/b.bin")
    assert head["ContentLength"] == len(body)
    part = s3.get_object(Bucket=bucket, Key="a/b.bin", Range="bytes=10-19")["Body"].read()
    assert part == body[10:20]
    s3.delete_object(Bucket=bucket, Key="a/b.bin")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_object(Bucket=bucket, Key="a/b.bin")
    assert e.value.response["Error"]["Code"] == "404"


def test_checksums_are_stored_and_returned(s3, bucket):
    for algo in ["CRC32", "CRC32C", "SHA256", "CRC64NVME"]:
        s3.put_object(Bucket=bucket, Key=algo, Body=b"x" * 5000, ChecksumAlgorithm=algo)
        head = s3.head_object(Bucket=bucket, Key=algo, ChecksumMode="ENABLED")
        assert "Checksum" + algo in head, head


def test_upload_file_multipart_and_list(s3, bucket, tmp_path):
    from boto3.s3.transfer import TransferConfig
    data = os.urandom(12 * 1024 * 1024 + 5)
    f = tmp_path / "big.bin"
    f.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    s3.upload_file(str(f), bucket, "big.bin", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="big.bin")
    assert head["ETag"].endswith('-3"')
    out = tmp_path / "out.bin"
    s3.download_file(bucket, "big.bin", str(out), Config=cfg)
    assert out.read_bytes() == data
    for i in range(25):
        s3.put_object(Bucket=bucket, Key=f"dir{i % 3}/k{i:02}", Body=b"")
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 7}):
        keys += [o["Key"] for o in page.get("Contents", [])]
    assert keys == sorted(keys) and len(keys) == 26
    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dir0/", "dir1/", "dir2/"]


def test_copy_and_delete_objects(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"copy me")
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"copy me"
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "src"}, {"Key": "dst"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["dst", "src"]


def test_presigned_urls(s3, bucket):
    put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=300)
    assert requests.put(put, data=b"via presign").status_code == 200
    get = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=300)
    r = requests.get(get)
    assert r.status_code == 200 and r.content == b"via presign"
    assert requests.get(get.replace("/p?", "/q?")).status_code == 403


def test_errors_are_s3_errors(s3, bucket):
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="missing")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    assert e.value.response["ResponseMetadata"]["RequestId"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.create_bucket(Bucket="Invalid_Name")
    assert e.value.response["Error"]["Code"] == "InvalidBucketName"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"")
    assert e.value.response["Error"]["Code"] == "KeyTooLongError"


def _nuke_versions(s3, name):
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        for v in page.get("Versions", []) + page.get("DeleteMarkers", []):
            s3.delete_object(Bucket=name, Key=v["Key"], VersionId=v["VersionId"], BypassGovernanceRetention=True)
    s3.delete_bucket(Bucket=name)


def test_versioning_with_the_paginator(s3):
    name = "py-versioning"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=name)["Status"] == "Enabled"
    ids = {}
    for key in ["a", "b/c", "b/d"]:
        ids[key] = [s3.put_object(Bucket=name, Key=key, Body=f"{key}{i}".encode())["VersionId"] for i in range(3)]
    marker = s3.delete_object(Bucket=name, Key="a")
    assert marker["DeleteMarker"] is True
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=name, Key="a")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"
    assert s3.get_object(Bucket=name, Key="a", VersionId=ids["a"][0])["Body"].read() == b"a0"
    pages = s3.get_paginator("list_object_versions").paginate(Bucket=name, PaginationConfig={"PageSize": 2})
    versions, markers = [], []
    for page in pages:
        versions += [(v["Key"], v["VersionId"], v["IsLatest"]) for v in page.get("Versions", [])]
        markers += [(m["Key"], m["VersionId"]) for m in page.get("DeleteMarkers", [])]
    assert markers == [("a", marker["VersionId"])]
    expected = [(k, v, i == 0 and k != "a") for k in ["a", "b/c", "b/d"] for i, v in enumerate(reversed(ids[k]))]
    assert versions == expected
    listed = s3.list_objects_v2(Bucket=name, Delimiter="/")
    assert [p["Prefix"] for p in listed.get("CommonPrefixes", [])] == ["b/"]
    assert "Contents" not in listed
    _nuke_versions(s3, name)


def test_object_lock_refuses_removal(s3):
    name = "py-object-lock"
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    s3.put_object_lock_configuration(Bucket=name, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}})
    v = s3.put_object(Bucket=name, Key="k", Body=b"locked")["VersionId"]
    assert s3.get_object_retention(Bucket=name, Key="k")["Retention"]["Mode"] == "GOVERNANCE"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.delete_object(Bucket=name, Key="k", VersionId=v)
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    s3.put_object_legal_hold(Bucket=name, Key="k", LegalHold={"Status": "ON"})
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.delete_object(Bucket=name, Key="k", VersionId=v, BypassGovernanceRetention=True)
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    s3.put_object_legal_hold(Bucket=name, Key="k", LegalHold={"Status": "OFF"})
    _nuke_versions(s3, name)


def test_public_read_acl_and_cors_for_a_browser(s3, server):
    name = "py-website"
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="index.html", Body=b"<html/>", ACL="public-read")
    s3.put_object(Bucket=name, Key="secret", Body=b"no")
    grants = s3.get_object_acl(Bucket=name, Key="index.html")["Grants"]
    assert {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"} in [g["Grantee"] for g in grants]
    # Unsigned requests, as a browser sends them: the public object only.
    assert requests.get(f"{server.endpoint}/{name}/index.html").content == b"<html/>"
    assert requests.get(f"{server.endpoint}/{name}/secret").status_code == 403
    s3.put_bucket_cors(Bucket=name, CORSConfiguration={"CORSRules": [
        {"AllowedOrigins": ["https://app.example.com"], "AllowedMethods": ["GET"], "MaxAgeSeconds": 60}]})
    ok = requests.options(f"{server.endpoint}/{name}/index.html", headers={
        "Origin": "https://app.example.com", "Access-Control-Request-Method": "GET"})
    assert ok.status_code == 200
    assert ok.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    refused = requests.options(f"{server.endpoint}/{name}/index.html", headers={
        "Origin": "https://other.example.com", "Access-Control-Request-Method": "GET"})
    assert refused.status_code == 403
    got = requests.get(f"{server.endpoint}/{name}/index.html", headers={"Origin": "https://app.example.com"})
    assert got.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    s3.put_object_acl(Bucket=name, Key="index.html", ACL="private")
    assert requests.get(f"{server.endpoint}/{name}/index.html").status_code == 403
    # HEAD shows the tag count; a missing key's 404 says it is no delete marker.
    s3.put_object_tagging(Bucket=name, Key="secret", Tagging={"TagSet": [{"Key": "a", "Value": "1"}]})
    head = s3.head_object(Bucket=name, Key="secret")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "1"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_object(Bucket=name, Key="missing")
    assert e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "false"
    s3.delete_objects(Bucket=name, Delete={"Objects": [{"Key": "index.html"}, {"Key": "secret"}]})
    s3.delete_bucket(Bucket=name)


def test_encryption_at_rest_sse_s3_kms_and_c(s3, bucket):
    body = os.urandom(200_000)
    r = s3.put_object(Bucket=bucket, Key="s3", Body=body, ServerSideEncryption="AES256")
    assert r["ServerSideEncryption"] == "AES256"
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    got = s3.get_object(Bucket=bucket, Key="s3", Range="bytes=65530-70000")
    assert got["ServerSideEncryption"] == "AES256" and got["Body"].read() == body[65530:70001]
    s3.put_object(Bucket=bucket, Key="kms", Body=body, ServerSideEncryption="aws:kms", SSEKMSKeyId="py-kms-key")
    head = s3.head_object(Bucket=bucket, Key="kms")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"], head["ContentLength"]) == ("aws:kms", "py-kms-key", len(body))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="x", Body=b"x", ServerSideEncryption="aws:kms", SSEKMSKeyId="no-such-key")
    assert e.value.response["Error"]["Code"] == "KMS.NotFoundException"
    # SSE-C: boto3 base64-encodes the key and adds its MD5.
    key, other = os.urandom(32), os.urandom(32)
    s3.put_object(Bucket=bucket, Key="c", Body=body, SSECustomerAlgorithm="AES256", SSECustomerKey=key)
    got = s3.get_object(Bucket=bucket, Key="c", SSECustomerAlgorithm="AES256", SSECustomerKey=key)
    assert got["Body"].read() == body and got["SSECustomerAlgorithm"] == "AES256"
    for kwargs in [{}, {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": other}]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            s3.get_object(Bucket=bucket, Key="c", **kwargs)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    # A copy from SSE-C to SSE-S3, and the bucket's default encryption.
    s3.copy_object(Bucket=bucket, Key="c2", CopySource={"Bucket": bucket, "Key": "c"},
                   CopySourceSSECustomerAlgorithm="AES256", CopySourceSSECustomerKey=key, ServerSideEncryption="AES256")
    assert s3.get_object(Bucket=bucket, Key="c2")["Body"].read() == body
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    assert s3.put_object(Bucket=bucket, Key="d", Body=b"by default")["ServerSideEncryption"] == "AES256"
    s3.delete_bucket_encryption(Bucket=bucket)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_bucket_encryption(Bucket=bucket)
    assert e.value.response["Error"]["Code"] == "ServerSideEncryptionConfigurationNotFoundError"
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in ["s3", "kms", "c", "c2", "d"]]})


def test_browser_post_uploads(s3, bucket, server):
    """POST uploads with boto3's presigned POST (SigV4): conditions on key, size and content type, the
    success status and redirect, and the refusals: tampered or expired policy, too large, anonymous."""
    conditions = [["starts-with", "$key", "uploads/"], ["content-length-range", 1, 1000],
                  ["starts-with", "$Content-Type", "text/"]]
    post = s3.generate_presigned_post(bucket, "uploads/${filename}", Fields={"Content-Type": "text/plain"},
                                      Conditions=conditions, ExpiresIn=600)
    fields = dict(post["fields"], key="uploads/a.txt")
    r = requests.post(post["url"], data=fields, files={"file": ("a.txt", b"hello post")})
    assert r.status_code == 204, r.text
    assert s3.get_object(Bucket=bucket, Key="uploads/a.txt")["Body"].read() == b"hello post"

    status_post = s3.generate_presigned_post(bucket, "uploads/b.txt", Fields={"success_action_status": "201"},
                                             Conditions=[{"success_action_status": "201"}], ExpiresIn=600)
    r = requests.post(status_post["url"], data=status_post["fields"], files={"file": ("b.txt", b"created")})
    assert r.status_code == 201 and "<Key>uploads/b.txt</Key>" in r.text, r.text

    redirect = "https://app.example.com/done"
    redirect_post = s3.generate_presigned_post(bucket, "uploads/c.txt", Fields={"success_action_redirect": redirect},
                                               Conditions=[{"success_action_redirect": redirect}], ExpiresIn=600)
    r = requests.post(redirect_post["url"], data=redirect_post["fields"], files={"file": ("c.txt", b"moved")},
                      allow_redirects=False)
    assert r.status_code == 303, r.text
    etag = s3.head_object(Bucket=bucket, Key="uploads/c.txt")["ETag"].strip('"')
    assert r.headers["Location"] == f"{redirect}?bucket={bucket}&key=uploads%2Fc.txt&etag=%22{etag}%22"

    # Another condition in the signed policy: the signature no longer matches it.
    forged = base64.b64encode(base64.b64decode(fields["policy"]).replace(b"1000", b"9999")).decode()
    tampered = dict(fields, policy=forged)
    r = requests.post(post["url"], data=tampered, files={"file": ("a.txt", b"evil")})
    assert r.status_code in (400, 403), r.text
    expired = s3.generate_presigned_post(bucket, "uploads/late.txt", ExpiresIn=-60)
    r = requests.post(expired["url"], data=expired["fields"], files={"file": ("late.txt", b"late")})
    assert r.status_code == 403 and "expired" in r.text, r.text
    r = requests.post(post["url"], data=fields, files={"file": ("a.txt", b"x" * 1001)})
    assert r.status_code == 400 and "EntityTooLarge" in r.text, r.text
    r = requests.post(post["url"], data={"key": "uploads/anon.txt"}, files={"file": ("anon.txt", b"anon")})
    assert r.status_code == 403 and "AccessDenied" in r.text, r.text
    for k in ("uploads/a.txt", "uploads/b.txt", "uploads/c.txt"):
        s3.delete_object(Bucket=bucket, Key=k)


def test_bucket_policy_deny_beats_allow(s3, bucket, server):
    """An anonymous reader is refused without a policy, let in by an Allow, and kept out of a prefix by a
    Deny that beats the Allow (the root key too)."""
    s3.put_object(Bucket=bucket, Key="public/a", Body=b"a")
    s3.put_object(Bucket=bucket, Key="private/b", Body=b"b")
    assert requests.get(f"{server.endpoint}/{bucket}/public/a").status_code == 403
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"},
        {"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/private/*"}]}
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    assert requests.get(f"{server.endpoint}/{bucket}/public/a").content == b"a"
    assert requests.get(f"{server.endpoint}/{bucket}/private/b").status_code == 403
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="private/b")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    s3.delete_bucket_policy(Bucket=bucket)


def test_copy_keeps_or_replaces_tags(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"tagged", Tagging="b=2&a=1")
    tags = lambda k: s3.get_object_tagging(Bucket=bucket, Key=k)["TagSet"]
    # S3's default directive is COPY: the copy has the source's tags (answered in key order).
    s3.copy_object(Bucket=bucket, Key="same", CopySource={"Bucket": bucket, "Key": "src"})
    assert tags("same") == [{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "2"}]
    assert s3.head_object(Bucket=bucket, Key="same")["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    s3.copy_object(Bucket=bucket, Key="new", CopySource={"Bucket": bucket, "Key": "src"},
                   TaggingDirective="REPLACE", Tagging="z=9")
    assert tags("new") == [{"Key": "z", "Value": "9"}]
    s3.copy_object(Bucket=bucket, Key="none", CopySource={"Bucket": bucket, "Key": "src"}, TaggingDirective="REPLACE")
    assert tags("none") == []
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "src"}, TaggingDirective="MOVE")
    assert e.value.response["Error"]["Code"] == "InvalidArgument"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        many = "&".join(f"k{i}=v" for i in range(11))
        s3.copy_object(Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "src"},
                       TaggingDirective="REPLACE", Tagging=many)
    assert e.value.response["Error"]["Code"] == "InvalidTag"


def _sha256_b64(data):
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def test_multipart_part_checksums(s3, bucket):
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]

    def upload(key):
        up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
        assert up["ChecksumAlgorithm"] == "SHA256"
        done = []
        for n, data in enumerate(parts, 1):
            r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n, Body=data,
                               ChecksumAlgorithm="SHA256")
            assert r["ChecksumSHA256"] == _sha256_b64(data)
            done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumSHA256": r["ChecksumSHA256"]})
        return up["UploadId"], done

    composite = base64.b64encode(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()).decode()
    upload_id, done = upload("mp")
    r = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload_id, MultipartUpload={"Parts": done},
                                     ChecksumSHA256=composite + "-2")
    assert (r["ChecksumSHA256"], r["ChecksumType"]) == (composite + "-2", "COMPOSITE")
    for n, data in enumerate(parts, 1):
        got = s3.get_object(Bucket=bucket, Key="mp", PartNumber=n, ChecksumMode="ENABLED")
        assert got["Body"].read() == data
        assert (got["ChecksumSHA256"], got["ChecksumType"]) == (_sha256_b64(data), "COMPOSITE")
        head = s3.head_object(Bucket=bucket, Key="mp", PartNumber=n, ChecksumMode="ENABLED")
        assert head["ChecksumSHA256"] == _sha256_b64(data)
    attrs = s3.get_object_attributes(Bucket=bucket, Key="mp", ObjectAttributes=["ObjectParts", "Checksum"])
    assert attrs["Checksum"]["ChecksumSHA256"] == composite + "-2"
    assert [p["ChecksumSHA256"] for p in attrs["ObjectParts"]["Parts"]] == [_sha256_b64(p) for p in parts]
    # A wrong checksum of the whole object, or of a part, is refused and the upload stays open.
    upload_id, done = upload("bad")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=upload_id, MultipartUpload={"Parts": done},
                                     ChecksumSHA256=_sha256_b64(b"other") + "-2")
    assert e.value.response["Error"]["Code"] == "BadDigest"
    wrong = [dict(done[0], ChecksumSHA256=_sha256_b64(b"other")), done[1]]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=upload_id, MultipartUpload={"Parts": wrong})
    assert e.value.response["Error"]["Code"] == "InvalidPart"
    s3.complete_multipart_upload(Bucket=bucket, Key="bad", UploadId=upload_id, MultipartUpload={"Parts": done})


def test_expiration_header_names_the_rule(s3, bucket):
    import datetime
    import email.utils
    import re
    rules = [{"ID": "old-logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 3}},
             {"ID": "tagged", "Filter": {"Tag": {"Key": "tmp", "Value": "1"}}, "Status": "Enabled",
              "Expiration": {"Days": 1}}]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})

    def expiry(r):
        m = re.fullmatch(r'expiry-date="(.+)", rule-id="(.+)"', r["Expiration"])
        return email.utils.parsedate_to_datetime(m.group(1)), m.group(2)

    put = s3.put_object(Bucket=bucket, Key="logs/a", Body=b"x")
    head = s3.head_object(Bucket=bucket, Key="logs/a")
    date, rule = expiry(put)
    assert (date, rule) == expiry(head) == expiry(s3.get_object(Bucket=bucket, Key="logs/a"))
    # Midnight UTC after three days have passed since the write.
    written = head["LastModified"]
    assert rule == "old-logs" and (date.hour, date.minute, date.second) == (0, 0, 0)
    assert written + datetime.timedelta(days=3) <= date < written + datetime.timedelta(days=4)
    assert "Expiration" not in s3.put_object(Bucket=bucket, Key="other", Body=b"x")
    # The earliest rule that matches wins; a tag filter is checked against the object's tags.
    s3.put_object(Bucket=bucket, Key="logs/t", Body=b"x", Tagging="tmp=1")
    assert expiry(s3.head_object(Bucket=bucket, Key="logs/t"))[1] == "tagged"
    s3.put_object_tagging(Bucket=bucket, Key="logs/t", Tagging={"TagSet": [{"Key": "tmp", "Value": "0"}]})
    assert expiry(s3.head_object(Bucket=bucket, Key="logs/t"))[1] == "old-logs"
    s3.delete_bucket_lifecycle(Bucket=bucket)
    assert "Expiration" not in s3.head_object(Bucket=bucket, Key="logs/a")
