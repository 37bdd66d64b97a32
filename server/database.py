"""The one SQLite file that holds tasks, keys, claims and the payment log.

Shared by every worker process through the file (WAL mode), which is what makes a
claim hold across workers. Connections are in autocommit mode; multi-statement
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


async def commit_until_stored(db: sqlite_utils.Database, write: Callable[[], None], what: str,
                              patience: float = 300.0) -> None:
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
    if "claims" not in tables:
        db.table("claims").create(
            {
                "token_digest": str,  # SHA-256 of the canonical token, never the token
                "nonce_key": str,  # network/asset/payer/nonce of an EVM authorization
                "request_digest": str,  # SHA-256 of agent + method + message content
                "agent": str,
                "state": str,  # running | delivered | settle_failed | settled | released
                "task_id": str,
                "payer": str,
                "answer": str,  # stored JSON-RPC answer for replays
                "owner_pid": int,
                "created_at": float,
                "updated_at": float,
                # The payload needed to settle later, sealed with a key kept outside the
                # database (gate/sealing.py), erased once settled or released.
                "sealed_payment": str,
            },
            pk="token_digest",
            if_not_exists=True,
        )
        db.conn.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS claims_nonce ON claims(nonce_key) WHERE nonce_key != ''"
        )
        db.table("claims").create_index(["state"], if_not_exists=True)
        db.table("claims").create_index(["task_id"], if_not_exists=True)
    if "payments" not in tables:
        db.table("payments").create(
            {
                "id": int,
                "at": float,
                "action": str,  # verify | reject | settle | settle_failed | replay | release
                "agent": str,
                "task_id": str,
                "token_digest": str,
                "payer": str,
                "amount": str,
                "network": str,
                "asset": str,
                "transaction": str,
                "error": str,
            },
            pk="id",
            if_not_exists=True,
        )
        db.table("payments").create_index(["token_digest"], if_not_exists=True)
        db.table("payments").create_index(["action", "at"], if_not_exists=True)
