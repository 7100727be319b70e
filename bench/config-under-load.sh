#!/usr/bin/env bash
# What a POST /config costs the proxy: wrk on a plain route for DURATION seconds, first with
# the Admin API idle, then while POST /config of each CONFIG is sent in a loop (a deeply
# nested 200 KB YAML, then a valid config of 20k services; each run in the same process; the
# posting client runs on the load CPU, at most ten POSTs a second). The whole gateway process
# (workers, Admin API and config loads) is pinned to the proxy CPU, as in the other scripts.
# Reports proxy RPS and p99 of both runs and the ratio, per binary, so an older build can be
# measured beside the current one in the same run:
#   BINS="/tmp/turnpike-before target/release/turnpike" bench/config-under-load.sh [DURATION]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
DURATION=${1:-10}
BINS=${BINS:-$ROOT/target/release/turnpike}
W=$(mktemp -d)
BENCH_TMP+=("$W")
start_upstream
python3 - "$W" <<'PY'
import pathlib, sys
w = pathlib.Path(sys.argv[1])
d = 100_000
(w / "deep.yml").write_text('_format_version: "3.0"\nservices: ' + '[' * d + ']' * d + '\n')
lines = ['_format_version: "3.0"', 'services:',
         '- name: plain\n  url: http://127.0.0.1:9001\n  routes:\n  - name: plain\n    paths: [/]']
for i in range(20_000):
    lines.append(f'- name: s{i}\n  url: http://127.0.0.1:9001\n  routes:\n  - name: r{i}\n    paths: [/s{i}]')
(w / "large.yml").write_text('\n'.join(lines) + '\n')
(w / "plain.yml").write_text('_format_version: "3.0"\nservices:\n- name: plain\n  url: http://127.0.0.1:9001\n  routes:\n  - name: plain\n    paths: [/]\n')
PY
p99() { awk '/ 99%/ {print $2}'; }
rps() { awk '/Requests\/sec/ {print $2}'; }
printf '| binary | admin load | RPS | p99 | RPS vs idle | POST /config answered |\n|---|---|---:|---:|---:|---|\n'
for BIN in $BINS; do
  PORT=$((20000 + RANDOM % 10000)); ADMIN=$((PORT + 1))  # below the ephemeral range (32768-)
  TURNPIKE_PREFIX=$W/prefix-$PORT TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$W/plain.yml \
    TURNPIKE_PROXY_LISTEN=127.0.0.1:$PORT TURNPIKE_ADMIN_LISTEN=127.0.0.1:$ADMIN \
    TURNPIKE_NGINX_WORKER_PROCESSES=1 taskset -c "$PROXY_CPUS" "$BIN" start >"$W/log-$PORT" 2>&1 &
  BENCH_PIDS+=($!)
  wait_port "$ADMIN"
  wait_port "$PORT"
  idle=$(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/" 2>&1)
  base_rps=$(echo "$idle" | rps)
  printf '| %s | none | %s | %s | 1.00 | - |\n' "$(basename "$BIN")" "$base_rps" "$(echo "$idle" | p99)"
  # control: the same client sending deep.yml to the upstream nginx instead (what the client
  # costs the load CPU, with no work for the gateway's Admin API).
  for cfg in control deep large; do
    url="http://127.0.0.1:$ADMIN/config" file=$cfg
    if [ "$cfg" = control ]; then url="http://127.0.0.1:9001/" file=deep; fi
    (
      end=$((SECONDS + DURATION))
      codes=""
      while [ $SECONDS -lt $end ]; do
        # The client on the load CPU, ten POSTs a second at most: the admin work is the
        # gateway's, not curl's.
        codes+="$(taskset -c "$LOAD_CPUS" curl -s -o /dev/null -w '%{http_code} ' --max-time 120 \
          "$url" -H 'content-type: text/yaml' --data-binary "@$W/$file.yml")"
        sleep 0.1
      done
      echo "$codes" | tr ' ' '\n' | grep -v '^$' | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}' >"$W/codes-$cfg"
    ) &
    poster=$!
    loaded=$(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${DURATION}s" --latency "http://127.0.0.1:$PORT/" 2>&1)
    wait $poster || true
    r=$(echo "$loaded" | rps)
    printf '| %s | %s in a loop | %s | %s | %.2f | %s |\n' "$(basename "$BIN")" \
      "$([ "$cfg" = control ] && echo "control: deep.yml POSTed to the upstream" || echo "POST /config $cfg.yml")" "$r" \
      "$(echo "$loaded" | p99)" "$(python3 -c "print($r / $base_rps)")" "$(cat "$W/codes-$cfg")"
    # Back to the plain config before the next run.
    curl -s -o /dev/null "http://127.0.0.1:$ADMIN/config" -H 'content-type: text/yaml' --data-binary "@$W/plain.yml"
  done
  kill "${BENCH_PIDS[-1]}" 2>/dev/null || true
done
