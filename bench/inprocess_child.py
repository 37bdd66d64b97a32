"""One tree's gate, in this process: its ASGI app called directly, one request after another.

Run by `bench/inprocess.py` as `python -c <this file's text> ARGS...` with the tree as the
working directory, so `import gate` and `import server` are the tree's (a script's own folder would
come first on the path instead, and bench/ holds a `profile` module that would shadow the standard
library's). Prints one JSON line per path: CPU µs per request and, profiled, Python calls per request.

Arguments: the gate's configuration file; a JSON file of {"key": API key, "vouchers": [PAYMENT-SIGNATURE
values, in order]} and the first voucher this run pays with (a channel's vouchers are spent in order,
across runs); the warm-up and measured request counts; "profile", "time", "capture", "read" (the
vouchers only read and their signers recovered, `read_voucher`, the app not called) or "parse" (only
read); the paths
("key,voucher"); profiled, a folder to write each path's cProfile statistics to (`<path>.pstats`), or ""
for none; capturing, a folder to write each path's SQL to (`<path>.sql.pickle`: every statement any of
the gate's SQLite connections executed, with its arguments, its connection's number, its outcome (the
rows it changed, or None for an error) and the time it ran, and how many had run when the warm-up ended and when the
measured requests each did), which `bench/sql_replay.py` runs again without the gate.
"""

import asyncio
import cProfile
import functools
import itertools
import json
import os
import pickle
import pstats
import sqlite3
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

config, lane_file, offset, warmup, measured = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
mode, paths = sys.argv[6], sys.argv[7].split(",")
stats_folder = sys.argv[8] if len(sys.argv) > 8 else ""
# captured: (connection, SQL, arguments, outcome, when)
statements: list[tuple[int, str, object, int | None, float]] = []

if mode == "capture":  # before the gate opens a connection: each one it opens records what it executes
    numbers = itertools.count(1)

    class Recording(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.number = next(numbers)

        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            kept = (
                {k: plain(v) for k, v in parameters.items()}
                if isinstance(parameters, dict)
                else tuple(map(plain, parameters))
            )
            at = time.time()  # the clock its `julianday('now')` reads, which the replay reads again
            try:
                cursor = super().execute(sql, parameters)
            except sqlite3.Error:
                statements.append((self.number, sql, kept, None, at))
                raise
            statements.append((self.number, sql, kept, cursor.rowcount, at))
            return cursor

    def plain(value: Any) -> Any:
        """The value SQLite is given, as a built-in type (an enum of the gate's, a plain `str`): the
        replay loads the capture without the gate."""
        if isinstance(value, str):
            return value[:]  # (a slice of a `str` subclass is a `str`)
        if isinstance(value, int):
            return int(value)  # (a bool is 0 or 1 to SQLite)
        if isinstance(value, float):
            return float(value)
        return value

    sqlite3.connect = functools.partial(sqlite3.connect, factory=Recording)
sys.path.insert(0, os.getcwd())
lane = json.loads(Path(lane_file).read_text())
os.chdir(Path(config).parent)  # the configuration's database is named relative to it

from gate.app import build_app, load_settings  # noqa: E402
from server import request_log  # noqa: E402

request_log.configure(json_lines=False, level="warning")
app = build_app(load_settings(config))
SERVER = ("127.0.0.1", 8000)


def body(i: int) -> bytes:
    """`bench.cases.send_body`'s bytes, written here: a reference commit's tree may have no such bench."""
    parts = [{"kind": "text", "text": "hello"}]
    message = {"kind": "message", "role": "user", "messageId": f"bench-{i}", "parts": parts}
    return json.dumps(
        {"jsonrpc": "2.0", "id": i, "method": "message/send", "params": {"message": message}}, separators=(",", ":")
    ).encode()


async def call(path: str, header: tuple[str, str], i: int) -> tuple[int, bytes]:
    """One request, as uvicorn hands it to the app: its scope, its body, the answer's messages."""
    content = body(i)
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        (header[0].encode(), header[1].encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000 + i % 20000),
        "server": SERVER,
    }
    messages: list[MutableMapping[str, Any]] = []
    received = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": content, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)

    await app(scope, receive, send)
    return messages[0]["status"], b"".join(m.get("body", b"") for m in messages[1:])


def read_voucher(header: tuple[str, str]) -> None:
    """What no voucher can skip, without the rest of the gate: its header read into a token, and
    (unless only "parse"d) its signer recovered and checked against the channel's payer authorizer
    (this tree's own functions)."""
    from gate import tokens
    from gate.schemes import batch_settlement

    token = tokens.from_header(header[1], "PAYMENT-SIGNATURE")
    if token is None:
        raise SystemExit("a voucher of the lane was not read as a token")
    if mode == "parse":
        return
    inner = token.payload["payload"]
    if not batch_settlement.voucher_signer_matches(inner["channelConfig"], inner["voucher"], token.network):
        raise SystemExit("a voucher of the lane did not recover its payer authorizer")


async def run_path(name: str, path: str, headers: list[tuple[str, str]]) -> dict:
    async def one(i: int) -> None:
        if mode in ("read", "parse"):
            return read_voucher(headers[i])
        status, answer = await call(path, headers[i], i)
        if status != 200 or b'"completed"' not in answer:
            raise SystemExit(f"{name}: request {i} answered {status}: {answer[:300]!r}")

    for i in range(warmup):
        await one(i)
    warm_end = len(statements)
    ends = []  # how many statements had run when each measured request ended
    profiler = cProfile.Profile() if mode == "profile" else None
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    for i in range(warmup, warmup + measured):
        await one(i)
        ends.append(len(statements))
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - started
    out = {"path": name, "us": cpu / measured * 1e6}
    if mode == "capture":
        captured = {"statements": statements, "warm_end": warm_end, "ends": ends}
        with open(Path(stats_folder) / f"{name}.sql.pickle", "wb") as file:
            pickle.dump(captured, file)
    if profiler is not None:
        stats = pstats.Stats(profiler)
        out["calls"] = stats.total_calls / measured  # type: ignore[attr-defined]
        if stats_folder:
            stats.dump_stats(Path(stats_folder) / f"{name}.pstats")
    return out


async def main() -> None:
    n = warmup + measured
    key = [("authorization", f"Bearer {lane['key']}")] * n
    vouchers = [("payment-signature", v) for v in lane["vouchers"][offset : offset + n]]
    if "voucher" in paths and len(vouchers) < n:
        raise SystemExit(f"{len(vouchers)} vouchers left for {n} requests")
    async with app.router.lifespan_context(app):
        for name, path, headers in (("key", "/a2a/echo", key), ("voucher", "/a2a/paid-channel", vouchers)):
            if name in paths:
                print(json.dumps(await run_path(name, path, headers)), flush=True)


asyncio.run(main())
