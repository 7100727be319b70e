#!/usr/bin/env bash
# Instructions per proxied request under callgrind: (Ir(N) - Ir(0)) / N over one keep-alive
# connection, Turnpike with one worker in front of a local upstream (nginx from
# shared/bench-reference/upstream.conf). Stable on noisy machines; prints one number.
# Usage: [CONFIG=kong.yml] [APIKEY=key] [AUTH=value] [HEADERS="name: value|..."] [DB=sqlite] bench/instructions.sh [N]
#   CONFIG: a declarative file to run instead of the one-route default (its route must answer
#   GET / with 200); APIKEY: sent as the `apikey` header (key-auth); AUTH: sent as the
#   Authorization header (basic-auth); HEADERS: more request headers, `|`-separated; DB=sqlite: import CONFIG into a SQLite store and run on
#   it (credentials then come through the node's cache, not the snapshot).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
N=${1:-20000}
OUT=$(mktemp -d)
BENCH_TMP+=("$OUT")
# BENCH_BIN=path: measure a binary built elsewhere (as bench_begin's scripts take it).
if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN
else
  cargo build --release --locked -p turnpike >&2
  BIN=$ROOT/target/release/turnpike
fi
start_upstream
turnpike_env "$OUT/tp"
[ -n "${CONFIG:-}" ] && export TURNPIKE_DECLARATIVE_CONFIG=$CONFIG
export APIKEY=${APIKEY:-} AUTH=${AUTH:-} HEADERS=${HEADERS:-}
if [ "${DB:-off}" = sqlite ]; then
  export TURNPIKE_DATABASE=sqlite
  "$BIN" config db_import "$TURNPIKE_DECLARATIVE_CONFIG" > /dev/null
fi
run() {
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$OUT/cg.$1" "$BIN" start > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  python3 - "$1" <<'PY'
import http.client, os, sys
c = http.client.HTTPConnection("127.0.0.1", 8000)
h = {"apikey": os.environ["APIKEY"]} if os.environ.get("APIKEY") else {}
if os.environ.get("AUTH"):
    h["authorization"] = os.environ["AUTH"]
for kv in filter(None, os.environ.get("HEADERS", "").split("|")):
    k, v = kv.split(": ", 1)
    h[k] = v
for _ in range(int(sys.argv[1])):
    c.request("GET", "/", headers=h); r = c.getresponse(); r.read(); assert r.status == 200, r.status
PY
  kill -TERM $vp; wait $vp 2>/dev/null || true
  grep -E '^(summary|totals):' "$OUT/cg.$1" | head -1 | awk '{print $2}'
}
A=$(run 1); B=$(run $((N + 1)))
echo $(( (B - A) / N ))
# KEEP_PROFILE=path: the N-request profile there, the one-request one beside it (`path.base`),
# so per-function costs can be differenced (`callgrind_annotate` of both).
if [ -n "${KEEP_PROFILE:-}" ]; then
  cp "$OUT/cg.$((N + 1))" "$KEEP_PROFILE"
  cp "$OUT/cg.1" "$KEEP_PROFILE.base"
fi
