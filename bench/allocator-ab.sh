#!/usr/bin/env bash
# A/B of the global allocator: the same proxy built with mimalloc (default) and with glibc's
# malloc (--features system-allocator), alternated run by run on the plain-proxy layout
# (proxy on CPU 0, upstream nginx and wrk on CPU 1). Prints RPS per run and the median.
# Usage: bench/allocator-ab.sh [RUNS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd); SHARED=${SHARED:-$ROOT/../shared/bench-reference}
RUNS=${1:-3}; DUR=${2:-10s}
mkdir -p /tmp/bench/upstream/{cbt,pt,ft,ut,st} /tmp/bench/ab
cargo build --release --locked -p turnpike >&2 && cp target/release/turnpike /tmp/bench/ab/turnpike-mimalloc
cargo build --release --locked -p turnpike --features system-allocator >&2 && cp target/release/turnpike /tmp/bench/ab/turnpike-glibc
cargo build --release --locked -p turnpike >&2
pids=(); trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done' EXIT
taskset -c 1 nginx -c "$SHARED/upstream.conf" -p /tmp/bench/upstream -e /tmp/bench/upstream/error.log & pids+=($!)
sleep 0.5
printf '_format_version: "3.0"\nservices: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/]}]}]\n' > /tmp/bench/ab/kong.yml
export TURNPIKE_PREFIX=/tmp/bench/ab/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000" TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 \
  TURNPIKE_DECLARATIVE_CONFIG=/tmp/bench/ab/kong.yml TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000 TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
declare -A results
for i in $(seq 1 "$RUNS"); do
  for a in mimalloc glibc; do
    taskset -c 0 /tmp/bench/ab/turnpike-$a start > /dev/null 2>&1 & tp=$!
    for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.05; done
    taskset -c 1 wrk -t1 -c50 -d2s http://127.0.0.1:8000/ > /dev/null
    rps=$(taskset -c 1 wrk -t1 -c50 -d"$DUR" http://127.0.0.1:8000/ | awk '/Requests\/sec/{print int($2)}')
    kill $tp; wait $tp 2>/dev/null || true
    results[$a]="${results[$a]:-} $rps"
    echo "run $i $a: $rps"
  done
done
for a in mimalloc glibc; do
  echo "$a median: $(echo ${results[$a]} | tr ' ' '\n' | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')"
done
