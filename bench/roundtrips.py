"""`a2a-gate serve` with its PostgreSQL round trips counted: the benchmark's wrapper, never the product's.

    python bench/roundtrips.py STATS_FILE serve --config ... --port ...

Runs `gate.cli` in this process (from the working directory's tree, as `python -m gate.cli`
would) after wrapping three psycopg 3 calls:

- `AsyncConnection.wait`: every operation that goes to the server and waits for its answer
  (a statement, BEGIN, COMMIT, ROLLBACK, the store's liveness probe): one round trip each;
  those made while serving a request (in its task, or a task it started) apart from the
  replica's own passes, which run by the clock;
  psycopg's one-off PREPARE, sent before a statement's sixth use on a connection, rides
  inside the same wait and is not counted (once per statement and connection);
- `AsyncCursor.execute`: the statements among them, by SQL text, with the time from the
  call to its answer as the gate's event loop sees it (the server's work, the network, and
  the wait for this process's own turn on a busy CPU);
- `AsyncConnectionPool.getconn` and `putconn`: how long a request waits for a pooled
  connection, and how long it holds one (its round trips, and its turns on the event loop
  in between);
- `redis.asyncio.Redis.execute_command`: the commands the shared limiters send to Redis;
- `server.app.a2a_endpoint`: the A2A requests answered, which the figures are divided by (the
  same window as the counters, where the load generator's count would be a slightly other one);
- `server.postgres_store.PostgresDatabase.write_together`: a statement group is sent with its
  values bound into its text, so its statements are counted under their SQL, joined, instead.

On SIGUSR1 the counters are written to STATS_FILE (a JSON document with a `seq` that goes
up by one each time, written whole then renamed), so the benchmark can read them as its
measured window opens and closes. The counting costs a few microseconds a call.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import defaultdict
from contextvars import ContextVar
from pathlib import Path
from typing import Any


class Counters:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = 0
        self.round_trips = 0
        self.request_round_trips = 0  # of them, those a request made (its task, or one it started)
        self.round_trip_seconds = 0.0
        self.checkouts = 0
        self.checkout_seconds = 0.0
        self.held_seconds = 0.0
        self.redis_commands = 0
        self.requests = 0  # A2A requests answered: what the counters above are divided by
        self.statements: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # sql: [count, seconds]

    def dump(self, *_: Any) -> None:
        self.seq += 1
        document = {
            "seq": self.seq,
            "pid": os.getpid(),
            "round_trips": self.round_trips,
            "request_round_trips": self.request_round_trips,
            "round_trip_seconds": self.round_trip_seconds,
            "checkouts": self.checkouts,
            "checkout_seconds": self.checkout_seconds,
            "held_seconds": self.held_seconds,
            "redis_commands": self.redis_commands,
            "requests": self.requests,
            "statements": {sql: {"count": c, "seconds": s} for sql, (c, s) in self.statements.items()},
        }
        partial = self.path.with_suffix(".part")
        partial.write_text(json.dumps(document))
        partial.replace(self.path)


def install(counters: Counters) -> None:
    import psycopg
    import redis.asyncio
    from psycopg_pool import AsyncConnectionPool

    wait, execute = psycopg.AsyncConnection.wait, psycopg.AsyncCursor.execute
    getconn, putconn = AsyncConnectionPool.getconn, AsyncConnectionPool.putconn
    command = redis.asyncio.Redis.execute_command
    taken: dict[int, float] = {}  # id(connection): when it left the pool

    async def counted_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await wait(self, gen, *args, **kwargs)
        finally:
            counters.round_trips += 1
            counters.round_trip_seconds += time.perf_counter() - started
            if serving.get():
                counters.request_round_trips += 1

    async def timed_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await execute(self, query, *args, **kwargs)
        finally:
            label = group.get() or (query if isinstance(query, str) else repr(query))
            entry = counters.statements[label]
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    async def timed_getconn(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        conn = await getconn(self, *args, **kwargs)
        now = time.perf_counter()
        counters.checkouts += 1
        counters.checkout_seconds += now - started
        taken[id(conn)] = now
        return conn

    async def timed_putconn(self: Any, conn: Any) -> None:
        since = taken.pop(id(conn), None)
        if since is not None:
            counters.held_seconds += time.perf_counter() - since
        await putconn(self, conn)

    async def counted_command(self: Any, *args: Any, **options: Any) -> Any:
        counters.redis_commands += 1
        return await command(self, *args, **options)

    psycopg.AsyncConnection.wait = counted_wait  # type: ignore[method-assign]
    psycopg.AsyncCursor.execute = timed_execute  # type: ignore[method-assign]
    AsyncConnectionPool.getconn = timed_getconn  # type: ignore[method-assign]
    AsyncConnectionPool.putconn = timed_putconn  # type: ignore[method-assign]
    redis.asyncio.Redis.execute_command = counted_command  # type: ignore[method-assign]


# Whether this task serves a request (or was started by one): its round trips are the request's, the
# others the replica's own passes (sweeps, lease renewals, counts), which run by the clock, not per request.
serving: ContextVar[bool] = ContextVar("serving", default=False)

# The statements of the `write_together` group under way, as the store was given them: it sends them
# with their values bound in, a text that differs every time, where a statement is counted by its SQL.
group: ContextVar[str] = ContextVar("group", default="")


def label_groups() -> None:
    """Count a statement group (`PostgresDatabase.write_together`) under its statements' SQL, joined."""
    import server.postgres_store

    store = getattr(server.postgres_store, "PostgresDatabase", None)
    translate = getattr(server.postgres_store, "translate", None)
    write_together = getattr(store, "write_together", None)
    if write_together is None or translate is None:  # an older tree: its statements are counted as sent
        return

    async def labelled(self: Any, statements: Any) -> Any:
        token = group.set("; ".join(translate(sql) for sql, _ in statements))
        try:
            return await write_together(self, statements)
        finally:
            group.reset(token)

    store.write_together = labelled  # type: ignore[method-assign]


def count_requests(counters: Counters) -> None:
    """Count the A2A requests the replica answers (`server.app.a2a_endpoint`, which the app's A2A route
    looks up by name on every request), so a window's round trips are divided by the requests of the
    same window, however late its marks land on a busy machine."""
    import server.app

    endpoint = getattr(server.app, "a2a_endpoint", None)
    if endpoint is None:  # an older tree: the load generator's count is used instead
        return

    async def counted_endpoint(request: Any) -> Any:
        token = serving.set(True)  # what the request's task does, and the tasks it starts (a copy of its context)
        try:
            return await endpoint(request)
        finally:
            serving.reset(token)
            counters.requests += 1

    server.app.a2a_endpoint = counted_endpoint  # type: ignore[attr-defined]


def main() -> int:
    counters = Counters(Path(sys.argv[1]))
    install(counters)
    signal.signal(signal.SIGUSR1, counters.dump)
    # the tree being benchmarked first, as `python -m gate.cli` would find it (not this script's folder)
    sys.path[0] = os.getcwd()
    count_requests(counters)
    label_groups()
    from gate.cli import main as gate_main

    return gate_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
