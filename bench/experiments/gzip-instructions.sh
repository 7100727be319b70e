#!/usr/bin/env bash
# gzip's cost in instructions per request (callgrind, as bench/instructions.sh counts them),
# Turnpike beside nginx in one run, for bodies of several sizes served by the upstream:
#   - below `gzip_min_length` (nginx's default 20; the 3-byte body): what gzip being on costs
#     a response it must not compress (should be nothing over plain proxying);
#   - at and above it: the cost over plain proxying, and per byte of body, against nginx's.
# Usage: [BENCH_BIN=path] bench/experiments/gzip-instructions.sh [N] [SIZES]   (default N 2000, SIZES "3 100 4096 65536")
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
N=${1:-2000}
SIZES=${2:-"3 100 4096 65536"}
OUT=$ROOT/bench/results/gzip-instructions-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
if [ -z "${BENCH_BIN:-}" ]; then
  cargo build --release --locked -p turnpike >&2
  # One binary for every row, whatever is edited while the run lasts.
  cp "$ROOT/target/release/turnpike" "$OUT/turnpike"
  export BENCH_BIN=$OUT/turnpike
fi
{ git -C "$ROOT" rev-parse --short HEAD; echo "binary $BENCH_BIN"; } > "$OUT/commit" 2>/dev/null || true
UP=$(mktemp -d)
BENCH_TMP+=("$UP")

# An upstream serving text of SIZE bytes at / (JSON-like lines: compressible as API bodies are).
upstream() {
  [ -n "${UPSTREAM_PID:-}" ] && { kill "$UPSTREAM_PID"; wait "$UPSTREAM_PID" 2>/dev/null || true; }
  mkdir -p "$UP"/{cbt,pt,ft,ut,st,www}
  python3 - "$1" > "$UP/www/body.txt" <<'PY'
import sys
n = int(sys.argv[1])
line = '{"id": %d, "name": "item-%d", "status": "active", "tags": ["a", "b"]}\n'
out, i = "", 0
while len(out) < n:
    out += line % (i, i * 7 % 1000)
    i += 1
sys.stdout.write(out[:n])
PY
  cat > "$UP/upstream.conf" <<EOF
worker_processes 1; daemon off; pid $UP/nginx.pid; error_log $UP/error.log warn;
events { worker_connections 1024; }
http {
  access_log off; keepalive_requests 1000000; keepalive_timeout 60s;
  client_body_temp_path $UP/cbt; proxy_temp_path $UP/pt; fastcgi_temp_path $UP/ft; uwsgi_temp_path $UP/ut; scgi_temp_path $UP/st;
  server {
    listen 127.0.0.1:9001 reuseport;
    location / { default_type text/plain; root $UP/www; try_files /body.txt =404; etag off; }
  }
}
EOF
  chmod 755 "$UP" "$UP/www" && chmod 644 "$UP/www/body.txt"  # nginx's workers run as nobody
  nginx -c "$UP/upstream.conf" -p "$UP" -e "$UP/error.log" &
  UPSTREAM_PID=$!
  BENCH_PIDS+=("$UPSTREAM_PID")
  wait_port 9001
  local got
  got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' http://127.0.0.1:9001/)
  [ "$got" = "200 $1" ] || { echo "the upstream answers '$got', not 200 with $1 bytes" >&2; exit 1; }
}

# nginx in front of the same upstream, as bench/reference-instructions.sh runs it.
nginx_count() { # extra-http requests header
  local dir
  dir=$(mktemp -d)
  BENCH_TMP+=("$dir")
  mkdir -p "$dir"/{cbt,pt,ft,ut,st}
  sed -e "s|@NAME@|nginx|g" -e "s|/tmp/bench/nginx|$dir|g" -e 's/@PORT@/8000/' \
      -e 's/@UPKA@/keepalive 64; keepalive_requests 1000000;/' -e 's/@ACCESS@//' \
      -e "s|@EXTRA_HTTP@|$1|" -e 's/@EXTRA_MAIN@//' "$SHARED/nginx_proxy.conf.tmpl" > "$dir/nginx.conf"
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$dir/cg" \
    nginx -c "$dir/nginx.conf" -p "$dir" -e "$dir/error.log" -g 'daemon off; master_process off;' \
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
  grep -E '^(summary|totals):' "$dir/cg" | head -1 | awk '{print $2}'
}
nginx_per_request() { # extra-http header
  local a b
  a=$(nginx_count "$1" 1 "$2"); b=$(nginx_count "$1" $((N + 1)) "$2")
  echo $(( (b - a) / N ))
}

{
  echo "| body bytes | Turnpike plain | Turnpike gzip | over plain | per byte | nginx plain | nginx gzip | over plain | per byte | ratio (over plain) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for size in $SIZES; do
    upstream "$size"
    tp_plain=$(HEADERS="accept-encoding: gzip" bench/instructions.sh "$N")
    # nginx's defaults: gzip_min_length 20, gzip_types adds text/plain here.
    tp_gzip=$(HEADERS="accept-encoding: gzip" TURNPIKE_NGINX_PROXY_GZIP=on \
      TURNPIKE_NGINX_PROXY_GZIP_TYPES=text/plain bench/instructions.sh "$N")
    ng_plain=$(nginx_per_request "" "accept-encoding: gzip")
    ng_gzip=$(nginx_per_request "gzip on; gzip_types text\/plain;" "accept-encoding: gzip")
    tp_over=$((tp_gzip - tp_plain)); ng_over=$((ng_gzip - ng_plain))
    ratio=$(python3 -c "print('%.2f' % ($tp_over / $ng_over) if $ng_over > 0 else 'n/a')")
    echo "| $size | $tp_plain | $tp_gzip | $tp_over | $(python3 -c "print('%.2f' % ($tp_over / $size))") | $ng_plain | $ng_gzip | $ng_over | $(python3 -c "print('%.2f' % ($ng_over / $size))") | $ratio |"
  done
} | tee "$OUT/summary.md"
echo "raw results: $OUT"
