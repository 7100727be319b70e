#!/usr/bin/env bash
# Plugin cost, Kong's benchmark cases on one pinned core: plain proxy, key-auth, key-auth +
# rate-limiting and basic-auth + rate-limiting (limit high enough never to block), with 1 route
# / 1 consumer and with 100 routes / 100 consumers (requests spread over them by wrk's script);
# and the two auth + rate-limiting cases again on a SQLite node (credentials through the cache,
# basic-auth passwords stored as argon2id). Same layout as plain-proxy.sh: Turnpike (1 worker) on CPU 0, upstream nginx
# and wrk on CPU 1; RUNS runs of DUR per case, interleaved, median RPS.
# Usage: bench/plugins.sh [RUNS] [DUR]   (needs nginx, wrk)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUNS=${1:-3}
DUR=${2:-10s}
OUT=$ROOT/bench/results/plugins-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
start_upstream 1

python3 - "$OUT" <<'PY'
import sys, pathlib
out = pathlib.Path(sys.argv[1])
head = '_format_version: "3.0"\n'
svc = 'services:\n- name: u\n  url: http://127.0.0.1:9001\n  routes:\n'
(out / "plain.yml").write_text(head + svc + "  - name: r\n    paths: [/]\n")
(out / "key-auth.yml").write_text(head + svc + "  - name: r\n    paths: [/]\n    plugins:\n    - name: key-auth\n"
    "consumers:\n- username: c0\n  keyauth_credentials: [{key: key-0}]\n")
rl = "    - name: rate-limiting\n      config: {year: 1000000000000, limit_by: consumer}\n"
(out / "key-auth-rl.yml").write_text(head + svc + "  - name: r\n    paths: [/]\n    plugins:\n    - name: key-auth\n" + rl +
    "consumers:\n- username: c0\n  keyauth_credentials: [{key: key-0}]\n")
routes = "".join(f"  - name: r{i}\n    paths: [/r{i}]\n    plugins:\n    - name: key-auth\n" + rl for i in range(100))
consumers = "consumers:\n" + "".join(f"- username: c{i}\n  keyauth_credentials: [{{key: key-{i}}}]\n" for i in range(100))
(out / "key-auth-rl-100.yml").write_text(head + svc + routes + consumers)
# basic-auth + rate-limiting (Kong's other auth case): password "pw-<i>" for user "u<i>".
bconsumers = lambda n: "consumers:\n" + "".join(
    f"- username: c{i}\n  basicauth_credentials: [{{username: u{i}, password: pw-{i}}}]\n" for i in range(n))
(out / "basic-auth-rl.yml").write_text(head + svc + "  - name: r\n    paths: [/]\n    plugins:\n    - name: basic-auth\n" + rl + bconsumers(1))
broutes = "".join(f"  - name: r{i}\n    paths: [/r{i}]\n    plugins:\n    - name: basic-auth\n" + rl for i in range(100))
(out / "basic-auth-rl-100.yml").write_text(head + svc + broutes + bconsumers(100))
import base64
(out / "spread-basic.lua").write_text(
    'local creds = {}\nfor i = 0, 99 do creds[i] = "Basic " .. ({' +
    ",".join(f'"{base64.b64encode(f"u{i}:pw-{i}".encode()).decode()}"' for i in range(100)) +
    '})[i + 1] end\nlocal i = 0\nrequest = function()\n  i = (i + 1) % 100\n'
    '  return wrk.format("GET", "/r" .. i, {["authorization"] = creds[i]})\nend\n')
(out / "spread-ngxlua.lua").write_text(
    'local i = 0\nrequest = function()\n  i = (i + 1) % 99\n'
    '  return wrk.format("GET", "/r" .. i, {["apikey"] = "key" .. (i + 1)})\nend\n')
(out / "spread.lua").write_text(
    'local i = 0\nrequest = function()\n  i = (i + 1) % 100\n'
    '  return wrk.format("GET", "/r" .. i, {["apikey"] = "key-" .. i})\nend\n')
PY

PREFIXES=$(mktemp -d)
BENCH_TMP+=("$PREFIXES")
run_case() { # name config wrk-args...   (DB=sqlite: run on a SQLite store holding config)
  local name=$1 cfg=$2; shift 2
  # The prefix (generated certificate and key included) stays out of the results.
  turnpike_env "$PREFIXES/tp-$name"
  export TURNPIKE_DECLARATIVE_CONFIG=$cfg
  if [ "${DB:-off}" = sqlite ]; then
    # A fresh store each run: the credentials' ids are random (Kong's rule for entities whose
    # key is generated), so importing twice would collide on their keys.
    rm -rf "$TURNPIKE_PREFIX"
    export TURNPIKE_DATABASE=sqlite
    "$BIN" config db_import "$cfg" > /dev/null
  fi
  taskset -c 0 "$BIN" start > "$OUT/$name.log" 2>&1 &
  local pid=$!
  wait_port 8000
  taskset -c 1 wrk -t1 -c50 -d2s "$@" > /dev/null
  taskset -c 1 wrk -t1 -c50 -d"$DUR" --latency "$@" > "$OUT/$name-run$run.txt"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
# The nginx + Lua reference (Kong's key-auth + rate-limiting emulated in an access phase).
ngx_lua_conf "$PREFIXES/ngxlua" 8000
run_ngxlua() { # name wrk-args...
  local name=$1; shift
  taskset -c 0 nginx -c "$PREFIXES/ngxlua/nginx.conf" -p "$PREFIXES/ngxlua" \
    -e "$PREFIXES/ngxlua/error.log" -g 'daemon off;' &
  local pid=$!
  wait_port 8000
  taskset -c 1 wrk -t1 -c50 -d2s "$@" > /dev/null
  taskset -c 1 wrk -t1 -c50 -d"$DUR" --latency "$@" > "$OUT/$name-run$run.txt"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for run in $(seq 1 "$RUNS"); do
  run_ngxlua nginx-lua-karl -H "apikey: key1" http://127.0.0.1:8000/
  run_ngxlua nginx-lua-karl-100 -s "$OUT/spread-ngxlua.lua" http://127.0.0.1:8000/
  run_case plain "$OUT/plain.yml" http://127.0.0.1:8000/
  run_case key-auth "$OUT/key-auth.yml" -H "apikey: key-0" http://127.0.0.1:8000/
  run_case key-auth-rl "$OUT/key-auth-rl.yml" -H "apikey: key-0" http://127.0.0.1:8000/
  run_case key-auth-rl-100 "$OUT/key-auth-rl-100.yml" -s "$OUT/spread.lua" http://127.0.0.1:8000/
  B0="Basic $(printf 'u0:pw-0' | base64)"
  run_case basic-auth-rl "$OUT/basic-auth-rl.yml" -H "authorization: $B0" http://127.0.0.1:8000/
  run_case basic-auth-rl-100 "$OUT/basic-auth-rl-100.yml" -s "$OUT/spread-basic.lua" http://127.0.0.1:8000/
  # The same two auth cases on a database node: credentials through the cache, passwords
  # stored as argon2id (verified once, then the verified-credential cache).
  DB=sqlite run_case key-auth-rl-db "$OUT/key-auth-rl.yml" -H "apikey: key-0" http://127.0.0.1:8000/
  DB=sqlite run_case basic-auth-rl-db "$OUT/basic-auth-rl.yml" -H "authorization: $B0" http://127.0.0.1:8000/
done

python3 - "$OUT" "$RUNS" <<'PY' | tee "$OUT/summary.md"
import re, sys, pathlib, statistics
out, runs = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def parse(p):
    t = p.read_text()
    def pct(k):
        m = re.search(rf"^\s+{k}%\s+([\d.]+)(us|ms|s)", t, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)), pct(50), pct(99), int(errs.group(1)) if errs else 0
print("| case | RPS (median) | runs | vs plain | p50 ms | p99 ms | non-2xx |\n|---|---:|---|---:|---:|---:|---:|")
base = None
for name in ["plain", "key-auth", "key-auth-rl", "key-auth-rl-100", "basic-auth-rl",
             "basic-auth-rl-100", "key-auth-rl-db", "basic-auth-rl-db",
             "nginx-lua-karl", "nginx-lua-karl-100"]:
    vals = [parse(out / f"{name}-run{i}.txt") for i in range(1, runs + 1)]
    med = sorted(vals)[len(vals) // 2]
    base = base or med[0]
    print(f"| {name} | {med[0]:,.0f} | {', '.join(f'{v[0]:,.0f}' for v in vals)} | {med[0] / base:.2f}x | {med[1]:.2f} | {med[2]:.2f} | {sum(v[3] for v in vals)} |")
PY
echo "raw results: $OUT"
