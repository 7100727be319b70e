#!/usr/bin/env bash
# Where a proxy's CPU goes per request, kernel beside user: one worker on CPU 0 (Turnpike, and
# nginx with Kong's TLS settings), `wrk -t1 -c50` on CPU 1 for DUR over PROTO (http or https,
# keep-alive); per request: system calls (perf's raw_syscalls:sys_enter on the proxy's
# process), user and system CPU time (/proc/PID/stat). Instructions (bench/instructions.sh,
# bench/tls-instructions.sh) count user space only; this shows the rest.
# Usage: bench/syscalls.sh [DUR] [PROTO...]   (needs perf, nginx, wrk, openssl)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
DUR=${1:-5s}
shift || true
PROTOS=${*:-http https}
OUT=$(mktemp -d)
BENCH_TMP+=("$OUT")
cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
start_upstream "$LOAD_CPUS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>/dev/null
turnpike_env "$OUT/tp"
export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096, 127.0.0.1:8443 ssl reuseport backlog=4096"
export TURNPIKE_SSL_CERT=$OUT/cert.pem TURNPIKE_SSL_CERT_KEY=$OUT/key.pem TURNPIKE_NGINX_WORKER_PROCESSES=1
mkdir -p "$OUT/nginx"/{cbt,pt,ft,ut,st}
sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$OUT/nginx|g" -e 's/@PORT@/8002/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
    -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > "$OUT/nginx/nginx.conf"
sed -i "s|listen 127.0.0.1:8002 backlog=4096;|listen 127.0.0.1:8002 backlog=4096; listen 127.0.0.1:8445 ssl backlog=4096; ssl_certificate $OUT/cert.pem; ssl_certificate_key $OUT/key.pem; $NGX_KONG_TLS|" "$OUT/nginx/nginx.conf"
taskset -c "$PROXY_CPUS" "$BIN" start > "$OUT/tp.log" 2>&1 &
TP=$!; BENCH_PIDS+=($TP)
taskset -c "$PROXY_CPUS" nginx -c "$OUT/nginx/nginx.conf" -p "$OUT/nginx" -e "$OUT/nginx/error.log" -g 'daemon off; master_process off;' &
NGX=$!; BENCH_PIDS+=($NGX)
wait_port 8000; wait_port 8002; wait_port 8443; wait_port 8445
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }  # utime stime, in clock ticks
HZ=$(getconf CLK_TCK)
echo "| proxy | protocol | requests/s | system calls per request | user µs per request | system µs per request |"
echo "|---|---|---:|---:|---:|---:|"
for proto in $PROTOS; do
  for p in turnpike nginx; do
    if [ $p = turnpike ]; then pid=$TP; port=8000; [ $proto = https ] && port=8443; else pid=$NGX; port=8002; [ $proto = https ] && port=8445; fi
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d2s "$proto://127.0.0.1:$port/" > /dev/null
    read -r u0 s0 < <(ticks $pid)
    perf stat -x, -e raw_syscalls:sys_enter -p $pid -o "$OUT/perf" &
    PERF=$!
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"$DUR" "$proto://127.0.0.1:$port/" > "$OUT/wrk"
    kill -INT $PERF; wait $PERF 2>/dev/null || true
    read -r u1 s1 < <(ticks $pid)
    n=$(awk '/requests in/ {print $1}' "$OUT/wrk")
    rps=$(awk '/Requests\/sec/ {printf "%d", $2}' "$OUT/wrk")
    sc=$(awk -F, '/raw_syscalls/ {print $1}' "$OUT/perf")
    python3 -c "
n, sc, hz = $n, $sc, $HZ
print(f'| $p | $proto | {$rps:,} | {sc / n:.2f} | {($u1 - $u0) / hz / n * 1e6:.1f} | {($s1 - $s0) / hz / n * 1e6:.1f} |')"
  done
done
