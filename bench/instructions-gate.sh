#!/usr/bin/env bash
# The CI regression gate: instructions per request under callgrind (stable on noisy, shared
# machines, unlike wall-clock figures) for Kong's plain-proxy and key-auth + rate-limiting cases
# and a jwt (HS256) case, compared with the baseline committed in
# bench/instructions-baseline.json. Fails when a case
# costs more than 5% above its baseline. Lowering or raising the baseline is a deliberate,
# reviewed commit: run `bench/instructions-gate.sh --write` and commit the file with the reason.
#
# Method as bench/instructions.sh: Turnpike (release build, one worker) under
# `valgrind --tool=callgrind`, (Ir(N requests) - Ir(0 requests)) / N over one keep-alive
# connection to a local nginx upstream. N=2000 keeps the gate to about a minute.
#
# Usage: [GATE_BIN=path] bench/instructions-gate.sh [--write]     (needs nginx, valgrind, python3)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
BASELINE=$ROOT/bench/instructions-baseline.json
N=${GATE_N:-2000}
TOLERANCE=${GATE_TOLERANCE:-0.05}
W=$(mktemp -d)
BENCH_TMP+=("$W")

# GATE_BIN measures another build (an earlier commit's, to compare in one session) instead.
if [ -n "${GATE_BIN:-}" ]; then
  BIN=$GATE_BIN
else
  cargo build --release --locked -p turnpike >&2
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/turnpike
fi

# The upstream (nginx from ../shared/bench-reference, or the copy kept in bench/).
if [ ! -f "$SHARED/upstream.conf" ]; then SHARED=$ROOT/bench/reference; fi
start_upstream

python3 - "$W" <<'PY'
import pathlib, sys
out = pathlib.Path(sys.argv[1])
head = '_format_version: "3.0"\nservices:\n- name: s\n  url: http://127.0.0.1:9001\n  routes:\n'
(out / "plain.yml").write_text(head + "  - name: r\n    paths: [/]\n")
(out / "key-auth-rl.yml").write_text(
    head + "  - name: r\n    paths: [/]\n    plugins:\n    - name: key-auth\n"
    "    - name: rate-limiting\n      config: {year: 1000000000000, limit_by: consumer}\n"
    "consumers:\n- username: c0\n  keyauth_credentials: [{key: key-0}]\n")
(out / "jwt.yml").write_text(
    head + "  - name: r\n    paths: [/]\n    plugins:\n    - name: jwt\n"
    "consumers:\n- username: c0\n  jwt_secrets: [{key: jwt-key, secret: jwt-secret}]\n")
# An HS256 token for that secret, as a client would send it.
import base64, hashlib, hmac, json
b = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
signing = b(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + b(json.dumps({"iss": "jwt-key"}).encode())
sig = hmac.new(b"jwt-secret", signing.encode(), hashlib.sha256).digest()
(out / "jwt.token").write_text(signing + "." + b(sig))
PY

# ir CONFIG N [HEADER]: total instructions of a run serving N requests, each with HEADER
# ("name: value") if given.
ir() {
  turnpike_env "$W/tp"
  export TURNPIKE_DECLARATIVE_CONFIG=$1
  local out=$W/cg.$(basename "$1").$2
  # Something else on the proxy port would answer instead (a stray gateway answered 404 and
  # the gate read 0 instructions as a pass).
  if (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null; then
    echo "port 8000 is in use: stop what listens there before the gate runs" >&2
    exit 1
  fi
  valgrind --tool=callgrind --collect-atstart=yes --callgrind-out-file="$out" "$BIN" start > /dev/null 2>&1 &
  local vp=$!
  for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
  HEADER=${3:-} python3 - "$2" <<'PY'
import http.client, os, sys
c = http.client.HTTPConnection("127.0.0.1", 8000)
h = dict([os.environ["HEADER"].split(": ", 1)]) if os.environ.get("HEADER") else {}
for _ in range(int(sys.argv[1])):
    c.request("GET", "/", headers=h); r = c.getresponse(); r.read(); assert r.status == 200, r.status
PY
  kill -TERM $vp; wait $vp 2>/dev/null || true
  grep -E '^(summary|totals):' "$out" | head -1 | awk '{print $2}'
}
per_request() { # CONFIG [HEADER]
  local zero n
  zero=$(ir "$1" 0 "${2:-}")
  n=$(ir "$1" "$N" "${2:-}")
  echo $(( (n - zero) / N ))
}
PLAIN=$(per_request "$W/plain.yml")
KARL=$(per_request "$W/key-auth-rl.yml" "apikey: key-0")
JWT=$(per_request "$W/jwt.yml" "Authorization: Bearer $(cat "$W/jwt.token")")

python3 - "$BASELINE" "$PLAIN" "$KARL" "$JWT" "$TOLERANCE" "${1:-}" "$N" <<'PY'
import json, sys, pathlib, platform, subprocess
path, plain, karl, jwt, tol, mode, n = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
measured = {"plain": plain, "key-auth+rate-limiting": karl, "jwt": jwt}
if mode == "--write":
    cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
    path.write_text(json.dumps({"instructions_per_request": measured, "requests": int(n),
                                "machine": cpu, "valgrind": subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()}, indent=2) + "\n")
    print(f"baseline written: {measured}")
    sys.exit(0)
base = json.loads(path.read_text())["instructions_per_request"]
failed = False
for case, value in measured.items():
    if value <= 0:
        print(f"{case}: NO MEASUREMENT ({value} instructions/request): the runs under callgrind failed")
        failed = True
        continue
    if case not in base:
        print(f"{case}: {value} instructions/request, NO BASELINE: add it in a reviewed commit")
        failed = True
        continue
    b = base[case]
    ratio = value / b
    verdict = "ok"
    if ratio > 1 + tol:
        verdict, failed = f"REGRESSION: more than {tol:.0%} above the baseline", True
    elif ratio < 1 - tol:
        verdict = "faster than the baseline: consider lowering it (bench/instructions-gate.sh --write)"
    print(f"{case}: {value} instructions/request, baseline {b} ({ratio:.3f}x) {verdict}")
sys.exit(1 if failed else 0)
PY
