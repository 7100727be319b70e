#!/usr/bin/env bash
# Every benchmark in one command: builds the release binary (each script does, --locked), then
# runs Kong's eight cases over HTTP and HTTPS with the extra cases (10k routes, upstream
# keepalive off, HTTP/2) and instruction counts, the plain-proxy table, the constant-rate latency
# sweeps (plain, and key-auth + rate-limiting), new-connection bursts, memory per idle
# connection, both CPUs' busy share and CPU time per request (also with a CPU quota on the
# proxies), instructions per request under load, CPU time and TCP segments per request, where
# slow requests fall, ten upstream
# targets, and the CI
# instruction gate. Each writes its own folder under bench/results/ (raw outputs, summary.md,
# plots); this script lists them at the end and keeps its whole output in
# bench/results/all-<date>.log.
#
# CPU layout (bench/lib.sh): on 2 CPUs the proxy under test on CPU 0, the upstream and the load
# generator on CPU 1, as ../shared/bench-reference/README.md says; with more CPUs the proxy gets
# the first half (one worker per CPU) and load and upstream the rest.
#
# Usage: [RUNS=3] [DUR=10s] bench/all.sh      (about 80 minutes on a 2-CPU machine with the
# defaults; RUNS and DUR apply to the closed-loop cases; SWEEP_RUNS, SWEEP_DUR, SWEEP_CONNS,
# SWEEP_RATES, INSTRUCTIONS and TAIL_ROUNDS size the rest). A quick check of the whole chain:
#   RUNS=1 DUR=2s SWEEP_RUNS=1 SWEEP_DUR=1s SWEEP_CONNS=100 SWEEP_RATES=5000 INSTRUCTIONS=200 \
#   TAIL_ROUNDS=1 bench/all.sh Needs what `TURNPIKE_SETUP_BENCH=1 scripts/setup.sh` installs, and oha
# (`cargo install oha`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DUR=${DUR:-10s}
# The sweeps' and counts' sizes (smaller ones make a quick check of the whole chain).
SWEEP_RUNS=${SWEEP_RUNS:-3}
SWEEP_DUR=${SWEEP_DUR:-5s}
SWEEP_CONNS=${SWEEP_CONNS:-100 250 500 1000}
SWEEP_RATES=${SWEEP_RATES:-5000 10000 20000 30000 40000}
INSTRUCTIONS=${INSTRUCTIONS:-3000}
TAIL_ROUNDS=${TAIL_ROUNDS:-3}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
missing=()
for tool in nginx wrk valgrind openssl python3; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
[ -x "$OHA" ] || missing+=(oha)
[ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || missing+=(libnginx-mod-http-lua)
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]} (TURNPIKE_SETUP_BENCH=1 scripts/setup.sh; cargo install oha)" >&2
  exit 1
fi
mkdir -p bench/results
START=$(date -u +%Y%m%d-%H%M%S)
LOG=bench/results/all-$START.log
MARK=$(mktemp)
trap 'rm -f "$MARK"' EXIT
step() {
  echo "== $* ($(date -u +%H:%M:%S) UTC)" | tee -a "$LOG"
  "$@" >> "$LOG" 2>&1
}
step env INSTRUCTIONS="$INSTRUCTIONS" EXTRA=1 bench/kong-cases.sh "$RUNS" "$DUR" "http https"
step env CALLGRIND_N="$((INSTRUCTIONS * 5))" bench/plain-proxy.sh "$RUNS" "$DUR"
step env RUNS="$SWEEP_RUNS" bench/latency-sweep.sh "$SWEEP_DUR" "$SWEEP_CONNS" "$SWEEP_RATES"
step env CASE=ka-rl RUNS="$SWEEP_RUNS" bench/latency-sweep.sh "$SWEEP_DUR" "$SWEEP_CONNS" "$SWEEP_RATES"
step bench/experiments/connection-burst.sh 500 6
step bench/idle-connections.sh 5000 3
step bench/experiments/same-work.sh "$RUNS" "$DUR"
# The same with each proxy held to 70% of its CPU, where the machine's cgroups allow it.
if [ -w /sys/fs/cgroup/cpu/cgroup.procs ] || [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
  step env QUOTA=70 bench/experiments/same-work.sh "$RUNS" "$DUR"
fi
step bench/instructions-under-load.sh 20s
step bench/experiments/cpu-split.sh 2 5s
step bench/experiments/tcp-segments.sh 2 4s
step bench/experiments/startup-tail.sh "$TAIL_ROUNDS" 500 5000 "$SWEEP_DUR"
step bench/upstream-targets.sh "$RUNS" "$DUR"
step bench/instructions-gate.sh
echo "results (each with summary.md):"
find bench/results -mindepth 1 -maxdepth 1 -type d -newer "$MARK" | sort
echo "log: $LOG"
