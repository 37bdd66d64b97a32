"""A webhook receiver on a loopback port, for the tests: a real HTTP server that answers as it is
told (2xx, 500, slowly, or not before the sender gives up), keeps every attempt, and notes every
time two deliveries of one event were in flight at once."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DOCS = Path(__file__).parents[2] / "docs" / "operations.md"


def documented_check() -> Callable[..., bool]:
    """The receiving side's check, exactly the lines docs/operations.md prints."""
    block = re.search(r"<!-- file: webhook_check.py -->\n```python\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert block, "docs/operations.md has no webhook_check.py block"
    scope: dict[str, Any] = {}
    exec(block.group(1), scope)
    return scope["verified"]


@dataclass
class Attempt:
    event_id: str
    headers: dict[str, str]
    body: bytes
    answer: str  # "200", "500", "hung"
    started: float
    ended: float = 0.0


class Receiver:
    """`mode`: "ok" (200), "fail" (500), "hang" (answers nothing for `hang_seconds`), "slow" (200 after
    `slow_seconds`); `fail_first`: each event's first attempt answers 500 whatever the mode."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"
        self.fail_first = False
        self.hang_seconds = 3.0
        self.slow_seconds = 0.3
        self.attempts: list[Attempt] = []
        self.in_flight: Counter[str] = Counter()
        self.overlaps: list[str] = []  # event ids seen twice in flight at once
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.handle(self, body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        event_id = request.headers.get("A2A-Gate-Event-Id", "")
        attempt = Attempt(event_id, dict(request.headers.items()), body, "", time.monotonic())
        with self.lock:
            first = not any(a.event_id == event_id for a in self.attempts)
            self.attempts.append(attempt)
            self.in_flight[event_id] += 1
            if self.in_flight[event_id] > 1:
                self.overlaps.append(event_id)
            mode = "fail" if self.fail_first and first else self.mode
        try:
            if mode == "hang":
                time.sleep(self.hang_seconds)
                attempt.answer = "hung"
                return
            if mode == "slow":
                time.sleep(self.slow_seconds)
            attempt.answer = "500" if mode == "fail" else "200"
            request.send_response(int(attempt.answer))
            request.send_header("Content-Length", "0")
            request.end_headers()
        finally:
            attempt.ended = time.monotonic()
            with self.lock:
                self.in_flight[event_id] -= 1

    def answered(self, answer: str) -> list[Attempt]:
        with self.lock:
            return [a for a in self.attempts if a.answer == answer]

    def delivered(self) -> dict[str, Attempt]:
        """Each event that got a 200, once (the receiving side deduplicates on the event id)."""
        return {a.event_id: a for a in self.answered("200")}
