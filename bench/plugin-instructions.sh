#!/usr/bin/env bash
# Instructions per request (callgrind, bench/instructions.sh) of this wave's plugins beside
# plain proxying, each on one route to the reference upstream (GET / -> "ok\n", text/plain):
# request-transformer (headers, querystring, templates), bot-detection (a browser's
# User-Agent, checked against Kong's rules), statsd and udp-log (one request's metrics or
# entry queued to the sender thread, which sends to a port nobody listens on; datadog's tagged
# metrics, tcp-log's entry, syslog's entry to a socket that is not there, likewise), and response
# compression (gzip of the 3-byte body, the client accepting gzip) beside nginx's gzip
# (bench/reference-instructions.sh's nginx-gzip), and proxy-cache hits (every request after the
# first) beside nginx's proxy_cache (nginx-cache).
# Usage: bench/plugin-instructions.sh [N]   (needs valgrind, nginx)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
N=${1:-5000}
W=$(mktemp -d)
BENCH_TMP+=("$W")
OUT=$ROOT/bench/results/plugin-instructions-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
git -C "$ROOT" rev-parse --short HEAD > "$OUT/commit" 2>/dev/null || true
head='_format_version: "3.0"
services:
- name: u
  url: http://127.0.0.1:9001
  routes:
  - name: r
    paths: [/]'
cfg() { printf '%s\n%s\n' "$head" "$2" > "$W/$1.yml"; }
cfg plain ""
cfg request-transformer '    plugins:
    - name: request-transformer
      config:
        remove: {headers: [x-drop]}
        add: {headers: ["x-user:$(headers.x_user)", "x-fixed:yes"], querystring: ["q:1"]}
        rename: {headers: ["x-old:x-new"]}'
cfg bot-detection '    plugins:
    - name: bot-detection'
cfg statsd '    plugins:
    - name: statsd
      config: {host: 127.0.0.1, port: 9}'
cfg proxy-cache '    plugins:
    - name: proxy-cache
      config: {strategy: memory, content_type: [text/plain]}'
cfg opentelemetry '    plugins:
    - name: opentelemetry
      config: {traces_endpoint: "http://127.0.0.1:9/v1/traces"}'
cfg tcp-log '    plugins:
    - name: tcp-log
      config: {host: 127.0.0.1, port: 9}'
cfg syslog '    plugins:
    - name: syslog'
cfg datadog '    plugins:
    - name: datadog
      config: {host: 127.0.0.1, port: 9}'
cfg zipkin '    plugins:
    - name: zipkin
      config: {http_endpoint: "http://127.0.0.1:9/api/v2/spans", sample_ratio: 1}'
cfg udp-log '    plugins:
    - name: udp-log
      config: {host: 127.0.0.1, port: 9}'
UA="user-agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36"
{
  echo "| case | instructions per request | over plain |"
  echo "|---|---:|---:|"
  plain=$(CONFIG=$W/plain.yml HEADERS="$UA" bench/instructions.sh "$N")
  echo "| plain | $plain | |"
  for c in request-transformer bot-detection statsd datadog udp-log tcp-log syslog zipkin; do
    n=$(CONFIG=$W/$c.yml HEADERS="$UA|x-user: u1|x-old: o|x-drop: d" bench/instructions.sh "$N")
    echo "| $c | $n | +$((n - plain)) |"
  done
  # Every request traced and its span queued (sampling 1.0; the collector port refuses).
  n=$(CONFIG=$W/opentelemetry.yml HEADERS="$UA" TURNPIKE_TRACING_INSTRUMENTATIONS=all \
      TURNPIKE_TRACING_SAMPLING_RATE=1 bench/instructions.sh "$N")
  echo "| opentelemetry (sampling 1.0) | $n | +$((n - plain)) |"
  # A hit, with the same request headers as plain (the response is the upstream's, cached).
  n=$(CONFIG=$W/proxy-cache.yml HEADERS="$UA" bench/instructions.sh "$N")
  echo "| proxy-cache (hits) | $n | $((n - plain)) |"
  n=$(CONFIG=$W/plain.yml HEADERS="$UA|accept-encoding: gzip" TURNPIKE_NGINX_PROXY_GZIP=on \
      TURNPIKE_NGINX_PROXY_GZIP_TYPES=text/plain TURNPIKE_NGINX_PROXY_GZIP_MIN_LENGTH=0 bench/instructions.sh "$N")
  echo "| gzip (nginx_proxy_gzip, 3-byte body) | $n | +$((n - plain)) |"
} | tee "$OUT/summary.md"
echo "nginx reference (same N): $(bench/reference-instructions.sh "$N" | tr '\n' ' ')" | tee -a "$OUT/summary.md"
echo "raw results: $OUT"
