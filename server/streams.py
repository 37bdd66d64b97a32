"""Server-sent event streams of one task, for `message/stream` and resubscription.

A task running in this worker is followed through its `Execution` (every status and
artifact event as it is published); a task running in another worker is followed
through the shared store, polled until it ends. Either way the stream opens with the
Task as it is now and closes after the final event. A slow reader never holds the
server up: it loses intermediate events and is sent the final state.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse

from server import dialects
from server.dialects import INTERRUPTED_STATES, TERMINAL_STATES
from server.execution import Execution, Subscriber, status_event

KEEPALIVE_SECONDS = 15.0
STORE_POLL_SECONDS = 0.5
ENDED_STATES = TERMINAL_STATES | INTERRUPTED_STATES  # a stream cycle ends at either


def sse(call_id: Any, result: Any) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": call_id, "result": result}, separators=(",", ":"))
    return f"data: {body}\n\n".encode("ascii")


def sse_response(events: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"cache-control": "no-store", **(headers or {})}
    )


async def follow_live(
    call_id: Any, dialect: str, execution: Execution, subscriber: Subscriber, first: dict[str, Any]
) -> AsyncIterator[bytes]:
    """`first` (the Task when `subscriber` subscribed), then the execution's events to the
    final one. The caller subscribes and takes `first` together, with no await between."""
    try:
        yield sse(call_id, first)
        while True:
            if subscriber.overflowed or (execution.done.is_set() and subscriber.queue.empty()):
                await execution.done.wait()
                yield sse(call_id, dialects.event_out(status_event(execution.task, final=True), dialect))
                return
            try:
                event = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield b": keepalive\n\n"
                continue
            yield sse(call_id, dialects.event_out(event, dialect))
            if event.get("final") is True:
                return
    finally:
        execution.unsubscribe(subscriber)


async def follow_stored(
    call_id: Any,
    dialect: str,
    task: dict[str, Any],
    reload: Callable[[], Awaitable[dict[str, Any] | None]],
    deadline_seconds: float,
) -> AsyncIterator[bytes]:
    """The Task, then its changes as they are stored (by another worker, or by the next
    turn of an interrupted task), until the turn under way ends: a terminal state, or a
    new interruption. An interrupted task waits for its caller's next message.

    Bounded: past `deadline_seconds` (by then housekeeping has failed a task nobody runs)
    the stream closes with the last stored state; a task that disappears closes it too."""
    yield sse(call_id, dialects.send_result(task, dialect))
    seen = {a.get("artifactId") for a in task.get("artifacts") or []}
    status = task["status"]
    give_up = time.monotonic() + deadline_seconds
    quiet_since = time.monotonic()
    while time.monotonic() < give_up:
        await asyncio.sleep(STORE_POLL_SECONDS)
        current = await reload()
        if current is None:
            return
        for artifact in current.get("artifacts") or []:
            if artifact.get("artifactId") not in seen:
                seen.add(artifact.get("artifactId"))
                event = {
                    "kind": "artifact-update",
                    "taskId": current["id"],
                    "contextId": current["contextId"],
                    "artifact": artifact,
                    "lastChunk": True,
                }
                yield sse(call_id, dialects.event_out(event, dialect))
        if current["status"] != status:
            status = current["status"]
            final = status["state"] in ENDED_STATES
            yield sse(call_id, dialects.event_out(status_event(current, final=final), dialect))
            if final:
                return
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield b": keepalive\n\n"
