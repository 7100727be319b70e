#!/usr/bin/env bash
# Instructions per proxied request under callgrind: (Ir(N) - Ir(0)) / N over one keep-alive
# connection, Turnpike with one worker in front of a local upstream (nginx from
# shared/bench-reference/upstream.conf). Stable on noisy machines; prints one number.
# Usage: bench/instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SHARED=${SHARED:-$ROOT/../shared/bench-reference}
N=${1:-20000}
OUT=$(mktemp -d)
mkdir -p /tmp/bench/upstream/{cbt,pt,ft,ut,st} "$OUT/tp"
cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
UP_PID=""
if ! (echo >/dev/tcp/127.0.0.1/9001) 2>/dev/null; then
  nginx -c "$SHARED/upstream.conf" -p /tmp/bench/upstream -e /tmp/bench/upstream/error.log &
  UP_PID=$!
  for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/9001) 2>/dev/null && break; sleep 0.05; done
fi
trap '[ -n "$UP_PID" ] && kill $UP_PID; rm -rf "$OUT"' EXIT
printf '_format_version: "3.0"\nservices: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/]}]}]\n' > "$OUT/tp/kong.yml"
export TURNPIKE_PREFIX=$OUT/tp/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000" TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 \
  TURNPIKE_DECLARATIVE_CONFIG=$OUT/tp/kong.yml TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000 TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
run() {
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$OUT/cg.$1" "$BIN" start > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  python3 - "$1" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", 8000)
for _ in range(int(sys.argv[1])):
    c.request("GET", "/"); r = c.getresponse(); r.read(); assert r.status == 200
PY
  kill -TERM $vp; wait $vp 2>/dev/null || true
  grep -E '^(summary|totals):' "$OUT/cg.$1" | head -1 | awk '{print $2}'
}
A=$(run 1); B=$(run $((N + 1)))
echo $(( (B - A) / N ))
[ -n "${KEEP_PROFILE:-}" ] && cp "$OUT/cg.$((N + 1))" "$KEEP_PROFILE" || true
