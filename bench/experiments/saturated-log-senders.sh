#!/usr/bin/env bash
# What a saturated proxy leaves its log plugins' threads: one Turnpike node on SQLite (two
# workers, unpinned: both cores taken by wrk -c128 through the proxy to the reference upstream)
# with file-log (to a file under the run's folder) and http-log (batches of up to 100 entries
# to the reference nginx) on every request, both added through the Admin API, so that the
# config builder builds them. After wrk: the requests wrk counted, the lines in the file, and
# the node's `turnpike_log_entries_{sent,dropped}_total`; and the priority (nice) the log
# threads ran at. Runs each binary of BINS in turn (default: this checkout's release build).
# Usage: [BINS="a b"] bench/experiments/saturated-log-senders.sh [SECS]
#        (needs nginx, wrk, curl)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
SECS=${1:-20}
bench_begin saturated-log-senders
BINS=${BINS:-$BIN}
ports_free 18000 18001
start_upstream "$LOAD_CPUS"
A=127.0.0.1:18001

one() { # binary run
  local bin=$1 d f
  d=$W/$2-$(basename "$1") f=$OUT/raw/$2-$(basename "$1").txt
  mkdir -p "$d"
  start_sqlite_node "$bin" "$d" warn
  local node=$NODE
  curl -sf -o /dev/null -XPOST $A/services -d name=s -d url=http://127.0.0.1:9001
  curl -sf -o /dev/null -XPOST $A/services/s/routes -d paths=/
  curl -sf -o /dev/null -XPOST $A/plugins -d name=file-log -d config.path="$d/requests.log"
  curl -sf -o /dev/null -XPOST $A/plugins -d name=http-log -d config.http_endpoint=http://127.0.0.1:9001/log \
    -d config.queue.max_batch_size=100
  until [ "$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18000/)" = 200 ] && [ -s "$d/requests.log" ]; do sleep 0.05; done
  local before
  before=$(wc -l < "$d/requests.log")
  wrk -t2 -c128 -d"${SECS}s" http://127.0.0.1:18000/ > "$d/wrk.txt" 2>&1
  sleep 3
  {
    echo "binary $bin"
    echo "log threads (name nice): $(for t in /proc/$node/task/*; do case $(cat "$t/comm") in file-log | http-log) echo "$(cat "$t/comm") $(awk '{print $19}' "$t/stat")" ;; esac; done | tr '\n' ';')"
    echo "wrk $(grep Requests/sec "$d/wrk.txt"); $(grep 'requests in' "$d/wrk.txt" | sed 's/^ *//')"
    echo "file-log lines written during wrk: $(( $(wc -l < "$d/requests.log") - before ))"
    curl -s $A/metrics | grep -E '^turnpike_log_entries_(sent|dropped)_total' | tr '\n' ';'
    echo
  } > "$f"
  kill $node; wait $node 2>/dev/null || true
}

n=0
for b in $BINS; do n=$((n + 1)); one "$b" "$n"; done
cat "$OUT"/raw/*.txt | tee "$OUT/summary.txt"
