"""The store, traced: one span per transaction (a statement outside one is its own), none per statement.

Put in front of the engine only when tracing is on (`server.app.Services`), so the store costs
nothing more when it is off. A span names the engine and never the SQL or its arguments (they
hold token digests, payers and task documents). Reads are not traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextvars import ContextVar
from typing import Any

from server import tracing
from server.database import Database, Row

_IN_TRANSACTION: ContextVar[bool] = ContextVar("traced_transaction", default=False)


class TracedDatabase(Database):
    """`inner`, each of its write transactions in a span of its own."""

    def __init__(self, inner: Database) -> None:
        self.inner = inner
        self.attributes = {"db.system.name": inner.dialect}

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        if _IN_TRANSACTION.get():
            return await self.inner.execute(sql, args)
        with tracing.span("store.write", self.attributes, kind="client"):
            return await self.inner.execute(sql, args)

    async def write_together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        if _IN_TRANSACTION.get():
            return await self.inner.write_together(statements)
        with tracing.span("store.write", {**self.attributes, "db.statements": len(statements)}, kind="client"):
            return await self.inner.write_together(statements)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return await self.inner.fetch(sql, args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if _IN_TRANSACTION.get():  # joined to the caller's: its span covers it
            async with self.inner.transaction():
                yield
            return
        joined = _IN_TRANSACTION.set(True)
        try:
            with tracing.span("store.transaction", self.attributes, kind="client"):
                async with self.inner.transaction():
                    yield
        finally:
            _IN_TRANSACTION.reset(joined)

    async def check_writable(self) -> None:
        await self.inner.check_writable()

    def json_text(self, column: str, *path: str) -> str:
        return self.inner.json_text(column, *path)

    async def lock_schema(self) -> None:
        await self.inner.lock_schema()

    async def lock(self, name: str) -> None:
        await self.inner.lock(name)

    async def notify(self, channel: str, payload: str) -> None:
        await self.inner.notify(channel, payload)

    async def listen(self, channel: str, handler: Callable[[str], None]) -> bool:
        return await self.inner.listen(channel, handler)


def traced(inner: Database) -> Database:
    """`inner` behind spans, with its engine's dialect and clock (class attributes of each engine)."""
    engine = type(
        f"Traced{type(inner).__name__}", (TracedDatabase,), {"dialect": inner.dialect, "clock_sql": inner.clock_sql}
    )
    return engine(inner)
