"""Read deadlines: a client cannot hold a connection by sending slowly, or not at all.

uvicorn bounds the idle time between requests on a kept-alive connection
(`timeout_keep_alive`), and h11 the size of a request head, but not the time a request
takes to arrive. Its keep-alive timer starts only after a response and is cancelled by
the next request's first byte; a new connection has no timer at all; once the headers
are in, the body may take forever; and httptools takes a head of any size. A client
sending a byte every few seconds held a connection (and, for the body, an application
task) for as long as it liked. One protocol mixin closes the gap, the same for uvicorn's
h11 and httptools protocols, below the application:

- the head: the request line and headers must arrive within `head_timeout` of the
  request's first byte, or of the connection's opening, and within `max_head_bytes`;
  otherwise a 408 (nothing, for a connection that never sent a byte) or a 400, and close.
- the body: the whole body must arrive within `body_timeout` of the end of the headers,
  whether or not the application reads it; otherwise a 408 and close (or just close,
  when an answer went out already: a 429 is sent before its body is read).

The timers exist only while something is late: a request that arrives in the packets it
was sent in, as nearly all do, arms none. The application may therefore answer before it
reads the body (the payment gate's limiter does), and reads what it reads as it comes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.config import HttpConfig
from server.shutdown import grace_seconds
from server.writes import WritesGathered


def raw_answer(status: str, detail: str) -> bytes:
    """A complete answer that closes, written straight to the transport (no request was parsed to answer)."""
    body = json.dumps({"detail": detail}).encode()
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status.encode(),
        len(body),
    )
    return head + body


HEAD_408 = raw_answer("408 Request Timeout", "Request headers not received in time")
HEAD_400 = raw_answer("400 Bad Request", "Request headers too large")
BODY_408 = raw_answer("408 Request Timeout", "Request body not received in time")


class ReadDeadlines:
    """Protocol mixin: close a connection whose request head or body is late.

    After each chunk of bytes the protocol has parsed, one look: is a head begun but not
    complete (`cycle` unchanged since the chunk started a request), or a body still
    owed (`body_pending`)? Only then is a timer armed, remembering the request cycle it
    was armed in; when it fires, the cycle it names still waiting means the client is
    late. uvicorn's h11 and httptools protocols both keep the current cycle in `cycle`.
    """

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]
        self.head_timeout: float = getattr(config, "head_timeout", HttpConfig.head_timeout_seconds)
        self.body_timeout: float = getattr(config, "body_timeout", HttpConfig.body_timeout_seconds)
        self.max_head_bytes: int = getattr(config, "max_head_bytes", HttpConfig.max_head_bytes)
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_armed_in: Any = None
        self.head_bytes = 0  # of the head under way
        self.head_started = False  # a byte of the head under way arrived
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_armed_in: Any = None

    def body_pending(self) -> bool:
        """Whether the current request's body is still owed (each protocol knows its own)."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.arm_head_timer()  # a connection that never speaks is closed too

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        starting = before is None or before.response_complete  # these bytes begin (or go on with) a head
        super().data_received(data)  # type: ignore[misc]
        cycle = self.cycle
        if cycle is not before:  # a head was completed: its deadline is met
            self.head_started, self.head_bytes = False, 0
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
        elif starting and not self.transport.is_closing():  # the head is not complete yet
            self.head_bytes += len(data)
            if self.head_bytes > self.max_head_bytes:
                self.transport.write(HEAD_400)
                self.transport.close()
                return
            self.head_started = True
            if self.head_timer is None:  # else armed as the connection opened, or by this head's first bytes
                self.arm_head_timer()
        if cycle is not None and cycle is not self.body_armed_in and self.body_pending():
            self.arm_body_timer(cycle)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.head_timer, self.body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def arm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.head_armed_in = self.cycle
        self.head_timer = self.loop.call_later(self.head_timeout, self.head_expired, self.cycle)

    def head_expired(self, armed_in: Any) -> None:
        self.head_timer = None
        if self.cycle is not armed_in or self.transport.is_closing():
            return  # a request head arrived in time
        if self.head_started:
            self.transport.write(HEAD_408)
        self.transport.close()

    def arm_body_timer(self, cycle: Any) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
        self.body_armed_in = cycle
        self.body_timer = self.loop.call_later(self.body_timeout, self.body_expired, cycle)

    def body_expired(self, armed_in: Any) -> None:
        self.body_timer = None
        if self.cycle is not armed_in or self.transport.is_closing() or not self.body_pending():
            return  # the body arrived in time
        if not armed_in.response_started:
            self.transport.write(BODY_408)
        self.transport.close()


class H11Deadlines(ReadDeadlines, WritesGathered, H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with the read deadlines."""

    def body_pending(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional
    HttpToolsProtocol = None  # type: ignore[misc, assignment]


if HttpToolsProtocol is not None:

    class HttpToolsDeadlines(ReadDeadlines, WritesGathered, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol with the read deadlines (module-level: workers pickle it)."""

        receiving_body = False

        def on_headers_complete(self) -> None:
            self.receiving_body = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self.receiving_body = False
            super().on_message_complete()

        def body_pending(self) -> bool:
            return self.receiving_body


def protocol_class(implementation: str) -> type:
    """The protocol for `[http] implementation`: "auto" is httptools when installed, else h11."""
    if implementation == "h11" or (implementation == "auto" and HttpToolsProtocol is None):
        return H11Deadlines
    if HttpToolsProtocol is None:
        raise RuntimeError("[http] implementation = 'httptools' needs httptools installed (pip install httptools)")
    return HttpToolsDeadlines


def server_config(app: Any, http: HttpConfig, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration with the deadlines, the head size limit and the stack of `http`."""
    # ws="none": the gate serves no WebSocket, so an upgrade request is an ordinary request;
    # no `server: uvicorn` header: it tells a scanner what runs here, and is one header more to
    # validate and write on every answer
    config = uvicorn.Config(
        app,
        http=protocol_class(http.implementation),
        loop=http.loop,
        ws="none",
        server_header=False,
        timeout_keep_alive=http.keep_alive_seconds,  # type: ignore[arg-type]
        timeout_graceful_shutdown=grace_seconds(http.drain_seconds),  # the drain began at the signal
        h11_max_incomplete_event_size=http.max_head_bytes,
        **options,
    )
    config.head_timeout = http.head_timeout_seconds  # type: ignore[attr-defined]  # read by ReadDeadlines
    config.body_timeout = http.body_timeout_seconds  # type: ignore[attr-defined]
    config.max_head_bytes = http.max_head_bytes  # type: ignore[attr-defined]
    return config
