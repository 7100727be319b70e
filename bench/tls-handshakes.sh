#!/usr/bin/env bash
# TLS handshakes per second on the proxy CPUs, Turnpike beside nginx (../shared/bench-reference's
# reverse proxy with an HTTPS listener set up as Kong sets up its own: `ssl_protocols TLSv1.2
# TLSv1.3`, session tickets, a 10 MB shared session cache, 1 day timeout) in the same run,
# alternating, RUNS runs of DURATION each.
#   MODE=full (default): every request on a new connection with a full TLS 1.3 handshake (wrk
#     with `Connection: close`; wrk never resumes a session).
#   MODE=resume: every connection resumes the session of the client's first one (`openssl
#     s_time -reuse`, one single-threaded client per load CPU plus one).
# KEY: rsa (2048, as bench/kong-cases.sh) or ecdsa (P-256).
# Besides the rate, each run records the proxy's CPU time (user + system, all its processes and
# threads) and reports CPU microseconds per handshake: on 2 CPUs the load generator's side of a
# handshake costs about as much as the server's, so without a quota the rate is the client's
# and the CPU per handshake is the proxy's figure. QUOTA=P (bench/lib.sh) limits each proxy to
# P% of one CPU so that the rate is the proxy's too (QUOTA=40 leaves the client room).
# Usage: [MODE=full|resume] [QUOTA=P] bench/tls-handshakes.sh [RUNS] [DURATION] [KEY]
# Needs nginx, wrk, openssl.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUNS=${1:-3}
DUR=${2:-6s}
KEY=${3:-rsa}
MODE=${MODE:-full}
case $MODE in full | resume) ;; *) echo "MODE is full or resume" >&2; exit 2 ;; esac
bench_begin "tls-handshakes-$MODE-$KEY${QUOTA:+-quota$QUOTA}"
[ -n "$QUOTA" ] && echo "$(cat "$OUT/commit"); each proxy limited to $QUOTA% of one CPU (cgroup)" > "$OUT/commit"
ports_free 8000 8443 8101 8002 8445
start_upstream "$LOAD_CPUS"

case $KEY in
  rsa) newkey=(-newkey rsa:2048) ;;
  ecdsa) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1) ;;
  *) echo "KEY is rsa or ecdsa" >&2; exit 2 ;;
esac
openssl req -x509 "${newkey[@]}" -nodes -days 2 -subj /CN=localhost \
  -keyout "$W/key.pem" -out "$W/cert.pem" 2>/dev/null

ngx_conf "$W/nginx" 8002
sed -i "s|listen 127.0.0.1:8002 backlog=4096;|listen 127.0.0.1:8002 backlog=4096; listen 127.0.0.1:8445 ssl backlog=4096; ssl_certificate $W/cert.pem; ssl_certificate_key $W/key.pem; $NGX_KONG_TLS|" "$W/nginx/nginx.conf"
grep -q "listen 127.0.0.1:8445 ssl" "$W/nginx/nginx.conf"

turnpike_env "$W/tp"
export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096, 127.0.0.1:8443 ssl reuseport backlog=4096"
export TURNPIKE_SSL_CERT=$W/cert.pem TURNPIKE_SSL_CERT_KEY=$W/key.pem
in_quota turnpike taskset -c "$PROXY_CPUS" "$BIN" start > "$W/tp.log" 2>&1 &
TP=$!
BENCH_PIDS+=($TP)
wait_port 8443
in_quota nginx taskset -c "$PROXY_CPUS" nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;' &
NGX=$!
BENCH_PIDS+=($NGX)
wait_port 8445
for p in 8443 8445; do
  printf 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' |
    timeout 5 openssl s_client -connect 127.0.0.1:$p -ign_eof 2>&1 | grep -m1 "Cipher is" | sed "s/^/port $p: /" >> "$OUT/commit"
done

# Ticks (1/100 s) of user and system CPU used so far by a process, its threads and children.
cpu_ticks() {
  local p
  for p in "$1" $(pgrep -P "$1"); do cat /proc/"$p"/task/*/stat 2>/dev/null; done |
    awk '{s += $14 + $15} END {print s + 0}'
}
# load PORT SECONDS: prints the number of completed connections.
load() {
  if [ "$MODE" = full ]; then
    taskset -c "$LOAD_CPUS" wrk -t"$LOAD_N" -c"$((50 * PROXY_N))" -d"$2"s -H "Connection: close" \
      "https://127.0.0.1:$1/" | tee -a "$LOG" | awk '/requests in/ {print $1}'
  else
    local i
    for i in $(seq 0 "$LOAD_N"); do
      # A client still running 20 s after its time is reported as hung.
      { timeout $(($2 + 20)) taskset -c "$LOAD_CPUS" openssl s_time -connect "127.0.0.1:$1" -reuse -www / -time "$2" 2>&1 ||
          echo "HUNG client on port $1" >> "$OUT/hung"; } |
        tee -a "$LOG" | awk '/connections in .* real seconds/ {print $1}' &
    done | awk '{s += $1} END {print s}' # (awk ends when the last client does)
  fi
}
run() { # label port pid run
  local secs=${DUR%s} t0 t1 w0 w1 n
  LOG=$OUT/raw/$1-run$4.txt
  : > "$LOG"
  load "$2" 2 > /dev/null
  t0=$(cpu_ticks "$3")
  w0=$(date +%s.%N)
  n=$(load "$2" "$secs")
  w1=$(date +%s.%N)
  t1=$(cpu_ticks "$3")
  echo "connections $n seconds $(echo "$w1 - $w0" | bc) proxy_cpu_ticks $((t1 - t0))" >> "$LOG"
}
for i in $(seq 1 "$RUNS"); do
  run turnpike 8443 "$TP" "$i"
  run nginx 8445 "$NGX" "$i"
done

python3 - "$OUT" "$KEY" "$MODE" <<'PY' | tee "$OUT/summary.md"
import pathlib, re, statistics, sys
out, key, mode = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def runs(name):
    rs = []
    for f in sorted((out / "raw").glob(f"{name}-run*.txt")):
        m = re.search(r"connections (\d+) seconds ([\d.]+) proxy_cpu_ticks (\d+)", f.read_text())
        n, secs, ticks = int(m.group(1)), float(m.group(2)), int(m.group(3))
        rs.append((n / secs, ticks * 10_000 / max(n, 1)))
    return rs
tp, ngx = runs("turnpike"), runs("nginx")
med = lambda rs, i: statistics.median(r[i] for r in rs)
fmt = lambda rs, i: ", ".join(f"{r[i]:,.0f}" for r in rs)
what = {"full": "new TLS 1.3 connection per request (full handshake)",
        "resume": "new connection per request, session resumed"}[mode]
print("| case | Turnpike (median; runs) | nginx (median; runs) | ratio |")
print("|---|---:|---:|---:|")
print(f"| {what}, {key}: handshakes/s | {med(tp, 0):,.0f} ({fmt(tp, 0)}) | {med(ngx, 0):,.0f} ({fmt(ngx, 0)}) | {med(tp, 0) / med(ngx, 0):.2f}x |")
print(f"| {what}, {key}: proxy CPU µs per handshake | {med(tp, 1):,.0f} ({fmt(tp, 1)}) | {med(ngx, 1):,.0f} ({fmt(ngx, 1)}) | {med(tp, 1) / med(ngx, 1):.2f}x |")
PY
[ -f "$OUT/hung" ] && cat "$OUT/hung"
cat "$OUT/commit"
echo "raw results: $OUT"
