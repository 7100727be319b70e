"""A gRPC client for the gateway's integration tests (grpcio, raw-bytes messages).

Usage: client.py TARGET CALLS_JSON [--tls CA --authority NAME]
CALLS_JSON: a list of {"method": "/echo.Echo/Unary", "kind": "unary|server|client|bidi",
"request": "text" | ["text", ...], "metadata": [[k, v], ...], "timeout": seconds, "repeat": N (the request's text N
times; the responses are then given as their lengths)}.
Prints a JSON list with one result per call: {"code", "details", "responses",
"initial_metadata", "trailing_metadata"}.
"""

import json
import sys

import grpc


def run(channel, call):
    kind = call.get("kind", "unary")
    md = [tuple(x) for x in call.get("metadata", [])]
    timeout = call.get("timeout", 10)
    ident = lambda b: b
    req = call.get("request", "")
    if "repeat" in call:
        req = req * call["repeat"] if isinstance(req, str) else [r * call["repeat"] for r in req]
    out = {"responses": []}
    try:
        if kind == "unary":
            f = channel.unary_unary(call["method"], ident, ident)
            resp, c = f.with_call(req.encode(), metadata=md, timeout=timeout)
            out["responses"] = [resp.decode(errors="replace")]
        elif kind == "server":
            f = channel.unary_stream(call["method"], ident, ident)
            c = f(req.encode(), metadata=md, timeout=timeout)
            # One at a time: the messages that came before an error are kept.
            for r in c:
                out["responses"].append(r.decode())
        elif kind == "client":
            f = channel.stream_unary(call["method"], ident, ident)
            resp, c = f.with_call(iter([r.encode() for r in req]), metadata=md, timeout=timeout)
            out["responses"] = [resp.decode()]
        else:
            f = channel.stream_stream(call["method"], ident, ident)
            c = f(iter([r.encode() for r in req]), metadata=md, timeout=timeout)
            out["responses"] = [r.decode() for r in c]
    except grpc.RpcError as e:
        c = e
    if "repeat" in call:
        out["responses"] = [len(r) for r in out["responses"]]
    out["code"] = c.code().name
    out["details"] = c.details() or ""
    out["initial_metadata"] = {k: v for k, v in (c.initial_metadata() or ())}
    out["trailing_metadata"] = {k: v for k, v in (c.trailing_metadata() or ())}
    return out


def main():
    target, calls = sys.argv[1], json.loads(sys.argv[2])
    opts = sys.argv[3:]
    if "--tls" in opts:
        ca = open(opts[opts.index("--tls") + 1], "rb").read()
        options = []
        if "--authority" in opts:
            name = opts[opts.index("--authority") + 1]
            options.append(("grpc.ssl_target_name_override", name))
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca), options)
    else:
        options = []
        if "--authority" in opts:
            options.append(("grpc.default_authority", opts[opts.index("--authority") + 1]))
        channel = grpc.insecure_channel(target, options)
    print(json.dumps([run(channel, c) for c in calls]))


if __name__ == "__main__":
    main()
