#!/usr/bin/env bash
# Measures small-object PUT and GET against Mosaic at several inline thresholds (objects up to the threshold
# live wholly in the metadata database; larger ones get data blocks), to choose the default.
#
#   scripts/bench-inline-threshold.sh [OUT]      (default /tmp/inline-threshold; one JSON per run)
#
# Each threshold gets a fresh drive; each object size a PUT run (write-only) then a GET run (100% reads).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/inline-threshold}
MOSAIC=${MOSAIC:-bin/mosaic}
DIR=${DIR:-/var/tmp/mosaic-inline-bench}
PORT=19300
AK=benchkey
SK=benchsecret-0123456789
mkdir -p "$OUT"
for threshold in ${THRESHOLDS:-0 4KiB 16KiB 64KiB}; do
  rm -rf "$DIR"
  MOSAIC_ACCESS_KEY=$AK MOSAIC_SECRET_KEY=$SK "$MOSAIC" server --data "$DIR" --drive-size 4GiB \
    --inline-max-size "$threshold" --s3-address 127.0.0.1:$PORT --admin-address 127.0.0.1:$((PORT + 1)) \
    >/tmp/mosaic-inline-bench.log 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null; rm -rf "$DIR"' EXIT
  for _ in $(seq 1 100); do curl -fsS -o /dev/null "http://127.0.0.1:$((PORT + 1))/health/ready" && break; sleep 0.2; done
  for size in ${SIZES:-4KiB 16KiB 64KiB}; do
    for op in put get; do
      mix=(--workload write-only); [[ $op == get ]] && mix=(--workload cosbench-a --mix 100/0/0)
      "$MOSAIC" bench s3 --endpoint "http://127.0.0.1:$PORT" --access-key $AK --secret-key $SK \
        --duration "${DURATION:-10s}" --warmup 2s --seed 1 "${mix[@]}" --size "$size" --objects 5000 \
        --concurrency 16 --bucket "b-$op-$(echo "$size" | tr 'A-Z' 'a-z')" --json >"$OUT/t$threshold-s$size-$op.json" 2>/dev/null
    done
  done
  kill $pid; wait $pid 2>/dev/null || true
  trap - EXIT
done
rm -rf "$DIR"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(os.listdir(out)):
    if not f.endswith('.json'): continue
    t, s, op = f[:-5].split('-')
    r = json.load(open(os.path.join(out, f)))
    o = next(iter(r['operations'].values()))
    rows.setdefault((s[1:], t[1:]), {})[op] = (o['ops_per_s'], o['latency_us_p99'] / 1000, o['errors'])
print('| object size | inline threshold | PUT obj/s | PUT p99 ms | GET obj/s | GET p99 ms | errors |')
print('|---|---|---:|---:|---:|---:|---|')
for (s, t), v in sorted(rows.items(), key=lambda kv: (int(''.join(c for c in kv[0][0] if c.isdigit())), int(''.join(c for c in kv[0][1] if c.isdigit()) or 0))):
    p, g = v.get('put', (0, 0, 0)), v.get('get', (0, 0, 0))
    print(f'| {s} | {t} | {p[0]:.0f} | {p[1]:.1f} | {g[0]:.0f} | {g[1]:.1f} | {p[2]} / {g[2]} |')
PY
