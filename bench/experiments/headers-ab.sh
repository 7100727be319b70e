#!/usr/bin/env bash
# What Kong's header contract costs: the plain-proxy layout (proxy on CPU 0, upstream nginx and
# wrk on CPU 1), Turnpike with its default `headers`/`headers_upstream` (Via, X-Kong-*-Latency,
# X-Kong-Request-Id both ways) against `headers = off` + `headers_upstream = off`, alternated
# run by run. X-Forwarded-* and X-Real-IP are sent in both (Kong always sends them).
# Usage: bench/experiments/headers-ab.sh [RUNS] [DURATION]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
RUNS=${1:-3}; DUR=${2:-5s}
cargo build --release --locked -p turnpike >&2
start_upstream 1
turnpike_env /tmp/bench/hdr
for i in $(seq 1 "$RUNS"); do
  for h in default off; do
    if [ "$h" = off ]; then export TURNPIKE_HEADERS=off TURNPIKE_HEADERS_UPSTREAM=off; else unset TURNPIKE_HEADERS TURNPIKE_HEADERS_UPSTREAM; fi
    taskset -c 0 target/release/turnpike start > /dev/null 2>&1 & tp=$!
    wait_port 8000
    taskset -c 1 wrk -t1 -c50 -d2s http://127.0.0.1:8000/ > /dev/null
    echo "run $i headers=$h $(taskset -c 1 wrk -t1 -c50 -d"$DUR" http://127.0.0.1:8000/ | awk '/Requests\/sec/{print int($2)}')"
    kill $tp; wait $tp 2>/dev/null || true
  done
done
