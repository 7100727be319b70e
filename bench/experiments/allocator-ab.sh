#!/usr/bin/env bash
# A/B of the global allocator: the same proxy built with mimalloc (default) and with glibc's
# malloc (--features system-allocator), alternated run by run on the plain-proxy layout
# (proxy on CPU 0, upstream nginx and wrk on CPU 1). Prints RPS per run and the median.
# Usage: bench/experiments/allocator-ab.sh [RUNS] [DURATION]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
RUNS=${1:-3}; DUR=${2:-10s}
mkdir -p /tmp/bench/ab
cargo build --release --locked -p turnpike >&2 && cp target/release/turnpike /tmp/bench/ab/turnpike-mimalloc
cargo build --release --locked -p turnpike --features system-allocator >&2 && cp target/release/turnpike /tmp/bench/ab/turnpike-glibc
cargo build --release --locked -p turnpike >&2
start_upstream 1
turnpike_env /tmp/bench/ab
declare -A results
for i in $(seq 1 "$RUNS"); do
  for a in mimalloc glibc; do
    taskset -c 0 /tmp/bench/ab/turnpike-$a start > /dev/null 2>&1 & tp=$!
    wait_port 8000
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
