"""Read deadlines: a client cannot hold a connection by sending slowly, or not at all.

uvicorn bounds the idle time between requests on a kept-alive connection
(`timeout_keep_alive`) and the size of a request head (h11's incomplete-event limit),
but not the time a request takes to arrive. Its keep-alive timer starts only after a
response and is cancelled by the next request's first byte; a new connection has no
timer at all; and once the headers are in, the body may take forever. A client sending
a byte every few seconds held a connection (and, for the body, an application task)
for as long as it liked. Two small guards close the gap:

- `HeadDeadline`, on the protocol (the only layer that sees a request before its
  headers are complete): the request line and headers must arrive within
  `head_timeout` of the request's first byte, or of the connection's opening.
  Otherwise a 408 (or, for a connection that never sent a byte, nothing) and close.
- `BodyDeadline`, an ASGI guard: the whole body is read within `body_timeout` of the
  end of the headers, before the application runs; otherwise 408 and close. The
  application then only ever sees complete requests.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from server.config import HttpConfig
from server.shutdown import grace_seconds


def raw_408(detail: str) -> bytes:
    """A complete 408 answer, written straight to the transport (no request was parsed to answer)."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


HEAD_408 = raw_408("Request headers not received in time")


class HeadDeadline:
    """Protocol mixin: close a connection whose request head is not complete in time.

    A timer is armed when a connection opens and when the first byte of a later request
    arrives. It remembers the request cycle it was armed in; if, when it fires, no new
    cycle has started (no request head was parsed since), the head is late. Works for
    uvicorn's h11 and httptools protocols alike: both keep the current cycle in `cycle`.
    """

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self.head_timeout: float = getattr(config, "head_timeout", HttpConfig.head_timeout_seconds)
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_armed_in: Any = None
        self.head_started = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:  # these bytes start a request head
            if self.head_armed_in is not self.cycle:
                self.arm_head_timer()
            self.head_started = True
        super().data_received(data)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def arm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.head_armed_in, self.head_started = self.cycle, False
        self.head_timer = self.loop.call_later(self.head_timeout, self.head_expired, self.cycle)

    def head_expired(self, armed_in: Any) -> None:
        self.head_timer = None
        if self.cycle is not armed_in or self.transport.is_closing():
            return  # a request head arrived in time
        if self.head_started:
            self.transport.write(HEAD_408)
        self.transport.close()


class HeadDeadlineProtocol(HeadDeadline, AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol (httptools if installed, else h11) with the head deadline."""


class BodyDeadline:
    """ASGI guard: read the whole body within `seconds`, then run the application.

    Reading stops early once more than `max_bytes` arrived, and a body declared larger
    is not read at all: the application refuses an oversized body itself (JSON-RPC
    -32600), and nothing past the limit is buffered here.
    """

    def __init__(self, app: ASGIApp, seconds: float, max_bytes: int) -> None:
        self.app = app
        self.seconds = seconds
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.declared_too_large(scope):
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.seconds):
                received = await self.read(receive)
        except TimeoutError:
            late = JSONResponse(
                {"detail": "Request body not received in time"}, status_code=408, headers={"connection": "close"}
            )
            await late(scope, receive, send)
            return

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)

    def declared_too_large(self, scope: Scope) -> bool:
        declared = Headers(scope=scope).get("content-length", "")
        return declared.isdigit() and int(declared) > self.max_bytes

    async def read(self, receive: Receive) -> list[Message]:
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body") or size > self.max_bytes:
                return messages


def server_config(app: Any, http: HttpConfig, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration with the deadlines and the head size limit of `http`."""
    # ws="none": the gate serves no WebSocket, so an upgrade request is an ordinary request
    config = uvicorn.Config(
        app,
        http=HeadDeadlineProtocol,
        ws="none",
        timeout_keep_alive=http.keep_alive_seconds,  # type: ignore[arg-type]
        timeout_graceful_shutdown=grace_seconds(http.drain_seconds),  # the drain began at the signal
        h11_max_incomplete_event_size=http.max_head_bytes,
        **options,
    )
    config.head_timeout = http.head_timeout_seconds  # type: ignore[attr-defined]  # read by HeadDeadline
    return config
