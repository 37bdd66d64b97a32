"""Running agents: one asyncio task per execution, detached from the HTTP request.

An execution outlives the request that started it, so a dropped connection never
cancels work or its settlement; only `tasks/cancel` does, and only before delivery.
Stream subscribers get bounded queues: a slow reader loses intermediate events and
is sent the final state, it never holds the server up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server import request_log, tracing, usage
from server.agents import AgentReply, AgentRequest, Answer
from server.database import Statement, commit_until_stored
from server.dialects import INTERRUPTED_STATES
from server.metrics import agent_label
from server.registry import AgentRegistry
from server.request_log import TASK_ID
from server.tasks import TaskStore, agent_message, new_id, set_status

logger = logging.getLogger("a2a_gate.execution")

STREAM_QUEUE_SIZE = 64
CANCEL_CHANNEL = "a2a_gate_cancel"  # notifications of cancel requests, payload: the task id
CANCEL_POLL_SECONDS = 0.25  # how soon a cancel asked of another process reaches this one
CANCEL_POLL_NOTIFIED_SECONDS = 2.0  # the same, as a fallback, where notifications come first
STOP_SECONDS = 5.0  # on shutdown, how long undelivered work has to record that it stopped
SETTLE_SECONDS = 5.0  # ... then how long delivered work may settle before its waiting request is answered
UNDELIVERED_STATES = INTERRUPTED_STATES | {"failed", "rejected", "canceled"}
# published to an execution's streams by a shutdown's drain that can wait no longer for it
SHUTTING_DOWN_EVENT: dict[str, Any] = {"kind": "shutting-down"}
PAST_DEADLINE = "The task passed its deadline."  # a turn failed by housekeeping, uncharged


PARTIAL = "partial"  # a stored result artifact's metadata key while its answer is delivered in parts


@dataclass(frozen=True)
class Stop:
    """A delivery hook's word that the run ends here (`DeliveryHooks.deliver_part`).

    The part it was handed was delivered (recorded, then shown) or not (`delivered`: nothing of it is
    recorded or shown); either way the agent is stopped as by a cancel (a streaming agent's generator
    is closed) and nothing after it is delivered. The task ends in `state` with `why` as its status
    message, keeping the parts delivered before; a run that delivered nothing ends `failed`."""

    delivered: bool
    state: str
    why: str


class RunStopped(Exception):
    """Raised through a running agent when a delivery hook stopped its run (`Execution.stop`)."""


class OwnershipLost(Exception):
    """Raised by one of the `DeliveryHooks`: the anonymous path no longer holds this execution's
    right to deliver or record (another process took it over). Nothing more is delivered,
    saved or published as this execution's outcome."""


@dataclass(frozen=True)
class Collected:
    """What settling delivered work came to: metadata for the final status, and whether it is paid."""

    metadata: dict[str, Any]
    paid: bool


class DeliveryMode(enum.Enum):
    """How a paid answer is delivered: the anonymous path says, the runner follows (no payment named)."""

    WHOLE = "whole"  # recorded whole once complete (`mark_delivered`), then collected (`delivered`)
    IN_PARTS = "in_parts"  # chunk by chunk: each complete chunk recorded (`deliver_part`) before it is shown
    ONE_WRITE = "one_write"  # the delivery, its outcome and the final task in one write (`deliver_final`)
    WITHHELD = "withheld"  # recorded whole, collected before the answer leaves; uncollected, it never does


class DeliveryHooks(Protocol):
    """What the anonymous path plugs into an execution (None on the free path), in its `mode`.

    `mark_delivered` records the delivery and runs the statement that saves the work
    (`TaskStore.save_statement`) with it, only if the record is made: one transaction, so a
    crash can never leave delivered work unowed or owed work undelivered (a withheld answer is
    handed to it instead of the task, and there is no statement), and is told what the work used
    (the agent's usage report, plain counts); `delivered` then collects, records the outcome
    durably, mirrors it at `task.metadata` and never raises (its `Collected.metadata` goes on the
    final status message); `saved` stores the final task the same way, its statement with the
    hook's own record; `abandoned` when that store gave up (the outcome recorded stands);
    `not_delivered` runs when nothing is to be charged. Any hook may raise `OwnershipLost`;
    `started` is handed, at the start, what stops the work when the right to deliver is gone.

    IN_PARTS: each complete chunk of a streamed answer is recorded with it (`deliver_part`, in the
    transaction that saves the task with the answer so far, and what the work used so far) before
    anyone sees it; a run that then ends without its whole answer (failed, canceled, paused) is
    collected for the part delivered (`delivered`), not released. `deliver_part` may answer a
    `Stop`: the run ends there, as that says (a part it refuses is neither recorded nor shown).
    While an answer is delivered in parts, its stored copy's result artifact says so (metadata
    `partial`), and only there: the run's end stores it without, so a stored task still marked was
    cut by a crash.

    ONE_WRITE: `deliver_final` is handed the delivered task and a function from the outcome's
    metadata to the statements that store the final task (its save, or a deferred task's INSERT
    with the rows that came with it; each with its WHERE clause last), and returns the outcome, or
    None when it could not (then the delivery is recorded and collected as WHOLE).
    """

    mode: DeliveryMode

    def started(self, revoke: Callable[[], None]) -> None: ...

    async def mark_delivered(
        self, task: dict[str, Any], withheld: dict[str, Any] | None, used: usage.Counts, save: Statement | None
    ) -> None: ...

    async def deliver_part(self, task: dict[str, Any], used: usage.Counts, save: Statement) -> Stop | None: ...

    async def deliver_final(
        self, task: dict[str, Any], used: usage.Counts, final: Callable[[dict[str, Any]], Sequence[Statement]]
    ) -> Collected | None: ...

    async def delivered(self, task: dict[str, Any]) -> Collected: ...

    async def not_delivered(self, task: dict[str, Any]) -> None: ...

    async def saved(self, save: Statement) -> None: ...

    def abandoned(self) -> None: ...


@dataclass
class Subscriber:
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(STREAM_QUEUE_SIZE))
    overflowed: bool = False

    def offer(self, event: dict[str, Any]) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True


@dataclass
class Execution:
    task: dict[str, Any]
    agent: str
    hooks: DeliveryHooks | None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # set with `done`, or by a shutdown's drain that can wait no longer: a blocking request answers then
    answerable: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: list[Subscriber] = field(default_factory=list)
    delivering: bool = False  # past this point the work is delivered and may not be cancelled
    stopped_by_shutdown: bool = False
    stopped_by_deadline: bool = False
    revoked: bool = False  # the anonymous path took back the right to deliver
    job: asyncio.Task[None] | None = None
    artifact_id: str = field(default_factory=new_id)  # the result: streamed in chunks, then whole
    # delivered chunk by chunk (`DeliveryHooks.deliver_part`): the chunks sent, not yet delivered,
    # and the answer delivered so far
    pending: list[list[dict[str, Any]]] = field(default_factory=list)
    delivered_part: Answer = field(default_factory=Answer)
    parts_delivered: int = 0
    stop: Stop | None = None  # a delivery hook ended the run (`DeliveryHooks.deliver_part`)

    def publish(self, event: dict[str, Any]) -> None:
        for subscriber in self.subscribers:
            subscriber.offer(event)

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        self.subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)


def artifact_event(
    task: dict[str, Any], artifact: dict[str, Any], *, append: bool = False, last: bool = True
) -> dict[str, Any]:
    return {
        "kind": "artifact-update",
        "taskId": task["id"],
        "contextId": task["contextId"],
        "artifact": artifact,
        "append": append,
        "lastChunk": last,
    }


class LiveProgress:
    """A running agent's progress, published to the execution's stream subscribers as it comes.

    Nothing of it is stored: the task keeps the whole answer once it is delivered. A paid
    run streams its status texts but not its chunks, which are its answer: the whole answer
    is sent once its delivery is recorded. An agent whose answer is withheld until paid
    shows not even its status texts: the whole answer is sent once the payment is settled.
    """

    def __init__(
        self,
        execution: Execution,
        deliver: Callable[[Execution, usage.Counts], Awaitable[Stop | None]] | None = None,
    ) -> None:
        self.execution = execution
        self.chunks = 0
        # A paid answer is delivered whole, once its delivery is recorded (a chunk streamed
        # before that would be work given away if the run then fails or its claim is lost),
        # or chunk by chunk where the hooks take part of it (`deliver`: each recorded, then
        # shown); a withheld one shows not even its status texts.
        mode = execution.hooks.mode if execution.hooks is not None else None
        paid = mode is not None
        self.by_chunk = mode is DeliveryMode.IN_PARTS and deliver is not None
        self.deliver = deliver
        self.shown_chunks = not paid
        self.shown = mode is not DeliveryMode.WITHHELD

    def status(self, text: str) -> None:
        if not self.shown:
            return
        task = self.execution.task
        set_status(task, "working", agent_message(task, text) if text else None)
        self.execution.publish(status_event(task, final=False))

    def chunk(self, parts: list[dict[str, Any]]) -> None:
        if self.by_chunk:
            self.execution.pending.append(parts)  # delivered at the agent's next yield
            return
        if not self.shown_chunks:
            return
        self.show(parts)

    def show(self, parts: list[dict[str, Any]]) -> None:
        artifact = {"artifactId": self.execution.artifact_id, "name": "result", "parts": parts}
        event = artifact_event(self.execution.task, artifact, append=self.chunks > 0, last=False)
        self.chunks += 1
        self.execution.publish(event)

    async def checkpoint(self, used: usage.Counts) -> None:
        if not self.by_chunk or not self.execution.pending:
            return
        assert self.deliver is not None
        pending = list(self.execution.pending)
        stop = await self.deliver(self.execution, used)
        if stop is None or stop.delivered:
            for parts in pending:
                self.show(parts)
        if stop is not None:  # the agent is told as by a cancel: its generator is closed on the way out
            raise RunStopped


def unusable_usage(execution: Execution, bad: usage.BadUsage) -> AgentReply:
    """A run whose agent reported usage that is not a count (`usage.BadUsage`): it fails, as the
    agent's error, logged as such; nothing it sent after its last good report is delivered."""
    logger.warning("agent %s reported usage that is not a count: %s", execution.agent, bad)
    request_log.agent_failed("agent reported unusable usage")
    return AgentReply.failed(f"The agent reported usage that is not a count ({bad}).")


def with_artifact(task: dict[str, Any], artifact: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's artifacts with `artifact` in place of any earlier version of it (the same id)."""
    kept = [a for a in task.get("artifacts") or [] if a.get("artifactId") != artifact["artifactId"]]
    return [*kept, artifact]


def status_event(task: dict[str, Any], final: bool) -> dict[str, Any]:
    event = {
        "kind": "status-update",
        "taskId": task["id"],
        "contextId": task["contextId"],
        "status": task["status"],
        "final": final,
    }
    if task.get("metadata"):
        event["metadata"] = task["metadata"]
    return event


class Runner:
    """Starts executions and tracks the live ones of this process."""

    def __init__(self, store: TaskStore, agents: AgentRegistry) -> None:
        self.store = store
        self.agents = agents
        self.live: dict[str, Execution] = {}
        # What an agent may see of a stored message: the anonymous path removes its own
        # vocabulary here (the payment gate: its metadata keys), so an agent's work never varies with it.
        self.agent_view: Callable[[dict[str, Any]], dict[str, Any]] = lambda message: message
        self.cancels_seen: set[str] = set()  # cancel requests from other processes, acted on once
        self.cancelling: set[asyncio.Task[str | None]] = set()
        self.stopping = False  # a shutdown's drain is over: work that starts now is stopped at once

    def start(
        self, task: dict[str, Any], agent: str, message: dict[str, Any], hooks: DeliveryHooks | None
    ) -> Execution:
        execution = Execution(task=task, agent=agent, hooks=hooks, stopped_by_shutdown=self.stopping)
        self.live[task["id"]] = execution
        TASK_ID.set(task["id"])  # the request's log lines from here on, and the work's, name the task
        execution.job = asyncio.create_task(self._run(execution, message), name=f"task-{task['id']}")
        if hooks is not None:
            hooks.started(lambda: self.revoke(execution))
        return execution

    def revoke(self, execution: Execution) -> None:
        """The right to deliver is gone: undelivered work stops here and now (its outcome is
        another process's to record); delivered work goes on, and its hooks record nothing."""
        if execution.revoked or execution.done.is_set():
            return
        execution.revoked = True
        if not execution.delivering and execution.job is not None:
            execution.job.cancel()

    async def cancel(self, execution: Execution) -> str | None:
        """Cancel before delivery; None when canceled, else why not (delivered, or the
        backend's upstream agent did not agree: its work goes on, and so does ours)."""
        if execution.delivering or execution.job is None:
            return "Task is delivered and being settled"
        if not await self.backend_agrees_to_cancel(execution.agent, execution.task["id"]):
            return "The upstream agent did not agree to cancel the task"
        if execution.done.is_set():  # it ended while the upstream was asked
            return (
                None
                if execution.task["status"]["state"] == "canceled"
                else f"Task is {execution.task['status']['state']}"
            )
        if execution.delivering:
            return "Task is delivered and being settled"
        execution.job.cancel()
        await execution.done.wait()
        return None

    def stop_past_deadline(self, execution: Execution) -> None:
        """Housekeeping found this turn past its deadline: stop it, undelivered (it ends failed,
        uncharged); delivered work is past stopping and settles."""
        if execution.delivering or execution.job is None:
            return
        execution.stopped_by_deadline = True
        execution.job.cancel()

    async def backend_agrees_to_cancel(self, agent: str, task_id: str) -> bool:
        """A backend that runs the task elsewhere (an upstream agent) is asked first."""
        cancel = getattr(self.agents.backend(agent), "cancel", None)
        if cancel is None:
            return True
        try:
            return bool(await cancel(task_id, await self.store.backend_ref(task_id)))
        except Exception as exc:  # noqa: BLE001 -- a backend bug refuses the cancel, never the request
            logger.warning("agent %s: cancel raised %s", agent, type(exc).__name__)
            return False

    async def follow_cancel_requests(self) -> None:
        """Cancel the tasks running here that another worker or replica was asked to cancel
        (`tasks/cancel` lands on any of them; the store carries the request). A notification,
        where the database has them, wakes this at once; polling covers the rest."""
        hint = asyncio.Event()
        notified = await self.store.db.listen(CANCEL_CHANNEL, lambda task_id: hint.set())
        interval = CANCEL_POLL_NOTIFIED_SECONDS if notified else CANCEL_POLL_SECONDS
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hint.wait(), interval)
            hint.clear()
            try:
                asked = await self.store.cancel_requests([i for i in self.live if i not in self.cancels_seen])
            except Exception as exc:  # noqa: BLE001 -- a store outage delays cancels, it ends nothing
                logger.warning("reading cancel requests failed: %s", type(exc).__name__)
                continue
            for task_id in asked:
                execution = self.live.get(task_id)
                if execution is not None:
                    self.cancels_seen.add(task_id)
                    job = asyncio.create_task(self.cancel(execution), name=f"cancel-{task_id}")
                    self.cancelling.add(job)
                    job.add_done_callback(self.cancelling.discard)

    async def drain(self, timeout: float) -> None:
        """On shutdown (from the signal on, every connection still open): let running executions
        (and their settlements) finish within `timeout`; then stop the undelivered rest, which
        answers their requests with the canceled Task and releases their claims uncharged now
        rather than after a lease; work that starts later is stopped before it runs. Delivered
        work gets SETTLE_SECONDS more to settle; a request still waiting on it is then answered
        "retry" (the payer's retry replays the stored outcome). If the process ends first, the
        claim's lease runs out and another process settles it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.live:
            logger.info("draining %d running task(s), for up to %gs", len(self.live), timeout)
        while (jobs := self._jobs()) and (left := deadline - loop.time()) > 0:
            await asyncio.wait(jobs, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        self.stopping = True
        stopping = [e for e in self.live.values() if e.job is not None and not e.delivering]
        for execution in stopping:
            execution.stopped_by_shutdown = True
            execution.job.cancel()  # type: ignore[union-attr]
        if stopping:
            logger.info("stopped %d undelivered task(s); nothing was charged for them", len(stopping))
            await asyncio.wait([e.job for e in stopping if e.job is not None], timeout=STOP_SECONDS)
        if jobs := self._jobs():
            await asyncio.wait(jobs, timeout=SETTLE_SECONDS)
        for execution in self.live.values():
            execution.answerable.set()
            execution.publish(SHUTTING_DOWN_EVENT)

    def _jobs(self) -> list[asyncio.Task[None]]:
        return [e.job for e in self.live.values() if e.job is not None]

    async def _run(self, execution: Execution, message: dict[str, Any]) -> None:
        task = execution.task
        try:
            if execution.stopped_by_shutdown:  # started after the drain: stopped before it runs
                raise asyncio.CancelledError
            # "working" lives in memory (tasks/get and streams of this process read it); the
            # stored row stays "submitted" until the next stored state, one write fewer per task
            set_status(task, "working")
            execution.publish(status_event(task, final=False))
            reply = await self._call_backend(execution, message)
            if execution.stop is not None:  # stopped, and the agent answered anyway: the stop stands
                raise RunStopped
            if reply.state == "completed":
                execution.delivering = True
                await self._deliver(execution, reply)
            else:
                await self._end_undelivered(execution, reply)
        except OwnershipLost:
            self._lose(execution)
        except RunStopped:
            await self._end_stopped(execution)
        except asyncio.CancelledError:
            if execution.revoked and not execution.delivering:
                self._lose(execution)
                return
            if execution.delivering:
                raise  # shutting down mid-settlement: the claim row lets the reconciler finish it
            if execution.stopped_by_deadline:  # not the caller's doing: the turn failed
                set_status(task, "failed", agent_message(task, PAST_DEADLINE))
            else:
                why = "Stopped by a server shutdown; nothing was charged." if execution.stopped_by_shutdown else None
                if execution.parts_delivered:
                    why = "Stopped by a server shutdown." if execution.stopped_by_shutdown else None
                set_status(task, "canceled", agent_message(task, why or "Canceled by the caller."))
            await self._end_early(execution)
        except Exception:
            logger.exception("execution of task %s failed", task["id"])
            if execution.delivering:
                # delivered: the claim's recorded outcome stands, the reconciler repairs the task
                if execution.hooks is not None:
                    execution.hooks.abandoned()
            else:  # a bug of ours before delivery: the task fails, charged only the parts delivered before
                set_status(task, "failed", agent_message(task, "Internal error while running the agent."))
                await self._end_early(execution)
        finally:
            self.live.pop(task["id"], None)
            self.cancels_seen.discard(task["id"])
            execution.done.set()
            execution.answerable.set()

    async def _call_backend(self, execution: Execution, message: dict[str, Any]) -> AgentReply:
        task = execution.task
        request = AgentRequest(
            message=self.agent_view(message),
            history=[self.agent_view(m) for m in task.get("history", [])],
            task_id=task["id"],
            context_id=task["contextId"],
            # a new task (one message) has no backend memory yet; a continued one may
            backend_ref=await self.store.backend_ref(task["id"]) if len(task.get("history") or []) > 1 else {},
        )
        deadline = self.agents.deadline_seconds(execution.agent)
        try:
            # the payment window a token must leave is counted from this deadline (DESIGN 4.7)
            with tracing.span("agent.run") as span:
                async with asyncio.timeout(deadline):
                    progress = LiveProgress(execution, self._deliver_part)
                    reply = await self.agents.backend(execution.agent).run(request, progress)
                if span is not tracing.OFF:  # named only when traced: off, no attribute is even made
                    span.set_attribute("a2a.agent", agent_label(execution.agent, self.agents.get(execution.agent)))
                    span.set_attribute("a2a.outcome", reply.state)
        except RunStopped:
            raise
        except TimeoutError:
            if execution.stop is not None:  # stopped, and its agent then took its deadline to close
                raise RunStopped from None
            logger.warning("agent %s passed its deadline of %gs", execution.agent, deadline)
            return AgentReply.failed(f"The agent did not finish within {deadline:g}s (its deadline).")
        except (asyncio.CancelledError, OwnershipLost):
            raise
        except usage.BadUsage as bad:  # the agent's error: its run fails (what it delivered before is settled)
            return unusable_usage(execution, bad)
        except Exception as exc:  # whatever an agent raises fails its task, uncharged
            if execution.stop is not None:  # stopped: what it raised on the way out is not its failure
                raise RunStopped from None
            # the agent's own fault, with its traceback: it never saw a key or a payment token
            logger.error("agent %s raised %s: %s", execution.agent, type(exc).__name__, exc, exc_info=exc)
            request_log.agent_failed(f"agent raised {type(exc).__name__}")
            return AgentReply.failed("The agent failed.")
        if reply.backend_ref:
            await self.store.save(task, backend_ref=reply.backend_ref)
        return reply

    async def _deliver_part(
        self, execution: Execution, used: usage.Counts, whole: list[dict[str, Any]] | None = None
    ) -> Stop | None:
        """The chunks an agent has moved past, delivered before the whole answer (hooks with
        `deliver_part`): recorded with the task's answer so far and what the work used so far,
        in one transaction, before any of them is shown. Cancels and deadlines wait for it. The
        hook's `Stop`, if it answered one, is kept on the execution and returned; the chunks it
        refused are dropped, unrecorded and unshown. With `whole` (the run's answer, at its end), that
        is what is delivered and stored, as the whole answer."""
        task, hooks = execution.task, execution.hooks
        assert hooks is not None and hooks.mode is DeliveryMode.IN_PARTS
        answer = Answer([dict(p) for p in (execution.delivered_part.parts if whole is None else whole)])
        for parts in execution.pending if whole is None else []:
            for part in parts:
                answer.add(part)
        artifact = {"artifactId": execution.artifact_id, "name": "result", "parts": answer.parts}
        # the stored copy of a part says the answer is partial, so a crash now leaves it read as cut
        stored = artifact if whole is not None else {**artifact, "metadata": {PARTIAL: True}}
        delivered = {**task, "artifacts": with_artifact(task, stored)}
        execution.delivering = True  # a cancel now would leave the record and the answer apart
        try:
            stop = await hooks.deliver_part(delivered, used, self.store.save_statement(delivered))
        finally:
            execution.delivering = False
        if stop is not None:
            execution.stop = stop
            if not stop.delivered:
                execution.pending.clear()
                return stop
        task["artifacts"] = with_artifact(task, artifact)
        execution.parts_delivered += len(execution.pending)
        execution.pending.clear()
        execution.delivered_part = answer
        return stop

    async def _deliver(self, execution: Execution, reply: AgentReply) -> None:
        task, hooks = execution.task, execution.hooks
        artifact = {"artifactId": execution.artifact_id, "name": "result", "parts": reply.parts}
        text = reply.text or "Done."
        if hooks is None:  # the free path: the artifact is saved with the final status
            self._show(execution, artifact)
            set_status(task, "completed", agent_message(task, text))
            await self.store.save(task)
            execution.publish(status_event(task, final=True))
            return
        # Nothing of the answer is visible (the live task, its streams, tasks/get) before the
        # delivery is recorded: a delivery that could not be recorded was never made.
        try:
            used = usage.checked(reply.usage)
        except usage.BadUsage as bad:  # the agent's error: nothing of its answer is delivered
            execution.delivering = False
            await self._end_undelivered(execution, unusable_usage(execution, bad))
            return
        if hooks.mode is DeliveryMode.ONE_WRITE and await self._deliver_final(execution, artifact, text, used):
            return
        # a streamed answer delivered in parts: its end is delivered as its parts were (priced first)
        streamed = hooks.mode is DeliveryMode.IN_PARTS and bool(execution.pending or execution.parts_delivered)
        withheld = hooks.mode is DeliveryMode.WITHHELD
        stop: Stop | None = None
        try:
            if withheld:  # the answer stays out of the task, its streams and the store until paid
                await hooks.mark_delivered(task, {"artifact": artifact, "text": text}, used, None)
            elif streamed:
                stop = await self._deliver_part(execution, used, whole=reply.parts)
                execution.delivering = True
            else:
                delivered = {**task, "artifacts": with_artifact(task, artifact)}
                await hooks.mark_delivered(delivered, None, used, self.store.save_statement(delivered))
                task["artifacts"] = delivered["artifacts"]
        except BaseException:  # rolled back (lost, unreachable, cancelled): nothing was delivered
            execution.delivering = False
            raise
        if stop is not None and not stop.delivered:  # its last chunks refused: it ends with what came before
            await self._end_stopped(execution)
            return
        if not withheld:
            execution.publish(artifact_event(task, artifact))
        # shielded: a cancel arriving now must not interrupt a settlement
        collected = await asyncio.shield(hooks.delivered(task))
        if collected.paid or not withheld:
            if withheld:
                self._show(execution, artifact)
            set_status(task, "completed", agent_message(task, text, collected.metadata))
        else:
            set_status(
                task, "failed", agent_message(task, "Payment failed: the answer is withheld.", collected.metadata)
            )
        await self._save_final(execution)
        execution.publish(status_event(task, final=True))

    async def _deliver_final(
        self, execution: Execution, artifact: dict[str, Any], text: str, used: usage.Counts
    ) -> bool:
        """The delivery, its outcome and the final task in one write (`DeliveryHooks.deliver_final`);
        False, nothing shown or stored, when the hook could not (the plain delivery follows)."""
        task, hooks = execution.task, execution.hooks
        assert hooks is not None and hooks.mode is DeliveryMode.ONE_WRITE
        delivered = {**task, "artifacts": with_artifact(task, artifact)}

        def final(metadata: dict[str, Any]) -> list[Statement]:
            set_status(delivered, "completed", agent_message(delivered, text, metadata))
            return self.store.final_statements(delivered)  # a deferred task's INSERT, with it

        async with self.store.writing(task["id"]):
            try:
                collected = await hooks.deliver_final(delivered, used, final)
            except BaseException:  # rolled back (lost, unreachable, cancelled): nothing was delivered
                execution.delivering = False
                raise
            if collected is not None:
                self.store.written(task["id"])
        if collected is None:
            await self.store.write(task)  # a deferred task is stored before the plain delivery's save
            return False
        task.update(delivered)
        execution.publish(artifact_event(task, artifact))
        execution.publish(status_event(task, final=True))
        return True

    def _lose(self, execution: Execution) -> None:
        """Ownership went elsewhere: this execution delivers, saves and charges nothing; its
        subscribers learn it ended here (the stored task is the new owner's to tell)."""
        task = execution.task
        execution.revoked = True
        logger.warning("task %s stopped: its payment claim is owned by another process now", task["id"])
        if not execution.delivering or task["status"]["state"] not in ("completed", "failed"):
            task["artifacts"] = [a for a in task.get("artifacts") or [] if a.get("name") != "result"]
            set_status(
                task,
                "failed",
                agent_message(
                    task, "Stopped: this request's payment is handled by another server; nothing was charged here."
                ),
            )
        execution.publish(status_event(task, final=True))

    def _show(self, execution: Execution, artifact: dict[str, Any]) -> None:
        execution.task.setdefault("artifacts", []).append(artifact)
        execution.publish(artifact_event(execution.task, artifact))

    async def _save_final(self, execution: Execution) -> None:
        """Store the task with its settlement outcome, again until it sticks (money has moved)."""
        hooks = execution.hooks
        assert hooks is not None

        async def write() -> None:
            await hooks.saved(self.store.save_statement(execution.task))

        await commit_until_stored(self.store.db, write, "a settled task", atomic=True)

    async def _end_undelivered(self, execution: Execution, reply: AgentReply) -> None:
        task = execution.task
        if reply.state in INTERRUPTED_STATES and reply.parts and execution.hooks is None:
            # partial work of a paused task is kept for a principal; a payer's pause is not
            # a delivery (nothing is charged), so it carries no work
            artifact = {"artifactId": new_id(), "name": "partial", "parts": reply.parts}
            task.setdefault("artifacts", []).append(artifact)
            execution.publish(
                {
                    "kind": "artifact-update",
                    "taskId": task["id"],
                    "contextId": task["contextId"],
                    "artifact": artifact,
                    "lastChunk": True,
                }
            )
        message = agent_message(task, reply.text or reply.state)
        set_status(task, reply.state if reply.state in UNDELIVERED_STATES else "failed", message)
        if reply.state in INTERRUPTED_STATES:
            task.setdefault("history", []).append(message)
        await self._end_early(execution)

    async def _end_stopped(self, execution: Execution) -> None:
        """A run a delivery hook stopped (`Stop`): it ends as the stop says, with the parts delivered
        before it and settled for them; a run that delivered nothing ends failed, uncharged."""
        task, stop = execution.task, execution.stop
        assert stop is not None
        logger.info("task %s stopped after %d delivered chunk(s): %s", task["id"], execution.parts_delivered, stop.why)
        state = stop.state if execution.parts_delivered else "failed"
        set_status(task, state, agent_message(task, stop.why))
        await self._end_early(execution)

    async def _end_early(self, execution: Execution) -> None:
        """A run that ended without its whole answer (its status set): settled for the part of it
        already delivered chunk by chunk, if any; otherwise undelivered, nothing charged."""
        task, hooks = execution.task, execution.hooks
        if hooks is None or not execution.parts_delivered:
            await self._finish_undelivered(execution)
            return
        execution.delivering = True
        collected = await asyncio.shield(hooks.delivered(task))
        message = task["status"].get("message") or agent_message(task, task["status"]["state"])
        message["metadata"] = {**(message.get("metadata") or {}), **collected.metadata}
        task["status"]["message"] = message
        await self._save_final(execution)
        execution.publish(status_event(task, final=True))

    async def _finish_undelivered(self, execution: Execution) -> None:
        task = execution.task
        stored = False
        if execution.hooks is not None:
            stored = await self.store.write(task)  # a deferred task, with its rows, while the claim is held
            try:
                await asyncio.shield(execution.hooks.not_delivered(task))
            except OwnershipLost:  # the new owner released the claim and tells the task's end
                self._lose(execution)
                return
        if not stored:
            await self.store.save(task)
        execution.publish(status_event(task, final=True))
