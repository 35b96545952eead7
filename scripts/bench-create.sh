#!/usr/bin/env bash
# Paper 004 on a cluster: creates cost metadata work on the drives of each object's set only, so the work a
# drive does per create falls as drives are added (no metadata server). Three stores of 1+1 sets (two
# drive files per node), one at a time: one server process (2 drives), two nodes (4), four nodes (8). The
# same client creates the same number of empty objects through node 0 (`mosaic bench s3 --workload
# create`); every drive's engine counters (transactions committed, KV WAL bytes) are read from each node's
# /metrics before and after, and the report gives each drive's share per create. On two cores wall-clock
# throughput cannot grow with processes; the per-drive counters can fall. Usage:
#   scripts/bench-create.sh [OUT]   (OPS=20000 creates by default; needs bin/mosaic from `make build`)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/var/tmp/bench-create}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${DIR:-/var/tmp/mosaic-bench-create}
OPS=${OPS:-20000}
AK=benchkey
SK=benchsecret-0123456789
SECRET=$(printf '%064x' 9)
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

server() { # name args... (in the background, logged under $OUT)
  local name=$1
  shift
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --drive-size "${DRIVE_SIZE:-2GiB}" "$@" \
    >>"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}

start_single() {
  server single --data "$DIR/single" --drive "$DIR/single/d0" --drive "$DIR/single/d1" --erasure 1+1 \
    --s3-address 127.0.0.1:19000 --admin-address 127.0.0.1:19001
  wait_ready http://127.0.0.1:19001/health/ready
}

start_cluster() { # nodes
  local nodes=$1
  for n in $(seq 0 $((nodes - 1))); do
    local join=()
    [[ $n != 0 ]] && join=(--join 127.0.0.1:19100)
    MOSAIC_CLUSTER_SECRET=$SECRET server "nodes$nodes-$n" --data "$DIR/n$n" --drive "$DIR/n$n/d0" \
      --drive "$DIR/n$n/d1" --s3-address 127.0.0.1:$((19000 + 10 * n)) \
      --admin-address 127.0.0.1:$((19001 + 10 * n)) --cluster-address 127.0.0.1:$((19100 + n)) "${join[@]}"
    if [[ $n == 0 ]]; then
      wait_ready http://127.0.0.1:19001/health/live
      MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" admin --admin 127.0.0.1:19001 \
        cluster init --erasure 1+1 --groups 64 >/dev/null
    fi
  done
  for n in $(seq 0 $((nodes - 1))); do wait_ready "http://127.0.0.1:$((19001 + 10 * n))/health/ready"; done
  # Nodes that joined after the first placement take their share: the creates start once no group moves.
  for _ in $(seq 1 600); do
    MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" admin --json --admin 127.0.0.1:19001 cluster status 2>/dev/null |
      python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(0 if d["groups_moving"] == 0 and d["rebalance"]["nodes_behind"] == 0 else 1)' 2>/dev/null &&
      return 0
    sleep 0.5
  done
  echo "the groups still move" >&2
  return 1
}

scrape() { # nodes file: every drive's counters, one line per drive and counter
  local nodes=$1 file=$2
  : >"$file"
  for n in $(seq 0 $((nodes - 1))); do
    curl -fsS "http://127.0.0.1:$((19001 + 10 * n))/metrics" |
      grep -E '^mosaic_engine_(transactions_committed|kv_wal_bytes)\{' | sed "s/^/node$n /" >>"$file"
  done
}

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (checkout at $(git rev-parse --short HEAD)), drive files of at most ${DRIVE_SIZE:-2GiB} on $(df -T "$(dirname "$DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "stores: 1+1 sets; one process with 2 drives; 2 and 4 nodes with 2 drives each (64 groups)"
  echo "client: mosaic bench s3 --workload create --ops $OPS --concurrency 16 --warmup 0s through 127.0.0.1:19000"
} >"$OUT/machine.txt"
for store in single nodes2 nodes4; do
  stop_all
  case $store in
    single) start_single; nodes=1 ;;
    nodes2) start_cluster 2; nodes=2 ;;
    nodes4) start_cluster 4; nodes=4 ;;
  esac
  # The bucket first, so that the counters cover the creates only (kept: emptying it is not measured).
  "$MOSAIC" bench s3 --endpoint http://127.0.0.1:19000 --access-key $AK --secret-key $SK --workload create \
    --ops 16 --concurrency 1 --warmup 0s --seed 2 --keep --out "$OUT/$store/setup" >/dev/null 2>&1
  scrape "$nodes" "$OUT/$store/before.txt"
  echo "== create on $store"
  "$MOSAIC" bench s3 --endpoint http://127.0.0.1:19000 --access-key $AK --secret-key $SK --workload create \
    --ops "$OPS" --concurrency 16 --warmup 0s --seed 1 --keep --out "$OUT/$store/create" >"$OUT/$store/create.txt" 2>&1
  tail -1 "$OUT/$store/create.txt"
  scrape "$nodes" "$OUT/$store/after.txt"
done
stop_all
python3 - "$OUT" "$OPS" <<'EOF' | tee "$OUT/summary.md"
import json, re, sys
out, ops = sys.argv[1], int(sys.argv[2])
line = re.compile(r'^(\S+) (\S+)\{drive="([^"]+)"\} (\S+)$')
def read(path):
    values = {}
    for l in open(path):
        m = line.match(l.strip())
        if m:
            node, metric, drive, v = m.groups()
            values[(node + "/" + drive, metric)] = float(v)
    return values
print("| store | drives | creates/s | drive txns per create (all drives) | per drive per create: mean | max | KV WAL bytes per create per drive: mean |")
print("|---|---:|---:|---:|---:|---:|---:|")
for store in ["single", "nodes2", "nodes4"]:
    before, after = read(f"{out}/{store}/before.txt"), read(f"{out}/{store}/after.txt")
    result = json.load(open(f"{out}/{store}/create/result.json"))
    creates = result["total"]["ops"] - result["total"]["errors"]
    drives = sorted({d for d, m in after if m == "mosaic_engine_transactions_committed"})
    txns = [(after[(d, "mosaic_engine_transactions_committed")] - before.get((d, "mosaic_engine_transactions_committed"), 0)) / creates for d in drives]
    wal = [(after[(d, "mosaic_engine_kv_wal_bytes")] - before.get((d, "mosaic_engine_kv_wal_bytes"), 0)) / creates for d in drives]
    print(f"| {store} | {len(drives)} | {result['total']['ops_per_s']:,.0f} | {sum(txns):.2f} | {sum(txns)/len(drives):.3f} | {max(txns):.3f} | {sum(wal)/len(drives):,.0f} |")
EOF
echo "done: $OUT"
