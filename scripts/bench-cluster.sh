#!/usr/bin/env bash
# The cost of the cluster on one machine: the same 2+1 sets, as one server process (three drive files) and
# as three node processes on loopback (two drive files each; every set spans the three nodes)
# The same client runs the same workloads through the single server and through node 0. Usage:
#   scripts/bench-cluster.sh [OUT]        (DURATION=20s by default; needs bin/mosaic from `make build`)
# TARGETS="cluster" runs one store only, ONLY="small-put small-get" some workloads only (an A/B of two
# builds: run it twice with MOSAIC=... and compare the two result.json with `mosaic bench compare`).
# TARGETS="cluster minio" compares the cluster with MinIO distributed on the same machine: three minio
# processes on the same ports, two drives each (directories on the XFS mount $MINIO_DIR, see
# docs/bench/README.md), one erasure set of six drives with parity 2 (4+2: 1.5x stored, as 2+1).
# ALL_NODES=1 sends the requests of the cluster and MinIO targets through all three nodes in turn (one
# endpoint per node) instead of through node 0; the single server has one endpoint either way.
# KEEP=1 leaves each workload's objects in a bucket of its own instead of deleting them after it (deleting
# 10,000 objects through a cluster takes minutes; the store is removed after its target anyway).
# Both stores run on drive files under $DIR (removed on exit); only one runs at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/var/tmp/bench-cluster}
MOSAIC=${MOSAIC:-bin/mosaic}
MINIO=${MINIO:-$(command -v minio || echo "$HOME/go/bin/minio")}
MINIO_DIR=${MINIO_DIR:-/mnt/minio-xfs/cluster}
DIR=${DIR:-/var/tmp/mosaic-bench-cluster}
AK=benchkey
SK=benchsecret-0123456789
SECRET=$(printf '%064x' 7)
COMMON=(--duration "${DURATION:-20s}" --warmup 3s --seed 1)
# The small and large workloads of the S3 series (scripts/bench-s3-workloads.sh), the same arguments.
WORKLOADS=(
  "small-put|--workload write-only --size 4KiB --objects 10000 --concurrency 16"
  "small-get|--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16"
  "large-put|--workload write-only --size 64MiB --objects 16 --concurrency 4"
  "large-get|--workload cosbench-c --mix 100/0/0 --size 64MiB --objects 16 --concurrency 4"
  "small-get-lean|--workload cosbench-a --mix 100/0/0 --size 4KiB --objects 10000 --concurrency 16 --get-client lean"
  "large-get-lean|--workload cosbench-c --mix 100/0/0 --size 64MiB --objects 16 --concurrency 4 --get-client lean"
)
MINIO_HOST=10.254.0.1
PIDS=()

# MinIO refuses loopback addresses for its nodes when it finds itself in a container (/.dockerenv, as on
# the CI machine), so with TARGETS naming minio the whole run moves into a network namespace of its own
# (needs root) whose loopback also carries $MINIO_HOST, outside 127/8: both stores and the client then
# talk over the same loopback device.
if [[ " ${TARGETS:-} " == *" minio "* && -z ${BENCH_NETNS:-} ]]; then
  ns=mosaic-bench-$$
  ip netns add "$ns"
  trap 'ip netns del "$ns"' EXIT
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$MINIO_HOST/32" dev lo
  BENCH_NETNS=$ns ip netns exec "$ns" "$(pwd)/scripts/bench-cluster.sh" "$@"
  exit 0
fi

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
  if [[ " ${TARGETS:-} " == *" minio "* ]]; then
    rm -rf "$MINIO_DIR"
    fstrim "$(dirname "$MINIO_DIR")" 2>/dev/null || true
  fi
}
trap stop_all EXIT

server() { # name args... (in the background, logged under $OUT)
  local name=$1
  shift
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --drive-size "${DRIVE_SIZE:-8GiB}" "$@" \
    >>"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}

start_single() {
  server single --data "$DIR/single" --drive "$DIR/single/d1" --drive "$DIR/single/d2" --drive "$DIR/single/d3" \
    --erasure 2+1 --s3-address 127.0.0.1:19000 --admin-address 127.0.0.1:19001
  wait_ready http://127.0.0.1:19001/health/ready
}

start_cluster() {
  for n in 0 1 2; do
    local join=()
    [[ $n != 0 ]] && join=(--join 127.0.0.1:19100)
    MOSAIC_CLUSTER_SECRET=$SECRET server "node$n" --data "$DIR/n$n" --drive "$DIR/n$n/d0" --drive "$DIR/n$n/d1" \
      --s3-address 127.0.0.1:$((19000 + 10 * n)) --admin-address 127.0.0.1:$((19001 + 10 * n)) \
      --cluster-address 127.0.0.1:$((19100 + n)) "${join[@]}"
    if [[ $n == 0 ]]; then
      wait_ready http://127.0.0.1:19001/health/live
      MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" admin --admin 127.0.0.1:19001 \
        cluster init --erasure 2+1 --groups 64 >/dev/null
    fi
  done
  for n in 0 1 2; do wait_ready "http://127.0.0.1:$((19001 + 10 * n))/health/ready"; done
}

start_minio() {
  local urls=()
  for n in 0 1 2; do
    mkdir -p "$MINIO_DIR/m$n/d1" "$MINIO_DIR/m$n/d2"
    # Listed one by one (no ellipses): MinIO makes one set of all six, as Mosaic's sets span the nodes.
    urls+=("http://$MINIO_HOST:$((19000 + 10 * n))$MINIO_DIR/m$n/d1" "http://$MINIO_HOST:$((19000 + 10 * n))$MINIO_DIR/m$n/d2")
  done
  for n in 0 1 2; do
    MINIO_ROOT_USER=$AK MINIO_ROOT_PASSWORD=$SK MINIO_BROWSER=off MINIO_UPDATE=off MINIO_STORAGE_CLASS_STANDARD=EC:2 \
      "$MINIO" server --address $MINIO_HOST:$((19000 + 10 * n)) "${urls[@]}" >>"$OUT/minio$n.log" 2>&1 &
    PIDS+=($!)
  done
  for n in 0 1 2; do wait_ready "http://$MINIO_HOST:$((19000 + 10 * n))/minio/health/cluster"; done
}

mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (commit $(git rev-parse --short HEAD)), drive files of at most ${DRIVE_SIZE:-8GiB} on $(df -T "$(dirname "$DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "single: one process, three drives, one 2+1 set; cluster: three processes, two drives each, 64 groups of 2+1 across the nodes"
  if [[ " ${TARGETS:-} " == *" minio "* ]]; then
    echo "minio: $("$MINIO" --version | head -1); three processes, two drives each on $(df -T "$(dirname "$MINIO_DIR")" | awk 'NR==2 {print $2" "$1}'), one set of six, EC:2"
  fi
  if [[ -n ${ALL_NODES:-} ]]; then
    echo "common arguments: ${COMMON[*]}; the client sends requests to the three nodes in turn (ports 19000, 19010, 19020)"
  else
    echo "common arguments: ${COMMON[*]}; the client talks to port 19000 (the single server, or node 0)"
  fi
} >"$OUT/machine.txt"
selected() { # name
  [[ -z ${ONLY:-} || " $ONLY " == *" $1 "* ]]
}
for target in ${TARGETS:-single cluster}; do
  stop_all
  "start_$target"
  for entry in "${WORKLOADS[@]}"; do
    name=${entry%%|*}
    args=${entry#*|}
    selected "$name" || continue
    host=127.0.0.1
    [[ $target == minio ]] && host=$MINIO_HOST
    endpoint=http://$host:19000
    if [[ -n ${ALL_NODES:-} && $target != single ]]; then
      endpoint=http://$host:19000,http://$host:19010,http://$host:19020
    fi
    echo "== $name on $target: mosaic bench s3 --endpoint $endpoint ${COMMON[*]} $args"
    keep=()
    [[ -n ${KEEP:-} ]] && keep=(--keep --bucket "bench-$name")
    # shellcheck disable=SC2086
    "$MOSAIC" bench s3 --endpoint "$endpoint" --access-key $AK --secret-key $SK "${COMMON[@]}" $args \
      "${keep[@]}" --out "$OUT/$name/$target" >"$OUT/$name.$target.txt" 2>&1 || echo "FAILED: see $OUT/$name.$target.txt"
    tail -3 "$OUT/$name.$target.txt"
  done
done
stop_all
for entry in "${WORKLOADS[@]}"; do
  name=${entry%%|*}
  for peer in single minio; do
    [[ -f $OUT/$name/cluster/result.json && -f $OUT/$name/$peer/result.json ]] || continue
    "$MOSAIC" bench compare "$OUT/$name/cluster/result.json" "$OUT/$name/$peer/result.json" \
      --plot "$OUT/$name/compare-$peer.svg" >"$OUT/$name/compare-$peer.md" || true
  done
done
echo "done: $OUT"
