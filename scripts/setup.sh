#!/usr/bin/env bash
# Installs what Turnpike needs on a fresh Debian machine: a C toolchain, curl, the Rust toolchain
# (rustup, when cargo is missing), PostgreSQL's binaries (for the tests) and, with
# TURNPIKE_SETUP_BENCH=1, the reference servers the benchmarks use.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# postgresql, redis-server, dnsmasq-base: the test harness starts its own throw-away servers
# (sqlite3: a test writes a row straight into the SQLite store; slapd: ldap-auth binds to a
# real OpenLDAP server)
# from these binaries. nginx and valgrind: the instructions-per-request regression gate the test
# command ends with (bench/instructions-gate.sh).
# python3-grpcio (python3-pip as the fallback): the gRPC tests' server and client (grpcio; the
# tests install it from PyPI into the target directory when the system's Python lacks it).
# golang-go: decK is built from ../shared/tools/deck for its integration test (a newer Go already
# installed is used instead); chromium, nodejs and npm: Kong Manager is built and driven in a
# headless browser by its integration test.
# Node.js and npm only when npm is missing: a machine with NodeSource's nodejs (which bundles npm)
# cannot take Debian's npm package beside it (the two conflict and apt refuses the whole line).
NODE_PKGS="nodejs npm"
command -v npm >/dev/null 2>&1 && NODE_PKGS=""
$SUDO apt-get install -y -qq build-essential pkg-config curl ca-certificates postgresql redis-server \
  dnsmasq-base nginx haproxy valgrind sqlite3 chromium $NODE_PKGS slapd python3-pip python3-grpcio
command -v go >/dev/null 2>&1 || test -x /usr/local/go/bin/go || $SUDO apt-get install -y -qq golang-go
if [ "${TURNPIKE_SETUP_BENCH:-0}" = 1 ]; then
  # nghttp2-client (h2load) and libnginx-mod-stream: bench/grpc.sh and bench/streams.sh.
  $SUDO apt-get install -y -qq wrk libnginx-mod-http-lua haproxy openssl python3-matplotlib time \
    nghttp2-client libnginx-mod-stream
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
cargo --version
if [ "${TURNPIKE_SETUP_BENCH:-0}" = 1 ] && ! command -v ghz >/dev/null 2>&1 \
  && ! test -x "$HOME/go/bin/ghz"; then
  # bench/grpc.sh's streaming load generator (gRPC bidirectional streams; from the Go module
  # proxy into ~/go/bin).
  PATH="$PATH:/usr/local/go/bin" go install github.com/bojand/ghz/cmd/ghz@v0.93.0 || true
fi
if [ "${TURNPIKE_SETUP_BENCH:-0}" = 1 ] && ! command -v oha >/dev/null 2>&1; then
  # The constant-rate load generator of bench/latency-sweep.sh (not packaged by Debian; a few
  # minutes to build).
  cargo install oha --locked
fi
