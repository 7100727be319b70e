#!/usr/bin/env bash
# Installs what is needed, builds an optimised binary and starts the gateway in the foreground on
# its embedded default (SQLite under the prefix; manage it through the Admin API on :8001).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p turnpike
exec ./target/release/turnpike start -c turnpike.conf.example "$@"
