"""The `Database` contract, held by both engines: SQLite in a file, PostgreSQL in a schema of its own.

Every table owner writes one SQL for both, so what one engine does here the other must do
too: rowcounts, ``ON CONFLICT DO NOTHING`` on a primary key and on a partial unique index,
transactions that commit whole or not at all and that nested calls join, JSON lookups,
versioned migrations safe when replicas start at once. PostgreSQL adds its own: a server
that is down or read-only is `DatabaseUnavailable`, and a pool whose backends die heals itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from server.database import Database, DatabaseUnavailable, Migration
from server.engines import open_database
from tests.support.gate_process import free_port
from tests.support.services import OwnPostgres, PostgresSchema

REPO = Path(__file__).parents[2]
CLAIMS = [
    "CREATE TABLE claims (digest TEXT PRIMARY KEY, nonce TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE UNIQUE INDEX claims_nonce ON claims (nonce) WHERE nonce != ''",
]
ROWS = "CREATE TABLE t (id TEXT PRIMARY KEY, n INTEGER NOT NULL, at DOUBLE PRECISION, doc TEXT)"
CLAIM = "INSERT INTO claims (digest, nonce, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: a SQLite file, or a PostgreSQL URL on a fresh schema."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return request.getfixturevalue("postgres_schema").store_url()


@pytest.fixture
def pg_location(postgres_schema: PostgresSchema) -> str:
    return postgres_schema.store_url()


def with_db(location: str, body: Callable[[Database], Awaitable[Any]]) -> Any:
    """Open a store at `location`, run `body` on it, close it."""

    async def run() -> Any:
        db = open_database(location)
        await db.open()
        try:
            return await body(db)
        finally:
            await db.close()

    return asyncio.run(run())


async def admin(location: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own, outside the store under test."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(location, autocommit=True) as conn:
        cursor = await conn.execute(sql, args)
        return await cursor.fetchall() if cursor.description else []


def test_rows_round_trip_as_dicts_with_their_types(location: str) -> None:
    now = time.time()

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        assert await db.execute("INSERT INTO t (id, n, at, doc) VALUES (?, ?, ?, ?)", ("a", 1, now, "x")) == 1
        await db.execute("INSERT INTO t (id, n, at, doc) VALUES (?, ?, ?, ?)", ("b", 2, float("inf"), None))
        await db.execute("INSERT INTO t (id, n, at, doc) VALUES (?, ?, ?, ?)", ("c", True, 0.5, "50%"))
        rows = await db.fetch("SELECT id, n, at, doc FROM t ORDER BY id")
        assert rows == [
            {"id": "a", "n": 1, "at": now, "doc": "x"},
            {"id": "b", "n": 2, "at": math.inf, "doc": None},
            {"id": "c", "n": 1, "at": 0.5, "doc": "50%"},
        ]
        assert isinstance(rows[0]["at"], float) and rows[0]["at"] == now  # DOUBLE PRECISION, not rounded
        assert await db.fetchrow("SELECT n FROM t WHERE id = ?", ("zz",)) is None
        assert await db.fetchval("SELECT count(*) FROM t") == 3
        # a ? or a % inside a literal is text, not a placeholder
        assert await db.fetchrow("SELECT '?' AS q, ? AS v, 'a%b' LIKE 'a%' AS l", ("v",)) == {
            "q": "?",
            "v": "v",
            "l": 1 if db.dialect == "sqlite" else True,
        }

    with_db(location, body)


def test_execute_returns_the_rows_an_update_or_delete_changed(location: str) -> None:
    async def body(db: Database) -> None:
        await db.execute(ROWS)
        for i in range(3):
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (f"r{i}", i))
        assert await db.execute("UPDATE t SET doc = ? WHERE n >= ?", ("y", 1)) == 2
        assert await db.execute("UPDATE t SET doc = ? WHERE n > ?", ("y", 99)) == 0
        assert await db.execute("DELETE FROM t WHERE n = ?", (0,)) == 1
        assert await db.execute("DELETE FROM t WHERE n = ?", (0,)) == 0

    with_db(location, body)


def test_on_conflict_do_nothing_counts_zero_on_a_primary_key_and_on_a_partial_unique_index(location: str) -> None:
    async def body(db: Database) -> None:
        for statement in CLAIMS:
            await db.execute(statement)
        assert await db.execute(CLAIM, ("d1", "nonce-1", 1.0)) == 1
        assert await db.execute(CLAIM, ("d1", "nonce-2", 2.0)) == 0  # the same token digest
        assert await db.execute(CLAIM, ("d2", "nonce-1", 3.0)) == 0  # the same authorization nonce
        assert await db.execute(CLAIM, ("d3", "", 4.0)) == 1  # no nonce: outside the partial index
        assert await db.execute(CLAIM, ("d4", "", 5.0)) == 1
        assert await db.fetch("SELECT digest, nonce, at FROM claims ORDER BY digest") == [
            {"digest": "d1", "nonce": "nonce-1", "at": 1.0},
            {"digest": "d3", "nonce": "", "at": 4.0},
            {"digest": "d4", "nonce": "", "at": 5.0},
        ]

    with_db(location, body)


def test_a_transaction_commits_whole_or_leaves_nothing(location: str) -> None:
    class Boom(Exception):
        pass

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        async with db.transaction():
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("kept-1", 1))
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("kept-2", 2))
        with pytest.raises(Boom):
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("lost-1", 1))
                assert await db.fetchval("SELECT count(*) FROM t WHERE id = ?", ("lost-1",)) == 1
                raise Boom
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("lost-2", 1))
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("kept-1", 9))  # fails half-way
        assert [r["id"] for r in await db.fetch("SELECT id FROM t ORDER BY id")] == ["kept-1", "kept-2"]

    with_db(location, body)


def test_a_nested_transaction_joins_the_one_around_it(location: str) -> None:
    async def record(db: Database, row_id: str) -> None:
        async with db.transaction():  # a callee that wants its own statements whole
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (row_id, 1))

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("outer", 1))
                await record(db, "inner")
                raise RuntimeError("the outer transaction fails after the inner one ended")
        assert await db.fetch("SELECT id FROM t") == []
        async with db.transaction():
            await record(db, "inner")
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("outer", 1))
        assert await db.fetchval("SELECT count(*) FROM t") == 2

    with_db(location, body)


def test_concurrent_tasks_do_not_join_each_others_transactions(location: str) -> None:
    """One task's failed transaction takes none of another's statements with it, nor blocks them for good."""

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        started = asyncio.Event()

        async def failing() -> None:
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("a1", 1))
                started.set()
                await asyncio.sleep(0.1)  # the other task runs meanwhile
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("a2", 1))
                raise RuntimeError("rolled back")

        async def succeeding() -> None:
            await started.wait()
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("b1", 2))
                await asyncio.sleep(0)
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("b2", 2))

        outcomes = await asyncio.gather(failing(), succeeding(), return_exceptions=True)
        assert isinstance(outcomes[0], RuntimeError) and outcomes[1] is None
        assert [r["id"] for r in await db.fetch("SELECT id FROM t ORDER BY id")] == ["b1", "b2"]

    with_db(location, body)


def test_postgresql_runs_each_tasks_statements_on_its_own_connection(pg_location: str) -> None:
    """Inside a transaction every statement is on its connection; another task's, even a child's, are not."""

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        inside = asyncio.Event()
        done = asyncio.Event()
        seen: dict[str, Any] = {}

        async def holder() -> None:
            async with db.transaction():
                seen["outer"] = await db.fetchval("SELECT pg_backend_pid()")
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("held", 1))
                async with db.transaction():
                    seen["nested"] = await db.fetchval("SELECT pg_backend_pid()")
                # a task started inside the transaction is not in it
                seen["child"] = await asyncio.create_task(db.fetchval("SELECT pg_backend_pid()"))
                inside.set()
                await done.wait()
                raise RuntimeError("rolled back")

        async def bystander() -> None:
            await inside.wait()
            seen["bystander"] = await db.fetchval("SELECT pg_backend_pid()")
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("free", 2))  # commits on its own
            seen["visible"] = await db.fetchval("SELECT count(*) FROM t WHERE id = ?", ("held",))
            done.set()

        outcomes = await asyncio.gather(holder(), bystander(), return_exceptions=True)
        assert isinstance(outcomes[0], RuntimeError), outcomes
        assert seen["nested"] == seen["outer"]
        assert seen["child"] != seen["outer"] and seen["bystander"] != seen["outer"]
        assert seen["visible"] == 0  # uncommitted rows stay in their transaction
        assert [r["id"] for r in await db.fetch("SELECT id FROM t")] == ["free"]

    with_db(pg_location, body)


def test_json_text_reads_inside_a_json_document(location: str) -> None:
    async def body(db: Database) -> None:
        await db.execute(ROWS)
        for row_id, state in (("a", "completed"), ("b", "working")):
            document = {"id": row_id, "status": {"state": state}, "metadata": {"x402": {"payer": "0xab"}}}
            await db.execute("INSERT INTO t (id, n, doc) VALUES (?, 0, ?)", (row_id, json.dumps(document)))
        found = await db.fetch(f"SELECT id FROM t WHERE {db.json_text('doc', 'status', 'state')} = ?", ("working",))
        assert found == [{"id": "b"}]
        payer = await db.fetchval(f"SELECT {db.json_text('doc', 'metadata', 'x402', 'payer')} FROM t WHERE id = 'a'")
        assert payer == "0xab"
        assert await db.fetchval(f"SELECT {db.json_text('doc', 'missing')} FROM t WHERE id = 'a'") is None

    with_db(location, body)


STEPS = [
    Migration(
        sqlite=["CREATE TABLE things (id TEXT PRIMARY KEY)", "INSERT INTO applied (step) VALUES (1)"],
        postgresql=["CREATE TABLE things (id TEXT PRIMARY KEY)", "INSERT INTO applied (step) VALUES (1)"],
    ),
    Migration(
        sqlite=["ALTER TABLE things ADD COLUMN at DOUBLE PRECISION", "INSERT INTO applied (step) VALUES (2)"],
        postgresql=["ALTER TABLE things ADD COLUMN at DOUBLE PRECISION", "INSERT INTO applied (step) VALUES (2)"],
    ),
]


async def third(db: Database) -> None:
    """A step SQL alone cannot say in both dialects: a function."""
    await db.execute("INSERT INTO things (id, at) VALUES (?, ?)", ("seeded", 1.5))
    await db.execute("INSERT INTO applied (step) VALUES (3)")


def test_migrate_applies_each_version_once(location: str) -> None:
    async def body(db: Database) -> None:
        await db.execute("CREATE TABLE applied (step INTEGER NOT NULL)")
        assert await db.migrate("things", STEPS) == 2
        assert await db.migrate("things", STEPS) == 2  # a no-op: CREATE TABLE would fail if run again
        assert await db.migrate("things", [*STEPS, Migration(sqlite=third, postgresql=third)]) == 3
        assert await db.migrate("other", STEPS[:0]) == 0
        assert [r["step"] for r in await db.fetch("SELECT step FROM applied ORDER BY step")] == [1, 2, 3]
        assert await db.fetchrow("SELECT id, at FROM things") == {"id": "seeded", "at": 1.5}
        assert await db.fetchval("SELECT version FROM schema_versions WHERE component = ?", ("things",)) == 3

    with_db(location, body)


def test_two_stores_migrating_at_once_apply_each_step_once(location: str) -> None:
    async def body(first: Database) -> None:
        await first.execute("CREATE TABLE applied (step INTEGER NOT NULL)")
        second = open_database(location)
        await second.open()
        try:
            versions = await asyncio.gather(*(db.migrate("things", STEPS) for db in (first, second, first, second)))
        finally:
            await second.close()
        assert versions == [2, 2, 2, 2]
        assert [r["step"] for r in await first.fetch("SELECT step FROM applied ORDER BY step")] == [1, 2]

    with_db(location, body)


def test_postgresql_unreachable_is_unavailable_quickly() -> None:
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    db = open_database(closed)
    began = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match=r"(?i)connect"):
        asyncio.run(db.open())
    assert time.monotonic() - began < 6
    with pytest.raises(DatabaseUnavailable):
        asyncio.run(db.execute("SELECT 1"))  # never opened: still the retryable error


def test_postgresql_read_only_is_not_writable(postgres_schema: PostgresSchema) -> None:
    """A standby (or a primary demoted under us) answers reads only: not ready, writes retryable."""

    async def body(db: Database) -> None:
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            await db.check_writable()
        with pytest.raises(DatabaseUnavailable):
            await db.execute(ROWS)
        assert await db.fetchval("SELECT 1") == 1

    with_db(postgres_schema.store_url("-cdefault_transaction_read_only=on"), body)


async def grow_pool(db: Database, size: int, connections: Callable[[], Awaitable[int]] | None = None) -> None:
    """Make the pool open `size` connections (as many transactions held at once), then let them go
    idle in it; `connections` counts them on the server, else half a second is taken as enough."""
    gate = asyncio.Event()

    async def hold() -> None:
        async with db.transaction():
            await db.fetchval("SELECT 1")
            await gate.wait()

    holders = [asyncio.create_task(hold()) for _ in range(size)]
    if connections is None:
        await asyncio.sleep(0.5)
    else:
        while await connections() < size:
            await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(*holders)


def test_postgresql_pool_recovers_when_its_backends_are_terminated(postgres_schema: PostgresSchema) -> None:
    """The server ends every connection (a restart, a failover, an operator): the next statements just work."""
    name = f"a2a-gate-test-{postgres_schema.schema}"
    location = postgres_schema.store_url(application_name=name, pool_max_size="4")

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        await grow_pool(db, 4, lambda: db_connections(name))
        before = set(await backends(name))
        await admin(
            postgres_schema.url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        )
        deadline = time.monotonic() + 10
        while set(await backends(name)) & before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for i in range(8):  # every dead connection is found and replaced, none reaches a caller
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (f"after-{i}", i))
        await db.check_writable()
        async with db.transaction():
            assert await db.fetchval("SELECT count(*) FROM t") == 8
        assert not set(await backends(name)) & before

    async def backends(app: str) -> list[int]:
        rows = await admin(postgres_schema.url, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))
        return [r[0] for r in rows]

    async def db_connections(app: str) -> int:
        return len(await backends(app))

    with_db(location, body)


def started_together(script: str, location: str, count: int) -> list[str]:
    """Run `script` in `count` processes that start their work at one instant (their interpreters
    up and connected well before); each must exit 0. Their outputs."""
    start_at = time.time() + 3.0
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, location, str(start_at)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    outputs = [p.communicate(timeout=60) for p in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    return [out for out, _ in outputs]


MIGRATOR = """
import asyncio, sys, time
from server.app import open_until_ready
from server.database import Migration
from server.engines import open_database

async def slow(db):
    await asyncio.sleep(0.3)  # hold the schema lock while the other process arrives
    await db.execute("INSERT INTO applied (step) VALUES (2)")

FIRST = [
    "CREATE TABLE applied (step INTEGER NOT NULL)",
    "CREATE TABLE things (id TEXT PRIMARY KEY, at DOUBLE PRECISION)",
    "INSERT INTO applied (step) VALUES (1)",
]
STEPS = [Migration(sqlite=FIRST, postgresql=FIRST), Migration(sqlite=slow, postgresql=slow)]

async def main(location, start_at):
    db = open_database(location)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await open_until_ready(db, 30.0)
    try:
        print(await db.migrate("things", STEPS))
    finally:
        await db.close()

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def test_two_processes_starting_at_once_on_a_fresh_store_both_start(location: str) -> None:
    """Two replicas started together: one creates the schema, the other waits and finds it current."""
    for out in started_together(MIGRATOR, location, 2):
        assert out.split() == ["2"]

    async def body(db: Database) -> None:
        assert [r["step"] for r in await db.fetch("SELECT step FROM applied ORDER BY step")] == [1, 2]
        assert await db.fetchval("SELECT version FROM schema_versions WHERE component = 'things'") == 2

    with_db(location, body)


def test_postgresql_restarted_is_unavailable_meanwhile_and_used_again_at_once(own_postgres: OwnPostgres) -> None:
    """A restart cuts a transaction (nothing of it stays), fails fast while down, and the pool is back at once.

    The outage outlasts one chain of reconnection attempts, whose backoff would otherwise keep
    the pool away from the server for about as long again."""
    from server.postgres_store import ACQUIRE_TIMEOUT, CHECK_TIMEOUT, RECONNECT_TIMEOUT

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        await grow_pool(db, 4)
        with pytest.raises(DatabaseUnavailable):
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("cut", 1))
                own_postgres.stop()  # the other three connections die idle in the pool
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("cut-2", 1))
        down = time.monotonic()
        began = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            await db.check_writable()
        assert time.monotonic() - began < CHECK_TIMEOUT + 1
        began = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("lost", 1))
        assert time.monotonic() - began < ACQUIRE_TIMEOUT + 1
        await asyncio.sleep(max(0.0, RECONNECT_TIMEOUT + 1 - (time.monotonic() - down)))
        own_postgres.start()
        began = time.monotonic()
        await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("back", 1))
        assert time.monotonic() - began < 1.5
        for i in range(8):
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (f"after-{i}", i))
        await db.check_writable()
        assert await db.fetchval("SELECT count(*) FROM t WHERE id IN ('cut', 'cut-2', 'lost')") == 0
        assert await db.fetchval("SELECT count(*) FROM t") == 9

    with_db(own_postgres.url + "?pool_max_size=4", body)


GATE_START = """
import asyncio, sys, time
from gate.claims import Claims
from gate.payment_log import PaymentLog
from server import principals
from server.app import open_until_ready
from server.engines import open_database
from server.tasks import TaskStore

async def main(location, start_at):
    db = open_database(location)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await open_until_ready(db, 30.0)
    try:  # what a2a-gate serve and a2a-gate migrate do on start, in their order
        await TaskStore(db).create_tables()
        await principals.create_tables(db)
        await Claims(db).create_tables()
        await PaymentLog(db).create_tables()
        rows = await db.fetch("SELECT component, version FROM schema_versions ORDER BY component")
        print(" ".join(f"{r['component']}={r['version']}" for r in rows))
    finally:
        await db.close()

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def test_three_replicas_creating_the_gates_tables_at_once_all_start(location: str) -> None:
    """The real tables (tasks, keys, claims, payment log), created by three processes started together."""
    from gate import claims, payment_log
    from server import principals, tasks

    outputs = started_together(GATE_START, location, 3)
    expected = {
        "api_keys": len(principals.MIGRATIONS),
        "claims": len(claims.MIGRATIONS),
        "payments": len(payment_log.MIGRATIONS),
        "tasks": len(tasks.MIGRATIONS),
    }
    for out in outputs:
        assert out.split() == [f"{name}={version}" for name, version in sorted(expected.items())]

    async def body(db: Database) -> None:
        for table in ("tasks", "api_keys", "claims", "payments"):
            assert await db.fetchval(f"SELECT count(*) FROM {table}") == 0

    with_db(location, body)


def test_notifications_reach_the_other_stores_listening_or_say_they_do_not(location: str) -> None:
    """PostgreSQL delivers NOTIFY to every listening store (at commit, never from a rollback);
    SQLite has none, says so, and its listeners poll."""
    channel = f"a2a_gate_test_{uuid.uuid4().hex[:12]}"  # channels are per database: one per test

    async def body(sender: Database) -> None:
        receiver = open_database(location)
        await receiver.open()
        got: asyncio.Queue[str] = asyncio.Queue()
        try:
            listening = await receiver.listen(channel, got.put_nowait)
            assert listening is (sender.dialect == "postgresql")
            await sender.notify(channel, "task-1")
            if not listening:
                await asyncio.sleep(0.2)
                assert got.empty()
                return
            assert await asyncio.wait_for(got.get(), 5) == "task-1"
            with pytest.raises(RuntimeError):
                async with sender.transaction():
                    await sender.notify(channel, "rolled-back")
                    raise RuntimeError
            async with sender.transaction():
                await sender.notify(channel, "committed")
                await asyncio.sleep(0.2)
                assert got.empty()  # not before the commit
            assert await asyncio.wait_for(got.get(), 5) == "committed"
            await asyncio.sleep(0.2)
            assert got.empty()
        finally:
            await receiver.close()

    with_db(location, body)


def test_postgresql_listening_comes_back_after_its_connection_is_terminated(postgres_schema: PostgresSchema) -> None:
    name = f"a2a-gate-listen-{postgres_schema.schema}"
    location = postgres_schema.store_url(application_name=name)
    channel = f"a2a_gate_test_{uuid.uuid4().hex[:12]}"

    async def body(db: Database) -> None:
        got: asyncio.Queue[str] = asyncio.Queue()
        assert await db.listen(channel, got.put_nowait)
        killed = await admin(
            postgres_schema.url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            (name,),
        )
        assert killed == [(True,)]
        deadline = time.monotonic() + 10
        while True:  # what is sent while it reconnects is lost (listeners poll too); then it arrives again
            await db.notify(channel, "again")
            with contextlib.suppress(TimeoutError):
                assert await asyncio.wait_for(got.get(), 0.5) == "again"
                break
            assert time.monotonic() < deadline, "the listener did not come back"

    with_db(location, body)


def test_sqlite_checkpoints_its_wal_off_the_serving_connection(tmp_path: Path) -> None:
    """The serving connection never runs a checkpoint inside a commit (a commit in hundreds
    took milliseconds on the event loop); the store's thread copies the WAL back instead."""
    from server import sqlite_store

    path = tmp_path / "store.db"
    others = {t for t in threading.enumerate() if t.name == "sqlite-checkpoint"}  # other tests' stores
    mine: list[threading.Thread] = []

    async def body(db: Database) -> tuple[int, int]:
        assert isinstance(db, sqlite_store.SQLiteDatabase)
        assert db.conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        await db.execute(ROWS)
        for i in range(sqlite_store.CHECKPOINT_WRITES):
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (str(i), i))
        frames = wal_progress(path)
        for _ in range(100):  # bounded: the commits woke the thread
            if frames[0] and frames[0] == frames[1]:
                break
            await asyncio.sleep(0.05)
            frames = wal_progress(path)
        mine.extend(t for t in threading.enumerate() if t.name == "sqlite-checkpoint" and t not in others)
        return frames

    written, copied = with_db(str(path), body)
    assert written > 0 and copied == written, f"{copied} of {written} WAL frames copied back"
    assert mine, "the store ran no checkpoint thread"
    for thread in mine:  # stopped with the store
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_sqlite_wal_starts_over_under_writes_that_never_pause(tmp_path: Path) -> None:
    """A PASSIVE checkpoint alone never finishes while commits keep coming (each pass leaves the
    frames committed meanwhile), and SQLite starts the WAL over only once all are copied: the WAL
    grew by every commit's pages (half a gigabyte in a benchmark). The last pass, with this
    process's writes held, lets the next commit start it over: the WAL stays a few checkpoints long."""
    from server import sqlite_store

    path = tmp_path / "store.db"
    document = "x" * 3000  # a page of its own per row
    commits = 3 * sqlite_store.RESTART_FRAMES  # a frame for the row, one for the key's index, at least

    async def body(db: Database) -> tuple[int, int, int]:
        await db.execute(ROWS)
        longest = restarts = last = 0
        for i in range(commits):
            await db.execute("INSERT INTO t (id, n, doc) VALUES (?, ?, ?)", (str(i), i, document))
            frames = wal_progress(path)[0]
            restarts += frames < last
            longest, last = max(longest, frames), frames
        return longest, restarts, await db.fetchval("SELECT count(*) FROM t")

    longest, restarts, rows = with_db(str(path), body)
    assert rows == commits
    # two frames a commit and more: six times RESTART_FRAMES, had the WAL never started over. How
    # long it grows before each restart depends on when the checkpointer's thread gets a core (a
    # CI machine running the suite on every core reached 22,263 frames): the restarts are the test.
    assert restarts >= 2 and longest < 6 * sqlite_store.RESTART_FRAMES, (longest, restarts)


def wal_progress(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames a checkpoint copied back), from the WAL index (the -shm file):
    the header's mxFrame at byte 16, the checkpoint information's nBackfill at byte 96."""
    shm = path.with_name(path.name + "-shm").read_bytes()
    return int.from_bytes(shm[16:20], sys.byteorder), int.from_bytes(shm[96:100], sys.byteorder)


def test_sqlite_commits_the_writes_of_one_loop_turn_together(tmp_path: Path) -> None:
    """Writes outside a transaction issued in the same turn of the event loop share one commit
    (group commit); each still gets its own rowcount or error, and only after the commit."""

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        await db.execute("INSERT INTO t (id, n) VALUES ('taken', 0)")
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        writes = [db.execute("INSERT INTO t (id, n) VALUES (?, ?)", (f"r{i}", i)) for i in range(8)]
        writes.append(db.execute("INSERT INTO t (id, n) VALUES ('taken', 1)"))  # a duplicate key
        writes.append(db.execute("UPDATE t SET n = 5 WHERE id = 'nobody'"))
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        db.conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert outcomes[:8] == [1] * 8 and outcomes[9] == 0
        assert isinstance(outcomes[8], Exception) and "UNIQUE" in str(outcomes[8])
        assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
        assert await db.fetchval("SELECT count(*) FROM t") == 9
        assert await db.fetchval("SELECT n FROM t WHERE id = 'taken'") == 0

    with_db(str(tmp_path / "store.db"), body)


INSERT = "INSERT INTO t (id, n) VALUES (?, ?)"


def one_commit_traced(tmp_path: Path, writes: Callable[[Database], list[Awaitable[Any]]], check: Callable) -> None:
    """A SQLite table holding a row 'taken'; then `writes` issued in one loop turn (one group commit),
    traced: `check(db, their outcomes, the statements SQLite ran)`."""

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        await db.execute("INSERT INTO t (id, n) VALUES ('taken', 0)")
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        outcomes = await asyncio.gather(*writes(db), return_exceptions=True)
        db.conn.set_trace_callback(None)  # type: ignore[attr-defined]
        await check(db, outcomes, statements)

    with_db(str(tmp_path / "store.db"), body)


def ends_of(statements: list[str]) -> list[str]:
    return [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")]


def test_sqlite_commits_groups_written_together_in_the_loop_turns_commit_each_whole(tmp_path: Path) -> None:
    """`write_together` groups of one loop turn join its group commit: a group that fails after some
    of it applied is undone whole (the commit redone with a savepoint per group), and the writes
    beside it in the same commit stand."""

    def writes(db: Database) -> list[Awaitable[Any]]:
        return [
            db.write_together([(INSERT, ("g1a", 1)), (INSERT, ("g1b", 1))]),
            db.write_together([(INSERT, ("g2a", 2)), (INSERT, ("taken", 2))]),  # its second fails: none of it
            db.execute(INSERT, ("single", 3)),
            db.write_together([(INSERT, ("g3a", 3)), ("UPDATE t SET n = 9 WHERE id = 'nobody'", ())]),
        ]

    async def check(db: Database, outcomes: list[Any], statements: list[str]) -> None:
        assert outcomes[0] == [1, 1] and outcomes[2] == 1 and outcomes[3] == [1, 0]
        assert isinstance(outcomes[1], Exception) and "UNIQUE" in str(outcomes[1])
        rows = await db.fetch("SELECT id FROM t ORDER BY id")
        assert [r["id"] for r in rows] == ["g1a", "g1b", "g3a", "single", "taken"]
        assert ends_of(statements) == ["BEGIN IMMEDIATE", "ROLLBACK", "BEGIN IMMEDIATE", "COMMIT"]  # one, redone
        assert statements.count("SAVEPOINT together") == 3  # in the redo, one a group

    one_commit_traced(tmp_path, writes, check)


def test_sqlite_commits_groups_without_savepoints_unless_one_fails_halfway(tmp_path: Path) -> None:
    """A savepoint a group is what a voucher's writes paid most for beside their statements: a commit
    runs without them, and a group that fails at its first statement needs none (a failed statement
    leaves nothing of itself), so only a group failing after some of it applied costs a redo."""

    def writes(db: Database) -> list[Awaitable[Any]]:
        return [
            db.write_together([(INSERT, ("a1", 1)), ("UPDATE t SET n = n + 1 WHERE id = ?", ("a1",))]),
            db.write_together([(INSERT, ("taken", 2)), (INSERT, ("b2", 2))]),  # fails first: nothing of it
            db.write_together([(INSERT, ("c1", 3)), ("UPDATE t SET n = 9 WHERE id = 'nobody'", ())]),
        ]

    async def check(db: Database, outcomes: list[Any], statements: list[str]) -> None:
        assert outcomes[0] == [1, 1] and outcomes[2] == [1, 0]
        assert isinstance(outcomes[1], Exception) and "UNIQUE" in str(outcomes[1])
        assert ends_of(statements) == ["BEGIN IMMEDIATE", "COMMIT"]
        assert not [s for s in statements if "SAVEPOINT" in s or "RELEASE" in s]
        rows = await db.fetch("SELECT id, n FROM t ORDER BY id")
        assert [(r["id"], r["n"]) for r in rows] == [("a1", 2), ("c1", 3), ("taken", 0)]

    one_commit_traced(tmp_path, writes, check)


def test_sqlite_a_group_whose_file_fails_halfway_is_undone_alone_and_asked_again(tmp_path: Path) -> None:
    """The redo's fault path: a group's second statement failing as the file would (an operational
    error, here raised by a function its SQL calls) fails in the redo too; its savepoint undoes the
    group, which is answered "unavailable, try again", and the writes beside it stand."""

    def writes(db: Database) -> list[Awaitable[Any]]:
        def fail(_: Any) -> int:
            raise OSError("disk I/O error")

        db.conn.create_function("fail", 1, fail)  # type: ignore[attr-defined]
        return [
            db.write_together([(INSERT, ("before", 1))]),
            db.write_together([(INSERT, ("half", 2)), ("UPDATE t SET n = fail(n) WHERE id = ?", ("half",))]),
            db.execute(INSERT, ("after", 3)),
        ]

    async def check(db: Database, outcomes: list[Any], statements: list[str]) -> None:
        assert outcomes[0] == [1] and outcomes[2] == 1
        assert isinstance(outcomes[1], DatabaseUnavailable), outcomes[1]
        rows = await db.fetch("SELECT id FROM t ORDER BY id")
        assert [r["id"] for r in rows] == ["after", "before", "taken"]
        assert ends_of(statements) == ["BEGIN IMMEDIATE", "ROLLBACK", "BEGIN IMMEDIATE", "COMMIT"]

    one_commit_traced(tmp_path, writes, check)


def test_writes_together_commit_whole_or_not_at_all(location: str) -> None:
    """`write_together`: one transaction for independent writes, their rowcounts in order; a
    failing one leaves none of them. Inside a transaction they join it."""

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        counts = await db.write_together(
            [
                ("INSERT INTO t (id, n) VALUES (?, ?)", ("a", 1)),
                ("INSERT INTO t (id, n) VALUES (?, ?)", ("b", 2)),
                ("UPDATE t SET n = n + 10 WHERE id IN (?, ?)", ("a", "nobody")),
            ]
        )
        assert counts == [1, 1, 1]
        with pytest.raises(Exception):  # noqa: B017 -- a duplicate key: the engine's own error
            await db.write_together(
                [("INSERT INTO t (id, n) VALUES (?, ?)", ("c", 3)), ("INSERT INTO t (id, n) VALUES (?, ?)", ("a", 4))]
            )
        assert await db.fetchval("SELECT count(*) FROM t WHERE id = 'c'") == 0
        with pytest.raises(RuntimeError):
            async with db.transaction():
                assert await db.write_together([("UPDATE t SET n = 0 WHERE id = ?", ("b",))]) == [1]
                raise RuntimeError
        assert await db.fetchval("SELECT n FROM t WHERE id = 'b'") == 2  # joined, so rolled back with it
        assert await db.fetchval("SELECT n FROM t WHERE id = 'a'") == 11

    with_db(location, body)


def test_a_group_past_the_drivers_parse_cache_binds_every_value_as_sent(location: str) -> None:
    """A delivery's group is bigger than psycopg keeps the parse of (50 values, 4 KB), so each of
    its statements is bound on its own and their texts joined: values that look like placeholders,
    quotes or statement ends, in SQL that holds a `%` of its own, reach their rows as sent."""
    odd = ["%s", "%(n)s", "100%", "%%", "it's", 'say "hi"', "a\\b", "x; DROP TABLE t; --", "?", "é€𝄞", ""]

    async def body(db: Database) -> None:
        await db.execute(ROWS)
        insert = "INSERT INTO t (id, n, at, doc) SELECT ?, ?, ?, ? || '' WHERE '%' = '%'"
        statements = [(insert, (f"row{i}-{value}", i, i / 3, value * 200)) for i, value in enumerate(odd * 2)]
        assert sum(len(args) for _, args in statements) > 50 and sum(len(a[3]) for _, a in statements) > 4096
        assert await db.write_together(statements) == [1] * len(statements)
        rows = await db.fetch("SELECT id, n, at, doc FROM t ORDER BY n")
        assert [(r["id"], r["n"], r["at"], r["doc"]) for r in rows] == [args for _, args in statements]

    with_db(location, body)


def test_postgres_writes_together_in_one_round_trip(pg_location: str) -> None:
    """BEGIN, the statements and COMMIT travel together. A loopback proxy reads the client's
    side of the protocol and counts what asks the server to answer now: a Sync (the extended
    protocol) or a simple Query. Four INSERTs in a transaction: one."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_location)
    proxy = SyncCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
    through = urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}"))
    through += "&sslmode=disable"

    async def body(db: Database) -> tuple[int, int]:
        await db.execute(ROWS)
        before = proxy.syncs
        await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("one", 0))
        alone = proxy.syncs - before
        before = proxy.syncs
        statements = [("INSERT INTO t (id, n) VALUES (?, ?)", (str(i), i)) for i in range(4)]
        assert await db.write_together(statements) == [1, 1, 1, 1]
        return alone, proxy.syncs - before

    try:
        alone, together = with_db(through, body)
    finally:
        proxy.close()
    assert alone == 1, f"the counter counts {alone} round trips for one statement"
    assert together == 1, f"{together} round trips for BEGIN, 4 INSERTs and COMMIT"


def test_postgres_transactions_send_begin_with_their_first_statement(pg_location: str) -> None:
    """A transaction of two statements is three round trips (BEGIN with the first, the second,
    COMMIT), one that issues nothing is none; and it still commits whole or rolls back."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_location)
    proxy = SyncCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
    through = urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}"))
    through += "&sslmode=disable"

    async def body(db: Database) -> tuple[int, int]:
        await db.execute(ROWS)
        before = proxy.syncs
        async with db.transaction():
            await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("a", 1))
            assert await db.fetchval("SELECT n FROM t WHERE id = ?", ("a",)) == 1
        two = proxy.syncs - before
        before = proxy.syncs
        async with db.transaction():
            pass
        empty = proxy.syncs - before
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await db.execute("INSERT INTO t (id, n) VALUES (?, ?)", ("b", 2))
                raise RuntimeError
        assert [r["id"] for r in await db.fetch("SELECT id FROM t")] == ["a"]
        return two, empty

    try:
        two, empty = with_db(through, body)
    finally:
        proxy.close()
    assert (two, empty) == (3, 0), f"{two} round trips for two statements, {empty} for none"


class SyncCounter:
    """A TCP proxy on loopback to one PostgreSQL, counting the client's Sync and Query messages."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.syncs = 0
        self.closing = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        import socket

        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self.relay, args=(client, server), daemon=True).start()

    def relay(self, client: Any, server: Any) -> None:
        import select

        pending, typed = b"", False  # the client's bytes not yet read as messages; past the startup?
        with client, server:
            while not self.closing:
                ready, _, _ = select.select([client, server], [], [], 0.5)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (server if sock is client else client).sendall(data)
                    if sock is not client:
                        continue
                    pending += data
                    while True:
                        head = 5 if typed else 4
                        if len(pending) < head:
                            break
                        length = int.from_bytes(pending[head - 4 : head], "big")
                        if len(pending) < head - 4 + length:
                            break
                        message, pending = pending[: head - 4 + length], pending[head - 4 + length :]
                        if typed:
                            self.syncs += message[:1] in (b"S", b"Q")
                        elif int.from_bytes(message[4:8], "big") not in (80877103, 80877104):  # not SSL/GSS
                            typed = True  # the startup message: typed messages from now on

    def close(self) -> None:
        self.closing = True
        self.listener.close()
