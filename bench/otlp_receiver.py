"""An OTLP/HTTP trace receiver for the tracing tests and bench.tracing_cost, in a thread of the caller's process:
POST /v1/traces, as OpenTelemetry's Python exporter sends it (protobuf ExportTraceServiceRequest, decoded with
opentelemetry-proto) and as tritonserver sends it (OTLP/JSON, ids in hex), kept as Spans."""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span


class OtlpReceiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def take_json(self, body: bytes) -> None:
        spans = []
        for resource in json.loads(body).get("resourceSpans", []):
            attributes = {
                a["key"]: a["value"].get("stringValue", "") for a in resource.get("resource", {}).get("attributes", [])
            }
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    spans.append(
                        Span(
                            attributes.get("service.name", ""),
                            span.get("name", ""),
                            span.get("traceId", "").lower(),
                            span.get("spanId", "").lower(),
                            span.get("parentSpanId", "").lower(),
                        )
                    )
        with self.lock:
            self.spans += spans

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        Span(
                            attributes.get("service.name", ""),
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                        )
                    )
        with self.lock:
            self.spans += spans

    def wait_for(self, predicate, timeout_s: float = 20.0) -> list[Span]:
        """The spans once predicate(spans) holds, or all of them after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.2)
        return spans

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        status = 200
        try:
            if self.headers.get("Content-Type", "").startswith("application/json"):
                self.server.take_json(body)
            else:
                self.server.take(body)
        except Exception:  # a body that is not OTLP: the sender is told, the test sees no spans
            status = 400
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass
