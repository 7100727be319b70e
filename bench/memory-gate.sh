#!/usr/bin/env bash
# The CI memory gate (issue #23): a fresh DB-less gateway (release build, 2 workers) loads a
# config of 100,000 consumers with key-auth credentials and one service, then takes three
# `POST /config` of the same file. Measured as bench/reload-memory.sh measures it: RSS 2 s
# after the Admin API answers, RSS 2 s after the third reload, peak (VmHWM). Fails when steady
# RSS or peak is more than 15% above bench/memory-baseline.json, or when RSS after the reloads
# is more than 1.2x the steady RSS (memory retained by reloads; it was 1.9x before the
# snapshot reaper). `--write` records the baseline.
#
# Usage: bench/memory-gate.sh [--write]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
BASELINE=$ROOT/bench/memory-baseline.json
TOLERANCE=${GATE_TOLERANCE:-0.15}
cargo build --release --locked -p turnpike >&2
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/turnpike
W=$(mktemp -d)
BENCH_TMP+=("$W")
python3 - "$W/c.json" <<'PY'
import json, sys
consumers = [{"username": f"c{i}", "keyauth_credentials": [{"key": f"key-{i:08d}"}]} for i in range(100_000)]
json.dump({"_format_version": "3.0", "services": [{"name": "s", "url": "http://127.0.0.1:9001",
           "routes": [{"name": "r", "paths": ["/"]}]}], "plugins": [{"name": "key-auth"}],
           "consumers": consumers}, open(sys.argv[1], "w"))
PY
mb() { awk -v k="$1" '$1 == k":" {printf "%d", $2 / 1024}' "/proc/$2/status"; }
post() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/config" -H 'content-type: application/json' --data-binary "@$2"; }
# Two free ports, below the ephemeral range (a port an outgoing connection holds cannot be
# bound even when nothing listens on it); another try on other ports if the bind still fails.
for attempt in 1 2 3; do
  while :; do
    PORT=$((20000 + RANDOM % 10000)); ADMIN=$((PORT + 1))
    ports_free "$PORT" "$ADMIN" 2>/dev/null && break
  done
  TURNPIKE_PREFIX=$W/prefix-$attempt TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$W/c.json \
    TURNPIKE_PROXY_LISTEN=127.0.0.1:$PORT TURNPIKE_ADMIN_LISTEN=127.0.0.1:$ADMIN \
    TURNPIKE_ADMIN_GUI_LISTEN=off TURNPIKE_NGINX_WORKER_PROCESSES=2 TURNPIKE_LOG_LEVEL=warn "$BIN" start >"$W/log" 2>&1 &
  PID=$!
  BENCH_PIDS+=($PID)
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$ADMIN/status" && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $PID 2>/dev/null && curl -sf -o /dev/null "http://127.0.0.1:$ADMIN/status" && break
  echo "the gateway did not start (attempt $attempt); its log:" >&2
  cat "$W/log" >&2
  [ $attempt = 3 ] && exit 1
done
sleep 2
STEADY=$(mb VmRSS $PID)
for _ in 1 2 3; do
  code=$(post $ADMIN "$W/c.json")
  [ "$code" = 201 ] || { echo "POST /config answered $code" >&2; exit 1; }
  sleep 2
done
RELOADED=$(mb VmRSS $PID)
PEAK=$(mb VmHWM $PID)
kill $PID; wait $PID 2>/dev/null || true

python3 - "$BASELINE" "$STEADY" "$RELOADED" "$PEAK" "$TOLERANCE" "${1:-}" <<'PY'
import json, pathlib, subprocess, sys
path, steady, reloaded, peak, tol, mode = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
measured = {"steady_rss_mb": steady, "peak_rss_mb": peak}
if mode == "--write":
    cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
    path.write_text(json.dumps({"consumers_100k": measured, "after_3_reloads_rss_mb": reloaded, "machine": cpu}, indent=2) + "\n")
    print(f"baseline written: {measured}, after 3 reloads {reloaded} MB")
    sys.exit(0)
base = json.loads(path.read_text())["consumers_100k"]
failed = False
for k, v in measured.items():
    ratio = v / base[k]
    verdict = "ok"
    if ratio > 1 + tol:
        verdict, failed = f"REGRESSION: more than {tol:.0%} above the baseline", True
    print(f"memory {k}: {v} MB, baseline {base[k]} MB ({ratio:.2f}x) {verdict}")
ratio = reloaded / steady
verdict = "ok" if ratio <= 1.2 else "REGRESSION: reloads retain memory (more than 1.2x steady)"
failed |= ratio > 1.2
print(f"memory after 3 reloads: {reloaded} MB, {ratio:.2f}x steady {verdict}")
sys.exit(1 if failed else 0)
PY
