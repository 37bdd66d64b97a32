"""Real A2A upstream agents (a2a-sdk 1.x) for the gate's `upstream` backend tests.

`build_upstream_app(behaviour)` returns a Starlette app serving JSON-RPC at `/`
(v1.0 methods, plus v0.3 methods via `enable_v0_3_compat=True` on the same
endpoint) and the agent card at `/.well-known/agent-card.json`.  Every
behaviour serves a card, so a client can resolve the agent and only then meet
the broken endpoint.

Wire facts that hold for all SDK behaviours (observed, pinned by
tests/server/test_support_sdk.py):
- v1.0 methods (`SendMessage`, `GetTask`, ...) are only accepted with the HTTP
  header `A2A-Version: 1.0`; without it the call counts as v0.3 and gets error
  -32009 "A2A version '0.3' is not supported by this handler".  v0.3 methods
  (`message/send`, `tasks/get`, ...) want no header or `A2A-Version: 0.3`;
  with `A2A-Version: 1.0` they get error -32603 (sic) "A2A version '1.0' is
  not supported by this handler. Expected version '0.3'."
- v1.0 enums are proto names (`TASK_STATE_COMPLETED`, `ROLE_AGENT`) and parts
  are bare ({"text": ...}); v0.3 uses lower-case strings (`completed`,
  `input-required`, `agent`) and every object carries `kind`.
- v1.0 errors carry `data` = [{"@type": "type.googleapis.com/google.rpc.
  ErrorInfo", "reason": "TASK_NOT_FOUND", "domain": "a2a-protocol.org",
  "metadata": {}}]; v0.3 errors carry `"data": null`.
- Ids are random uuid4 strings; the message id is the client's; timestamps
  are RFC 3339 with `Z`.  GetTask/`tasks/get` return the same task object as
  the send (v1.0 unwrapped, not {"task": ...}).
- Streams (`SendStreamingMessage` / `message/stream`) answer
  `text/event-stream`, CRLF-framed `data: <JSON-RPC response>` events:
  v1.0 results {"task"} (state SUBMITTED; WORKING for "slow"), then
  {"artifactUpdate"} and/or {"statusUpdate"} -- no `final`, the stream just
  ends; v0.3 results are the bare objects with `kind` "task" /
  "artifact-update" / "status-update" and `final` on status updates.

What each behaviour returns (`<T>` task id, `<C>` context id, `<A>` artifact id):

"echo" -- completes at once.
  v0.3 `message/send` {"message": {"role": "user", "kind": "message",
  "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}} ->
    {"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": <T>,
     "contextId": <C>,
     "status": {"state": "completed", "timestamp": "2025-..Z"},
     "artifacts": [{"artifactId": <A>, "name": "echo",
                    "parts": [{"kind": "text", "text": "upstream echo: hi"}]}],
     "history": [{"kind": "message", "role": "user", "messageId": "m1",
                  "taskId": <T>, "contextId": <C>,
                  "parts": [{"kind": "text", "text": "hi"}]}]}}
  v1.0 `SendMessage` {"message": {"role": "ROLE_USER", "messageId": "m1",
  "parts": [{"text": "hi"}]}} ->
    {"jsonrpc": "2.0", "id": 1, "result": {"task": {"id": <T>,
     "contextId": <C>,
     "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2025-..Z"},
     "artifacts": [{"artifactId": <A>, "name": "echo",
                    "parts": [{"text": "upstream echo: hi"}]}],
     "history": [{"messageId": "m1", "contextId": <C>, "taskId": <T>,
                  "role": "ROLE_USER", "parts": [{"text": "hi"}]}]}}}

"slow" -- always answers at once (even for blocking requests) with the task
  in `working` (v0.3 "working", v1.0 "TASK_STATE_WORKING"), no status
  timestamp, no artifacts, history = [the user message]; ~1.5 s later the task
  is `completed` with artifact "upstream echo: <text>" (name "echo"), so a
  client must poll `tasks/get` / `GetTask`.  Cancelling it meanwhile gives
  `canceled` (v1.0 "TASK_STATE_CANCELED") and no artifact ever appears.

"input-required" -- first message: task in `input-required`
  (v1.0 "TASK_STATE_INPUT_REQUIRED") whose `status.message` is an agent
  message (v0.3 role "agent", v1.0 "ROLE_AGENT") with one text part
  "need more"; no artifacts.  A follow-up message carrying the same taskId
  (and optionally the contextId) completes it with an artifact (name
  "answer") "upstream got: <text>"; history then holds both user messages
  and the "need more" agent message.  A follow-up naming another contextId
  gets error -32602; one to a finished task gets -32004 ("... is in
  terminal state"); one to an unknown taskId gets -32001.

"fail" -- task in `failed` (v1.0 "TASK_STATE_FAILED") whose `status.message`
  is an agent message with one text part "upstream broke"; no artifacts.
  (A JSON-RPC *result*, not an error.)

"hang" -- POST / never answers (up to an hour; the handler quits quietly when
  the caller disconnects or the server stops).  Not the SDK.
"garbage" -- POST / answers 200 `text/plain` body `this is not json`.
"garbage-json" -- POST / answers 200
  `{"jsonrpc":"2.0","id":1,"result":{"weird":true}}` whatever was asked.
"http500" -- POST / answers HTTP 500 (`text/plain` "upstream exploded").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

SDK_BEHAVIOURS = ("echo", "slow", "input-required", "fail")
RAW_BEHAVIOURS = ("hang", "garbage", "garbage-json", "http500")
BEHAVIOURS = SDK_BEHAVIOURS + RAW_BEHAVIOURS

SLOW_DELAY_S = 1.5
GARBAGE_JSON = b'{"jsonrpc":"2.0","id":1,"result":{"weird":true}}'


async def _open_task(context: RequestContext, queue: EventQueue) -> Task:
    """Return the task for this request, enqueueing a new one if needed.

    The SDK rejects status updates before a Task event exists, so a fresh
    request must publish the Task first; a follow-up reuses the stored one.
    """
    if context.current_task is not None:
        return context.current_task
    assert context.message is not None
    task = new_task_from_user_message(context.message)
    await queue.enqueue_event(task)
    return task


class EchoExecutor(AgentExecutor):
    """Completes with the artifact 'upstream echo: <text>'."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = await _open_task(context, event_queue)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        await updater.add_artifact([new_text_part(f"upstream echo: {text}")], name="echo")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class SlowExecutor(EchoExecutor):
    """Publishes a `working` task, then completes SLOW_DELAY_S later."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        # The first Task event is what a return-immediately send answers with,
        # so it must already say `working`.
        task = new_task_from_user_message(context.message)
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_WORKING))
        await event_queue.enqueue_event(task)
        await asyncio.sleep(SLOW_DELAY_S)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        await updater.add_artifact([new_text_part(f"upstream echo: {text}")], name="echo")
        await updater.complete()


class InputRequiredExecutor(EchoExecutor):
    """Asks for more input once, then completes with 'upstream got: <text>'."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        follow_up = context.current_task is not None
        task = await _open_task(context, event_queue)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if not follow_up:
            ask = updater.new_agent_message([new_text_part("need more")])
            await updater.requires_input(message=ask)
            return
        text = context.get_user_input()
        await updater.add_artifact([new_text_part(f"upstream got: {text}")], name="answer")
        await updater.complete()


class FailExecutor(EchoExecutor):
    """Ends the task `failed` with the status message 'upstream broke'."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = await _open_task(context, event_queue)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.failed(message=updater.new_agent_message([new_text_part("upstream broke")]))


class ReturnImmediatelyHandler(DefaultRequestHandler):
    """Answers every send with the first Task event, whatever the client asked.

    Used by "slow" so blocking clients (v0.3 `blocking: true`, v1.0 without
    `returnImmediately`) also get a `working` task and have to poll.
    """

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        params.configuration.return_immediately = True
        return await super().on_message_send(params, context)


_EXECUTORS: dict[str, type[AgentExecutor]] = {
    "echo": EchoExecutor,
    "slow": SlowExecutor,
    "input-required": InputRequiredExecutor,
    "fail": FailExecutor,
}


def agent_card(url: str, behaviour: str) -> AgentCard:
    """The card for `behaviour`, advertising JSON-RPC 1.0 and 0.3 at `url`."""
    return AgentCard(
        name=f"upstream-{behaviour}",
        description=f"Test upstream agent ({behaviour})",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id=behaviour,
                name=behaviour,
                description=f'Behaves as "{behaviour}"',
                tags=["test"],
            )
        ],
    )


def _card_route(behaviour: str) -> Route:
    """Card route whose interface URL is the server's own base URL.

    The port is only known once uvicorn binds, so the URL comes from the
    request rather than being baked in at build time.
    """

    async def card(request: Request) -> JSONResponse:
        url = str(request.base_url)
        return JSONResponse(agent_card_to_dict(agent_card(url, behaviour)))

    return Route(AGENT_CARD_WELL_KNOWN_PATH, card, methods=["GET"])


async def _hang(request: Request) -> Response:
    """Never answer; stop quietly once the caller gives up or the server stops.

    Watching for the disconnect keeps abandoned requests from piling up, and
    swallowing the shutdown cancellation keeps uvicorn from logging a
    traceback for what is the intended behaviour.
    """
    deadline = asyncio.get_running_loop().time() + 3600
    try:
        while asyncio.get_running_loop().time() < deadline:
            if await request.is_disconnected():
                break
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        pass
    return PlainTextResponse("too late", status_code=504)


async def _garbage(request: Request) -> Response:
    return PlainTextResponse("this is not json")


async def _garbage_json(request: Request) -> Response:
    return Response(GARBAGE_JSON, media_type="application/json")


async def _http500(request: Request) -> Response:
    return PlainTextResponse("upstream exploded", status_code=500)


_RAW_ENDPOINTS = {
    "hang": _hang,
    "garbage": _garbage,
    "garbage-json": _garbage_json,
    "http500": _http500,
}


def build_upstream_app(behaviour: str) -> Starlette:
    """A Starlette app acting as an upstream A2A agent with `behaviour`."""
    if behaviour in _RAW_ENDPOINTS:
        routes = [_card_route(behaviour), Route("/", _RAW_ENDPOINTS[behaviour], methods=["POST"])]
        return Starlette(routes=routes)
    if behaviour not in _EXECUTORS:
        raise ValueError(f"unknown upstream behaviour {behaviour!r}; expected one of {BEHAVIOURS}")

    handler_class = ReturnImmediatelyHandler if behaviour == "slow" else DefaultRequestHandler
    handler = handler_class(
        agent_executor=_EXECUTORS[behaviour](),
        task_store=InMemoryTaskStore(),
        # The card URL is a placeholder: the handler only reads capabilities.
        agent_card=agent_card("http://127.0.0.1/", behaviour),
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await handler.aclose()

    routes = [_card_route(behaviour), *create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True)]
    return Starlette(routes=routes, lifespan=lifespan)
