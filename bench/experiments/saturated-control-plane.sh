#!/usr/bin/env bash
# What a saturated proxy leaves the control plane and the health checker: one Turnpike node on
# SQLite (two workers, unpinned: both cores taken by wrk -c128 through the proxy to the
# reference upstream), an upstream with active health checks every 0.2 s (0.2 s timeout, one
# timeout makes a target unhealthy) on the healthy reference nginx. While wrk runs, ROUNDS
# times: curl's time for `GET /status` and `POST /consumers` on the Admin API, and the time
# from a new route's `POST` to the proxy's first 200 on it (curl processes started in a loop,
# so it includes their start-up on the busy cores); at the end, wrk's RPS, the node's threads'
# nice values, and how many health transitions the checker logged (a healthy target: any is a
# false one). Runs each binary of BINS in turn (default: this checkout's release build); a
# binary written `path:idle` runs with its control plane (the main thread, the config builder
# and the SQLite connection threads at nice 19) moved to SCHED_IDLE.
# Usage: [BINS="a b:idle"] bench/experiments/saturated-control-plane.sh [SECS] [ROUNDS]
#        (needs nginx, wrk, curl)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
SECS=${1:-20}
ROUNDS=${2:-8}
bench_begin saturated-control-plane
BINS=${BINS:-$BIN}
ports_free 18000 18001
start_upstream "$LOAD_CPUS"
A=127.0.0.1:18001
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

one() { # binary[:idle] run
  local bin=${1%:idle} idle=0 d f
  if [ "$bin" != "$1" ]; then idle=1; fi
  d=$W/$2-$(basename "$1") f=$OUT/raw/$2-$(basename "$1").txt
  mkdir -p "$d"
  start_sqlite_node "$bin" "$d" info
  local node=$NODE
  if [ $idle = 1 ]; then
    local t
    for t in /proc/$node/task/*; do
      if [ "${t##*/}" = "$node" ] || [ "$(awk '{print $19}' "$t/stat")" = 19 ]; then
        chrt --idle -p 0 "${t##*/}"
      fi
    done
  fi
  curl -sf -o /dev/null -XPOST $A/upstreams -H 'content-type: application/json' -d '{"name":"u","healthchecks":{"active":{"timeout":0.2,
    "healthy":{"interval":0.2,"successes":1},"unhealthy":{"interval":0.2,"timeouts":1,"tcp_failures":1,"http_failures":1}}}}'
  curl -sf -o /dev/null -XPOST $A/upstreams/u/targets -d target=127.0.0.1:9001
  curl -sf -o /dev/null -XPOST $A/services -d name=s -d host=u
  curl -sf -o /dev/null -XPOST $A/services/s/routes -d paths=/
  until [ "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18000/)" = 200 ]; do sleep 0.05; done
  {
    echo "binary $bin$([ $idle = 1 ] && echo ', control plane SCHED_IDLE')"
    echo "threads (name nice): $(for t in /proc/$node/task/*; do echo "$(cat "$t/comm") $(awk '{print $19}' "$t/stat")"; done | sort | uniq -c | awk '{printf "%s%s x%s; ", $2, " " $3, $1}')"
    wrk -t2 -c128 -d"${SECS}s" http://127.0.0.1:18000/ > "$d/wrk.txt" 2>&1 &
    local wrk=$! t0
    sleep 3
    for i in $(seq 1 "$ROUNDS"); do
      local status post
      status=$(curl -s -o /dev/null -w '%{time_total}' $A/status)
      post=$(curl -s -o /dev/null -w '%{time_total}' -XPOST $A/consumers -d username=c$i)
      t0=$(date +%s%N); curl -s -o /dev/null -XPOST $A/services/s/routes -d paths=/new$i
      until [ "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18000/new$i)" = 200 ]; do :; done
      echo "round $i: GET /status ${status}s; POST /consumers ${post}s; route live after $(ms "$t0") ms"
      sleep 1
    done
    wait $wrk
    echo "wrk $(grep Requests/sec "$d/wrk.txt")"
    echo "health transitions logged: $(grep -c 'is now' "$d/node.log" || true)"
  } > "$f"
  kill $node; wait $node 2>/dev/null || true
}

n=0
for b in $BINS; do n=$((n + 1)); one "$b" "$n"; done
cat "$OUT"/raw/*.txt | tee "$OUT/summary.txt"
