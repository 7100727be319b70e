"""A gRPC server for the gateway's integration tests (grpcio, generic handlers: the messages
are raw bytes, so no generated code and no .proto file are needed).

Methods of the service `echo.Echo`:
  Unary          answers the request's bytes, prefixed with the server's name
  Meta           answers the request metadata as JSON (what the gateway forwarded)
  ServerStream   request "N:x": N messages "x0" .. "x<N-1>"
  ClientStream   answers the messages it got, joined with ","
  Bidi           answers each message as it comes, upper-cased
  Fail           request "CODE:details": ends with that status, details and trailing
                 metadata `x-trailer: kept`
  Sleep          request "MS": answers after MS milliseconds
  StreamFail     request "CODE:details": one message "partial", then that status (in the
                 trailers, after the message)
  SlowStream     request "N:MS": N messages "0" .. "<N-1>", MS milliseconds apart

Usage: echo_server.py PORT NAME [CERT KEY]  (with CERT and KEY: TLS, ALPN h2)
Prints "ready" on stdout once it listens.
"""

import json
import sys
import time
from concurrent import futures

import grpc


def main():
    port, name = int(sys.argv[1]), sys.argv[2].encode()
    tls = sys.argv[3:5] if len(sys.argv) >= 5 else None

    def unary(req, ctx):
        ctx.send_initial_metadata((("x-server", name.decode()),))
        return name + b":" + req

    def meta(req, ctx):
        md = {k: v for k, v in ctx.invocation_metadata() if not k.endswith("-bin")}
        return json.dumps(md, sort_keys=True).encode()

    def server_stream(req, ctx):
        n, x = req.split(b":", 1)
        for i in range(int(n)):
            yield x + str(i).encode()

    def client_stream(reqs, ctx):
        return b",".join(reqs)

    def bidi(reqs, ctx):
        for r in reqs:
            yield r.upper()

    def fail(req, ctx):
        code, details = req.decode().split(":", 1)
        ctx.set_trailing_metadata((("x-trailer", "kept"),))
        ctx.abort(grpc.StatusCode[code], details)

    def stream_fail(req, ctx):
        code, details = req.decode().split(":", 1)
        yield b"partial"
        ctx.abort(grpc.StatusCode[code], details)

    def slow_stream(req, ctx):
        n, ms = (int(x) for x in req.split(b":"))
        for i in range(n):
            if i:
                time.sleep(ms / 1000)
            yield str(i).encode()

    def sleep(req, ctx):
        time.sleep(int(req) / 1000)
        return b"slept"

    ident = lambda b: b
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "Meta": grpc.unary_unary_rpc_method_handler(meta, ident, ident),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream, ident, ident),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream, ident, ident),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, ident, ident),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, ident, ident),
        "Sleep": grpc.unary_unary_rpc_method_handler(sleep, ident, ident),
        "StreamFail": grpc.unary_stream_rpc_method_handler(stream_fail, ident, ident),
        "SlowStream": grpc.unary_stream_rpc_method_handler(slow_stream, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", handlers),))
    addr = f"127.0.0.1:{port}"
    if tls:
        with open(tls[0], "rb") as c, open(tls[1], "rb") as k:
            creds = grpc.ssl_server_credentials(((k.read(), c.read()),))
        server.add_secure_port(addr, creds)
    else:
        server.add_insecure_port(addr)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
