#!/usr/bin/env bash
# The cost of admitting every request through microstores: small GETs (4 KiB, 1,000 objects, 16 clients) on
# one drive with `[microstores] enabled = false` against the default, same build, alternating rounds.
#
#   scripts/bench-microstores-cost.sh OUT [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
ROUNDS=${2:-2}
BIN=${MOSAIC_BIN:-bin/mosaic}
DIR=${DATA_DIR:-/var/tmp/mosaic-microstores-cost}
PORT=19820
AK=benchkey
SK=benchsecret-0123456789
export MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK
# shellcheck source=one-server.sh
source "$(dirname "$0")/one-server.sh"
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for mode in off on; do
    require_free_port
    rm -rf "$DIR"
    mkdir -p "$DIR"
    printf '[microstores]\nenabled = %s\n' "$([[ $mode == on ]] && echo true || echo false)" >"$DIR/mosaic.toml"
    "$BIN" server --data "$DIR/data" --drive-size 4GiB --config "$DIR/mosaic.toml" --s3-address 127.0.0.1:$PORT \
      --admin-address 127.0.0.1:$((PORT + 1)) >/dev/null 2>&1 &
    PID=$!
    wait_port
    "$BIN" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --workload read-only \
      --size 4KiB --objects 1000 --duration 15s --warmup 3s --concurrency 16 --seed 1 \
      --out "$OUT/round$round/$mode" >/dev/null 2>&1 || { echo "round $round $mode FAILED"; exit 1; }
    echo "round $round microstores $mode: $(jq -r '.operations.GET | "\(.ops_per_s|floor) GET/s, p99 \(.latency_us_p99) us, errors \(.errors)"' "$OUT/round$round/$mode/result.json")"
    stop
  done
done | tee "$OUT/summary.txt"
