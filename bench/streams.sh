#!/usr/bin/env bash
# TCP stream benchmark: Turnpike's stream proxy (`stream_listen`, a `tcp` route on the
# listener's port, a `tcp` service) beside nginx's stream module (`proxy_pass`, 1 worker), in
# the same run on the same machine, each proxy on the proxy CPUs, the server and the load on
# the others (crates/turnpike/examples/stream_bench.rs for both).
#
# Cases: a 1 GiB upload and a 1 GiB download through one connection (MiB/s), and new
# connections per second (each: connect, 32 bytes echoed, close) from C concurrent clients
# for S seconds. RUNS runs of each, median.
#
# Usage: bench/streams.sh [RUNS] [S] [C]   (needs nginx with libnginx-mod-stream; defaults 3 5 50)
# Results: bench/results/streams-<date>/ (raw outputs and summary.md).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
RUNS=${1:-3}
S=${2:-5}
C=${3:-50}
GIB=$((1 << 30))
bench_begin streams
cargo build --release --locked -p turnpike --example stream_bench >&2
SB=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/stream_bench
ports_free 9201 9202 9203 8101
STREAM_MODULE=/usr/lib/nginx/modules/ngx_stream_module.so
[ -f "$STREAM_MODULE" ] || { echo "needs nginx's stream module (apt install libnginx-mod-stream)" >&2; exit 1; }

taskset -c "$LOAD_CPUS" "$SB" server 9201 &
BENCH_PIDS+=($!)
wait_port 9201

mkdir -p "$W/nginx"
cat > "$W/nginx/nginx.conf" <<NGX
load_module $STREAM_MODULE;
worker_processes $PROXY_N;
pid $W/nginx/nginx.pid;
events { worker_connections 16384; }
stream {
  # proxy_half_close: the upload case half-closes and waits for the server's byte count (nginx
  # closes both directions at the first EOF by default).
  server { listen 127.0.0.1:9202 reuseport backlog=4096; proxy_half_close on; proxy_pass 127.0.0.1:9201; }
}
NGX
start_nginx "$W/nginx" 9202

mkdir -p "$W/tp"
cat > "$W/tp/kong.yml" <<YML
_format_version: "3.0"
services:
- name: s
  url: tcp://127.0.0.1:9201
  routes:
  - name: r
    protocols: [tcp]
    destinations: [{port: 9203}]
YML
export TURNPIKE_PREFIX=$W/tp/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000" \
  TURNPIKE_STREAM_LISTEN="127.0.0.1:9203 reuseport backlog=4096" \
  TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$W/tp/kong.yml \
  TURNPIKE_NGINX_WORKER_PROCESSES=$PROXY_N TURNPIKE_LOG_LEVEL=warn
start_turnpike "$W/tp/turnpike.log"
wait_port 9203

load() { taskset -c "$LOAD_CPUS" "$SB" "$@"; }
for run in $(seq 1 "$RUNS"); do
  for name in nginx turnpike; do
    port=9202; [ $name = turnpike ] && port=9203
    load upload "127.0.0.1:$port" "$GIB" > "$OUT/raw/$name-upload-$run.txt"
    load download "127.0.0.1:$port" "$GIB" > "$OUT/raw/$name-download-$run.txt"
    load conns "127.0.0.1:$port" "$S" "$C" > "$OUT/raw/$name-conns-$run.txt"
  done
done
python3 - "$OUT" "$RUNS" "$S" "$C" <<'PY'
import pathlib, re, statistics, sys, datetime, platform
out, runs, s, c = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def val(name, case, i):
    t = (out / "raw" / f"{name}-{case}-{i}.txt").read_text()
    return float(re.match(r"([\d.]+)", t).group(1)), t.strip()
lines = [f"# TCP streams: Turnpike beside nginx stream ({datetime.date.today()}, {platform.node()})", "",
         f"{runs} runs, median; connections: {c} clients for {s} s; commit {(out / 'commit').read_text().strip()}", "",
         "| case | Turnpike | nginx | ratio | runs (Turnpike; nginx) |", "|---|---:|---:|---:|---|"]
for case, unit in (("upload", "MiB/s"), ("download", "MiB/s"), ("conns", "connections/s")):
    tp = [val("turnpike", case, i)[0] for i in range(1, runs + 1)]
    ng = [val("nginx", case, i)[0] for i in range(1, runs + 1)]
    mt, mn = statistics.median(tp), statistics.median(ng)
    lines.append(f"| {case} ({unit}) | {mt:,.0f} | {mn:,.0f} | {mt / mn:.2f}x | {', '.join(f'{x:,.0f}' for x in tp)}; {', '.join(f'{x:,.0f}' for x in ng)} |")
failed = [val(n, "conns", i)[1] for n in ("turnpike", "nginx") for i in range(1, runs + 1)]
lines += ["", "connection runs: " + " | ".join(failed)]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
