#!/usr/bin/env python3
"""Control-plane benchmark driver (run by bench/control-plane.sh, which starts PostgreSQL, the
three nodes and the upstream).

propagate A B C N   -- N times: create a route on node A through the Admin API; from the moment
                       A's response arrives, poll nodes B and C until they route it. Prints the
                       latency per node and write as JSON lines, then p50/p99.
writes A RATE SECS  -- PATCH a route on node A RATE times a second for SECS seconds (the write
                       load beside wrk). Prints how many writes succeeded.
"""
import http.client
import os
import json
import sys
import time


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"content-type": "application/json"} if body is not None else {}
    c.request(method, path, json.dumps(body) if body is not None else None, headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def propagate(a, b, c, n):
    lat = {b: [], c: []}
    conns = {p: http.client.HTTPConnection("127.0.0.1", p, timeout=10) for p in (b, c)}
    for i in range(n):
        path = f"/prop-{time.time_ns()}-{i}"
        route = ({"expression": f'http.path == "{path}"'} if os.environ.get("FLAVOR") == "expressions"
                 else {"paths": [path]})
        status, body = call(a, "POST", "/services/bench/routes", route)
        assert status == 201, (status, body)
        t0 = time.perf_counter()
        pending = {b, c}
        while pending:
            for p in list(pending):
                conn = conns[p]
                conn.request("GET", path, headers={"host": "bench"})
                r = conn.getresponse()
                r.read()
                if r.status != 404:
                    lat[p].append((time.perf_counter() - t0) * 1000)
                    pending.discard(p)
            if time.perf_counter() - t0 > 10:
                raise SystemExit(f"route {path} not propagated within 10 s to {pending}")
    allv = lat[b] + lat[c]
    print(json.dumps({"writes": n, "p50_ms": round(pct(allv, 50), 2), "p99_ms": round(pct(allv, 99), 2),
                      "max_ms": round(max(allv), 2),
                      "per_node_p99_ms": {str(p): round(pct(v, 99), 2) for p, v in lat.items()}}))


def writes(a, rate, secs):
    ok = failed = 0
    interval = 1.0 / rate
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < secs:
        status, _ = call(a, "PATCH", "/routes/bench-write", {"tags": [f"w{i}"]})
        ok += status == 200
        failed += status != 200
        i += 1
        next_at = start + i * interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    elapsed = time.perf_counter() - start
    print(json.dumps({"writes_ok": ok, "writes_failed": failed, "rate_per_s": round(ok / elapsed, 1)}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "propagate":
        propagate(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "writes":
        writes(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
    else:
        raise SystemExit(__doc__)
