#!/usr/bin/env python3
"""Reports import cycles among the source files of each crate (a file is a module; an
import is any `crate::a::b`, `super::` or child-relative path outside its `#[cfg(test)]`
module). A module may use the items of the modules it is part of (its ancestors: a module
split into files, whose parts `use super::*`): those edges are not counted; every other cycle
(between siblings, or across folders) is. Exits 1 when a crate has one. Run by
scripts/test.sh."""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*)\}")


def modules(src):
    """module path (tuple) -> file"""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[tuple(parts)] = os.path.join(dirpath, f)
    return out


def code(path):
    text = open(path, encoding="utf-8").read()
    # Drop the test module: test imports do not make the build's graph.
    i = text.find("#[cfg(test)]\nmod tests")
    if i >= 0:
        text = text[:i]
    return "\n".join(l.split("//")[0] for l in text.splitlines())


def resolve(mods, me, kind, rest):
    if kind == "crate":
        base = ()
    else:
        # super:: of a file module is its parent; of mod.rs/lib.rs likewise its own parent.
        base = me[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    full = base + tuple(rest)
    for n in range(len(full), 0, -1):
        if full[:n] in mods:
            return full[:n]
    return None


def edges(mods):
    g = {m: set() for m in mods}
    for m, path in mods.items():
        text = code(path)
        found = []
        for kind, head, body in GROUP.findall(text):
            h = [p for p in head.split("::") if p]
            for item in body.split(","):
                item = item.strip().split(" as ")[0]
                found.append((kind, h + [p for p in item.split("::") if p and p != "self"]))
        for kind, rest in PATH.findall(text):
            found.append((kind, [p for p in rest.split("::") if p]))
        # A module's own children named by a relative path (`child::x`, `self::child::x`).
        children = {c[-1] for c in mods if len(c) == len(m) + 1 and c[: len(m)] == m}
        for name in re.findall(r"(?<![A-Za-z0-9_:])(?:self::)?([a-z_][a-z0-9_]*)::", text):
            if name in children:
                g[m].add(m + (name,))
        # `use super::*;` (and `use crate::a::*;`) import the whole module.
        for kind, head in re.findall(r"\buse (crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\*", text):
            found.append((kind, [p for p in head.split("::") if p]))
        for kind, rest in found:
            t = resolve(mods, m, kind, rest)
            # A module using an ancestor's items is a part of that module using it.
            if t is not None and t != m and t != () and m[: len(t)] != t:
                g[m].add(t)
    return g


def sccs(g):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


bad = 0
for crate in sorted(os.listdir(ROOT)):
    src = os.path.join(ROOT, crate, "src")
    if not os.path.isdir(src):
        continue
    mods = modules(src)
    g = edges(mods)
    for comp in sccs(g):
        bad += 1
        names = sorted("::".join(c) for c in comp)
        print(f"{crate}: cycle among {len(comp)} modules: {', '.join(names)}")
        for c in sorted(comp):
            inner = sorted("::".join(t) for t in g[c] if t in comp)
            print(f"    {'::'.join(c)} -> {', '.join(inner)}")
if bad:
    sys.exit(1)
print("no import cycle in any crate")
