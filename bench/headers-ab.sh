#!/usr/bin/env bash
# What Kong's header contract costs: the plain-proxy layout (proxy on CPU 0, upstream nginx and
# wrk on CPU 1), Turnpike with its default `headers`/`headers_upstream` (Via, X-Kong-*-Latency,
# X-Kong-Request-Id both ways) against `headers = off` + `headers_upstream = off`, alternated
# run by run. X-Forwarded-* and X-Real-IP are sent in both (Kong always sends them).
# Usage: bench/headers-ab.sh [RUNS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd); SHARED=${SHARED:-$ROOT/../shared/bench-reference}
RUNS=${1:-3}; DUR=${2:-5s}
mkdir -p /tmp/bench/upstream/{cbt,pt,ft,ut,st} /tmp/bench/hdr
cargo build --release --locked -p turnpike >&2
pids=(); trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done' EXIT
taskset -c 1 nginx -c "$SHARED/upstream.conf" -p /tmp/bench/upstream -e /tmp/bench/upstream/error.log & pids+=($!)
sleep 0.5
printf '_format_version: "3.0"\nservices: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/]}]}]\n' > /tmp/bench/hdr/kong.yml
export TURNPIKE_PREFIX=/tmp/bench/hdr/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000" TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 \
  TURNPIKE_DECLARATIVE_CONFIG=/tmp/bench/hdr/kong.yml TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000 TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
for i in $(seq 1 "$RUNS"); do
  for h in default off; do
    if [ "$h" = off ]; then export TURNPIKE_HEADERS=off TURNPIKE_HEADERS_UPSTREAM=off; else unset TURNPIKE_HEADERS TURNPIKE_HEADERS_UPSTREAM; fi
    taskset -c 0 target/release/turnpike start > /dev/null 2>&1 & tp=$!
    for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.05; done
    taskset -c 1 wrk -t1 -c50 -d2s http://127.0.0.1:8000/ > /dev/null
    echo "run $i headers=$h $(taskset -c 1 wrk -t1 -c50 -d"$DUR" http://127.0.0.1:8000/ | awk '/Requests\/sec/{print int($2)}')"
    kill $tp; wait $tp 2>/dev/null || true
  done
done
