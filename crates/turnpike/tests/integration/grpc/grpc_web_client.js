// The official gRPC-Web client (npm `grpc-web`, the library browsers run) in Node, for the
// gateway's integration tests: XMLHttpRequest from `xhr2`, messages as raw bytes (the echo
// server's methods take and give bytes, so no generated code is needed).
//
// Usage: node grpc_web_client.js BASE_URL FORMAT CALLS_JSON
//   FORMAT: "text" (application/grpc-web-text) or "binary" (application/grpc-web+proto)
//   CALLS_JSON: [{"method": "Unary", "kind": "unary|server", "request": "text",
//                 "metadata": {"k": "v"}}, ...]
// Prints a JSON list, one result per call: {"code", "message", "responses", "metadata",
// "headers"} (code, message and metadata from the status the client reports, headers the
// response's initial metadata of a unary call; responses decoded as UTF-8).

global.XMLHttpRequest = require("xhr2");
const grpcWeb = require("grpc-web");

class Raw {
  constructor(bytes) {
    this.bytes = bytes;
  }
  serializeBinary() {
    return this.bytes;
  }
}

const [, , base, format, callsJson] = process.argv;
const client = new grpcWeb.GrpcWebClientBase({ format });

function descriptor(method, kind) {
  const type = kind === "server" ? grpcWeb.MethodType.SERVER_STREAMING : grpcWeb.MethodType.UNARY;
  return new grpcWeb.MethodDescriptor(
    `/echo.Echo/${method}`,
    type,
    Raw,
    Raw,
    (r) => r.serializeBinary(),
    (bytes) => new Raw(bytes),
  );
}

function run(call) {
  const md = descriptor(call.method, call.kind || "unary");
  const url = `${base}/echo.Echo/${call.method}`;
  const req = new Raw(new TextEncoder().encode(call.request || ""));
  const out = { responses: [], code: null, message: null, metadata: {} };
  const text = (r) => Buffer.from(r.bytes).toString("utf8");
  return new Promise((resolve) => {
    if ((call.kind || "unary") === "unary") {
      const c = client.rpcCall(url, req, call.metadata || {}, md, (err, resp) => {
        if (err) {
          out.code = err.code;
          out.message = err.message;
          out.metadata = err.metadata || {};
        } else {
          out.responses.push(text(resp));
        }
      });
      c.on("metadata", (m) => {
        out.headers = m;
      });
      c.on("status", (s) => {
        if (out.code === null) {
          out.code = s.code;
          out.message = s.details;
          out.metadata = s.metadata || {};
        }
        resolve(out);
      });
      c.on("error", () => setTimeout(() => resolve(out), 50));
    } else {
      const s = client.serverStreaming(url, req, call.metadata || {}, md);
      s.on("data", (r) => out.responses.push(text(r)));
      s.on("status", (st) => {
        out.code = st.code;
        out.message = st.details;
        out.metadata = st.metadata || {};
      });
      s.on("error", (e) => {
        out.code = e.code;
        out.message = e.message;
      });
      s.on("end", () => resolve(out));
    }
  });
}

(async () => {
  const results = [];
  for (const call of JSON.parse(callsJson)) {
    results.push(await run(call));
  }
  console.log(JSON.stringify(results));
})();
