#!/usr/bin/env bash
# Server CPU per small GET, A against B, in alternated pairs: each run starts one binary's server on a fresh
# drive file, preloads 10,000 objects of 4 KiB and reads them at c16 (the 4 KiB GET of
# bench-s3-vs-minio.sh) for 20 s, and over 10 s of that phase reads the server's CPU time (/proc, user and
# system) and its count of answered GETs (its metrics). CPU per GET is steadier than a rate on a shared
# machine: the client's share of the two cores moves the rate, not the server's cost.
#
#   scripts/bench-cpu-per-get.sh BIN_A BIN_B [PAIRS]      # prints one line per run
set -euo pipefail
A=$1
B=$2
PAIRS=${3:-3}
DATA=${DATA:-/var/tmp/mosaic-cpu-per-get}
PORT=${PORT:-19300}
AK=benchkey
SK=benchsecret-0123456789

run() { # label bin
  rm -rf "$DATA"
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$2" server --data "$DATA" --drive-size 4GiB \
    --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) >/dev/null 2>&1 &
  local pid=$!
  trap 'kill $pid 2>/dev/null || true; rm -rf "$DATA"' EXIT
  for _ in $(seq 1 300); do curl -fsS -o /dev/null "http://127.0.0.1:$((PORT + 1))/health/ready" 2>/dev/null && break; sleep 0.2; done
  gets() { curl -s "http://127.0.0.1:$((PORT + 1))/metrics" | awk '/^mosaic_s3_requests_total\{op="GetObject",status="200"\}/ {print $2}'; }
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  (
    sleep 9 # preload (about 3 s) and warm-up done
    g0=$(gets) t0=$(ticks)
    sleep 10
    g1=$(gets) t1=$(ticks)
    hz=$(getconf CLK_TCK)
    echo "$1 gets=$((g1 - g0)) cpu_ms=$(((t1 - t0) * 1000 / hz)) us_per_get=$(((t1 - t0) * 1000000 / hz / (g1 - g0))) ops_per_s=$(((g1 - g0) / 10))"
  ) &
  local probe=$!
  "$2" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --duration 20s --warmup 3s \
    --seed 1 --workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16 \
    --out "$DATA-result" >/dev/null 2>&1
  wait $probe
  kill $pid
  wait $pid 2>/dev/null || true
  rm -rf "$DATA" "$DATA-result"
  trap - EXIT
}

for i in $(seq 1 "$PAIRS"); do
  run "A-$i" "$A"
  run "B-$i" "$B"
done
