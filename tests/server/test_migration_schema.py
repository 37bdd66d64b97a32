"""Every component's migration steps, held to what they were: the SQL each step runs on each
engine (an existing database upgrades exactly as it always did: same versions, same order, same
statements), and the schema a fresh SQLite file and a fresh PostgreSQL schema end up with
(tables, columns, indexes).

Both are compared with `tests/support/migration_schema.json`. A new migration step changes it
on purpose: regenerate it with `python -m tests.server.test_migration_schema` (PostgreSQL running, as
for the tests) and review the difference like any other schema change.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gate import claims, payment_log, sealing, sign_in
from gate.flows.channel import store as channels
from gate.webhooks import outbox as webhooks
from server import principals, request_counts, tasks
from server.database import Database, Migration
from server.engines import open_database
from tests.support.services import PostgresSchema, postgres_url

SNAPSHOT = Path(__file__).parents[1] / "support" / "migration_schema.json"
DIALECTS = ("sqlite", "postgresql")
# (component, its steps), in the order a gate creates its tables
COMPONENTS: tuple[tuple[str, Sequence[Migration]], ...] = (
    ("tasks", tasks.MIGRATIONS),
    ("api_keys", principals.MIGRATIONS),
    ("request_counts", request_counts.MIGRATIONS),
    ("claims", claims.MIGRATIONS),
    ("payments", payment_log.MIGRATIONS),
    ("channels", channels.MIGRATIONS),
    ("sign_in", sign_in.MIGRATIONS),
    ("sealing", sealing.MIGRATIONS),
    ("webhooks", webhooks.MIGRATIONS),
)


def step_sql(step: Migration, dialect: str) -> list[str] | str:
    """What a step runs on one engine: its statements, or the function it calls, by name."""
    statements = step.statements(dialect)
    if callable(statements):
        return f"{statements.__module__}.{statements.__qualname__}"
    return list(statements)


def steps() -> dict[str, dict[str, list[list[str] | str]]]:
    return {
        name: {dialect: [step_sql(step, dialect) for step in migrations] for dialect in DIALECTS}
        for name, migrations in COMPONENTS
    }


async def migrate_all(db: Database) -> None:
    for name, migrations in COMPONENTS:
        assert await db.migrate(name, migrations) == len(migrations)


async def sqlite_schema(db: Database) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for table in await db.fetch("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        name = table["name"]
        columns = [
            f"{c['name']} {c['type']} not null={c['notnull']} default={c['dflt_value']} pk={c['pk']}"
            for c in await db.fetch(f"PRAGMA table_info({name})")
        ]
        indexes = {
            i["name"]: i["sql"]
            for i in await db.fetch(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? ORDER BY name", (name,)
            )
        }
        tables[name] = {"columns": columns, "indexes": indexes}
    return tables


async def postgresql_schema(db: Database, schema: str) -> dict[str, Any]:
    tables: dict[str, Any] = {}
    for table in await db.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY table_name", (schema,)
    ):
        name = table["table_name"]
        columns = [
            f"{c['column_name']} {c['data_type']} nullable={c['is_nullable']}"
            f" default={strip(c['column_default'], schema)}"
            for c in await db.fetch(
                "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns"
                " WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
                (schema, name),
            )
        ]
        indexes = {
            i["indexname"]: strip(i["indexdef"], schema)
            for i in await db.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = ? AND tablename = ? ORDER BY indexname",
                (schema, name),
            )
        }
        tables[name] = {"columns": columns, "indexes": indexes}
    return tables


def strip(sql: str | None, schema: str) -> str | None:
    """A definition without the test's own schema name in it."""
    return None if sql is None else re.sub(rf'"?{re.escape(schema)}"?\.', "", sql)


async def fresh_schema(location: str, dialect: str, schema: str = "") -> dict[str, Any]:
    db = open_database(location)
    await db.open()
    try:
        await migrate_all(db)
        await migrate_all(db)  # a second start finds every component current
        return await (sqlite_schema(db) if dialect == "sqlite" else postgresql_schema(db, schema))
    finally:
        await db.close()


def snapshot() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def test_every_step_runs_the_sql_it_always_ran() -> None:
    assert steps() == snapshot()["steps"]


def test_a_fresh_sqlite_file_gets_the_schema_it_always_got(tmp_path: Path) -> None:
    schema = asyncio.run(fresh_schema(str(tmp_path / "store.db"), "sqlite"))
    assert schema == snapshot()["schema"]["sqlite"]


def test_a_fresh_postgresql_schema_gets_the_schema_it_always_got(postgres_schema: PostgresSchema) -> None:
    schema = asyncio.run(fresh_schema(postgres_schema.store_url(), "postgresql", postgres_schema.schema))
    assert schema == snapshot()["schema"]["postgresql"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_engine_without_an_override_runs_the_portable_statements(dialect: str) -> None:
    portable = ("CREATE TABLE t (id TEXT)",)
    other = ("CREATE TABLE t (id BIGINT)",)
    assert Migration(portable).statements(dialect) == portable
    overridden = Migration(portable, **{dialect: other})
    assert overridden.statements(dialect) == other
    assert overridden.statements(next(d for d in DIALECTS if d != dialect)) == portable


def write_snapshot() -> None:
    """Regenerate the snapshot from the code as it is (see the module's docstring)."""
    import psycopg

    schema = f"a2a_gate_snapshot_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            postgresql = asyncio.run(
                fresh_schema(PostgresSchema(postgres_url(), schema).store_url(), "postgresql", schema)
            )
        finally:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    with tempfile.TemporaryDirectory() as directory:
        sqlite = asyncio.run(fresh_schema(str(Path(directory) / "store.db"), "sqlite"))
    document = {"steps": steps(), "schema": {"sqlite": sqlite, "postgresql": postgresql}}
    SNAPSHOT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_snapshot()
    sys.exit(0)
