"""Server-sent event streams of one task, for `message/stream` and resubscription.

A task running in this worker is followed through its `Execution` (every status and
artifact event as it is published); a task running in another worker is followed
through the shared store, polled until it ends: ONE poller per task in this process
(`StoredWatches`), however many streams follow it, each stream reading the poller's
latest copy. Either way the stream opens with the Task as it is now and closes after
the final event. A slow reader never holds the server up: it loses intermediate events
and is sent the final state.

Resubscriptions are bounded (`StreamSlots`): per task, per owner (a key, a payer) and per
client address, so nobody can hold an unbounded number of connections and pollers open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse

from server import dialects, json_text
from server.config import StreamConfig
from server.dialects import INTERRUPTED_STATES, TERMINAL_STATES
from server.execution import SHUTTING_DOWN_EVENT, Execution, Subscriber, status_event
from server.jsonrpc import error_body, shutting_down

logger = logging.getLogger("a2a_gate.streams")

KEEPALIVE_SECONDS = 15.0
STORE_POLL_SECONDS = 0.5
ENDED_STATES = TERMINAL_STATES | INTERRUPTED_STATES  # a stream cycle ends at either


def sse(call_id: Any, result: Any) -> bytes:
    return b"data: " + json_text.encode({"jsonrpc": "2.0", "id": call_id, "result": result}) + b"\n\n"


def sse_shutting_down(call_id: Any) -> bytes:
    """A stream's last event when the server stops before the task ends here: retryable."""
    return b"data: " + json_text.encode(error_body(call_id, shutting_down())) + b"\n\n"


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
            if event is SHUTTING_DOWN_EVENT:
                yield sse_shutting_down(call_id)
                return
            yield sse(call_id, dialects.event_out(event, dialect))
            if event.get("final") is True:
                return
    finally:
        execution.unsubscribe(subscriber)


class TooManyStreams(Exception):
    """A resubscription past one of the caps; `scope` names which (task, owner, client)."""

    def __init__(self, scope: str, limit: int) -> None:
        super().__init__(f"too many open streams per {scope} (at most {limit})")
        self.scope, self.limit = scope, limit


class StreamSlots:
    """The open resubscription streams of this process, counted per task, owner and client."""

    def __init__(self, limits: StreamConfig) -> None:
        self.limits = limits
        self.open: dict[str, Counter[str]] = {"task": Counter(), "owner": Counter(), "client": Counter()}

    def take(self, task_id: str, owner: str, client: str) -> Callable[[], None]:
        """A slot for one stream, or TooManyStreams; returns its release (idempotent)."""
        keys = {"task": task_id, "owner": owner, "client": client}
        caps = {
            "task": self.limits.max_per_task,
            "owner": self.limits.max_per_owner,
            "client": self.limits.max_per_client,
        }
        for scope, key in keys.items():
            if key and self.open[scope][key] >= caps[scope]:
                raise TooManyStreams(scope, caps[scope])
        for scope, key in keys.items():
            if key:
                self.open[scope][key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            for scope, key in keys.items():
                if key:
                    self.open[scope][key] -= 1
                    if self.open[scope][key] <= 0:
                        del self.open[scope][key]  # nothing grows with the callers seen

        return release


def holding(events: AsyncIterator[bytes], release: Callable[[], None]) -> AsyncIterator[bytes]:
    """`events`, holding a stream slot until they end or are dropped (also never started)."""

    async def held() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield event
        finally:
            release()
            if hasattr(events, "aclose"):
                await events.aclose()

    stream = held()
    weakref.finalize(stream, release)  # a stream never iterated (its answer never sent) frees its slot too
    return stream


@dataclass
class StoredWatch:
    """One task followed through the store: the poller's latest copy, and who reads it."""

    reload: Callable[[], Awaitable[dict[str, Any] | None]]
    current: dict[str, Any] | None
    readers: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # replaced at every new copy
    gone: bool = False  # the task disappeared: every reader closes
    stopped: bool = False  # the server is stopping: every reader ends, to resubscribe elsewhere
    poller: asyncio.Task[None] | None = None


class StoredWatches:
    """One store poller per task followed here, shared by every stream that follows it."""

    def __init__(self, interval: float = STORE_POLL_SECONDS) -> None:
        self.interval = interval
        self.watches: dict[str, StoredWatch] = {}
        self.stopping = False

    def join(self, task: dict[str, Any], reload: Callable[[], Awaitable[dict[str, Any] | None]]) -> StoredWatch:
        watch = self.watches.get(task["id"])
        if watch is None:
            watch = self.watches[task["id"]] = StoredWatch(reload, task)
            watch.poller = asyncio.create_task(self.poll(task["id"], watch), name=f"watch-{task['id']}")
        watch.readers += 1
        watch.stopped = self.stopping
        return watch

    def stop(self) -> None:
        """A shutdown: every stream following a task through the store ends now, retryably (the
        task runs elsewhere; another replica can follow it), and so does any that starts later."""
        self.stopping = True
        for watch in self.watches.values():
            watch.stopped = True
            watch.changed.set()

    def leave(self, task_id: str, watch: StoredWatch) -> None:
        watch.readers -= 1
        if watch.readers <= 0 and self.watches.get(task_id) is watch:
            del self.watches[task_id]
            if watch.poller is not None:
                watch.poller.cancel()

    async def poll(self, task_id: str, watch: StoredWatch) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                current = await watch.reload()
            except Exception as exc:  # noqa: BLE001 -- a store outage delays the streams, it ends none
                logger.warning("reading task %s for its streams failed: %s", task_id, type(exc).__name__)
                continue
            if current is None:
                watch.gone = True
            elif current == watch.current:
                continue
            watch.current = current
            changed, watch.changed = watch.changed, asyncio.Event()
            changed.set()
            if watch.gone:
                return


async def follow_stored(
    call_id: Any, dialect: str, task: dict[str, Any], watch: StoredWatch, deadline_seconds: float
) -> AsyncIterator[bytes]:
    """The Task, then its changes as they are stored (by another worker, or by the next
    turn of an interrupted task), until the turn under way ends: a terminal state, or a
    new interruption. An interrupted task waits for its caller's next message. The copies
    come from `watch`, the task's one poller in this process.

    Bounded: past `deadline_seconds` (by then housekeeping has failed a task nobody runs)
    the stream closes with the last stored state; a task that disappears closes it too."""
    yield sse(call_id, dialects.send_result(task, dialect))
    seen = {a.get("artifactId") for a in task.get("artifacts") or []}
    status = task["status"]
    give_up = time.monotonic() + deadline_seconds
    read: dict[str, Any] | None = task  # the copy this stream read last; a slow reader skips to the latest
    while (left := give_up - time.monotonic()) > 0:
        if watch.stopped:
            yield sse_shutting_down(call_id)
            return
        if watch.current is read:
            changed = watch.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(KEEPALIVE_SECONDS, left))
            if watch.stopped:
                continue
            if watch.current is read and not watch.gone:
                if time.monotonic() < give_up:
                    yield b": keepalive\n\n"
                continue
        current = read = watch.current
        if watch.gone or current is None:
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
