"""The A2A methods: send, stream, get, cancel, subscribe and list, for any caller.

Both the free path and the payment gate call these. A send is split in two,
`plan_send` (read the request, no side effects) and `start_send` (create or continue
the task and run it), so the gate can put its payment steps between the two.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import functools
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.responses import Response, StreamingResponse

from server import dialects
from server.config import StreamConfig
from server.dialects import INTERRUPTED_STATES, TERMINAL_STATES, V10, InvalidShape
from server.execution import CANCEL_CHANNEL, DeliveryHooks, DeliveryMode, Execution, Runner
from server.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    result_response,
    shutting_down,
)
from server.streams import (
    StoredWatches,
    StreamSlots,
    TooManyStreams,
    follow_live,
    follow_stored,
    holding,
    sse,
    sse_response,
)
from server.tasks import TaskQuery, TaskStore, agent_message, new_id, new_task, set_status, trim_history

logger = logging.getLogger("a2a_gate.methods")

CANCEL_WAIT_SECONDS = 10.0  # how long a cancel waits for the process running the task to stop it
CANCEL_CHECK_SECONDS = 0.1
# A blocking send's task is written once, with its outcome, unless it runs longer than this:
# then it is written as it stands (ListTasks, housekeeping and other workers see it), and again at the end.
UNWRITTEN_SECONDS = 0.5

__all__ = ["Methods", "SendPlan", "finished", "plan_send", "sse", "unsupported"]

PAGE_SIZE, MAX_PAGE_SIZE = 50, 100  # ListTasks, as the a2a-sdk


@dataclass(slots=True)
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


def finished(task: dict[str, Any]) -> RpcError:
    """The answer to a message naming a task in a terminal state, which is never continued or
    restarted (A2A 3.1.1: UnsupportedOperationError), on every path: free, paid or paid in-band."""
    state = task["status"]["state"]
    return RpcError(UNSUPPORTED_OPERATION, f"Task is in a terminal state ({state}): it cannot be continued")


def keep_message(message: dict[str, Any]) -> dict[str, Any]:
    """The default message filter: keep everything."""
    return message


class Methods:
    def __init__(
        self,
        store: TaskStore,
        runner: Runner,
        scrub: Callable[[dict[str, Any]], dict[str, Any]] = keep_message,
        streams: StreamConfig = StreamConfig(),  # noqa: B008 -- frozen
    ) -> None:
        self.store = store
        self.runner = runner
        self.slots = StreamSlots(streams)  # resubscriptions open here, bounded
        self.watches = StoredWatches()  # one store poller per task followed here
        # What a message may keep once it is accepted: the payment gate removes signed
        # material here, before anything is stored, run or echoed.
        self.scrub = scrub
        self.writing: set[asyncio.Task[None]] = set()  # deferred tasks being written while they run

    async def start_send(
        self,
        plan: SendPlan,
        agent: str,
        owner: str,
        hooks: DeliveryHooks | None = None,
        with_writes: Callable[[dict[str, Any], bool], Sequence[tuple[str, Sequence[Any]]]] | None = None,
    ) -> Execution:
        """Create the task (or continue an interrupted one of the same owner) and run it.

        `with_writes(task, final)`: rows that belong with a new task (the payment gate's bookkeeping
        for it), written in the task's own transaction and round trip; `final` when the task is
        first written as it ends, with its delivery's statements (`TaskStore.create`)."""
        message = self.scrub(plan.message)
        task_id = message.get("taskId")
        if task_id is None:
            task = new_task(message.get("contextId"), message)
            # a blocking send: no one can name the task before its answer, which waits for the write;
            # free, or paid by its delivery's own write (which stores the task with it)
            one_write = hooks is None or hooks.mode is DeliveryMode.ONE_WRITE
            deferred = one_write and plan.blocking and plan.call.operation == "send"
            rows = None if with_writes is None else functools.partial(with_writes, task)
            await self.store.create(task, agent=agent, owner=owner, deferred=deferred, with_writes=rows)
        else:
            found = await self.store.get(task_id, owner, agent)
            if found is None:
                raise RpcError(TASK_NOT_FOUND)
            if found["status"]["state"] in TERMINAL_STATES:
                raise finished(found)
            if found["status"]["state"] not in INTERRUPTED_STATES or task_id in self.runner.live:
                raise RpcError(
                    INVALID_PARAMS, f"Task is {found['status']['state']}: only an interrupted task can be continued"
                )
            task, interrupted = found, found["status"]["state"]
            message = {**message, "contextId": task["contextId"]}
            if "messageId" not in message:  # required of a request: an id is minted only when missing
                message["messageId"] = new_id()
            task.setdefault("history", []).append(message)
            set_status(task, "working")  # resumed: it was submitted on its first turn, not now
            # the turn starts now, and so does its deadline; unless another message or a cancel came first
            if not await self.store.start_turn(task, interrupted):
                now = await self.store.get(task_id, owner, agent)
                if now is not None and now["status"]["state"] in TERMINAL_STATES:
                    raise finished(now)
                raise RpcError(INVALID_PARAMS, "Task changed meanwhile: only an interrupted task can be continued")
        return self.runner.start(task, agent, message, hooks)

    async def start_task(
        self, task: dict[str, Any], agent: str, message: dict[str, Any], hooks: DeliveryHooks | None = None
    ) -> Execution:
        """Run an existing task on one of its messages (a request paid for after it was made)."""
        set_status(task, "submitted")
        await self.store.save(task)
        return self.runner.start(task, agent, self.scrub(message), hooks)

    async def send(self, plan: SendPlan, execution: Execution) -> dict[str, Any]:
        """The send result in the caller's dialect, after the work when blocking."""
        if plan.blocking:
            if execution.task["id"] in self.store.unwritten:
                await self.wait_unwritten(execution)
            else:
                await execution.answerable.wait()
                if not execution.done.is_set():  # a shutdown could wait no longer for its settlement
                    raise shutting_down()
        task = trim_history(execution.task, plan.history_length)
        return dialects.send_result(task, plan.call.dialect)

    async def wait_unwritten(self, execution: Execution) -> None:
        """Wait for a deferred task to end; it is stored before its answer leaves (DatabaseUnavailable
        if it cannot be), and stored as it stands if it runs past UNWRITTEN_SECONDS."""
        timer = asyncio.get_running_loop().call_later(UNWRITTEN_SECONDS, self._write_soon, execution.task)
        try:
            await execution.done.wait()
        finally:
            timer.cancel()
        try:
            await self.store.write(execution.task)  # nothing to do when the last save wrote it
        except BaseException:
            self.store.unwritten.pop(execution.task["id"], None)  # the caller is told it failed
            raise

    def _write_soon(self, task: dict[str, Any]) -> None:
        job = asyncio.create_task(self._write_running(task))
        self.writing.add(job)
        job.add_done_callback(self.writing.discard)

    async def _write_running(self, task: dict[str, Any]) -> None:
        try:
            await self.store.write(task)
        except Exception as exc:  # noqa: BLE001 -- the final save, or the answer, writes it again
            logger.warning("storing running task %s failed: %s", task["id"], type(exc).__name__)

    def stream(self, plan: SendPlan, execution: Execution, headers: dict[str, str] | None = None) -> StreamingResponse:
        call = plan.call
        subscriber = execution.subscribe()
        # the task as it is now, before the execution runs: the stream's first event
        first = dialects.send_result(copy.deepcopy(trim_history(execution.task, plan.history_length)), call.dialect)
        return sse_response(follow_live(call.id, call.dialect, execution, subscriber, first), headers)

    async def subscribe(self, call: Call, agent: str, owner: str, client: str = "") -> StreamingResponse:
        """Resubscription: the Task now, then every event until it ends, from any worker.

        Each open stream holds a slot (at most so many per task, per owner and per `client`,
        the caller's address); past a cap, -32603 `too_many_streams`, retryable."""
        if not self.runner.agents.get(agent).streaming:  # type: ignore[union-attr]
            raise RpcError(UNSUPPORTED_OPERATION, "This agent does not stream")
        task = await self.store.get(call.params.get("id"), owner, agent)
        if task is None:
            raise RpcError(TASK_NOT_FOUND)
        live = self.runner.live.get(task["id"])
        if live is None and task["status"]["state"] in TERMINAL_STATES:
            raise RpcError(UNSUPPORTED_OPERATION, f"Task is {task['status']['state']}: a finished task has no stream")
        try:
            release = self.slots.take(task["id"], owner, client)
        except TooManyStreams as exc:
            raise RpcError(
                INTERNAL_ERROR,
                f"Too many open streams per {exc.scope}",
                {"code": "too_many_streams", "retryable": True, "scope": exc.scope, "limit": exc.limit},
            ) from None
        if live is not None:
            subscriber = live.subscribe()
            first = dialects.send_result(copy.deepcopy(live.task), call.dialect)
            return sse_response(holding(follow_live(call.id, call.dialect, live, subscriber, first), release))
        watch = self.watches.join(task, lambda: self.store.get(task["id"], owner, agent))

        def done() -> None:
            release()
            self.watches.leave(task["id"], watch)

        events = follow_stored(call.id, call.dialect, task, watch, self.store.deadline_seconds)
        return sse_response(holding(events, once(done)))

    async def task_call(self, call: Call, agent: str, owner: str, client: str = "") -> Response:
        """The task calls (get, cancel, subscribe, list) of a caller proved to be `owner`, from
        `client` (its address): one table for every path, so principals and payers get the same."""
        if call.operation == "get":
            return result_response(call.id, await self.get(call, agent, owner))
        if call.operation == "cancel":
            return result_response(call.id, await self.cancel(call, agent, owner))
        if call.operation == "subscribe":
            return await self.subscribe(call, agent, owner, client)
        if call.operation == "list":
            return result_response(call.id, await self.list(call, agent, owner))
        raise unsupported(call)

    async def list(self, call: Call, agent: str, owner: str | None) -> dict[str, Any]:
        """ListTasks: `owner`'s tasks at this agent, newest first, one page at a time
        (an empty page for a caller who owns nothing here: no owner)."""
        try:
            query, length, with_artifacts = list_query(call.params, call.dialect)
        except InvalidShape as exc:
            raise invalid(exc) from None
        tasks, total, cursor = await self.store.page(owner, agent, query) if owner else ([], 0, None)
        page = []
        for task in tasks:
            live = self.runner.live.get(task["id"])
            if live is not None and query.state in (None, live.task["status"]["state"]):
                task = copy.deepcopy(live.task)
            task = dict(trim_history(task, length))
            if not with_artifacts:
                task.pop("artifacts", None)
            elif "artifacts" not in task:
                task["artifacts"] = []
            page.append(dialects.task_out(task, call.dialect))
        return {"tasks": page, "nextPageToken": encode_cursor(cursor), "pageSize": query.size, "totalSize": total}

    async def get(self, call: Call, agent: str, owner: str) -> dict[str, Any]:
        try:
            length = dialects.history_length(call.params.get("historyLength"))
        except InvalidShape as exc:
            raise invalid(exc) from None
        task = await self.store.get(call.params.get("id"), owner, agent)
        if task is None:
            raise RpcError(TASK_NOT_FOUND)
        live = self.runner.live.get(task["id"])
        if live is not None:
            task = live.task
        return dialects.task_out(trim_history(task, length), call.dialect)

    async def cancel(self, call: Call, agent: str, owner: str) -> dict[str, Any]:
        task = await self.store.get(call.params.get("id"), owner, agent)
        if task is None:
            raise RpcError(TASK_NOT_FOUND)
        live = self.runner.live.get(task["id"])
        if live is not None:
            refused = await self.runner.cancel(live)
            if refused:
                raise RpcError(TASK_NOT_CANCELABLE, refused)
            task = live.task
        elif task["status"]["state"] in TERMINAL_STATES:
            raise RpcError(TASK_NOT_CANCELABLE)
        elif task["status"]["state"] in INTERRUPTED_STATES:
            if not await self.runner.backend_agrees_to_cancel(agent, task["id"]):
                raise RpcError(TASK_NOT_CANCELABLE, "The upstream agent did not agree to cancel the task")
            task = await self.store.get(task["id"], owner, agent)  # as it is after that wait
            if task is None or task["status"]["state"] not in INTERRUPTED_STATES or task["id"] in self.runner.live:
                raise RpcError(TASK_NOT_CANCELABLE, "Task changed while its cancel was forwarded")
            set_status(task, "canceled", agent_message(task, "Canceled by the caller."))
            await self.store.save(task)
        else:
            task = await self.cancel_elsewhere(task, agent, owner)
        return dialects.task_out(task, call.dialect)

    async def cancel_elsewhere(self, task: dict[str, Any], agent: str, owner: str) -> dict[str, Any]:
        """A task another worker or replica runs: ask it through the store, then wait for the outcome."""
        if await self.store.request_cancel(task["id"]):
            await self.store.db.notify(CANCEL_CHANNEL, task["id"])
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(CANCEL_CHECK_SECONDS)
            current = await self.store.get(task["id"], owner, agent)
            if current is None:
                raise RpcError(TASK_NOT_FOUND)
            state = current["status"]["state"]
            if state == "canceled":
                return current
            if state not in ("submitted", "working"):
                raise RpcError(TASK_NOT_CANCELABLE, f"Task is {state}")
        raise RpcError(TASK_NOT_CANCELABLE, "The task did not stop in time (it runs in another process)")


def once(action: Callable[[], None]) -> Callable[[], None]:
    """`action`, run at its first call only."""
    ran = False

    def run() -> None:
        nonlocal ran
        if not ran:
            ran = True
            action()

    return run


def task_answer(plan: SendPlan, task: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    """A send's answer that is a Task as it stands: a JSON-RPC result, or one SSE event for a stream."""
    result = dialects.send_result(trim_history(task, plan.history_length), plan.call.dialect)
    if plan.call.operation == "stream":
        return StreamingResponse(
            iter([sse(plan.call.id, result)]),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", **(headers or {})},
        )
    return result_response(plan.call.id, result, headers)


def list_query(params: dict[str, Any], dialect: str) -> tuple[TaskQuery, int | None, bool]:
    """ListTasks parameters: filters and page, historyLength, includeArtifacts."""
    size = params.get("pageSize")
    if size is None:
        size = PAGE_SIZE
    elif isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PAGE_SIZE:
        raise InvalidShape(f"pageSize must be a whole number from 1 to {MAX_PAGE_SIZE}")
    context_id = params.get("contextId")
    if context_id is not None and (not isinstance(context_id, str) or "\x00" in context_id):
        raise InvalidShape("contextId must be a string (no NUL)")
    query = TaskQuery(
        size=size,
        context_id=context_id or None,
        state=dialects.state_in(params.get("status"), dialect),
        status_after=timestamp_in(params.get("statusTimestampAfter")),
        after=decode_cursor(params.get("pageToken")),
    )
    include = params.get("includeArtifacts")
    if include is not None and not isinstance(include, bool):
        raise InvalidShape("includeArtifacts must be a boolean")
    return query, dialects.history_length(params.get("historyLength")), include is True


_FRACTION = re.compile(r"(\.\d{6})\d+")  # Python reads at most microseconds


def timestamp_in(raw: Any) -> str | None:
    """A protobuf Timestamp in its JSON form (RFC 3339), in the form tasks store theirs."""
    if raw is None or raw == "":
        return None
    try:
        if not isinstance(raw, str):
            raise ValueError
        moment = datetime.fromisoformat(_FRACTION.sub(r"\1", raw.replace("Z", "+00:00")))
        if moment.tzinfo is None:
            raise ValueError
    except ValueError:
        raise InvalidShape("statusTimestampAfter must be an RFC 3339 timestamp") from None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_cursor(cursor: tuple[float, str] | None) -> str:
    if cursor is None:
        return ""
    return base64.urlsafe_b64encode(json.dumps(cursor, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(raw: Any) -> tuple[float, str] | None:
    """A pageToken this server issued (opaque to the client); anything else is -32602."""
    if raw is None or raw == "":
        return None
    try:
        if not isinstance(raw, str) or len(raw) > 512:
            raise ValueError
        value = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        updated_at, task_id = value
        if isinstance(updated_at, bool) or not isinstance(updated_at, (int, float)) or not isinstance(task_id, str):
            raise ValueError
        return float(updated_at), task_id
    except (ValueError, TypeError, binascii.Error):
        raise InvalidShape("pageToken is not one this server issued") from None
