"""The tasks table's indexes, on both engines: requests awaiting payment are counted per caller
(`TaskStore.count_pending`, the cap on unpaid requests) from an index that holds only them, so a
task written in any other state (a key's, a paid one: nearly every task) changes one index less.
A store made before the index moved upgrades to it and counts the same."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from server.database import Database
from server.tasks import MIGRATIONS, TaskStore
from tests.server.test_store_engines import with_db

OWNER, OTHER = "anon:203.0.113.7", "anon:203.0.113.8"


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, or a fresh PostgreSQL schema whose planner uses an index wherever one serves
    (a few rows would otherwise be read whole, whatever the indexes)."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return request.getfixturevalue("postgres_schema").store_url("-cenable_seqscan=off")


def task(state: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "contextId": "c", "kind": "task", "status": {"state": state}}


async def write_every_state(store: TaskStore) -> None:
    """Two live requests awaiting payment of OWNER, one expired, one of OTHER, and OWNER's tasks in
    every other state."""
    for state, owner, deadline in [
        ("input-required", OWNER, 600.0),
        ("input-required", OWNER, 600.0),
        ("input-required", OWNER, -1.0),  # its deadline passed: no longer counted
        ("input-required", OTHER, 600.0),
        *[(s, OWNER, 600.0) for s in ("submitted", "working", "completed", "failed", "canceled", "rejected")],
    ]:
        await store.create(task(state), agent="paid", owner=owner, deadline_seconds=deadline)


async def plan(db: Database, sql: str, args: tuple[Any, ...]) -> str:
    if db.dialect == "sqlite":
        return " ".join(str(row["detail"]) for row in await db.fetch(f"EXPLAIN QUERY PLAN {sql}", args))
    return " ".join(str(row["QUERY PLAN"]) for row in await db.fetch(f"EXPLAIN {sql}", args))


async def indexes(db: Database) -> set[str]:
    if db.dialect == "sqlite":
        rows = await db.fetch("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'")
    else:
        rows = await db.fetch(
            "SELECT indexname AS name FROM pg_indexes WHERE tablename = 'tasks' AND schemaname = current_schema()"
        )
    return {row["name"] for row in rows}


async def entries(db: Database, index: str) -> int:
    """How many rows an index holds: SQLite counts its leaf cells; PostgreSQL's ANALYZE reads a
    table this small whole and stores the count for each index."""
    if db.dialect == "sqlite":
        return int(await db.fetchval("SELECT SUM(ncell) FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (index,)))
    await db.execute("ANALYZE tasks")
    return int(
        await db.fetchval(
            "SELECT reltuples FROM pg_class WHERE relname = ? AND relkind = 'i' AND relnamespace = current_schema()::regnamespace",
            (index,),
        )
    )


def test_requests_awaiting_payment_are_counted_from_an_index_of_them_alone(location: str) -> None:
    async def body(db: Database) -> None:
        store = TaskStore(db)
        await store.create_tables()
        await write_every_state(store)
        assert await store.count_pending(OWNER) == 2
        assert await store.count_pending(OTHER) == 1
        assert "idx_tasks_awaiting_payment" in await plan(db, TaskStore.COUNT_PENDING, (OWNER, time.time()))
        assert "idx_tasks_owner_state" not in await indexes(db)
        # the four awaiting payment, and none of the six in another state; every task in the others
        assert await entries(db, "idx_tasks_awaiting_payment") == 4
        assert await entries(db, "idx_tasks_owner_agent_updated_at") == 10

    with_db(location, body)


def test_a_store_made_before_the_index_moved_upgrades_and_counts_the_same(location: str) -> None:
    async def body(db: Database) -> None:
        store = TaskStore(db)
        await db.migrate("tasks", MIGRATIONS[:2])  # as the version before made it
        await write_every_state(store)
        assert "idx_tasks_owner_state" in await indexes(db)
        assert await store.count_pending(OWNER) == 2
        await store.create_tables()  # the upgrade, as a gate starting on it runs it
        assert {"idx_tasks_awaiting_payment", "idx_tasks_owner_agent_updated_at"} <= await indexes(db)
        assert "idx_tasks_owner_state" not in await indexes(db)
        assert await store.count_pending(OWNER) == 2
        assert await store.count_pending(OTHER) == 1
        await store.create(task("input-required"), agent="paid", owner=OWNER)
        assert await store.count_pending(OWNER) == 3

    with_db(location, body)
