"""a2a-sdk `AgentExecutor`s for the `a2a-sdk` backend's tests (``tests.support.sdk_agents:NAME``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from a2a.helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater


class StreamingExecutor(AgentExecutor):
    """Enqueues its Task, a working status, then its answer in two artifact chunks."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.start_work(updater.new_agent_message([new_text_part("reading...")]))
        await updater.add_artifact([new_text_part("sdk heard: ")], artifact_id="answer", name="answer")
        await updater.add_artifact(
            [new_text_part(context.get_user_input())], artifact_id="answer", append=True, last_chunk=True
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class WaitingExecutor(AgentExecutor):
    """Works until cancelled; its `cancel` writes the file its message names, then says canceled."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.start_work(updater.new_agent_message([new_text_part("waiting")]))
        await asyncio.sleep(60)
        await updater.add_artifact([new_text_part("too late")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        Path(context.get_user_input()).write_text(f"cancel asked for {context.task_id}")
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


class AskingExecutor(AgentExecutor):
    """Asks for a city on the first turn; answers on the turn that continues the task."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        task = context.current_task
        if task is None:
            await updater.requires_input(updater.new_agent_message([new_text_part("Which city?")]))
            return
        asked = [m for m in task.history if m.role == 2]  # ROLE_AGENT: our question is in the history
        await updater.add_artifact([new_text_part(f"weather in {context.get_user_input()}: sunny ({len(asked)})")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


def make_streaming() -> AgentExecutor:
    """A factory, for `executor = "module:factory"`."""
    return StreamingExecutor()


class MessageExecutor(AgentExecutor):
    """Answers at once with one Message, as the SDK allows for an immediate response."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message(f"at once: {context.get_user_input()}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class BrokenExecutor(AgentExecutor):
    """Raises in the middle of its work."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.add_artifact([new_text_part("half")])
        raise ValueError("executor bug")

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class StubbornExecutor(AskingExecutor):
    """Asks, like `AskingExecutor`, but will not be canceled."""

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise RuntimeError("this task cannot be canceled")


class StatusAnswerExecutor(AgentExecutor):
    """Completes with its answer in the final status message, no artifact."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.complete(updater.new_agent_message([new_text_part(f"done: {context.get_user_input()}")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class MeteredExecutor(AgentExecutor):
    """Answers in two artifact chunks, each reporting what it used in its metadata (`usage`)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.start_work()
        for text, tokens in (("metered ", 2), (context.get_user_input(), 5)):
            usage = {"usage": {"output_tokens": tokens}}
            await updater.add_artifact([new_text_part(text)], artifact_id="a", append=tokens == 5, metadata=usage)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError
