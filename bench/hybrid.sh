#!/usr/bin/env bash
# Hybrid-mode benchmark: a control plane on PostgreSQL and its data planes on loopback.
#
#  1. Fan-out: N in-process data planes of the real protocol (`dp_swarm`, TLS + WebSocket +
#     basic_info + pings) on one control plane; W writes through the Admin API, each timed from
#     the PATCH sent to every data plane holding the config with it (p50/p99/max), with the
#     control plane's RSS per connected data plane and CPU time per write.
#  2. Scale: the control plane holds ROUTES routes and CONSUMERS consumers with a key-auth key
#     each; a real data plane (the release binary) starts empty: bytes of the full config,
#     export and apply times; then a one-route change: bytes sent and time from the PATCH to the
#     data plane routing it: a delta to a Turnpike data plane, beside the whole config a Kong
#     data plane gets (Kong 3.9's v1 protocol).
#  3. Traffic under changes: a data plane with 1,000 routes, wrk on one of them for DUR, once
#     with no changes and once while 50 changes/s are written on the control plane.
#
# Layout (2 cores): the data plane of case 3 (1 worker) on CPU 0, wrk and the upstream on CPU 1;
# the control plane and PostgreSQL unpinned.
# Usage: [ROUTES=100000] [CONSUMERS=100000] bench/hybrid.sh [N] [WRITES] [DUR]
#        (needs postgresql, nginx, wrk, python3, openssl)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=${1:-100}
W=${2:-50}
DUR=${3:-10s}
ROUTES=${ROUTES:-100000}
CONSUMERS=${CONSUMERS:-100000}
OUT=$ROOT/bench/results/hybrid-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release --locked -p turnpike >&2
cargo build --release --locked -p turnpike-cluster --example dp_swarm >&2
BIN=$ROOT/target/release/turnpike
SWARM=$ROOT/target/release/examples/dp_swarm
WORK=$(mktemp -d /tmp/turnpike-hybrid.XXXXXX)
BENCH_TMP+=("$WORK")
chmod 755 "$WORK"

PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGPORT=55433
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$WORK"; fi
"${AS[@]}" "$PGBIN/initdb" -D "$WORK/pg" -U kong --auth=trust -E UTF8 --locale=C --no-sync > /dev/null
"${AS[@]}" "$PGBIN/postgres" -D "$WORK/pg" -p $PGPORT -k "$WORK" -c listen_addresses=127.0.0.1 \
  -c fsync=off -c synchronous_commit=off > "$WORK/pg.log" 2>&1 &
BENCH_PIDS+=($!)
wait_port $PGPORT
sleep 0.5
PG_ENV=(TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT=$PGPORT
  TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres)
env "${PG_ENV[@]}" "$BIN" migrations bootstrap > /dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -days 30 -subj /CN=kong_clustering \
  -addext subjectAltName=DNS:kong_clustering -keyout "$WORK/cluster.key" -out "$WORK/cluster.crt" 2> /dev/null
CERT_ENV=(TURNPIKE_CLUSTER_CERT=$WORK/cluster.crt TURNPIKE_CLUSTER_CERT_KEY=$WORK/cluster.key
  TURNPIKE_CLUSTER_MAX_PAYLOAD=268435456 TURNPIKE_LOG_LEVEL=info)
start_upstream 1

CP=
start_cp() { # log
  env "${PG_ENV[@]}" "${CERT_ENV[@]}" TURNPIKE_ROLE=control_plane TURNPIKE_PREFIX=$WORK/cp \
    TURNPIKE_PROXY_LISTEN=off TURNPIKE_ADMIN_LISTEN=127.0.0.1:8001 TURNPIKE_CLUSTER_LISTEN=127.0.0.1:8005 \
    "$BIN" start > "$1" 2>&1 &
  CP=$!
  BENCH_PIDS+=($CP)
  wait_port 8005
}
DP=
start_dp() { # name proxy-port [cpu]
  local pin=()
  [ -n "${3:-}" ] && pin=(taskset -c "$3")
  env "${CERT_ENV[@]}" TURNPIKE_ROLE=data_plane TURNPIKE_DATABASE=off TURNPIKE_PREFIX=$WORK/$1 \
    TURNPIKE_CLUSTER_CONTROL_PLANE=127.0.0.1:8005 TURNPIKE_PROXY_LISTEN="127.0.0.1:$2 reuseport" \
    TURNPIKE_ADMIN_LISTEN=127.0.0.1:$(($2 + 1)) TURNPIKE_NGINX_WORKER_PROCESSES=1 \
    "${pin[@]}" "$BIN" start > "$OUT/dp-$1.log" 2>&1 &
  DP=$!
  BENCH_PIDS+=($DP)
  wait_port "$2"
}
admin() { curl -sf -o /dev/null -X "$1" "http://127.0.0.1:8001$2" -H 'content-type: application/json' ${3:+--data "$3"}; }
routes_on() { # port path: until it answers 200 (60 s)
  for _ in $(seq 1 6000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'apikey: k0' "http://127.0.0.1:$1$2")" = 200 ] && return 0
    sleep 0.01
  done
  return 1
}

# 1. Fan-out.
start_cp "$OUT/cp-fanout.log"
admin POST /services '{"name":"bench","url":"http://127.0.0.1:9001"}'
admin POST /services/bench/routes '{"name":"bench-write","paths":["/w"]}'
echo "== 1. fan-out: $N data planes, $W writes" | tee "$OUT/summary.md"
"$SWARM" 127.0.0.1:8005 127.0.0.1:8001 "$WORK/cluster.crt" "$WORK/cluster.key" "$CP" "$N" "$W" \
  | tee "$OUT/fanout.json" | tee -a "$OUT/summary.md"
stop_pid "$CP"

# 2. Scale: a fresh database with the big config.
"${AS[@]}" "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U kong -d postgres -qc 'DROP SCHEMA public CASCADE; CREATE SCHEMA public;' > /dev/null
env "${PG_ENV[@]}" "$BIN" migrations bootstrap > /dev/null
python3 - "$WORK/big.json" "$ROUTES" "$CONSUMERS" <<'PY'
import json, sys
routes, consumers = int(sys.argv[2]), int(sys.argv[3])
doc = {"_format_version": "3.0", "services": [{"name": "bench", "url": "http://127.0.0.1:9001",
        "routes": [{"name": "bench-write", "paths": ["/bench-write"]}] + [{"name": f"r{i}", "paths": [f"/r{i}"]} for i in range(routes)]}],
       "consumers": [{"username": f"c{i}", "keyauth_credentials": [{"key": f"k{i}"}]} for i in range(consumers)]}
json.dump(doc, open(sys.argv[1], "w"))
PY
env "${PG_ENV[@]}" "$BIN" config db_import "$WORK/big.json" > /dev/null
start_cp "$OUT/cp-scale.log"
for _ in $(seq 1 1200); do grep -q "exported" "$OUT/cp-scale.log" && break; sleep 0.1; done
T0=$(date +%s.%N)
start_dp scale 8100
routes_on 8100 "/r$((ROUTES - 1))"
T1=$(date +%s.%N)
RSS_DP=$(awk '/VmRSS/{print $2}' /proc/$DP/status)
admin PATCH /routes/bench-write '{"paths":["/moved-route"]}'
T2=$(date +%s.%N)
routes_on 8100 /moved-route
T3=$(date +%s.%N)
sleep 2
python3 - "$OUT" "$T0" "$T1" "$T2" "$T3" "$RSS_DP" "$ROUTES" "$CONSUMERS" <<'PY' | tee -a "$OUT/summary.md"
import re, sys, pathlib
out = pathlib.Path(sys.argv[1]); t0, t1, t2, t3 = map(float, sys.argv[2:6])
cp = (out / "cp-scale.log").read_text(); dp = (out / "dp-scale.log").read_text()
ex = re.findall(r"exported \((\d+) bytes, (\d+) compressed\) in ([\d.]+)(ms|s|µs)", cp)
ap = re.findall(r"applied in ([\d.]+)(ms|s|µs): (whole config|delta of \d+ entities) \((\d+) bytes\)", dp)
sec = lambda v, u: float(v) / (1000 if u == "ms" else 1e6 if u == "µs" else 1)
print(f"\n== 2. scale: {sys.argv[7]} routes, {sys.argv[8]} consumers with a key each")
print("| step | sent to a Turnpike data plane (gzip bytes) | a Kong data plane would get (gzip; JSON) | control plane export | data plane apply | wall time to serving |")
print("|---|---:|---:|---:|---:|---:|")
print(f"| first sync (data plane starts empty): {ap[0][2]} | {int(ap[0][3]):,} | {int(ex[0][1]):,}; {int(ex[0][0]):,} | {sec(ex[0][2], ex[0][3]):.2f} s | {sec(ap[0][0], ap[0][1]):.2f} s | {t1 - t0:.2f} s |")
print(f"| one route changed: {ap[-1][2]} | {int(ap[-1][3]):,} | {int(ex[-1][1]):,}; {int(ex[-1][0]):,} | {sec(ex[-1][2], ex[-1][3]):.2f} s | {sec(ap[-1][0], ap[-1][1]):.3f} s | {t3 - t2:.2f} s |")
print(f"\ndata plane RSS after the first sync: {int(sys.argv[6]) / 1024:.0f} MB")
PY
stop_pid "$DP"
stop_pid "$CP"

# 3. Traffic on a data plane while changes arrive.
"${AS[@]}" "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U kong -d postgres -qc 'DROP SCHEMA public CASCADE; CREATE SCHEMA public;' > /dev/null
env "${PG_ENV[@]}" "$BIN" migrations bootstrap > /dev/null
ROUTES_C=1000
python3 - "$WORK/small.json" "$ROUTES_C" <<'PY'
import json, sys
n = int(sys.argv[2])
json.dump({"_format_version": "3.0", "services": [{"name": "bench", "url": "http://127.0.0.1:9001",
    "routes": [{"name": "bench-write", "paths": ["/w"]}] + [{"name": f"r{i}", "paths": [f"/r{i}"]} for i in range(n)]}]},
    open(sys.argv[1], "w"))
PY
env "${PG_ENV[@]}" "$BIN" config db_import "$WORK/small.json" > /dev/null
start_cp "$OUT/cp-traffic.log"
start_dp traffic 8200 0
routes_on 8200 /r500
for i in 1 2 3; do
  taskset -c 1 wrk -t1 -c20 -d"$DUR" --latency http://127.0.0.1:8200/r500 > "$OUT/no-changes-run$i.txt"
  python3 "$ROOT/bench/control-plane.py" writes 8001 50 "${DUR%s}" > "$OUT/changes-run$i.json" &
  WP=$!
  taskset -c 1 wrk -t1 -c20 -d"$DUR" --latency http://127.0.0.1:8200/r500 > "$OUT/with-changes-run$i.txt"
  wait $WP
done
APPLIED=$(grep -c "applied in" "$OUT/dp-traffic.log" || true)
python3 - "$OUT" "$APPLIED" <<'PY' | tee -a "$OUT/summary.md"
import json, re, sys, pathlib, statistics
out = pathlib.Path(sys.argv[1])
def parse(p):
    t = p.read_text()
    def pct(k):
        m = re.search(rf"^\s+{k}%\s+([\d.]+)(us|ms|s)", t, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)), pct(50), pct(99), int(errs.group(1)) if errs else 0
print("\n== 3. a data plane's traffic (1,000 routes, 1 worker) while changes arrive")
print("| case | RPS (median) | p50 ms | p99 ms (median) | p99 ms (runs) | non-2xx |")
print("|---|---:|---:|---:|---|---:|")
for name in ["no-changes", "with-changes"]:
    vals = [parse(out / f"{name}-run{i}.txt") for i in (1, 2, 3)]
    print(f"| {name} | {statistics.median(v[0] for v in vals):,.0f} | {statistics.median(v[1] for v in vals):.2f} | "
          f"{statistics.median(v[2] for v in vals):.2f} | {', '.join(f'{v[2]:.2f}' for v in vals)} | {sum(v[3] for v in vals)} |")
w = [json.loads((out / f"changes-run{i}.json").read_text()) for i in (1, 2, 3)]
print("\nchanges written:", ", ".join(f"{x['writes_ok']} ok ({x['rate_per_s']}/s)" for x in w), f"; configs the data plane applied: {sys.argv[2]}")
PY
echo "raw results: $OUT"
