#!/usr/bin/env python3
# A plugin written with Kong's Python PDK (kong-pdk, from PyPI), run as Kong runs one: a
# dedicated plugin server, asked for its info with `--dump` and started with `-p <dir>`,
# listening on <dir>/py-greeter.sock. Written for Turnpike's tests.
import kong_pdk.pdk.kong as kong

Schema = (
    {"message": {"type": "string", "default": "hello"}},
    {"deny_header": {"type": "string", "default": "x-deny"}},
    {"log_file": {"type": "string"}},
)
version = "0.2.0"
priority = 950


class Plugin(object):
    def __init__(self, config):
        self.config = config

    def rewrite(self, kong: kong.kong):
        # Runs for a global config only, before the router (as in Kong).
        kong.service.request.set_header("x-py-rewrite", "before routing")

    def access(self, kong: kong.kong):
        denied, _ = kong.request.get_header(self.config["deny_header"])
        if denied:
            return kong.response.exit(403, {"message": "denied by py-greeter"}, {"x-py": "denied"})
        host, _ = kong.request.get_header("host")
        kong.service.request.set_header("x-py-greeting", "%s %s" % (self.config["message"], host))
        headers, _ = kong.request.get_headers()
        kong.service.request.set_header("x-py-multi", ",".join(headers.get("x-multi", [])))
        path, _ = kong.request.get_path()
        kong.response.set_header("x-py-path", path)
        # The gateway's consumer by username, as Kong's PDK loads it.
        consumer, err = kong.client.load_consumer("grace", True)
        kong.service.request.set_header(
            "x-py-consumer", consumer["id"] if consumer else "error: %s" % err)
        # A PDK function Turnpike does not have answers with an error naming it.
        _, err = kong.node.get_memory_stats()
        kong.service.request.set_header("x-py-missing", str(err))

    def response(self, kong: kong.kong):
        # Kong's response phase: the upstream's whole body, before the client gets anything.
        body, _ = kong.service.response.get_raw_body()
        status, _ = kong.service.response.get_status()
        kong.response.set_header("x-py-upstream-bytes", str(len(body or b"")))
        if status == 418:
            return kong.response.exit(200, {"message": "tea replaced by py-greeter"})

    def log(self, kong: kong.kong):
        if self.config.get("log_file"):
            entry, _ = kong.log.serialize()
            status, _ = kong.response.get_status()
            ua, _ = kong.request.get_header("user-agent")
            with open(self.config["log_file"], "a") as f:
                f.write("%d %s %s\n" % (status, ua, entry))


if __name__ == "__main__":
    from kong_pdk.cli import start_dedicated_server

    start_dedicated_server("py-greeter", Plugin, version, priority, Schema)
