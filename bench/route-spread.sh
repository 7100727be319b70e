#!/usr/bin/env bash
# Does spreading requests over 100 routes and consumers cost Turnpike more than sending them all
# to one? Kong's basic-auth + rate-limiting 100/100 config (bench/kong-cases.sh's ba-rl-100),
# one Turnpike worker on CPU 0, upstream and `wrk -t1 -c50` on CPU 1; each round sends one run
# spread over the routes (normal draw, as kong-cases.sh) and one to route 49 alone, in turn.
# Usage: bench/route-spread.sh [ROUNDS] [DURATION]   (needs nginx, wrk, python3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}
DUR=${2:-5s}
bench_begin route-spread
start_upstream 1
python3 - "$W" <<'PY'
import base64, pathlib, sys
w = pathlib.Path(sys.argv[1])
head = '_format_version: "3.0"\nservices:\n- name: s\n  url: http://127.0.0.1:9001\n  routes:\n'
pl = ("    plugins:\n    - name: basic-auth\n    - name: rate-limiting\n"
      "      config: {year: 1000000000000, limit_by: consumer}\n")
routes = "".join(f"  - name: r{i}\n    paths: [/r{i}]\n" + pl for i in range(100))
cons = "consumers:\n" + "".join(
    f"- username: u{i}\n  basicauth_credentials: [{{username: u{i}, password: pw-{i}}}]\n" for i in range(100))
(w / "ba-rl-100.yml").write_text(head + routes + cons)
pick = '''
local function pick()
  local u1, u2 = math.random(), math.random()
  local z = math.sqrt(-2 * math.log(u1 + 1e-12)) * math.cos(2 * math.pi * u2)
  local i = math.floor(49.5 + 20 * z + 0.5)
  if i < 0 then i = 0 elseif i > 99 then i = 99 end
  return i
end
'''
creds = "local creds = {" + ",".join(
    f'"Basic {base64.b64encode(f"u{i}:pw-{i}".encode()).decode()}"' for i in range(100)) + "}\n"
# Both draw a route (the same Lua work per request); "one" then sends to route 49 anyway.
(w / "spread.lua").write_text(pick + creds + 'request = function() local i = pick() return wrk.format("GET", "/r" .. i, {authorization = creds[i + 1]}) end\n')
(w / "one.lua").write_text(pick + creds + 'request = function() local i = pick() return wrk.format("GET", "/r49", {authorization = creds[50]}) end\n')
PY
turnpike_env "$W/tp"
export TURNPIKE_DECLARATIVE_CONFIG=$W/ba-rl-100.yml
start_turnpike "$OUT/raw/turnpike.log"
# Warm-up over every route: each credential's slow hash is verified once, then cached.
taskset -c 1 wrk -t1 -c50 -d3s -s "$W/spread.lua" http://127.0.0.1:8000/ > /dev/null
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; commit $(cat "$OUT/commit"); wrk -t1 -c50 -d$DUR"
  echo
  echo "| round | spread over 100 routes (RPS) | one route (RPS) |"
  echo "|---|---:|---:|"
  for r in $(seq 1 "$ROUNDS"); do
    for s in spread one; do
      taskset -c 1 wrk -t1 -c50 -d"$DUR" -s "$W/$s.lua" http://127.0.0.1:8000/ > "$OUT/raw/$s-$r.txt"
    done
    printf '| %s | %s | %s |\n' "$r" \
      "$(awk '/Requests\/sec/ {printf "%d", $2}' "$OUT/raw/spread-$r.txt")" \
      "$(awk '/Requests\/sec/ {printf "%d", $2}' "$OUT/raw/one-$r.txt")"
  done
} | tee "$OUT/summary.md"
echo "raw results: $OUT"
