"""Claims: one payment token pays for one request, across every worker.

A claim is a row in the shared SQLite file, inserted atomically before anything is
executed. Its primary key is the token's digest and a unique index covers the EVM
authorization nonce, so neither the same token nor the same authorization in another
wrapper can claim twice. Verify is a dry run the facilitator passes again and again
until settlement; without this row one signature would buy unlimited work.

States: running -> settling -> settled | settle_failed (-> settling again, by the
reconciler or the payer's retry). A claim for work that was not delivered is
released: the row goes, and the same token may try again.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import sqlite_utils

RUNNING, SETTLING, SETTLED, SETTLE_FAILED = "running", "settling", "settled", "settle_failed"


@dataclass(frozen=True)
class Outcome:
    kind: str  # new | replay | in_flight | conflict
    row: dict[str, Any] | None = None
    reason: str = ""


class Claims:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db
        self.pid = os.getpid()

    def claim(self, token_digest: str, nonce_key: str, request_digest: str, agent: str, sealed: str) -> Outcome:
        now = time.time()
        try:
            self.db.conn.execute(
                "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, task_id, payer,"
                " owner_pid, created_at, updated_at, sealed_payment) VALUES (?, ?, ?, ?, ?, '', '', ?, ?, ?, ?)",
                (token_digest, nonce_key, request_digest, agent, RUNNING, self.pid, now, now, sealed),
            )
            return Outcome("new")
        except sqlite3.IntegrityError:
            pass
        row = self.find(token_digest)
        if row is None:
            return Outcome("conflict", reason="authorization_nonce_already_used")
        if row["request_digest"] != request_digest or row["agent"] != agent:
            return Outcome("conflict", row, reason="payment_already_used")
        if row["state"] in (SETTLED, SETTLE_FAILED):
            return Outcome("replay", row)
        return Outcome("in_flight", row)

    def find(self, token_digest: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM claims WHERE token_digest = ?", [token_digest]))
        return rows[0] if rows else None

    def bind(self, token_digest: str, payer: str, task_id: str) -> None:
        self._set(token_digest, payer=payer, task_id=task_id)

    def release(self, token_digest: str) -> None:
        self.db.conn.execute("DELETE FROM claims WHERE token_digest = ?", (token_digest,))

    def settling(self, token_digest: str) -> None:
        self._set(token_digest, state=SETTLING, owner_pid=self.pid)

    def settled(self, token_digest: str) -> None:
        self._set(token_digest, state=SETTLED, sealed_payment="")

    def settle_failed(self, token_digest: str) -> None:
        self._set(token_digest, state=SETTLE_FAILED)

    def take_owed(self, token_digest: str) -> bool:
        """Move one settle_failed claim to settling for this process; False if someone else did."""
        cursor = self.db.conn.execute(
            "UPDATE claims SET state = ?, owner_pid = ?, updated_at = ? WHERE token_digest = ? AND state = ?",
            (SETTLING, self.pid, time.time(), token_digest, SETTLE_FAILED),
        )
        return cursor.rowcount == 1

    def owed(self, older_than: float = 0.0, limit: int = 100) -> list[dict[str, Any]]:
        """Delivered work whose settlement has not succeeded yet."""
        return list(
            self.db.query(
                "SELECT * FROM claims WHERE state = ? AND updated_at <= ? ORDER BY updated_at LIMIT ?",
                [SETTLE_FAILED, time.time() - older_than, limit],
            )
        )

    def orphans(self) -> list[dict[str, Any]]:
        """Claims left running or settling by a process that is gone (a crash)."""
        rows = self.db.query("SELECT * FROM claims WHERE state IN (?, ?)", [RUNNING, SETTLING])
        return [r for r in rows if r["owner_pid"] != self.pid and not pid_alive(r["owner_pid"])]

    def count_in_flight(self) -> int:
        return self.db.conn.execute("SELECT COUNT(*) FROM claims WHERE state IN (?, ?)", (RUNNING, SETTLING)).fetchone()[0]

    def count_owed(self) -> int:
        return self.db.conn.execute("SELECT COUNT(*) FROM claims WHERE state = ?", (SETTLE_FAILED,)).fetchone()[0]

    def expire(self, retention_seconds: float) -> None:
        self.db.conn.execute(
            "DELETE FROM claims WHERE state = ? AND updated_at < ?", (SETTLED, time.time() - retention_seconds)
        )

    def _set(self, token_digest: str, **values: Any) -> None:
        values["updated_at"] = time.time()
        columns = ", ".join(f"{k} = ?" for k in values)
        self.db.conn.execute(f"UPDATE claims SET {columns} WHERE token_digest = ?", (*values.values(), token_digest))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
