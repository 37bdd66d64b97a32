"""The one SQLite file that holds tasks and keys (and what is built on the server adds: the
gate's claims and payment log, each created by the module that owns it).

Shared by every worker process through the file (WAL mode), so what one worker writes
(a task, a claim) holds for all of them. Connections are in autocommit mode; multi-statement
changes use `transaction()` with ``BEGIN IMMEDIATE`` so writers serialise early.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlite_utils


def open_database(path: str) -> sqlite_utils.Database:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
    db = sqlite_utils.Database(conn)
    if path != ":memory:":
        db.enable_wal()
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    create_schema(db)
    return db


@contextmanager
def transaction(db: sqlite_utils.Database) -> Iterator[sqlite3.Connection]:
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


logger = logging.getLogger("a2a_gate.database")


async def commit_until_stored(
    db: sqlite_utils.Database, write: Callable[[], None], what: str, patience: float = 300.0
) -> None:
    """Run `write` in one transaction, again until it sticks (a locked or full database).

    For records that must not be lost once money has moved: a settle outcome, and the
    task that shows it. Gives up (raising) only after `patience` seconds.
    """
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            with transaction(db):
                write()
            return
        except sqlite3.Error as exc:
            if time.monotonic() > deadline:
                raise
            logger.warning("storing %s failed (%s), retrying", what, type(exc).__name__)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def create_schema(db: sqlite_utils.Database) -> None:
    """Create tables and indexes if missing; safe to run from every worker at start."""
    tables = set(db.table_names())
    if "tasks" not in tables:
        db.table("tasks").create(
            {
                "id": str,
                "agent": str,
                "context_id": str,
                "state": str,
                "owner": str,  # "key:<name>" for a principal, "payer:<address>" for a payer
                "document": str,  # the Task as JSON, canonical (v0.3) shape
                "backend_ref": str,  # a backend's memory for the task (an upstream's task id)
                "created_at": float,
                "updated_at": float,
                "deadline_at": float,
            },
            pk="id",
            if_not_exists=True,
        )
        db.table("tasks").create_index(["state", "updated_at"], if_not_exists=True)
    # requests awaiting payment are counted per caller
    db.table("tasks").create_index(["owner", "state"], if_not_exists=True)
    # ListTasks: one owner's tasks at one agent, newest first (also added to older files)
    db.table("tasks").create_index(["owner", "agent", "updated_at"], if_not_exists=True)
    if "api_keys" not in tables:
        db.table("api_keys").create(
            {"sha256": str, "name": str, "agents": str, "revoked": int, "created_at": float},
            pk="sha256",
            if_not_exists=True,
        )
