#!/usr/bin/env bash
# Full TLS handshakes per second on the proxy CPUs: every request on a new TLS connection
# (wrk with `Connection: close`, TLS 1.3, no session resumption: wrk does not resume), Turnpike
# beside nginx (../shared/bench-reference's reverse proxy with an HTTPS listener) in the same
# run, alternating, RUNS runs of DURATION each. KEY: rsa (2048, as bench/kong-cases.sh) or
# ecdsa (P-256).
# Usage: bench/tls-handshakes.sh [RUNS] [DURATION] [KEY]
# Needs nginx, wrk, openssl.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUNS=${1:-3}
DUR=${2:-6s}
KEY=${3:-rsa}
bench_begin "tls-handshakes-$KEY"
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
sed -i "s|listen 127.0.0.1:8002 backlog=4096;|listen 127.0.0.1:8002 backlog=4096; listen 127.0.0.1:8445 ssl backlog=4096; ssl_certificate $W/cert.pem; ssl_certificate_key $W/key.pem;|" "$W/nginx/nginx.conf"
grep -q "listen 127.0.0.1:8445 ssl" "$W/nginx/nginx.conf"

turnpike_env "$W/tp"
export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000 reuseport backlog=4096, 127.0.0.1:8443 ssl reuseport backlog=4096"
export TURNPIKE_SSL_CERT=$W/cert.pem TURNPIKE_SSL_CERT_KEY=$W/key.pem
start_turnpike "$W/tp.log"
wait_port 8443
start_nginx "$W/nginx" 8445

run() { # label port run
  local conns=$((50 * PROXY_N))
  taskset -c "$LOAD_CPUS" wrk -t"$LOAD_N" -c"$conns" -d2s -H "Connection: close" "https://127.0.0.1:$2/" > /dev/null
  taskset -c "$LOAD_CPUS" wrk -t"$LOAD_N" -c"$conns" -d"$DUR" --latency -H "Connection: close" \
    "https://127.0.0.1:$2/" > "$OUT/raw/$1-run$3.txt"
}
for i in $(seq 1 "$RUNS"); do
  run turnpike 8443 "$i"
  run nginx 8445 "$i"
done

python3 - "$OUT" "$KEY" <<'PY' | tee "$OUT/summary.md"
import pathlib, re, statistics, sys
out, key = pathlib.Path(sys.argv[1]), sys.argv[2]
def rates(name):
    rs = []
    for f in sorted((out / "raw").glob(f"{name}-run*.txt")):
        t = f.read_text()
        m = re.search(r"Requests/sec:\s+([\d.]+)", t)
        errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
        if m:
            rs.append((float(m.group(1)), int(errs.group(1)) if errs else 0))
    return rs
tp, ngx = rates("turnpike"), rates("nginx")
mt, mn = statistics.median(r for r, _ in tp), statistics.median(r for r, _ in ngx)
print(f"| case | Turnpike handshakes/s (median; runs) | nginx (median; runs) | ratio |")
print(f"|---|---:|---:|---:|")
runs = lambda rs: ", ".join(f"{r:,.0f}" for r, _ in rs)
print(f"| new TLS connection per request, {key} | {mt:,.0f} ({runs(tp)}) | {mn:,.0f} ({runs(ngx)}) | {mt / mn:.2f}x |")
bad = sum(e for _, e in tp + ngx)
if bad:
    print(f"\nnon-2xx responses: {bad}")
PY
echo "raw results: $OUT"
