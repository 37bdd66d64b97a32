"""Claims: one payment token pays for one request, across every worker and host.

A claim is a row in the shared database, inserted atomically before anything is
executed. Its primary key is the token's digest and a unique index covers the EVM
authorization nonce, so neither the same token nor the same authorization in another
wrapper can claim twice. Verify is a dry run the facilitator passes again and again
until settlement; without this row one signature would buy unlimited work.

States (`ClaimState`): running -> settling -> settled | settle_failed (owed: settling
again later) | unsettled (written off) | needs_attention. A claim for work that was
not delivered is released: the row goes, and the same token may try again. A claim in
`settling` is never released: its settle call may have been sent.

Ownership is an instance id (random per process start) and a lease the owner renews
while the work is alive. A claim in `running` or `settling` whose lease ran out is an
orphan, whatever any pid says: pid 1 in a container is always "alive".

Every operation is a method here and rows leave as `Claim` values, so the store can
move to another database behind the same interface.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import sqlite_utils


class ClaimState(StrEnum):
    RUNNING = "running"
    SETTLING = "settling"
    SETTLED = "settled"
    SETTLE_FAILED = "settle_failed"  # owed: delivered, settlement to be retried
    UNSETTLED = "unsettled"  # terminal: delivered, not paid, written off
    NEEDS_ATTENTION = "needs_attention"  # terminal: unknown, an operator must look


LIVE_STATES = (ClaimState.RUNNING, ClaimState.SETTLING)
FINAL_STATES = (ClaimState.SETTLED, ClaimState.UNSETTLED, ClaimState.NEEDS_ATTENTION)
DEFAULT_LEASE_SECONDS = 30.0

# Columns added after the first release; existing files gain them on start.
MIGRATED_COLUMNS = {
    "owner_instance": "TEXT NOT NULL DEFAULT ''",
    "lease_until": "REAL NOT NULL DEFAULT 0",
    "settle_passes": "INTEGER NOT NULL DEFAULT 0",  # owed passes that did not settle
    "settle_unknown": "INTEGER NOT NULL DEFAULT 0",  # 1: an earlier attempt may have landed
    "next_settle_at": "REAL NOT NULL DEFAULT 0",
    "last_error": "TEXT NOT NULL DEFAULT ''",
    "receipt": "TEXT NOT NULL DEFAULT ''",  # the settle response (JSON), once settled
    "task_outdated": "INTEGER NOT NULL DEFAULT 0",  # 1: the outcome is not on the stored task yet
    "withheld": "TEXT NOT NULL DEFAULT ''",  # a withholding agent's answer (JSON) until paid
}


@dataclass(frozen=True)
class Claim:
    """One claim row, typed."""

    token_digest: str
    nonce_key: str
    request_digest: str
    agent: str
    state: ClaimState
    task_id: str
    payer: str
    sealed_payment: str
    owner_instance: str = ""
    lease_until: float = 0.0
    settle_passes: int = 0
    settle_unknown: bool = False
    next_settle_at: float = 0.0
    last_error: str = ""
    receipt: dict[str, Any] = field(default_factory=dict)
    task_outdated: bool = False
    withheld: dict[str, Any] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Claim:
        return cls(
            token_digest=row["token_digest"],
            nonce_key=row["nonce_key"] or "",
            request_digest=row["request_digest"],
            agent=row["agent"],
            state=ClaimState(row["state"]),
            task_id=row["task_id"] or "",
            payer=row["payer"] or "",
            sealed_payment=row["sealed_payment"] or "",
            owner_instance=row["owner_instance"] or "",
            lease_until=row["lease_until"] or 0.0,
            settle_passes=row["settle_passes"] or 0,
            settle_unknown=bool(row["settle_unknown"]),
            next_settle_at=row["next_settle_at"] or 0.0,
            last_error=row["last_error"] or "",
            receipt=json.loads(row["receipt"]) if row["receipt"] else {},
            task_outdated=bool(row["task_outdated"]),
            withheld=json.loads(row["withheld"]) if row["withheld"] else None,
            created_at=row["created_at"] or 0.0,
            updated_at=row["updated_at"] or 0.0,
        )


@dataclass(frozen=True)
class Outcome:
    kind: str  # new | replay | in_flight | conflict
    claim: Claim | None = None
    reason: str = ""


def create_table(db: sqlite_utils.Database) -> None:
    """Create the claims table and its indexes if missing; safe from every worker at start."""
    tables = set(db.table_names())
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
        db.conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS claims_nonce ON claims(nonce_key) WHERE nonce_key != ''")
        db.table("claims").create_index(["state"], if_not_exists=True)
        db.table("claims").create_index(["task_id"], if_not_exists=True)


def migrate(db: sqlite_utils.Database) -> None:
    """Add the columns newer code needs to a claims table made by older code (idempotent)."""
    present = {row[1] for row in db.conn.execute("PRAGMA table_info(claims)")}
    for column, declaration in MIGRATED_COLUMNS.items():
        if column not in present:
            try:
                db.conn.execute(f"ALTER TABLE claims ADD COLUMN {column} {declaration}")
            except sqlite3.OperationalError as exc:  # another worker added it first
                if "duplicate column" not in str(exc):
                    raise
    db.conn.execute("CREATE INDEX IF NOT EXISTS claims_lease ON claims(state, lease_until)")


class Claims:
    def __init__(self, db: sqlite_utils.Database, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.db = db
        self.instance = secrets.token_hex(8)  # this process start; never reused
        self.lease_seconds = lease_seconds
        self.held: set[str] = set()  # digests whose work is alive in this process
        create_table(db)
        migrate(db)

    # -- the request path --------------------------------------------------------

    def claim(self, token_digest: str, nonce_key: str, request_digest: str, agent: str, sealed: str) -> Outcome:
        now = time.time()
        try:
            self.db.conn.execute(
                "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, task_id, payer,"
                " owner_pid, owner_instance, lease_until, created_at, updated_at, sealed_payment)"
                " VALUES (?, ?, ?, ?, ?, '', '', 0, ?, ?, ?, ?, ?)",
                (
                    token_digest,
                    nonce_key,
                    request_digest,
                    agent,
                    ClaimState.RUNNING,
                    self.instance,
                    now + self.lease_seconds,
                    now,
                    now,
                    sealed,
                ),
            )
            self.held.add(token_digest)
            return Outcome("new")
        except sqlite3.IntegrityError:
            pass
        claim = self.find(token_digest)
        if claim is None:
            return Outcome("conflict", reason="authorization_nonce_already_used")
        if claim.request_digest != request_digest or claim.agent != agent:
            return Outcome("conflict", claim, reason="payment_already_used")
        if claim.state in LIVE_STATES:
            return Outcome("in_flight", claim)
        return Outcome("replay", claim)

    def find(self, token_digest: str) -> Claim | None:
        rows = list(self.db.query("SELECT * FROM claims WHERE token_digest = ?", [token_digest]))
        return Claim.from_row(rows[0]) if rows else None

    def bind(self, token_digest: str, payer: str, task_id: str) -> None:
        self._set(token_digest, payer=payer, task_id=task_id)

    def release(self, token_digest: str) -> bool:
        """Drop a claim whose work was not delivered; never one that is settling or beyond."""
        self.held.discard(token_digest)
        cursor = self.db.conn.execute(
            "DELETE FROM claims WHERE token_digest = ? AND state = ?", (token_digest, ClaimState.RUNNING)
        )
        return cursor.rowcount == 1

    def mark_delivered(self, token_digest: str, withheld: dict[str, Any] | None = None) -> None:
        """The work is delivered: from now on the claim is settled, owed or written off, never released."""
        self._set(
            token_digest,
            state=ClaimState.SETTLING,
            owner_instance=self.instance,
            lease_until=time.time() + self.lease_seconds,
            withheld=json.dumps(withheld, separators=(",", ":")) if withheld is not None else "",
        )

    # -- settlement outcomes (callers wrap them in one transaction with the log row) --

    def settled(self, token_digest: str, receipt: dict[str, Any]) -> None:
        self._set(
            token_digest,
            state=ClaimState.SETTLED,
            sealed_payment="",
            last_error="",
            receipt=json.dumps(receipt, separators=(",", ":")),
            task_outdated=1,
        )

    def owed(self, token_digest: str, *, error: str, unknown: bool, passes: int, next_settle_at: float) -> None:
        self._set(
            token_digest,
            state=ClaimState.SETTLE_FAILED,
            last_error=error[:200],
            settle_unknown=int(unknown),
            settle_passes=passes,
            next_settle_at=next_settle_at,
            task_outdated=1,
        )

    def terminal(self, token_digest: str, state: ClaimState, error: str) -> None:
        assert state in (ClaimState.UNSETTLED, ClaimState.NEEDS_ATTENTION), state
        self._set(token_digest, state=state, last_error=error[:200], sealed_payment="", task_outdated=1)

    def task_synced(self, token_digest: str, *, final: bool) -> None:
        """The stored task now shows the claim's outcome; a final one needs no withheld answer any more."""
        self.held.discard(token_digest)
        if final:
            self._set(token_digest, task_outdated=0, withheld="")
        else:
            self._set(token_digest, task_outdated=0)

    def let_go(self, token_digest: str) -> None:
        """Stop renewing: whatever is left (a task to repair) is for whoever finds the lease expired."""
        self.held.discard(token_digest)

    # -- owed work, orphans and repair (the reconciler) ---------------------------

    def take_owed(self, token_digest: str) -> Claim | None:
        """Move one owed claim to settling for this process; None if someone else did."""
        now = time.time()
        cursor = self.db.conn.execute(
            "UPDATE claims SET state = ?, owner_instance = ?, lease_until = ?, updated_at = ?"
            " WHERE token_digest = ? AND state = ?",
            (ClaimState.SETTLING, self.instance, now + self.lease_seconds, now, token_digest, ClaimState.SETTLE_FAILED),
        )
        if cursor.rowcount != 1:
            return None
        self.held.add(token_digest)
        return self.find(token_digest)

    def due(self, *, now: bool = False, limit: int = 100) -> list[Claim]:
        """Owed claims whose next settle attempt is due (all of them with `now`)."""
        rows = self.db.query(
            "SELECT * FROM claims WHERE state = ? AND next_settle_at <= ? ORDER BY next_settle_at LIMIT ?",
            [ClaimState.SETTLE_FAILED, float("inf") if now else time.time(), limit],
        )
        return [Claim.from_row(r) for r in rows]

    def orphans(self, limit: int = 100) -> list[Claim]:
        """Claims left running or settling by an owner whose lease ran out (it is gone)."""
        rows = self.db.query(
            "SELECT * FROM claims WHERE state IN (?, ?) AND lease_until < ? LIMIT ?",
            [*LIVE_STATES, time.time(), limit],
        )
        return [Claim.from_row(r) for r in rows if r["token_digest"] not in self.held]

    def take_orphan(self, claim: Claim) -> bool:
        """Become the owner of an orphan, unless its owner renewed or someone else took it."""
        now = time.time()
        cursor = self.db.conn.execute(
            "UPDATE claims SET owner_instance = ?, lease_until = ?, updated_at = ?"
            " WHERE token_digest = ? AND owner_instance = ? AND lease_until = ? AND lease_until < ?",
            (
                self.instance,
                now + self.lease_seconds,
                now,
                claim.token_digest,
                claim.owner_instance,
                claim.lease_until,
                now,
            ),
        )
        return cursor.rowcount == 1

    def orphan_settling(self, token_digest: str) -> None:
        """A settling claim whose owner died: owed, and its settle may have been sent."""
        self.owed(token_digest, error="interrupted while settling", unknown=True, passes=0, next_settle_at=0.0)

    def outdated(self, limit: int = 100) -> list[Claim]:
        """Claims whose outcome never reached their stored task, and whose owner is gone."""
        rows = self.db.query(
            "SELECT * FROM claims WHERE task_outdated = 1 AND state IN (?, ?, ?, ?) AND lease_until < ? LIMIT ?",
            [*FINAL_STATES, ClaimState.SETTLE_FAILED, time.time(), limit],
        )
        return [Claim.from_row(r) for r in rows if r["token_digest"] not in self.held]

    def renew(self) -> int:
        """Extend the lease of every claim whose work is alive here."""
        if not self.held:
            return 0
        digests = list(self.held)
        marks = ", ".join("?" for _ in digests)
        cursor = self.db.conn.execute(
            f"UPDATE claims SET lease_until = ? WHERE owner_instance = ? AND token_digest IN ({marks})",
            (time.time() + self.lease_seconds, self.instance, *digests),
        )
        return cursor.rowcount

    # -- counts and listings -------------------------------------------------------

    def count(self, *states: ClaimState) -> int:
        marks = ", ".join("?" for _ in states)
        return self.db.conn.execute(f"SELECT COUNT(*) FROM claims WHERE state IN ({marks})", states).fetchone()[0]

    def count_in_flight(self) -> int:
        return self.count(*LIVE_STATES)

    def count_owed(self) -> int:
        return self.count(ClaimState.SETTLE_FAILED)

    def listing(self, state: ClaimState, limit: int = 50) -> list[Claim]:
        rows = self.db.query("SELECT * FROM claims WHERE state = ? ORDER BY updated_at DESC LIMIT ?", [state, limit])
        return [Claim.from_row(r) for r in rows]

    def expire(self, retention_seconds: float) -> None:
        self.db.conn.execute(
            "DELETE FROM claims WHERE state = ? AND task_outdated = 0 AND updated_at < ?",
            (ClaimState.SETTLED, time.time() - retention_seconds),
        )

    def _set(self, token_digest: str, **values: Any) -> None:
        values["updated_at"] = time.time()
        columns = ", ".join(f"{k} = ?" for k in values)
        self.db.conn.execute(f"UPDATE claims SET {columns} WHERE token_digest = ?", (*values.values(), token_digest))
