#!/usr/bin/env bash
# Server CPU per small GET (or PUT), A against B, in alternated pairs: each run starts one binary's server on
# a fresh drive file and runs a workload of bench-s3-workloads.sh for 20 s (by default `small-get`: 10,000
# objects of 4 KiB preloaded, read at c16); over 10 s of the measured phase it reads the server's CPU time
# (/proc, user and system) and its count of answered requests (its metrics). CPU per request is steadier
# than a rate on a shared machine: the client's share of the two cores moves the rate, not the server's cost.
#
#   scripts/bench-cpu-per-get.sh BIN_A BIN_B [PAIRS]      # prints one line per run
#
# WORKLOAD=small-put counts PUTs instead, WORKLOAD=small-get-lean makes the GETs with the lean client;
# CLIENT=BIN runs every load with that build's `mosaic bench s3` (default: each server's own build). The
# client's CPU per request over the same 10 s is printed too (`client_us_per_op`).
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1
B=$2
PAIRS=${3:-3}
WORKLOAD=${WORKLOAD:-small-get}
case "$WORKLOAD" in
  small-get | small-get-lean) OP=GetObject ;;
  small-put) OP=PutObject ;;
  *) echo "WORKLOAD must be small-get, small-get-lean or small-put" >&2; exit 2 ;;
esac
DIR=${DATA:-/var/tmp/mosaic-cpu-per-get}
PORT=${PORT:-19300}
ADMIN=$((PORT + 1))
AK=benchkey
SK=benchsecret-0123456789
# shellcheck source=scripts/one-server.sh
source scripts/one-server.sh
# shellcheck source=scripts/bench-s3-workloads.sh
source scripts/bench-s3-workloads.sh
ARGS=
for w in "${WORKLOADS[@]}"; do [[ "${w%%|*}" == "$WORKLOAD" ]] && ARGS=${w#*|}; done

run() { # label bin
  require_free_port
  rm -rf "$DIR"
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$2" server --data "$DIR" --drive-size 4GiB \
    --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$ADMIN >/dev/null 2>&1 &
  PID=$!
  wait_port
  count() { curl -s "http://127.0.0.1:$ADMIN/metrics" | awk -v op="$OP" '$1 == "mosaic_s3_requests_total{op=\"" op "\",status=\"200\"}" {print $2}'; }
  ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
  # shellcheck disable=SC2086
  "${CLIENT:-$2}" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --duration 20s \
    --warmup 3s --seed 1 $ARGS --out "$DIR-result" >/dev/null 2>&1 &
  local client=$!
  sleep 9 # preload (about 3 s) and warm-up done
  local c0 t0 l0 c1 t1 l1 hz
  c0=$(count) t0=$(ticks $PID) l0=$(ticks $client)
  sleep 10
  c1=$(count) t1=$(ticks $PID) l1=$(ticks $client)
  hz=$(getconf CLK_TCK)
  echo "$1 ops=$((c1 - c0)) cpu_ms=$(((t1 - t0) * 1000 / hz)) us_per_op=$(((t1 - t0) * 1000000 / hz / (c1 - c0))) ops_per_s=$(((c1 - c0) / 10)) client_us_per_op=$(((l1 - l0) * 1000000 / hz / (c1 - c0)))"
  wait $client
  stop
  rm -rf "$DIR-result"
}

for i in $(seq 1 "$PAIRS"); do
  run "A-$i" "$A"
  run "B-$i" "$B"
done
