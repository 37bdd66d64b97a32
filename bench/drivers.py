"""`python -m bench.drivers`: asyncpg against psycopg 3 on the store's own statements.

    python -m bench.drivers                         # 2,000 operations per case and mode
    python -m bench.drivers --ops 5000 --concurrency 16 --pool 10
    python -m bench.drivers --url postgresql://postgres@127.0.0.1:5432/test --json drivers.json

Each driver runs through a pool, in autocommit, behind the same thin layer the store puts
over it (``?`` placeholders translated once per statement string, a transaction held in a
ContextVar), so the figures compare what the store would get, not the drivers' best cases.
The operations are the store's: a claim (``INSERT ... ON CONFLICT DO NOTHING`` on a
primary key and a partial unique index, rowcount checked), a task written then updated
(a ~1 KB JSON document), a payment-log append, a read by primary key, and a settlement's
three statements in one transaction. Each case runs sequentially (one task) and with
`--concurrency` tasks at once; the drivers alternate, in both orders, over `--rounds`.

``asyncpg`` is its pool as shipped: each release resets the connection (one more round
trip: ``RESET ALL``, ``UNLISTEN *``, ...); ``asyncpg-noreset`` skips that. ``psycopg+check``
is psycopg with the pool's `check_connection` on every checkout (one more round trip), the
price of finding a dead connection before a statement does. ``store`` is
`server.postgres_store.PostgresDatabase` itself, on psycopg: what the gate gets.

Every run works in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

DEFAULT_URL = os.environ.get("A2A_GATE_TEST_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"

SCHEMA = [
    "CREATE TABLE claims (token_digest TEXT PRIMARY KEY, nonce_key TEXT NOT NULL, request_digest TEXT NOT NULL,"
    " agent TEXT NOT NULL, state TEXT NOT NULL, task_id TEXT NOT NULL DEFAULT '', owner_instance TEXT NOT NULL,"
    " lease_until DOUBLE PRECISION NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
    " updated_at DOUBLE PRECISION NOT NULL, sealed_payment TEXT NOT NULL, receipt TEXT NOT NULL DEFAULT '')",
    "CREATE UNIQUE INDEX claims_nonce ON claims (nonce_key) WHERE nonce_key != ''",
    "CREATE INDEX claims_state ON claims (state)",
    "CREATE TABLE tasks (id TEXT PRIMARY KEY, agent TEXT NOT NULL, context_id TEXT NOT NULL, state TEXT NOT NULL,"
    " owner TEXT NOT NULL, document TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
    " updated_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE payments (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at DOUBLE PRECISION NOT NULL,"
    " action TEXT NOT NULL, agent TEXT NOT NULL, task_id TEXT NOT NULL, token_digest TEXT NOT NULL,"
    " payer TEXT NOT NULL, amount TEXT NOT NULL, detail TEXT NOT NULL)",
    "CREATE INDEX payments_digest ON payments (token_digest)",
]

CLAIM = (
    "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, owner_instance, lease_until,"
    " created_at, updated_at, sealed_payment) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
TASK_INSERT = (
    "INSERT INTO tasks (id, agent, context_id, state, owner, document, created_at, updated_at)"
    " VALUES (?, ?, ?, 'submitted', '', ?, ?, ?)"
)
TASK_UPDATE = "UPDATE tasks SET state = ?, document = ?, updated_at = ? WHERE id = ?"
LOG = (
    "INSERT INTO payments (at, action, agent, task_id, token_digest, payer, amount, detail)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
GET = "SELECT * FROM tasks WHERE id = ?"
SETTLE_CLAIM = "UPDATE claims SET state = 'settled', receipt = ?, updated_at = ? WHERE token_digest = ?"


def task_document(task_id: str, state: str) -> str:
    """A task as the store keeps it: about 1 KB of JSON text."""
    text = "x" * 700
    return json.dumps(
        {
            "kind": "task",
            "id": task_id,
            "contextId": task_id[::-1],
            "status": {"state": state, "timestamp": "2026-01-01T00:00:00Z"},
            "history": [{"role": "user", "parts": [{"kind": "text", "text": text}], "messageId": task_id}],
            "metadata": {"x402": {"payer": "0x" + "ab" * 20, "amount": "10000"}},
        },
        separators=(",", ":"),
    )


# -- the two drivers behind the store's thin layer ----------------------------------------


class Driver(ABC):
    """What the store needs of a driver: a pool, autocommit statements, a task-bound transaction."""

    name: str

    def __init__(self, url: str, schema: str, pool: int) -> None:
        self.url = url
        self.schema = schema
        self.pool_size = pool
        self.sql: dict[str, str] = {}
        self.conn: ContextVar[Any] = ContextVar(f"bench-conn-{id(self)}", default=None)

    @abstractmethod
    def translate(self, sql: str) -> str: ...

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int: ...

    @abstractmethod
    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    @abstractmethod
    def transaction(self) -> Any: ...

    def prepared(self, sql: str) -> str:
        text = self.sql.get(sql)
        if text is None:
            text = self.sql[sql] = self.translate(sql)
        return text


class Asyncpg(Driver):
    name = "asyncpg"
    reset = True

    def translate(self, sql: str) -> str:
        parts = sql.split("?")
        return "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], start=1)) + parts[-1]

    async def open(self) -> None:
        import asyncpg

        async def keep(conn: Any) -> None:
            return None

        self.pool = await asyncpg.create_pool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            server_settings={"search_path": self.schema},
            reset=None if self.reset else keep,
        )

    async def close(self) -> None:
        await self.pool.close()

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        conn = self.conn.get()
        if conn is not None:
            status = await conn.execute(self.prepared(sql), *args)
        else:
            async with self.pool.acquire() as conn:
                status = await conn.execute(self.prepared(sql), *args)
        last = status.rpartition(" ")[2]
        return int(last) if last.isdigit() else -1

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        conn = self.conn.get()
        if conn is not None:
            return [dict(r) for r in await conn.fetch(self.prepared(sql), *args)]
        async with self.pool.acquire() as conn:
            return [dict(r) for r in await conn.fetch(self.prepared(sql), *args)]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.pool.acquire() as conn, conn.transaction():
            token = self.conn.set(conn)
            try:
                yield
            finally:
                self.conn.reset(token)


class Psycopg(Driver):
    name = "psycopg"
    check = False

    def translate(self, sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    async def open(self) -> None:
        from psycopg_pool import AsyncConnectionPool

        self.pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            kwargs={"autocommit": True, "options": f"-csearch_path={self.schema}"},
            check=AsyncConnectionPool.check_connection if self.check else None,
        )
        await self.pool.open(wait=True, timeout=5)

    async def close(self) -> None:
        await self.pool.close()

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        conn = self.conn.get()
        if conn is not None:
            return (await conn.execute(self.prepared(sql), args)).rowcount
        async with self.pool.connection() as conn:
            return (await conn.execute(self.prepared(sql), args)).rowcount

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        conn = self.conn.get()
        if conn is not None:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self.prepared(sql), args)
            return await cur.fetchall()
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self.prepared(sql), args)
            return await cur.fetchall()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.pool.connection() as conn, conn.transaction():
            token = self.conn.set(conn)
            try:
                yield
            finally:
                self.conn.reset(token)


class AsyncpgKept(Asyncpg):
    name = "asyncpg-noreset"
    reset = False


class PsycopgChecked(Psycopg):
    name = "psycopg+check"
    check = True


class Store(Driver):
    """The store itself (server/postgres_store.py): psycopg, its checkout check, its error mapping."""

    name = "store"

    def translate(self, sql: str) -> str:
        return sql  # the store translates

    async def open(self) -> None:
        from server.postgres_store import PostgresDatabase

        joiner = "&" if "?" in self.url else "?"
        self.db = PostgresDatabase(
            f"{self.url}{joiner}options=-csearch_path%3D{self.schema}&pool_max_size={self.pool_size}"
        )
        await self.db.open()

    async def close(self) -> None:
        await self.db.close()

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return await self.db.execute(sql, args)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return await self.db.fetch(sql, args)

    def transaction(self) -> Any:
        return self.db.transaction()


DRIVERS: dict[str, type[Driver]] = {d.name: d for d in (Asyncpg, AsyncpgKept, Psycopg, PsycopgChecked, Store)}


# -- the operations -------------------------------------------------------------------------


class Operations:
    """Each store operation, on fresh keys every call (i is unique across a run)."""

    def __init__(self, db: Driver) -> None:
        self.db = db
        self.tasks: list[str] = []  # written by `task`, read by `get`
        self.claims: list[str] = []  # token digests written by `claim`, settled by `settle`

    async def claim(self, i: int) -> None:
        now = time.time()
        digest = f"{self.db.name}-{i:08d}-" + "d" * 48
        nonce = f"eip155:8453/usdc/{self.db.name}/{i}" if i % 2 else ""  # half with a nonce key, as EVM tokens
        args = (digest, nonce, "r" * 64, "echo", "instance", now + 60, now, now, "s" * 300)
        if await self.db.execute(CLAIM, args) != 1:
            raise AssertionError("a new claim was not inserted")
        if await self.db.execute(CLAIM, args) != 0:  # the replay: the same token again
            raise AssertionError("a duplicate claim was inserted")
        self.claims.append(digest)

    async def task(self, i: int) -> None:
        task_id = f"{self.db.name}-task-{i:08d}"
        now = time.time()
        await self.db.execute(TASK_INSERT, (task_id, "echo", task_id, task_document(task_id, "submitted"), now, now))
        done = await self.db.execute(TASK_UPDATE, ("completed", task_document(task_id, "completed"), now, task_id))
        if done != 1:
            raise AssertionError("the task update changed no row")
        self.tasks.append(task_id)

    async def log(self, i: int) -> None:
        await self.db.execute(
            LOG,
            (time.time(), "settled", "echo", f"task-{i}", "d" * 64, "0x" + "ab" * 20, "10000", '{"tx":"0x00"}'),
        )

    async def get(self, i: int) -> None:
        rows = await self.db.fetch(GET, (self.tasks[i % len(self.tasks)],))
        if len(rows) != 1 or not isinstance(rows[0]["updated_at"], float):
            raise AssertionError("the task was not read back")

    async def settle(self, i: int) -> None:
        """The settlement's transaction: the claim, its log row and its task, together."""
        task_id = self.tasks[i % len(self.tasks)]
        digest = self.claims[i % len(self.claims)]
        now = time.time()
        async with self.db.transaction():
            if await self.db.execute(SETTLE_CLAIM, ('{"transaction":"0x00"}', now, digest)) != 1:
                raise AssertionError("the claim to settle was not found")
            await self.db.execute(LOG, (now, "settled", "echo", task_id, digest, "0xpayer", "10000", "{}"))
            await self.db.execute(TASK_UPDATE, ("completed", task_document(task_id, "completed"), now, task_id))


CASES = ("claim", "task", "log", "get", "settle")
DESCRIPTIONS = {
    "claim": "claim: INSERT ... ON CONFLICT DO NOTHING, new then duplicate (2 statements)",
    "task": "task: INSERT then UPDATE of a ~1 KB JSON text (2 statements)",
    "log": "log: payment-log append (1 statement)",
    "get": "get: SELECT by primary key (1 statement)",
    "settle": "settle: transaction of 3 statements (BEGIN/COMMIT besides)",
}


@dataclass
class Result:
    driver: str
    case: str
    mode: str  # sequential | concurrent
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def ops_per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


async def measure(
    call: Callable[[int], Awaitable[None]], start: int, ops: int, tasks: int
) -> tuple[float, list[float]]:
    """Run `ops` calls over `tasks` tasks; wall seconds and each call's latency in ms."""
    latencies: list[float] = []
    counter = iter(range(start, start + ops))

    async def worker() -> None:
        for i in counter:
            began = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return time.perf_counter() - began, latencies


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(args: argparse.Namespace, log: Callable[[str], None]) -> list[Result]:
    import psycopg

    names = [n.strip() for n in args.drivers.split(",") if n.strip()]
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM ends the run like Ctrl-C does: cancelled, through the finally below (the schema goes)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    admin = await psycopg.AsyncConnection.connect(args.url, autocommit=True, connect_timeout=5)
    schema = f"bench_drivers_{uuid.uuid4().hex[:10]}"
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    drivers: list[Driver] = []
    try:
        async with await psycopg.AsyncConnection.connect(
            args.url, autocommit=True, options=f"-csearch_path={schema}"
        ) as conn:
            for statement in SCHEMA:
                await conn.execute(statement)
        for name in names:
            driver = DRIVERS[name](args.url, schema, args.pool)
            await driver.open()
            drivers.append(driver)
        operations = {d.name: Operations(d) for d in drivers}
        for ops in operations.values():  # warm the pools and the statement caches
            for i in range(50):
                await ops.task(900_000_000 + i)
        merged: dict[tuple[str, str, str], tuple[float, list[float]]] = {}
        position = 0
        for round_ in range(args.rounds):
            for case in CASES:
                for mode, tasks in (("sequential", 1), ("concurrent", args.concurrency)):
                    order = drivers if round_ % 2 == 0 else list(reversed(drivers))
                    for driver in order:
                        call = getattr(operations[driver.name], case)
                        seconds, latencies = await measure(call, position, args.ops, tasks)
                        seconds_before, before = merged.get((driver.name, case, mode), (0.0, []))
                        merged[(driver.name, case, mode)] = (seconds_before + seconds, before + latencies)
                        log(f"round {round_ + 1} {case:6} {mode:10} {driver.name:14} {args.ops / seconds:8,.0f} ops/s")
                    position += args.ops
        return [
            Result(name, case, mode, len(lat), seconds, quantile(lat, 0.50), quantile(lat, 0.99))
            for (name, case, mode), (seconds, lat) in merged.items()
        ]
    finally:
        for driver in drivers:
            await driver.close()
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


def table(results: list[Result], drivers: list[str]) -> str:
    head = ("case", "mode", "driver", "ops/s", "p50 ms", "p99 ms", "vs first")
    rows = []
    by_key = {(r.driver, r.case, r.mode): r for r in results}
    for case in CASES:
        for mode in ("sequential", "concurrent"):
            first = by_key.get((drivers[0], case, mode))
            for name in drivers:
                r = by_key.get((name, case, mode))
                if r is None:
                    continue
                ratio = f"{r.ops_per_second / first.ops_per_second:.2f}×" if first and first.ops_per_second else "-"
                rows.append((case, mode, name, f"{r.ops_per_second:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", ratio))
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]

    def render(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([render(head), render(tuple("-" * w for w in widths)), *map(render, rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drivers", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL to run on (a schema of its own)")
    parser.add_argument(
        "--drivers", default="asyncpg,asyncpg-noreset,psycopg,psycopg+check,store", help=", ".join(DRIVERS)
    )
    parser.add_argument("--ops", type=int, default=2000, help="operations per case, mode, driver and round")
    parser.add_argument("--concurrency", type=int, default=16, help="tasks at once in the concurrent mode")
    parser.add_argument("--pool", type=int, default=10, help="pool size (the store's default maximum)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the drivers' order reversed in each")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    unknown = [n for n in args.drivers.split(",") if n.strip() and n.strip() not in DRIVERS]
    if unknown:
        print(f"error: unknown driver(s) {', '.join(unknown)}; choose from {', '.join(DRIVERS)}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.drivers.split(",") if n.strip()]
    started = time.monotonic()
    try:
        results = asyncio.run(run(args, log=lambda msg: print(msg, file=sys.stderr, flush=True)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    packages = ", ".join(f"{p} {version(p)}" for p in ("asyncpg", "psycopg", "psycopg-pool"))
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; packages: {packages}")
    print(
        f"run: {args.ops} ops per case, mode, driver and round; {args.rounds} rounds; pool max {args.pool}; "
        f"concurrent = {args.concurrency} tasks; {time.monotonic() - started:.0f}s in all"
    )
    for case in CASES:
        print(f"  {DESCRIPTIONS[case]}")
    print()
    print(table(results, names))
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "ops_per_second": r.ops_per_second} for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
