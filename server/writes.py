"""One send per answer: the writes a connection makes in one turn of the event loop leave together.

uvicorn writes an answer's head as the application sends `http.response.start` and its body
as it sends `http.response.body`: two writes, and, since the transport sends at once what it
can, two `send(2)` calls and two TCP segments for every answer, however small. The two
messages arrive in the same turn of the loop (Starlette's `Response` sends them back to
back), so the protocol's transport is wrapped in one that gathers the writes of a turn and
hands them to the real transport once, at the end of the turn (`loop.call_soon`). Nothing
waits longer than that: a streamed answer's chunks still leave as they are sent; closing sends
what is gathered first; and a turn that gathers more than `GATHER_BYTES` hands it over at once,
so the real transport's flow control (`pause_writing`) sees a large answer as it always did.
"""

from __future__ import annotations

import asyncio
from typing import Any

GATHER_BYTES = 64 * 1024  # what a turn may gather before it is handed over at once


class GatheredWrites:
    """A transport whose writes of one loop turn reach the wrapped transport as one write."""

    __slots__ = ("loop", "pending", "size", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.pending: list[bytes] | None = None  # the writes of this turn, not yet handed over
        self.size = 0  # their bytes

    def write(self, data: bytes) -> None:
        if self.pending is None:
            self.pending = [data]
            self.size = len(data)
            self.loop.call_soon(self.flush)
        else:
            self.pending.append(data)
            self.size += len(data)
        if self.size > GATHER_BYTES:
            self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, None
        self.size = 0
        if pending and not self.transport.is_closing():
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self.pending, self.size = None, 0
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self.size

    def __getattr__(self, name: str) -> Any:  # the rest (extra info, reading, flow control) as it is
        return getattr(self.transport, name)


class WritesGathered:
    """Protocol mixin: the connection's answers go out through `GatheredWrites`."""

    transport: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.transport = GatheredWrites(transport, self.loop)
