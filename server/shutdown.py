"""How a process stops: the drain begins at the signal, while every connection is still open.

uvicorn, on SIGTERM, stops accepting, waits for open requests up to its
`timeout_graceful_shutdown`, cancels those still running (the client gets a plain-text
500, or nothing), and only then runs the application's lifespan shutdown. A drain that
began there came too late: a paid request waiting on its work was cut off first, and its
claim released a whole drain later. So the application starts draining when the signal
arrives (`draining_on_signals`, chained before uvicorn's own handler): running work has
`drain_seconds` to finish, the undelivered rest is stopped (its task `canceled`, its claim
released), each waiting request answers, and uvicorn's wait ends with every answer
written (`grace_seconds` bounds it well past the drain). SIGHUP stops nothing: it reloads
the configuration (`server.reload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from server.execution import SETTLE_SECONDS, STOP_SECONDS


def grace_seconds(drain_seconds: float) -> int:
    """uvicorn's `timeout_graceful_shutdown`: the drain (`Runner.drain`) and both of its bounds,
    and a margin for the answers to be written. Only a stuck request ever meets it."""
    return math.ceil(drain_seconds + STOP_SECONDS + SETTLE_SECONDS) + 5


@contextlib.contextmanager
def draining_on_signals(begin: Callable[[], None]) -> Iterator[None]:
    """Call `begin` on the event loop when SIGTERM or SIGINT arrives, then let the handler in
    place (uvicorn's) stop the server.

    Entered inside the server (the lifespan's start-up), where its handlers are installed;
    the previous handlers are back on exit. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(begin)
        chained: Any = previous[sig]
        if callable(chained):
            chained(sig, frame)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
