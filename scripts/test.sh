#!/usr/bin/env bash
# Runs the whole test suite: unit tests beside the code and the integration tests that start
# the real binary against real upstream servers.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --locked
