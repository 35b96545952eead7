#!/usr/bin/env bash
# SSE-S3 against no encryption, same build, same client and seed, in alternating rounds (the machine's
# noise moves whole runs): 64 MiB PUTs (write-only) and 64 MiB GETs (read-only, reads only), each against
# a fresh server; with SSE the bench bucket gets SSE-S3 default encryption, so every object is encrypted.
#
#   scripts/bench-sse.sh OUT [ROUNDS]
#
# DURATION (default 20s), SIZE (default 64MiB), OBJECTS (default 16), CONCURRENCY (default 4),
# DRIVE_SIZE (default 12GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
ROUNDS=${2:-3}
BIN=${MOSAIC_BIN:-bin/mosaic}
DIR=${DATA_DIR:-/var/tmp/mosaic-sse-bench}
PORT=19710
AK=benchkey
SK=benchsecret-0123456789
# shellcheck source=one-server.sh
source "$(dirname "$0")/one-server.sh"
COMMON=(--size "${SIZE:-64MiB}" --objects "${OBJECTS:-16}" --concurrency "${CONCURRENCY:-4}"
  --duration "${DURATION:-20s}" --warmup 3s --seed 1)
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "build: $("$BIN" --version) (commit $(git rev-parse --short HEAD))"
  echo "commands: mosaic bench s3 --workload write-only ${COMMON[*]} [--sse-s3]"
  echo "          mosaic bench s3 --workload read-only --mix 100/0/0 ${COMMON[*]} [--sse-s3]"
} >"$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for workload in write-only read-only; do
    for mode in plain sse-s3; do
      require_free_port
      rm -rf "$DIR"
      MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$BIN" server --data "$DIR" --drive-size "${DRIVE_SIZE:-12GiB}" \
        --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) >/dev/null 2>&1 &
      PID=$!
      wait_port
      extra=()
      [[ $mode == sse-s3 ]] && extra+=(--sse-s3)
      [[ $workload == read-only ]] && extra+=(--mix 100/0/0)
      op=PUT
      [[ $workload == read-only ]] && op=GET
      "$BIN" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --workload "$workload" \
        "${COMMON[@]}" "${extra[@]}" --out "$OUT/round$round/$workload-$mode" >/dev/null 2>&1 \
        || { echo "round $round $workload $mode FAILED"; exit 1; }
      echo "round $round $workload $mode: $(jq -r ".operations.$op | \"\(.mib_per_s|floor) MiB/s $op, p99 \(.latency_us_p99) us, errors \(.errors)\"" "$OUT/round$round/$workload-$mode/result.json")"
      stop
    done
  done
done | tee "$OUT/summary.txt"
