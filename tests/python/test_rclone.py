"""rclone copy + check round trip against a real server."""

import os
import subprocess

from conftest import ACCESS_KEY, SECRET_KEY


def test_copy_and_check(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RCLONE_", "AWS_"))}
    env.update({
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_MOSAIC_TYPE": "s3",
        "RCLONE_CONFIG_MOSAIC_PROVIDER": "Other",
        "RCLONE_CONFIG_MOSAIC_ENDPOINT": server.endpoint,
        "RCLONE_CONFIG_MOSAIC_ACCESS_KEY_ID": ACCESS_KEY,
        "RCLONE_CONFIG_MOSAIC_SECRET_ACCESS_KEY": SECRET_KEY,
        "RCLONE_CONFIG_MOSAIC_REGION": "us-east-1",
        "RCLONE_CONFIG_MOSAIC_FORCE_PATH_STYLE": "true",
    })
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    for i in range(20):
        (src / f"f{i}.bin").write_bytes(os.urandom(1000 * i))
    (src / "nested" / "big.bin").write_bytes(os.urandom(7 * 1024 * 1024))

    def rclone(*args):
        r = subprocess.run(["rclone", *args], env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"rclone {' '.join(args)}: {r.stderr}"
        return r

    rclone("mkdir", "mosaic:rclone-bucket")
    rclone("copy", str(src), "mosaic:rclone-bucket/tree")
    rclone("check", str(src), "mosaic:rclone-bucket/tree")
    back = tmp_path / "back"
    rclone("copy", "mosaic:rclone-bucket/tree", str(back))
    rclone("check", str(src), str(back))
    rclone("purge", "mosaic:rclone-bucket")
