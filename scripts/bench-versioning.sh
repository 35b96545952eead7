#!/usr/bin/env bash
# PUT into a versioned bucket against PUT into an unversioned one, same build, same client and seed, in
# alternating rounds (the machine's noise moves whole runs): every PUT overwrites one of a small set of keys,
# so in the versioned bucket each PUT also keeps the old version (a clone) beside the key.
#
#   scripts/bench-versioning.sh OUT [ROUNDS]
#
# DURATION (default 20s), SIZE (default 4KiB), OBJECTS (default 2000 keys), DRIVE_SIZE (default 12GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
ROUNDS=${2:-3}
BIN=${MOSAIC_BIN:-bin/mosaic}
DIR=${DATA_DIR:-/var/tmp/mosaic-versioning-bench}
PORT=19700
AK=benchkey
SK=benchsecret-0123456789
# shellcheck source=one-server.sh
source "$(dirname "$0")/one-server.sh"
ARGS=(--workload write-only --size "${SIZE:-4KiB}" --objects "${OBJECTS:-2000}" --duration "${DURATION:-20s}"
  --warmup 3s --seed 1 --keep)
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "build: $("$BIN" --version) (checkout at $(git rev-parse --short HEAD))"
  echo "command: mosaic bench s3 ${ARGS[*]} [--versioning]"
} >"$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for mode in plain versioned; do
    require_free_port
    rm -rf "$DIR"
    MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$BIN" server --data "$DIR" --drive-size "${DRIVE_SIZE:-12GiB}" \
      --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) >/dev/null 2>&1 &
    PID=$!
    wait_port
    extra=()
    [[ $mode == versioned ]] && extra=(--versioning)
    "$BIN" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK "${ARGS[@]}" "${extra[@]}" \
      --out "$OUT/round$round/$mode" >/dev/null 2>&1 || { echo "round $round $mode FAILED"; exit 1; }
    echo "round $round $mode: $(jq -r '.operations.PUT | "\(.ops_per_s|floor) PUT/s, p99 \(.latency_us_p99) us, errors \(.errors)"' "$OUT/round$round/$mode/result.json")"
    stop
  done
done | tee "$OUT/summary.txt"
