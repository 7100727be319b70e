#!/usr/bin/env python3
"""Route churn against a node's Admin API: RATE times a second for SECS seconds, create a route
on the service `bench` and delete it again (what bench/control-plane.sh's PATCH load does not
exercise: additions and removals). Prints the pairs sent and the writes that succeeded.
Usage: route-churn.py ADMIN_PORT RATE SECS   (node CPU is read around it from /proc/<pid>/stat)
"""
import http.client, json, sys, time
port, rate, secs = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
def call(m, p, b=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(m, p, json.dumps(b) if b is not None else None, {"content-type": "application/json"} if b is not None else {})
    r = c.getresponse(); r.read(); c.close(); return r.status
start = time.perf_counter(); i = 0; ok = 0
while time.perf_counter() - start < secs:
    name = f"churn-{time.time_ns()}"
    ok += call("POST", "/services/bench/routes", {"name": name, "paths": [f"/{name}"]}) == 201
    ok += call("DELETE", f"/routes/{name}") == 204
    i += 1
    d = start + i / rate - time.perf_counter()
    if d > 0: time.sleep(d)
print(json.dumps({"pairs": i, "ok": ok}))
