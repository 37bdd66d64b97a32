"""The A2A methods: send, stream, get and cancel, for any caller.

Both the free path and the payment gate call these. A send is split in two,
`plan_send` (read the request, no side effects) and `start_send` (create or continue
the task and run it), so the gate can put its payment steps between the two.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response, StreamingResponse

from server import dialects
from server.dialects import INTERRUPTED_STATES, TERMINAL_STATES, V10, InvalidShape
from server.execution import Execution, Runner, Settlement, status_event
from server.jsonrpc import (
    INVALID_PARAMS,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    result_response,
)
from server.tasks import TaskStore, agent_message, new_id, new_task, set_status, trim_history

KEEPALIVE_SECONDS = 15.0


@dataclass(frozen=True)
class SendPlan:
    """A read send request: the message, and how the caller wants the answer."""

    call: Call
    message: dict[str, Any]
    blocking: bool
    history_length: int | None


def invalid(exc: InvalidShape) -> RpcError:
    return RpcError(INVALID_PARAMS, str(exc))


def plan_send(call: Call) -> SendPlan:
    """Read a send/stream request; -32602 for a message without usable parts."""
    try:
        message = dialects.message_in(call.params.get("message"), call.dialect)
        configuration = call.params.get("configuration") or {}
        if not isinstance(configuration, dict):
            raise InvalidShape("params.configuration must be an object")
        length = dialects.history_length(configuration.get("historyLength"))
    except InvalidShape as exc:
        raise invalid(exc) from None
    if call.dialect == V10:
        blocking = configuration.get("returnImmediately") is not True
    else:
        blocking = configuration.get("blocking") is not False
    return SendPlan(call=call, message=message, blocking=blocking, history_length=length)


def unsupported(call: Call) -> RpcError:
    if call.operation == "push":
        return RpcError(PUSH_NOT_SUPPORTED)
    return RpcError(UNSUPPORTED_OPERATION)


def keep_message(message: dict[str, Any]) -> dict[str, Any]:
    """The default message filter: keep everything."""
    return message


class Methods:
    def __init__(self, store: TaskStore, runner: Runner,
                 scrub: Callable[[dict[str, Any]], dict[str, Any]] = keep_message) -> None:
        self.store = store
        self.runner = runner
        # What a message may keep once it is accepted: the payment gate removes signed
        # material here, before anything is stored, run or echoed.
        self.scrub = scrub

    def start_send(self, plan: SendPlan, agent: str, owner: str, settlement: Settlement | None = None) -> Execution:
        """Create the task (or continue an interrupted one of the same owner) and run it."""
        message = self.scrub(plan.message)
        task_id = message.get("taskId")
        if task_id is None:
            task = new_task(message.get("contextId"), message)
            self.store.create(task, agent=agent, owner=owner)
        else:
            found = self.store.get(task_id, owner, agent)
            if found is None:
                raise RpcError(TASK_NOT_FOUND)
            if found["status"]["state"] not in INTERRUPTED_STATES or task_id in self.runner.live:
                raise RpcError(INVALID_PARAMS, f"Task is {found['status']['state']}: only an interrupted task can be continued")
            task = found
            message = {**message, "contextId": task["contextId"]}
            message.setdefault("messageId", new_id())
            task.setdefault("history", []).append(message)
            set_status(task, "submitted")
            self.store.save(task)
        return self.runner.start(task, agent, message, settlement)

    def start_task(self, task: dict[str, Any], agent: str, message: dict[str, Any],
                   settlement: Settlement | None = None) -> Execution:
        """Run an existing task on one of its messages (a request paid for after it was made)."""
        set_status(task, "submitted")
        self.store.save(task)
        return self.runner.start(task, agent, self.scrub(message), settlement)

    async def send(self, plan: SendPlan, execution: Execution) -> dict[str, Any]:
        """The send result in the caller's dialect, after the work when blocking."""
        if plan.blocking:
            await execution.done.wait()
        task = trim_history(execution.task, plan.history_length)
        return dialects.send_result(task, plan.call.dialect)

    def stream(self, plan: SendPlan, execution: Execution, headers: dict[str, str] | None = None) -> StreamingResponse:
        subscriber = execution.subscribe()
        call = plan.call
        # the task as it is now, before the execution runs: the stream's first event
        first = dialects.send_result(copy.deepcopy(trim_history(execution.task, plan.history_length)), call.dialect)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield sse(call.id, first)
                final = False
                while not final:
                    if subscriber.overflowed:
                        await execution.done.wait()
                        yield sse(call.id, dialects.event_out(status_event(execution.task, final=True), call.dialect))
                        return
                    try:
                        event = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE_SECONDS)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    final = event.get("final") is True
                    yield sse(call.id, dialects.event_out(event, call.dialect))
            finally:
                execution.unsubscribe(subscriber)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store", **(headers or {})})

    def get(self, call: Call, agent: str, owner: str) -> dict[str, Any]:
        try:
            length = dialects.history_length(call.params.get("historyLength"))
        except InvalidShape as exc:
            raise invalid(exc) from None
        task = self.store.get(call.params.get("id"), owner, agent)
        if task is None:
            raise RpcError(TASK_NOT_FOUND)
        live = self.runner.live.get(task["id"])
        if live is not None:
            task = live.task
        return dialects.task_out(trim_history(task, length), call.dialect)

    async def cancel(self, call: Call, agent: str, owner: str) -> dict[str, Any]:
        task = self.store.get(call.params.get("id"), owner, agent)
        if task is None:
            raise RpcError(TASK_NOT_FOUND)
        live = self.runner.live.get(task["id"])
        if live is not None:
            if not await self.runner.cancel(live):
                raise RpcError(TASK_NOT_CANCELABLE, "Task is delivered and being settled")
            task = live.task
        elif task["status"]["state"] in TERMINAL_STATES:
            raise RpcError(TASK_NOT_CANCELABLE)
        elif task["status"]["state"] in INTERRUPTED_STATES:
            set_status(task, "canceled", agent_message(task, "Canceled by the caller."))
            self.store.save(task)
        else:
            raise RpcError(TASK_NOT_CANCELABLE, "Task is running in another worker")
        return dialects.task_out(task, call.dialect)


def task_answer(plan: SendPlan, task: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    """A send's answer that is a Task as it stands: a JSON-RPC result, or one SSE event for a stream."""
    result = dialects.send_result(trim_history(task, plan.history_length), plan.call.dialect)
    if plan.call.operation == "stream":
        return StreamingResponse(iter([sse(plan.call.id, result)]), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", **(headers or {})})
    return result_response(plan.call.id, result, headers)


def sse(call_id: Any, result: Any) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": call_id, "result": result}, separators=(",", ":"))
    return f"data: {body}\n\n".encode("ascii")
