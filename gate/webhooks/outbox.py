"""The webhook outbox: the payment log itself, read past a cursor per endpoint, and a small table
of deliveries (what is owed to each endpoint, its attempts, its next try).

Why the log and not an outbox table of its own: every change an event reports already writes its
log row in the same transaction as the change (gate/settlement.py, gate/claims.py,
gate/flows/channel/jobs.py), so reading the log cannot miss a change nor invent one, and the paid
path pays no extra write. A background pass per endpoint reads the rows past its cursor, turns the
subscribed ones into deliveries and moves the cursor, in one transaction.

The cursor and ids: a SQLite log's ids are given in commit order (one writer at a time), but
PostgreSQL hands a sequence's ids out at insert, so a row may commit after one with a higher id.
The cursor therefore stops before a gap in the ids until the row after it is `GAP_GRACE_SECONDS`
old (a transaction holding the missing id has committed or rolled back by then); the rows past the
gap are turned into deliveries at once all the same, and reading them again adds nothing (one
delivery per endpoint and event id).

One replica at a time serves an endpoint: it holds the endpoint's lease (`owner`, `lease_until`,
by the database's clock, as a channel job holds its channel), renews it before each round of
sends, and every write it makes names it; a frozen replica's lease lapses and another takes over.
A new endpoint starts at the end of the log: it gets the events from its first start on.

Bounded: past `max_backlog` undelivered events an endpoint's oldest are given up (the caller logs
and counts them); delivered and given-up rows are deleted after `RETENTION_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.webhooks.events import Event, from_log_row
from server.database import Database, Migration

GAP_GRACE_SECONDS = 60.0  # longer than any transaction that writes a log row
PAGE = 500  # log rows read per pass
RETENTION_SECONDS = 7 * 86400.0  # delivered and given-up rows are kept this long

_ENDPOINTS = (
    "CREATE TABLE IF NOT EXISTS webhook_endpoints (name TEXT PRIMARY KEY,"
    " last_log_id BIGINT NOT NULL DEFAULT 0,"  # the cursor: every log row up to it is turned into deliveries
    " owner TEXT NOT NULL DEFAULT '', lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " summary_day TEXT NOT NULL DEFAULT '',"  # the last day whose summary was queued
    " created_at DOUBLE PRECISION NOT NULL DEFAULT 0)"
)
_DELIVERIES = (
    "CREATE TABLE IF NOT EXISTS webhook_deliveries (id {key} PRIMARY KEY, endpoint TEXT NOT NULL,"
    " event_id TEXT NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,"
    " state TEXT NOT NULL DEFAULT 'pending',"  # pending, delivered, given_up
    " attempts INTEGER NOT NULL DEFAULT 0, next_at DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " last_error TEXT NOT NULL DEFAULT '', created_at DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " done_at DOUBLE PRECISION NOT NULL DEFAULT 0)"
)
_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS webhook_deliveries_event ON webhook_deliveries (endpoint, event_id)",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (endpoint, state, next_at)",
)
MIGRATIONS = (
    Migration(
        sqlite=(_ENDPOINTS, _DELIVERIES.format(key="INTEGER"), *_INDEXES),
        postgresql=(_ENDPOINTS, _DELIVERIES.format(key="BIGSERIAL"), *_INDEXES),
    ),
)


class LeaseLost(Exception):
    """Another replica serves this endpoint now: this one stops writing for it."""


@dataclass(frozen=True)
class Delivery:
    id: int
    event_id: str
    type: str
    body: str
    attempts: int


def advance(cursor: int, rows: Sequence[tuple[int, float]], now: float, grace: float = GAP_GRACE_SECONDS) -> int:
    """How far the cursor may move over `rows` (id, time written), read in id order past it: to the
    last id before a gap whose next row is younger than `grace` (its missing id may still commit)."""
    for row_id, at in rows:
        if row_id != cursor + 1 and now - at < grace:
            break
        cursor = row_id
    return cursor


class Outbox:
    """The deliveries owed to each endpoint, and each endpoint's cursor and lease, in the store."""

    def __init__(self, db: Database, owner: str) -> None:
        self.db = db
        self.owner = owner  # this process, for as long as it lives

    @property
    def now(self) -> str:
        return self.db.clock_sql

    async def create_tables(self) -> None:
        await self.db.migrate("webhooks", MIGRATIONS)

    async def register(self, name: str) -> None:
        """An endpoint seen for the first time starts at the end of the log."""
        await self.db.execute(
            f"INSERT INTO webhook_endpoints (name, last_log_id, created_at) SELECT ?, COALESCE(MAX(id), 0), {self.now}"
            " FROM payments WHERE 1 = 1 ON CONFLICT (name) DO NOTHING",
            (name,),
        )

    async def take(self, name: str, lease_seconds: float) -> bool:
        """Hold (or keep holding) `name`'s lease for `lease_seconds`, unless another holds it."""
        taken = await self.db.execute(
            f"UPDATE webhook_endpoints SET owner = ?, lease_until = {self.now} + ?"
            f" WHERE name = ? AND (owner = ? OR lease_until < {self.now})",
            (self.owner, lease_seconds, name, self.owner),
        )
        return taken == 1

    async def release(self, names: Sequence[str]) -> None:
        """At a stop: the next replica (or this one started again) need not wait out the lease."""
        for name in names:
            await self.db.execute(
                "UPDATE webhook_endpoints SET lease_until = 0 WHERE name = ? AND owner = ?", (name, self.owner)
            )

    async def fill(self, name: str, actions: dict[str, str], now: float) -> int:
        """Turn the log rows past `name`'s cursor that it subscribes to (`actions`: log action ->
        event type) into deliveries, and move its cursor; the number of rows it moved over (0: it stayed)."""
        seen = await self.db.fetchrow(
            "SELECT last_log_id, (SELECT MAX(id) FROM payments) AS latest FROM webhook_endpoints"
            " WHERE name = ? AND owner = ?",
            (name, self.owner),
        )
        if seen is None:
            raise LeaseLost(name)
        if seen["latest"] is None or int(seen["latest"]) <= int(seen["last_log_id"]):
            return 0  # nothing new: no write transaction (on SQLite it would hold the requests' writes off)
        async with self.db.transaction():
            cursor = await self.db.fetchval(
                "SELECT last_log_id FROM webhook_endpoints WHERE name = ? AND owner = ?", (name, self.owner)
            )
            if cursor is None:
                raise LeaseLost(name)
            rows = await self.db.fetch("SELECT * FROM payments WHERE id > ? ORDER BY id LIMIT ?", (cursor, PAGE))
            for row in rows:
                if row["action"] in actions:
                    await self.add(name, from_log_row(row, actions[row["action"]]))
            moved = advance(int(cursor), [(int(r["id"]), float(r["at"])) for r in rows], now)
            if moved != cursor:
                await self.db.execute(
                    "UPDATE webhook_endpoints SET last_log_id = ? WHERE name = ? AND owner = ?",
                    (moved, name, self.owner),
                )
        return len(rows) if moved != cursor else 0  # (a cursor held at a gap is no reason to read again at once)

    async def add(self, name: str, event: Event) -> bool:
        """Owe `event` to `name`, once: an event already owed (or delivered) is not added again."""
        added = await self.db.execute(
            "INSERT INTO webhook_deliveries (endpoint, event_id, type, body, next_at, created_at)"
            f" VALUES (?, ?, ?, ?, {self.now}, {self.now}) ON CONFLICT (endpoint, event_id) DO NOTHING",
            (name, event.id, event.type, event.body),
        )
        return added == 1

    async def summary_due(self, name: str, day: str, day_start: float) -> bool:
        """Whether `day`'s summary is still to be queued for `name`: not yet, and it existed before the day ended."""
        row = await self.db.fetchrow(
            "SELECT summary_day, created_at FROM webhook_endpoints WHERE name = ? AND owner = ?", (name, self.owner)
        )
        return row is not None and row["summary_day"] < day and float(row["created_at"]) < day_start + 86400

    async def add_summary(self, name: str, day: str, event: Event) -> None:
        async with self.db.transaction():
            marked = await self.db.execute(
                "UPDATE webhook_endpoints SET summary_day = ? WHERE name = ? AND owner = ? AND summary_day < ?",
                (day, name, self.owner, day),
            )
            if marked:
                await self.add(name, event)

    async def bound(self, name: str, max_backlog: int) -> list[dict[str, Any]]:
        """Give up `name`'s oldest undelivered events past `max_backlog`; the ones given up."""
        count = await self.db.fetchval(
            "SELECT COUNT(*) FROM webhook_deliveries WHERE endpoint = ? AND state = 'pending'", (name,)
        )
        if int(count or 0) <= max_backlog:
            return []
        oldest = await self.db.fetch(
            "SELECT id, event_id, attempts FROM webhook_deliveries WHERE endpoint = ? AND state = 'pending'"
            " ORDER BY id LIMIT ?",
            (name, int(count) - max_backlog),
        )
        given_up = []
        for row in oldest:
            if await self.finish(name, int(row["id"]), "given_up", "the endpoint's backlog is full"):
                given_up.append(row)
        return given_up

    async def due(self, name: str, limit: int) -> list[Delivery]:
        rows = await self.db.fetch(
            "SELECT id, event_id, type, body, attempts FROM webhook_deliveries"
            f" WHERE endpoint = ? AND state = 'pending' AND next_at <= {self.now} ORDER BY id LIMIT ?",
            (name, limit),
        )
        return [Delivery(int(r["id"]), r["event_id"], r["type"], r["body"], int(r["attempts"])) for r in rows]

    def _ours(self) -> str:
        return "EXISTS (SELECT 1 FROM webhook_endpoints WHERE name = ? AND owner = ?)"

    async def finish(
        self, name: str, delivery_id: int, state: str, error: str = "", *, attempted: bool = False
    ) -> bool:
        """A delivery ends `delivered` or `given_up`; False when it was not pending, or the lease is gone."""
        return (
            await self.db.execute(
                "UPDATE webhook_deliveries SET state = ?, last_error = ?, attempts = attempts + ?,"
                f" done_at = {self.now} WHERE id = ? AND state = 'pending' AND {self._ours()}",
                (state, error[:200], int(attempted), delivery_id, name, self.owner),
            )
            == 1
        )

    async def retry(self, name: str, delivery_id: int, error: str, delay: float) -> bool:
        return (
            await self.db.execute(
                f"UPDATE webhook_deliveries SET attempts = attempts + 1, last_error = ?, next_at = {self.now} + ?"
                f" WHERE id = ? AND state = 'pending' AND {self._ours()}",
                (error[:200], delay, delivery_id, name, self.owner),
            )
            == 1
        )

    async def forget_old(self, name: str) -> None:
        await self.db.execute(
            f"DELETE FROM webhook_deliveries WHERE endpoint = ? AND state != 'pending' AND done_at < {self.now} - ?",
            (name, RETENTION_SECONDS),
        )

    async def backlog(self) -> dict[str, int]:
        """Undelivered events per endpoint (the metric)."""
        rows = await self.db.fetch(
            "SELECT endpoint, COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending' GROUP BY endpoint"
        )
        return {r["endpoint"]: int(r["n"]) for r in rows}
