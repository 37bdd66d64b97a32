"""The `upstream` backend: another A2A server, with the gate as its client.

Every answer an upstream gives goes through ONE function, `parse_answer`, into typed
variants that never raise. The caller's credentials and payment token are never
forwarded; the only credential sent is the operator's, from the environment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from server import request_log, usage
from server.agents import AgentReply, AgentRequest, Progress
from server.config import AgentConfig
from server.dialects import (
    INTERRUPTED_STATES,
    message_from_any,
    parts_from_any,
    state_from_any,
)
from server.jsonrpc import TASK_NOT_FOUND, load_json
from server.secret_files import secret
from server.tasks import new_id

logger = logging.getLogger("a2a_gate.upstream")


@dataclass(frozen=True)
class Result:
    """A finished answer: a Message, or a Task in a terminal or interrupted state."""

    state: str
    parts: list[dict[str, Any]]
    text: str
    task_id: str = ""
    context_id: str = ""
    usage: usage.Counts = field(default_factory=dict)  # the upstream's `metadata.usage`, if it reports one


@dataclass(frozen=True)
class Running:
    task_id: str
    context_id: str


@dataclass(frozen=True)
class RpcFailure:
    code: int
    message: str


@dataclass(frozen=True)
class Malformed:
    reason: str


Answer = Result | Running | RpcFailure | Malformed


def parse_answer(status_code: int, body: bytes) -> Answer:
    """Read one upstream HTTP answer; anything unexpected is `Malformed`, never an exception."""
    if status_code != 200:
        return Malformed(f"HTTP {status_code}")
    try:
        doc = load_json(body)
    except (ValueError, RecursionError):
        return Malformed("body is not JSON")
    if not isinstance(doc, dict):
        return Malformed("body is not a JSON-RPC object")
    error = doc.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return RpcFailure(
            code if isinstance(code, int) and not isinstance(code, bool) else 0,
            message[:200] if isinstance(message, str) else "",
        )
    result = doc.get("result")
    if not isinstance(result, dict):
        return Malformed("no result object")
    # v1.0 wraps results as {"task": ...} or {"message": ...}
    if "kind" not in result and len(result) == 1 and isinstance(next(iter(result.values())), dict):
        result = next(iter(result.values()))
    if "status" in result:
        return _task_answer(result)
    message = message_from_any(result)
    if message is None or not message["parts"]:
        return Malformed("result is neither a Task nor a Message")
    return Result(
        "completed", message["parts"], _text(message["parts"]), usage=usage.from_metadata(result.get("metadata"))
    )


def _task_answer(task: dict[str, Any]) -> Answer:
    status = task.get("status")
    task_id = task.get("id")
    if not isinstance(status, dict) or not isinstance(task_id, str):
        return Malformed("task without id or status")
    state = state_from_any(status.get("state"))
    if state is None:
        return Malformed("task with an unknown state")
    context_id: str = task["contextId"] if isinstance(task.get("contextId"), str) else ""
    if state in ("submitted", "working"):
        return Running(task_id, context_id)
    status_message = message_from_any(status.get("message"))
    status_parts = status_message["parts"] if status_message else []
    parts: list[dict[str, Any]] = []
    artifacts = task.get("artifacts")
    if isinstance(artifacts, list):
        for artifact in artifacts:
            if isinstance(artifact, dict):
                parts.extend(parts_from_any(artifact.get("parts")))
    if state == "completed" and not parts:
        parts = status_parts
    # usage on the task's metadata, else on its final status message's
    raw = status.get("message")
    used = usage.from_metadata(task.get("metadata")) or usage.from_metadata(
        raw.get("metadata") if isinstance(raw, dict) else None
    )
    return Result(state, parts, _text(status_parts), task_id, context_id, used)


def _text(parts: list[dict[str, Any]]) -> str:
    return " ".join(p["text"] for p in parts if p.get("kind") == "text")[:500]


def failed(detail: str, reason: str) -> AgentReply:
    """A failed turn, which the request's log line calls `agent_error` (with `detail`, ours: never the
    upstream's own words, which the task carries) as it does an agent that raised."""
    request_log.agent_failed(detail)
    return AgentReply.failed(reason)


class UpstreamBackend:
    def __init__(self, agent: AgentConfig) -> None:
        self.agent = agent
        self.url = agent.url
        headers = {"content-type": "application/json"}
        credential = secret(agent.upstream_auth_env) if agent.upstream_auth_env else None
        if credential:
            headers["authorization"] = credential
        self.client = httpx.AsyncClient(headers=headers, timeout=agent.timeout_seconds, follow_redirects=False)
        self.running: dict[str, str] = {}  # our task id -> the upstream's, while we poll it

    async def run(self, request: AgentRequest, progress: Progress) -> AgentReply:
        message: dict[str, Any] = {
            "kind": "message",
            "role": "user",
            "messageId": new_id(),
            "parts": request.message["parts"],
        }
        upstream_task = request.backend_ref.get("upstream_task_id")
        if upstream_task:
            message["taskId"] = upstream_task
            message["contextId"] = request.backend_ref.get("upstream_context_id") or ""
        answer = await self.call("message/send", {"message": message, "configuration": {"blocking": True}})
        deadline = time.monotonic() + self.agent.deadline_seconds
        try:
            while isinstance(answer, Running):
                self.running[request.task_id] = answer.task_id
                if time.monotonic() >= deadline:
                    return failed(
                        "upstream deadline", f"upstream did not finish within {self.agent.deadline_seconds:g}s"
                    )
                await asyncio.sleep(self.agent.poll_interval_seconds)
                answer = await self.call("tasks/get", {"id": answer.task_id})
        finally:
            self.running.pop(request.task_id, None)
        return self.reply(answer)

    async def cancel(self, task_id: str, backend_ref: dict[str, Any]) -> bool:
        """Ask the upstream to cancel its task: True when it agrees or the task is gone there.

        False when the upstream has not named its task yet (a blocking send still in
        flight), refuses, or cannot be reached: our task then goes on."""
        upstream_task = self.running.get(task_id) or backend_ref.get("upstream_task_id")
        if not upstream_task:
            return False
        answer = await self.call("tasks/cancel", {"id": upstream_task})
        if isinstance(answer, RpcFailure):
            return answer.code == TASK_NOT_FOUND
        if isinstance(answer, Malformed):
            logger.warning("upstream agent %s (%s): cancel: %s", self.agent.name, self.url, answer.reason)
        return isinstance(answer, Result) and answer.state == "canceled"

    async def call(self, method: str, params: dict[str, Any]) -> Answer:
        body = {"jsonrpc": "2.0", "id": new_id(), "method": method, "params": params}
        try:
            response = await self.client.post(self.url, json=body)
        except httpx.TimeoutException:
            return Malformed(f"timed out after {self.agent.timeout_seconds:g}s")
        except httpx.HTTPError as exc:
            return Malformed(f"unreachable ({type(exc).__name__})")
        return parse_answer(response.status_code, response.content)

    def reply(self, answer: Answer) -> AgentReply:
        if isinstance(answer, Malformed):
            logger.warning("upstream agent %s (%s): %s", self.agent.name, self.url, answer.reason)
            return failed("upstream malformed", f"upstream agent failed: {answer.reason}")
        if isinstance(answer, RpcFailure):
            return failed(
                f"upstream error {answer.code}", f"upstream agent answered error {answer.code}: {answer.message}"
            )
        assert isinstance(answer, Result)
        ref = {"upstream_task_id": answer.task_id, "upstream_context_id": answer.context_id} if answer.task_id else {}
        if answer.state == "completed":
            return AgentReply(parts=answer.parts, text=answer.text, backend_ref=ref, usage=answer.usage)
        if answer.state in INTERRUPTED_STATES:
            # an interrupted upstream task may already hold partial work: kept, not delivered
            return AgentReply(state=answer.state, parts=answer.parts, text=answer.text or answer.state, backend_ref=ref)
        if answer.state == "canceled":
            return AgentReply(state="canceled", text=answer.text or "The upstream agent canceled the task.")
        text = f"upstream task {answer.state}" + (f": {answer.text}" if answer.text else "")
        return failed(f"upstream task {answer.state}", text)

    async def aclose(self) -> None:
        await self.client.aclose()
