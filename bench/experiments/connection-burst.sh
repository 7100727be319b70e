#!/usr/bin/env bash
# New-connection bursts: N clients connect at the same moment and send one request each (what a
# fleet of clients does after a deploy or a network blip). Reports, per burst, the proxy's CPU
# time per connection (from /proc/PID/task/*/schedstat: user + kernel, all threads and worker
# processes) and the requests' latency. A fresh process per proxy, BURSTS bursts each, the first
# one cold; Turnpike as shipped, Turnpike with transparent huge pages allowed
# (MIMALLOC_ALLOW_THP=1, how it ran before they were turned off) and nginx.
#
# Layout of bench/lib.sh: on 2 CPUs the proxy pinned to CPU 0 with one worker, the upstream and
# the client on CPU 1 (with more CPUs, half for the proxy, one worker each); plain proxy, one route, HTTP.
# Usage: bench/experiments/connection-burst.sh [N] [BURSTS]   (needs nginx, python3)
# Results: bench/results/connection-burst-<date>/ (every burst's figures and summary.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh
N=${1:-500}
BURSTS=${2:-6}
bench_begin connection-burst
start_upstream "$LOAD_CPUS"

ngx_conf "$W/nginx" 8002

cat > "$W/burst.py" <<'PY'
# One burst: N non-blocking connects at once, one GET on each as soon as it is writable, until
# every response head has arrived. Prints one JSON line.
import glob, json, selectors, socket, sys, time
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def cpu_ns():
    pids = [str(pid)] + open(f"/proc/{pid}/task/{pid}/children").read().split()
    return sum(int(open(f).read().split()[0]) for p in pids for f in glob.glob(f"/proc/{p}/task/*/schedstat"))
c0, t0 = cpu_ns(), time.monotonic()
sel = selectors.DefaultSelector()
socks = []
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    socks.append(s)
    sel.register(s, selectors.EVENT_WRITE)
sent, lat = {}, []
while len(lat) < n:
    for key, ev in sel.select(10):
        s = key.fileobj
        if ev & selectors.EVENT_WRITE:
            s.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            sent[s] = time.monotonic()
            sel.modify(s, selectors.EVENT_READ)
        elif b"\r\n\r\n" in s.recv(65536):
            lat.append(time.monotonic() - sent[s])
            sel.unregister(s)
wall, cpu = time.monotonic() - t0, cpu_ns() - c0
for s in socks:
    s.close()
lat.sort()
print(json.dumps({"wall_ms": wall * 1e3, "cpu_us_per_conn": cpu / 1e3 / n,
                  "p50_ms": lat[n // 2] * 1e3, "max_ms": lat[-1] * 1e3}))
PY

bursts() { # name port pid
  for i in $(seq 1 "$BURSTS"); do
    taskset -c "$LOAD_CPUS" python3 "$W/burst.py" "$2" "$N" "$3" >> "$OUT/$1.jsonl"
    sleep 0.5
  done
}

turnpike_env "$W/tp"
for variant in turnpike turnpike-thp; do
  if [ $variant = turnpike-thp ]; then export MIMALLOC_ALLOW_THP=1; else unset MIMALLOC_ALLOW_THP; fi
  start_turnpike "$W/$variant.log"
  bursts $variant 8000 $TP
  stop_pid $TP
done
unset MIMALLOC_ALLOW_THP

start_nginx "$W/nginx" 8002
sleep 0.2 # the worker process forks after the port opens
bursts nginx 8002 $NGX
stop_pid $NGX

python3 - "$OUT" "$N" <<'PY'
import json, pathlib, statistics, sys
out, n = pathlib.Path(sys.argv[1]), sys.argv[2]
lines = [f"commit {(out / 'commit').read_text().strip()}; bursts of {n} new connections, one request each; first burst cold", "",
         "| proxy | first burst: CPU µs/conn | first burst: p50 / max ms | later bursts (median): CPU µs/conn | later bursts (median): p50 / max ms |",
         "|---|---:|---:|---:|---:|"]
for name in ["turnpike", "turnpike-thp", "nginx"]:
    rows = [json.loads(l) for l in (out / f"{name}.jsonl").read_text().splitlines()]
    first, rest = rows[0], rows[1:]
    med = lambda k, f: f.format(statistics.median(r[k] for r in rest)) if rest else "—"
    lines.append(f"| {name} | {first['cpu_us_per_conn']:.0f} | {first['p50_ms']:.1f} / {first['max_ms']:.1f} | "
                 f"{med('cpu_us_per_conn', '{:.0f}')} | {med('p50_ms', '{:.1f}')} / {med('max_ms', '{:.1f}')} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results: $OUT"
