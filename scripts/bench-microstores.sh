#!/usr/bin/env bash
# Microstores (paper 002) on one node with six drive files (one 3+3 set): a small-object tenant beside a
# large-object tenant, and the four COSBench workloads at once, in three modes, same build, same client and
# seed, in alternating rounds:
#   monolith     no microstore defined: every bucket is served by the default one (all workers);
#   static       microstores "small" (small-* classes' buckets) and "large" (large-*), workers fixed;
#   adaptive     the same microstores, the resource manager moving workers each round;
#   sets         adaptive, and each microstore owns one of two erasure sets (needs SETS=2);
#   sets-static  static, and each microstore owns one of two erasure sets (needs SETS=2).
# Then a load change with the adaptive mode: the small tenant alone, the large one joining in the middle,
# with `mosaic admin microstore status` sampled every second (workers and sets held, each microstore's p99)
# for the plot. LOAD_CHANGE_MODE=lc-sets runs it on sixteen drives of 2+2 (four sets): small owns set 0,
# large set 1, the default microstore holds sets 2 and 3, and the resource manager may move sets too; the
# small tenant's target is 40 ms there (it meets it alone on this machine, so a set moves on the change;
# the small tenant runs 10 s alone before the timeline starts, so the first slow rounds of a new store are
# not on it; set_patience_rounds = 10).
#
#   scripts/bench-microstores.sh OUT [ROUNDS]
#
# DURATION (default 30s), CONCURRENCY (per tenant, default 8), LARGE_SIZE (default 1MiB-32MiB), DRIVE_SIZE
# (per drive, default 4GiB), SETS (1: six drives, one 3+3 set; 2: twelve drives, two 3+3 sets, every mode),
# MODES (default "monolith static adaptive", with SETS=2 also "sets sets-static"), ABCD_MODES (default
# "monolith adaptive"), ABCD_ROUNDS (default 1), LARGE_WORKERS (the large microstore's workers in the
# two-tenant rounds and the load change, default 4), ABCD_LARGE_WORKERS (in A-D, default twice CONCURRENCY),
# LARGE_TARGET_MIB_S (the large microstore's target, default 100),
# LOAD_CHANGE (default 1; 0 skips it), LOAD_CHANGE_MODE (adaptive or lc-sets), MOVE_SETS (default true;
# false: the resource manager moves no set, the ablation), IO_SHARES (default true; false: drives do not
# schedule IO by microstore, the ablation), IO_IN_FLIGHT (default 8MiB: device bytes a drive lets be in
# flight before IO waits its turn by share), BULK_NICE (the bulk CPU class's nice; 0: none, the ablation;
# unset: the server's default), SMALL_RATE (the small tenant's offered rate in op/s in the two-tenant rounds:
# an open loop whose latencies count from each operation's due time; unset: a closed loop of CONCURRENCY
# clients).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT directory}
ROUNDS=${2:-2}
BIN=${MOSAIC_BIN:-bin/mosaic}
DIR=${DATA_DIR:-/var/tmp/mosaic-microstores-bench}
PORT=19800
ADMIN=127.0.0.1:$((PORT + 1))
AK=benchkey
SK=benchsecret-0123456789
export MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK
# shellcheck source=one-server.sh
source "$(dirname "$0")/one-server.sh"
DURATION=${DURATION:-30s}
SMALL_TENANT=cosbench-b${SMALL_RATE:+@$SMALL_RATE}
CONC=${CONCURRENCY:-8}
LARGE=${LARGE_SIZE:-1MiB-32MiB}
SETS=${SETS:-1}
DRIVES=$((6 * SETS))
if [[ $SETS == 2 ]]; then DEFAULT_MODES="monolith static adaptive sets sets-static"; else DEFAULT_MODES="monolith static adaptive"; fi
read -r -a MODE_LIST <<<"${MODES:-$DEFAULT_MODES}"
read -r -a ABCD_LIST <<<"${ABCD_MODES:-monolith adaptive}"
ABCD_ROUNDS=${ABCD_ROUNDS:-1}
# The large microstore's workers: in the two-tenant rounds fewer than the large tenant's clients, so that
# its requests queue at the frontend rather than crowd the small tenant's; in A-D as many as the clients
# of its two workloads (C and D), so that C's short reads do not wait behind D's long writes for a worker.
TENANTS_LARGE_WORKERS=${LARGE_WORKERS:-4}
ABCD_LARGE_WORKERS=${ABCD_LARGE_WORKERS:-$((2 * CONC))}
large_workers=$TENANTS_LARGE_WORKERS
COMMON=(--endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --concurrency "$CONC" --seed 1)
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "build: $("$BIN" --version) (commit $(git rev-parse --short HEAD))"
  echo "server: $DRIVES drives of ${DRIVE_SIZE:-4GiB} (thin files, $SETS 3+3 set(s)), [microstores] window_slot = 1s, floor_workers = 2, set_patience_rounds = 10, move_sets = ${MOVE_SETS:-true}, io_shares = ${IO_SHARES:-true}, io_in_flight = ${IO_IN_FLIGHT:-8MiB}, bulk_nice = ${BULK_NICE:-default}"
  echo "large microstore: target ${LARGE_TARGET_MIB_S:-100} MiB/s; workers $TENANTS_LARGE_WORKERS (two tenants, load change), $ABCD_LARGE_WORKERS (A-D)"
  echo "load change: ${LOAD_CHANGE_MODE:-adaptive} (lc-sets: sixteen drives of 2+2, four sets; small owns set 0 with a 40 ms target, large set 1)"
  echo "command: mosaic bench s3 --workload tenants --tenants $SMALL_TENANT,cosbench-d:$LARGE --duration $DURATION --concurrency $CONC --warmup 3s --seed 1"
} >"$OUT/machine.txt"

start_server() { # MODE
  require_free_port
  rm -rf "$DIR"
  mkdir -p "$DIR"
  local adapt=true small_sets=() large_sets=() erasure=3+3 count=$DRIVES small_target=20
  [[ $1 == static || $1 == sets-static ]] && adapt=false
  [[ $1 == sets* || $1 == lc-sets ]] && small_sets=(--sets 0) && large_sets=(--sets 1)
  [[ $1 == lc-sets ]] && erasure=2+2 count=16 small_target=40
  printf '[microstores]\nwindow_slot = "1s"\nwindow_slots = 10\nfloor_workers = 2\nadapt = %s\nset_patience_rounds = 10\nmove_sets = %s\nio_shares = %s\nio_in_flight = "%s"\n' \
    "$adapt" "${MOVE_SETS:-true}" "${IO_SHARES:-true}" "${IO_IN_FLIGHT:-8MiB}" >"$DIR/mosaic.toml"
  [[ -z ${BULK_NICE:-} ]] || echo "bulk_nice = $BULK_NICE" >>"$DIR/mosaic.toml"
  local drives=()
  for i in $(seq 0 $((count - 1))); do drives+=(--drive "$DIR/d$i"); done
  "$BIN" server --data "$DIR/data" "${drives[@]}" --erasure $erasure --drive-size "${DRIVE_SIZE:-4GiB}" --config "$DIR/mosaic.toml" \
    --s3-address 127.0.0.1:$PORT --admin-address "$ADMIN" >"$DIR/server.log" 2>&1 &
  PID=$!
  wait_port
  if [[ $1 != monolith ]]; then
    "$BIN" admin --admin "$ADMIN" microstore create small --target-p99-ms $small_target --workers 32 "${small_sets[@]}" >/dev/null
    "$BIN" admin --admin "$ADMIN" microstore create large --target-mib-s "${LARGE_TARGET_MIB_S:-100}" --workers "$large_workers" "${large_sets[@]}" >/dev/null
  fi
}

assign() { # MODE BUCKET MICROSTORE
  [[ $1 == monolith ]] || "$BIN" admin --admin "$ADMIN" microstore assign "$2" "$3" >/dev/null
}

summary() { # RESULT LABEL
  jq -r --arg l "$2" '.tenants[] | "\($l) \(.workload): \(.total.ops_per_s|floor) op/s, \(.total.mib_per_s*10|floor/10) MiB/s, errors \(.total.errors), p99 ms: " +
    ([.operations | to_entries[] | "\(.key) \(.value.latency_us_p99/1000)"] | join(", "))' "$1"
}

for round in $(seq 1 "$ROUNDS"); do
  for mode in "${MODE_LIST[@]}"; do
    start_server $mode
    assign $mode ten-t1 small
    assign $mode ten-t2 large
    "$BIN" bench s3 "${COMMON[@]}" --workload tenants --tenants "$SMALL_TENANT,cosbench-d:$LARGE" --bucket ten --warmup 3s \
      --duration "$DURATION" --out "$OUT/round$round/$mode" >/dev/null 2>"$OUT/bench-errors.log" || { echo "round $round $mode FAILED: $(tail -1 "$OUT/bench-errors.log")"; stop; exit 1; }
    summary "$OUT/round$round/$mode/result.json" "round $round $mode"
    "$BIN" admin --admin "$ADMIN" --json microstore status >"$OUT/round$round/$mode/microstores.json"
    stop
  done
done | tee "$OUT/summary.txt"

# The four COSBench workloads at once, each in its own bucket (two bench processes of two tenants each).
large_workers=$ABCD_LARGE_WORKERS
for round in $(seq 1 "$ABCD_ROUNDS"); do
  for mode in "${ABCD_LIST[@]}"; do
    start_server $mode
    for b in ac-t1:small ac-t2:large bd-t1:small bd-t2:large; do assign $mode "${b%%:*}" "${b##*:}"; done
    out=$OUT/abcd/round$round/$mode
    "$BIN" bench s3 "${COMMON[@]}" --workload tenants --tenants "cosbench-a,cosbench-c:$LARGE" --bucket ac --warmup 3s \
      --duration "$DURATION" --out "$out/ac" >/dev/null 2>&1 &
    AC=$!
    "$BIN" bench s3 "${COMMON[@]}" --workload tenants --tenants "cosbench-b,cosbench-d:$LARGE" --bucket bd --warmup 3s \
      --duration "$DURATION" --out "$out/bd" >/dev/null 2>"$OUT/bench-errors.log" || { echo "abcd $mode FAILED: $(tail -1 "$OUT/bench-errors.log")"; stop; exit 1; }
    wait $AC || { echo "abcd $mode FAILED"; stop; exit 1; }
    summary "$out/ac/result.json" "abcd round $round $mode"
    summary "$out/bd/result.json" "abcd round $round $mode"
    stop
  done
done | tee -a "$OUT/summary.txt"
large_workers=$TENANTS_LARGE_WORKERS

[[ ${LOAD_CHANGE:-1} == 1 ]] || exit 0
# A load change: the small tenant alone for 20 s, then the large one too for LC_BOTH seconds (25; 60 with
# lc-sets, so the time after a set's move is seen); status every second.
LC=${LOAD_CHANGE_MODE:-adaptive}
if [[ $LC == lc-sets ]]; then BOTH=${LC_BOTH:-60}; else BOTH=${LC_BOTH:-25}; fi
start_server "$LC"
assign "$LC" lc-small small
assign "$LC" lc-large large
mkdir -p "$OUT/load-change"
if [[ $LC == lc-sets ]]; then
  # The buckets on their microstores' sets and the home off them before the load begins (at most 60 s).
  for _ in $(seq 600); do
    "$BIN" admin --admin "$ADMIN" --json microstore status | jq -e '.placements["lc-small"].sets == [0] and
      .placements["lc-large"].sets == [1] and ([.placements[], .home] | all(.moving_from == null))' >/dev/null && break
    sleep 0.1
  done
  # Ten seconds of the small tenant alone first (kept), so the timeline starts from a warm store.
  "$BIN" bench s3 "${COMMON[@]}" --workload cosbench-b --bucket lc-small --duration 10s --warmup 0s --keep \
    --out "$OUT/load-change/warm" >/dev/null 2>&1 || echo "load change: warm-up FAILED"
fi
: >"$OUT/load-change/status.jsonl"
(
  t0=$(date +%s.%N)
  all_sets=$("$BIN" admin --admin "$ADMIN" --json drives | jq '.sets | length')
  while kill -0 "$PID" 2>/dev/null; do
    s=$("$BIN" admin --admin "$ADMIN" --json microstore status 2>/dev/null) || break
    # The default microstore's sets are the home (null: every set).
    jq -c --argjson t "$(echo "$(date +%s.%N) - $t0" | bc)" --argjson all "$all_sets" '(.home.sets // null) as $home | {t: $t,
      moving: (([.placements[] | select(.moving_from != null)] | length) + (if .home.moving_from then 1 else 0 end)),
      microstores: [.microstores[] | {name, target, workers, bandwidth_cap_mib_s, in_use, waiting, last_round, io_points, io_served_bytes,
        sets: (if .name == "default" then ($home // [range($all)]) else .sets end)}]}' <<<"$s" >>"$OUT/load-change/status.jsonl"
    sleep 1
  done
) &
SAMPLER=$!
"$BIN" bench s3 "${COMMON[@]}" --workload cosbench-b --bucket lc-small --duration $((20 + BOTH + 5))s --warmup 0s \
  --out "$OUT/load-change/small" >/dev/null 2>&1 &
SMALL=$!
sleep 20
"$BIN" bench s3 "${COMMON[@]}" --workload cosbench-d --size "$LARGE" --bucket lc-large --duration "${BOTH}s" --warmup 0s \
  --out "$OUT/load-change/large" >/dev/null 2>&1 || echo "load change: large tenant FAILED"
wait $SMALL || echo "load change: small tenant FAILED"
cp "$DIR/server.log" "$OUT/load-change/server.log"
stop
wait $SAMPLER 2>/dev/null || true
python3 scripts/plot-microstores.py "$OUT/load-change/status.jsonl" "$OUT/load-change.svg"
grep -c "microstore workers moved\|microstore bandwidth moved\|microstore set moved" "$OUT/load-change/server.log" | sed 's/^/load change: decisions logged: /' | tee -a "$OUT/summary.txt"
grep "microstore set moved\|objects of moving buckets moved\|a bucket's data mov\|no microstore's sets mov" "$OUT/load-change/server.log" >"$OUT/load-change/set-moves.log" || true
rm -f "$OUT/load-change/server.log"
