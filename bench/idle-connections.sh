#!/usr/bin/env bash
# Memory per idle keep-alive connection: Turnpike beside the nginx reference proxy, same run.
# N clients each open a connection, make one request (one after another, as clients that come
# and go do) and keep the connection open; after WAIT seconds (past Turnpike's 1 s linger, when
# every connection is idle) the growth of the worker's resident memory is divided by N.
# Turnpike is measured twice: with mimalloc's defaults (freed memory is kept for reuse until
# later allocations purge it, or until the worker, quiet for two 1 s ticks, hands it back:
# server::QuietWatch) and with MIMALLOC_PURGE_DELAY=0 (freed memory goes back at once: what
# the idle connections themselves hold). WAIT should be 3 s or more for the first to settle.
# Usage: bench/idle-connections.sh [N] [WAIT]   (needs nginx, python3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=${1:-5000}
WAIT=${2:-3}
bench_begin idle-connections
start_upstream
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

clients() { # port pid -> "before after" (KiB)
  python3 - "$1" "$2" "$N" "$WAIT" <<'PY'
import socket, sys, time
port, pid, n, wait = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
def one(s):
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    d = b""
    while not d.endswith(b"ok\n"):
        got = s.recv(4096)
        assert got, d
        d += got
for _ in range(20):  # warm-up on connections that close
    s = socket.create_connection(("127.0.0.1", port)); one(s); s.close()
time.sleep(wait)
before = rss()
conns = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port)); one(s); conns.append(s)
time.sleep(wait)
print(before, rss())
PY
}

# nginx reference proxy (one worker), enough connections for N.
mkdir -p "$W/nginx"/{cbt,pt,ft,ut,st}
sed -e "s|/tmp/bench/@NAME@|$W/nginx|g" -e 's/@PORT@/8002/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' -e 's/@EXTRA_HTTP@//' \
    -e "s/@EXTRA_MAIN@/worker_rlimit_nofile 65536;/" -e "s/worker_connections 4096/worker_connections 65536/" \
    "$SHARED/nginx_proxy.conf.tmpl" > "$W/nginx/nginx.conf"
taskset -c "$PROXY_CPUS" nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;' &
NGM=$!
BENCH_PIDS+=($NGM)
wait_port 8002
NGW=$(pgrep -P "$NGM" | head -1)
read -r NB NA < <(clients 8002 "$NGW")
kill "$NGM"; wait "$NGM" 2>/dev/null || true

turnpike_env "$W/tp"
start_turnpike "$OUT/raw/turnpike.log"
read -r TB TA < <(clients 8000 "$TP")
kill "$TP"; wait "$TP" 2>/dev/null || true
MIMALLOC_PURGE_DELAY=0 start_turnpike "$OUT/raw/turnpike-purge0.log"
read -r PB PA < <(clients 8000 "$TP")
kill "$TP"; wait "$TP" 2>/dev/null || true

per() { echo $(( ($2 - $1) * 1024 / N )); }
{
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; commit $(cat "$OUT/commit"); $N connections, ${WAIT} s wait"
  echo
  echo "| proxy | RSS before (KiB) | RSS after (KiB) | bytes per idle connection |"
  echo "|---|---:|---:|---:|"
  echo "| nginx (reference) | $NB | $NA | $(per "$NB" "$NA") |"
  echo "| Turnpike | $TB | $TA | $(per "$TB" "$TA") |"
  echo "| Turnpike, MIMALLOC_PURGE_DELAY=0 | $PB | $PA | $(per "$PB" "$PA") |"
} | tee "$OUT/summary.md"
echo "raw results: $OUT"
