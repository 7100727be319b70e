#!/usr/bin/env bash
# Latency at a given rate, corrected for coordinated omission, beside nginx: the sweep ingress
# tuning guides use. For each concurrency (connections) and each offered rate, `oha` sends at
# that constant rate for DURATION with `--latency-correction` (latency counted from when a
# request was due, not from when a busy connection could send it: wrk2's method) and reports
# p50/p99/p99.9 and the share of requests that succeeded. One line per concurrency in the plot.
#
# Layout of bench/lib.sh: on 2 CPUs the proxy pinned to CPU 0 with one worker, the upstream and
# the load generator on CPU 1 (with more CPUs, half for the proxy, one worker each). HTTP. CASE=plain (default): plain proxy, one route, beside nginx;
# CASE=ka-rl: key-auth + rate-limiting (one consumer, a yearly limit never reached), beside the
# nginx + Lua emulation of ../shared/bench-reference/. RUNS (default 1) runs per point, the
# proxies alternated run by run; the table and plot show each point's median run by p99.
#
# Usage: [CASE=plain|ka-rl] [RUNS=1] bench/latency-sweep.sh [DURATION] ["CONCURRENCIES"] ["RATES"]
#   e.g. bench/latency-sweep.sh 5s "100 250 500 1000" "5000 10000 20000 30000 40000"
# Needs nginx (+ libnginx-mod-http-lua for ka-rl), oha (`cargo install oha`), python3
# (+ python3-matplotlib for the plot).
# Results: bench/results/latency-sweep-<date>/ (every run's raw oha JSON, summary.md, plot).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
DUR=${1:-5s}
CONCURRENCIES=${2:-100 250 500 1000}
RATES=${3:-5000 10000 20000 30000 40000}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
CASE=${CASE:-plain}
RUNS=${RUNS:-1}
bench_begin latency-sweep
start_upstream "$LOAD_CPUS"

# The reference: nginx for the plain case, the nginx + Lua emulation for key-auth + rate limiting.
if [ "$CASE" = ka-rl ]; then
  REF=nginx-lua
  ngx_lua_conf "$W/nginx" 8002
  AUTH=(-H "apikey: key-0")
  REF_AUTH=(-H "apikey: key1")
  printf '_format_version: "3.0"\nservices: [{name: u, url: "http://127.0.0.1:9001", routes: [{name: all, paths: [/], plugins: [{name: key-auth}, {name: rate-limiting, config: {year: 1000000000000, limit_by: consumer}}]}]}]\nconsumers: [{username: c0, keyauth_credentials: [{key: key-0}]}]\n' > "$W/ka-rl.yml"
else
  REF=nginx
  ngx_conf "$W/nginx" 8002
  AUTH=()
  REF_AUTH=()
fi
echo "$CASE" > "$OUT/case"

sweep() { # name port run header...
  local name=$1 port=$2 run=$3
  shift 3
  for c in $CONCURRENCIES; do
    for r in $RATES; do
      taskset -c "$LOAD_CPUS" "$OHA" --no-tui --output-format json --latency-correction "$@" \
        -c "$c" -q "$r" -z "$DUR" "http://127.0.0.1:$port/" > "$OUT/raw/$name-c$c-r$r-run$run.json" 2>/dev/null || true
    done
  done
}

turnpike_env "$W/tp"
[ "$CASE" = ka-rl ] && export TURNPIKE_DECLARATIVE_CONFIG=$W/ka-rl.yml
for run in $(seq 1 "$RUNS"); do
  start_turnpike "$W/tp.log"
  sweep turnpike 8000 "$run" "${AUTH[@]}"
  stop_pid $TP

  start_nginx "$W/nginx" 8002
  sweep "$REF" 8002 "$run" "${REF_AUTH[@]}"
  stop_pid $NGX
done

"$(report_python)" - "$OUT" "$CONCURRENCIES" "$RATES" "$DUR" "$RUNS" "$REF" <<'PY'
import json, pathlib, sys
out, cs, rs, dur = pathlib.Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
runs, ref = int(sys.argv[5]), sys.argv[6]
case = (out / "case").read_text().strip()
def one(p):
    try:
        j = json.loads(p.read_text())
    except Exception:
        return None
    s, pct = j["summary"], j["latencyPercentiles"]
    if pct.get("p99") is None:
        return None
    return {"rps": s["requestsPerSec"], "success": s["successRate"],
            "p50": pct["p50"] * 1000, "p99": pct["p99"] * 1000, "p999": pct["p99.9"] * 1000}
def point(name, c, r):
    # The median run by p99 (the lower one of an even count; with RUNS=1, the run).
    pts = [p for p in (one(out / "raw" / f"{name}-c{c}-r{r}-run{k}.json") for k in range(1, runs + 1)) if p]
    if not pts:
        return None
    pts.sort(key=lambda p: p["p99"])
    return pts[(len(pts) - 1) // 2]
lines = [f"commit {(out / 'commit').read_text().strip()}; case {case}; {dur} per point, {runs} run(s) per point (median by p99); oha --latency-correction (constant rate)", "",
         "| proxy | connections | offered rate | achieved RPS | success | p50 ms | p99 ms | p99.9 ms |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
data = {}
for name in ["turnpike", ref]:
    for c in cs:
        for r in rs:
            pt = point(name, c, r)
            data[(name, c, r)] = pt
            if pt:
                lines.append(f"| {name} | {c} | {int(r):,} | {pt['rps']:,.0f} | {pt['success']:.2%} | {pt['p50']:.2f} | {pt['p99']:.2f} | {pt['p999']:.2f} |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, name in zip(axes, ["turnpike", ref]):
        for c in cs:
            xs = [int(r) for r in rs if data.get((name, c, r))]
            ys = [data[(name, c, r)]["p99"] for r in rs if data.get((name, c, r))]
            ax.plot(xs, ys, marker="o", label=f"{c} connections")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_title(f"{name} ({case}): p99 latency at a constant rate")
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("p99 ms (coordinated-omission corrected)")
    fig.tight_layout()
    fig.savefig(out / "sweep-p99.svg")
    lines += ["", "Plot: `sweep-p99.svg`"]
except ImportError:
    lines += ["", "(no plot: python3-matplotlib is not installed)"]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results: $OUT"
