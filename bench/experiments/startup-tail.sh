#!/usr/bin/env bash
# Where a constant-rate run's slow requests are: in its first half second (new connections
# arriving together) or spread over the run. Each round starts a fresh proxy process and runs
# oha twice against it (the first run meets a cold process, the second a warm one), recording
# every request (`oha --db-url`), for Turnpike as shipped, Turnpike with transparent huge pages
# allowed (MIMALLOC_ALLOW_THP=1) and nginx, alternated round by round.
#
# Per run: p99 of the whole run, p99 without the first 0.5 s, and how many requests took over
# 10 ms in the first 0.5 s and after it. Latency is oha's coordinated-omission corrected one
# (from when the request was due). Layout as bench/latency-sweep.sh.
# Usage: bench/experiments/startup-tail.sh [ROUNDS] [CONNECTIONS] [RATE] [DURATION]   (needs nginx, oha)
# Results: bench/results/startup-tail-<date>/ (runs.txt, summary.md; the request databases
# are deleted after they are read: ~5 MB each).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh
ROUNDS=${1:-3}
C=${2:-500}
RATE=${3:-5000}
DUR=${4:-5s}
OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
bench_begin startup-tail
start_upstream "$LOAD_CPUS"
ngx_conf "$W/nginx" 8002

cat > "$W/runstat.py" <<'PY'
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select start, start_latency_correction, end from oha").fetchall()
due = [(r[1] or r[0], r[2]) for r in rows]
t0 = min(d for d, _ in due)
lat = sorted(e - d for d, e in due)
late = sorted(e - d for d, e in due if d - t0 >= 0.5)
p99 = lambda xs: xs[int(len(xs) * 0.99)] * 1e3
slow_start = sum(1 for d, e in due if d - t0 < 0.5 and e - d > 0.01)
slow_after = sum(1 for d, e in due if d - t0 >= 0.5 and e - d > 0.01)
print(f"{sys.argv[2]} {sys.argv[3]} {len(rows)} {p99(lat):.2f} {p99(late):.2f} {slow_start} {slow_after}")
PY

runs() { # name port
  for i in cold warm; do
    rm -f "$W/req.db"
    taskset -c "$LOAD_CPUS" "$OHA" --no-tui --output-format json --latency-correction -c "$C" -q "$RATE" -z "$DUR" \
      --db-url "$W/req.db" "http://127.0.0.1:$2/" > /dev/null 2>&1 || true
    python3 "$W/runstat.py" "$W/req.db" "$1" $i | tee -a "$OUT/runs.txt"
  done
}

turnpike_env "$W/tp"
for _ in $(seq 1 "$ROUNDS"); do
  for variant in turnpike turnpike-thp; do
    if [ $variant = turnpike-thp ]; then export MIMALLOC_ALLOW_THP=1; else unset MIMALLOC_ALLOW_THP; fi
    start_turnpike "$W/tp.log"
    runs $variant 8000
    stop_pid $TP
  done
  unset MIMALLOC_ALLOW_THP
  start_nginx "$W/nginx" 8002
  runs nginx 8002
  stop_pid $NGX
done

python3 - "$OUT" "$C" "$RATE" "$DUR" <<'PY'
import pathlib, statistics, sys
out, c, rate, dur = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rows = [l.split() for l in (out / "runs.txt").read_text().splitlines()]
lines = [f"commit {(out / 'commit').read_text().strip()}; oha --latency-correction -c {c} -q {rate} -z {dur}; medians over rounds (each round: a fresh process)", "",
         "| proxy | run | p99 ms | p99 ms without the first 0.5 s | requests > 10 ms in the first 0.5 s | requests > 10 ms after |",
         "|---|---|---:|---:|---:|---:|"]
for name in ["turnpike", "turnpike-thp", "nginx"]:
    for run in ["cold", "warm"]:
        rs = [r for r in rows if r[0] == name and r[1] == run]
        if not rs:
            continue
        med = lambda i, f=float: statistics.median(f(r[i]) for r in rs)
        lines.append(f"| {name} | {run} | {med(3):.2f} | {med(4):.2f} | {med(5, int):.0f} | {med(6, int):.0f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "results: $OUT"
