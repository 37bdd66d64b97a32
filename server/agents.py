"""Agents and their backends: what actually does the work behind the endpoint.

A backend turns an `AgentRequest` into an `AgentReply`. It sees the caller's message
content and history, never the caller's credentials or payment token: payment
metadata is stripped before a message reaches a backend.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.config import AgentConfig


@dataclass(frozen=True)
class AgentRequest:
    """What a backend gets: the new message, the conversation so far, and ids."""

    message: dict[str, Any]
    history: list[dict[str, Any]]
    task_id: str
    context_id: str
    backend_ref: dict[str, Any] = field(default_factory=dict)  # a backend's own memory per task

    @property
    def text(self) -> str:
        return "\n".join(p["text"] for p in self.message["parts"] if p.get("kind") == "text")


@dataclass
class AgentReply:
    """How the work ended: `completed` (a delivery) or failed / rejected / an interruption."""

    state: str = "completed"
    parts: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""  # the status message shown to the caller
    backend_ref: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, reason: str) -> AgentReply:
        return cls(state="failed", text=reason)


class Backend(Protocol):
    async def run(self, request: AgentRequest) -> AgentReply: ...

    async def aclose(self) -> None: ...


class EchoBackend:
    """Built in: answers with the parts it was sent, as one artifact."""

    async def run(self, request: AgentRequest) -> AgentReply:
        return AgentReply(parts=[dict(p) for p in request.message["parts"]])

    async def aclose(self) -> None:
        return None


class PythonBackend:
    """An importable async callable, ``package.module:function``.

    It is called with the `AgentRequest` and may return a string (one text part),
    a list of parts, or an `AgentReply`.
    """

    def __init__(self, target: str) -> None:
        module_name, _, attribute = target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for name in attribute.split("."):
            obj = getattr(obj, name)
        if not callable(obj):
            raise TypeError(f"{target} is not callable")
        self.function: Callable[[AgentRequest], Awaitable[Any]] = obj
        self.target = target

    async def run(self, request: AgentRequest) -> AgentReply:
        result = self.function(request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, AgentReply):
            return result
        if isinstance(result, str):
            return AgentReply(parts=[{"kind": "text", "text": result}])
        if isinstance(result, list) and all(isinstance(p, dict) for p in result):
            return AgentReply(parts=result)
        return AgentReply.failed(f"agent returned an unusable {type(result).__name__}")

    async def aclose(self) -> None:
        return None


def build_backend(agent: AgentConfig) -> Backend:
    if agent.backend == "upstream":
        from server.upstream import UpstreamBackend

        return UpstreamBackend(agent)
    if agent.backend == "python":
        return PythonBackend(agent.callable)
    return EchoBackend()


class AgentRegistry:
    """The configured agents and one backend instance each, built at start-up."""

    def __init__(self, agents: dict[str, AgentConfig]) -> None:
        self.configs = agents
        self.backends: dict[str, Backend] = {name: build_backend(a) for name, a in agents.items()}

    def get(self, name: str) -> AgentConfig | None:
        return self.configs.get(name)

    def backend(self, name: str) -> Backend:
        return self.backends[name]

    def deadline_seconds(self, name: str) -> float:
        """How long one run of this agent may take before its task fails, uncharged."""
        return self.configs[name].deadline_seconds

    async def aclose(self) -> None:
        for backend in self.backends.values():
            await backend.aclose()
