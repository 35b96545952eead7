#!/usr/bin/env bash
# Runs `mosaic bench s3` workloads against two Mosaic builds, one after the other on the same machine, with
# the same client, drive size and seed, and writes both results and their comparison under OUT: an A/B check
# that a change costs nothing (only figures measured side by side compare).
#
#   scripts/bench-s3-ab.sh OUT BASELINE_BIN NEW_BIN
#
# CLIENT=BIN runs the load with that build's `mosaic bench s3` (default NEW_BIN's), so that a series can keep
# one client while the servers run in either order.
# ONLY="small-put small-get" selects workloads (names in bench-s3-workloads.sh); DRIVE_SIZE (default 12GiB) is
# each drive's maximum; SET=4+2 gives both servers one erasure set over k+m drive files (default: one drive);
# the drives are removed after each server.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
A=${2:?baseline mosaic binary}
B=${3:?new mosaic binary}
CLIENT=${CLIENT:-$B}
DATA_DIR=${DATA_DIR:-/var/tmp/mosaic-ab-data}
AK=benchkey
SK=benchsecret-0123456789
PORT=19200
COMMON=(--duration "${DURATION:-20s}" --warmup 3s --seed 1)
# shellcheck source=bench-s3-workloads.sh
source "$(dirname "$0")/bench-s3-workloads.sh"

wait_ready() { # url
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "not ready: $1" >&2
  return 1
}

SERVER_PID=
stop_server() {
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
  rm -rf "$DATA_DIR"
}
trap stop_server EXIT

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "a (baseline): $("$A" --version) $A"
  # The binaries name no commit: the work tree's is recorded, and which build each was is the caller's to say.
  echo "b (new): $("$B" --version) $B"
  echo "client: $("$CLIENT" --version) $CLIENT"
  echo "work tree: commit $(git rev-parse --short HEAD)"
  echo "drives: ${SET:-1+0}, each ${DRIVE_SIZE:-12GiB} maximum, files on $(df -T "$(dirname "$DATA_DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "common arguments: ${COMMON[*]}"
} >"$OUT/machine.txt"
: >>"$OUT/rss.txt"
DRIVES=()
if [[ -n "${SET:-}" ]]; then
  for d in $(seq 1 $((${SET%+*} + ${SET#*+}))); do DRIVES+=(--drive "$DATA_DIR/drive$d"); done
  DRIVES+=(--erasure "$SET")
fi
for entry in "${WORKLOADS[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then continue; fi
  for side in a b; do
    bin=$A; [[ $side == b ]] && bin=$B
    rm -rf "$DATA_DIR"
    MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$bin" server --data "$DATA_DIR" --drive-size "${DRIVE_SIZE:-12GiB}" \
      "${DRIVES[@]}" --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) >"${LOG_DIR:-/tmp}/mosaic-ab-$side.log" 2>&1 &
    SERVER_PID=$!
    wait_ready "http://127.0.0.1:$((PORT + 1))/health/ready"
    echo "== $name on $side: mosaic bench s3 --endpoint http://127.0.0.1:$PORT ${COMMON[*]} $args --out $OUT/$name/$side"
    # shellcheck disable=SC2086
    "$CLIENT" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK "${COMMON[@]}" $args \
      --out "$OUT/$name/$side" >"$OUT/$name.$side.txt" 2>/dev/null || echo "FAILED: see $OUT/$name.$side.txt"
    tail -3 "$OUT/$name.$side.txt"
    echo "$name $side: $(awk '/VmHWM/ {printf "peak RSS %.0f MiB", $2/1024}' "/proc/$SERVER_PID/status")" >>"$OUT/rss.txt"
    stop_server
    rm -f "$OUT/$name.$side.txt"
  done
  "$B" bench compare "$OUT/$name/b/result.json" "$OUT/$name/a/result.json" --plot "$OUT/$name/compare.svg" \
    >"$OUT/$name/compare.md" || true
done
echo "done: $OUT"
