#!/usr/bin/env bash
# User and kernel CPU time per request of the proxy worker, Turnpike beside the nginx reference,
# and the syscalls each makes per request. Layout of ../shared/bench-reference/README.md: the
# proxy (one worker) on CPU 0, the upstream and `wrk -t1 -c50` on CPU 1. Per proxy and round: a
# 1 s warm-up, then utime/stime (10 ms ticks) of the worker's threads from /proc/<pid>/task/*/stat
# around a DURATION run; then `strace -c -f` over a 2 s run.
# Usage: bench/experiments/cpu-split.sh [ROUNDS] [DURATION]   (needs nginx, wrk, strace, python3)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
ROUNDS=${1:-2}
DUR=${2:-5s}
bench_begin cpu-split
start_upstream 1

ngx_conf "$W/nginx" 8002
taskset -c 0 nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;' &
NGM=$!
BENCH_PIDS+=($NGM)
wait_port 8002
NGW=$(pgrep -P "$NGM" | head -1)
turnpike_env "$W/tp"
start_turnpike "$OUT/raw/turnpike.log"

ticks() { awk '{u += $14; s += $15} END {print u, s}' /proc/"$1"/task/*/stat; }
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; commit $(cat "$OUT/commit"); wrk -t1 -c50 -d$DUR"
  echo
  echo "| round | proxy | requests | user ticks | kernel ticks | user µs / request | kernel µs / request |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  for r in $(seq 1 "$ROUNDS"); do
    for x in "nginx 8002 $NGW" "turnpike 8000 $TP"; do
      set -- $x
      taskset -c 1 wrk -t1 -c50 -d1s "http://127.0.0.1:$2/" > /dev/null
      read -r u0 s0 < <(ticks "$3")
      n=$(taskset -c 1 wrk -t1 -c50 -d"$DUR" "http://127.0.0.1:$2/" | tee "$OUT/raw/$1-round$r.txt" | awk '/requests in/ {print $1}')
      read -r u1 s1 < <(ticks "$3")
      python3 -c "
u, s, n = $u1 - $u0, $s1 - $s0, $n
print(f'| $r | $1 | {n:,} | {u} | {s} | {u * 1e4 / n:.2f} | {s * 1e4 / n:.2f} |')"
    done
  done
  echo
  echo "Syscalls per request (strace -c -f over a 2 s run):"
  for x in "nginx 8002 $NGW" "turnpike 8000 $TP"; do
    set -- $x
    timeout -s INT 3 strace -c -f -p "$3" -o "$OUT/raw/strace-$1.txt" 2>/dev/null &
    SP=$!
    sleep 0.5
    n=$(taskset -c 1 wrk -t1 -c50 -d2s "http://127.0.0.1:$2/" | awk '/requests in/ {print $1}')
    wait "$SP" || true
    python3 - "$1" "$n" "$OUT/raw/strace-$1.txt" <<'PY'
import sys
name, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
        calls[f[-1]] = int(f[3])
top = sorted(calls.items(), key=lambda kv: -kv[1])[:5]
print(f"- {name}: " + ", ".join(f"{c / n:.2f} {k}" for k, c in top) + f" (of {n:,} requests)")
PY
  done
} | tee "$OUT/summary.md"
echo "raw results: $OUT"
