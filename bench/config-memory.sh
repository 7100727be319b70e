#!/usr/bin/env bash
# Memory of a large POST /config (DB-less): a generated config of SERVICES services with one
# route each (231,000 make the 50 MiB file of issue #20), posted twice to a fresh gateway.
# Reports RSS and peak RSS (VmHWM) fresh, after the load and after a reload of the same file,
# the time the POST took and the size of its answer, for each binary in BINS (so an older
# build is measured beside the current one in the same run):
#   BINS="/tmp/turnpike-before target/release/turnpike" bench/config-memory.sh [SERVICES]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
SERVICES=${1:-231000}
BINS=${BINS:-$ROOT/target/release/turnpike}
W=$(mktemp -d)
BENCH_TMP+=("$W")
python3 - "$W/big.yml" "$SERVICES" <<'PY'
import sys
out, n = sys.argv[1], int(sys.argv[2])
with open(out, "w") as f:
    f.write('_format_version: "3.0"\nservices:\n')
    for i in range(n):
        f.write(f'- name: service-{i:07d}\n  url: http://upstream-{i%100}.internal.example:8080/api/v1/resource\n'
                f'  tags: [generated, team-{i%50}]\n  routes:\n  - name: route-{i:07d}\n'
                f'    paths: [/svc/{i:07d}/items]\n    methods: [GET, POST]\n    strip_path: true\n')
PY
SIZE=$(stat -c %s "$W/big.yml")
echo "config: $SERVICES services and routes, $((SIZE / 1024 / 1024)) MiB"
printf '| binary | fresh RSS | POST /config | answer | RSS after load | peak | RSS after reload | peak |\n|---|---:|---:|---:|---:|---:|---:|---:|\n'
mb() { awk -v k="$1" '$1 == k":" {printf "%d MB", $2 / 1024}' "/proc/$2/status"; }
for BIN in $BINS; do
  PORT=$((20000 + RANDOM % 10000)); ADMIN=$((PORT + 1))  # below the ephemeral range (32768-)
  printf '_format_version: "3.0"\n' >"$W/empty.yml"
  TURNPIKE_PREFIX=$W/prefix-$PORT TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$W/empty.yml \
    TURNPIKE_PROXY_LISTEN=127.0.0.1:$PORT TURNPIKE_ADMIN_LISTEN=127.0.0.1:$ADMIN \
    TURNPIKE_NGINX_WORKER_PROCESSES=2 "$BIN" start >"$W/log-$PORT" 2>&1 &
  PID=$!
  BENCH_PIDS+=($PID)
  wait_port "$ADMIN"
  fresh=$(mb VmRSS $PID)
  t0=$(date +%s.%N)
  answer=$(curl -s -o /dev/null -w '%{http_code}, %{size_download} B' "http://127.0.0.1:$ADMIN/config" \
    -H 'content-type: text/yaml' --data-binary "@$W/big.yml")
  took=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f} s')")
  sleep 2
  rss1=$(mb VmRSS $PID); hwm1=$(mb VmHWM $PID)
  curl -s -o /dev/null "http://127.0.0.1:$ADMIN/config" -H 'content-type: text/yaml' --data-binary "@$W/big.yml"
  sleep 2
  rss2=$(mb VmRSS $PID); hwm2=$(mb VmHWM $PID)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(basename "$BIN")" "$fresh" "$took" "$answer" "$rss1" "$hwm1" "$rss2" "$hwm2"
  kill $PID; wait $PID 2>/dev/null || true
done
