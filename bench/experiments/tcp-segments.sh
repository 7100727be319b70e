#!/usr/bin/env bash
# TCP segments per proxied request, nginx beside Turnpike: the machine's Tcp InSegs/OutSegs
# counters (/proc/net/snmp, every socket: client, proxy and upstream sides together) around a
# `wrk -t1 -c50` run, divided by the requests served. Four segments (request and response on
# each of the two connections, ACKs riding on them) is the floor; a proxy that sends more
# (split writes, pure ACKs) costs both CPUs kernel time that user-space figures do not show.
# Layout of ../shared/bench-reference/README.md: proxy (one worker) on CPU 0, upstream and wrk
# on CPU 1. Nothing else should use the network meanwhile.
# Usage: bench/experiments/tcp-segments.sh [ROUNDS] [DURATION]   (needs nginx, wrk, python3)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
ROUNDS=${1:-2}
DUR=${2:-4s}
bench_begin tcp-segments
start_upstream 1
ngx_conf "$W/nginx" 8002
taskset -c 0 nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;' &
BENCH_PIDS+=($!)
wait_port 8002
turnpike_env "$W/tp"
start_turnpike "$OUT/raw/turnpike.log"
# InSegs and OutSegs: fields 11 and 12 of the second Tcp: line.
segs() { awk '/^Tcp:/ {if (h) {print $11, $12} else h=1}' /proc/net/snmp; }
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; commit $(cat "$OUT/commit"); wrk -t1 -c50 -d$DUR"
  echo
  echo "| round | proxy | requests | segments in / request | segments out / request |"
  echo "|---|---|---:|---:|---:|"
  for round in $(seq 1 "$ROUNDS"); do
    for p in nginx:8002 turnpike:8000; do
      name=${p%%:*} port=${p##*:}
      taskset -c 1 wrk -t1 -c50 -d1s "http://127.0.0.1:$port/" > /dev/null
      read -r i1 o1 < <(segs)
      taskset -c 1 wrk -t1 -c50 -d"$DUR" "http://127.0.0.1:$port/" > "$OUT/raw/$name-$round.txt"
      read -r i2 o2 < <(segs)
      n=$(awk '/requests in/ {print $1}' "$OUT/raw/$name-$round.txt")
      python3 -c "print('| $round | $name | {:,} | {:.2f} | {:.2f} |'.format($n, ($i2 - $i1) / $n, ($o2 - $o1) / $n))"
    done
  done
} | tee "$OUT/summary.md"
echo "raw results: $OUT"
