#!/usr/bin/env bash
# oauth2 at a million tokens (issue #24): the failure that started this project was a gateway
# whose token look-ups slowed down as tokens were written through the Admin API. One Turnpike
# node (1 worker, CPU 0) on PostgreSQL holding TOKENS live oauth2 tokens; wrk (CPU 1)
# authenticates every request with a token drawn at random from all of them, for DUR, RUNS
# times each with no writes and while new tokens are written through `POST /oauth2_tokens` at
# each rate of RATES (oha, or with WRITER=python a Python writer; unpinned, as is
# PostgreSQL). Reports proxy RPS and p99 beside the no-write runs, the table's size, and the
# share of requests answered from the node's token cache (1 - access-token index reads /
# requests, from PostgreSQL's `pg_stat_user_indexes`; the writes' own reads of that index,
# measured without traffic, are counted out).
# APART=1 runs PostgreSQL and the writer as SCHED_IDLE: they get only the CPU time the node,
# the load generator and the upstream leave, as if on machines of their own (as in production),
# so that what the writes still cost the proxy is the node's own share of them. Meant with a
# cache that holds the tokens (TURNPIKE_MEM_CACHE_SIZE=1024m): at the default, four in five
# requests read PostgreSQL, which then waits behind the proxy.
# CONTROL_CPUS=<list> moves the node's threads other than its proxy workers (the Admin API,
# the config sync, the builder) off the worker's CPU onto these (taskset), so that what is
# left of the writes' cost to the proxy is not the node's control plane taking the worker's CPU.
# CONTROL_NICE=<n> renices the node's threads other than its proxy workers (the node runs
# them at nice 5 and its config builder at 10) to n.
# CONTROL_IDLE=1 puts the node's control plane (its main thread: the Admin API and the config
# sync; and the config builder) under SCHED_IDLE instead of its nice 19: a woken proxy worker
# then preempts it at once (a nice-19 thread keeps the CPU for the rest of its slice).
# Usage: [TOKENS=1000000] [RATES="150 1500"] [WARM=60s] [OPEN_RPS=n] [WRITER=oha|python] [APART=1] [CONTROL_CPUS=list] [CONTROL_NICE=n] [CONTROL_IDLE=1] [BENCH_BIN=path] bench/oauth2-tokens.sh [RUNS] [DUR]
#        (needs postgresql, nginx, wrk, python3, oha; GNU time)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUNS=${1:-2}
DUR=${2:-10s}
TOKENS=${TOKENS:-1000000}
RATES=${RATES:-150 1500}
WARM=${WARM:-60s}
bench_begin "oauth2-tokens-$TOKENS"
WORK=$W
chmod 755 "$WORK"

PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGPORT=55433
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$WORK"; fi
APART_AS=()
if [ "${APART:-0}" = 1 ]; then APART_AS=(chrt --idle 0); fi
"${AS[@]}" "$PGBIN/initdb" -D "$WORK/pg" -U kong --auth=trust -E UTF8 --locale=C --no-sync > /dev/null
"${APART_AS[@]}" "${AS[@]}" "$PGBIN/postgres" -D "$WORK/pg" -p $PGPORT -k "$WORK" -c listen_addresses=127.0.0.1 \
  -c fsync=off -c synchronous_commit=off -c shared_buffers=256MB > "$WORK/pg.log" 2>&1 &
BENCH_PIDS+=($!)
wait_port $PGPORT
sleep 0.5
psql() { "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U kong -d postgres -qAt "$@"; }
export TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT=$PGPORT \
  TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres TURNPIKE_LOG_LEVEL=warn \
  TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_PREFIX=$WORK/node \
  TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096" TURNPIKE_ADMIN_LISTEN=127.0.0.1:8001 \
  TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS=1000000 TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS=1000000
"$BIN" migrations bootstrap
start_upstream "$LOAD_CPUS"
taskset -c "$PROXY_CPUS" "$BIN" start > "$OUT/node.log" 2>&1 &
NODE=$!
BENCH_PIDS+=($NODE)
wait_port 8001
# The node's thread ids: its proxy workers (`workers`) or the others (`control`).
threads() { # workers|control
  local t kind
  for t in /proc/$NODE/task/*; do
    kind=control
    case $(cat "$t/comm") in turnpike-worker*) kind=workers ;; esac
    if [ "$kind" = "$1" ]; then echo "${t##*/}"; fi
  done
}
for tid in $(threads control); do
  if [ -n "${CONTROL_CPUS:-}" ]; then taskset -pc "$CONTROL_CPUS" "$tid" > /dev/null; fi
  if [ -n "${CONTROL_NICE:-}" ]; then renice -n "$CONTROL_NICE" -p "$tid" > /dev/null; fi
  if [ "${CONTROL_IDLE:-0}" = 1 ]; then
    if [ "$tid" = "$NODE" ] || [ "$(cat "/proc/$NODE/task/$tid/comm")" = config-builder ]; then
      chrt --idle -p 0 "$tid"
    fi
  fi
done

oauth2_setup http://127.0.0.1:8001 http://127.0.0.1:9001

# The tokens, written in one statement in the rows' stored form (as POST /oauth2_tokens
# writes them).
NOW=$(date +%s)
t0=$(date +%s.%N)
psql <<SQL
INSERT INTO oauth2_tokens (id, access_token, credential_id, service_id, created_at, entity)
SELECT u, 'tok-' || g, '$CRED', '$SVC', $NOW,
  json_build_object('id', u, 'created_at', $NOW, 'access_token', 'tok-' || g,
    'refresh_token', NULL, 'token_type', 'bearer', 'expires_in', 86400,
    'authenticated_userid', 'user-' || g, 'scope', 'email', 'ttl', NULL, 'tags', NULL,
    'credential', json_build_object('id', '$CRED'), 'service', json_build_object('id', '$SVC'))::text
FROM (SELECT gen_random_uuid()::text AS u, g FROM generate_series(1, $TOKENS) g) s;
ANALYZE oauth2_tokens;
SQL
t1=$(date +%s.%N)
echo "inserted $TOKENS tokens in $(echo "$t1 - $t0" | bc) s" | tee "$OUT/setup.txt"

cat > "$WORK/random.lua" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/o", { ["Authorization"] = "Bearer tok-" .. math.random(1, $TOKENS) })
end
LUA
curl -sf -o /dev/null -H "Authorization: Bearer tok-1" http://127.0.0.1:8000/o

# CPU ticks (1/100 s) used so far by these processes and their threads.
# A process may end between pgrep and the read (a short-lived PostgreSQL backend): skipped.
ticks() { for p in "$@"; do cat /proc/"$p"/task/*/stat 2>/dev/null || true; done | awk '{s += $14 + $15} END {print s + 0}'; }
# Reads of the access token's unique index: the node's token look-ups, and one per write (its
# uniqueness check); the config sync reads written tokens by id, through the primary key.
# PostgreSQL 15 backends publish their counts at most once a second while busy, and within 10 s
# once idle: `settle` waits that out, so that a run's reads are counted in that run.
settle() { sleep 11; }
idx_scans() { psql -c "SELECT sum(idx_scan) FROM pg_stat_user_indexes WHERE relname = 'oauth2_tokens' AND indexrelname LIKE '%access_token%'"; }
# The token writes, at a rate for some seconds, in the background: one JSON line on stdout
# (writes done, errors, seconds, the writer's own CPU seconds). By default oha sends them (32
# kept-alive connections, paced; the access token left to the Admin API to draw, as Kong's
# `auto` field): the token service is another machine in production, and a Python writer
# took 0.23-0.36 of a CPU at 1,500/s from the two this benchmark shares. WRITER=python: the
# Python writer of the earlier figures (its own access tokens).
writer() { # rate seconds
  if [ "${WRITER:-oha}" = oha ]; then writer_oha "$@" & return; fi
  writer_python "$@"
}
writer_oha() { # rate seconds
  local j=$WORK/writer.$BASHPID
  "${APART_AS[@]}" /usr/bin/time -f '%U %S' -o "$j.cpu" "$OHA" --no-tui --output-format json -c 32 -q "$1" -z "$2s" \
    -m POST -T application/json \
    -d "{\"credential\":{\"id\":\"$CRED\"},\"service\":{\"id\":\"$SVC\"},\"expires_in\":7200,\"scope\":\"email\"}" \
    http://127.0.0.1:8001/oauth2_tokens > "$j.json"
  python3 - "$j.json" "$j.cpu" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
codes = d.get("statusCodeDistribution", {})
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
bad = sum(v for k, v in codes.items() if k != "201")
bad += sum(v for k, v in d.get("errorDistribution", {}).items() if "aborted due to deadline" not in k)
print(json.dumps({"writes": codes.get("201", 0), "errors": bad, "seconds": round(d["summary"]["total"], 2),
                  "cpu": round(u + s, 2)}))
PY
}
writer_python() { # rate seconds: paced writes from 32 threads (one client cannot do 1,500/s)
  "${APART_AS[@]}" python3 - "$1" "$2" <<'PY' &
import http.client, json, resource, sys, threading, time, urllib.request, uuid
rate, secs = float(sys.argv[1]), float(sys.argv[2])
cred = json.load(urllib.request.urlopen("http://127.0.0.1:8001/oauth2"))["data"][0]["id"]
svc = json.load(urllib.request.urlopen("http://127.0.0.1:8001/services/s"))["id"]
lock = threading.Lock()
state = {"next": 0, "done": 0, "errors": 0}
start = time.time()
def work():
    # One kept-alive connection a thread, as a token service's HTTP client pool holds.
    conn = http.client.HTTPConnection("127.0.0.1", 8001)
    while True:
        with lock:
            i = state["next"]; state["next"] += 1
        at = start + i / rate
        if at - start >= secs:
            return
        lag = at - time.time()
        if lag > 0:
            time.sleep(lag)
        body = json.dumps({"credential": {"id": cred}, "service": {"id": svc}, "expires_in": 7200,
                           "access_token": "w-" + uuid.uuid4().hex, "scope": "email"}).encode()
        try:
            conn.request("POST", "/oauth2_tokens", body, {"content-type": "application/json"})
            r = conn.getresponse(); r.read(); ok = r.status == 201
        except Exception:
            conn.close(); ok = False
        with lock:
            state["done" if ok else "errors"] += 1
threads = [threading.Thread(target=work) for _ in range(32)]
for t in threads: t.start()
for t in threads: t.join()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"writes": state["done"], "errors": state["errors"], "seconds": round(time.time() - start, 2),
                  "cpu": round(u.ru_utime + u.ru_stime, 2)}))
PY
}
# The proxy's load for DUR: wrk as fast as 50 connections go (closed loop), or, with OPEN_RPS,
# oha sending that many requests a second whatever the answers' pace (open loop: a site's
# traffic does not slow down because the gateway does; latency counted from when each request
# was due). oha's token is in the query (`access_token`, as Kong's oauth2 reads it), drawn from
# the tokens with as many digits as the last one; its figures are written as wrk's lines.
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
DIGITS=$(( ${#TOKENS} - 1 ))
load() { # file
  if [ -z "${OPEN_RPS:-}" ]; then
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"$DUR" --latency -s "$WORK/random.lua" http://127.0.0.1:8000/o > "$1"
    return
  fi
  taskset -c "$LOAD_CPUS" "$OHA" --no-tui --output-format json --latency-correction -c 50 -q "$OPEN_RPS" -z "$DUR" \
    --rand-regex-url "http://127.0.0.1:8000/o\\?access_token=tok-[1-9][0-9]{$((DIGITS - 1))}" > "$1.json"
  python3 - "$1.json" > "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s, codes = d["summary"], d.get("statusCodeDistribution", {})
n = sum(codes.values())
print(f"  99% {d['latencyPercentiles']['p99'] * 1000:.3f}ms")
print(f"  {n} requests in {s['total']:.2f}s")
# Answers other than 2xx/3xx, and requests that got none (oha's errors; not those still in
# flight when the run's time was up).
bad = sum(v for k, v in codes.items() if not k.startswith(("2", "3")))
bad += sum(v for k, v in d.get("errorDistribution", {}).items() if "aborted due to deadline" not in k)
print(f"Non-2xx or 3xx responses: {bad}")
print(f"Requests/sec: {n / s['total']:.2f}")
PY
}
# The proxy workers' time on a CPU and waiting for one (runnable, another thread on it), in ns
# (/proc/<tid>/schedstat): whether the writes make a request cost the worker more, or only
# make it wait for its CPU.
worker_sched() {
  for tid in $(threads workers); do cat "/proc/$NODE/task/$tid/schedstat"; done | awk '{r += $1; w += $2} END {printf "%.0f %.0f\n", r, w}'
}
run() { # label rate run
  local secs=${DUR%s} s0 s1 f=$OUT/raw/$1-run$3.txt
  local wp="" n0 n1 p0 p1 k0 k1
  s0=$(idx_scans)
  k0=$(worker_sched)
  n0=$(ticks "$NODE")
  p0=$(ticks $(pgrep -u postgres postgres))
  if [ "$2" != 0 ]; then
    writer "$2" "$secs" > "$f.writer"
    wp=$!
  fi
  load "$f"
  # Only the writer: a bare `wait` would wait for the servers too.
  if [ -n "$wp" ]; then wait "$wp"; fi
  n1=$(ticks "$NODE")
  k1=$(worker_sched)
  p1=$(ticks $(pgrep -u postgres postgres))
  settle
  s1=$(idx_scans)
  echo "token_index_reads $((s1 - s0))" >> "$f"
  echo "cpu_ticks node $((n1 - n0)) postgres $((p1 - p0))" >> "$f"
  echo "worker_ns run $(( ${k1% *} - ${k0% *} )) wait $(( ${k1#* } - ${k0#* } ))" >> "$f"
}
# The token index reads of a write itself (no proxy traffic), to count out of the write runs'
# hit ratio.
settle
c0=$(idx_scans)
writer 150 2 > "$OUT/calibration.writer"
wait $!
settle
c1=$(idx_scans)
echo "index_reads $((c1 - c0))" >> "$OUT/calibration.writer"
# Warm-up until the token cache is full (~220k tokens of 608 bytes in the default 128m
# mem_cache_size), so that each run sees the same hit ratio rather than a rising one.
taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"$WARM" -s "$WORK/random.lua" http://127.0.0.1:8000/o > /dev/null
# The node's resident memory with its token cache full (mem_cache_size bounds the cache).
echo "after_warmup $(ps -o rss= -p "$NODE")" > "$OUT/rss.txt"
settle
# Runs in ABBA order (none, writes, writes, none, ...), so that a drift over the runs does not
# fall on one side.
for i in $(seq 1 "$RUNS"); do
  if [ $((i % 2)) = 1 ]; then
    run none 0 "$i"
    for r in $RATES; do run "w$r" "$r" "$i"; done
  else
    for r in $(echo $RATES | tr ' ' '\n' | tac); do run "w$r" "$r" "$i"; done
    run none 0 "$i"
  fi
done
psql -c "SELECT count(*), pg_size_pretty(pg_total_relation_size('oauth2_tokens')) FROM oauth2_tokens" > "$OUT/store.txt"
echo "after_runs $(ps -o rss= -p "$NODE")" >> "$OUT/rss.txt"

python3 - "$OUT" "$TOKENS" "$RATES" "${OPEN_RPS:-}" "${APART:-0}" "${CONTROL_CPUS:-}" "${CONTROL_NICE:-}" "${CONTROL_IDLE:-0}" <<'PY' | tee "$OUT/summary.md"
import json, pathlib, re, statistics, sys
out, tokens, rates = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split()
def lat(t):
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
cal = (out / "calibration.writer").read_text().splitlines()
per_write = int(cal[1].split()[1]) / max(json.loads(cal[0])["writes"], 1)
def runs(label):
    rs = []
    for f in sorted((out / "raw").glob(f"{label}-run*.txt")):
        t = f.read_text()
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
        n = int(re.search(r"(\d+) requests in", t).group(1))
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
        reads = int(re.search(r"token_index_reads (\d+)", t).group(1))
        w = f.with_suffix(".txt.writer")
        writes = json.loads(w.read_text()) if w.exists() else None
        cpu = re.search(r"cpu_ticks node (\d+) postgres (\d+)", t)
        secs = float(re.search(r"requests in ([\d.]+)s", t).group(1))
        # The writes' own index reads are not the requests'.
        reads -= round(per_write * writes["writes"]) if writes else 0
        ws = re.search(r"worker_ns run (\d+) wait (\d+)", t)
        rs.append(dict(rps=rps, p99=lat(t), hit=1 - reads / max(n, 1), bad=int(non2xx.group(1)) if non2xx else 0, writes=writes,
                       node=int(cpu.group(1)) / secs, pg=int(cpu.group(2)) / secs,
                       wrun=int(ws.group(1)) / 1000 / max(n, 1) if ws else None,
                       wwait=int(ws.group(2)) / 1000 / max(n, 1) if ws else None))
    return rs
store = (out / "store.txt").read_text().strip().replace("|", " rows, ")
rss = dict(l.split() for l in (out / "rss.txt").read_text().splitlines())
rss = f"node RSS {int(rss['after_warmup']) / 1024:.0f} MB after the warm-up, {int(rss['after_runs']) / 1024:.0f} MB after the runs"
base = runs("none")
open_rps = sys.argv[4] if len(sys.argv) > 4 else ""
load = f"oha, open loop at {int(open_rps):,} requests/s (latency from when each was due)" if open_rps else "wrk, closed loop, 50 connections"
apart = "; PostgreSQL and the writer SCHED_IDLE (APART=1)" if len(sys.argv) > 5 and sys.argv[5] == "1" else ""
apart += f"; the node's threads other than its worker on CPU {sys.argv[6]}" if len(sys.argv) > 6 and sys.argv[6] else ""
apart += f"; the node's threads other than its worker at nice {sys.argv[7]}" if len(sys.argv) > 7 and sys.argv[7] else ""
apart += "; the node's control plane SCHED_IDLE (CONTROL_IDLE=1)" if len(sys.argv) > 8 and sys.argv[8] == "1" else ""
print(f"{tokens:,} tokens in PostgreSQL; table after the runs: {store}; a write's own token index reads: {per_write:.2f}; load: {load}; {rss}{apart}\n")
def p_larger(none, writes):
    """Exact one-sided p of the Mann-Whitney U test that the write runs' p99s rank above the
    no-write runs': the share of all ways to split the pooled runs in two groups of these
    sizes whose U is at least the one seen (ties count half)."""
    from itertools import combinations
    u = lambda xs, ys: sum((x > y) + 0.5 * (x == y) for x in xs for y in ys)
    pooled, k, seen = none + writes, len(writes), u(writes, none)
    splits = list(combinations(range(len(pooled)), k))
    hits = sum(u([pooled[i] for i in c], [pooled[i] for i in range(len(pooled)) if i not in c]) >= seen for c in splits)
    return hits / len(splits)
def us(v):
    return "-" if v is None else f"{v:.1f}"
print("| writes | RPS (median; runs) | p99 ms (runs) | p99 over no writes: median difference ms; p (one-sided Mann-Whitney) | token cache hit ratio | writes done/s | non-2xx | node CPU % | PostgreSQL CPU % | writer CPU % | worker µs a request: on CPU; waiting for it |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
for label, name in [("none", "none")] + [("w" + r, r + "/s") for r in rates]:
    rs = runs(label)
    wd = [r["writes"]["writes"] / r["writes"]["seconds"] for r in rs if r["writes"]]
    rps = ", ".join("{:,.0f}".format(r["rps"]) for r in rs)
    p99 = ", ".join("{:.2f}".format(r["p99"]) for r in rs)
    done = "{:,.0f}".format(statistics.median(wd)) if wd else "-"
    wc = [100 * r["writes"]["cpu"] / r["writes"]["seconds"] for r in rs if r["writes"] and "cpu" in r["writes"]]
    wcpu = "{:.0f}".format(statistics.median(wc)) if wc else "-"
    if label == "none":
        versus = "-"
    else:
        a, b = [r["p99"] for r in base], [r["p99"] for r in rs]
        versus = "{:+.2f}; {:.3f}".format(statistics.median(b) - statistics.median(a), p_larger(a, b))
    wr = [r["wrun"] for r in rs if r["wrun"] is not None]
    ww = [r["wwait"] for r in rs if r["wwait"] is not None]
    sched = "{}; {}".format(us(statistics.median(wr)), us(statistics.median(ww))) if wr else "-"
    print("| {} | {:,.0f} ({}) | {} | {} | {:.2f} | {} | {} | {:.0f} | {:.0f} | {} | {} |".format(
        name, statistics.median(r["rps"] for r in rs), rps, p99, versus,
        statistics.median(r["hit"] for r in rs), done, sum(r["bad"] for r in rs),
        statistics.median(r["node"] for r in rs), statistics.median(r["pg"] for r in rs), wcpu, sched))
PY
echo "raw results: $OUT"
