#!/usr/bin/env bash
# 2 KiB appends on a 4+2 set over six drive files (issue 13): lazy sync of tails (appends gather in the
# tail's m + 1 copies; whole stripes are encoded in the background once a tail holds 1 MiB) against its
# ablation, each stripe encoded on the request path by the append that fills it (reading the stripe's
# earlier bytes back). Same binary, client, seed and duration, one after the other; the server's per-drive
# IO (write amplification, IO count, run length) comes from its metrics.
#
#   scripts/bench-append-ablation.sh [OUT]     (default docs/bench/<today>-append-ablation; needs bin/mosaic)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/bench/$(date -u +%F)-append-ablation}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${APPEND_DIR:-/var/tmp/mosaic-append}
AK=benchkey
SK=benchsecret-0123456789
PORT=19500
ARGS=(--duration "${DURATION:-20s}" --warmup 3s --seed 1 --workload append --objects 16 --concurrency 16)

wait_ready() {
  for _ in $(seq 1 300); do curl -fsS -o /dev/null "http://127.0.0.1:$((PORT + 1))/health/ready" 2>/dev/null && return 0; sleep 0.2; done
  echo "server not ready" >&2; exit 1
}
PID=
stop_server() {
  if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; fi
  rm -rf "$DIR"
}
trap stop_server EXIT

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (checkout at $(git rev-parse --short HEAD)), 4+2 over six drive files of at most 6GiB on $(df -T "$(dirname "$DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "server: $MOSAIC server --data DIR --drive-size 6GiB --drive DIR/drive1 ... --drive DIR/drive6 --erasure 4+2 [--lazy-encode-min-size 0]"
  echo "command: $MOSAIC bench s3 --endpoint http://127.0.0.1:$PORT --access-key $AK --secret-key $SK ${ARGS[*]} --drive-metrics http://127.0.0.1:$((PORT + 1))/metrics --out $OUT/<mode>"
} >"$OUT/machine.txt"

for mode in lazy request-path; do
  rm -rf "$DIR" && mkdir -p "$DIR"
  extra=()
  [[ $mode == request-path ]] && extra=(--lazy-encode-min-size 0)
  DRIVES=()
  for d in 1 2 3 4 5 6; do DRIVES+=(--drive "$DIR/drive$d"); done
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$DIR/data" --drive-size 6GiB "${DRIVES[@]}" \
    --erasure 4+2 "${extra[@]}" --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) \
    >"$DIR/server.log" 2>&1 &
  PID=$!
  wait_ready
  echo "== $mode"
  "$MOSAIC" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK "${ARGS[@]}" \
    --drive-metrics "http://127.0.0.1:$((PORT + 1))/metrics" --out "$OUT/$mode" | tail -12
  curl -fsS "http://127.0.0.1:$((PORT + 1))/metrics" | grep -E '^mosaic_set_(encoded|heal)' >"$OUT/$mode/set-metrics.txt" || true
  echo "$mode: $(awk '/VmHWM/ {printf "peak RSS %.0f MiB", $2/1024}' "/proc/$PID/status")" >>"$OUT/rss.txt"
  stop_server
done
echo "done: $OUT"
