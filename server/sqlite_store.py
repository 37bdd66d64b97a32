"""The embedded engine: one SQLite file (WAL), shared by the workers of one machine.

One connection per process in autocommit mode; a transaction is ``BEGIN IMMEDIATE``, so
writers of every worker serialise at its start, not at its first write. Statements run
inline: SQLite answers in microseconds, and a coroutine that never suspends keeps a
transaction whole on the event loop. A lock still queues transactions of one process
behind each other, should one ever wait on something else.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import sqlite_utils

from server.database import Database, DatabaseUnavailable, Row


class SQLiteDatabase(Database):
    dialect = "sqlite"
    # One machine, one clock: the same wall clock every process on it reads, in SQL.
    clock_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite_utils.Database | None = None
        self._transaction = asyncio.Lock()
        self._inside: ContextVar[bool] = ContextVar(f"sqlite-transaction-{id(self)}", default=False)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise DatabaseUnavailable("the database is not open")
        return self._db.conn

    async def open(self) -> None:
        if self._db is not None:
            return
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        try:
            db = sqlite_utils.Database(conn)
            if self.path != ":memory:":
                db.enable_wal()  # needs the file to itself for a moment: busy while others start too
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.OperationalError as exc:
            conn.close()
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc
        self._db = db

    async def close(self) -> None:
        if self._db is not None:
            self._db.conn.close()
            self._db = None

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        try:
            return self.conn.execute(sql, tuple(args)).rowcount
        except sqlite3.OperationalError as exc:  # locked, full, read-only, I/O
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        try:
            cursor = self.conn.execute(sql, tuple(args))
            columns = [c[0] for c in cursor.description]
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.OperationalError as exc:
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self._inside.get():  # a transaction already holds this task: its statements join it
            yield
            return
        async with self._transaction:
            await self.execute("BEGIN IMMEDIATE")
            token = self._inside.set(True)
            try:
                yield
                await self.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
            finally:
                self._inside.reset(token)

    async def check_writable(self) -> None:
        async with self.transaction():
            pass

    def json_text(self, column: str, *path: str) -> str:
        return f"json_extract({column}, '$.{'.'.join(path)}')"

    async def lock_schema(self) -> None:
        return None  # BEGIN IMMEDIATE already holds every other writer off

    async def lock(self, name: str) -> None:
        return None  # the same
