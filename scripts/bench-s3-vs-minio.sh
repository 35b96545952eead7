#!/usr/bin/env bash
# Runs every `mosaic bench s3` workload against Mosaic (one drive on a preallocated file) and MinIO (single
# drive on XFS) on this machine, with the same client, concurrency and seed, and writes each pair of results
# and their comparison under OUT (default docs/bench/<today>-s3).
#
#   scripts/bench-s3-vs-minio.sh [OUT]
#
# Needs: bin/mosaic (make build), minio on PATH or in ~/go/bin (go install github.com/minio/minio@latest),
# an XFS file system mounted at $MINIO_DIR's parent (see docs/bench/README.md), and ~20 GiB free.
# Select workloads with ONLY="cosbench-a list" (names from the table below).
# SET=4+2 gives both servers six drives: Mosaic a 4+2 set over six drive files, MinIO six directories on the
# XFS mount with MINIO_STORAGE_CLASS_STANDARD=EC:2. DEGRADED=2 then takes two drives away from both before the
# workloads (both formatted whole, then restarted with a file where each of the last two drive directories
# was).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/bench/$(date -u +%F)-s3}
MOSAIC=${MOSAIC:-bin/mosaic}
MINIO=${MINIO:-$(command -v minio || echo "$HOME/go/bin/minio")}
MOSAIC_DIR=${MOSAIC_DIR:-/var/tmp/mosaic-bench-data}
MINIO_DIR=${MINIO_DIR:-/mnt/minio-xfs/data}
AK=benchkey
SK=benchsecret-0123456789
MOSAIC_PORT=19000
MINIO_PORT=19100
COMMON=(--duration "${DURATION:-20s}" --warmup 3s --seed 1)

# shellcheck source=bench-s3-workloads.sh
source "$(dirname "$0")/bench-s3-workloads.sh"

wait_ready() { # url
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "not ready: $1" >&2
  return 1
}

rss() { # pid -> "VmHWM VmRSS RssAnon RssFile" in MiB (RssFile: page-cache pages mapped, which large reads
  # served in place through a mapping of the drive file count: the kernel's pages, reclaimable unless kept
  # verified, verified_cache_size)
  awk '/VmRSS|VmHWM|RssAnon|RssFile/ {printf "%s %.0f MiB  ", $1, $2/1024}' "/proc/$1/status"
}

MOSAIC_DRIVES=()
MINIO_DRIVES=("$MINIO_DIR")
MINIO_ENV=()
if [[ -n "${SET:-}" ]]; then
  K=${SET%+*}
  M=${SET#*+}
  for d in $(seq 1 $((K + M))); do MOSAIC_DRIVES+=(--drive "$MOSAIC_DIR/drive$d"); done
  MOSAIC_DRIVES+=(--erasure "$SET")
  MINIO_DRIVES=("$MINIO_DIR/d{1...$((K + M))}")
  MINIO_ENV=(MINIO_STORAGE_CLASS_STANDARD=EC:$M)
fi

launch() {
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$MOSAIC_DIR" --drive-size "${DRIVE_SIZE:-12GiB}" \
    "${MOSAIC_DRIVES[@]}" --s3-address 127.0.0.1:$MOSAIC_PORT --admin-address 127.0.0.1:$((MOSAIC_PORT + 1)) \
    >>"${LOG_DIR:-/tmp}/mosaic-bench-server.log" 2>&1 &
  MOSAIC_PID=$!
  env "${MINIO_ENV[@]}" MINIO_ROOT_USER=$AK MINIO_ROOT_PASSWORD=$SK MINIO_BROWSER=off MINIO_UPDATE=off \
    "$MINIO" server "${MINIO_DRIVES[@]}" --address 127.0.0.1:$MINIO_PORT >>"${LOG_DIR:-/tmp}/minio-bench-server.log" 2>&1 &
  MINIO_PID=$!
  # Stop both servers and free their disk space however the script ends.
  trap 'kill $MOSAIC_PID $MINIO_PID 2>/dev/null || true; wait 2>/dev/null; rm -rf "$MOSAIC_DIR" "$MINIO_DIR"' EXIT
  wait_ready "http://127.0.0.1:$((MOSAIC_PORT + 1))/health/ready"
  wait_ready "http://127.0.0.1:$MINIO_PORT/minio/health/cluster"
}

start_servers() {
  rm -rf "$MOSAIC_DIR" "$MINIO_DIR"
  mkdir -p "$MINIO_DIR"
  for d in $(seq 1 $((${K:-0} + ${M:-0}))); do mkdir -p "$MINIO_DIR/d$d"; done
  : >"${LOG_DIR:-/tmp}/mosaic-bench-server.log"
  : >"${LOG_DIR:-/tmp}/minio-bench-server.log"
  launch
  if [[ -n "${DEGRADED:-}" ]]; then
    # Both stores formatted whole; then the last DEGRADED drives of each are gone (a file where the
    # directory was), and both start again without them.
    kill "$MOSAIC_PID" "$MINIO_PID"
    wait "$MOSAIC_PID" "$MINIO_PID" 2>/dev/null || true
    for d in $(seq $((K + M - DEGRADED + 1)) $((K + M))); do
      rm -rf "$MOSAIC_DIR/drive$d" "$MINIO_DIR/d$d"
      touch "$MOSAIC_DIR/drive$d" "$MINIO_DIR/d$d"
    done
    launch
  fi
}

mkdir -p "$OUT"
start_servers
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (checkout at $(git rev-parse --short HEAD)), drives: ${SET:-1+0} over drive files of at most ${DRIVE_SIZE:-12GiB} on $(df -T "$(dirname "$MOSAIC_DIR")" | awk 'NR==2 {print $2" "$1}')"
  echo "minio: $("$MINIO" --version | head -1), drives: ${SET:+six directories, EC:${SET#*+}, }$(df -T "$MINIO_DIR" | awk 'NR==2 {print $2" "$1}')"
  echo "common arguments: ${COMMON[*]}"
} >"$OUT/machine.txt"
: >"$OUT/rss.txt"
for entry in "${WORKLOADS[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then continue; fi
  for target in mosaic minio; do
    port=$MOSAIC_PORT; [[ $target == minio ]] && port=$MINIO_PORT
    # Mosaic's per-drive IO over each measured phase comes from its metrics (MinIO exports none per drive).
    drive_io=(--drive-metrics "http://127.0.0.1:$((MOSAIC_PORT + 1))/metrics")
    [[ $target == minio ]] && drive_io=()
    # Each run starts with nothing dirty in the page cache, so that no writeback of an earlier run lands in
    # it (what was dirty is printed; on 2026-12-03 it was at most 2 MiB before each run).
    echo "page cache dirty before $name on $target: $(awk '/^Dirty:/ {printf "%.0f MiB", $2 / 1024}' /proc/meminfo)"
    sync
    echo "== $name on $target: mosaic bench s3 --endpoint http://127.0.0.1:$port ${COMMON[*]} $args ${drive_io[*]} --out $OUT/$name/$target"
    # shellcheck disable=SC2086
    "$MOSAIC" bench s3 --endpoint "http://127.0.0.1:$port" --access-key $AK --secret-key $SK "${COMMON[@]}" $args \
      "${drive_io[@]}" --out "$OUT/$name/$target" >"$OUT/$name.$target.txt" 2>/dev/null || echo "FAILED: see $OUT/$name.$target.txt"
    tail -n +1 "$OUT/$name.$target.txt" | tail -3
  done
  echo "$name: mosaic $(rss $MOSAIC_PID) | minio $(rss $MINIO_PID)" >>"$OUT/rss.txt"
  # MinIO moves deleted objects to .minio.sys/tmp/.trash and purges them later; on this disk the backlog
  # filled the file system mid-run. Empty it between workloads and give the space back to the host.
  rm -rf "$MINIO_DIR/.minio.sys/tmp/.trash/"* 2>/dev/null || true
  fstrim "$(dirname "$MINIO_DIR")" 2>/dev/null || true
  "$MOSAIC" bench compare "$OUT/$name/mosaic/result.json" "$OUT/$name/minio/result.json" \
    --plot "$OUT/$name/compare.svg" >"$OUT/$name/compare.md" || true
  rm -f "$OUT/$name.mosaic.txt" "$OUT/$name.minio.txt"
done
echo "done: $OUT"
