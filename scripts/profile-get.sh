#!/usr/bin/env bash
# Flame graphs of Mosaic's GET paths (issue 14): a one-drive server (the README default) under the small-GET
# and the large-GET workload of bench-ceiling.sh (ONLY=small-put: the 4 KiB PUT of bench-s3-workloads.sh;
# ONLY="small-get-lean large-get-lean": the GETs through the lean client),
# sampled with `perf record` (DWARF call graphs) while the same client runs, plus the server's syscalls per
# request (`perf stat` on raw syscall entries).
# Sampling costs CPU on these two cores, so the throughput printed here is not a result: use
# bench-ceiling.sh and bench-s3-ab.sh for figures.
#
#   scripts/profile-get.sh [OUT]     (default docs/bench/<today>-profile; needs bin/mosaic, perf, inferno)
#
# KEEP_FOLDED=DIR keeps the collapsed stacks there (DIR/<workload>.folded) for a closer look.
# SET=4+2 profiles a k+m set over k+m drive files instead of one drive (ONLY=large-get picks one workload).
#
# Writes OUT/<workload>.svg (flame graph), OUT/<workload>-stages.txt (inclusive share of each stage) and
# OUT/<workload>-syscalls.txt. Requests are counted by the server's metrics (GetObject, or PutObject for
# small-put); syscalls are per request of the workload's kind. The stages are a GET's (profile-stages.py):
# for small-put only the shared ones (http, auth, checksum, rocksdb, allocator) mean something.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/bench/$(date -u +%F)-profile}
MOSAIC=${MOSAIC:-bin/mosaic}
# The load generator; a fixed one when two server builds are profiled against each other.
LOADGEN=${LOADGEN:-$MOSAIC}
DIR=${PROFILE_DIR:-/var/tmp/mosaic-profile}
AK=benchkey
SK=benchsecret-0123456789
PORT=19650
SECONDS_SAMPLED=${SECONDS_SAMPLED:-8}
# The profiled workloads (their arguments come from bench-s3-workloads.sh) and the op each one counts.
declare -A OPS=([small-get]=GetObject [large-get]=GetObject [small-put]=PutObject [small-get-lean]=GetObject
  [large-get-lean]=GetObject)
# shellcheck source=scripts/bench-s3-workloads.sh
source scripts/bench-s3-workloads.sh
args_of() { # workload: its `mosaic bench s3` arguments
  local w
  for w in "${WORKLOADS[@]}"; do [[ "${w%%|*}" == "$1" ]] && { echo "${w#*|}"; return 0; }; done
  echo "no workload $1 in bench-s3-workloads.sh" >&2
  return 1
}
DRIVES=()
SET_NAME="one drive"
if [[ -n "${SET:-}" ]]; then
  for d in $(seq 1 $((${SET%+*} + ${SET#*+}))); do DRIVES+=(--drive "$DIR/data/drive$d"); done
  DRIVES+=(--erasure "$SET")
  SET_NAME="a $SET set"
fi
for tool in perf inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt install linux-perf; cargo install inferno)" >&2; exit 1; }
done

# shellcheck source=scripts/one-server.sh
source scripts/one-server.sh
served() { # admin port, op: requests of that op the server counted
  curl -fsS "http://127.0.0.1:$1/metrics" 2>/dev/null | awk -v op="$2" '$1 ~ "^mosaic_s3_requests_total\\{op=\"" op "\"" {s += $2} END {printf "%d", s}'
}
wait_served() { # admin port, op, count: until the server counted that many more requests (at most 120 s)
  local base
  base=$(served "$1" "$2")
  for _ in $(seq 1 1200); do
    (($(served "$1" "$2") >= base + $3)) && return 0
    sleep 0.1
  done
  echo "no $2 requests reached the server" >&2
  return 1
}
bench() { # workload duration [extra...]
  local w=$1 d=$2 args
  shift 2
  args=$(args_of "$w")
  # shellcheck disable=SC2086
  "$LOADGEN" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --seed 1 --keep \
    --warmup 1s --duration "$d" $args "$@"
}

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (commit $(git rev-parse --short HEAD)), $SET_NAME, drives of at most ${DRIVE_SIZE:-12GiB}"
  echo "sampling: perf record -F 499 -g --call-graph dwarf,16384 -p <server> -- sleep $SECONDS_SAMPLED"
  for w in "${!OPS[@]}"; do echo "workload $w: $(args_of "$w")"; done
} >"$OUT/machine.txt"

for w in ${ONLY:-small-get large-get}; do
  rm -rf "$DIR" && mkdir -p "$DIR"
  require_free_port
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$DIR/data" --drive-size "${DRIVE_SIZE:-12GiB}" "${DRIVES[@]}" \
    --s3-address "127.0.0.1:$PORT" --admin-address "127.0.0.1:$((PORT + 1))" >"$DIR/server.log" 2>&1 &
  PID=$!
  wait_port
  echo "== $w"
  bench "$w" 2s >/dev/null # prepares the objects
  bench "$w" "$((SECONDS_SAMPLED * 2 + 4))s" --json >"$DIR/run.json" &
  CLIENT=$!
  # The run prepares its objects again (PUTs over the kept ones) before its GETs: sample only once the GETs
  # have begun, or the profile mixes in the PUTs' commits (a PUT workload prepares nothing).
  wait_served "$((PORT + 1))" "${OPS[$w]}" 200
  sleep 1
  perf record -F 499 -g --call-graph dwarf,16384 -p "$PID" -o "$DIR/perf.data" -- sleep "$SECONDS_SAMPLED" 2>/dev/null
  perf stat -e raw_syscalls:sys_enter -p "$PID" -o "$DIR/syscalls.txt" -- sleep "$SECONDS_SAMPLED"
  wait "$CLIENT"
  ops=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["ops_per_s"])' "$DIR/run.json")
  syscalls=$(awk '/raw_syscalls:sys_enter/ {gsub(",", "", $1); print $1}' "$DIR/syscalls.txt")
  awk -v n="$syscalls" -v s="$SECONDS_SAMPLED" -v ops="$ops" 'BEGIN {
    printf "server syscalls: %d in %d s; client requests/s over the run: %.0f; syscalls per request: %.1f\n", n, s, ops, (ops > 0 ? n / s / ops : 0) }' \
    >"$OUT/$w-syscalls.txt"
  cat "$OUT/$w-syscalls.txt"
  perf script -i "$DIR/perf.data" 2>/dev/null | inferno-collapse-perf >"$DIR/folded"
  inferno-flamegraph --minwidth 0.2 --title "Mosaic $w ($SET_NAME)" <"$DIR/folded" >"$OUT/$w.svg"
  python3 scripts/profile-stages.py "$DIR/folded" >"$OUT/$w-stages.txt"
  if [[ -n "${KEEP_FOLDED:-}" ]]; then cp "$DIR/folded" "$KEEP_FOLDED/$w.folded"; fi
  cat "$OUT/$w-stages.txt"
  stop
done
echo "done: $OUT"
