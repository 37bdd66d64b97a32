"""Serve an ASGI app on a real uvicorn server in a background thread.

Tests talk to the app over real sockets, so connection handling, concurrency
and response framing are the real thing rather than an in-process transport.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

__all__ = ["serve_app"]


@contextmanager
def serve_app(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0, wait_on_exit: bool = True
) -> Iterator[str]:
    """Serve ``app`` on a free port of ``host`` (or on ``port``); yield its base URL (no trailing slash).

    The listening socket is bound here and handed to uvicorn, so no other
    process can grab the port between choosing it and serving on it.
    With ``wait_on_exit=False`` (a fixture's teardown) the server is told to stop and
    winds down in the background: uvicorn's own timers are about 0.2 s, more when a
    handler is stuck in a slow fault, and nothing after a teardown needs it gone.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="auto",
        # Handlers stuck in a slow fault must not hold up teardown.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start in time")
            time.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        if wait_on_exit:
            _close_when_stopped(thread, sock)
        else:
            threading.Thread(target=_close_when_stopped, args=(thread, sock), daemon=True).start()


def _close_when_stopped(thread: threading.Thread, sock: socket.socket) -> None:
    thread.join(10)
    sock.close()
