#!/usr/bin/env bash
# Heal of a replaced drive on a 4+2 set (issue 13's heal targets), on this machine:
#   1. the disk's sequential write bandwidth (dd, O_DIRECT, 2 GiB), the yardstick;
#   2. idle: fill the set with 64 MiB objects, replace one drive, `mosaic admin heal`, and time the rebuild
#      (bytes the new drive was given per second), once with every source shard read from the disk (cold),
#      once with the source drives' files in the page cache (as if each drive had its own disk);
#   3. under load: cosbench-a alone, then cosbench-a while background heal rebuilds another replaced drive
#      (at the background IO class, paced by heal_rate), then, once that heal is done, cosbench-a alone
#      again; the load's p99 with heal is compared with the mean of the two runs alone (the load's bucket
#      grows from run to run, so one run alone before would favour it).
#
#   scripts/bench-heal.sh [OUT]      (default docs/bench/<today>-heal; needs bin/mosaic and ~30 GiB free)
#
# LOAD_ONLY=1 skips the idle rebuilds (step 2's timings), for a study of heal under load.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/bench/$(date -u +%F)-heal}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${HEAL_DIR:-/var/tmp/mosaic-heal}
FILL_OBJECTS=${FILL_OBJECTS:-96}
AK=benchkey
SK=benchsecret-0123456789
PORT=19300
ADMIN=127.0.0.1:$((PORT + 1))

mkdir -p "$OUT"
rm -rf "$DIR" && mkdir -p "$DIR"
trap 'kill $PID 2>/dev/null || true; wait 2>/dev/null; rm -rf "$DIR"' EXIT

adm() { MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" admin --admin "$ADMIN" --json "$@"; }
bench() { "$MOSAIC" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK --seed 1 "$@"; }
wait_ready() {
  for _ in $(seq 1 300); do curl -fsS -o /dev/null "http://$ADMIN/health/ready" 2>/dev/null && return 0; sleep 0.2; done
  echo "server not ready" >&2; exit 1
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "mosaic: $("$MOSAIC" --version) (checkout at $(git rev-parse --short HEAD)), 4+2 over six drive files on $(df -T "$DIR" | awk 'NR==2 {print $2" "$1}')"
} >"$OUT/machine.txt"

# 1. The yardstick: sequential O_DIRECT writes of 4 MiB on the same file system, synced.
dd if=/dev/zero of="$DIR/dd.test" bs=4M count=512 oflag=direct conv=fsync 2>"$OUT/dd.txt"
rm -f "$DIR/dd.test"
tail -1 "$OUT/dd.txt"

DRIVES=()
for d in 1 2 3 4 5 6; do DRIVES+=(--drive "$DIR/drive$d"); done
MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$DIR/data" --drive-size 8GiB "${DRIVES[@]}" \
  --erasure 4+2 --s3-address 127.0.0.1:$PORT --admin-address "$ADMIN" >"$DIR/server.log" 2>&1 &
PID=$!
wait_ready

# 2. Idle rebuild.
bench --workload write-only --size 64MiB --objects "$FILL_OBJECTS" --ops "$FILL_OBJECTS" --concurrency 4 \
  --warmup 0s --bucket heal-fill --keep --json >"$OUT/fill.json"
# Timed from the replacement: background heal starts on it, `admin heal` finishes whatever is left.
# idle_heal LABEL NEW_DRIVE: replaces slot 5 (the sixth drive) with NEW_DRIVE and times its rebuild.
idle_heal() {
  local label=$1 new=$2 start end
  start=$(date +%s.%N)
  adm drive replace 5 "$new" >"$OUT/replace-idle-$label.json"
  adm heal >"$OUT/heal-idle-$label.json"
  end=$(date +%s.%N)
  adm drives >"$OUT/drives-after-idle-heal-$label.json"
  python3 - "$OUT" "$label" "$start" "$end" <<'EOF2'
import json, re, sys
out, label, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
drives = json.load(open(f"{out}/drives-after-idle-heal-{label}.json"))["drives"]
new = [d for d in drives if d["slot"] == 5][0]
written = new["device_bytes_written"]
dd = open(f"{out}/dd.txt").read().strip().splitlines()[-1]
m = re.search(r"([\d.]+) ([MG])B/s", dd)
disk = float(m.group(1)) * (1000 if m.group(2) == "G" else 1) * 1e6 if m else 0
secs = end - start
rate = written / secs
with open(f"{out}/heal-idle-{label}.txt", "w") as f:
    f.write(f"{label}: heal took {secs:.1f} s; the new drive was written {written/2**20:.0f} MiB: {rate/2**20:.0f} MiB/s\n")
    f.write(f"disk sequential write (dd): {disk/2**20:.0f} MiB/s; heal at {rate/disk*100 if disk else 0:.0f}% of it\n")
print(open(f"{out}/heal-idle-{label}.txt").read(), end="")
EOF2
}
if [[ -z "${LOAD_ONLY:-}" ]]; then
# Cold: every shard a rebuild reads comes from the one disk that also takes the new drive's writes, so the
# disk moves about k + 1 = 5 times the rebuilt bytes (a node with a disk per drive reads the k shards from k
# other disks).
sync && echo 3 >/proc/sys/vm/drop_caches
idle_heal cold "$DIR/drive6-new"
# Sources off the disk: the five other drives' files read into the page cache first, so the rebuild's reads
# cost the disk nothing and the new drive's writes are what the disk does, as on a node with a disk per
# drive.
find "$DIR"/drive[1-5] -type f -exec cat {} + >/dev/null
idle_heal sources-cached "$DIR/drive6-new2"
fi

# 3. Heal under load: cosbench-a's p99 alone, then while another replaced drive is rebuilt in the background.
bench --workload cosbench-a --duration 20s --warmup 3s --bucket load --keep --out "$OUT/load-alone" >/dev/null
adm drive replace 4 "$DIR/drive5-new" >"$OUT/replace-load.json"
bench --workload cosbench-a --duration 20s --warmup 3s --bucket load --keep --out "$OUT/load-with-heal" >/dev/null
adm drives >"$OUT/drives-after-load.json"
adm heal >"$OUT/heal-after-load.json"
bench --workload cosbench-a --duration 20s --warmup 3s --bucket load --out "$OUT/load-alone-after" >/dev/null
"$MOSAIC" bench compare "$OUT/load-alone/result.json" "$OUT/load-with-heal/result.json" \
  --plot "$OUT/load-compare.svg" >"$OUT/load-compare.md"
cat "$OUT/load-compare.md"
python3 - "$OUT" <<'EOF2' | tee "$OUT/load-p99.txt"
import json, sys
out = sys.argv[1]
def p99(run):
    ops = json.load(open(f"{out}/{run}/result.json"))["operations"]
    return {op: v["latency_us_p99"] / 1000 for op, v in ops.items()}
before, heal, after = p99("load-alone"), p99("load-with-heal"), p99("load-alone-after")
for op in sorted(heal):
    alone = (before[op] + after[op]) / 2
    print(f"{op} p99 ms: alone {before[op]:.2f} and {after[op]:.2f} (mean {alone:.2f}), with heal {heal[op]:.2f}: {(heal[op] / alone - 1) * 100:+.0f}%")
healing = [d for d in json.load(open(f"{out}/drives-after-load.json"))["drives"] if d["state"] == "healing"]
print(f"drives still healing when the load with heal ended: {len(healing)}")
EOF2
echo "done: $OUT"
