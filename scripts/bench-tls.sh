#!/usr/bin/env bash
# HTTPS against plain HTTP, same build, same client (aws-sdk-s3 over rustls) and seed, in alternating
# rounds (the machine's noise moves whole runs): 4 KiB GETs at concurrency 16 and 64 MiB GETs at
# concurrency 4, each against a fresh server; HTTPS with a certificate made by scripts/test-cert.sh.
#
#   scripts/bench-tls.sh OUT [ROUNDS]
#
# DURATION (default 20s), DRIVE_SIZE (default 12GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
ROUNDS=${2:-3}
BIN=${MOSAIC_BIN:-bin/mosaic}
DIR=${DATA_DIR:-/var/tmp/mosaic-tls-bench}
CERTS=$DIR-certs
PORT=19720
AK=benchkey
SK=benchsecret-0123456789
# shellcheck source=one-server.sh
source "$(dirname "$0")/one-server.sh"
trap 'stop; rm -rf "$CERTS"' EXIT
rm -rf "$CERTS"
scripts/test-cert.sh "$CERTS"
COMMON=(--duration "${DURATION:-20s}" --warmup 3s --seed 1 --mix 100/0/0)
declare -A SHAPE=([small-get]="--size 4KiB --objects 2000 --concurrency 16"
  [large-get]="--size 64MiB --objects 16 --concurrency 4")
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "build: $("$BIN" --version) (commit $(git rev-parse --short HEAD))"
  for w in small-get large-get; do
    echo "command ($w): mosaic bench s3 --workload read-only ${SHAPE[$w]} ${COMMON[*]} [--endpoint https://... --ca-cert CA]"
  done
} >"$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for w in small-get large-get; do
    for mode in http https; do
      require_free_port
      rm -rf "$DIR"
      tls=()
      [[ $mode == https ]] && tls=(--tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key")
      MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$BIN" server --data "$DIR" --drive-size "${DRIVE_SIZE:-12GiB}" \
        --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) "${tls[@]}" >/dev/null 2>&1 &
      PID=$!
      wait_port
      client=(--endpoint "http://127.0.0.1:$PORT")
      [[ $mode == https ]] && client=(--endpoint "https://127.0.0.1:$PORT" --ca-cert "$CERTS/ca.pem")
      # shellcheck disable=SC2086
      "$BIN" bench s3 "${client[@]}" --access-key $AK --secret-key $SK --workload read-only ${SHAPE[$w]} \
        "${COMMON[@]}" --out "$OUT/round$round/$w-$mode" >/dev/null 2>&1 \
        || { echo "round $round $w $mode FAILED"; exit 1; }
      echo "round $round $w $mode: $(jq -r '.operations.GET | "\(.ops_per_s|floor) obj/s, \(.mib_per_s|floor) MiB/s, p99 \(.latency_us_p99) us, errors \(.errors)"' "$OUT/round$round/$w-$mode/result.json")"
      stop
    done
  done
done | tee "$OUT/summary.txt"
