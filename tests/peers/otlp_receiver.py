"""An OTLP/HTTP trace receiver for the trace tests, built on the official
OpenTelemetry protobuf messages (the `opentelemetry-proto` package), not on
anything of ours: it decodes the `ExportTraceServiceRequest` bodies that
exporters POST to `/v1/traces`.

    otlp_receiver.py MODE OUT

MODE is `ok` (answer every export), `hang` (accept it, never answer: a
collector that is down behind a live socket) or `sink` (answer without
decoding or writing anything: a collector for benchmarks). Prints `listening on
127.0.0.1:PORT` on stderr once it listens. Appends one JSON line per export
request to OUT:

    {"services": [...], "raw": "<base64 of the body>", "spans": [
       {"service", "trace_id", "span_id", "parent_span_id", "name", "kind",
        "attributes": {key: value}, "links": [{"trace_id", "span_id"}],
        "status": {"code", "message"}}]}
"""

import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

MODE, OUT = sys.argv[1], sys.argv[2]
LOCK = threading.Lock()


def value(v):
    """An OTLP AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, kind)


def decode(body: bytes) -> dict:
    req = trace_service_pb2.ExportTraceServiceRequest()
    req.ParseFromString(body)
    services, spans = [], []
    for rs in req.resource_spans:
        attrs = {kv.key: value(kv.value) for kv in rs.resource.attributes}
        service = attrs.get("service.name")
        services.append(service)
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    {
                        "service": service,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": trace_pb2.Span.SpanKind.Name(s.kind),
                        "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                        "links": [
                            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                            for l in s.links
                        ],
                        "status": MessageToDict(s.status),
                    }
                )
    return {"services": services, "spans": spans, "raw": base64.b64encode(body).decode()}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (the stdlib's name)
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        if MODE == "hang":
            time.sleep(3600)
            return
        if MODE == "sink":
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            record = decode(body)
        except Exception as e:  # a body that is not OTLP is the test's failure
            record = {"error": f"{type(e).__name__}: {e}", "raw": base64.b64encode(body).decode()}
        with LOCK, open(OUT, "a") as f:
            f.write(json.dumps(record) + "\n")
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"listening on 127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
server.serve_forever()
