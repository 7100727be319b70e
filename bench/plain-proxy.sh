#!/usr/bin/env bash
# Plain-proxy benchmark: Turnpike beside nginx (the reference set-ups in
# ../shared/bench-reference/), measured in the same run on the same machine.
#
# Layout (from shared/bench-reference/README.md): the proxy under test pinned to CPU 0 with one
# worker; the upstream (nginx, 1 worker) and wrk pinned to CPU 1; `wrk -t1 -c50 -d10s --latency`,
# 2 s warm-up, RUNS runs, median. Instructions per request: the proxy under
# `valgrind --tool=callgrind`, (Ir(N requests) - Ir(0)) / N over one keep-alive connection.
#
# Usage: [BIN=path] [OLD_BIN=path] bench/plain-proxy.sh [RUNS] [DURATION]   (needs nginx, wrk, valgrind, python3)
# OLD_BIN: another Turnpike build (an older commit's) run the same way on port 8010 and
# measured in every round after the current one ("old" in the summary).
# Results: bench/results/plain-proxy-<date>/ (raw wrk output and a summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SHARED=${SHARED:-$ROOT/../shared/bench-reference}
RUNS=${1:-3}
DUR=${2:-10s}
CALLGRIND_N=${CALLGRIND_N:-20000}
OUT=$ROOT/bench/results/plain-proxy-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT" /tmp/bench/upstream /tmp/bench/nginx /tmp/bench/turnpike
for d in /tmp/bench/upstream /tmp/bench/nginx; do mkdir -p $d/cbt $d/pt $d/ft $d/ut $d/st; done

# BIN: an already built Turnpike to measure (default: this tree's, built now).
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -p turnpike >&2
  BIN=$ROOT/target/release/turnpike
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_port() { for _ in $(seq 1 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

# Upstream on CPU 1.
taskset -c 1 nginx -c "$SHARED/upstream.conf" -p /tmp/bench/upstream -e /tmp/bench/upstream/error.log &
pids+=($!)
wait_port 9001

# nginx reverse proxy with upstream keepalive, CPU 0, port 8002.
sed -e 's/@NAME@/nginx/g' -e 's/@PORT@/8002/' -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' \
    -e 's/@ACCESS@//' -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > /tmp/bench/nginx/nginx.conf
taskset -c 0 nginx -c /tmp/bench/nginx/nginx.conf -p /tmp/bench/nginx -e /tmp/bench/nginx/error.log -g 'daemon off;' &
pids+=($!)
wait_port 8002

# Turnpike, same role: one worker, CPU 0, port 8000; keepalive tuned like the nginx reference.
cat > /tmp/bench/turnpike/kong.yml <<YML
_format_version: "3.0"
services:
  - name: upstream
    url: http://127.0.0.1:9001
    routes:
      - name: all
        paths: [/]
YML
export TURNPIKE_PREFIX=/tmp/bench/turnpike/prefix
export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096"
export TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101
export TURNPIKE_DATABASE=off
export TURNPIKE_DECLARATIVE_CONFIG=/tmp/bench/turnpike/kong.yml
export TURNPIKE_NGINX_WORKER_PROCESSES=1
export TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000
export TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
export TURNPIKE_LOG_LEVEL=warn
taskset -c 0 "$BIN" start > "$OUT/turnpike.log" 2>&1 &
pids+=($!)
TP_PID=$!
wait_port 8000
if [ -n "${OLD_BIN:-}" ]; then
  TURNPIKE_PREFIX=/tmp/bench/turnpike/prefix-old TURNPIKE_ADMIN_LISTEN=127.0.0.1:8111 \
    TURNPIKE_PROXY_LISTEN="127.0.0.1:8010 reuseport backlog=4096" \
    taskset -c 0 "$OLD_BIN" start > "$OUT/turnpike-old.log" 2>&1 &
  pids+=($!)
  OLD_PID=$!
  wait_port 8010
fi

run_wrk() { # name port run
  taskset -c 1 wrk -t1 -c50 -d2s "http://127.0.0.1:$2/" > /dev/null
  taskset -c 1 wrk -t1 -c50 -d"$DUR" --latency "http://127.0.0.1:$2/" > "$OUT/$1-run$3.txt"
}
for i in $(seq 1 "$RUNS"); do
  run_wrk direct 9001 "$i"
  run_wrk nginx 8002 "$i"
  run_wrk turnpike 8000 "$i"
  [ -n "${OLD_BIN:-}" ] && run_wrk old 8010 "$i"
done
kill "$TP_PID"; wait "$TP_PID" 2>/dev/null || true
[ -n "${OLD_BIN:-}" ] && { kill "$OLD_PID"; wait "$OLD_PID" 2>/dev/null || true; }

# Instructions per request under callgrind (one keep-alive connection, N requests).
keepalive_client() { # port n
  python3 - "$1" "$2" <<'PY'
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
for _ in range(n):
    c.request("GET", "/")
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
}
ir_total() { grep -E '^(summary|totals):' "$1" | head -1 | awk '{print $2}'; }
callgrind_turnpike() { # n [binary] -> Ir
  local f=$OUT/callgrind.turnpike.$1${2:+.old}
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$f" "${2:-$BIN}" start > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  [ "$1" -gt 0 ] && keepalive_client 8000 "$1"
  kill -TERM "$vp"; wait "$vp" 2>/dev/null || true
  ir_total "$f"
}
callgrind_nginx() { # n -> Ir
  local f=$OUT/callgrind.nginx.$1
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$f" \
    nginx -c /tmp/bench/nginx/nginx.conf -p /tmp/bench/nginx -e /tmp/bench/nginx/error.log \
    -g 'daemon off; master_process off;' > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8002) 2>/dev/null && break; sleep 0.1; done
  [ "$1" -gt 0 ] && keepalive_client 8002 "$1"
  kill -QUIT "$vp"; wait "$vp" 2>/dev/null || true
  ir_total "$f"
}
# The nginx proxy must be stopped so its callgrind copy can bind the port.
kill "${pids[1]}"; wait "${pids[1]}" 2>/dev/null || true
TP0=$(callgrind_turnpike 0); TPN=$(callgrind_turnpike "$CALLGRIND_N")
NG0=$(callgrind_nginx 0); NGN=$(callgrind_nginx "$CALLGRIND_N")
TP_IPR=$(( (TPN - TP0) / CALLGRIND_N )); NG_IPR=$(( (NGN - NG0) / CALLGRIND_N ))
OLD_IPR=—
if [ -n "${OLD_BIN:-}" ]; then
  O0=$(callgrind_turnpike 0 "$OLD_BIN"); ON=$(callgrind_turnpike "$CALLGRIND_N" "$OLD_BIN")
  OLD_IPR=$(( (ON - O0) / CALLGRIND_N ))
fi

python3 - "$OUT" "$RUNS" "$TP_IPR" "$NG_IPR" "$OLD_IPR" "${OLD_BIN:-}" <<'PY'
import re, sys, statistics, pathlib, platform, subprocess
out, runs, tp_ipr, ng_ipr = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
old_ipr, old_bin = sys.argv[5], sys.argv[6]
def parse(p):
    t = p.read_text()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    def pct(k):
        m = re.search(rf"^\s+{k}%\s+([\d.]+)(us|ms|s)", t, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    return rps, pct(50), pct(99), int(errs.group(1)) if errs else 0
rows = {}
for name in ["direct", "nginx", "turnpike"] + (["old"] if old_bin else []):
    vals = [parse(out / f"{name}-run{i}.txt") for i in range(1, runs + 1)]
    med = sorted(vals, key=lambda v: v[0])[len(vals) // 2]
    rows[name] = med + ([v[0] for v in vals],)
cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
lines = [f"machine: {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} CPUs, kernel {platform.release()}", "",
         "| case | RPS (median) | runs | p50 ms | p99 ms | non-2xx | instructions / request |", "|---|---:|---|---:|---:|---:|---:|"]
ipr = {"nginx": ng_ipr, "turnpike": tp_ipr, "direct": "—", "old": old_ipr}
for name, (rps, p50, p99, errs, all_rps) in rows.items():
    lines.append(f"| {name} | {rps:,.0f} | {', '.join(f'{r:,.0f}' for r in all_rps)} | {p50:.2f} | {p99:.2f} | {errs} | {ipr[name]} |")
lines.append("")
lines.append(f"turnpike / nginx RPS: {rows['turnpike'][0] / rows['nginx'][0]:.2f}x")
if old_bin:
    lines.append(f"old ({old_bin}) / nginx RPS: {rows['old'][0] / rows['nginx'][0]:.2f}x; turnpike / old: {rows['turnpike'][0] / rows['old'][0]:.2f}x")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "raw results: $OUT"
