#!/usr/bin/env bash
# CPU a token write costs, without proxy traffic: one Turnpike node (1 worker, all on CPU 0) on
# a PostgreSQL of its own (with pg_stat_statements), oauth2 tokens written through
# `POST /oauth2_tokens` by oha at RATE a second for SECS; per write, the node's and
# PostgreSQL's CPU time (utime + stime of every thread of theirs, 10 ms ticks) and the
# statements PostgreSQL ran (pg_stat_statements: calls, total execution ms, rows). Runs each
# binary of BINS in turn, ROUNDS times (BINS: paths; default: this checkout's release build).
# PERF=1 also samples the node's threads (perf record -g, 999 Hz) while the writes run and keeps
# each round's top symbols in raw/<binary>-round<n>.perf.txt.
# Usage: [BINS="a b"] [PERF=1] bench/experiments/token-write-cost.sh [RATE] [SECS] [ROUNDS]
#        (needs postgresql, oha, python3)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
RATE=${1:-150}
SECS=${2:-20}
ROUNDS=${3:-2}
bench_begin "token-write-cost-$RATE"
BINS=${BINS:-$BIN}
chmod 755 "$W"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGPORT=55440
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$W"; fi
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
ticks() { for p in "$@"; do cat /proc/"$p"/task/*/stat 2>/dev/null || true; done | awk '{s += $14 + $15} END {print s + 0}'; }

one() { # binary round
  local bin=$1 d=$W/r$2-$(basename "$1") f=$OUT/raw/$(basename "$1")-round$2.txt
  mkdir -p "$d"
  [ ${#AS[@]} = 0 ] || chown postgres "$d"
  "${AS[@]}" "$PGBIN/initdb" -D "$d/pg" -U kong --auth=trust -E UTF8 --locale=C --no-sync > /dev/null
  "${AS[@]}" "$PGBIN/postgres" -D "$d/pg" -p $PGPORT -k "$d" -c listen_addresses=127.0.0.1 \
    -c fsync=off -c synchronous_commit=off -c shared_buffers=256MB \
    -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all > "$d/pg.log" 2>&1 &
  local pg=$!
  wait_port $PGPORT
  sleep 0.5
  psql() { "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U kong -d postgres -qAt "$@"; }
  psql -c "CREATE EXTENSION pg_stat_statements"
  export TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT=$PGPORT \
    TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres TURNPIKE_LOG_LEVEL=warn \
    TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_PREFIX=$d/node \
    TURNPIKE_PROXY_LISTEN=127.0.0.1:8000 TURNPIKE_ADMIN_LISTEN=127.0.0.1:8001
  "$bin" migrations bootstrap > /dev/null
  taskset -c 0 "$bin" start > "$d/node.log" 2>&1 &
  local node=$!
  BENCH_PIDS+=($node $pg)
  wait_port 8001
  oauth2_setup http://127.0.0.1:8001 http://127.0.0.1:9001
  sleep 1
  psql -c "SELECT pg_stat_statements_reset()" > /dev/null
  local n0 p0 n1 p1
  n0=$(ticks $node); p0=$(ticks $(pgrep -u postgres postgres))
  local perf=
  if [ "${PERF:-}" = 1 ]; then
    perf record -q -g -F 999 -p "$node" -o "$d/perf.data" -- sleep "$SECS" > /dev/null 2>&1 &
    perf=$!
  fi
  "$OHA" --no-tui --output-format json -c 32 -q "$RATE" -z "${SECS}s" -m POST -T application/json \
    -d "{\"credential\":{\"id\":\"$CRED\"},\"service\":{\"id\":\"$SVC\"},\"expires_in\":7200,\"scope\":\"email\"}" \
    http://127.0.0.1:8001/oauth2_tokens > "$d/oha.json"
  n1=$(ticks $node); p1=$(ticks $(pgrep -u postgres postgres))
  if [ -n "$perf" ]; then
    wait "$perf" || true
    perf report -i "$d/perf.data" --no-children --sort comm,symbol --stdio 2>/dev/null \
      | grep -v '^#' | grep '%' | head -60 > "${f%.txt}.perf.txt" || true
  fi
  local written
  written=$(python3 -c "import json; print(json.load(open('$d/oha.json')).get('statusCodeDistribution', {}).get('201', 0))")
  {
    echo "binary $bin"
    echo "writes $written"
    echo "node_us_per_write $(( (n1 - n0) * 10000 / (written > 0 ? written : 1) ))"
    echo "postgres_us_per_write $(( (p1 - p0) * 10000 / (written > 0 ? written : 1) ))"
    psql -c "SELECT calls, round(total_exec_time::numeric, 1), rows, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
             FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC LIMIT 12"
  } > "$f"
  kill $node; wait $node 2>/dev/null || true
  kill $pg; wait $pg 2>/dev/null || true
}

for r in $(seq 1 "$ROUNDS"); do
  for b in $BINS; do one "$b" "$r"; done
done
for f in "$OUT"/raw/*.txt; do echo "== $(basename "$f")"; sed -n 2,4p "$f"; done | tee "$OUT/summary.txt"
