"""An OTLP/HTTP collector on loopback for the tracing tests: it takes what the
processes' OTLP exporters send to ``/v1/traces`` (protobuf), decoded with
opentelemetry-proto, and keeps the spans."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class CollectedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items if isinstance(kv, KeyValue)}


class Collector:
    def __init__(self) -> None:
        self.spans: list[CollectedSpan] = []
        self.num_exports = 0
        self._lock = threading.Lock()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans: list[CollectedSpan] = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope in resource_spans.scope_spans:
                spans.extend(_span(service, s) for s in scope.spans)
        with self._lock:
            self.spans.extend(spans)
            self.num_exports += 1

    def named(self, name: str) -> list[CollectedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, names: set[str], timeout_s: float = 60.0) -> dict[str, CollectedSpan]:
        """The first span of each name, once every name has come; AssertionError else."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                found = {s.name: s for s in reversed(self.spans) if s.name in names}
            if set(found) == names:
                return found
            time.sleep(0.1)
        raise AssertionError(f"spans missing after {timeout_s}s: {names - set(found)}")


def _span(service: str, span: Any) -> CollectedSpan:
    return CollectedSpan(
        service=service,
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        kind=span.kind,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        events=[(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events],
    )


@contextmanager
def otlp_collector() -> Iterator[tuple[str, Collector]]:
    """A collector on a free loopback port: its base URL (what
    OTEL_EXPORTER_OTLP_ENDPOINT names) and what it has received."""
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                collector.take(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
