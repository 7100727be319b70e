#!/usr/bin/env bash
# Two Turnpike builds (OLD, NEW) alternated, ROUNDS rounds, on the Go plugin case of
# bench/custom-plugins.sh (bench/plugins/go-lookup through its plugin server, one worker and
# the server on CPU 0, upstream and wrk on CPU 1, `wrk -t1 -c50 -d8s` with `x-key: k1`).
# Usage: OLD=<binary> NEW=<binary> bench/experiments/go-plugin-ab.sh [ROUNDS]
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
ROUNDS=${1:-3}
W=$(mktemp -d /tmp/go-plugin-ab.XXXX)
BENCH_TMP+=("$W")
(cd bench/plugins/go-lookup && GOFLAGS=-mod=mod PATH="$PATH:/usr/local/go/bin" go build -o "$W/go-lookup" .)
start_upstream "$LOAD_CPUS"
printf '_format_version: "3.0"\nservices:\n- name: u\n  url: http://127.0.0.1:9001\n  routes:\n  - name: r\n    paths: [/]\n    plugins:\n    - name: go-lookup\n' > "$W/go.yml"
for r in $(seq 1 "$ROUNDS"); do
  for b in old new; do
    BIN=$OLD; [ "$b" = new ] && BIN=$NEW
    turnpike_env "$W/tp-$b-$r"
    export TURNPIKE_DECLARATIVE_CONFIG=$W/go.yml
    env TURNPIKE_PLUGINS=bundled,go-lookup TURNPIKE_PLUGINSERVER_NAMES=go-lookup \
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_SOCKET=$W/go-lookup.socket" \
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_START_CMD=$W/go-lookup -kong-prefix $W" \
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_QUERY_CMD=$W/go-lookup -dump" \
      taskset -c "$PROXY_CPUS" "$BIN" start > "$W/$b-$r.log" 2>&1 &
    pid=$!
    BENCH_PIDS+=($pid)
    wait_port 8000
    curl -sf -H "x-key: k1" http://127.0.0.1:8000/ > /dev/null
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d2s -H "x-key: k1" http://127.0.0.1:8000/ > /dev/null
    echo "$b round $r: $(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d8s -H 'x-key: k1' http://127.0.0.1:8000/ | grep Requests/sec)"
    stop_pid "$pid"
    sleep 0.5
  done
done
