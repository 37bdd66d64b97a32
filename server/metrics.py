"""Prometheus metrics (prometheus-client), served at /metrics, and who may read them.

Labels come from bounded, public sets: an agent is named only when it is exposed
(`agent_label`), outcomes come from a fixed set. A label naming a hidden agent would
tell anyone who can scrape which names the identical 401s are hiding. What is built on
the server registers its own metrics on `registry` (the gate: `gate/metrics.py`). With
several workers each serves its own counters.

`/metrics` is for the operator, not the public: `[http] metrics_listen` serves it on a
listener of its own (a loopback address, say) in the same process, and nowhere else;
`[http] metrics_token_env` names the variable holding a bearer token it asks for
(`MetricsAccess`).

The operator's console (`/console/`: a page, and the JSON API under `/console/api/` the anonymous
path serves, `AnonymousPath.console`) shares that door: only on the metrics listener, and only when
a token is set; its API asks for the token as /metrics does. The page itself holds no data (it asks
for the token, then reads the API), so it is the one console path served without it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server.config import HttpConfig
from server.secret_files import secret

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
        self.reloads = Counter(
            "a2a_gate_config_reloads",
            "Configuration reloads (SIGHUP) by outcome: applied, or refused whole",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("applied", "refused"):  # at 0 from the start: a rule's increase() sees the first one
            self.reloads.labels(outcome)
        # the file read last is the one a restart would start from: 0 while it is refused (alert on it)
        self.reload_successful = Gauge(
            "a2a_gate_config_last_reload_successful",
            "1 while the configuration file read last was taken (at start, or by the last SIGHUP), 0 once refused",
            registry=self.registry,
        )
        self.reload_successful.set(1)
        self.request_children: dict[tuple[str, str, str], Any] = {}  # labels() looked up once per label set
        # gauges of stored state are read from the database (asynchronously) before each scrape
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []

    def count_request(self, agent: str, caller: str, outcome: str) -> None:
        """One answered request (its labels are bounded: public agent labels, caller kinds, outcomes)."""
        key = (agent, caller, outcome)
        child = self.request_children.get(key)
        if child is None:
            child = self.request_children[key] = self.requests.labels(*key)
        child.inc()

    async def endpoint(self, request: Request) -> Response:
        for refresh in self.before_scrape:
            await refresh()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


METRICS_PATH = "/metrics"
ADMIN_PATHS = frozenset({METRICS_PATH, "/healthz", "/readyz"})  # what the metrics listener serves
CONSOLE_PATH = "/console"  # the console's page and API, beside them (`AnonymousPath.console`)
CONSOLE_PAGES = frozenset({CONSOLE_PATH, CONSOLE_PATH + "/"})  # no data in it: served without the token
NO_STORE = {"Cache-Control": "no-store"}


def is_console(path: str) -> bool:
    return path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/")


class MetricsAccess:
    """ASGI middleware: /metrics only on the metrics listener when there is one (which serves
    nothing but it, the health checks and the console), and only with the bearer token when one
    is set; the console only there and only with a token set. Every refusal is the 404 (or 401)
    an unknown path gets: the public port shows nothing."""

    def __init__(self, app: ASGIApp, http: HttpConfig, environ: Mapping[str, str] = os.environ) -> None:
        self.app = app
        self.listen = http.metrics_listen
        # a token variable that is set but empty, or unset, refuses everyone (`serve` stops first)
        self.token = (secret(http.metrics_token_env, environ) or "").encode() if http.metrics_token_env else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> Response | None:
        path = scope["path"]
        console = is_console(path)
        not_found = JSONResponse({"detail": "Not Found"}, status_code=404)
        if self.listen is not None:
            admin = self.on_metrics_listener(scope)
            if (admin and path not in ADMIN_PATHS and not console) or (not admin and (path == METRICS_PATH or console)):
                return not_found
        if console and (self.listen is None or self.token is None):
            return not_found  # a console is for the operations listener and its token, never the A2A port
        asks_token = path == METRICS_PATH or (console and path not in CONSOLE_PAGES)
        if asks_token and self.token is not None and not self.authorized(scope):
            return JSONResponse(
                {"detail": "Not authenticated"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer", **(NO_STORE if console else {})},
            )
        return None

    def on_metrics_listener(self, scope: Scope) -> bool:
        """Did the connection come in on the metrics listener (the local address it reached)?"""
        server = scope.get("server")
        if not server or server[1] is None:
            return False
        assert self.listen is not None
        listen_host, listen_port = self.listen
        if int(server[1]) != listen_port:
            return False
        if ipaddress.ip_address(listen_host).is_unspecified:  # 0.0.0.0 or ::: the port says it
            return True
        try:
            return str(ipaddress.ip_address(server[0])) == listen_host
        except ValueError:
            return False

    def authorized(self, scope: Scope) -> bool:
        if not self.token:
            return False
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False
