"""The shared engine: a pool of psycopg 3 connections to PostgreSQL, for replicas on many machines.

Selected by a URL (``database = "postgresql://user@host:5432/db"``); libpq reads it, so
every libpq parameter works (``sslmode``, ``connect_timeout``, ``options=-csearch_path%3Ds``
for a schema of one's own, several hosts with ``target_session_attrs``). Two parameters
are the pool's, taken out before libpq sees the URL: ``pool_min_size`` (default 1) and
``pool_max_size`` (default 10), per process.

Connections are in autocommit: a statement outside a transaction commits by itself. A
transaction takes one connection from the pool and holds it in a ContextVar, with the
task that opened it, so every statement that task issues inside, at any depth, runs on
that connection; another task (even one started inside) takes a connection of its own.
Its BEGIN travels with its first statement (one simple query, ``BEGIN; <statement>``, the
values bound by psycopg's `ClientCursor`): a round trip fewer per transaction, and none at
all for a transaction that issues nothing.

`notify`/`listen` are PostgreSQL's NOTIFY/LISTEN: one connection of its own per process
listens (outside the pool), and comes back by itself after losing its server; what was sent
meanwhile is lost, so listeners poll as well. Channels are per database, not per schema.

What says "try again later" (refused, reset, a terminated backend, a pool with no
connection free in time, a serialization failure or deadlock, a read-only server) raises
`DatabaseUnavailable`; anything else (a constraint, a syntax error) is a bug and raises as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import select
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from server.database import Database, DatabaseRefused, DatabaseUnavailable, Row

CONNECT_TIMEOUT = 5  # seconds for one connection attempt (libpq connect_timeout), unless the URL says
ACQUIRE_TIMEOUT = 5.0  # seconds a statement waits for a free pool connection before DatabaseUnavailable
CHECK_TIMEOUT = 2.0  # seconds the readiness check may take
# seconds one chain of reconnection attempts (backoff 1, 2, 4 s...) goes on before giving up; the
# next request starts a new one. The pool's default (5 min) lets the backoff grow with the outage,
# so after a long one the pool could wait about as long again before it tries the server that is back.
RECONNECT_TIMEOUT = 5.0
# pg_advisory_xact_lock key serialising schema migrations across replicas (any fixed bigint)
SCHEMA_LOCK = 0x6132_6167_6174_65  # "a2agate"
READ_ONLY = "25006"  # read_only_sql_transaction: a standby, or a primary demoted under us
PATH_ELEMENT = re.compile(r"^[A-Za-z0-9_-]+$")
LISTEN_TURN = 0.5  # seconds between looks for channels newly listened to
LISTEN_RETRY_MAX = 10.0  # seconds at most between attempts to get the listening connection back

logger = logging.getLogger("a2a_gate.database")


@dataclass
class Held:
    """A transaction under way: its connection, the task it belongs to, whether BEGIN was sent."""

    conn: psycopg.AsyncConnection[Any]
    task: asyncio.Task[Any] | None
    begun: bool = False


@lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """Portable SQL to psycopg's: ``?`` outside quotes becomes ``%s``, every ``%`` is doubled."""
    out: list[str] = []
    quote = ""
    for char in sql:
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "?":
            out.append("%s")
            continue
        out.append("%%" if char == "%" else char)
    return "".join(out)


def pool_sizes(url: str) -> tuple[str, int, int]:
    """The URL without the pool's own parameters (the rest kept verbatim), and the pool's min and max size."""
    parts = urlsplit(url)
    sizes = {"pool_min_size": 1, "pool_max_size": 10}
    rest = []
    for pair in parts.query.split("&") if parts.query else []:
        name, _, value = pair.partition("=")
        if name in sizes:
            sizes[name] = int(value)
        else:
            rest.append(pair)
    if sizes["pool_min_size"] > sizes["pool_max_size"]:
        raise ValueError("pool_min_size is larger than pool_max_size")
    return urlunsplit(parts._replace(query="&".join(rest))), sizes["pool_min_size"], sizes["pool_max_size"]


# What a server that turned a connection away for good says (libpq gives no SQLSTATE for it)
REFUSED = re.compile(
    r"FATAL:\s+(database \S+ does not exist|role \S+ does not exist|password authentication failed for user \S+"
    r"|no pg_hba\.conf entry for .*)",
)


def unavailable(exc: psycopg.Error) -> NoReturn:
    raise DatabaseUnavailable(f"postgresql: {type(exc).__name__}: {str(exc).strip() or 'no answer'}") from exc


def retryable(exc: psycopg.Error) -> bool:
    # OperationalError covers connection failures, AdminShutdown, PoolTimeout/PoolClosed,
    # serialization failures and deadlocks (TransactionRollback), cancelled statements.
    return isinstance(exc, psycopg.OperationalError) or exc.sqlstate == READ_ONLY


def arguments(args: Sequence[Any]) -> tuple[Any, ...]:
    """Flags are integers in portable SQL: a Python bool goes in as 0 or 1, as SQLite stores it."""
    return tuple(int(a) if isinstance(a, bool) else a for a in args)


async def alive(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether a connection from the pool still works, without a round trip in the common case.

    An idle autocommit connection receives nothing unless its server said something (most
    often: terminating the backend, or shutting down), so only a readable socket is worth a
    real check. asyncpg's pool notices the same through its always-reading protocol.
    """
    if conn.closed:
        return False
    poller = select.poll()  # not select.select: a busy server's descriptors pass 1024
    poller.register(conn.pgconn.socket, select.POLLIN)
    if not poller.poll(0):
        return True
    try:
        await conn.execute("")
    except psycopg.OperationalError:
        return False
    return True


class PostgresDatabase(Database):
    dialect = "postgresql"
    # The server's clock, read afresh per statement (now() would be the transaction's start).
    clock_sql = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    def __init__(self, url: str) -> None:
        self.conninfo, self.min_size, self.max_size = pool_sizes(url)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        # (connection, the task whose transaction holds it)
        self._handlers: dict[str, list[Callable[[str], None]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._listening: dict[str, asyncio.Event] = {}  # set once LISTEN ran for the channel
        self._held: ContextVar[Held | None] = ContextVar(f"postgres-transaction-{id(self)}", default=None)

    @property
    def pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise DatabaseUnavailable("the database is not open")
        return self._pool

    def _connect_arguments(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in conninfo_to_dict(self.conninfo):
            extra["connect_timeout"] = CONNECT_TIMEOUT
        return extra

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            extra = self._connect_arguments()
            # One direct attempt first: a refused or unknown server fails at once, with its reason.
            first = await psycopg.AsyncConnection.connect(self.conninfo, **extra)
            await first.close()
        except psycopg.Error as exc:
            reason = REFUSED.search(str(exc))
            if reason:  # the server said no: a wrong name, role or password
                raise DatabaseRefused(f"postgresql: {reason.group(0).strip()}") from exc
            if retryable(exc):
                unavailable(exc)
            raise  # a URL libpq cannot read: the configuration is wrong, waiting will not help
        pool = AsyncConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs=extra,
            open=False,
            timeout=ACQUIRE_TIMEOUT,
            reconnect_timeout=RECONNECT_TIMEOUT,
            name="a2a-gate",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT + 1)
        except psycopg.Error as exc:
            await pool.close()
            unavailable(exc)
        self._pool = pool

    async def close(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close(timeout=5)

    def _held_here(self) -> Held | None:
        """The transaction this task is in, if any."""
        held = self._held.get()
        return held if held is not None and held.task is asyncio.current_task() else None

    def _joined(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection of the transaction this task is in, if any."""
        held = self._held_here()
        return None if held is None else held.conn

    async def _begin_with(self, held: Held, sql: str, args: Sequence[Any], rows: bool) -> Any:
        """The transaction's first statement, its BEGIN in the same query: rowcount, or rows."""
        cursor = psycopg.AsyncClientCursor(held.conn, row_factory=dict_row)
        await cursor.execute("BEGIN; " + sql, args)
        held.begun = True
        cursor.nextset()  # past BEGIN's own result
        return await cursor.fetchall() if rows else cursor.rowcount

    @asynccontextmanager
    async def _checkout(self, timeout: float = ACQUIRE_TIMEOUT) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A working connection from the pool, returned to it afterwards.

        A dead one (its backend terminated, its server restarted) goes back at once, and
        the pool replaces it; the next is tried without the backoff the pool's own `check`
        would sleep between failures (a second for the first, then 2, 4 ... within the timeout).
        """
        pool = self.pool
        deadline = time.monotonic() + timeout
        for _ in range(self.max_size + 1):
            conn = await pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            if await alive(conn):
                break
            await pool.putconn(conn)  # broken: closed and replaced by the pool
        else:
            raise DatabaseUnavailable("postgresql: every pooled connection was broken")
        try:
            yield conn
        finally:
            await pool.putconn(conn)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = self._joined()
        if conn is not None:
            yield conn
            return
        async with self._checkout() as conn:
            yield conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        try:
            held = self._held_here()
            if held is not None and not held.begun:
                return int(await self._begin_with(held, translate(sql), arguments(args), rows=False))
            async with self._connection() as conn:
                cursor = await conn.execute(translate(sql), arguments(args))
                return cursor.rowcount
        except psycopg.Error as exc:
            if retryable(exc):
                unavailable(exc)
            raise

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        try:
            held = self._held_here()
            if held is not None and not held.begun:
                return list(await self._begin_with(held, translate(sql), arguments(args), rows=True))
            async with self._connection() as conn:
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(translate(sql), arguments(args))
                return await cursor.fetchall()
        except psycopg.Error as exc:
            if retryable(exc):
                unavailable(exc)
            raise

    async def write_together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        """One round trip: the statements as ONE simple query, which PostgreSQL runs as one
        (implicit) transaction, all or none, or inside the caller's. The values are bound by
        psycopg on this side (`ClientCursor`, libpq's quoting): the simple protocol has no
        parameters, and it is what runs several statements in one message. Each statement is
        bound on its own and the texts joined after: psycopg keeps the parse of a statement of
        up to 50 values and 4 KB, and a delivery's group is past both when bound whole, which
        cost a replica about 3% of its CPU parsing it afresh for every voucher."""
        held = self._held_here()
        try:
            async with self._connection() as conn:
                cursor = psycopg.AsyncClientCursor(conn)
                text = "; ".join(cursor.mogrify(translate(sql), arguments(args)) for sql, args in statements)
                if held is not None and not held.begun:  # the caller's transaction begins with these
                    text, held.begun = "BEGIN; " + text, True
                await cursor.execute(text)
                counts = [cursor.rowcount]
                while cursor.nextset():
                    counts.append(cursor.rowcount)
                return counts[1:] if text.startswith("BEGIN; ") else counts
        except psycopg.Error as exc:
            if retryable(exc):
                unavailable(exc)
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self._joined() is not None:  # this task is in a transaction already: join it
            yield
            return
        try:
            async with self._checkout() as conn:
                held = Held(conn, asyncio.current_task())
                token = self._held.set(held)
                try:
                    yield
                except BaseException:
                    if held.begun:  # a broken connection is the pool's to discard
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("ROLLBACK")
                    raise
                else:
                    if held.begun:
                        await conn.execute("COMMIT")
                finally:
                    self._held.reset(token)
        except psycopg.Error as exc:  # at COMMIT; the body's own errors are mapped already
            if retryable(exc):
                unavailable(exc)
            raise

    async def check_writable(self) -> None:
        """A transaction that could write starts within CHECK_TIMEOUT, or `DatabaseUnavailable`."""
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                async with self._checkout(CHECK_TIMEOUT) as conn, conn.transaction():
                    cursor = await conn.execute("SELECT current_setting('transaction_read_only')")
                    row = await cursor.fetchone()
        except TimeoutError as exc:
            raise DatabaseUnavailable(f"postgresql: no answer within {CHECK_TIMEOUT:g}s") from exc
        except psycopg.Error as exc:
            unavailable(exc)
        if row is None or row[0] != "off":
            raise DatabaseUnavailable("postgresql: the server is read-only (a standby?)")

    def json_text(self, column: str, *path: str) -> str:
        for element in path:
            if not PATH_ELEMENT.match(element):
                raise ValueError(f"a JSON path element must be a plain name: {element!r}")
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')"

    async def lock_schema(self) -> None:
        if self._joined() is None:
            raise RuntimeError("lock_schema() holds the lock until the transaction ends: call it inside one")
        await self.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")

    async def lock(self, name: str) -> None:
        if self._joined() is None:
            raise RuntimeError("lock() holds the lock until the transaction ends: call it inside one")
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)  # a bigint
        await self.execute("SELECT pg_advisory_xact_lock(?)", (key,))

    async def notify(self, channel: str, payload: str) -> None:
        """Delivered to every listener on this database; inside a transaction, when it commits."""
        await self.execute("SELECT pg_notify(?, ?)", (channel, payload))

    async def listen(self, channel: str, handler: Callable[[str], None]) -> bool:
        """From when this returns (the server up), every notification on `channel` reaches `handler`."""
        self._handlers.setdefault(channel, []).append(handler)
        ready = self._listening.setdefault(channel, asyncio.Event())
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="a2a-gate-listen")
        with contextlib.suppress(TimeoutError):  # the server is away: it listens when back
            await asyncio.wait_for(ready.wait(), CONNECT_TIMEOUT)
        return True

    async def _listen(self) -> None:
        """Hold one connection listening on every channel asked for; reconnect when it goes."""
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, **self._connect_arguments())
                async with conn:
                    listening: set[str] = set()
                    delay = 0.5
                    while True:
                        for channel in [c for c in self._handlers if c not in listening]:
                            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                            listening.add(channel)
                            self._listening[channel].set()
                        async for note in conn.notifies(timeout=LISTEN_TURN):
                            for handler in self._handlers.get(note.channel, []):
                                try:
                                    handler(note.payload)
                                except Exception:  # a listener's bug loses its notification, not the others'
                                    logger.exception("a handler of notifications on %s failed", note.channel)
            except psycopg.OperationalError as exc:
                logger.warning("listening for notifications: %s; again in %.1fs", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, LISTEN_RETRY_MAX)
