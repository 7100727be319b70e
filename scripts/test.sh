#!/usr/bin/env bash
# Runs the whole test suite: unit tests beside the code and the integration tests that start
# the real binary against real upstream servers and real PostgreSQL and Redis servers.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
# On a fresh machine, install what the tests need first (Rust; PostgreSQL's binaries, which the
# harness uses to start its own servers; redis-server and dnsmasq, likewise).
if ! command -v cargo >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
  || ! command -v redis-server >/dev/null 2>&1 \
  || ! { command -v dnsmasq || test -x /usr/sbin/dnsmasq; } >/dev/null 2>&1 \
  || ! command -v valgrind >/dev/null 2>&1 \
  || ! command -v sqlite3 >/dev/null 2>&1 \
  || ! { command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1 \
  || ! command -v chromium >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 \
  || ! { command -v nginx || test -x /usr/sbin/nginx; } >/dev/null 2>&1; then
  bash scripts/setup.sh
fi
export PATH="$PATH:/usr/sbin"
# A one-shot run gains nothing from incremental compilation, and its caches took ~7 GB of disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# decK and Kong Manager, which their integration tests drive, build from ../shared/tools (Go and
# pnpm; minutes when their caches are cold) while cargo compiles the tests; the tests then find
# them built.
TOOLS_LOG=$(mktemp -d)
SHARED_TOOLS="$(pwd)/../shared/tools"
(bash "$SHARED_TOOLS/deck/build.sh" >"$TOOLS_LOG/deck.log" 2>&1 || true) &
DECK_BUILD=$!
(bash "$SHARED_TOOLS/kong-manager/build.sh" >"$TOOLS_LOG/kong-manager.log" 2>&1 || true) &
KM_BUILD=$!
# The architecture holds: no import cycle among any crate's modules.
python3 scripts/module-cycles.py
cargo test --workspace --locked --no-run
wait "$DECK_BUILD" "$KM_BUILD"
cargo test --workspace --locked
# Performance is tested like a feature: instructions per request of the plain-proxy and
# key-auth + rate-limiting cases must stay within 5% of bench/instructions-baseline.json.
bench/instructions-gate.sh
# Memory is tested like a feature too: a 100k-consumer config's RSS, peak, and what reloads
# retain, against bench/memory-baseline.json.
bench/memory-gate.sh
