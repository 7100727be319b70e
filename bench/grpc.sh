#!/usr/bin/env bash
# gRPC unary benchmark: Turnpike (a `grpc` service, a route with `protocols: [grpc]` on a
# listener flagged `http2`) beside nginx's `grpc_pass` (1 worker, upstream keepalive), measured
# in the same run on the same machine, the proxy under test pinned as in
# ../shared/bench-reference/ (proxy on the proxy CPUs with one worker per CPU, the upstream and
# h2load on the others).
#
# Upstream: crates/turnpike/examples/grpc_upstream.rs (h2c, echoes each call's message with
# grpc-status 0 in the trailers). Load: h2load over h2c, POST /bench.Echo/Unary with
# `content-type: application/grpc` and `te: trailers`, a 5-byte gRPC frame + a 64-byte message,
# C connections with M concurrent streams each, RUNS runs of N calls after a warm-up, median.
#
# p50/p99 from h2load's per-call log (--log-file).
# Streaming (when ghz is installed: `go install github.com/bojand/ghz/cmd/ghz@v0.93.0`, or
# GHZ=path): bidirectional streaming calls to /bench.Echo/Stream (bench/reference/grpc/bench.proto),
# each sending STREAM_MSGS 64-byte messages that a grpc-go upstream
# (bench/reference/grpc/upstream) echoes as they come; ghz with
# STREAM_C concurrent calls over one client connection, STREAM_N calls a run, the same runs
# interleaved; messages/s counts each message once per direction.
# Usage: bench/grpc.sh [RUNS] [N] [C] [M]   (needs nginx, h2load; defaults 3 200000 50 10)
# Results: bench/results/grpc-<date>/ (raw h2load output and summary.md).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
RUNS=${1:-3}
N=${2:-200000}
C=${3:-50}
M=${4:-10}
bench_begin grpc
cargo build --release --locked -p turnpike --example grpc_upstream >&2
UPBIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/grpc_upstream
ports_free 9101 9102 8000

taskset -c "$LOAD_CPUS" "$UPBIN" 9101 "$LOAD_N" &
BENCH_PIDS+=($!)
wait_port 9101
# The streaming calls' upstream: grpc-go (bench/reference/grpc/upstream, built from the Go
# module proxy) on 9103; both proxies send /bench.Echo/Stream there.
GHZ=${GHZ:-$(command -v ghz || { test -x "$HOME/go/bin/ghz" && echo "$HOME/go/bin/ghz"; } || true)}
if [ -n "$GHZ" ]; then
  (cd "$ROOT/bench/reference/grpc/upstream" && PATH="$PATH:/usr/local/go/bin" go build -o "$W/grpc-go-upstream" .)
  taskset -c "$LOAD_CPUS" "$W/grpc-go-upstream" 9103 &
  BENCH_PIDS+=($!)
  wait_port 9103
fi

# The request: a gRPC frame (uncompressed, big-endian length) carrying 64 bytes.
python3 -c 'import sys; m = b"x" * 64; sys.stdout.buffer.write(b"\0" + len(m).to_bytes(4, "big") + m)' > "$W/call.bin"

# nginx as Kong's `@grpc` location runs it: grpc_pass to an upstream with keepalive.
mkdir -p "$W/nginx"/{cbt,pt,ft,ut,st}
cat > "$W/nginx/nginx.conf" <<NGX
worker_processes $PROXY_N;
pid $W/nginx/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $W/nginx/cbt; proxy_temp_path $W/nginx/pt;
  fastcgi_temp_path $W/nginx/ft; uwsgi_temp_path $W/nginx/ut; scgi_temp_path $W/nginx/st;
  keepalive_requests 1000000;
  # nginx's grpc_pass carries one call per upstream connection (no multiplexing): enough idle
  # connections kept for every call in flight (C x M), or it would open one per call.
  upstream grpc_up { server 127.0.0.1:9101; keepalive 1024; keepalive_requests 1000000; }
  upstream grpc_go { server 127.0.0.1:9103; keepalive 1024; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:9102 http2;
    location / { grpc_pass grpc://grpc_up; }
    location /bench.Echo/Stream { grpc_pass grpc://grpc_go; }
  }
}
NGX
start_nginx "$W/nginx" 9102

mkdir -p "$W/tp"
cat > "$W/tp/kong.yml" <<YML
_format_version: "3.0"
services:
- name: g
  url: grpc://127.0.0.1:9101
  routes:
  - name: all
    protocols: [grpc]
    paths: [/]
- name: go
  url: grpc://127.0.0.1:9103
  routes:
  - name: stream
    protocols: [grpc]
    paths: [/bench.Echo/Stream]
YML
export TURNPIKE_PREFIX=$W/tp/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 http2 reuseport backlog=4096" \
  TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$W/tp/kong.yml \
  TURNPIKE_NGINX_WORKER_PROCESSES=$PROXY_N TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
start_turnpike "$W/tp/turnpike.log"

load() {
  taskset -c "$LOAD_CPUS" h2load -n "$1" -c "$C" -m "$M" -t 1 -d "$W/call.bin" ${3:+--log-file=$3} \
    -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$2/bench.Echo/Unary"
}
# Both answer a call as the upstream does before anything is measured.
for port in 9102 8000; do
  out=$(load 100 "$port")
  echo "$out" | grep -q "100 succeeded" || { echo "port $port: $out" >&2; exit 1; }
done
for run in $(seq 1 "$RUNS"); do
  for name in nginx turnpike; do
    port=9102; [ $name = turnpike ] && port=8000
    load 20000 "$port" > /dev/null
    load "$N" "$port" "$W/$name-$run.log" > "$OUT/raw/$name-$run.txt"
    # Per-call latency (h2load's log: start, status, microseconds): p50 and p99.
    python3 -c 'import sys; v = sorted(int(l.split()[2]) for l in open(sys.argv[1]) if l.strip()); print(v[len(v) // 2] / 1000, v[int(len(v) * 0.99)] / 1000)' "$W/$name-$run.log" > "$OUT/raw/$name-$run.pct"
  done
done
# Streaming calls, when ghz is at hand.
export STREAM_MSGS=${STREAM_MSGS:-100}
STREAM_N=${STREAM_N:-4000}
STREAM_C=${STREAM_C:-50}
if [ -n "$GHZ" ]; then
  stream_load() { # port calls out
    taskset -c "$LOAD_CPUS" "$GHZ" --insecure --proto "$ROOT/bench/reference/grpc/bench.proto" \
      --call bench.Echo.Stream -d "{\"data\":\"$(printf 'x%.0s' $(seq 64) | base64 -w0)\"}" \
      --stream-call-count "$STREAM_MSGS" -c "$STREAM_C" -n "$2" -O json "127.0.0.1:$1" > "$3"
  }
  for run in $(seq 1 "$RUNS"); do
    for name in nginx turnpike; do
      port=9102; [ $name = turnpike ] && port=8000
      stream_load "$port" 200 /dev/null
      stream_load "$port" "$STREAM_N" "$OUT/raw/stream-$name-$run.json"
    done
  done
fi
python3 - "$OUT" "$RUNS" "$N" "$C" "$M" <<'PY'
import pathlib, re, statistics, sys, platform, datetime
out, runs, n, c, m = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def parse(t):
    rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", t).group(1))
    ok = int(re.search(r"(\d+) succeeded", t).group(1))
    # "time for request:  min max mean sd +/- sd" (units ms or us)
    row = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", t)
    def ms(v):
        return float(v[:-2]) / 1000 if v.endswith("us") else float(v[:-2]) if v.endswith("ms") else float(v[:-1]) * 1000
    return rps, ok, ms(row.group(3)), ms(row.group(2))
res = {}
for name in ("nginx", "turnpike"):
    rows = []
    for i in range(1, runs + 1):
        p50, p99 = map(float, (out / "raw" / f"{name}-{i}.pct").read_text().split())
        rows.append(parse((out / "raw" / f"{name}-{i}.txt").read_text()) + (p50, p99))
    res[name] = rows
lines = [f"# gRPC unary: Turnpike beside nginx grpc_pass ({datetime.date.today()}, {platform.node()})", "",
         f"h2load -n {n} -c {c} -m {m}, {runs} runs, median; commit {(out / 'commit').read_text().strip()}", "",
         "| proxy | req/s (median) | runs | p50 ms | p99 ms | max ms | succeeded |", "|---|---:|---|---:|---:|---:|---:|"]
med = {}
for name, rows in res.items():
    rps = [r[0] for r in rows]
    med[name] = statistics.median(rps)
    lines.append(f"| {name} | {med[name]:,.0f} | {', '.join(f'{x:,.0f}' for x in rps)} | "
                 f"{statistics.median(r[4] for r in rows):.2f} | {statistics.median(r[5] for r in rows):.2f} | "
                 f"{max(r[3] for r in rows):.2f} | {min(r[1] for r in rows)} |")
lines += ["", f"ratio turnpike / nginx: {med['turnpike'] / med['nginx']:.2f}"]
import json, os
if (out / "raw" / "stream-nginx-1.json").exists():
    lines += ["", "## Bidirectional streaming (ghz)", "",
              "| proxy | calls/s (median) | messages/s | runs (calls/s) | p50 ms | p99 ms | errors |",
              "|---|---:|---:|---|---:|---:|---:|"]
    smed = {}
    for name in ("nginx", "turnpike"):
        rows = []
        for i in range(1, runs + 1):
            j = json.loads((out / "raw" / f"stream-{name}-{i}.json").read_text())
            pct = {d["percentage"]: d["latency"] / 1e6 for d in j.get("latencyDistribution") or []}
            errs = sum(j.get("errorDistribution", {}).values()) if j.get("errorDistribution") else 0
            rows.append((j["rps"], pct.get(50, 0), pct.get(99, 0), errs))
        rps = [r[0] for r in rows]
        smed[name] = statistics.median(rps)
        msgs = int(os.environ.get("STREAM_MSGS", "100"))
        lines.append(f"| {name} | {smed[name]:,.0f} | {smed[name] * msgs * 2:,.0f} | {', '.join(f'{x:,.0f}' for x in rps)} | "
                     f"{statistics.median(r[1] for r in rows):.2f} | {statistics.median(r[2] for r in rows):.2f} | {sum(r[3] for r in rows)} |")
    lines += ["", f"streaming ratio turnpike / nginx: {smed['turnpike'] / smed['nginx']:.2f}"]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
