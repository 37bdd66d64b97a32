"""The operator's console: one page and the JSON API it reads, over what the gate keeps.

Revenue per agent and day, the payments with their stories, what needs the operator (needs attention,
with the re-open action; owed, with the next retry), the channels holding unclaimed charges, request
rates, and the exports. The server mounts it at `/console/` on the operations listener only, behind
the metrics token (`server/metrics.py`); the gate hands it over as `PaymentGate.console`, the way it
hands over its anonymous path. The page is one static file with its script and style inside: nothing
to build, nothing fetched from elsewhere.
"""

from __future__ import annotations

from starlette.routing import Route, Router

from gate.console import api
from gate.console.page import page
from gate.console.rates import RequestRates
from gate.parts import GateParts


def console_app(parts: GateParts) -> Router:
    """The console's routes, relative to where the server mounts them."""
    read = api.ConsoleApi(parts, RequestRates(parts.metrics.registry))
    return Router(
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/api/records", read.records, methods=["GET"]),
            Route("/api/summary", read.summary, methods=["GET"]),
            Route("/api/attention", read.attention, methods=["GET"]),
            Route("/api/channels", read.channels, methods=["GET"]),
            Route("/api/rates", read.rates, methods=["GET"]),
            Route("/api/export", read.export, methods=["GET"]),
            Route("/api/reopen", read.reopen, methods=["POST"]),
        ]
    )
