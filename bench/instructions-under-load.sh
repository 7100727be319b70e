#!/usr/bin/env bash
# Instructions per request under load: the proxy under `valgrind --tool=callgrind` (one worker,
# CPU 0) while `wrk -t1 -c50` (CPU 1) keeps 50 keep-alive connections busy for DURATION;
# (Ir(load run) - Ir(a run serving one request)) / requests served. bench/instructions.sh counts
# over one connection, where every request waits in epoll and parks the runtime; with 50
# connections a wake-up serves many requests, as in the RPS runs. Under valgrind the proxy is
# the bottleneck by far, so the figure does not depend on the load side.
# Cases: plain (Turnpike beside the nginx reference) and ka-rl (key-auth + rate-limiting, one
# route and one consumer, beside the nginx + Lua reference of ../shared/bench-reference/).
# Usage: bench/instructions-under-load.sh [DURATION] [CASES]   e.g. bench/instructions-under-load.sh 20s "plain ka-rl"
# Prints one line per case and proxy: "<case> <proxy> <requests> <instructions/request>".
set -euo pipefail
source "$(dirname "$0")/lib.sh"
DUR=${1:-20s}
CASES=${2:-plain ka-rl}
bench_begin instructions-under-load
start_upstream 1
ngx_conf "$W/nginx" 8000
ngx_lua_conf "$W/ngxlua" 8000
turnpike_env "$W/tp"
printf '%s\n' '_format_version: "3.0"' \
  'services: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/], plugins: [{name: key-auth}, {name: rate-limiting, config: {year: 1000000000000, limit_by: consumer}}]}]}]' \
  'consumers: [{username: c0, keyauth_credentials: [{key: key-0}]}]' > "$W/ka-rl.yml"

# count NAME HEADER LOAD CMD...: Ir of CMD under callgrind serving one request, or (LOAD=1) one
# request and then DURATION of wrk; prints "requests Ir".
count() {
  local name=$1 header=$2 load=$3
  shift 3
  taskset -c 0 valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$W/cg.$name.$load" "$@" \
    > "$W/$name.$load.log" 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  local hdr=()
  [ -n "$header" ] && hdr=(-H "$header")
  local n=1
  curl -sf -o /dev/null "${hdr[@]}" http://127.0.0.1:8000/
  if [ "$load" = 1 ]; then
    taskset -c 1 wrk -t1 -c50 -d"$DUR" "${hdr[@]}" http://127.0.0.1:8000/ > "$OUT/raw/$name.wrk"
    grep -q "Non-2xx" "$OUT/raw/$name.wrk" && { echo "$name: non-2xx responses under load" >&2; exit 1; }
    n=$((1 + $(awk '/requests in/ {print $1}' "$OUT/raw/$name.wrk")))
  fi
  sleep 1
  kill -TERM $vp 2>/dev/null || true
  wait $vp 2>/dev/null || true
  echo "$n $(grep -E '^(summary|totals):' "$W/cg.$name.$load" | head -1 | awk '{print $2}')"
}
per_request() { # case proxy header cmd...
  local c=$1 p=$2 h=$3
  shift 3
  read -r n0 i0 < <(count "$c-$p" "$h" 0 "$@")
  read -r n1 i1 < <(count "$c-$p" "$h" 1 "$@")
  echo "$c $p $((n1 - n0)) $(((i1 - i0) / (n1 - n0)))"
  echo "| $c | $p | $((n1 - n0)) | $(((i1 - i0) / (n1 - n0))) |" >> "$OUT/summary.md"
}
printf '%s\n' "commit $(cat "$OUT/commit"); wrk -t1 -c50 -d$DUR against the proxy under callgrind" "" \
  "| case | proxy | requests | instructions / request |" "|---|---|---:|---:|" > "$OUT/summary.md"
NGX=(nginx -g 'daemon off; master_process off;' -e /dev/null)
for c in $CASES; do
  case $c in
    plain)
      TURNPIKE_DECLARATIVE_CONFIG=$W/tp/kong.yml per_request plain turnpike "" "$BIN" start
      per_request plain nginx "" "${NGX[@]}" -c "$W/nginx/nginx.conf" -p "$W/nginx" ;;
    ka-rl)
      TURNPIKE_DECLARATIVE_CONFIG=$W/ka-rl.yml per_request ka-rl turnpike "apikey: key-0" "$BIN" start
      per_request ka-rl nginx-lua "apikey: key1" "${NGX[@]}" -c "$W/ngxlua/nginx.conf" -p "$W/ngxlua" ;;
    *) echo "unknown case $c" >&2; exit 1 ;;
  esac
done
echo "raw results: $OUT"
