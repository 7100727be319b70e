#!/usr/bin/env bash
# Instructions one route match costs (callgrind), traditional routes beside expression routes,
# at 10, 1k, 10k and 100k routes: crates/turnpike-router/examples/route_cost.rs run with F
# requests and with none, the difference divided by F (the build is excluded).
# The last column: expression routes through a worker's match cache (Kong's), every request
# a hit (F >= 1,000: the example's 1,000 distinct requests fill it first).
# Usage: bench/router-instructions.sh [F] [SIZES]   (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
F=${1:-2000}
SIZES=${2:-"10 1000 10000 100000"}
cargo build -q --release -p turnpike-router --example route_cost
BIN=$(mktemp -d)/route_cost
cp target/release/examples/route_cost "$BIN"
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$@" 2>&1 \
    | awk '/Collected :/ {print $4}'
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; commit $(git rev-parse --short HEAD); $(date -u +%F); $F requests"
echo
echo "| routes | traditional_compatible (instr/match) | expressions (instr/match) | ratio | expressions through the match cache, all hits (instr/match) |"
echo "|---:|---:|---:|---:|---:|"
for n in $SIZES; do
  row="| $n"
  vals=()
  for kind in traditional expressions; do
    a=$(count "$kind" "$n" "$F")
    b=$(count "$kind" "$n" 0 2>/dev/null || echo 0)
    vals+=($(( (a - b) / F )))
  done
  # Cached: F more requests after F (the first 1,000 fill the cache), the difference / F.
  a=$(count expressions "$n" $((2 * F)) cached)
  b=$(count expressions "$n" "$F" cached)
  vals+=($(( (a - b) / F )))
  printf '| %s | %s | %s | %.2fx | %s |\n' "$n" "${vals[0]}" "${vals[1]}" "$(echo "${vals[1]} / ${vals[0]}" | bc -l)" "${vals[2]}"
done
