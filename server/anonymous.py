"""The seam the anonymous path plugs into.

The server answers principals itself and hands every other caller to an `AnonymousPath`
it is given (`create_app(settings, anonymous=...)`), so it knows nothing of payments: the
payment gate is one such path and builds on the server, never the other way. Without
one, every anonymous call gets the uniform 401 and cards declare no extensions.

The path owns its configuration too (`PathConfig`): the server reads its own keys of the
file and hands the tables and per-agent keys the path declares to the path's reader, so
one list holds every problem of the file, each with its key path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from server.config import AgentConfig, Reader, Settings, read_toml
from server.database import Database
from server.execution import Runner
from server.methods import Methods
from server.metrics import Metrics
from server.registry import AgentRegistry
from server.reload import Reloaded
from server.request_log import RequestInfo
from server.signing_key import SigningKey
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
    signing_key: SigningKey | None = None  # the operator's key ([signing]), for a path that signs what it says


class AnonymousPath(Protocol):
    """Everything the server asks of the path that serves callers without a key."""

    outcomes: frozenset[str]  # what its requests may end as in the request log and metrics, beside the server's

    async def handle(self, request: Request, agent: str, info: RequestInfo) -> Response:
        """Answer one anonymous POST to `/a2a/{agent}`; `info` is its request-log line, for the path
        to name the method, the payer and the outcome on. What it raises, the server answers
        (`server.app.answered`): an `RpcError` as itself, anything else as a retryable -32603."""

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

    async def reload(self, settings: Settings) -> Reloaded:
        """Take what this path can of a configuration read again while serving (SIGHUP), from the
        next request on; `ConfigError` refuses the whole file, nothing of it taken."""

    def console(self) -> ASGIApp | None:
        """The operator's console for what this path keeps (an ASGI app), or None: the server mounts
        it at `/console/` on the operations listener only, behind the metrics token (`server.metrics`)."""

    async def close(self) -> None: ...


AnonymousFactory = Callable[[Parts], AnonymousPath]


class PathConfig(Protocol):
    """What an anonymous path reads of the configuration file: the keys the server leaves to it."""

    keys: frozenset[str]  # top-level keys and tables (kept raw in `Settings.sections`)
    agent_keys: frozenset[str]  # keys of an `[agents.NAME]` table (kept raw in `AgentConfig.sections`)

    def read(self, settings: Settings, reader: Reader) -> Any:
        """The path's own configuration from the raw sections, each problem told to `reader`
        with its key path; the server keeps what it returns as `Settings.anonymous`."""


def parse_config(raw: dict[str, Any], path: PathConfig, *, base_dir: Path, source: str = "<dict>") -> Settings:
    """The server's settings and the path's, read from one raw tree: every problem of both in one `ConfigError`."""
    reader = Reader(path.keys, path.agent_keys)
    settings = reader.settings(raw, base_dir, source)
    anonymous = path.read(settings, reader)
    reader.raise_problems(source)
    return replace(settings, anonymous=anonymous, warnings=tuple(f"{source}: {w}" for w in reader.warnings))


def load_config(file: str | os.PathLike[str], path: PathConfig) -> Settings:
    """Read and validate a TOML file for the server and `path`; relative database paths resolve beside it."""
    return parse_config(read_toml(file), path, base_dir=Path(file).resolve().parent, source=str(file))


def not_authenticated() -> JSONResponse:
    """The one answer for an anonymous caller the server will not serve: the same bytes for
    an unknown, unexposed or unpriced agent, so nobody can map the fleet."""
    return JSONResponse({"detail": "Not authenticated"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class KeysOnly:
    """The anonymous path of a server that serves principals only."""

    outcomes: frozenset[str] = frozenset()

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    async def handle(self, request: Request, agent: str, info: RequestInfo) -> Response:
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

    async def reload(self, settings: Settings) -> Reloaded:
        return Reloaded()

    def console(self) -> ASGIApp | None:
        return None

    async def close(self) -> None:
        return None
