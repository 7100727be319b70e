#!/usr/bin/env python3
"""Summarises a bench/kong-cases.sh run: the table of Kong's eight cases per protocol (median run
by RPS; p50, p95, p99, p99.9 from wrk's percentiles), Turnpike beside the references measured in
the same run, Kong's published 3.11 figures for context, and the plots (latency percentile
spectra, requests per second), written next to the raw results.

Usage: kong_cases_report.py RESULTS_DIR RUNS "http https"
"""
import pathlib
import platform
import re
import subprocess
import sys

OUT = pathlib.Path(sys.argv[1])
RUNS = int(sys.argv[2])
PROTOCOLS = sys.argv[3].split()
CASES = ["plain-1", "plain-100", "rl-1", "rl-100", "ka-rl-1", "ka-rl-100", "ba-rl-1", "ba-rl-100"]
TITLES = {
    "plain-1": "proxy, no plugins (1 route)",
    "plain-100": "proxy, no plugins (100 routes)",
    "rl-1": "rate limit (1 route)",
    "rl-100": "rate limit (100 routes)",
    "ka-rl-1": "rate limit + key-auth (1/1)",
    "ka-rl-100": "rate limit + key-auth (100/100)",
    "ba-rl-1": "rate limit + basic-auth (1/1)",
    "ba-rl-100": "rate limit + basic-auth (100/100)",
}
# Kong 3.11, HTTPS, 16 workers on a c5.4xlarge (../shared/kong-compat.md §2): RPS, P99, P95.
KONG_311 = {
    "plain-1": (130119, 6.28, 3.60), "plain-100": (124676, 6.52, 3.75),
    "rl-1": (111583, 8.14, 3.98), "rl-100": (107716, 8.23, 4.07),
    "ka-rl-1": (96673, 9.23, 4.66), "ka-rl-100": (91456, 9.75, 5.06),
    "ba-rl-1": (91413, 9.86, 5.31), "ba-rl-100": (86402, 10.25, 5.55),
}
PCTLS = [50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 100]


def parse(path):
    t = path.read_text()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    pct = {float(p): int(v) / 1000.0 for p, v in re.findall(r"^PCTL ([\d.]+) (\d+)$", t, re.M)}
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    return {"rps": rps, "pct": pct, "non2xx": int(errs.group(1)) if errs else 0,
            "socket": sock.group(1).strip() if sock else ""}


def median_run(label):
    runs = []
    for i in range(1, RUNS + 1):
        p = OUT / "raw" / f"{label}-run{i}.txt"
        if p.exists():
            runs.append(parse(p))
    if not runs:
        return None
    runs.sort(key=lambda r: r["rps"])
    m = dict(runs[len(runs) // 2])
    m["all"] = [r["rps"] for r in runs]
    return m


cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True,
                     capture_output=True, text=True).stdout.strip()
commit = (OUT / "commit").read_text().strip() if (OUT / "commit").exists() else "?"
# The layout of bench/lib.sh: the proxy gets half the CPUs (one worker each), at least one.
NCPU = int(subprocess.run("nproc", capture_output=True, text=True).stdout.strip() or 1)
PROXY_N = max(1, NCPU // 2)
WORKERS = "one worker on one core" if PROXY_N == 1 else f"{PROXY_N} workers on {PROXY_N} cores"
lines = [f"machine: {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} CPUs, "
         f"kernel {platform.release()}; commit {commit}; {RUNS} runs per case and proxy, median by RPS", ""]
data = {}
for proto in PROTOCOLS:
    lines += [f"### {proto.upper()}", "",
              "| case | Turnpike RPS | p50 ms | p95 ms | p99 ms | p99.9 ms | non-2xx | nginx RPS | nginx p99 ms | Turnpike / nginx | nginx + Lua RPS | Turnpike / nginx + Lua | Kong 3.11 RPS (16 workers) / p99 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case in CASES:
        tp = median_run(f"{proto}-{case}-turnpike")
        ng = median_run(f"{proto}-{case}-nginx")
        nl = median_run(f"{proto}-{case}-nginx-lua")
        data[(proto, case)] = (tp, ng, nl)
        if not tp or not ng:
            continue
        p = tp["pct"]
        lua = f"{nl['rps']:,.0f}" if nl else "—"
        lua_ratio = f"{tp['rps'] / nl['rps']:.2f}x" if nl else "—"
        k = KONG_311[case]
        lines.append(
            f"| {TITLES[case]} | {tp['rps']:,.0f} | {p.get(50, 0):.2f} | {p.get(95, 0):.2f} | {p.get(99, 0):.2f} | "
            f"{p.get(99.9, 0):.2f} | {tp['non2xx']} | {ng['rps']:,.0f} | {ng['pct'].get(99, 0):.2f} | "
            f"{tp['rps'] / ng['rps']:.2f}x | {lua} | {lua_ratio} | {k[0]:,} / {k[1]} |")
    lines.append("")
# The extra cases, when run.
extra = []
for proto in PROTOCOLS:
    for case, title in [("plain-10k", "proxy, no plugins (10k routes)"),
                        ("keepalive-off", "proxy, upstream keepalive off (1 route)")]:
        tp, ng = median_run(f"{proto}-{case}-turnpike"), median_run(f"{proto}-{case}-nginx")
        if tp and ng:
            extra.append(f"| {proto.upper()} | {title} | {tp['rps']:,.0f} | {tp['pct'].get(50, 0):.2f} | {tp['pct'].get(99, 0):.2f} | "
                         f"{ng['rps']:,.0f} | {ng['pct'].get(99, 0):.2f} | {tp['rps'] / ng['rps']:.2f}x |")
import json as _json
def oha_median(label):
    runs = []
    for i in range(1, RUNS + 1):
        p = OUT / "raw" / f"{label}-run{i}.json"
        try:
            j = _json.loads(p.read_text())
            runs.append((j["summary"]["requestsPerSec"], j["latencyPercentiles"]["p50"] * 1000,
                         j["latencyPercentiles"]["p99"] * 1000))
        except Exception:
            pass
    runs.sort()
    return runs[len(runs) // 2] if runs else None
tp, ng = oha_median("h2-plain-1-turnpike"), oha_median("h2-plain-1-nginx")
if tp and ng:
    extra.append(f"| HTTP/2 over TLS (oha, 50 connections) | proxy, no plugins (1 route) | {tp[0]:,.0f} | {tp[1]:.2f} | {tp[2]:.2f} | "
                 f"{ng[0]:,.0f} | {ng[2]:.2f} | {tp[0] / ng[0]:.2f}x |")
if extra:
    lines += ["### Extra cases", "",
              "| protocol | case | Turnpike RPS | p50 ms | p99 ms | nginx RPS | nginx p99 ms | Turnpike / nginx |",
              "|---|---|---:|---:|---:|---:|---:|---:|"] + extra + [
              "", "Keepalive off: Turnpike with `upstream_keepalive_pool_size = 0`, nginx without `keepalive` in its upstream block.", ""]

ipr_file = OUT / "instructions.txt"
if ipr_file.exists():
    ipr = {}
    for line in ipr_file.read_text().split("\n"):
        parts = line.split()
        if len(parts) == 3:
            ipr[(parts[0], parts[1])] = int(parts[2])
    lines += ["### Instructions per request (callgrind, HTTP, one keep-alive connection)", "",
              "| case | Turnpike | nginx (plain proxy) | Turnpike / nginx | nginx + Lua (key-auth + rate-limiting emulation) |",
              "|---|---:|---:|---:|---:|"]
    for case in CASES:
        n = case.split("-")[-1]
        tp, ng = ipr.get((case, "turnpike")), ipr.get((f"nginx-{n}", "nginx"))
        lua = ipr.get((f"ngxlua-{n}", "nginx-lua")) if case.startswith("ka-rl") else None
        if tp and ng:
            lines.append(f"| {TITLES[case]} | {tp:,} | {ng:,} | {tp / ng:.2f}x | {f'{lua:,}' if lua else '—'} |")
    lines.append("")
lines += ["Kong's figures come from a 16-vCPU c5.4xlarge with 16 workers and k6 on separate machines;",
          f"ours from {WORKERS} with the upstream and load generator on the other {NCPU - PROXY_N} of {NCPU} CPUs.",
          "They are context, not a comparison; the ratios to the references measured in the same run are."]

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for proto in PROTOCOLS:
        fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharey=False)
        for ax, case in zip(axes.flat, CASES):
            tp, ng, nl = data[(proto, case)]
            for run, name, style in [(tp, "Turnpike", "-"), (ng, "nginx", "--"), (nl, "nginx + Lua", ":")]:
                if not run:
                    continue
                xs = [p for p in PCTLS if p in run["pct"] and p < 100]
                # HdrHistogram's percentile spectrum: x is 1 / (1 - percentile).
                ax.plot([1 / (1 - x / 100) for x in xs], [run["pct"][x] for x in xs], style, marker="o",
                        markersize=3, label=name)
            ax.set_xscale("log")
            ax.set_xticks([2, 10, 100, 1000, 10000])
            ax.set_xticklabels(["50%", "90%", "99%", "99.9%", "99.99%"])
            ax.set_title(TITLES[case], fontsize=10)
            ax.set_ylabel("latency ms")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Latency by percentile, {proto.upper()}, wrk -c50 (median run)")
        fig.tight_layout()
        fig.savefig(OUT / f"spectrum-{proto}.svg")
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(12, 4.5))
        width = 0.27
        for j, (name, idx) in enumerate([("Turnpike", 0), ("nginx", 1), ("nginx + Lua", 2)]):
            vals = [(data[(proto, c)][idx] or {}).get("rps", 0) for c in CASES]
            ax.bar([i + (j - 1) * width for i in range(len(CASES))], vals, width, label=name)
        ax.set_xticks(range(len(CASES)))
        ax.set_xticklabels([TITLES[c].replace(" (", "\n(") for c in CASES], fontsize=8)
        ax.set_ylabel(f"requests / s ({WORKERS})")
        ax.set_title(f"Kong's eight cases, {proto.upper()}, {WORKERS}")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(OUT / f"rps-{proto}.svg")
        plt.close(fig)
    lines += ["", "Plots: " + ", ".join(f"`spectrum-{p}.svg`, `rps-{p}.svg`" for p in PROTOCOLS)]
except ImportError:
    lines += ["", "(no plots: python3-matplotlib is not installed)"]

(OUT / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
