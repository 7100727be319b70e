#!/usr/bin/env bash
# Ten upstream targets, round-robin: Turnpike (an `upstreams` entity with 10 targets) beside
# nginx (an `upstream` block with the same 10 servers, keepalive 64), same run, same machine.
# Reports RPS, p50/p99 and the upstream connection reuse ratio, counted at the upstream for both
# proxies (nginx stub_status: accepted connections vs requests) and, for Turnpike, also from its
# own /status (per target).
#
# Layout as ../shared/bench-reference/README.md: the proxy pinned to CPU 0 with one worker;
# the upstream (one nginx worker listening on 10 ports) and wrk on CPU 1;
# `wrk -t1 -c50 -d10s --latency`, 2 s warm-up, RUNS runs, median.
#
# Usage: bench/upstream-targets.sh [RUNS] [DURATION]   (needs nginx, wrk, python3)
# Results: bench/results/upstream-targets-<date>/ (raw wrk output, status files, summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
RUNS=${1:-3}
DUR=${2:-10s}
OUT=$ROOT/bench/results/upstream-targets-$(date -u +%Y%m%d-%H%M%S)
W=$(mktemp -d /tmp/bench-targets.XXXX)
BENCH_TMP+=("$W")
mkdir -p "$OUT" "$W"/{up,nginx,turnpike}/{cbt,pt,ft,ut,st}

cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
PORTS=$(seq 9011 9020)

# The upstream: one nginx worker answering "ok" on ten ports, stub_status on 9030.
{
  echo "worker_processes 1; daemon off; pid $W/up/nginx.pid; error_log $W/up/error.log warn;"
  echo "events { worker_connections 4096; }"
  echo "http { access_log off; keepalive_requests 1000000; keepalive_timeout 60s;"
  echo "  client_body_temp_path $W/up/cbt; proxy_temp_path $W/up/pt; fastcgi_temp_path $W/up/ft; uwsgi_temp_path $W/up/ut; scgi_temp_path $W/up/st;"
  echo "  server {"
  for p in $PORTS; do echo "    listen 127.0.0.1:$p backlog=4096;"; done
  echo "    location / { default_type text/plain; return 200 \"ok\\n\"; } }"
  echo "  server { listen 127.0.0.1:9030; location / { stub_status; } } }"
} > "$W/up/nginx.conf"
taskset -c 1 nginx -c "$W/up/nginx.conf" -p "$W/up" -e "$W/up/error.log" &
BENCH_PIDS+=($!)
wait_port 9020
wait_port 9030

# nginx: the same ten servers in an upstream block (round-robin is its default).
{
  echo "worker_processes 1; pid $W/nginx/nginx.pid; error_log $W/nginx/error.log warn;"
  echo "events { worker_connections 4096; }"
  echo "http { access_log off; keepalive_requests 1000000; keepalive_timeout 60s;"
  echo "  client_body_temp_path $W/nginx/cbt; proxy_temp_path $W/nginx/pt; fastcgi_temp_path $W/nginx/ft; uwsgi_temp_path $W/nginx/ut; scgi_temp_path $W/nginx/st;"
  echo "  upstream up {"
  for p in $PORTS; do echo "    server 127.0.0.1:$p;"; done
  echo "    keepalive 64; keepalive_requests 1000000; }"
  echo "  server { listen 127.0.0.1:8002 backlog=4096;"
  echo "    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } } }"
} > "$W/nginx/nginx.conf"
taskset -c 0 nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;' &
BENCH_PIDS+=($!)
wait_port 8002

# Turnpike: an upstream entity with the ten targets (turnpike_env's settings, this config).
turnpike_env "$W/turnpike"
{
  echo '_format_version: "3.0"'
  echo 'upstreams:'
  echo '- name: ten'
  echo '  targets:'
  for p in $PORTS; do echo "  - target: 127.0.0.1:$p"; done
  echo 'services: [{name: s, host: ten, routes: [{name: all, paths: [/]}]}]'
} > "$W/turnpike/ten-targets.yml"
export TURNPIKE_DECLARATIVE_CONFIG=$W/turnpike/ten-targets.yml
taskset -c 0 "$BIN" start > "$OUT/turnpike.log" 2>&1 &
BENCH_PIDS+=($!)
wait_port 8000

stub() { curl -s http://127.0.0.1:9030/ | awk 'NR==3 {print $1, $3}'; }  # accepts requests
run_wrk() { # name port run
  taskset -c 1 wrk -t1 -c50 -d2s "http://127.0.0.1:$2/" > /dev/null
  local before after
  before=$(stub)
  taskset -c 1 wrk -t1 -c50 -d"$DUR" --latency "http://127.0.0.1:$2/" > "$OUT/$1-run$3.txt"
  after=$(stub)
  # Connections the upstream accepted and requests it served during the measured run
  # (stub_status's own request adds one).
  echo "$before $after" | awk '{print $3 - $1, $4 - $2 - 1}' > "$OUT/$1-run$3.upstream"
}
for i in $(seq 1 "$RUNS"); do
  run_wrk nginx 8002 "$i"
  run_wrk turnpike 8000 "$i"
done
curl -s http://127.0.0.1:8101/status > "$OUT/turnpike-status.json"

python3 - "$OUT" "$RUNS" <<'PY'
import re, sys, json, pathlib, platform, subprocess
out, runs = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def parse(name, i):
    t = (out / f"{name}-run{i}.txt").read_text()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    def pct(k):
        m = re.search(rf"^\s+{k}%\s+([\d.]+)(us|ms|s)", t, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    conns, reqs = map(int, (out / f"{name}-run{i}.upstream").read_text().split())
    reuse = 1 - conns / reqs if reqs else 0.0
    return rps, pct(50), pct(99), int(errs.group(1)) if errs else 0, conns, reqs, reuse
cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
lines = [f"machine: {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} CPUs, kernel {platform.release()}", "",
         "| proxy (10 targets, round-robin) | RPS (median) | runs | p50 ms | p99 ms (median run) | p99 ms (each run) | non-2xx | upstream connections / requests (median run) | reuse ratio |",
         "|---|---:|---|---:|---:|---|---:|---:|---:|"]
med = {}
for name in ["nginx", "turnpike"]:
    vals = [parse(name, i) for i in range(1, runs + 1)]
    m = sorted(vals, key=lambda v: v[0])[len(vals) // 2]
    med[name] = m
    med[name + "_p99"] = sorted(v[2] for v in vals)[len(vals) // 2]
    lines.append(f"| {name} | {m[0]:,.0f} | {', '.join(f'{v[0]:,.0f}' for v in vals)} | {m[1]:.2f} | {m[2]:.2f} | {', '.join(f'{v[2]:.2f}' for v in vals)} | {m[3]} | {m[4]} / {m[5]:,} | {m[6]:.5%} |")
lines.append("")
lines.append(f"turnpike / nginx RPS: {med['turnpike'][0] / med['nginx'][0]:.2f}x; median p99 over the runs: turnpike {med['turnpike_p99']:.2f} ms, nginx {med['nginx_p99']:.2f} ms ({med['turnpike_p99'] / med['nginx_p99']:.2f}x)")
st = json.loads((out / "turnpike-status.json").read_text())["upstream"]
lines.append("")
lines.append(f"Turnpike's own /status over the whole run (warm-ups included): {st['connections_opened']} connections for {st['requests']:,} requests, reuse ratio {(st['reuse_ratio'] or 0):.5%}; per target:")
lines.append("")
lines.append("| target | connections opened | requests | reuse ratio |")
lines.append("|---|---:|---:|---:|")
for p in sorted(st["peers"], key=lambda p: p["peer"]):
    lines.append(f"| {p['peer']} | {p['connections_opened']} | {p['requests']:,} | {p['reuse_ratio']:.5%} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "raw results: $OUT"
