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

Every operation is a method here, in portable SQL over `server.database.Database`, and
rows leave as `Claim` values: SQLite and PostgreSQL run the same code, and either
database enforces the unique keys (the claim is an ``INSERT ... ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from server.database import Database, Migration


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


_COLUMNS = (
    "token_digest TEXT PRIMARY KEY,"  # SHA-256 of the canonical token, never the token
    " nonce_key TEXT,"  # network/asset/payer/nonce of an EVM authorization
    " request_digest TEXT,"  # SHA-256 of agent + method + message content
    " agent TEXT, state TEXT, task_id TEXT, payer TEXT,"
    " answer TEXT, owner_pid INTEGER,"  # unused since leases; kept so old files and new agree
    " created_at DOUBLE PRECISION, updated_at DOUBLE PRECISION,"
    # The payload needed to settle later, sealed with a key kept outside the database
    # (gate/sealing.py), erased once settled or released.
    " sealed_payment TEXT"
)
_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS claims_nonce ON claims (nonce_key) WHERE nonce_key != ''",
    "CREATE INDEX IF NOT EXISTS idx_claims_state ON claims (state)",
    "CREATE INDEX IF NOT EXISTS idx_claims_task_id ON claims (task_id)",
    "CREATE INDEX IF NOT EXISTS claims_lease ON claims (state, lease_until)",
)


async def _sqlite_tables(db: Database) -> None:
    """A new file gets the whole table; a file made by older code gains the columns it lacks."""
    await db.execute(f"CREATE TABLE IF NOT EXISTS claims ({_COLUMNS})")
    present = {row["name"] for row in await db.fetch("PRAGMA table_info(claims)")}
    for column, declaration in MIGRATED_COLUMNS.items():
        if column not in present:
            await db.execute(f"ALTER TABLE claims ADD COLUMN {column} {declaration}")
    for statement in _INDEXES:
        await db.execute(statement)


_POSTGRES_TABLES = (
    f"CREATE TABLE IF NOT EXISTS claims ({_COLUMNS},"
    + ",".join(f" {column} {declaration}" for column, declaration in MIGRATED_COLUMNS.items()).replace(
        "REAL", "DOUBLE PRECISION"
    )
    + ")",
    *_INDEXES,
)
MIGRATIONS = (Migration(sqlite=_sqlite_tables, postgresql=_POSTGRES_TABLES),)


class Claims:
    def __init__(self, db: Database, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.db = db
        self.instance = secrets.token_hex(8)  # this process start; never reused
        self.lease_seconds = lease_seconds
        self.held: set[str] = set()  # digests whose work is alive in this process

    async def create_tables(self) -> None:
        await self.db.migrate("claims", MIGRATIONS)

    # -- the request path --------------------------------------------------------

    async def claim(self, token_digest: str, nonce_key: str, request_digest: str, agent: str, sealed: str) -> Outcome:
        now = time.time()
        added = await self.db.execute(
            "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, task_id, payer,"
            " owner_pid, owner_instance, lease_until, created_at, updated_at, sealed_payment)"
            " VALUES (?, ?, ?, ?, ?, '', '', 0, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
        if added:
            self.held.add(token_digest)
            return Outcome("new")
        claim = await self.find(token_digest)
        if claim is None:
            return Outcome("conflict", reason="authorization_nonce_already_used")
        if claim.request_digest != request_digest or claim.agent != agent:
            return Outcome("conflict", claim, reason="payment_already_used")
        if claim.state in LIVE_STATES:
            return Outcome("in_flight", claim)
        return Outcome("replay", claim)

    async def find(self, token_digest: str) -> Claim | None:
        row = await self.db.fetchrow("SELECT * FROM claims WHERE token_digest = ?", (token_digest,))
        return None if row is None else Claim.from_row(row)

    async def bind(self, token_digest: str, payer: str, task_id: str) -> None:
        await self._set(token_digest, payer=payer, task_id=task_id)

    async def release(self, token_digest: str) -> bool:
        """Drop a claim whose work was not delivered; never one that is settling or beyond."""
        self.held.discard(token_digest)
        deleted = await self.db.execute(
            "DELETE FROM claims WHERE token_digest = ? AND state = ?", (token_digest, ClaimState.RUNNING)
        )
        return deleted == 1

    async def mark_delivered(self, token_digest: str, withheld: dict[str, Any] | None = None) -> None:
        """The work is delivered: from now on the claim is settled, owed or written off, never released."""
        await self._set(
            token_digest,
            state=ClaimState.SETTLING,
            owner_instance=self.instance,
            lease_until=time.time() + self.lease_seconds,
            withheld=json.dumps(withheld, separators=(",", ":")) if withheld is not None else "",
        )

    # -- settlement outcomes (callers wrap them in one transaction with the log row) --

    async def settled(self, token_digest: str, receipt: dict[str, Any]) -> None:
        await self._set(
            token_digest,
            state=ClaimState.SETTLED,
            sealed_payment="",
            last_error="",
            receipt=json.dumps(receipt, separators=(",", ":")),
            task_outdated=1,
        )

    async def owed(self, token_digest: str, *, error: str, unknown: bool, passes: int, next_settle_at: float) -> None:
        await self._set(
            token_digest,
            state=ClaimState.SETTLE_FAILED,
            last_error=error[:200],
            settle_unknown=int(unknown),
            settle_passes=passes,
            next_settle_at=next_settle_at,
            task_outdated=1,
        )

    async def terminal(self, token_digest: str, state: ClaimState, error: str) -> None:
        assert state in (ClaimState.UNSETTLED, ClaimState.NEEDS_ATTENTION), state
        await self._set(token_digest, state=state, last_error=error[:200], sealed_payment="", task_outdated=1)

    async def task_synced(self, token_digest: str, *, final: bool) -> None:
        """The stored task now shows the claim's outcome; a final one needs no withheld answer any more."""
        self.held.discard(token_digest)
        if final:
            await self._set(token_digest, task_outdated=0, withheld="")
        else:
            await self._set(token_digest, task_outdated=0)

    def let_go(self, token_digest: str) -> None:
        """Stop renewing: whatever is left (a task to repair) is for whoever finds the lease expired."""
        self.held.discard(token_digest)

    # -- owed work, orphans and repair (the reconciler) ---------------------------

    async def take_owed(self, token_digest: str) -> Claim | None:
        """Move one owed claim to settling for this process; None if someone else did."""
        now = time.time()
        taken = await self.db.execute(
            "UPDATE claims SET state = ?, owner_instance = ?, lease_until = ?, updated_at = ?"
            " WHERE token_digest = ? AND state = ?",
            (ClaimState.SETTLING, self.instance, now + self.lease_seconds, now, token_digest, ClaimState.SETTLE_FAILED),
        )
        if taken != 1:
            return None
        self.held.add(token_digest)
        return await self.find(token_digest)

    async def due(self, *, now: bool = False, limit: int = 100) -> list[Claim]:
        """Owed claims whose next settle attempt is due (all of them with `now`)."""
        rows = await self.db.fetch(
            "SELECT * FROM claims WHERE state = ? AND next_settle_at <= ? ORDER BY next_settle_at LIMIT ?",
            (ClaimState.SETTLE_FAILED, float("inf") if now else time.time(), limit),
        )
        return [Claim.from_row(r) for r in rows]

    async def orphans(self, limit: int = 100) -> list[Claim]:
        """Claims left running or settling by an owner whose lease ran out (it is gone)."""
        rows = await self.db.fetch(
            "SELECT * FROM claims WHERE state IN (?, ?) AND lease_until < ? LIMIT ?",
            (*LIVE_STATES, time.time(), limit),
        )
        return [Claim.from_row(r) for r in rows if r["token_digest"] not in self.held]

    async def take_orphan(self, claim: Claim) -> bool:
        """Become the owner of an orphan, unless its owner renewed or someone else took it."""
        now = time.time()
        taken = await self.db.execute(
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
        return taken == 1

    async def orphan_settling(self, token_digest: str) -> None:
        """A settling claim whose owner died: owed, and its settle may have been sent."""
        await self.owed(token_digest, error="interrupted while settling", unknown=True, passes=0, next_settle_at=0.0)

    async def outdated(self, limit: int = 100) -> list[Claim]:
        """Claims whose outcome never reached their stored task, and whose owner is gone."""
        rows = await self.db.fetch(
            "SELECT * FROM claims WHERE task_outdated = 1 AND state IN (?, ?, ?, ?) AND lease_until < ? LIMIT ?",
            (*FINAL_STATES, ClaimState.SETTLE_FAILED, time.time(), limit),
        )
        return [Claim.from_row(r) for r in rows if r["token_digest"] not in self.held]

    async def renew(self) -> int:
        """Extend the lease of every claim whose work is alive here."""
        if not self.held:
            return 0
        digests = list(self.held)
        marks = ", ".join("?" for _ in digests)
        return await self.db.execute(
            f"UPDATE claims SET lease_until = ? WHERE owner_instance = ? AND token_digest IN ({marks})",
            (time.time() + self.lease_seconds, self.instance, *digests),
        )

    # -- counts and listings -------------------------------------------------------

    async def count(self, *states: ClaimState) -> int:
        marks = ", ".join("?" for _ in states)
        return int(await self.db.fetchval(f"SELECT COUNT(*) FROM claims WHERE state IN ({marks})", states))

    async def count_in_flight(self) -> int:
        return await self.count(*LIVE_STATES)

    async def count_owed(self) -> int:
        return await self.count(ClaimState.SETTLE_FAILED)

    async def listing(self, state: ClaimState, limit: int = 50) -> list[Claim]:
        rows = await self.db.fetch(
            "SELECT * FROM claims WHERE state = ? ORDER BY updated_at DESC LIMIT ?", (state, limit)
        )
        return [Claim.from_row(r) for r in rows]

    async def expire(self, retention_seconds: float) -> None:
        await self.db.execute(
            "DELETE FROM claims WHERE state = ? AND task_outdated = 0 AND updated_at < ?",
            (ClaimState.SETTLED, time.time() - retention_seconds),
        )

    async def _set(self, token_digest: str, **values: Any) -> None:
        values["updated_at"] = time.time()
        columns = ", ".join(f"{k} = ?" for k in values)
        await self.db.execute(f"UPDATE claims SET {columns} WHERE token_digest = ?", (*values.values(), token_digest))
