"""The seam the anonymous path plugs into.

The server answers principals itself and hands every other caller to an `AnonymousPath`
it is given (`create_app(settings, anonymous=...)`), so it knows nothing of payments: the
payment gate is one such path and builds on the server, never the other way. Without
one, every anonymous call gets the uniform 401 and cards declare no extensions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.agents import AgentRegistry
from server.config import AgentConfig, Settings
from server.database import Database
from server.execution import Runner
from server.methods import Methods
from server.metrics import Metrics
from server.tasks import TaskStore


@dataclass(frozen=True)
class Parts:
    """The parts of the server an anonymous path may build on."""

    settings: Settings
    db: Database
    store: TaskStore
    agents: AgentRegistry
    runner: Runner
    methods: Methods
    metrics: Metrics


class AnonymousPath(Protocol):
    """Everything the server asks of the path that serves callers without a key."""

    async def handle(self, request: Request, agent: str) -> Response:
        """Answer one anonymous POST to `/a2a/{agent}`."""

    def scrub_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """A message as it may be stored, run and echoed (on every path, principals' too)."""

    def agent_view(self, message: dict[str, Any]) -> dict[str, Any]:
        """A stored message as an agent sees it (on every path, principals' too)."""

    def card_extensions(self, agent: AgentConfig, public_url: str) -> list[dict[str, Any]]:
        """Extensions the agent's card declares for this path."""

    async def readiness(self) -> dict[str, str]:
        """Named states for `/readyz`'s body ("ok", "not configured", or what is wrong): reported
        there, never deciding whether the server is ready."""

    async def expire(self, older_than_seconds: float) -> None:
        """Housekeeping: drop this path's records as old as finished tasks."""

    async def open_store(self) -> None:
        """Create or update this path's own tables (the server's are ready by then)."""

    async def start(self) -> None:
        """Begin serving: after `open_store`, before the first request."""

    async def close(self) -> None: ...


AnonymousFactory = Callable[[Parts], AnonymousPath]


def not_authenticated() -> JSONResponse:
    """The one answer for an anonymous caller the server will not serve: the same bytes for
    an unknown, unexposed or unpriced agent, so nobody can map the fleet."""
    return JSONResponse({"detail": "Not authenticated"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class KeysOnly:
    """The anonymous path of a server that serves principals only."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    async def handle(self, request: Request, agent: str) -> Response:
        return not_authenticated()

    def scrub_message(self, message: dict[str, Any]) -> dict[str, Any]:
        return message

    def agent_view(self, message: dict[str, Any]) -> dict[str, Any]:
        return message

    def card_extensions(self, agent: AgentConfig, public_url: str) -> list[dict[str, Any]]:
        return []

    async def readiness(self) -> dict[str, str]:
        return {}

    async def expire(self, older_than_seconds: float) -> None:
        return None

    async def open_store(self) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
