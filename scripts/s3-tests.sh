#!/usr/bin/env bash
# ceph/s3-tests against Mosaic: `scripts/s3-tests.sh gate` (the passing list; part of `make test`) or
# `scripts/s3-tests.sh full [--update] [--out DIR]` (every test of test_s3.py; a longer run).
# Finds the suite (S3TESTS_DIR, else ../shared/s3-tests beside the clone, else a clone of the pinned
# revision in the cache) and prepares its Python venv outside the clone, only when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# The revision the passing list was measured at; another revision may pass or fail other tests.
PINNED=8f0ae7b404a3
CACHE="${MOSAIC_CACHE:-$(if [ -w /var/cache ]; then echo /var/cache; else echo "$HOME/.cache/mosaic"; fi)}"
VENV="$CACHE/mosaic-s3tests-venv"

# shellcheck source=apt.sh
source "$ROOT/scripts/apt.sh"
need_apt=()
command -v git >/dev/null 2>&1 || need_apt+=(git)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
apt_install "${need_apt[@]}"

suite="${S3TESTS_DIR:-}"
if [ -z "$suite" ]; then
    for d in "$ROOT/../shared/s3-tests" /work/shared/s3-tests "$CACHE/s3-tests-$PINNED"; do
        if [ -f "$d/s3tests/functional/test_s3.py" ]; then suite="$d"; break; fi
    done
fi
if [ -z "$suite" ]; then
    echo "s3-tests: no copy of ceph/s3-tests found; cloning revision $PINNED into $CACHE"
    git clone -q https://github.com/ceph/s3-tests "$CACHE/s3-tests-$PINNED.tmp"
    git -C "$CACHE/s3-tests-$PINNED.tmp" checkout -q "$PINNED"
    mv "$CACHE/s3-tests-$PINNED.tmp" "$CACHE/s3-tests-$PINNED"
    suite="$CACHE/s3-tests-$PINNED"
fi

# The suite's own requirements, without tox and gevent (neither is used by test_s3.py).
want="boto3==1.44.8 botocore==1.44.8 munch==4.0.0 isodate==0.7.2 requests==2.34.2 pytz==2026.6 httplib2==0.32.1 lxml==6.1.3 pytest==9.2.0 PyYAML==6.0.4 python-dateutil==2.9.0.post0"
if [ ! -x "$VENV/bin/pytest" ] || [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$want" ]; then
    echo "s3-tests: preparing the Python venv in $VENV"
    python3 -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q $want
    echo "$want" > "$VENV/.requirements"
fi

MOSAIC_BIN="${MOSAIC_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/mosaic}" \
    S3TESTS_DIR="$suite" exec "$VENV/bin/python" "$ROOT/scripts/s3-tests.py" "$@"
