#!/usr/bin/env bash
# Where the plain-proxy RPS comparison is decided on this machine: each CPU's busy share and
# CPU time per request, for Turnpike, the nginx reference, and nginx doing the same header work
# as Kong. Layout of ../shared/bench-reference/README.md: the proxy (one worker) on CPU 0, the
# upstream and `wrk -t1 -c50` on CPU 1; the proxies are started together and each run goes to
# each of them in turn (1 s warm-up, then DURATION with --latency).
#
# Proxies:
#   direct        wrk straight to the upstream (what CPU 1 can do alone)
#   nginx         the reference proxy of ../shared/bench-reference/ (forwards requests as they are)
#   nginx-kong    the same nginx plus the headers Kong's contract adds, set by nginx itself:
#                 X-Forwarded-For/-Proto/-Host/-Port/-Path/-Prefix, X-Real-IP and X-Kong-Request-Id
#                 upstream; Via, X-Kong-Upstream-Latency, X-Kong-Proxy-Latency and X-Kong-Request-Id
#                 downstream (the nginx half of Kong, without its Lua)
#   turnpike      Turnpike with its defaults (Kong's headers on)
# CPU busy shares come from /proc/stat (everything but idle and iowait), per CPU, around each
# measured run; µs per request = busy share x duration / requests.
#
# QUOTA=P (percent, optional): every proxy runs in a cgroup limited to P% of one CPU (10 ms
# period), so that the proxy, not the load CPU, is the only bottleneck; needs root and the cgroup
# v1 cpu controller (/sys/fs/cgroup/cpu) or cgroup v2 with cpu.max.
#
# Usage: [QUOTA=70] bench/experiments/same-work.sh [RUNS] [DURATION]   (needs nginx, wrk, python3)
# Results: bench/results/same-work-<date>/ (raw wrk output, runs.tsv, summary.md).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
RUNS=${1:-5}
DUR=${2:-8s}
[ "$NCPU" -eq 2 ] || echo "note: made for 2 CPUs (proxy on CPU 0, load on CPU 1); this machine has $NCPU" >&2
bench_begin same-work${QUOTA:+-quota$QUOTA}

# launch NAME PORT CMD...: CMD on CPU 0 (in NAME's cgroup under QUOTA, bench/lib.sh); waits
# for PORT.
launch() {
  local name=$1 port=$2
  shift 2
  in_quota "$name" taskset -c 0 "$@" > "$W/$name.log" 2>&1 &
  BENCH_PIDS+=($!)
  wait_port "$port"
}

start_upstream 1
ngx_conf "$W/nginx" 8002
launch nginx 8002 nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" -e "$W/nginx/error.log" -g 'daemon off;'
# The same nginx with Kong's headers: what Kong's own nginx template sets around its Lua.
KONG_HEADERS='proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Forwarded-Host $host; proxy_set_header X-Forwarded-Port $server_port; proxy_set_header X-Forwarded-Path $uri; proxy_set_header X-Forwarded-Prefix /; proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Kong-Request-Id $request_id; add_header Via "1.1 kong/3.9.1"; add_header X-Kong-Upstream-Latency $upstream_header_time; add_header X-Kong-Proxy-Latency 0; add_header X-Kong-Request-Id $request_id;'
ngx_conf "$W/nginx-kong" 8003
sed -i "s|proxy_pass http://up;|$KONG_HEADERS proxy_pass http://up;|" "$W/nginx-kong/nginx.conf"
launch nginx-kong 8003 nginx -c "$W/nginx-kong/nginx.conf" -p "$W/nginx-kong" -e "$W/nginx-kong/error.log" -g 'daemon off;'
turnpike_env "$W/tp"
launch turnpike 8000 "$BIN" start
cp "$W/nginx-kong/nginx.conf" "$OUT/raw/nginx-kong.conf"

# busy: "total idle" jiffies of CPU 0 and CPU 1.
busy() { awk '/^cpu[01] / {t = 0; for (i = 2; i <= NF; i++) t += $i; printf "%d %d ", t, $5 + $6} END {print ""}' /proc/stat; }
printf 'run\tproxy\trequests\tseconds\trps\tp99_ms\tcpu0_busy\tcpu1_busy\n' > "$OUT/runs.tsv"
for i in $(seq 1 "$RUNS"); do
  for x in "direct 9001" "nginx 8002" "nginx-kong 8003" "turnpike 8000"; do
    set -- $x
    taskset -c 1 wrk -t1 -c50 -d1s "http://127.0.0.1:$2/" > /dev/null
    read -r t0a i0a t1a i1a < <(busy)
    taskset -c 1 wrk -t1 -c50 -d"$DUR" --latency "http://127.0.0.1:$2/" > "$OUT/raw/$1-run$i.txt"
    read -r t0b i0b t1b i1b < <(busy)
    python3 - "$OUT/raw/$1-run$i.txt" "$i" "$1" "$t0a $i0a $t1a $i1a $t0b $i0b $t1b $i1b" >> "$OUT/runs.tsv" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
n = int(re.search(r"(\d+) requests in ([\d.]+)(m?s)", t).group(1))
m = re.search(r"requests in ([\d.]+)(ms|s)", t)
secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
p = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)", t, re.M)
p99 = float(p.group(1)) * {"us": 1e-3, "ms": 1, "s": 1e3}[p.group(2)]
t0a, i0a, t1a, i1a, t0b, i0b, t1b, i1b = map(int, sys.argv[4].split())
b0 = 1 - (i0b - i0a) / max(t0b - t0a, 1)
b1 = 1 - (i1b - i1a) / max(t1b - t1a, 1)
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{n}\t{secs}\t{n / secs:.0f}\t{p99:.2f}\t{b0:.3f}\t{b1:.3f}")
PY
  done
done

python3 - "$OUT" "${QUOTA:-}" "$DUR" <<'PY'
import csv, pathlib, statistics, subprocess, sys
out, quota, dur = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = list(csv.DictReader(open(out / "runs.tsv"), delimiter="\t"))
names = ["direct", "nginx", "nginx-kong", "turnpike"]
by = {n: [r for r in rows if r["proxy"] == n] for n in names}
def us(r, cpu):  # CPU time per request on that CPU, µs
    return float(r[f"cpu{cpu}_busy"]) * float(r["seconds"]) * 1e6 / int(r["requests"])
med = statistics.median
cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True,
                     capture_output=True, text=True).stdout.strip()
commit = (out / "commit").read_text().strip()
lines = [f"machine: {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} CPUs; "
         f"commit {commit}; wrk -t1 -c50 -d{dur} --latency, {len(by['turnpike'])} runs per proxy, interleaved; "
         + (f"each proxy limited to {quota}% of CPU 0 (cgroup)" if quota else "no CPU quota"), "",
         "| proxy | RPS (median) | runs | p99 ms (median) | CPU 0 busy | CPU 1 busy | CPU 0 µs / request | CPU 1 µs / request |",
         "|---|---:|---|---:|---:|---:|---:|---:|"]
for n in names:
    rs = by[n]
    def m(key):
        return med(float(r[key]) for r in rs)
    each = ", ".join(format(float(r["rps"]), ",.0f") for r in rs)
    lines.append(f"| {n} | {m('rps'):,.0f} | {each} | {m('p99_ms'):.2f} | {m('cpu0_busy'):.3f} | "
                 f"{m('cpu1_busy'):.3f} | {med(us(r, 0) for r in rs):.2f} | {med(us(r, 1) for r in rs):.2f} |")
lines.append("")
tp = by["turnpike"]
for ref in ["nginx", "nginx-kong"]:
    pairs = list(zip(tp, by[ref]))
    ratios = [float(a["rps"]) / float(b["rps"]) for a, b in pairs]
    wins = sum(r > 1 for r in ratios)
    rps = med(float(r["rps"]) for r in tp) / med(float(r["rps"]) for r in by[ref])
    lines.append(f"- turnpike / {ref}: RPS {rps:.3f}x "
                 f"(median of the run-by-run ratios {med(ratios):.3f}x, Turnpike ahead in {wins} of {len(pairs)}); "
                 f"CPU 0 µs / request {med(us(r, 0) for r in tp) / med(us(r, 0) for r in by[ref]):.3f}x; "
                 f"CPU 1 µs / request {med(us(r, 1) for r in tp) / med(us(r, 1) for r in by[ref]):.3f}x")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "raw results: $OUT"
