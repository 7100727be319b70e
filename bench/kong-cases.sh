#!/usr/bin/env bash
# Kong's eight published performance cases, over HTTP and HTTPS, Turnpike beside the reference
# proxies of ../shared/bench-reference/ measured in the same run on the same machine:
#   plain proxy | rate limiting | key-auth + rate limiting | basic-auth + rate limiting,
#   each with 1 route / 1 consumer and with 100 routes / 100 consumers.
# Rate limits are yearly and high enough never to refuse (the cost of counting, not refusing).
# In the 100-route cases every request picks its route (and consumer) from a normal
# distribution over the 100 (mean 49.5, standard deviation 20, clamped), as Kong's k6 script
# spreads its traffic; wrk draws it in its Lua `request()`.
# References: nginx as a plain reverse proxy for every case (the floor any gateway pays), and
# nginx + Lua emulating key-auth + rate-limiting (kong_emul.lua) for the key-auth cases.
#
# Layout (../shared/bench-reference/README.md): the proxy under test pinned to CPU 0 with one
# worker; the upstream (nginx) and `wrk -t1 -c50` on CPU 1; 2 s warm-up, RUNS runs of DURATION
# per case and proxy, interleaved run by run (each run goes to every proxy in turn, all of
# them running); the median run by RPS. With more CPUs (bench/lib.sh) the
# proxies get the first half with one worker per CPU, and the upstream and wrk (one thread
# per CPU, 50 connections per proxy worker) the rest. Instruction counts always use one worker. wrk's Lua `done()` prints the latency
# percentiles (50 … 99.99) that make the table and the percentile-spectrum plots.
#
# QUOTA=P: each proxy of the cases limited to P% of one CPU by a cgroup (bench/lib.sh), so that
# the proxy is the only bottleneck: on 2 CPUs the one running wrk and the upstream is itself
# ~99% busy in the layout above (bench/experiments/same-work.sh).
#
# Usage: [INSTRUCTIONS=N] [EXTRA=1] [CASES="..."] [QUOTA=P] bench/kong-cases.sh [RUNS] [DURATION] [PROTOCOLS]
#   e.g. INSTRUCTIONS=5000 bench/kong-cases.sh 3 10s "http https"
# Needs nginx, libnginx-mod-http-lua, wrk, openssl, python3 (+ python3-matplotlib for the plots):
# TURNPIKE_SETUP_BENCH=1 scripts/setup.sh installs them.
# Results: bench/results/kong-cases-<date>/ (every run's raw wrk output, summary.md, plots).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
# What the runs need, checked before anything starts (a missing wrk used to fail a run with
# the proxy left running).
for tool in wrk nginx openssl; do
  command -v "$tool" > /dev/null || { echo "$tool is missing: TURNPIKE_SETUP_BENCH=1 scripts/setup.sh installs it" >&2; exit 1; }
done
RUNS=${1:-3}
DUR=${2:-10s}
PROTOCOLS=${3:-http https}
bench_begin kong-cases${QUOTA:+-quota$QUOTA}
[ -n "$QUOTA" ] && echo "$(cat "$OUT/commit"); each proxy limited to $QUOTA% of one CPU (cgroup)" > "$OUT/commit"
start_upstream "$LOAD_CPUS"

# A self-signed certificate for both proxies' HTTPS listeners.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
  -keyout "$W/key.pem" -out "$W/cert.pem" 2>/dev/null

python3 - "$W" <<'PY'
import base64, pathlib, sys
w = pathlib.Path(sys.argv[1])
head = '_format_version: "3.0"\nservices:\n- name: s\n  url: http://127.0.0.1:9001\n  routes:\n'
rl = "    - name: rate-limiting\n      config: {year: 1000000000000, limit_by: consumer}\n"
auth = {"plain": "", "rl": "", "ka-rl": "    - name: key-auth\n", "ba-rl": "    - name: basic-auth\n"}
def consumers(kind, n):
    if kind == "ka-rl":
        return "consumers:\n" + "".join(f"- username: c{i}\n  keyauth_credentials: [{{key: key-{i}}}]\n" for i in range(n))
    if kind == "ba-rl":
        return "consumers:\n" + "".join(f"- username: u{i}\n  basicauth_credentials: [{{username: u{i}, password: pw-{i}}}]\n" for i in range(n))
    return ""
for kind in auth:
    plugins = auth[kind] + (rl if kind != "plain" else "")
    pl = ("    plugins:\n" + plugins) if plugins else ""
    (w / f"{kind}-1.yml").write_text(head + "  - name: r\n    paths: [/]\n" + pl + consumers(kind, 1))
    routes = "".join(f"  - name: r{i}\n    paths: [/r{i}]\n" + pl for i in range(100))
    (w / f"{kind}-100.yml").write_text(head + routes + consumers(kind, 100))

# The extra cases' configs: 10k plain routes.
(w / "plain-10k.yml").write_text(head + "".join(f"  - name: r{i}\n    paths: [/r{i}]\n" for i in range(10000)))

# wrk scripts: the request of each case, and the percentiles printed at the end.
done = '''
done = function(summary, latency, requests)
  for _, p in ipairs({50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}) do
    io.write(string.format("PCTL %g %d\\n", p, latency:percentile(p)))
  end
  io.write(string.format("PCTL 100 %d\\n", latency.max))
end
'''
normal = '''
local function pick()
  -- Box-Muller: a normal draw around the middle of the 100 routes, clamped.
  local u1, u2 = math.random(), math.random()
  local z = math.sqrt(-2 * math.log(u1 + 1e-12)) * math.cos(2 * math.pi * u2)
  local i = math.floor(49.5 + 20 * z + 0.5)
  if i < 0 then i = 0 elseif i > 99 then i = 99 end
  return i
end
'''
basic = "local creds = {" + ",".join(f'"Basic {base64.b64encode(f"u{i}:pw-{i}".encode()).decode()}"' for i in range(100)) + "}\n"
scripts = {
    "plain-1": 'request = function() return wrk.format("GET", "/") end\n',
    "rl-1": 'request = function() return wrk.format("GET", "/") end\n',
    "ka-rl-1": 'request = function() return wrk.format("GET", "/", {apikey = "key-0"}) end\n',
    "ba-rl-1": basic + 'request = function() return wrk.format("GET", "/", {authorization = creds[1]}) end\n',
    "plain-100": normal + 'request = function() return wrk.format("GET", "/r" .. pick()) end\n',
    "rl-100": normal + 'request = function() return wrk.format("GET", "/r" .. pick()) end\n',
    "ka-rl-100": normal + 'request = function() local i = pick() return wrk.format("GET", "/r" .. i, {apikey = "key-" .. i}) end\n',
    "ba-rl-100": normal + basic + 'request = function() local i = pick() return wrk.format("GET", "/r" .. i, {authorization = creds[i + 1]}) end\n',
    # The nginx + Lua emulation knows keys key1..key99 (key100 is its 429 probe).
    "ngxlua-1": 'request = function() return wrk.format("GET", "/", {apikey = "key1"}) end\n',
    "ngxlua-100": normal + 'request = function() local i = pick() if i > 98 then i = 98 end return wrk.format("GET", "/r" .. i, {apikey = "key" .. (i + 1)}) end\n',
    "nginx-1": 'request = function() return wrk.format("GET", "/") end\n',
    "nginx-100": normal + 'request = function() return wrk.format("GET", "/r" .. pick()) end\n',
    # 10k routes: the same normal draw, scaled (mean 4999.5, sd 2000).
    "plain-10k": normal.replace("49.5 + 20 * z", "4999.5 + 2000 * z").replace("i > 99 then i = 99", "i > 9999 then i = 9999")
        + 'request = function() return wrk.format("GET", "/r" .. pick()) end\n',
}
for name, body in scripts.items():
    (w / f"{name}.lua").write_text(body + done)
PY

# The references: nginx, and nginx + Lua, each with an HTTP and an HTTPS listener.
ngx_tls_conf() { # dir http-port https-port with-lua
  if [ "$4" = lua ]; then ngx_lua_conf "$1" "$2"; else ngx_conf "$1" "$2"; fi
  # The same server again on the HTTPS port.
  sed -i "s|listen 127.0.0.1:$2 backlog=4096;|listen 127.0.0.1:$2 backlog=4096; listen 127.0.0.1:$3 ssl http2 backlog=4096; ssl_certificate $W/cert.pem; ssl_certificate_key $W/key.pem; $NGX_KONG_TLS|" "$1/nginx.conf"
}
ngx_tls_conf "$W/nginx" 8002 8445 plain
ngx_tls_conf "$W/ngxlua" 8003 8446 lua
# nginx without upstream keepalive, for the connection-storm case.
ngx_tls_conf "$W/nginx-noka" 8004 8447 plain
sed -i 's/keepalive 64; keepalive_requests 1000000;//' "$W/nginx-noka/nginx.conf"
start_ngx() { # dir
  in_quota "$(basename "$1")" taskset -c "$PROXY_CPUS" nginx -c "$1/nginx.conf" -p "$1" -e "$1/error.log" -g 'daemon off;' &
  NGX_PID=$!
  BENCH_PIDS+=($NGX_PID)
}

run_wrk() { # label url script run
  local scheme_url=$2
  local conns=$((50 * PROXY_N))
  taskset -c "$LOAD_CPUS" wrk -t"$LOAD_N" -c"$conns" -d2s -s "$3" "$scheme_url" > /dev/null
  taskset -c "$LOAD_CPUS" wrk -t"$LOAD_N" -c"$conns" -d"$DUR" --latency -s "$3" "$scheme_url" > "$OUT/raw/$1-run$4.txt"
}

ports_free 8000 8443 8101 8002 8003 8445 8446
CASES=${CASES-plain-1 plain-100 rl-1 rl-100 ka-rl-1 ka-rl-100 ba-rl-1 ba-rl-100}
for proto in $PROTOCOLS; do
  if [ "$proto" = https ]; then TP_PORT=8443; NGX_PORT=8445; LUA_PORT=8446; else TP_PORT=8000; NGX_PORT=8002; LUA_PORT=8003; fi
  for case in $CASES; do
    n=${case##*-}
    turnpike_env "$W/tp-$case"
    export TURNPIKE_DECLARATIVE_CONFIG=$W/$case.yml
    export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096, 127.0.0.1:8443 ssl http2 reuseport backlog=4096"
    export TURNPIKE_SSL_CERT=$W/cert.pem TURNPIKE_SSL_CERT_KEY=$W/key.pem
    in_quota turnpike taskset -c "$PROXY_CPUS" "$BIN" start > "$W/tp-$case.log" 2>&1 &
    TP=$!
    BENCH_PIDS+=($TP)
    wait_port 8000
    # The references of this case run beside it (nginx always, nginx + Lua for the key-auth
    # cases; idle ones cost nothing), and each run goes to every proxy in turn: a slow spell of
    # the machine then falls on all of them instead of on one proxy's block of runs.
    start_ngx "$W/nginx"; NGX=$NGX_PID; wait_port $NGX_PORT
    LUA=
    if [[ $case == ka-rl-* ]]; then
      start_ngx "$W/ngxlua"; LUA=$NGX_PID; wait_port $LUA_PORT
    fi
    for i in $(seq 1 "$RUNS"); do
      run_wrk "$proto-$case-turnpike" "$proto://127.0.0.1:$TP_PORT/" "$W/$case.lua" "$i"
      run_wrk "$proto-$case-nginx" "$proto://127.0.0.1:$NGX_PORT/" "$W/nginx-$n.lua" "$i"
      if [ -n "$LUA" ]; then
        run_wrk "$proto-$case-nginx-lua" "$proto://127.0.0.1:$LUA_PORT/" "$W/ngxlua-$n.lua" "$i"
      fi
    done
    for p in $TP $NGX $LUA; do kill "$p"; wait "$p" 2>/dev/null || true; done
  done
done

# The extra cases (EXTRA=1): 10k routes, upstream keepalive off (what the default saves: the
# connection storm), HTTP/2 over TLS (oha, 50 connections, one stream each, JSON percentiles).
tp_start() { # config [env...]
  turnpike_env "$W/tp-extra"
  export TURNPIKE_DECLARATIVE_CONFIG=$1
  export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096, 127.0.0.1:8443 ssl http2 reuseport backlog=4096"
  export TURNPIKE_SSL_CERT=$W/cert.pem TURNPIKE_SSL_CERT_KEY=$W/key.pem
  shift
  in_quota turnpike env "$@" taskset -c "$PROXY_CPUS" "$BIN" start > "$W/tp-extra.log" 2>&1 &
  TP=$!
  BENCH_PIDS+=($TP)
  wait_port 8000
}
if [ "${EXTRA:-0}" = 1 ]; then
  for proto in $PROTOCOLS; do
    if [ "$proto" = https ]; then TP_PORT=8443; NGX_PORT=8445; NOKA_PORT=8447; else TP_PORT=8000; NGX_PORT=8002; NOKA_PORT=8004; fi
    tp_start "$W/plain-10k.yml"
    for i in $(seq 1 "$RUNS"); do run_wrk "$proto-plain-10k-turnpike" "$proto://127.0.0.1:$TP_PORT/" "$W/plain-10k.lua" "$i"; done
    kill $TP; wait $TP 2>/dev/null || true
    start_ngx "$W/nginx"; wait_port $NGX_PORT
    for i in $(seq 1 "$RUNS"); do run_wrk "$proto-plain-10k-nginx" "$proto://127.0.0.1:$NGX_PORT/" "$W/plain-10k.lua" "$i"; done
    kill $NGX_PID; wait $NGX_PID 2>/dev/null || true
    tp_start "$W/plain-1.yml" TURNPIKE_UPSTREAM_KEEPALIVE_POOL_SIZE=0
    for i in $(seq 1 "$RUNS"); do run_wrk "$proto-keepalive-off-turnpike" "$proto://127.0.0.1:$TP_PORT/" "$W/plain-1.lua" "$i"; done
    kill $TP; wait $TP 2>/dev/null || true
    start_ngx "$W/nginx-noka"; wait_port $NOKA_PORT
    for i in $(seq 1 "$RUNS"); do run_wrk "$proto-keepalive-off-nginx" "$proto://127.0.0.1:$NOKA_PORT/" "$W/plain-1.lua" "$i"; done
    kill $NGX_PID; wait $NGX_PID 2>/dev/null || true
  done
  OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
  h2() { # label port run
    taskset -c "$LOAD_CPUS" "$OHA" --no-tui --http2 --insecure -c $((50 * PROXY_N)) -p 1 -z 2s "https://127.0.0.1:$2/" > /dev/null 2>&1 || true
    taskset -c "$LOAD_CPUS" "$OHA" --no-tui --http2 --insecure --output-format json -c $((50 * PROXY_N)) -p 1 -z "$DUR" "https://127.0.0.1:$2/" > "$OUT/raw/$1-run$3.json" 2>/dev/null || true
  }
  tp_start "$W/plain-1.yml"
  for i in $(seq 1 "$RUNS"); do h2 h2-plain-1-turnpike 8443 "$i"; done
  kill $TP; wait $TP 2>/dev/null || true
  start_ngx "$W/nginx"; wait_port 8445
  for i in $(seq 1 "$RUNS"); do h2 h2-plain-1-nginx 8445 "$i"; done
  kill $NGX_PID; wait $NGX_PID 2>/dev/null || true
fi

# Instructions per request of each case under callgrind (INSTRUCTIONS=N requests; 0 skips):
# Turnpike, nginx, and nginx + Lua for the key-auth cases, HTTP, one keep-alive connection,
# (Ir(N) - Ir(0)) / N; the 100-route cases cycle over the routes and consumers.
INSTRUCTIONS=${INSTRUCTIONS:-0}
client() { # port kind routes n
  python3 - "$@" <<'PY'
import base64, http.client, sys
port, kind, routes, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = http.client.HTTPConnection("127.0.0.1", port)
for k in range(n):
    i = k % routes
    path = "/" if routes == 1 else f"/r{i}"
    h = {}
    if kind == "ka-rl":
        h["apikey"] = f"key-{i}"
    elif kind == "ba-rl":
        h["authorization"] = "Basic " + base64.b64encode(f"u{i}:pw-{i}".encode()).decode()
    elif kind == "ngxlua":
        h["apikey"] = f"key{min(i, 98) + 1}"
    c.request("GET", path, headers=h); r = c.getresponse(); r.read(); assert r.status == 200, (r.status, path)
PY
}
ir_of() { # file
  grep -E '^(summary|totals):' "$1" | head -1 | awk '{print $2}'
}
callgrind_tp() { # case n
  turnpike_env "$W/cg-tp"
  export TURNPIKE_NGINX_WORKER_PROCESSES=1
  export TURNPIKE_DECLARATIVE_CONFIG=$W/$1.yml TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096"
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$W/cg.tp.$1.$2" "$BIN" start > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  local kind=${1%-*} routes=${1##*-}
  [ "$2" -gt 0 ] && client 8000 "$kind" "$routes" "$2"
  kill -TERM $vp; wait $vp 2>/dev/null || true
  ir_of "$W/cg.tp.$1.$2"
}
callgrind_ngx() { # dir port kind routes n
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$W/cg.ngx.$3.$4.$5" \
    nginx -c "$1/nginx.conf" -p "$1" -e "$1/error.log" -g 'daemon off; master_process off;' > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/$2) 2>/dev/null && break; sleep 0.1; done
  [ "$5" -gt 0 ] && client "$2" "$3" "$4" "$5"
  kill -QUIT $vp; wait $vp 2>/dev/null || true
  ir_of "$W/cg.ngx.$3.$4.$5"
}
if [ "$INSTRUCTIONS" -gt 0 ]; then
  : > "$OUT/instructions.txt"
  for case in $CASES; do
    n=${case##*-}
    a=$(callgrind_tp "$case" 0); b=$(callgrind_tp "$case" "$INSTRUCTIONS")
    echo "$case turnpike $(( (b - a) / INSTRUCTIONS ))" >> "$OUT/instructions.txt"
  done
  for n in 1 100; do
    a=$(callgrind_ngx "$W/nginx" 8002 plain "$n" 0); b=$(callgrind_ngx "$W/nginx" 8002 plain "$n" "$INSTRUCTIONS")
    echo "nginx-$n nginx $(( (b - a) / INSTRUCTIONS ))" >> "$OUT/instructions.txt"
    a=$(callgrind_ngx "$W/ngxlua" 8003 ngxlua "$n" 0); b=$(callgrind_ngx "$W/ngxlua" 8003 ngxlua "$n" "$INSTRUCTIONS")
    echo "ngxlua-$n nginx-lua $(( (b - a) / INSTRUCTIONS ))" >> "$OUT/instructions.txt"
  done
fi

"$(report_python)" bench/kong_cases_report.py "$OUT" "$RUNS" "$PROTOCOLS"
echo "results: $OUT"
