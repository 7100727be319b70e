#!/usr/bin/env bash
# Memory across config reloads (issue #23's table): for each config, a fresh DB-less gateway
# (release build, WORKERS workers) starts on it; RSS is read 2 s after the Admin API answers, then
# after each of 3 `POST /config` of the same file (2 s after each answers). Peak is VmHWM:
# "start peak" before the reloads (the initial load), "peak" at the end.
#   [WORKERS=2] bench/reload-memory.sh [CASES]   CASES: empty routes10k routes100k services10k consumers100k mixed routes100k-yaml
# BINS="/tmp/turnpike-before target/release/turnpike" measures several builds in one run.
# STORE=sqlite: each config is written into a fresh SQLite store (`migrations bootstrap`,
# `config db_import`) and the gateway starts on it (credentials read by key); no reloads
# (a database node takes no `POST /config`), so those columns are "-".
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
CASES=${1:-"routes10k routes100k services10k consumers100k mixed"}
BINS=${BINS:-$ROOT/target/release/turnpike}
WORKERS=${WORKERS:-2}
STORE=${STORE:-off}
W=$(mktemp -d)
BENCH_TMP+=("$W")
python3 - "$W" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def svc(i, routes):
    return {"name": f"s{i}", "url": f"http://127.0.0.1:{9001 + i % 8}",
            "routes": [{"name": f"r{i}-{j}", "paths": [f"/s{i}/r{j}"]} for j in routes]}
def consumers(n):
    return [{"username": f"c{i}", "keyauth_credentials": [{"key": f"key-{i:08d}"}]} for i in range(n)]
cases = {
    "empty": {},
    "routes10k": {"services": [svc(0, range(10_000))]},
    "routes100k": {"services": [svc(0, range(100_000))]},
    "services10k": {"services": [svc(i, [0]) for i in range(10_000)]},
    "consumers100k": {"services": [svc(0, [0])], "plugins": [{"name": "key-auth"}], "consumers": consumers(100_000)},
    "mixed": {"services": [svc(i, [0]) for i in range(10_000)], "plugins": [{"name": "key-auth"}], "consumers": consumers(100_000)},
}
for name, body in cases.items():
    body = {"_format_version": "3.0", **body}
    (out / f"{name}.json").write_text(json.dumps(body))
# The 100k routes as YAML (Kong's usual kong.yml), written by hand: no YAML module needed.
lines = ['_format_version: "3.0"', "services:", "- name: s0", "  url: http://127.0.0.1:9001", "  routes:"]
for j in range(100_000):
    lines += [f"  - name: r0-{j}", f'    paths: ["/s0/r{j}"]']
(out / "routes100k-yaml.yml").write_text("\n".join(lines) + "\n")
PY
mb() { awk -v k="$1" '$1 == k":" {printf "%d", $2 / 1024}' "/proc/$2/status"; }
post() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/config" -H 'content-type: application/json' --data-binary "@$2"; }
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now) - $1:.2f}')"; }
echo "| binary | config | file | ready | steady RSS | start peak | reload | after 1 reload | after 3 reloads | peak |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for BIN in $BINS; do
  for CASE in $CASES; do
    F=$W/$CASE.json; [ -f "$F" ] || F=$W/$CASE.yml
    PORT=$((20000 + RANDOM % 10000)); ADMIN=$((PORT + 1))  # below the ephemeral range (32768-)
    if [ "$STORE" = sqlite ]; then
      TURNPIKE_PREFIX=$W/prefix-$PORT TURNPIKE_DATABASE=sqlite "$BIN" migrations bootstrap >/dev/null 2>&1
      TURNPIKE_PREFIX=$W/prefix-$PORT TURNPIKE_DATABASE=sqlite "$BIN" config db_import "$F" >/dev/null 2>&1
    fi
    t0=$(now)
    TURNPIKE_PREFIX=$W/prefix-$PORT TURNPIKE_DATABASE=$STORE TURNPIKE_DECLARATIVE_CONFIG=$F \
      TURNPIKE_PROXY_LISTEN=127.0.0.1:$PORT TURNPIKE_ADMIN_LISTEN=127.0.0.1:$ADMIN \
      TURNPIKE_ADMIN_GUI_LISTEN=off TURNPIKE_NGINX_WORKER_PROCESSES=$WORKERS TURNPIKE_LOG_LEVEL=warn "$BIN" start >"$W/log-$PORT" 2>&1 &
    PID=$!
    BENCH_PIDS+=($PID)
    until curl -sf -o /dev/null "http://127.0.0.1:$ADMIN/status"; do
      # A gateway that stopped (a port taken by another program) ends the run with its log.
      kill -0 $PID 2>/dev/null || { echo "turnpike stopped:" >&2; cat "$W/log-$PORT" >&2; exit 1; }
      sleep 0.01
    done
    ready=$(since "$t0")
    sleep 2
    steady=$(mb VmRSS $PID); start_peak=$(mb VmHWM $PID)
    if [ "$STORE" != off ]; then
      printf '| %s | %s on %s | %d MB | %s s | %s MB | %s MB | - | - | - | %s MB |\n' "$(basename "$(dirname "$(dirname "$BIN")")")/$(basename "$BIN")" \
        "$CASE" "$STORE" $(( $(stat -c %s "$F") / 1048576 )) "$ready" "$steady" "$start_peak" "$start_peak"
      kill $PID; wait $PID 2>/dev/null || true
      continue
    fi
    t1=$(now); code=$(post $ADMIN "$F"); reload=$(since "$t1")
    [ "$code" = 201 ] || { echo "POST /config answered $code" >&2; exit 1; }
    sleep 2
    r1=$(mb VmRSS $PID)
    post $ADMIN "$F" >/dev/null; sleep 2
    post $ADMIN "$F" >/dev/null; sleep 2
    r3=$(mb VmRSS $PID); hwm=$(mb VmHWM $PID)
    printf '| %s | %s | %d MB | %s s | %s MB | %s MB | %s s | %s MB | %s MB | %s MB |\n' "$(basename "$(dirname "$(dirname "$BIN")")")/$(basename "$BIN")" \
      "$CASE" $(( $(stat -c %s "$F") / 1048576 )) "$ready" "$steady" "$start_peak" "$reload" "$r1" "$r3" "$hwm"
    kill $PID; wait $PID 2>/dev/null || true
  done
done
