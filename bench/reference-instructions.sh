#!/usr/bin/env bash
# Instructions per request of the reference proxies under callgrind, measured like
# bench/instructions.sh: (Ir(N) - Ir(1)) / N over one keep-alive connection, nginx running as a
# single process (master_process off) in front of the same upstream.
# Usage: bench/reference-instructions.sh [N]   prints "nginx <n>", "nginx-lua-karl <n>" and
#   "nginx-gzip <n>" (gzip on for text/plain at any length, the client accepting gzip) and
#   "nginx-cache <n>" (proxy_cache of 200s: every request after the first is a hit)
#   (needs nginx, libnginx-mod-http-lua, valgrind)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=${1:-5000}
OUT=$(mktemp -d)
BENCH_TMP+=("$OUT")
start_upstream
ngx_lua_conf "$OUT/ngxlua" 8000
mkdir -p "$OUT/nginx"/{cbt,pt,ft,ut,st}
sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$OUT/nginx|g" -e 's/@PORT@/8000/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
    -e 's/@EXTRA_HTTP@//' -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > "$OUT/nginx/nginx.conf"
mkdir -p "$OUT/nginx-gzip"/{cbt,pt,ft,ut,st}
sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$OUT/nginx-gzip|g" -e 's/@PORT@/8000/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
    -e 's/@EXTRA_HTTP@/gzip on; gzip_types text\/plain; gzip_min_length 0;/' -e 's/@EXTRA_MAIN@//' \
    "$SHARED/nginx_proxy.conf.tmpl" > "$OUT/nginx-gzip/nginx.conf"
mkdir -p "$OUT/nginx-cache"/{cbt,pt,ft,ut,st,cache}
sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$OUT/nginx-cache|g" -e 's/@PORT@/8000/' \
    -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
    -e "s|@EXTRA_HTTP@|proxy_cache_path $OUT/nginx-cache/cache keys_zone=pc:10m; proxy_cache pc; proxy_cache_valid 200 5m;|" \
    -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > "$OUT/nginx-cache/nginx.conf"
count() { # dir requests header
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$OUT/cg.$2" \
    nginx -c "$1/nginx.conf" -p "$1" -e "$1/error.log" -g 'daemon off; master_process off;' \
    > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  HDR=$3 python3 - "$2" <<'PY'
import http.client, os, sys
c = http.client.HTTPConnection("127.0.0.1", 8000)
h = dict([os.environ["HDR"].split(": ", 1)]) if os.environ.get("HDR") else {}
for _ in range(int(sys.argv[1])):
    c.request("GET", "/", headers=h); r = c.getresponse(); r.read(); assert r.status == 200, r.status
PY
  kill -QUIT $vp; wait $vp 2>/dev/null || true
  grep -E '^(summary|totals):' "$OUT/cg.$2" | head -1 | awk '{print $2}'
}
for case in "nginx||$OUT/nginx" "nginx-lua-karl|apikey: key1|$OUT/ngxlua" "nginx-gzip|accept-encoding: gzip|$OUT/nginx-gzip" "nginx-cache||$OUT/nginx-cache"; do
  IFS='|' read -r name hdr dir <<< "$case"
  A=$(count "$dir" 1 "$hdr"); B=$(count "$dir" $((N + 1)) "$hdr")
  echo "$name $(( (B - A) / N ))"
done
