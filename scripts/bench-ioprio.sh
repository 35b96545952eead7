#!/usr/bin/env bash
# Does the disk's IO scheduler let one IO class go before another? fio on this machine's disk: a writer of
# 1 MiB sequential O_DIRECT writes at depth 16 (bulk work: heal, a move's fill) beside 64 KiB random
# O_DIRECT writes each followed by fdatasync at depth 1 (a client's small PUT), for each pair of IO
# classes (1 realtime, 2 best-effort, the default, 3 idle). Prints each job's MiB/s and completion
# latency p50/p99, and the small job's fdatasync p99.
#
#   scripts/bench-ioprio.sh [OUT]     (default /var/tmp/bench-ioprio; needs fio and 5 GiB free)
#
# RUNTIME (seconds per pair, default 20), PAIRS (default "2:2 3:2 2:1": bulk class:small class).
set -euo pipefail
OUT=${1:-/var/tmp/bench-ioprio}
DIR=${IOPRIO_DIR:-/var/tmp/bench-ioprio-files}
command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio)" >&2; exit 1; }
mkdir -p "$OUT" "$DIR"
trap 'rm -rf "$DIR"' EXIT
# The disk under DIR (a partition's parent, or the device itself) and its IO scheduler.
dev=$(df "$DIR" | awk 'NR==2 {print $1}')
disk=$(lsblk -no pkname "$dev" 2>/dev/null | head -1)
[[ -n $disk ]] || disk=$(basename "$dev")
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(uname -sr), $(df -T "$DIR" | awk 'NR==2 {print $2" "$1}'), scheduler $(cat "/sys/block/$disk/queue/scheduler" 2>/dev/null || echo unknown)"
  echo "fio: $(fio --version)"
} >"$OUT/machine.txt"
for pair in ${PAIRS:-2:2 3:2 2:1}; do
  bulk=${pair%:*} small=${pair#*:}
  fio --output-format=json --output="$OUT/bulk$bulk-small$small.json" - <<EOF2
[global]
ioengine=io_uring
direct=1
time_based=1
runtime=${RUNTIME:-20}

[bulk]
filename=$DIR/bulk
size=4G
rw=write
bs=1M
iodepth=16
prioclass=$bulk

[small]
filename=$DIR/small
size=1G
rw=randwrite
bs=64k
iodepth=1
fdatasync=1
prioclass=$small
EOF2
  jq -r --arg p "bulk class $bulk, small class $small" '.jobs[] | "\($p): \(.jobname) \(.write.bw/1024|floor) MiB/s, p50 \(.write.clat_ns.percentile["50.000000"]/1e6*100|floor/100) ms, p99 \(.write.clat_ns.percentile["99.000000"]/1e6*100|floor/100) ms" + (if .jobname == "small" then ", fdatasync p99 \(.sync.lat_ns.percentile["99.000000"]/1e6*100|floor/100) ms" else "" end)' "$OUT/bulk$bulk-small$small.json"
done | tee "$OUT/summary.txt"
