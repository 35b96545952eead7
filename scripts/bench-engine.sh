#!/usr/bin/env bash
# The engine benchmarks of issue 3 (paper 001's workloads without HTTP) on a preallocated file on this
# machine's disk, and fio's sequential O_DIRECT write bandwidth on the same file system for comparison.
#
#   scripts/bench-engine.sh [OUT]      (default /tmp/bench-engine; one JSON per run, commands.txt)
#
# The aligned workload and fio alternate ROUNDS times (default 3) because this disk's bandwidth drifts
# from minute to minute; compare the medians. Each run gets a fresh device file.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/bench-engine}
MOSAIC=${MOSAIC:-bin/mosaic}
DEV_DIR=${DEV_DIR:-/var/tmp/mosaic-engine-bench}
mkdir -p "$OUT" "$DEV_DIR"
trap 'rm -f "$DEV_DIR/dev.img" "$DEV_DIR/fio.img"' EXIT
: >"$OUT/commands.txt"

engine() {
  local name=$1
  shift
  rm -f "$DEV_DIR/dev.img"
  local cmd=(bench engine "$@" --device "$DEV_DIR/dev.img" --device-size 8GiB --json)
  echo "== $name: mosaic ${cmd[*]}" >>"$OUT/commands.txt"
  "$MOSAIC" "${cmd[@]}" >"$OUT/$name.json"
}

fio_seq() {
  local name=$1
  rm -f "$DEV_DIR/fio.img"
  local cmd=(fio --name=seqwrite --filename="$DEV_DIR/fio.img" --size=4G --rw=write --bs=1M --iodepth=16
    --ioengine=io_uring --direct=1 --fallocate=native --end_fsync=1 --output-format=json)
  echo "== $name: ${cmd[*]}" >>"$OUT/commands.txt"
  "${cmd[@]}" >"$OUT/$name.json"
  rm -f "$DEV_DIR/fio.img"
}

engine within-fraglog-qd16 --workload within-block --total 1GiB --queue-depth 16 --mode fragment-log
engine within-rmw-qd16 --workload within-block --total 1GiB --queue-depth 16 --mode rmw
engine cross-fraglog-qd16 --workload cross-block --total 1GiB --queue-depth 16 --mode fragment-log
engine cross-rmw-qd16 --workload cross-block --total 1GiB --queue-depth 16 --mode rmw
for round in $(seq 1 "${ROUNDS:-3}"); do
  engine "aligned-1m-qd16-r$round" --workload aligned --io-size 1MiB --object-size 64MiB --total 4GiB --queue-depth 16
  fio_seq "fio-seqwrite-1m-qd16-r$round"
done
engine aligned-1m-qd16-pread --workload aligned --io-size 1MiB --object-size 64MiB --total 4GiB --queue-depth 16 \
  --io-engine pread
engine aligned-128k-qd16 --workload aligned --io-size 128KiB --object-size 4MiB --total 1GiB --queue-depth 16
echo "results in $OUT"
