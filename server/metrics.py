"""Prometheus metrics (prometheus-client), served at /metrics.

Labels come from bounded, public sets: an agent is named only when it is exposed
(`agent_label`), outcomes come from a fixed set. A label naming a hidden agent would
tell anyone who can scrape which names the identical 401s are hiding. Gauges that describe stored state (claims in flight,
the reconciler's backlog) are read from the database at scrape time. With several
workers each serves its own counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
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
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("a2a_gate_requests", "A2A requests by agent, caller kind and outcome",
                                ["agent", "caller", "outcome"], registry=self.registry)
        self.facilitator_seconds = Histogram(
            "a2a_gate_facilitator_seconds", "Facilitator call latency", ["call"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.facilitator_errors = Counter("a2a_gate_facilitator_errors", "Facilitator calls without an answer",
                                          ["call", "reason"], registry=self.registry)
        self.settle_failures = Counter("a2a_gate_settle_failures", "Settlements that did not succeed",
                                       registry=self.registry)
        self.settlements = Counter("a2a_gate_settlements", "Settle passes by outcome (settled, owed, unsettled,"
                                   " needs_attention)", ["outcome"], registry=self.registry)
        self.unsettled = Gauge("a2a_gate_claims_unsettled", "Delivered work written off (never paid)",
                               registry=self.registry)
        self.needs_attention = Gauge("a2a_gate_claims_needs_attention", "Settlements an operator must resolve",
                                     registry=self.registry)
        self.limiter_refusals = Counter("a2a_gate_limiter_refusals", "Anonymous requests refused by a limiter",
                                        ["limiter"], registry=self.registry)
        self.limiter_shared = Gauge("a2a_gate_limiter_shared", "1 while the limiters' buckets are shared through"
                                    " Redis, 0 while this replica answers from its own", registry=self.registry)
        self.limiter_fallbacks = Counter("a2a_gate_limiter_fallbacks", "Times Redis stopped answering and the"
                                         " limiters fell back to this replica's own buckets", registry=self.registry)
        self.claims_in_flight = Gauge("a2a_gate_claims_in_flight", "Claims running or settling",
                                      registry=self.registry)
        self.reconciler_backlog = Gauge("a2a_gate_reconciler_backlog", "Delivered work awaiting settlement",
                                        registry=self.registry)

    def watch_state(self, in_flight: Callable[[], float], backlog: Callable[[], float]) -> None:
        self.claims_in_flight.set_function(in_flight)
        self.reconciler_backlog.set_function(backlog)

    def watch_terminal(self, unsettled: Callable[[], float], needs_attention: Callable[[], float]) -> None:
        self.unsettled.set_function(unsettled)
        self.needs_attention.set_function(needs_attention)

    def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
