#!/usr/bin/env bash
# Control-plane benchmark: three Turnpike nodes sharing one PostgreSQL on loopback.
#
#  1. Propagation: a route created through node A's Admin API; time from A's response until
#     nodes B and C route it (N writes, p50/p99 over both nodes).
#  2. Writes under load: node A holds ROUTES routes; wrk measures proxy latency (p50/p99) on a
#     route for DUR, once with no writes and once while 50 writes/s hit A's Admin API
#     (alternated, RUNS times each). Nodes B and C are stopped first: on a 2-core machine their
#     rebuilds would compete with wrk and the upstream rather than measure node A.
#
# Layout (2 cores): node A (1 worker) on CPU 0; wrk and the nginx upstream on CPU 1; nodes B, C
# and PostgreSQL unpinned.
# FLAVOR=expressions: every node on `router_flavor = expressions`, the routes (imported and
# written) as expressions (`http.path ^= "/rN"`, `http.path == "/prop-..."`).
# Usage: [ROUTES=10000] [FLAVOR=traditional_compatible|expressions] bench/control-plane.sh [N_WRITES] [RUNS] [DUR]
#        (needs postgresql, nginx, wrk, python3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=${1:-200}
RUNS=${2:-3}
DUR=${3:-10s}
ROUTES=${ROUTES:-10000}
FLAVOR=${FLAVOR:-traditional_compatible}
export TURNPIKE_ROUTER_FLAVOR=$FLAVOR FLAVOR
OUT=$ROOT/bench/results/control-plane-$ROUTES${FLAVOR/traditional_compatible/}-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
WORK=$(mktemp -d /tmp/turnpike-cp.XXXXXX)
BENCH_TMP+=("$WORK")
chmod 755 "$WORK"

# PostgreSQL, as the postgres user when we are root.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGPORT=55432
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$WORK"; fi
"${AS[@]}" "$PGBIN/initdb" -D "$WORK/pg" -U kong --auth=trust -E UTF8 --locale=C --no-sync > /dev/null
"${AS[@]}" "$PGBIN/postgres" -D "$WORK/pg" -p $PGPORT -k "$WORK" -c listen_addresses=127.0.0.1 \
  -c fsync=off -c synchronous_commit=off > "$WORK/pg.log" 2>&1 &
BENCH_PIDS+=($!)
wait_port $PGPORT
sleep 0.5
export TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT=$PGPORT \
  TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_NGINX_WORKER_PROCESSES=1
"$BIN" migrations bootstrap

start_upstream 1
python3 - "$WORK/kong.yml" "$ROUTES" <<'PY'
import os, sys
expr = os.environ["FLAVOR"] == "expressions"
def match(path):
    return f"    expression: 'http.path ^= \"{path}\"'" if expr else f"    paths: [{path}]"
lines = ['_format_version: "3.0"', "services:", "- name: bench", "  url: http://127.0.0.1:9001", "  routes:",
         "  - name: bench-write", match("/w")]
for i in range(int(sys.argv[2])):
    lines += [f"  - name: r{i}", match(f"/r{i}")]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
"$BIN" config db_import "$WORK/kong.yml"

NODE_PIDS=()
start_node() { # name proxy-port admin-port [cpu]
  local pin=()
  [ -n "${4:-}" ] && pin=(taskset -c "$4")
  TURNPIKE_PREFIX=$WORK/$1 TURNPIKE_PROXY_LISTEN="127.0.0.1:$2 reuseport" TURNPIKE_ADMIN_LISTEN=127.0.0.1:$3 \
    "${pin[@]}" "$BIN" start > "$OUT/node-$1.log" 2>&1 &
  BENCH_PIDS+=($!)
  NODE_PIDS+=($!)
  wait_port "$2"
}
start_node a 8000 8001 0
start_node b 8010 8011
start_node c 8020 8021
# The nodes load 10k routes at start; wait until each routes one.
for p in 8000 8010 8020; do
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/r$((ROUTES - 1))")" = 200 ] && break
    sleep 0.1
  done
done

echo "== propagation ($N writes, $ROUTES routes)" | tee "$OUT/summary.md"
python3 "$ROOT/bench/control-plane.py" propagate 8001 8010 8020 "$N" | tee "$OUT/propagation.json" | tee -a "$OUT/summary.md"
kill "${NODE_PIDS[1]}" "${NODE_PIDS[2]}"
R=$((ROUTES / 2))

for i in $(seq 1 "$RUNS"); do
  taskset -c 1 wrk -t1 -c20 -d"$DUR" --latency http://127.0.0.1:8000/r$R > "$OUT/no-writes-run$i.txt"
  python3 "$ROOT/bench/control-plane.py" writes 8001 50 "${DUR%s}" > "$OUT/writes-run$i.json" &
  WP=$!
  taskset -c 1 wrk -t1 -c20 -d"$DUR" --latency http://127.0.0.1:8000/r$R > "$OUT/with-writes-run$i.txt"
  wait $WP
done

python3 - "$OUT" "$RUNS" "$ROUTES" <<'PY' | tee -a "$OUT/summary.md"
import json, re, sys, pathlib, statistics
out, runs = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def parse(p):
    t = p.read_text()
    def pct(k):
        m = re.search(rf"^\s+{k}%\s+([\d.]+)(us|ms|s)", t, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)), pct(50), pct(99), int(errs.group(1)) if errs else 0, sock.group(1) if sock else ""
print(f"\n| case ({sys.argv[3]} routes, node A) | RPS (median) | p50 ms | p99 ms (median) | p99 ms (runs) | non-2xx |")
print("|---|---:|---:|---:|---|---:|")
for name in ["no-writes", "with-writes"]:
    vals = [parse(out / f"{name}-run{i}.txt") for i in range(1, runs + 1)]
    print(f"| {name} | {statistics.median(v[0] for v in vals):,.0f} | {statistics.median(v[1] for v in vals):.2f} | "
          f"{statistics.median(v[2] for v in vals):.2f} | {', '.join(f'{v[2]:.2f}' for v in vals)} | {sum(v[3] for v in vals)} |")
w = [json.loads((out / f"writes-run{i}.json").read_text()) for i in range(1, runs + 1)]
print("\nwrites during the with-writes runs:", ", ".join(f"{x['writes_ok']} ok / {x['writes_failed']} failed ({x['rate_per_s']}/s)" for x in w))
PY
echo "raw results: $OUT"
