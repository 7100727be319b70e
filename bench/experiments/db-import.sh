#!/usr/bin/env bash
# `config db_import` of 10k services and routes + 100k consumers (every tenth with a key-auth
# key) into an empty SQLite store, beside the same file loaded DB-less (`config parse`: load
# and compile), ROUNDS interleaved rounds, for each binary in BINS (e.g. an older commit's).
# Usage: [BINS="old new"] bench/experiments/db-import.sh [ROUNDS]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
ROUNDS=${1:-3}
if [ -z "${BINS:-}" ]; then
  cargo build --release --locked -p turnpike >&2
  BINS=$ROOT/target/release/turnpike
fi
W=$(mktemp -d)
BENCH_TMP+=("$W")
python3 - "$W/big.yml" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write('_format_version: "3.0"\nservices:\n')
    for i in range(10000):
        f.write(f'- name: svc-{i}\n  url: http://up-{i%100}.example:8080/v1\n  routes:\n  - name: r-{i}\n    paths: [/s/{i}]\n')
    f.write('consumers:\n')
    for i in range(100000):
        f.write(f'- username: user-{i}\n  keyauth_credentials:\n  - key: key-{i}\n' if i % 10 == 0 else f'- username: user-{i}\n')
PY
secs() { local s e; s=$(date +%s.%N); "$@" > /dev/null 2>&1; e=$(date +%s.%N); python3 -c "print(round($e - $s, 2))"; }
for r in $(seq 1 "$ROUNDS"); do
  for BIN in $BINS; do
    rm -rf "$W/p"
    i=$(secs env -i PATH="$PATH" TURNPIKE_DATABASE=sqlite TURNPIKE_PREFIX="$W/p" "$BIN" config db_import "$W/big.yml")
    l=$(secs env -i PATH="$PATH" TURNPIKE_DATABASE=off "$BIN" config parse "$W/big.yml")
    echo "round $r $(basename "$BIN"): db_import $i s, DB-less load $l s"
  done
done
