#!/usr/bin/env bash
# What Lua in a plugin config costs per request: instructions per proxied request (callgrind,
# bench/instructions.sh's method) for plain proxying and for a global pre-function doing
# (1) nothing in access, (2) one get_header and one set_header in access, (3) rewrite + access
# + header_filter with kong.ctx.shared carrying a value between them. Same binary, same run.
# Usage: bench/experiments/lua-cost.sh [N]   (needs nginx, valgrind, python3)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
N=${1:-5000}
bench_begin lua-cost
python3 - "$W" <<'PY'
import pathlib, sys
w = pathlib.Path(sys.argv[1])
head = ('_format_version: "3.0"\nservices:\n- name: s\n  url: http://127.0.0.1:9001\n'
        '  routes:\n  - name: r\n    paths: [/]\n')
def pre(phases):
    body = "".join(f"    {p}:\n    - \"{code}\"\n" for p, code in phases)
    return head + "plugins:\n- name: pre-function\n  config:\n" + body
(w / "plain.yml").write_text(head)
(w / "lua-noop.yml").write_text(pre([("access", "local x = 1")]))
(w / "lua-access.yml").write_text(pre([("access",
    "kong.service.request.set_header('x-tenant', kong.request.get_header('host'))")]))
(w / "lua-phases.yml").write_text(pre([
    ("rewrite", "kong.ctx.shared.t = kong.request.get_header('host')"),
    ("access", "kong.service.request.set_header('x-tenant', kong.ctx.shared.t)"),
    ("header_filter", "kong.response.set_header('x-tenant', kong.ctx.shared.t)")]))
PY
{
  echo "| config | instructions per request | over plain |"
  echo "| --- | ---: | ---: |"
  plain=
  for c in plain lua-noop lua-access lua-phases; do
    ir=$(CONFIG=$W/$c.yml "$ROOT/bench/instructions.sh" "$N" 2>"$OUT/raw/$c.log" | tail -1)
    [ -z "$plain" ] && plain=$ir
    echo "| $c | $ir | +$((ir - plain)) |"
  done
} | tee "$OUT/table.md"
