#!/usr/bin/env bash
# `config db_import` of 10k services and routes + 100k consumers (every tenth with a key-auth
# key) into an empty SQLite store, beside the same file loaded DB-less (`config parse`: load
# and compile), ROUNDS interleaved rounds, for each binary in BINS (e.g. an older commit's).
# DB=postgres imports into an empty PostgreSQL instead (the system's server, started here on a
# free port with its default durability settings; `migrations reset` + `bootstrap` each round).
# Usage: [BINS="old new"] [DB=sqlite|postgres] bench/experiments/db-import.sh [ROUNDS]
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
DB=${DB:-sqlite}
if [ "$DB" = postgres ]; then
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  PGPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  AS=()
  if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$W"; fi
  "${AS[@]}" "$PGBIN/initdb" -D "$W/pg" -U kong --auth=trust -E UTF8 --locale=C --no-sync > /dev/null
  "${AS[@]}" "$PGBIN/postgres" -D "$W/pg" -p "$PGPORT" -k "$W" -c listen_addresses=127.0.0.1 \
    > "$W/pg.log" 2>&1 &
  BENCH_PIDS+=($!)
  wait_port "$PGPORT"
  sleep 0.5
  PGENV=(TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT="$PGPORT"
    TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres)
fi
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
    if [ "$DB" = postgres ]; then
      env -i PATH="$PATH" "${PGENV[@]}" "$BIN" migrations reset --yes > /dev/null 2>&1 || true
      env -i PATH="$PATH" "${PGENV[@]}" "$BIN" migrations bootstrap > /dev/null
      i=$(secs env -i PATH="$PATH" "${PGENV[@]}" TURNPIKE_PREFIX="$W/p" "$BIN" config db_import "$W/big.yml")
    else
      i=$(secs env -i PATH="$PATH" TURNPIKE_DATABASE=sqlite TURNPIKE_PREFIX="$W/p" "$BIN" config db_import "$W/big.yml")
    fi
    l=$(secs env -i PATH="$PATH" TURNPIKE_DATABASE=off "$BIN" config parse "$W/big.yml")
    echo "round $r $(basename "$BIN") ($DB): db_import $i s, DB-less load $l s"
  done
done
