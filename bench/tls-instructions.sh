#!/usr/bin/env bash
# Instructions per HTTPS request under callgrind, Turnpike beside nginx with Kong's TLS settings
# (NGX_KONG_TLS), measured like bench/instructions.sh: (Ir(N + 1) - Ir(1)) / N over one
# keep-alive TLS 1.3 connection (Python's ssl: TLS_AES_256_GCM_SHA384), each proxy with one
# worker in front of the same upstream, the same ECDSA P-256 certificate. Where a TLS request's
# instructions go: each proxy's callgrind profile of the N + 1 requests, less the one of 1,
# grouped by library / our crates (callgrind_annotate, inclusive of nothing: self cost).
# Usage: [KEEP=dir] bench/tls-instructions.sh [N]
#   prints "turnpike <n>", "nginx <n>", then each one's top self-cost groups per request.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
N=${1:-3000}
OUT=$(mktemp -d)
BENCH_TMP+=("$OUT")
cargo build --release --locked -p turnpike >&2
BIN=$ROOT/target/release/turnpike
start_upstream
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=localhost -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>/dev/null
turnpike_env "$OUT/tp"
export TURNPIKE_PROXY_LISTEN="127.0.0.1:8000, 127.0.0.1:8443 ssl"
export TURNPIKE_SSL_CERT=$OUT/cert.pem TURNPIKE_SSL_CERT_KEY=$OUT/key.pem
mkdir -p "$OUT/nginx"/{cbt,pt,ft,ut,st}
sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$OUT/nginx|g" -e 's/@PORT@/8000/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
    -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > "$OUT/nginx/nginx.conf"
sed -i "s|listen 127.0.0.1:8000 backlog=4096;|listen 127.0.0.1:8000 backlog=4096; listen 127.0.0.1:8443 ssl backlog=4096; ssl_certificate $OUT/cert.pem; ssl_certificate_key $OUT/key.pem; $NGX_KONG_TLS|" "$OUT/nginx/nginx.conf"
grep -q "listen 127.0.0.1:8443 ssl" "$OUT/nginx/nginx.conf" || { echo "nginx.conf: no HTTPS listener" >&2; exit 1; }

requests() {
  python3 - "$1" <<'PY'
import http.client, ssl, sys
c = http.client.HTTPSConnection("127.0.0.1", 8443, context=ssl._create_unverified_context())
for _ in range(int(sys.argv[1])):
    c.request("GET", "/"); r = c.getresponse(); r.read(); assert r.status == 200, r.status
PY
}
count() { # name requests
  if [ "$1" = turnpike ]; then
    valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$OUT/$1.$2" "$BIN" start > /dev/null 2>&1 &
  else
    valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$OUT/$1.$2" \
      nginx -c "$OUT/nginx/nginx.conf" -p "$OUT/nginx" -e "$OUT/nginx/error.log" -g 'daemon off; master_process off;' \
      > /dev/null 2>&1 &
  fi
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8443) 2>/dev/null && break; sleep 0.1; done
  requests "$2"
  if [ "$1" = turnpike ]; then kill -TERM $vp; else kill -QUIT $vp; fi
  wait $vp 2>/dev/null || true
  grep -E '^(summary|totals):' "$OUT/$1.$2" | head -1 | awk '{print $2}'
}
for p in turnpike nginx; do
  A=$(count $p 1); B=$(count $p $((N + 1)))
  echo "$p $(( (B - A) / N ))"
done
# Self cost per request by group: the difference of the two profiles' per-function totals.
for p in turnpike nginx; do
  for n in 1 $((N + 1)); do
    callgrind_annotate --threshold=100 --inclusive=no --auto=no "$OUT/$p.$n" 2>/dev/null > "$OUT/$p.$n.txt"
  done
  echo "== $p: self instructions per request by group (top 14)"
  python3 - "$OUT/$p.1.txt" "$OUT/$p.$((N + 1)).txt" "$N" <<'PY'
import re, sys, collections
def load(f):
    d = collections.Counter()
    for line in open(f):
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
        if not m: continue
        n = int(m.group(1).replace(",", ""))
        where = m.group(2)
        lib = re.search(r"\[([^\]]+)\]\s*$", where)
        lib = lib.group(1).rsplit("/", 1)[-1] if lib else ""
        where = re.sub(r"\s*\[[^\]]*\]\s*$", "", where)
        obj, _, fn = where.partition(":")
        if "PROGRAM TOTALS" in where: continue
        if "ring_core" in fn or "/ring-0" in obj: g = "ring (AES-GCM, SHA)"
        elif "aws_lc" in fn or "aws-lc" in obj: g = "aws-lc"
        elif "rustls" in fn or "rustls" in obj: g = "rustls"
        elif "libcrypto" in lib or "libcrypto" in obj: g = "libcrypto (OpenSSL)"
        elif "libssl" in lib or "libssl" in obj: g = "libssl (OpenSSL)"
        elif re.search(r"mem(cpy|move|set|cmp)|__memcpy|__memmove|__memset", fn): g = "memcpy/memset"
        elif "tokio" in fn or "tokio" in obj: g = "tokio"
        elif "mimalloc" in fn or "mi_" in fn[:4] or "malloc" in fn or "free" in fn: g = "allocator"
        elif "libc.so" in lib or "libc" in obj: g = "libc (other)"
        elif "turnpike" in fn or "turnpike" in obj: g = "turnpike crates"
        elif "hyper" in fn or "http" in obj: g = "hyper/http"
        elif "ngx_" in fn: g = "nginx"
        else: g = "other"
        d[g] += n
    return d
a, b, n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
for g, v in sorted(((g, (b[g] - a[g]) / n) for g in b), key=lambda x: -x[1])[:14]:
    print(f"  {g:24s} {v:10.0f}")
PY
done
[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$OUT"/*.txt "$KEEP"/ || true
