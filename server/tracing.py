"""Tracing: OpenTelemetry spans for a request and the steps it takes, when the operator asks.

Decided once per process, at start (`start`). Off, the default: `span` hands out one shared object
that does nothing, and nothing of OpenTelemetry is imported (the `otel` extra need not be
installed), so the free path and the voucher path pay a function call per step and nothing else.
On (`[tracing] enabled = true`): spans are exported over OTLP/HTTP, or to the exporter the
configuration carries (a test's, in memory).

What a span carries is named by its caller, attribute by attribute, and is never a secret: no
token, signature, API key, payer's secret, payment header or message text. Exceptions are not
recorded on spans, in an event or the status (their messages are not ours to vouch for); a span
that ends by one is marked an error, and says no more. A `traceparent` on the incoming request
continues its trace (`span(..., headers=...)`), and `inject` writes the current one on an outgoing call.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from server.config import TracingConfig

SERVICE_NAME = "a2a-gate"  # the service's name when neither the file nor OTEL_SERVICE_NAME gives one
TRACES_PATH = "/v1/traces"  # appended to a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
NEEDED = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")
MISSING = "tracing.enabled is true but OpenTelemetry is not installed: pip install 'a2a-gate[otel]'"

Attribute = str | int | float | bool


class Span(Protocol):
    """What a caller does with its span: name what it learned (OpenTelemetry's own method)."""

    def set_attribute(self, key: str, value: Attribute) -> Any: ...


class _Off:
    """The span while tracing is off: one shared object, entered and left for nothing."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Attribute) -> None:
        return None


OFF = _Off()

_tracer: Any = None  # OpenTelemetry's tracer, while on
_provider: Any = None
_api: Any = None  # opentelemetry.trace, imported only when on
_propagate: Any = None  # opentelemetry.propagate, likewise
_kinds: dict[str, Any] = {}


def problems(config: TracingConfig) -> list[str]:
    """What stops `serve` (and `check-config`) from tracing as configured: the extra missing."""
    if not config.enabled or config.exporter is not None:
        return []
    try:
        if all(importlib.util.find_spec(name) is not None for name in NEEDED):
            return []
    except ImportError:
        pass
    return [MISSING]


def active() -> bool:
    return _tracer is not None


def start(config: TracingConfig) -> bool:
    """Turn tracing on for this process if `config` says so (and OTEL_SDK_DISABLED does not);
    True when this call turned it on (the caller then `stop`s it). Off, nothing is imported."""
    global _tracer, _provider, _api, _propagate
    if not config.enabled or _tracer is not None or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    named = config.service_name or ("" if os.environ.get("OTEL_SERVICE_NAME") else SERVICE_NAME)
    provider = TracerProvider(resource=Resource.create({"service.name": named} if named else {}))
    if config.exporter is not None:  # given in code: every span handed over as it ends
        provider.add_span_processor(SimpleSpanProcessor(config.exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(config.endpoint))))
    _kinds.update(server=trace.SpanKind.SERVER, client=trace.SpanKind.CLIENT, internal=trace.SpanKind.INTERNAL)
    _api, _propagate, _provider = trace, propagate, provider
    _tracer = provider.get_tracer("a2a-gate")
    return True


def traces_url(endpoint: str) -> str | None:
    """The file's collector URL as the exporter takes it; None: the OTEL_* variables decide."""
    if not endpoint:
        return None
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def stop() -> None:
    """Export what is left and turn tracing off (a process's end, a test's)."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is not None:
        provider.shutdown()


def span(
    name: str,
    attributes: Mapping[str, Attribute] | None = None,
    *,
    kind: str = "internal",
    headers: Mapping[str, str] | None = None,
) -> AbstractContextManager[Span]:
    """A span around a step, the current one inside it; `headers`: an incoming request's, whose
    `traceparent` (if any) it continues."""
    if _tracer is None:
        return OFF
    parent = None if headers is None else _propagate.extract(headers)
    return _recording(name, parent, kind, attributes)


@contextlib.contextmanager
def _recording(name: str, parent: Any, kind: str, attributes: Mapping[str, Attribute] | None) -> Iterator[Span]:
    """OpenTelemetry's current span, an error when an exception ends it, but with no word of the
    exception: its own handling would put the message in the status and the stack in an event."""
    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=_kinds[kind],
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception:
            span.set_status(_api.StatusCode.ERROR)
            raise


def annotate(attributes: Mapping[str, Attribute]) -> None:
    """Name what a step learned on the span it runs in (the request's, for the gate's steps)."""
    if _tracer is not None:
        _api.get_current_span().set_attributes(attributes)


def inject(headers: MutableMapping[str, str]) -> None:
    """Write the current trace (`traceparent`) into an outgoing call's headers."""
    if _tracer is not None:
        _propagate.inject(headers)
