"""An OTLP/HTTP trace collector on a loopback port, for the tests: every body a process exported, as
it came (gzip undone), and the spans decoded from it (opentelemetry-proto, in the test extra)."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Collector:
    """An OTLP/HTTP trace receiver: every body as it came, and the spans decoded from it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.resources: list[dict[str, Any]] = []
        self.spans: list[Any] = []
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.bodies.append(body)
            for resource_spans in request.resource_spans:
                self.resources.append({a.key: a.value.string_value for a in resource_spans.resource.attributes})
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)

    def named(self, name: str) -> list[Any]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, name: str, count: int, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.named(name)) < count:
            assert time.monotonic() < deadline, f"{name}: {len(self.named(name))} of {count} spans arrived"
            time.sleep(0.1)
        return self.named(name)


@contextmanager
def collecting() -> Iterator[tuple[Collector, str]]:
    """A collector serving `POST /v1/traces`, and its base URL (a `[tracing] endpoint`)."""
    received = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                received.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    """A decoded span's attributes, as a dict of their values."""
    values = {}
    for attribute in span.attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind)
    return values
