"""Prometheus metrics (prometheus-client), served at /metrics.

Labels come from bounded, public sets: an agent is named only when it is exposed
(`agent_label`), outcomes come from a fixed set. A label naming a hidden agent would
tell anyone who can scrape which names the identical 401s are hiding. What is built on
the server registers its own metrics on `registry` (the gate: `gate/metrics.py`). With
several workers each serves its own counters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

UNKNOWN_AGENT = "unknown"  # a name no agent is configured under
HIDDEN_AGENT = "other"  # a configured agent that is not exposed


def agent_label(name: str, agent: Any | None) -> str:
    """How a metric label or a log line names the agent a request asked for."""
    if agent is None:
        return UNKNOWN_AGENT
    return name if agent.exposed else HIDDEN_AGENT


class Metrics:
    """The server's registry and its own request counter."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "a2a_gate_requests",
            "A2A requests by agent, caller kind and outcome",
            ["agent", "caller", "outcome"],
            registry=self.registry,
        )
        # gauges of stored state are read from the database (asynchronously) before each scrape
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []

    async def endpoint(self, request: Request) -> Response:
        for refresh in self.before_scrape:
            await refresh()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
