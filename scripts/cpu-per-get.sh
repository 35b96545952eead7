#!/usr/bin/env bash
# CPU per small GET of Mosaic builds, alternated (issue 14): each binary serves a one-drive server (the README
# default) under the same small-GET load, and the server's and the client's CPU time (/proc/PID/stat, user +
# system) over a steady window is divided by the GETs the server counted in it. On this machine's two cores
# the client takes about twice the server's CPU, and the machine's speed moves by a fifth within minutes, so
# the server's CPU is also given as a share of the client's: that ratio is the steadier figure.
#
#   scripts/cpu-per-get.sh OUT BIN_A BIN_B [ROUNDS]     (rounds of A then B, default 3)
#
# Writes OUT/cpu-per-get.tsv (one line per run) and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
A=${2:?first mosaic binary}
B=${3:?second mosaic binary}
ROUNDS=${4:-3}
DIR=${CPU_DIR:-/var/tmp/mosaic-cpu-per-get}
AK=benchkey
SK=benchsecret-0123456789
PORT=19660
WINDOW_S=${WINDOW_S:-8}
LOAD=(--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16 --seed 1 --keep)

# shellcheck source=scripts/one-server.sh
source scripts/one-server.sh
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
gets_served() {
  curl -fsS "http://127.0.0.1:$((PORT + 1))/metrics" | awk '/^mosaic_s3_requests_total\{op="GetObject"/ {s += $2} END {printf "%d", s}'
}

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "a: $("$A" --version) $A"
  echo "b: $("$B" --version) $B"
  echo "load: mosaic bench s3 ${LOAD[*]}; window ${WINDOW_S} s once the GETs run"
} >"$OUT/machine.txt"
printf 'round\tbinary\tgets_per_s\tserver_us_per_get\tclient_us_per_get\tserver_over_client\n' >"$OUT/cpu-per-get.tsv"
hz=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
  for side in a b; do
    bin=$A; [[ $side == b ]] && bin=$B
    rm -rf "$DIR" && mkdir -p "$DIR"
    require_free_port
    MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$bin" server --data "$DIR/data" --drive-size 4GiB \
      --s3-address "127.0.0.1:$PORT" --admin-address "127.0.0.1:$((PORT + 1))" >"$DIR/server.log" 2>&1 &
    PID=$!
    wait_port
    bench=("$bin" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK "${LOAD[@]}")
    "${bench[@]}" --duration 2s --warmup 0s >/dev/null 2>&1 # prepares the objects
    "${bench[@]}" --duration "$((WINDOW_S + 8))s" --warmup 0s >/dev/null 2>&1 &
    CLIENT=$!
    # The run prepares its objects again before its GETs: the window starts once GETs are counted.
    base=$(gets_served)
    until (($(gets_served) > base + 2000)); do sleep 0.2; done
    s0=$(ticks "$PID") c0=$(ticks "$CLIENT") g0=$(gets_served)
    sleep "$WINDOW_S"
    s1=$(ticks "$PID") c1=$(ticks "$CLIENT") g1=$(gets_served)
    wait "$CLIENT"
    awk -v r="$round" -v s="$side" -v sd=$((s1 - s0)) -v cd=$((c1 - c0)) -v g=$((g1 - g0)) -v hz="$hz" -v w="$WINDOW_S" \
      'BEGIN { printf "%d\t%s\t%.0f\t%.1f\t%.1f\t%.3f\n", r, s, g / w, sd / hz * 1e6 / g, cd / hz * 1e6 / g, sd / cd }' \
      >>"$OUT/cpu-per-get.tsv"
    stop
  done
done
column -t "$OUT/cpu-per-get.tsv"
