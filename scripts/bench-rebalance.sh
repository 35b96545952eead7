#!/usr/bin/env bash
# What adding a node costs: three node processes on loopback (two drive files each, 64 groups of 2+1) are
# filled with OBJECTS objects of SIZE, a foreground load (cosbench-a) runs once before and once while a
# fourth node joins and the rebalancer moves its share onto it, and once after. Reports the bytes moved against the
# optimal (the new node's weight share of the bytes stored), how long the move took, and the load's p99
# before, during and after, and the drives' work meanwhile (commit groups, data-device flushes and bytes
# written per second, from every node's engine counters). Usage:
#   scripts/bench-rebalance.sh [OUT]      (needs bin/mosaic from `make build`)
# MOVE_RATE (e.g. 16MiB) is each node's --move-rate; unset, the server's default.
# PAUSED=1: moves are paused before the fourth node joins, so the load "during" runs while every group that
# must move waits its turn and none is filled (what a move costs the foreground besides its copying); they
# are resumed after it, and the move's time then counts from the resume.
# Drive files live under $DIR and are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/var/tmp/bench-rebalance}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${DIR:-/var/tmp/mosaic-bench-rebalance}
AK=benchkey
SK=benchsecret-0123456789
SECRET=$(printf '%064x' 9)
OBJECTS=${OBJECTS:-1024}
SIZE=${SIZE:-1MiB}
LOAD=(--workload cosbench-a --size 4KiB --objects 2000 --concurrency 8 --duration "${LOAD_DURATION:-30s}" --warmup 2s --seed 2)
PIDS=()

wait_ready() { # url
  for _ in $(seq 1 600); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "not ready: $1" >&2
  return 1
}

stop_all() {
  if [[ ${#PIDS[@]} -gt 0 ]]; then kill "${PIDS[@]}" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  PIDS=()
  rm -rf "$DIR"
}
trap stop_all EXIT

admin() { # node args...
  local n=$1
  shift
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" admin --admin 127.0.0.1:$((19001 + 10 * n)) --json "$@"
}

start_node() { # n
  local n=$1 join=() rate=()
  [[ $n != 0 ]] && join=(--join 127.0.0.1:19100)
  [[ -n ${MOVE_RATE:-} ]] && rate=(--move-rate "$MOVE_RATE")
  MOSAIC_CLUSTER_SECRET=$SECRET MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server \
    --drive-size "${DRIVE_SIZE:-8GiB}" --data "$DIR/n$n" --drive "$DIR/n$n/d0" --drive "$DIR/n$n/d1" \
    --s3-address 127.0.0.1:$((19000 + 10 * n)) --admin-address 127.0.0.1:$((19001 + 10 * n)) \
    --cluster-address 127.0.0.1:$((19100 + n)) "${join[@]}" "${rate[@]}" >>"$OUT/node$n.log" 2>&1 &
  PIDS+=($!)
  if [[ $n == 0 ]]; then
    wait_ready http://127.0.0.1:19001/health/live
    admin 0 cluster init --erasure 2+1 --groups 64 >/dev/null
  fi
}

bench() { # name args...
  local name=$1
  shift
  "$MOSAIC" bench s3 --endpoint http://127.0.0.1:19000 --access-key $AK --secret-key $SK "$@" \
    --out "$OUT/$name" >"$OUT/$name.txt" 2>&1
}

counters() { # name: the time, then each running node's engine counters summed over its drives
  {
    date +%s.%N
    for n in 0 1 2 3; do
      curl -fsS -m 2 "http://127.0.0.1:$((19001 + 10 * n))/metrics" 2>/dev/null | awk -v n="$n" '
        /^mosaic_engine_groups_committed[ {]/ { g += $NF }
        /^mosaic_engine_device_flushes[ {]/ { f += $NF }
        /^mosaic_engine_device_bytes_written[ {]/ { w += $NF }
        END { if (NR > 0) print n, g + 0, f + 0, w + 0 }' || true
    done
  } >"$OUT/counters-$1.txt"
  # Node 0's set commits by path (plain, armed, armed_followed): how many, seconds, slower than 10/20/40 ms.
  curl -fsS -m 2 http://127.0.0.1:19001/metrics 2>/dev/null | awk '/^mosaic_set_commit/' >"$OUT/commits-$1.txt" || true
}

used_bytes() { # nodes...
  local total=0
  for n in "$@"; do
    total=$((total + $(admin "$n" info | python3 -c 'import json,sys; print(json.load(sys.stdin)["space"]["used_bytes"])')))
  done
  echo "$total"
}

mkdir -p "$OUT"
rm -rf "$DIR"
for n in 0 1 2; do start_node "$n"; done
for n in 0 1 2; do wait_ready "http://127.0.0.1:$((19001 + 10 * n))/health/ready"; done
bench fill --workload read-only --objects "$OBJECTS" --size "$SIZE" --concurrency 8 --duration 1s --warmup 0s \
  --bucket moved --keep
stored=$(used_bytes 0 1 2)
counters load-before-start
bench load-before "${LOAD[@]}"
counters load-before-end
# The fourth node joins; the load runs again while its share moves onto it.
[[ -n ${PAUSED:-} ]] && admin 0 cluster rebalance pause >/dev/null
start=$(date +%s.%N)
start_node 3
wait_ready http://127.0.0.1:19031/health/ready
counters load-during-start
if [[ -n ${PAUSED:-} ]]; then
  bench load-during "${LOAD[@]}"
  counters load-during-end
  admin 0 cluster rebalance resume >/dev/null
  start=$(date +%s.%N)
  load=
else
  bench load-during "${LOAD[@]}" &
  load=$!
fi
# Node 0's gauge of the groups still moving, read with curl once a second until it is 0 (after it was
# seen above 0: the map may not name the moves yet when the fourth node is ready). Not `admin cluster
# status` and python: measured, those two processes a second (and python's pyenv shim) took about 6% of
# the machine while the load "during" ran, and only then (docs/bench/2026-12-08-move-harness.md).
moving() { curl -fsS -m 2 http://127.0.0.1:19001/metrics 2>/dev/null | awk '/^mosaic_rebalance_groups_moving / {print $2}'; }
seen=
for _ in $(seq 1 3000); do
  m=$(moving)
  [[ -n $m && $m != 0 ]] && seen=1
  [[ -n $seen && $m == 0 ]] && break
  sleep 1
done
end=$(date +%s.%N)
[[ -n $seen ]] || { echo "no move was seen on node 0's metrics" >&2; exit 1; }
admin 0 cluster status >"$OUT/status.json"
moved_s=$(python3 -c "print(round($end - $start, 1))")
if [[ -n $load ]]; then
  wait "$load"
  counters load-during-end
fi
# The same load on the four nodes once nothing moves: what the fourth node costs by itself.
counters load-after-start
bench load-after "${LOAD[@]}"
counters load-after-end
python3 - "$OUT/status.json" "$stored" "$moved_s" "$OUT" >"$OUT/summary.txt" <<'EOF'
import json, sys
status, stored, moved_s, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4]
weights = {n["id"]: sum(d["weight"] for d in n["drives"]) for n in status["nodes"]}
newest = max(status["nodes"], key=lambda n: n["address"])["id"]
share = weights[newest] / sum(weights.values())
moved = status["rebalance"]["bytes_moved"]
optimal = stored * share
def p99(name):
    ops = json.load(open(f"{out}/{name}/result.json"))["operations"]
    return ", ".join(f"{k} {v['latency_us_p99'] / 1000:.1f} ms ({v['ops_per_s']:.0f}/s, {v['errors']} errors)"
                     for k, v in sorted(ops.items()))
print(f"stored before the join: {stored} bytes (shards on the three nodes' drives)")
print(f"new node's weight share: {share:.4f}; optimal move: {optimal:.0f} bytes")
print(f"moved: {moved} bytes = {moved / optimal:.3f}x optimal, groups moved {status['rebalance']['groups_moved']}, in {moved_s} s")
print(f"calls node 0 made again after a step's switch refused them: {status.get('switch_calls_made_again', 'n/a')}")
print(f"foreground p99 before: {p99('load-before')}")
print(f"foreground p99 during: {p99('load-during')}")
print(f"foreground p99 after (four nodes, nothing moving): {p99('load-after')}")
def counters(name):
    lines = open(f"{out}/counters-{name}.txt").read().split("\n")
    nodes = {int(l.split()[0]): [float(x) for x in l.split()[1:]] for l in lines[1:] if l.strip()}
    return float(lines[0]), nodes
# The drives' work while each load ran, all nodes together: the move's commits and device flushes land on
# the same disk as the load's.
for phase in ("before", "during", "after"):
    (t0, start), (t1, end) = counters(f"load-{phase}-start"), counters(f"load-{phase}-end")
    rates = [sum(v[i] - start.get(n, [0, 0, 0])[i] for n, v in end.items()) / (t1 - t0) for i in range(3)]
    print(f"drives while the load ran {phase}: {rates[0]:.0f} commit groups/s, {rates[1]:.0f} data-device "
          f"flushes/s, {rates[2] / 2**20:.1f} MiB/s written to data devices")
def commits(name):
    # {(metric, path, ms): value} from node 0's `mosaic_set_commit*` lines.
    out_ = {}
    for l in open(f"{out}/commits-{name}.txt"):
        key, value = l.rsplit(" ", 1)
        metric, _, labels = key.partition("{")
        kv = dict(p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
        out_[(metric, kv.get("path", "").strip('"'), kv.get("ms", "").strip('"'))] = float(value)
    return out_
# Node 0's commits by how a moving group's step treated them: a move's cost to its groups' writes.
for phase in ("before", "during", "after"):
    a, b = commits(f"load-{phase}-start"), commits(f"load-{phase}-end")
    d = lambda *k: b.get(k, 0) - a.get(k, 0)
    parts = []
    for path in ("plain", "armed", "armed_followed"):
        n = d("mosaic_set_commits", path, "")
        if n > 0:
            mean_ms = d("mosaic_set_commit_seconds_total", path, "") / n * 1000
            slow = "/".join(f"{d('mosaic_set_commits_slower_than', path, ms):.0f}" for ms in ("10", "20", "40"))
            parts.append(f"{path} {n:.0f} (mean {mean_ms:.1f} ms, over 10/20/40 ms: {slow})")
    print(f"node 0's set commits, load {phase} (its preload and cleanup included): "
          + ("; ".join(parts) or "none"))
EOF
cat "$OUT/summary.txt"
