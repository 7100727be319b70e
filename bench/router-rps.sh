#!/usr/bin/env bash
# RPS through N routes, expression routes beside the same routes as traditional_compatible
# ones, at 10, 1k, 10k and 100k routes: the shape of bench/router-instructions.sh (one route
# per host and path prefix, with GET), DB-less, one Turnpike worker on CPU 0, the upstream
# and `wrk -t1 -c50` on CPU 1. Each request is one of 1,000 distinct (host, path) pairs spread
# over the routes, so the worker's match cache (expressions) holds them all after the warm-up,
# as it would for a site's hot set. Rounds interleave sizes and flavors.
# Usage: bench/router-rps.sh [ROUNDS] [DURATION] [SIZES]   (needs nginx, wrk, python3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}
DUR=${2:-8s}
SIZES=${3:-"10 1000 10000 100000"}
bench_begin router-rps
ports_free 8000 9001
start_upstream 1
python3 - "$W" $SIZES <<'PY'
import pathlib, sys
w = pathlib.Path(sys.argv[1])
for n in map(int, sys.argv[2:]):
    for kind in ("expressions", "traditional"):
        lines = ['_format_version: "3.0"', "services:", "- name: s", "  url: http://127.0.0.1:9001", "  routes:"]
        for i in range(n):
            host, path = f"h{i % 100}.test", f"/s{i // 10}-r{i % 10}"
            if kind == "expressions":
                e = f'http.host == "{host}" && http.path ^= "{path}" && http.method == "GET"'
                lines.append(f"  - {{name: r{i}, expression: '{e}'}}")
            else:
                lines.append(f"  - {{name: r{i}, paths: [{path}], hosts: [{host}], methods: [GET]}}")
        (w / f"{kind}-{n}.yml").write_text("\n".join(lines) + "\n")
    reqs = []
    for k in range(1000):
        i = (k * 7919) % n
        reqs.append(f'{{"/s{i // 10}-r{i % 10}/x", "h{i % 100}.test"}}')
    (w / f"req-{n}.lua").write_text(
        "local reqs = {" + ",".join(reqs) + "}\nlocal k = 0\n"
        "request = function() k = k % #reqs + 1 local r = reqs[k] "
        "return wrk.format('GET', r[1], {Host = r[2]}) end\n")
PY
turnpike_env "$W/tp"
rps() { awk '/Requests\/sec/ {print $2}' "$1"; }
for round in $(seq 1 "$ROUNDS"); do
  for n in $SIZES; do
    for kind in expressions traditional; do
      if [ $kind = expressions ]; then flavor=expressions; else flavor=traditional_compatible; fi
      export TURNPIKE_DECLARATIVE_CONFIG=$W/$kind-$n.yml TURNPIKE_ROUTER_FLAVOR=$flavor
      start_turnpike "$OUT/raw/turnpike-$kind-$n-$round.log"
      # Every request must be routed: a 404 would measure the miss path.
      code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: h0.test' http://127.0.0.1:8000/s0-r0/x)
      [ "$code" = 200 ] || { echo "$kind $n: GET /s0-r0/x answered $code" >&2; exit 1; }
      taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d1s -s "$W/req-$n.lua" http://127.0.0.1:8000 > /dev/null
      taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"$DUR" -s "$W/req-$n.lua" http://127.0.0.1:8000 \
        > "$OUT/raw/wrk-$kind-$n-$round.txt"
      if grep -q "Non-2xx" "$OUT/raw/wrk-$kind-$n-$round.txt"; then
        echo "$kind $n: non-2xx answers" >&2; cat "$OUT/raw/wrk-$kind-$n-$round.txt" >&2; exit 1
      fi
      echo "round $round $kind $n: $(rps "$OUT/raw/wrk-$kind-$n-$round.txt") RPS"
      stop_pid "$TP"
    done
  done
done | tee "$OUT/raw/runs.txt"
python3 - "$OUT/raw/runs.txt" $SIZES > "$OUT/summary.md" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    p = line.split()
    runs.setdefault((p[2], int(p[3].rstrip(":"))), []).append(float(p[4]))
print("| routes | expressions RPS (median; runs) | traditional_compatible RPS (median; runs) | ratio |")
print("|---:|---:|---:|---:|")
for n in map(int, sys.argv[2:]):
    e, t = runs[("expressions", n)], runs[("traditional", n)]
    me, mt = statistics.median(e), statistics.median(t)
    fmt = lambda v: ", ".join(f"{x:,.0f}" for x in v)
    print(f"| {n:,} | {me:,.0f} ({fmt(e)}) | {mt:,.0f} ({fmt(t)}) | {me / mt:.2f}x |")
PY
{ echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; $(cat "$OUT/commit"); $(date -u +%F); $ROUNDS rounds of $DUR"; cat "$OUT/summary.md"; } | tee "$OUT/summary.txt"
