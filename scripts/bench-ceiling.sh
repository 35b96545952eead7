#!/usr/bin/env bash
# The ceiling of GETs on this machine (issue 14): the same small-GET and large-GET workloads, same client,
# against `mosaic bench ceiling` (a minimal server answering from memory with Mosaic's headers, no storage,
# no signature check) and against a Mosaic server (one drive, the README default), one after the other.
# Mosaic's GETs are reported as a fraction of the ceiling.
#
#   scripts/bench-ceiling.sh [OUT]     (default docs/bench/<today>-ceiling; needs bin/mosaic)
#
# GET_CLIENT=lean makes every GET through the lean client (`--get-client lean`) instead of the SDK.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/bench/$(date -u +%F)-ceiling}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${CEILING_DIR:-/var/tmp/mosaic-ceiling}
AK=benchkey
SK=benchsecret-0123456789
PORT=19600
COMMON=(--duration "${DURATION:-20s}" --warmup 3s --seed 1 --keep --get-client "${GET_CLIENT:-sdk}")
declare -A WORKLOADS=(
  [small-get]="--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16"
  [large-get]="--workload cosbench-c --mix 100/0/0 --size 64MiB --objects 16 --concurrency 4"
)

# shellcheck source=scripts/one-server.sh
source scripts/one-server.sh

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (commit $(git rev-parse --short HEAD)); one drive of at most 12GiB on $(df -T "$(dirname "$DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "ceiling: $MOSAIC bench ceiling --address 127.0.0.1:$PORT"
  echo "mosaic server: $MOSAIC server --data DIR --drive-size 12GiB --s3-address 127.0.0.1:$PORT"
  echo "command: $MOSAIC bench s3 --endpoint http://127.0.0.1:$PORT --access-key $AK --secret-key $SK ${COMMON[*]} <workload> --out $OUT/<workload>/<server>"
  for w in "${!WORKLOADS[@]}"; do echo "workload $w: ${WORKLOADS[$w]}"; done
} >"$OUT/machine.txt"

for server in ceiling mosaic; do
  for w in small-get large-get; do
    rm -rf "$DIR" && mkdir -p "$DIR"
    require_free_port
    if [[ $server == ceiling ]]; then
      "$MOSAIC" bench ceiling --address "127.0.0.1:$PORT" >"$DIR/server.log" 2>&1 &
    else
      MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$DIR/data" --drive-size 12GiB \
        --s3-address "127.0.0.1:$PORT" --admin-address "127.0.0.1:$((PORT + 1))" >"$DIR/server.log" 2>&1 &
    fi
    PID=$!
    wait_port
    echo "== $w on $server"
    # shellcheck disable=SC2086
    "$MOSAIC" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK "${COMMON[@]}" \
      ${WORKLOADS[$w]} --out "$OUT/$w/$server" | grep -E "^total|^\| GET"
    stop
  done
done
for w in small-get large-get; do
  "$MOSAIC" bench compare "$OUT/$w/ceiling/result.json" "$OUT/$w/mosaic/result.json" --plot "$OUT/$w/compare.svg" \
    >"$OUT/$w/compare.md"
  grep -E "GET \| (ops/s|MiB/s|p99)" "$OUT/$w/compare.md"
done
echo "done: $OUT"
