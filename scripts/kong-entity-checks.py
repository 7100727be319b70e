#!/usr/bin/env python3
"""Kong 3.9's `entity_checks`, as its Admin API's `GET /schemas/...` returns them.

Reads the Lua schema files of a Kong checkout (core entities, and the bundled plugins
Turnpike carries) at a tag, evaluates each `entity_checks` table literal the way Kong's
`api_helpers.schema_to_jsonable` serialises it (functions dropped, `null` as JSON null), and
writes one JSON object: {"entities": {table: [...]}, "plugins": {name: [...]},
"plugin_configs": {name: [...]}} (the last: checks of a plugin's `config` record, which Kong's
JSON shows inside that field).

Usage: scripts/kong-entity-checks.py KONG_REPO [TAG] > crates/turnpike-admin/src/entity_checks.json
(KONG_REPO: a clone of github.com/Kong/kong; TAG defaults to 3.9.1.) The output is committed:
the build and CI never need the checkout.
"""
import json
import re
import subprocess
import sys

REPO = sys.argv[1]
TAG = sys.argv[2] if len(sys.argv) > 2 else "3.9.1"
ENTITIES = ["services", "routes", "consumers", "upstreams", "targets", "certificates", "snis",
            "ca_certificates", "plugins", "vaults", "keys", "key_sets"]
PLUGINS = ["acl", "basic-auth", "bot-detection", "correlation-id", "cors", "datadog", "file-log",
           "hmac-auth", "http-log", "ip-restriction", "jwt", "key-auth", "ldap-auth", "oauth2",
           "opentelemetry", "post-function", "pre-function", "prometheus", "proxy-cache",
           "rate-limiting", "redirect", "request-size-limiting", "request-termination",
           "request-transformer", "response-ratelimiting", "response-transformer", "session",
           "statsd", "syslog", "tcp-log", "udp-log", "zipkin"]


def show(path):
    r = subprocess.run(["git", "-C", REPO, "show", f"{TAG}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


TOKEN = re.compile(r'''\s+|--\[\[.*?\]\]|--[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[\[.*?\]\]|[A-Za-z_][A-Za-z0-9_.]*|-?\d+(?:\.\d+)?|\.\.|[{}=,;()\[\]#<>~+*/^:-]''', re.S)


def tokens(text):
    out = []
    for m in TOKEN.finditer(text):
        t = m.group(0)
        if t.isspace() or t.startswith("--"):
            continue
        out.append(t)
    return out


class Parser:
    def __init__(self, toks, env=None):
        self.t, self.i = toks, 0
        self.env = env or {}

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def next(self):
        v = self.t[self.i]
        self.i += 1
        return v

    def skip_function(self):
        # `function (...) ... end`, nested blocks counted.
        depth = 0
        while True:
            t = self.next()
            if t in ("function", "do", "then") or t == "repeat":
                depth += 1
            elif t == "end" or t == "until":
                depth -= 1
                if depth == 0:
                    return
            elif t == "if" or t == "for" or t == "while":
                pass  # their `do`/`then` opens the block

    def value(self):
        t = self.peek()
        if t == "{":
            return self.table()
        if t == "function":
            self.skip_function()
            return FUNCTION
        self.next()
        if t.startswith('"') or t.startswith("'"):
            s = t[1:-1]
            s = s.encode().decode("unicode_escape")
            # String concatenation of literals.
            while self.peek() == "..":
                self.next()
                s += self.value()
            return s
        if t in ("null", "ngx.null"):
            return None
        if t == "true":
            return True
        if t == "false":
            return False
        if re.fullmatch(r"-?\d+(\.\d+)?", t):
            return float(t) if "." in t else int(t)
        # A local defined as a literal earlier in the file.
        if t in self.env and self.peek() != "(":
            return self.env[t]
        # An identifier: a local or a call we cannot evaluate here.
        if self.peek() == "(":
            depth = 0
            while True:
                x = self.next()
                depth += x == "("
                depth -= x == ")"
                if depth == 0:
                    break
        return Unknown(t)

    def table(self):
        assert self.next() == "{"
        keyed, listed = {}, []
        while self.peek() != "}":
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.peek() or "") and self.peek(1) == "=":
                k = self.next()
                self.next()
                v = self.value()
                # `fn = <a local function>` is a function all the same (dropped, as Kong drops
                # functions from the JSON).
                if v is not FUNCTION and k != "fn":
                    keyed[k] = v
            elif self.peek() == "[":
                self.next()
                k = self.value()
                assert self.next() == "]"
                assert self.next() == "="
                v = self.value()
                if v is not FUNCTION:
                    keyed[k] = v
            else:
                v = self.value()
                if v is not FUNCTION:
                    listed.append(v)
            if self.peek() in (",", ";"):
                self.next()
        self.next()
        if keyed and listed:
            raise ValueError("mixed table")
        return keyed if keyed else listed


FUNCTION = object()


class Unknown:
    def __init__(self, name):
        self.name = name


def check_known(v, where):
    if isinstance(v, Unknown):
        raise ValueError(f"{where}: cannot evaluate '{v.name}'")
    if isinstance(v, dict):
        for k, x in v.items():
            check_known(x, where)
    if isinstance(v, list):
        for x in v:
            check_known(x, where)


# Locals taken from other modules (`require "kong.constants".KEY_FORMATS`: a set's keys; the
# order Turnpike's own messages use).
KNOWN = {"supported_key_formats": ["jwk", "pem"]}


def locals_of(toks):
    """`local NAME = <literal>` definitions, evaluated where they can be."""
    env = dict(KNOWN)
    for i, t in enumerate(toks[:-3]):
        if t == "local" and toks[i + 2] == "=" and toks[i + 1] != "entity_checks":
            p = Parser(toks, env)
            p.i = i + 3
            try:
                v = p.value()
            except Exception:
                continue
            if toks[i + 1] not in KNOWN and v is not FUNCTION and not isinstance(v, Unknown):
                try:
                    check_known(v, "")
                    env[toks[i + 1]] = v
                except ValueError:
                    pass
    return env


def entity_checks(text, where):
    """(the schema's own checks, its `config` record's checks) as Kong's JSON has them."""
    toks = tokens(text)
    env = locals_of(toks)
    own, config = [], []
    stack = []  # the key of each open table (None: positional)
    for i, t in enumerate(toks):
        if t == "{":
            named = i >= 2 and toks[i - 1] == "=" and re.fullmatch(r"[A-Za-z_]\w*", toks[i - 2])
            stack.append(toks[i - 2] if named else None)
        elif t == "}" and stack:
            stack.pop()
        if t == "entity_checks" and toks[i + 1] == "=" and toks[i + 2] == "{":
            p = Parser(toks, env)
            p.i = i + 2
            checks = p.table()
            path = [n for n in stack if n]
            # The schema's own (a field of the returned table or of a `local r = {`, or
            # `local entity_checks`); a
            # plugin's `config` record's (in Kong's JSON, inside that field); a deeper
            # record's (statsd's `metrics`) belongs to its own field and is left out here.
            if len(path) == 0 or (len(path) == 1 and path[0] != "fields"):
                own.extend(checks)
            elif path == ["fields", "config"]:
                config.extend(checks)
        # routes.lua: `table.insert(entity_checks, { ... })`
        if t == "table.insert" and toks[i + 1] == "(" and toks[i + 2] == "entity_checks":
            p = Parser(toks, env)
            p.i = i + 4
            own.append(p.table())
    check_known(own, where)
    check_known(config, where)
    return own, config


out = {"kong": TAG, "entities": {}, "plugins": {}, "plugin_configs": {}}
for e in ENTITIES:
    text = show(f"kong/db/schema/entities/{e}.lua")
    if text is not None:
        out["entities"][e] = entity_checks(text, e)[0]
for name in PLUGINS:
    text = show(f"kong/plugins/{name}/schema.lua")
    if text is not None:
        own, config = entity_checks(text, name)
        out["plugins"][name] = own
        if config:
            out["plugin_configs"][name] = config
json.dump(out, sys.stdout, indent=1, sort_keys=True)
sys.stdout.write("\n")
