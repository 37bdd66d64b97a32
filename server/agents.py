"""Agents and their backends: what actually does the work behind the endpoint.

A backend turns an `AgentRequest` into an `AgentReply`, telling its `Progress` what it
has so far as it goes (stream subscribers see it live). It sees the caller's message
content and history, never the caller's credentials or payment token: payment
metadata is stripped before a message reaches a backend.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from server import callables, usage
from server.dialects import INTERRUPTED_STATES, part_in_v03


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
    # what the work used, by name (`{"output_tokens": 812}`): carried to the delivery, never priced here
    usage: usage.Counts = field(default_factory=dict)

    @classmethod
    def failed(cls, reason: str) -> AgentReply:
        return cls(state="failed", text=reason)


@dataclass(frozen=True)
class AgentStatus:
    """What a streaming agent yields to say where it is: `working` (with a message for the
    caller), or `input-required` / `auth-required`, which ends the run as a pause."""

    state: str = "working"
    text: str = ""


@dataclass(frozen=True)
class Usage:
    """What a streaming agent yields to report usage as it goes; its reports are summed by name."""

    counts: usage.Counts


class Progress(Protocol):
    """Where a backend reports work in progress, before its reply."""

    def status(self, text: str) -> None:
        """The agent is working, and says so to the caller (a `working` status-update)."""

    def chunk(self, parts: list[dict[str, Any]]) -> None:
        """More of the answer: parts appended to the result artifact (an artifact-update)."""

    async def checkpoint(self, used: usage.Counts) -> None:
        """The agent moved on past the chunks it sent, having used `used` so far: where the work
        is delivered chunk by chunk, those chunks are delivered now (a streaming agent's next yield)."""


class NoProgress:
    """A progress nobody follows."""

    def status(self, text: str) -> None:
        return None

    def chunk(self, parts: list[dict[str, Any]]) -> None:
        return None

    async def checkpoint(self, used: usage.Counts) -> None:
        return None


class Backend(Protocol):
    async def run(self, request: AgentRequest, progress: Progress) -> AgentReply: ...

    async def aclose(self) -> None: ...


class EchoBackend:
    """Built in: answers with the parts it was sent, as one artifact; its usage is the
    characters of text it answers with (`characters`), which a usage price can charge by."""

    async def run(self, request: AgentRequest, progress: Progress) -> AgentReply:
        parts = [dict(p) for p in request.message["parts"]]
        characters = sum(len(p["text"]) for p in parts if p.get("kind") == "text" and isinstance(p.get("text"), str))
        return AgentReply(parts=parts, usage={"characters": characters})

    async def aclose(self) -> None:
        return None


class PythonBackend:
    """An importable callable, ``package.module:function``, called with the `AgentRequest`.

    An async function returns a string (one text part), a list of parts, or an
    `AgentReply` (with its `usage`). An async generator streams: it yields strings (text
    chunks), parts, `AgentStatus` updates and `Usage` reports as it goes, and what it
    yielded is the answer when it ends (or the `AgentReply` it yields last), its usage the
    sum of its reports (or the reply's own, when it has one).
    """

    def __init__(self, target: str) -> None:
        obj = callables.load(target)
        if not callable(obj):
            raise TypeError(f"{target} is not callable")
        self.function: Callable[[AgentRequest], Any] = obj
        self.target = target

    async def run(self, request: AgentRequest, progress: Progress) -> AgentReply:
        result = self.function(request)
        if inspect.isasyncgen(result):
            return await follow(result, progress)
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


async def follow(events: AsyncGenerator[Any, Any], progress: Progress) -> AgentReply:
    """Run a streaming agent to its end: each yield reported as progress, the answer built up.

    A chunk is complete when the agent yields its next item (a `Usage` report with it counts
    for the chunks before it): the progress may then deliver it (`Progress.checkpoint`)."""
    answer = Answer()
    used: usage.Counts = {}
    try:
        async for item in events:
            if isinstance(item, Usage):
                # BadUsage goes to the runner: the run fails, the chunks it would count for never delivered
                used = usage.checked(usage.added(used, usage.checked(item.counts)))
                await progress.checkpoint(used)
                continue
            if isinstance(item, AgentReply):
                if item.state == "completed" and not item.parts:
                    item.parts = answer.parts
                item.usage = usage.checked(item.usage) or used
                return item
            if isinstance(item, AgentStatus):
                await progress.checkpoint(used)
                if item.state in INTERRUPTED_STATES:
                    return AgentReply(state=item.state, parts=answer.parts, text=item.text or item.state, usage=used)
                if item.state != "working":
                    return AgentReply.failed(f"agent yielded a status it may not set: {item.state!r}")
                progress.status(item.text)
                continue
            if item == "":
                continue
            part = {"kind": "text", "text": item} if isinstance(item, str) else part_in_v03(item)
            if part is None:
                return AgentReply.failed(f"agent yielded an unusable {type(item).__name__}")
            await progress.checkpoint(used)
            answer.add(part)
            progress.chunk([part])
    finally:
        await events.aclose()
    if not answer.parts:
        return AgentReply.failed("The agent produced no answer.")
    return AgentReply(parts=answer.parts, usage=used)


@dataclass
class Answer:
    """The parts a streaming agent has sent so far: consecutive text chunks make one text part."""

    parts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, part: dict[str, Any]) -> None:
        last = self.parts[-1] if self.parts else None
        if part["kind"] == "text" and last is not None and set(last) == {"kind", "text"} and last["kind"] == "text":
            self.parts[-1] = {"kind": "text", "text": last["text"] + part["text"]}
        else:
            self.parts.append(dict(part))
