#!/usr/bin/env bash
# Operators' own plugins (#49): the same access-phase work (read a header, look its value up,
# set an upstream header) done by a bundled Rust plugin (request-transformer, the header
# through a template), by a Lua plugin (bench/plugins/kong/plugins/bench-lookup: kong.cache),
# by a Go plugin over Kong's plugin-server protocol (bench/plugins/go-lookup: Kong's Go PDK,
# its server started by the gateway and pinned with it), and by nginx + Lua (access_by_lua,
# a Lua table), beside plain proxying, and the Lua plugin again with lua_time_budget = 0 (no
# budget: LuaJIT's compiler on); all in one run, rounds interleaved.
#
# RPS: the proxy pinned to CPU 0 with one worker (the Go plugin server too: it inherits the
# gateway's CPU), upstream and wrk on CPU 1, `wrk -t1 -c50` with `x-key: k1`, ROUNDS rounds of
# DUR each, median. Instructions per request: bench/instructions.sh (the gateway's own; the Go
# server's are not counted there, which RPS shows).
# Usage: bench/custom-plugins.sh [ROUNDS] [DUR] [N]   (needs nginx with the Lua module, wrk,
# valgrind, go)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ROUNDS=${1:-3}
DUR=${2:-8s}
N=${3:-5000}
bench_begin custom-plugins
ports_free 8000 8002
start_upstream "$LOAD_CPUS"

# The Go plugin server, built from the module proxy.
GOBIN=$W/go-lookup
(cd bench/plugins/go-lookup && GOFLAGS=-mod=mod PATH="$PATH:/usr/local/go/bin" go build -o "$GOBIN" .)

head='_format_version: "3.0"
services:
- name: u
  url: http://127.0.0.1:9001
  routes:
  - name: r
    paths: [/]'
cfg() { printf '%s\n%s\n' "$head" "$2" > "$W/$1.yml"; }
cfg plain ""
cfg bundled '    plugins:
    - name: request-transformer
      config: {add: {headers: ["x-up:v-$(headers.x_key)"]}}'
cfg lua '    plugins:
    - name: bench-lookup'
cp "$W/lua.yml" "$W/lua-jit.yml"
cfg go '    plugins:
    - name: go-lookup'

# The environment of each case (CASE_ENV): which plugins the node loads and where they are.
case_env() {
  CASE_ENV=(BENCH_CASE="$1")
  case $1 in
    lua) CASE_ENV+=(TURNPIKE_PLUGINS=bundled,bench-lookup
      "TURNPIKE_LUA_PACKAGE_PATH=$ROOT/bench/plugins/?.lua;;") ;;
    # The same plugin with no time budget (lua_time_budget = 0): LuaJIT's compiler on.
    lua-jit) CASE_ENV+=(TURNPIKE_PLUGINS=bundled,bench-lookup TURNPIKE_LUA_TIME_BUDGET=0
      "TURNPIKE_LUA_PACKAGE_PATH=$ROOT/bench/plugins/?.lua;;") ;;
    go) CASE_ENV+=(TURNPIKE_PLUGINS=bundled,go-lookup TURNPIKE_PLUGINSERVER_NAMES=go-lookup
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_SOCKET=$W/go-lookup.socket"
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_START_CMD=$GOBIN -kong-prefix $W"
      "TURNPIKE_PLUGINSERVER_GO_LOOKUP_QUERY_CMD=$GOBIN -dump") ;;
  esac
}

# nginx + Lua doing the same work: the header, a Lua table looked up, the upstream header.
NG=$W/nginx-lua
mkdir -p "$NG"/{cbt,pt,ft,ut,st}
sed -e "s|/tmp/bench/@NAME@|$NG|g" -e "s/@NAME@/nginx-lua/g" -e "s/@PORT@/8002/" \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' \
    -e 's/@ACCESS@/access_by_lua_block { local k = ngx.var.http_x_key or "none" local v = cache[k] if not v then v = "v-" .. k cache[k] = v end ngx.req.set_header("x-up", v) }/' \
    -e 's/@EXTRA_HTTP@/init_by_lua_block { cache = {} }/' \
    -e 's|@EXTRA_MAIN@|load_module /usr/lib/nginx/modules/ndk_http_module.so; load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;|' \
    "$SHARED/nginx_proxy.conf.tmpl" > "$NG/nginx.conf"
ngx_workers "$NG"

measure() { # name port round
  taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d2s -H "x-key: k1" "http://127.0.0.1:$2/" > /dev/null
  taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"$DUR" -H "x-key: k1" "http://127.0.0.1:$2/" > "$OUT/raw/$1-$3.txt"
}
turnpike_case() { # case round
  turnpike_env "$W/tp-$1"
  export TURNPIKE_DECLARATIVE_CONFIG=$W/$1.yml
  case_env "$1"
  env "${CASE_ENV[@]}" taskset -c "$PROXY_CPUS" "$BIN" start > "$W/tp-$1.log" 2>&1 &
  local pid=$!
  BENCH_PIDS+=($pid)
  wait_port 8000
  # The plugin must have run: the upstream's answer is the same, so check the gateway's own.
  curl -sf -H "x-key: k1" http://127.0.0.1:8000/ > /dev/null
  measure "$1" 8000 "$2"
  stop_pid "$pid"
  sleep 0.5
}
for r in $(seq 1 "$ROUNDS"); do
  for c in plain bundled lua lua-jit go; do turnpike_case "$c" "$r"; done
  start_nginx "$NG" 8002
  measure nginx-lua 8002 "$r"
  stop_pid "$NGX"
done

# Instructions per request of the gateway in each case.
declare -A IPR
for c in plain bundled lua lua-jit go; do
  case_env "$c"
  IPR[$c]=$(env "${CASE_ENV[@]}" CONFIG="$W/$c.yml" HEADERS="x-key: k1" BENCH_BIN="$BIN" bench/instructions.sh "$N")
done

python3 - "$OUT" "$ROUNDS" "${IPR[plain]}" "${IPR[bundled]}" "${IPR[lua]}" "${IPR[lua-jit]}" "${IPR[go]}" <<'PY'
import re, sys, statistics, pathlib, subprocess, platform
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
ipr = dict(zip(["plain", "bundled", "lua", "lua-jit", "go"], sys.argv[3:8]))
def rps(p):
    return float(re.search(r"Requests/sec:\s+([\d.]+)", p.read_text()).group(1))
med = {}
lines = []
cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
lines.append(f"machine: {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} CPUs, kernel {platform.release()}")
lines.append("")
lines.append("| case | RPS (median) | rounds | instructions / request (gateway) |")
lines.append("|---|---:|---|---:|")
names = {"plain": "plain proxying", "bundled": "bundled Rust plugin (request-transformer)",
         "lua": "Lua plugin (kong.cache), lua_time_budget on (LuaJIT interpreter)",
         "lua-jit": "the same, lua_time_budget = 0 (LuaJIT compiler)",
         "go": "Go plugin (plugin server, ProtoBuf)",
         "nginx-lua": "nginx + Lua (access_by_lua)"}
for c in ["plain", "bundled", "lua", "lua-jit", "go", "nginx-lua"]:
    vals = [rps(out / "raw" / f"{c}-{r}.txt") for r in range(1, rounds + 1)]
    med[c] = statistics.median(vals)
    lines.append(f"| {names[c]} | {med[c]:,.0f} | {', '.join(f'{v:,.0f}' for v in vals)} | {ipr.get(c, '—')} |")
lines.append("")
cost = lambda c: int(ipr[c]) - int(ipr["plain"])
lines.append(f"Lua plugin / bundled plugin, instructions over plain: {cost('lua')} / {cost('bundled')} = {cost('lua') / max(cost('bundled'), 1):.2f}x (budget off: {cost('lua-jit')} = {cost('lua-jit') / max(cost('bundled'), 1):.2f}x)")
lines.append(f"Lua plugin RPS / nginx + Lua RPS: {med['lua'] / med['nginx-lua']:.2f}x (budget off: {med['lua-jit'] / med['nginx-lua']:.2f}x); Go plugin RPS / Lua plugin RPS: {med['go'] / med['lua']:.2f}x")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "raw results: $OUT"
