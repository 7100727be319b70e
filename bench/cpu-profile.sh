#!/usr/bin/env bash
# Where the proxy core's time goes, Turnpike beside nginx: `perf record -e cpu-clock -C 0 -g`
# on CPU 0 (the proxy's core) during a 5 s `wrk -t1 -c50` run (after a 2 s warm-up), then the
# share of samples in the kernel, the binary and libc. Same pinned layout as plain-proxy.sh.
# Also counts syscalls per request with `strace -c -f` over a 3 s run.
# Usage: bench/cpu-profile.sh   (needs nginx, wrk, perf, strace)
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cargo build --release --locked -p turnpike >&2
OUT=$ROOT/bench/results/cpu-profile-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT" /tmp/bench/nginx/{cbt,pt,ft,ut,st}
start_upstream 1
sed -e 's/@NAME@/nginx/g' -e 's/@PORT@/8002/' -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' \
    -e 's/@ACCESS@//' -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > /tmp/bench/nginx/nginx.conf
taskset -c 0 nginx -c /tmp/bench/nginx/nginx.conf -p /tmp/bench/nginx -e /tmp/bench/nginx/error.log -g 'daemon off;' &
NGINX=$!
BENCH_PIDS+=($NGINX)
TP_DIR=$(mktemp -d)
BENCH_TMP+=("$TP_DIR")
turnpike_env "$TP_DIR"
taskset -c 0 "$ROOT/target/release/turnpike" start > "$OUT/turnpike.log" 2>&1 &
TP=$!
BENCH_PIDS+=($TP)
wait_port 8002
wait_port 8000
for who in nginx turnpike; do
  port=8002; [ $who = turnpike ] && port=8000
  taskset -c 1 wrk -t1 -c50 -d2s "http://127.0.0.1:$port/" > /dev/null
  perf record -q -e cpu-clock -C 0 -g -o "$OUT/$who.perf" -- \
    taskset -c 1 wrk -t1 -c50 -d5s "http://127.0.0.1:$port/" > "$OUT/$who.wrk" 2>&1
  echo "== $who: $(grep Requests/sec "$OUT/$who.wrk")"
  perf report -i "$OUT/$who.perf" --no-children --sort comm,dso -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -5
  # Syscalls per request: every thread of the proxy under strace for 3 s.
  if [ $who = nginx ]; then pids=$(pgrep -P $NGINX); else pids=$(ls /proc/$TP/task); fi
  args=(); for p in $pids; do args+=(-p "$p"); done
  strace -c -f "${args[@]}" -o "$OUT/$who.strace" 2>/dev/null &
  SP=$!
  sleep 0.5
  taskset -c 1 wrk -t1 -c50 -d3s "http://127.0.0.1:$port/" > "$OUT/$who.strace.wrk"
  kill -INT $SP; wait $SP
  echo "   $(grep 'requests in' "$OUT/$who.strace.wrk") (under strace)"
  head -8 "$OUT/$who.strace"
done
echo "raw results: $OUT"
