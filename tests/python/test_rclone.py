"""rclone copy + check round trip against a real server."""

import os

from conftest import rclone, rclone_env


def test_copy_and_check(server, tmp_path):
    env = rclone_env(server.endpoint, tmp_path)
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    for i in range(20):
        (src / f"f{i}.bin").write_bytes(os.urandom(1000 * i))
    (src / "nested" / "big.bin").write_bytes(os.urandom(7 * 1024 * 1024))

    rclone(env, "mkdir", "mosaic:rclone-bucket")
    rclone(env, "copy", str(src), "mosaic:rclone-bucket/tree")
    rclone(env, "check", str(src), "mosaic:rclone-bucket/tree")
    back = tmp_path / "back"
    rclone(env, "copy", "mosaic:rclone-bucket/tree", str(back))
    rclone(env, "check", str(src), str(back))
    rclone(env, "purge", "mosaic:rclone-bucket")
