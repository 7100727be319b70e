#!/usr/bin/env bash
# Instructions (callgrind) to parse the plain case's response head and request head once:
# turnpike-proxy's h1_parse beside httparse, (Ir(N) - Ir(1)) / (N - 1). Prints one line each.
# Usage: bench/experiments/head-parse.sh [N]     (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/head-parse"
N=${1:-10001}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/../../../target}/head-parse
cargo build --release -q
BIN=$CARGO_TARGET_DIR/release/head-parse
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ir() {
  valgrind --tool=callgrind --callgrind-out-file="$W/cg" "$BIN" "$1" "$2" > /dev/null 2> "$W/err"
  grep -E '^(summary|totals):' "$W/cg" | head -1 | awk '{print $2}'
}
for which in ours httparse; do
  a=$(ir "$which" 1); b=$(ir "$which" "$N")
  echo "$which: $(( (b - a) / (N - 1) )) instructions per response head + request head"
done
