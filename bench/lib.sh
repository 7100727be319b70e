# Shared by the benchmark scripts (source it from a script in this folder).
# Sets ROOT and SHARED; provides wait_port, start_upstream and turnpike_env.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared/bench-reference}
# CPU layout (../shared/bench-reference/README.md on 2 CPUs: the proxy under test on CPU 0, the
# upstream and the load generator on CPU 1). With more CPUs the proxy gets the first half (one
# worker per CPU) and the upstream and load generator the rest, so that the proxy stays the
# bottleneck. PROXY_CPUS/LOAD_CPUS are taskset lists; PROXY_N/LOAD_N their sizes.
NCPU=${NCPU:-$(nproc)}
if [ "$NCPU" -lt 2 ]; then
  PROXY_N=1 LOAD_N=1 PROXY_CPUS=0 LOAD_CPUS=0
else
  PROXY_N=$((NCPU / 2))
  LOAD_N=$((NCPU - PROXY_N))
  PROXY_CPUS=0-$((PROXY_N - 1))
  LOAD_CPUS=$PROXY_N-$((NCPU - 1))
fi
BENCH_PIDS=()   # processes to stop at exit
BENCH_TMP=()    # folders to remove at exit
bench_cleanup() {
  for p in "${BENCH_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for d in "${BENCH_TMP[@]}"; do rm -rf "$d"; done
}
trap bench_cleanup EXIT

# QUOTA=P (percent, optional): proxies started through `in_quota` run in a cgroup limited to P%
# of one CPU (10 ms period), so that the proxy, not the CPU of the upstream and load generator,
# is the only bottleneck of a 2-CPU machine. Needs root and the cgroup v1 cpu controller
# (/sys/fs/cgroup/cpu) or cgroup v2 with cpu.max. The cgroups are removed at exit.
QUOTA=${QUOTA:-}
QUOTA_CGROUPS=()
# in_quota NAME CMD...: runs CMD (exec) in NAME's cgroup under QUOTA, or as it is without.
in_quota() {
  local name=$1
  shift
  if [ -z "$QUOTA" ]; then
    exec "$@"
  fi
  local period=10000 dir
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    dir=/sys/fs/cgroup/cpu/turnpike-bench-$name
    mkdir -p "$dir"
    echo $period > "$dir/cpu.cfs_period_us"
    echo $((QUOTA * period / 100)) > "$dir/cpu.cfs_quota_us"
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    dir=/sys/fs/cgroup/turnpike-bench-$name
    mkdir -p "$dir"
    echo "$((QUOTA * period / 100)) $period" > "$dir/cpu.max"
  else
    echo "QUOTA needs the cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)" >&2
    exit 1
  fi
  echo "$BASHPID" > "$dir/cgroup.procs"
  exec "$@"
}
# Removes the cgroups in_quota made (their processes must have exited).
quota_cleanup() {
  [ -n "$QUOTA" ] || return 0
  sleep 0.5
  rmdir /sys/fs/cgroup/cpu/turnpike-bench-* /sys/fs/cgroup/turnpike-bench-* 2>/dev/null || true
}
trap 'bench_cleanup; quota_cleanup' EXIT

# bench_begin NAME: what every benchmark script starts with: OUT (bench/results/NAME-<date>/
# with raw/ and the commit), W (a work folder removed at exit), and BIN (the release binary,
# built --locked; BENCH_BIN=path measures a binary built elsewhere instead, e.g. an older
# commit's from a git worktree, and the commit file then says so).
bench_begin() {
  OUT=$ROOT/bench/results/$1-$(date -u +%Y%m%d-%H%M%S)
  W=$(mktemp -d "/tmp/$1.XXXX")
  BENCH_TMP+=("$W")
  mkdir -p "$OUT/raw"
  if [ -n "${BENCH_BIN:-}" ]; then
    BIN=$BENCH_BIN
    echo "binary $BIN ($("$BIN" version 2>/dev/null | head -1))" > "$OUT/commit"
    return
  fi
  git -C "$ROOT" rev-parse --short HEAD > "$OUT/commit" 2>/dev/null || true
  cargo build --release --locked -p turnpike >&2
  BIN=$ROOT/target/release/turnpike
}

# start_sqlite_node BIN DIR LOG_LEVEL: a Turnpike node on SQLite in DIR (two workers, unpinned;
# proxy on 127.0.0.1:18000, Admin API on :18001), bootstrapped and started, its log in
# DIR/node.log; sets NODE to its pid once the Admin API listens.
start_sqlite_node() {
  export TURNPIKE_PREFIX=$2 TURNPIKE_DATABASE=sqlite TURNPIKE_PROXY_LISTEN=127.0.0.1:18000 \
    TURNPIKE_ADMIN_LISTEN=127.0.0.1:18001 TURNPIKE_NGINX_WORKER_PROCESSES=2 TURNPIKE_LOG_LEVEL=$3
  "$1" migrations bootstrap > /dev/null
  "$1" start > "$2/node.log" 2>&1 &
  NODE=$!
  BENCH_PIDS+=($NODE)
  wait_port 18001
}

# wait_port PORT: until something listens on 127.0.0.1:PORT (10 s at most).
wait_port() {
  for _ in $(seq 1 200); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "port $1 never opened" >&2
  return 1
}

# ports_free PORT...: refuses to go on while something already listens on one of them (a
# proxy left over from an interrupted run would be measured instead of the one started now).
ports_free() {
  for p in "$@"; do
    if (echo >/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "port $p is already in use (a proxy left from an earlier run?); stop it first" >&2
      return 1
    fi
  done
}

# start_upstream [CPU]: the reference upstream (nginx, GET / -> "ok") on 127.0.0.1:9001,
# pinned to CPU when given; reuses one already listening there.
start_upstream() {
  (echo >/dev/tcp/127.0.0.1/9001) 2>/dev/null && return 0
  mkdir -p /tmp/bench/upstream/{cbt,pt,ft,ut,st}
  local pin=()
  [ -n "${1:-}" ] && pin=(taskset -c "$1")
  # One upstream worker per load CPU (the reference's one on a 2-CPU machine).
  sed "s/^worker_processes 1;/worker_processes $LOAD_N;/" "$SHARED/upstream.conf" > /tmp/bench/upstream/upstream.conf
  "${pin[@]}" nginx -c /tmp/bench/upstream/upstream.conf -p /tmp/bench/upstream -e /tmp/bench/upstream/error.log &
  BENCH_PIDS+=($!)
  wait_port 9001
}

# turnpike_env DIR: a one-route config to the upstream, and the TURNPIKE_* settings of the
# plain-proxy case (one worker per proxy CPU: one on 2 CPUs; proxy on :8000, keepalive as
# tuned as the nginx reference).
turnpike_env() {
  mkdir -p "$1"
  printf '_format_version: "3.0"\nservices: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/]}]}]\n' > "$1/kong.yml"
  export TURNPIKE_PREFIX=$1/prefix TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096" \
    TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 TURNPIKE_DATABASE=off TURNPIKE_DECLARATIVE_CONFIG=$1/kong.yml \
    TURNPIKE_NGINX_WORKER_PROCESSES=$PROXY_N TURNPIKE_LOG_LEVEL=warn \
    TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000 TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
}

# start_turnpike LOG: Turnpike ($BIN, settings from turnpike_env and the environment) on the
# proxy CPUs; TP is its pid once :8000 listens.
start_turnpike() {
  taskset -c "$PROXY_CPUS" "$BIN" start > "$1" 2>&1 &
  TP=$!
  BENCH_PIDS+=($TP)
  wait_port 8000
}

# start_nginx DIR PORT: the nginx of DIR/nginx.conf on the proxy CPUs; NGX is its pid once PORT
# listens.
start_nginx() {
  taskset -c "$PROXY_CPUS" nginx -c "$1/nginx.conf" -p "$1" -e "$1/error.log" -g 'daemon off;' &
  NGX=$!
  BENCH_PIDS+=($NGX)
  wait_port "$2"
}

# stop_pid PID: stops a proxy started above and waits for it.
stop_pid() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# ngx_conf DIR PORT: the plain nginx reverse proxy of ../shared/bench-reference/ with upstream
# keepalive (as tuned as Turnpike's pool), written to DIR/nginx.conf.
ngx_conf() {
  mkdir -p "$1"/{cbt,pt,ft,ut,st}
  sed -e "s|/tmp/bench/@NAME@|$1|g" -e "s/@NAME@/$(basename "$1")/g" -e "s/@PORT@/$2/" \
      -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' \
      -e 's/@ACCESS@//' -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' \
      "$SHARED/nginx_proxy.conf.tmpl" > "$1/nginx.conf"
  ngx_workers "$1"
}

# The TLS settings Kong gives nginx (kong.conf.default: ssl_protocols, ssl_session_*), for the
# HTTPS listeners of the nginx references: nginx 1.22's own default ssl_protocols lacks TLS 1.3,
# which would compare Turnpike's TLS 1.3 with nginx's TLS 1.2.
NGX_KONG_TLS="ssl_protocols TLSv1.2 TLSv1.3; ssl_session_tickets on; ssl_session_timeout 1d; ssl_session_cache shared:SSL:10m;"

# ngx_workers DIR: one nginx worker per proxy CPU (the reference's one on 2 CPUs).
ngx_workers() {
  sed -i "s/^worker_processes 1;/worker_processes $PROXY_N;/" "$1/nginx.conf"
}

# ngx_lua_conf DIR PORT: the nginx + Lua reference of ../shared/bench-reference/ (Kong's key-auth
# + rate-limiting emulated in an access phase: keys key1..key100, a per-second counter per
# consumer in a shared dict; key100 is limited to 3, the others to 10^9), written to DIR.
ngx_lua_conf() {
  mkdir -p "$1"/{cbt,pt,ft,ut,st}
  local shared
  shared=$(cd "$SHARED" && pwd)
  sed -e "s|@NAME@|$(basename "$1")|g" -e "s|/tmp/bench/$(basename "$1")|$1|g" -e "s/@PORT@/$2/" \
      -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' \
      -e "s|@ACCESS@|access_by_lua_file $shared/kong_emul.lua;|" \
      -e 's|@EXTRA_HTTP@|lua_shared_dict ratelimit 10m; init_by_lua_block { keys_table = {} for i = 1, 100 do keys_table["key" .. i] = {id = "c" .. i, limit = (i == 100) and 3 or 1000000000} end }|' \
      -e 's|@EXTRA_MAIN@|load_module /usr/lib/nginx/modules/ndk_http_module.so; load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;|' \
      "$SHARED/nginx_proxy.conf.tmpl" > "$1/nginx.conf"
  ngx_workers "$1"
}

# report_python: a python3 that has matplotlib (Debian's python3-matplotlib lives with
# /usr/bin/python3, and a pyenv python3 may come first on PATH); plain python3 otherwise.
report_python() {
  if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
    echo /usr/bin/python3
  else
    echo python3
  fi
}

# oauth2_setup ADMIN UPSTREAM: through the Admin API at ADMIN (http://host:port), a service
# to UPSTREAM, its route /o with oauth2 (client credentials) on it, and a consumer "owner" with
# an oauth2 application; sets SVC and CRED to the service's and the application's ids. The
# set-up of the oauth2 token benchmarks.
oauth2_setup() {
  local admin=$1 upstream=$2 ct='content-type: application/json' id='import json,sys; print(json.load(sys.stdin)["id"])'
  SVC=$(curl -sf -X POST "$admin/services" -H "$ct" -d "{\"name\":\"s\",\"url\":\"$upstream\"}" | python3 -c "$id")
  curl -sf -X POST "$admin/services/s/routes" -H "$ct" -d '{"name":"r","paths":["/o"]}' > /dev/null
  curl -sf -X POST "$admin/services/s/plugins" -H "$ct" -d '{"name":"oauth2","config":{"enable_client_credentials":true}}' > /dev/null
  curl -sf -X POST "$admin/consumers" -H "$ct" -d '{"username":"owner"}' > /dev/null
  CRED=$(curl -sf -X POST "$admin/consumers/owner/oauth2" -H "$ct" -d '{"name":"app"}' | python3 -c "$id")
}
