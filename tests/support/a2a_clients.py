"""Helpers around the official a2a-sdk 1.x client, returning plain dicts.

Tests use these to prove that a stock SDK client (v1.0 JSON-RPC dialect) can
talk to our gate; results are `MessageToDict` output, i.e. exactly the v1.0
JSON wire shapes (camelCase keys, `TASK_STATE_*` / `ROLE_*` enum names).
Each call resolves the card afresh and uses a fresh httpx client.

What the SDK client needs and does (a2a-sdk 1.3.0; pinned by
tests/server/test_support_sdk.py against a recording server):

- Card: GET `<url>/.well-known/agent-card.json`, sent with
  `A2A-Version: 1.0` and our extra headers.  The least it accepts is
  {"name": ..., "supportedInterfaces": [{"url": <rpc url>,
  "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
  "capabilities": {"streaming": true}}; unknown fields are ignored.  Every
  RPC is POSTed to the chosen interface's `url`, not to the base URL.
  Among JSONRPC entries it takes `protocolVersion` "1.0" (patch ignored),
  else the first > 1.0, else the first >= 0.3, else one without a version.
  A chosen version in [0.3, 1.0) selects the v0.3 transport (`message/send`,
  `kind` fields, `configuration.blocking`, header `A2A-Version: 0.3`); "1.0"
  or no version selects the v1.0 transport.  A legacy card without
  `supportedInterfaces` is read as one interface from top-level `url`,
  `preferredTransport` (default JSONRPC) and `protocolVersion` (default
  "0.3.0").  Without `capabilities.streaming: true` streaming silently falls
  back to `SendMessage`.  Card failures raise `AgentCardResolutionError`.
- Headers on every v1.0 RPC: `A2A-Version: 1.0` (ClientFactory sets it as a
  default on the httpx client), `Content-Type: application/json`, plus ours;
  streams add `Accept: text/event-stream` and `Cache-Control: no-store`.
- Request bodies (`id` is a fresh uuid4 string; params are `MessageToDict`
  of the request proto, so unset fields are omitted):
    SendMessage / SendStreamingMessage:
      {"jsonrpc": "2.0", "id": "<uuid>", "method": "SendMessage",
       "params": {"message": {"messageId": "<uuid>", "role": "ROLE_USER",
                              "parts": [{"text": "hi"}]
                              [, "taskId": ..., "contextId": ...]},
                  "configuration": {} | {"returnImmediately": true}}}
      v1.0 has no `blocking`: blocking is the default and the SDK always
      sends `configuration`, empty unless something in it is set.
    GetTask:    {"jsonrpc": "2.0", "id": "<uuid>", "method": "GetTask",
                 "params": {"id": "<task id>"[, "historyLength": n]}}
    CancelTask: {"jsonrpc": "2.0", "id": "<uuid>", "method": "CancelTask",
                 "params": {"id": "<task id>"}}
- Replies: the client only looks at `result` / `error` (not at `id` or
  `jsonrpc`) and parses leniently (unknown fields ignored).
    SendMessage -> result = {"task": Task} or {"message": Message}
    GetTask / CancelTask -> result = Task (bare, not wrapped)
    SendStreamingMessage -> `Content-Type: text/event-stream`; each SSE
      event's `data:` is one whole JSON-RPC response {"jsonrpc": "2.0",
      "id": <same>, "result": StreamResponse}, where StreamResponse is
      exactly one of {"task": Task}, {"message": Message},
      {"statusUpdate": {"taskId", "contextId", "status"}} or
      {"artifactUpdate": {"taskId", "contextId", "artifact"
      [, "append", "lastChunk"]}}.  v1.0 has no `final`: the client reads
      until the server closes the stream (or stops after a `message`).
      Bare `data:` lines with LF or CRLF framing both work.  An SSE event
      named `error`, or a `data:` holding {"error": {...}}, raises; a non-SSE
      reply is parsed as a single JSON-RPC response (up-front errors).
- Errors: a JSON-RPC `error` raises the class mapped from its code in
  `a2a.utils.errors.JSON_RPC_ERROR_CODE_MAP` (`TaskNotFoundError` for
  -32001, `TaskNotCancelableError` -32002, ...); those subclass `A2AError`,
  not `A2AClientError`.  Unknown codes raise `A2AClientError("JSON-RPC Error
  <code>: <message>")`.  HTTP >= 400 and non-JSON bodies raise
  `A2AClientError`; timeouts `A2AClientTimeoutError`.  A JSON-RPC result
  of the wrong shape is NOT an A2A error: SendMessage raises `ValueError`
  ("Response has neither task nor message") and GetTask returns an empty
  Task.  `jsonrpc_error_code` recovers the code from an SDK exception.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
from a2a.client import A2AClientError, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError
from google.protobuf.json_format import MessageToDict

DEFAULT_TIMEOUT_S = 10.0


@asynccontextmanager
async def sdk_client(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    streaming: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> AsyncIterator[Client]:
    """An SDK `Client` for the agent at `url`, resolved from its card.

    Custom headers travel as defaults of our own httpx client, which the SDK
    then uses both for the card fetch and for every RPC.
    """
    async with httpx.AsyncClient(headers=dict(headers or {}), timeout=timeout) as http:
        factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
        client = await factory.create_from_url(url)
        try:
            yield client
        finally:
            await client.close()


def text_message(text: str, *, task_id: str | None = None, context_id: str | None = None) -> Message:
    """A user message with one text part, as the SDK expects to send it."""
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id or "",
        context_id=context_id or "",
    )


def _send_request(text: str, *, blocking: bool, task_id: str | None, context_id: str | None) -> SendMessageRequest:
    request = SendMessageRequest(message=text_message(text, task_id=task_id, context_id=context_id))
    if not blocking:
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    return request


async def send_text(
    url: str,
    text: str,
    *,
    headers: Mapping[str, str] | None = None,
    blocking: bool = True,
    task_id: str | None = None,
    context_id: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Send `text` with `SendMessage`; returns {"task": {...}} or {"message": {...}}.

    `blocking=False` sets `configuration.returnImmediately`.
    """
    request = _send_request(text, blocking=blocking, task_id=task_id, context_id=context_id)
    async with sdk_client(url, headers=headers, streaming=False, timeout=timeout) as client:
        results = [MessageToDict(event) async for event in client.send_message(request)]
    if len(results) != 1:
        raise AssertionError(f"expected one SendMessage result, got {results!r}")
    return results[0]


async def get_task(
    url: str,
    task_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    history_length: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """`GetTask`; returns the Task dict."""
    request = GetTaskRequest(id=task_id)
    if history_length is not None:
        request.history_length = history_length
    async with sdk_client(url, headers=headers, timeout=timeout) as client:
        return MessageToDict(await client.get_task(request))


async def cancel_task(
    url: str,
    task_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """`CancelTask`; returns the Task dict."""
    async with sdk_client(url, headers=headers, timeout=timeout) as client:
        return MessageToDict(await client.cancel_task(CancelTaskRequest(id=task_id)))


async def stream_text(
    url: str,
    text: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """`SendStreamingMessage`; returns every StreamResponse as a dict.

    Falls back to one `SendMessage` result if the card says no streaming.
    """
    request = _send_request(text, blocking=True, task_id=None, context_id=None)
    async with sdk_client(url, headers=headers, streaming=True, timeout=timeout) as client:
        return [MessageToDict(event) async for event in client.send_message(request)]


_CODE_IN_MESSAGE = re.compile(r"JSON-RPC Error (-?\d+):")


def jsonrpc_error_code(error: BaseException) -> int | None:
    """The JSON-RPC error code behind an exception raised by the SDK client.

    None when the failure was not a JSON-RPC error response (HTTP error,
    garbage body, timeout, ...).
    """
    for cls in type(error).__mro__:
        if cls in JSON_RPC_ERROR_CODE_MAP:
            return JSON_RPC_ERROR_CODE_MAP[cls]  # type: ignore[index]
    if isinstance(error, A2AClientError):
        match = _CODE_IN_MESSAGE.search(str(error))
        if match:
            return int(match.group(1))
    return None


async def expect_a2a_error(awaitable: Awaitable[Any]) -> A2AError:
    """Await `awaitable`, which must raise an SDK error; return that error."""
    try:
        result = await awaitable
    except A2AError as error:
        return error
    raise AssertionError(f"expected an A2A error, got result {result!r}")
