"""The `a2a-sdk` backend: an a2a-sdk `AgentExecutor`, run in the gate's own process.

An agent written for the a2a-sdk needs no server of its own. For each run the gate
builds the SDK's `RequestContext` (the message, and on a continued turn the task with
its history) and hands `execute` an `EventQueue` of its own that reads every event the
executor enqueues as it comes: status messages and artifact chunks become the run's
progress (stream subscribers see them live), and the last status decides the reply.
Payment, tasks, streams and cancels stay the gate's: only a `completed` run is a
delivery, and the executor never sees a key or a payment token.

Messages cross in the SDK's protobuf types through its own JSON mapping (`ParseDict`,
`MessageToDict`), from and to the v1.0 shapes `server.dialects` already speaks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.types.a2a_pb2 import (
    Message,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError  # type: ignore[import-untyped]

from server import callables, usage
from server.agents import AgentReply, AgentRequest, NoProgress, Progress
from server.config import AgentConfig
from server.dialects import (
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    V10,
    message_from_any,
    message_out_v10,
    parts_from_any,
    state_from_any,
    task_out,
)

logger = logging.getLogger("a2a_gate.sdk")

ENDED_STATES = TERMINAL_STATES | INTERRUPTED_STATES


def build_executor(target: str) -> AgentExecutor:
    """`target` names an `AgentExecutor` class (built with no arguments) or a factory returning one."""
    found = callables.load(target)
    executor = found() if callable(found) else found
    if not isinstance(executor, AgentExecutor):
        raise TypeError(f"{target} did not give an a2a.server.agent_execution.AgentExecutor")
    return executor


@dataclass
class Run:
    """One call of `execute`: what the executor has said so far."""

    progress: Progress
    artifacts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by artifactId, in order
    state: str | None = None  # the last terminal or interrupted state it set
    text: str = ""  # the message that came with it
    status_parts: list[dict[str, Any]] = field(default_factory=list)  # ... all of it: a bare answer
    message_parts: list[dict[str, Any]] | None = None  # a Message answer: the whole reply at once
    context: RequestContext | None = None
    used: usage.Counts = field(default_factory=dict)  # `metadata.usage` of its events, summed

    def report(self, metadata: Any) -> None:
        self.used = usage.added(self.used, usage.from_metadata(metadata))

    def take(self, event: Any) -> None:
        if self.message_parts is not None or self.state in TERMINAL_STATES:
            return  # the answer is given: what comes after it changes nothing
        if isinstance(event, Message):
            raw = MessageToDict(event)
            message = message_from_any(raw)
            self.message_parts = message["parts"] if message else []
            self.report(raw.get("metadata"))
        elif isinstance(event, Task):
            task = MessageToDict(event)
            for artifact in task.get("artifacts") or []:
                self.artifact(artifact, append=False)
            self.used = usage.from_metadata(task.get("metadata")) or self.used  # a whole task: its total
            self.status(task.get("status"))
        elif isinstance(event, TaskStatusUpdateEvent):
            update = MessageToDict(event)
            self.report(update.get("metadata"))
            self.status(update.get("status"))
        elif isinstance(event, TaskArtifactUpdateEvent):
            update = MessageToDict(event)
            self.report(update.get("metadata"))
            self.report((update.get("artifact") or {}).get("metadata"))  # TaskUpdater.add_artifact(metadata=...)
            parts = self.artifact(update.get("artifact") or {}, append=update.get("append") is True)
            if parts:
                self.progress.chunk(parts)

    def status(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        state = state_from_any(raw.get("state"))
        message = message_from_any(raw.get("message"))
        text = " ".join(p["text"] for p in message["parts"] if p["kind"] == "text") if message else ""
        if state in ENDED_STATES:
            self.state, self.text = state, text
            self.status_parts = message["parts"] if message else []
        elif state == "working" and text:
            self.progress.status(text)

    def artifact(self, raw: dict[str, Any], *, append: bool) -> list[dict[str, Any]]:
        artifact_id = str(raw.get("artifactId") or "")
        parts = parts_from_any(raw.get("parts"))
        if append and artifact_id in self.artifacts:
            self.artifacts[artifact_id].extend(parts)
        else:
            self.artifacts[artifact_id] = list(parts)
        return parts

    def reply(self, context_id: str) -> AgentReply:
        memory = {"context_id": context_id, "state": self.state or ""}
        if self.message_parts is not None:
            if not self.message_parts:
                return AgentReply.failed("The agent answered with an empty message.")
            return AgentReply(parts=self.message_parts, backend_ref=memory, usage=self.used)
        parts = [part for chunk in self.artifacts.values() for part in chunk]
        if self.state == "completed" and not parts:  # completed with its answer in the status message
            parts = self.status_parts
        if self.state is None or self.state == "completed":
            if not parts:
                return AgentReply.failed("The agent ended without an answer.")
            return AgentReply(parts=parts, text=self.text, backend_ref=memory, usage=self.used)
        if self.state in INTERRUPTED_STATES:
            return AgentReply(state=self.state, parts=parts, text=self.text or self.state, backend_ref=memory)
        return AgentReply(state=self.state, text=self.text or f"The agent ended the task: {self.state}.")


class Events(EventQueue):
    """The queue `execute` and `cancel` write to: each event is read as it is enqueued."""

    def __init__(self, run: Run) -> None:
        self.run = run

    async def enqueue_event(self, event: Any) -> None:
        self.run.take(event)


def sdk_request(request: AgentRequest) -> tuple[Message, Task | None]:
    """The message in the SDK's types, and on a continued turn the task with its history."""
    message = ParseDict(message_out_v10(request.message), Message(), ignore_unknown_fields=True)
    state = request.backend_ref.get("state")
    if state not in INTERRUPTED_STATES:
        return message, None
    task = {
        "id": request.task_id,
        "contextId": request.context_id,
        "status": {"state": state},
        "history": request.history,
    }
    return message, ParseDict(task_out(task, V10), Task(), ignore_unknown_fields=True)


class SdkBackend:
    """One executor, built at start-up, shared by every task of its agent."""

    def __init__(self, agent: AgentConfig) -> None:
        self.agent = agent
        self.executor = build_executor(agent.executor)
        self.running: dict[str, Run] = {}  # our task id (the executor's too) -> its run

    async def run(self, request: AgentRequest, progress: Progress) -> AgentReply:
        try:
            message, task = sdk_request(request)
        except ParseError as exc:  # the caller's message, not the agent: e.g. file bytes that are not base64
            logger.warning("agent %s: the message does not fit the a2a-sdk's types: %s", self.agent.name, exc)
            return AgentReply.failed("The message has a part this agent cannot read (file bytes must be base64).")
        context = RequestContext(
            ServerCallContext(),
            SendMessageRequest(message=message),
            task_id=request.task_id,
            context_id=request.context_id,
            task=task,
        )
        run = Run(progress=progress, context=context)
        self.running[request.task_id] = run
        try:
            await self.executor.execute(context, Events(run))
        finally:
            self.running.pop(request.task_id, None)
        return run.reply(request.context_id)

    async def cancel(self, task_id: str, backend_ref: dict[str, Any]) -> bool:
        """The executor's `cancel`, then our cancel goes on (the running `execute` is stopped)."""
        run = self.running.get(task_id)
        if run is not None and run.context is not None:
            await self.executor.cancel(run.context, Events(run))
            return True
        context = RequestContext(
            ServerCallContext(), task_id=task_id, context_id=str(backend_ref.get("context_id") or "") or None
        )
        await self.executor.cancel(context, Events(Run(progress=NoProgress())))
        return True

    async def aclose(self) -> None:
        return None
