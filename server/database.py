"""The store's seam: one small async interface over SQL, with two engines behind it.

Each table's owner (tasks and keys in the server; claims and the payment log in the gate)
writes portable SQL with ``?`` placeholders against `Database` and never learns which
engine runs it. `server.engines.open_database` picks one from the configured `database`:

- a path: one embedded SQLite file (`server/sqlite_store.py`), the default, shared by the
  workers of one machine;
- a ``postgresql://`` URL: a connection pool to PostgreSQL (`server/postgres_store.py`),
  shared by replicas on many machines.

Portable SQL here means: ``?`` placeholders, ``INSERT ... ON CONFLICT DO NOTHING`` (and
the rowcount) where a unique key decides, ``DOUBLE PRECISION``-compatible floats for
times, integers for flags, and `Database.json_text` for the one JSON lookup.

Every statement inside ``async with db.transaction():`` runs in that one transaction,
however deep the call that issues it; outside one, each statement commits by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

Row = dict[str, Any]
# One SQL statement with its arguments, as `Database.execute` and `write_together` take it.
Statement = tuple[str, Sequence[Any]]
Statements = Sequence[str] | Callable[["Database"], Awaitable[None]]

logger = logging.getLogger("a2a_gate.database")


class DatabaseUnavailable(Exception):
    """The database cannot take the statement now (unreachable, locked, full): try again later."""


class DatabaseRefused(Exception):
    """The database answered and turned us away for good (no such database or role, a wrong
    password, no entry for us): the configuration is wrong, and waiting will not help."""


DIALECTS = ("sqlite", "postgresql")  # `Database.dialect` of each engine


@dataclass(frozen=True)
class Migration:
    """One schema step: the statements every engine runs (portable SQL, written once), and an
    engine's own only where its words differ; either may be a function, for what SQL cannot say.

    ``Migration(statements)`` is the same on both engines; ``Migration(statements, postgresql=...)``
    replaces them on PostgreSQL alone; ``Migration(sqlite=..., postgresql=...)`` has nothing in common.
    """

    portable: Statements | None = None
    sqlite: Statements | None = None
    postgresql: Statements | None = None

    def __post_init__(self) -> None:
        for dialect in DIALECTS:
            if self.portable is None and getattr(self, dialect) is None:
                raise TypeError(f"a migration step says nothing for {dialect}: give its portable statements")

    def statements(self, dialect: str) -> Statements:
        """What this step runs on the engine of `dialect`."""
        own: Statements | None = getattr(self, dialect)
        statements = self.portable if own is None else own
        assert statements is not None  # __post_init__
        return statements

    @classmethod
    def add_columns(cls, table: str, columns: Sequence[str], then: Sequence[str] = ()) -> Migration:
        """`ALTER TABLE ... ADD COLUMN` for each declaration in `columns`, then the statements in
        `then`. PostgreSQL's adds ``IF NOT EXISTS`` (a column a concurrent or earlier start added is
        no error); SQLite has no such clause, and its schema lock already makes the step run once."""
        return cls(
            sqlite=(*(f"ALTER TABLE {table} ADD COLUMN {c}" for c in columns), *then),
            postgresql=(*(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {c}" for c in columns), *then),
        )


class Database(ABC):
    dialect: ClassVar[str]
    # The database's own clock, in epoch seconds, as a SQL expression: lease arithmetic is
    # written with it so every process judges a lease by one clock, never by its own.
    clock_sql: ClassVar[str]

    @abstractmethod
    async def open(self) -> None:
        """Connect (a pool, a file); called once before the first statement."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""

    @abstractmethod
    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Run one query; its rows as dicts keyed by column name."""

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[None]:
        """All statements issued inside run in one transaction, committed at the end or rolled back."""

    @abstractmethod
    async def check_writable(self) -> None:
        """Raise `DatabaseUnavailable` unless a write could start now (the readiness check)."""

    @abstractmethod
    def json_text(self, column: str, *path: str) -> str:
        """A SQL expression for the text at `path` inside a JSON document column."""

    @abstractmethod
    async def lock_schema(self) -> None:
        """Inside a transaction: hold off every other process migrating the schema until it ends."""

    @abstractmethod
    async def lock(self, name: str) -> None:
        """Inside a transaction: hold off every other transaction taking the lock of this name
        (in any process or replica) until it ends: a read, then a write that depends on it, is one step."""

    async def notify(self, channel: str, payload: str) -> None:
        """Tell the other processes on this database (`listen`); an engine without notifications
        does nothing, and its listeners find out by polling."""
        return None

    async def listen(self, channel: str, handler: Callable[[str], None]) -> bool:
        """Call `handler(payload)` for every notification on `channel` from now on; False when
        this engine has no notifications (the caller polls instead)."""
        return False

    async def write_together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        """Run these writes in one transaction (all or none; joined to the caller's, if it is in
        one) and return their rowcounts. No statement depends on another's answer, so an engine
        with a network between it and the data sends them at once: PostgreSQL in one round trip.
        """
        async with self.transaction():
            return [await self.execute(sql, args) for sql, args in statements]

    async def fetchrow(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetch(sql, args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, args: Sequence[Any] = ()) -> Any:
        row = await self.fetchrow(sql, args)
        return None if row is None else next(iter(row.values()))

    async def migrate(self, component: str, steps: Sequence[Migration]) -> int:
        """Bring `component`'s tables to the newest of `steps` (version n is steps[n-1]).

        Safe when several processes or replicas start at once: one migrates under the
        schema lock, the others then find the version current. Returns the version.
        """
        async with self.transaction():
            await self.lock_schema()
            # under the lock: two PostgreSQL sessions creating the same table at once collide
            await self.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
            current = await self.fetchval("SELECT version FROM schema_versions WHERE component = ?", (component,))
            current = current or 0
            for version, step in enumerate(steps, start=1):
                if version <= current:
                    continue
                statements = step.statements(self.dialect)
                if callable(statements):
                    await statements(self)
                else:
                    for statement in statements:
                        await self.execute(statement)
            if len(steps) > current:
                await self.execute(
                    "INSERT INTO schema_versions (component, version) VALUES (?, ?)"
                    " ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                    (component, len(steps)),
                )
        return max(current, len(steps))


async def commit_until_stored(
    db: Database, write: Callable[[], Awaitable[None]], what: str, patience: float = 300.0, *, atomic: bool = False
) -> None:
    """Run `write` in one transaction, again until it sticks (a locked, full or unreachable database).

    For records that must not be lost once money has moved: a settle outcome, and the
    task that shows it. Gives up (raising) only after `patience` seconds. `atomic`: `write`
    is a single statement or `write_together` already, all or none without a transaction
    around it (one round trip instead of three on PostgreSQL).
    """
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            if atomic:
                await write()
            else:
                async with db.transaction():
                    await write()
            return
        except DatabaseUnavailable as exc:
            if time.monotonic() > deadline:
                raise
            logger.warning("storing %s failed (%s), retrying", what, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
