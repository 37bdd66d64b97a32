"""Claims: one payment token pays for one request, across every worker and host.

A claim is a row in the shared database, inserted atomically before anything is
executed. Its primary key is the token's digest and a unique index covers the EVM
authorization nonce, so neither the same token nor the same authorization in another
wrapper can claim twice. Verify is a dry run the facilitator passes again and again
until settlement; without this row one signature would buy unlimited work.

Two claims, two homes: this module's is the request's claim on its token, held under a lease
(`Hold`); a payment channel's claim on chain (the vouchers the gate collects from the
settlement contract) is `gate.flows.channel.jobs`'s, and named only there.

States (`ClaimState`): running -> settling -> settled | settle_failed (owed: settling
again later) | unsettled (written off) | needs_attention | no_charge (an upto delivery
charged nothing; kept, since its nonce was never spent on chain). A claim for work that was
not delivered is released: the row goes, and the same token may try again. A claim in
`settling` is never released: its settle call may have been sent.

Ownership is fenced. Whoever inserts a claim, or takes one over (an orphan, an owed
claim), mints a new fence and holds it as a `Hold`; every later write names the fence
and the state it expects, and a write that changes no row raises `ClaimLost`: the
claim is someone else's now, so the work it covered must not be delivered, settled
or released by us. The owner renews a lease while the work is alive; a claim in
`running` or `settling` whose lease ran out is an orphan, whatever any pid says (pid 1
in a container is always "alive"). Lease time is the database's clock
(`Database.clock_sql`), never a process's own, so a replica whose clock is off
neither steals live claims nor is fooled about its own.

Every operation is a method here, in portable SQL over `server.database.Database`, and
rows leave as `Claim` values: SQLite and PostgreSQL run the same code, and either
database enforces the unique keys (the claim is an ``INSERT ... ON CONFLICT DO NOTHING``).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from server import json_text
from server.database import Database, DatabaseUnavailable, Migration, Statement
from server.ids import random_bytes

# A write that belongs with a claim's update: given the condition "the claim is still ours, in
# the state just written" (SQL and its arguments), the statement that applies only under it.
Along = Callable[[tuple[str, tuple[Any, ...]]], Statement]


def and_where(statement: Statement, condition: tuple[str, Sequence[Any]]) -> Statement:
    """`statement` (its WHERE clause last) with one more condition."""
    return f"{statement[0]} AND {condition[0]}", (*statement[1], *condition[1])


def only_if(statement: Statement) -> Along:
    """`statement` (a task's save, a channel's write: its WHERE clause last) as a write that belongs
    with a claim's update, applying only under its condition."""
    return lambda ours: and_where(statement, ours)


logger = logging.getLogger("a2a_gate.claims")


class ClaimState(StrEnum):
    RUNNING = "running"
    SETTLING = "settling"
    SETTLED = "settled"
    SETTLE_FAILED = "settle_failed"  # owed: delivered, settlement to be retried
    UNSETTLED = "unsettled"  # terminal: delivered, not paid, written off
    NEEDS_ATTENTION = "needs_attention"  # terminal until an operator re-opens it
    NO_CHARGE = "no_charge"  # terminal: delivered, charged nothing (an upto usage priced at 0, or unpriceable)


LIVE_STATES = (ClaimState.RUNNING, ClaimState.SETTLING)
FINAL_STATES = (ClaimState.SETTLED, ClaimState.UNSETTLED, ClaimState.NEEDS_ATTENTION, ClaimState.NO_CHARGE)
RECORDED_STATES = (*FINAL_STATES, ClaimState.SETTLE_FAILED)  # a settle pass's outcome is on the claim
ANY_STATE = tuple(ClaimState)  # "ours, whatever it is doing": made once, not by iterating the enum each write
EVERY_STATE = frozenset(ANY_STATE)
# no pass will ever change these (needs_attention may be re-opened: it keeps what a payment needs)
ENDED_STATES = (ClaimState.SETTLED, ClaimState.UNSETTLED, ClaimState.NO_CHARGE)
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
    "fence": "TEXT NOT NULL DEFAULT ''",  # minted at the insert and at every takeover
    "last_write": "TEXT NOT NULL DEFAULT ''",  # minted by each update sent with others (`Claims._write`)
    # the payer's x402 `payment-identifier` (gate/payment_ids.py), unique, and the payer the payment
    # named when it was claimed (its verified payer is `payer`, once bound)
    "payment_id": "TEXT NOT NULL DEFAULT ''",
    "payment_id_payer": "TEXT NOT NULL DEFAULT ''",
}


@dataclass(frozen=True)
class Hold:
    """This process's right to write one claim: the fence minted when it inserted or took it."""

    token_digest: str
    fence: str


class Unmet(Exception):
    """A fenced write's own condition (`provided`) did not hold; the claim is still ours, unchanged."""


class ClaimLost(Exception):
    """A fenced write changed no row: the claim was taken over (or ended) elsewhere."""

    def __init__(self, hold: Hold, write: str) -> None:
        super().__init__(f"claim {hold.token_digest[:12]} is no longer ours ({write})")
        self.hold = hold
        self.write = write


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
    fence: str = ""
    payment_id: str = ""
    payment_id_payer: str = ""

    @property
    def id_payer(self) -> str:
        """The payer a payment identifier is bound to: the verified one, or the one named until verified."""
        return self.payer or self.payment_id_payer

    @property
    def hold(self) -> Hold:
        return Hold(self.token_digest, self.fence)

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
            fence=row["fence"] or "",
            payment_id=row.get("payment_id") or "",
            payment_id_payer=row.get("payment_id_payer") or "",
        )


@dataclass(frozen=True)
class Outcome:
    kind: str  # new | replay | in_flight | conflict | identified (`claim`: the first payment under its id)
    claim: Claim | None = None
    reason: str = ""
    hold: Hold | None = None  # for "new": the fence every later write of this request names
    along: tuple[int, ...] = ()  # for "new": the rowcounts of the writes sent with the claim


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
_NONCE_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS claims_nonce ON claims (nonce_key) WHERE nonce_key != ''"
_LEASE_INDEX = "CREATE INDEX IF NOT EXISTS claims_lease ON claims (state, lease_until)"
# made by the first version, dropped since (the last step): its only reader also asks for a state,
# which claims_lease finds; it cost each paid request about 15-30 us of its two writes, in a replay
_TASK_ID_INDEX = "CREATE INDEX IF NOT EXISTS idx_claims_task_id ON claims (task_id)"
# one claim per payment identifier; a payment without one adds nothing to this index
_PAYMENT_ID_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS claims_payment_id ON claims (payment_id) WHERE payment_id != ''"


async def _sqlite_tables(db: Database) -> None:
    """A new file gets the whole table; a file made by older code gains the columns it lacks."""
    await db.execute(f"CREATE TABLE IF NOT EXISTS claims ({_COLUMNS})")
    present = {row["name"] for row in await db.fetch("PRAGMA table_info(claims)")}
    for column, declaration in MIGRATED_COLUMNS.items():
        if column not in present:
            await db.execute(f"ALTER TABLE claims ADD COLUMN {column} {declaration}")
    for statement in (_NONCE_INDEX, _LEASE_INDEX, _PAYMENT_ID_INDEX):
        await db.execute(statement)


_POSTGRES_TABLES = (
    f"CREATE TABLE IF NOT EXISTS claims ({_COLUMNS},"
    + ",".join(f" {column} {declaration}" for column, declaration in MIGRATED_COLUMNS.items()).replace(
        "REAL", "DOUBLE PRECISION"
    )
    + ")",
    _NONCE_INDEX,
    _TASK_ID_INDEX,
    _LEASE_INDEX,
)
MIGRATIONS = (
    Migration(sqlite=_sqlite_tables, postgresql=_POSTGRES_TABLES),
    # the fence (a PostgreSQL database made by the first version lacks it; SQLite gains it above)
    Migration(
        sqlite=_sqlite_tables,
        postgresql=("ALTER TABLE claims ADD COLUMN IF NOT EXISTS fence TEXT NOT NULL DEFAULT ''",),
    ),
    # the id of the last update sent with other writes
    Migration(
        sqlite=_sqlite_tables,
        postgresql=("ALTER TABLE claims ADD COLUMN IF NOT EXISTS last_write TEXT NOT NULL DEFAULT ''",),
    ),
    # (state) alone: claims_lease (state, lease_until) answers every query by state, one index less per write
    Migration(("DROP INDEX IF EXISTS idx_claims_state",)),
    # payment identifiers (x402 `payment-identifier`): the id, unique, and the payer it is bound to
    Migration(
        sqlite=_sqlite_tables,
        postgresql=(
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS payment_id TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE claims ADD COLUMN IF NOT EXISTS payment_id_payer TEXT NOT NULL DEFAULT ''",
            _PAYMENT_ID_INDEX,
        ),
    ),
    # a claim is found by its task only with its state (`reopen`): claims_lease answers that
    Migration(("DROP INDEX IF EXISTS idx_claims_task_id",)),
)


def mint_fence() -> str:
    """A fence (or a write's name): 8 random bytes from the server's block of the OS CSPRNG, as its
    ids are (`server.ids`): two a paid request, where `os.urandom` made each a system call."""
    return random_bytes(8).hex()


class Claims:
    def __init__(
        self,
        db: Database,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        on_lost: Callable[[ClaimLost], None] = lambda lost: None,
    ) -> None:
        self.db = db
        self.instance = secrets.token_hex(8)  # this process start; never reused
        self.lease_seconds = lease_seconds
        self.held: dict[str, str] = {}  # digest -> fence, for the claims whose work is alive here
        # told of every claim found lost (the gate logs and counts it)
        self.on_lost = on_lost  # a write (or a renewal) found a claim of ours taken over

    @property
    def now(self) -> str:
        """The database's clock, in SQL: every lease and schedule is judged by it."""
        return self.db.clock_sql

    async def create_tables(self) -> None:
        await self.db.migrate("claims", MIGRATIONS)

    async def database_time(self) -> float:
        return float(await self.db.fetchval(f"SELECT {self.now} AS now"))

    # -- the request path --------------------------------------------------------

    async def claim(
        self,
        token_digest: str,
        nonce_key: str,
        request_digest: str,
        agent: str,
        sealed: str,
        *,
        along: Sequence[Along] = (),
        payment_id: str = "",
        named_payer: str = "",
    ) -> Outcome:
        """Take the request's claim, unless its token (or its nonce, or its `payment_id`) is claimed
        already. `along`: writes sent with it that apply only if this claim was just taken (a channel's
        reservation); their rowcounts come back in the outcome. `named_payer`: the payer the payment
        names, its id's until the verified one is bound."""
        fence = mint_fence()
        values: tuple[Any, ...] = (
            token_digest,
            nonce_key,
            request_digest,
            agent,
            ClaimState.RUNNING,
            self.instance,
            fence,
            self.lease_seconds,
            sealed,
        )
        if payment_id:  # (a payment without one sends the statement it always did)
            identified = (", payment_id, payment_id_payer", ", ?, ?")
            values = (*values, payment_id, named_payer.lower())
        else:
            identified = ("", "")
        insert = (
            "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, task_id, payer,"
            f" owner_pid, owner_instance, fence, lease_until, created_at, updated_at, sealed_payment{identified[0]})"
            f" VALUES (?, ?, ?, ?, ?, '', '', 0, ?, ?, {self.now} + ?, {self.now}, {self.now}, ?{identified[1]})"
            " ON CONFLICT DO NOTHING",
            values,
        )
        if along:
            ours = self._ours(Hold(token_digest, fence), (ClaimState.RUNNING,))
            added, *counts = await self.db.write_together([insert, *(statement(ours) for statement in along)])
        else:
            added, counts = await self.db.execute(*insert), []
        if added:
            self.held[token_digest] = fence
            return Outcome("new", hold=Hold(token_digest, fence), along=tuple(counts))
        claim = await self.find(token_digest)
        if claim is None and payment_id:
            first = await self.find_by_payment_id(payment_id)
            if first is not None:  # (else its nonce is another claim's, or the first was just released)
                return Outcome("identified", first)
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

    async def find_by_payment_id(self, payment_id: str) -> Claim | None:
        """The claim of the payment that first came with this payment identifier, while it lives."""
        row = await self.db.fetchrow("SELECT * FROM claims WHERE payment_id = ? AND payment_id != ''", (payment_id,))
        return None if row is None else Claim.from_row(row)

    async def bind(self, hold: Hold, payer: str, task_id: str) -> None:
        """Name the payer and the task; the execution may already have delivered (any state)."""
        await self._write(hold, "bind", ANY_STATE, payer=payer, task_id=task_id)

    def ours(self, hold: Hold) -> tuple[str, tuple[Any, ...]]:
        """The condition "this claim is still ours" (in any state), for a row written only while it is."""
        return self._ours(hold, ANY_STATE)

    def bind_statement(self, hold: Hold, payer: str, task_id: str) -> Statement:
        """`bind` as a statement to send with the task's INSERT (`Database.write_together`). Its
        rowcount is not read: a claim lost by then fails the delivery's fenced write instead."""
        return self._update(hold, ANY_STATE, {"payer": payer, "task_id": task_id})

    async def release(self, hold: Hold) -> None:
        """Drop a claim whose work was not delivered; never one that is settling or beyond
        (that raises `ClaimLost`, as does a claim taken over by someone else)."""
        self.held.pop(hold.token_digest, None)
        deleted = await self.db.execute(
            "DELETE FROM claims WHERE token_digest = ? AND fence = ? AND state = ?",
            (hold.token_digest, hold.fence, ClaimState.RUNNING),
        )
        if deleted != 1:
            self._lost(hold, "release")

    async def mark_delivered(
        self,
        hold: Hold,
        withheld: dict[str, Any] | None = None,
        *,
        payer: str = "",
        task_id: str = "",
        sealed: str = "",
        along: Sequence[Along] = (),
    ) -> None:
        """The work is delivered: from now on the claim is settled, owed or written off, never released.
        It names the payer and the task again, so a replay finds them whatever became of `bind`; `sealed`
        replaces the sealed payment with what this delivery is charged (an upto charge)."""
        named: dict[str, Any] = {"payer": payer, "task_id": task_id} if task_id else {}
        if sealed:
            named["sealed_payment"] = sealed
        await self._write(
            hold,
            "mark_delivered",
            (ClaimState.RUNNING,),
            state=ClaimState.SETTLING,
            **named,
            withheld=json_text.dumps(withheld) if withheld is not None else "",
            lease=True,
            along=along,
        )

    async def delivered_settled(
        self,
        hold: Hold,
        receipt: dict[str, Any],
        *,
        payer: str,
        task_id: str,
        along: Sequence[Along] = (),
        first: Sequence[Along] = (),
        provided: Statement | None = None,
    ) -> None:
        """Delivered, settled and synced in one write, for a payment the gate charges itself (a
        channel's voucher): `mark_delivered`, `settled` and `task_synced` at once, on the same
        conditions as `settled`; the task's final form goes `along`."""
        await self._write(
            hold,
            "mark_delivered",
            (ClaimState.RUNNING,),
            state=ClaimState.SETTLED,
            payer=payer,
            task_id=task_id,
            withheld="",
            sealed_payment="",
            last_error="",
            receipt=json_text.dumps(receipt),
            task_outdated=0,
            lease=True,
            along=along,
            first=first,
            provided=provided,
        )
        self.held.pop(hold.token_digest, None)

    async def recharge(self, hold: Hold, sealed: str, along: Sequence[Along] = ()) -> None:
        """More of a delivery delivered (an upto answer, chunk by chunk): the sealed charge grows with it."""
        await self._write(hold, "recharge", (ClaimState.SETTLING,), sealed_payment=sealed, lease=True, along=along)

    # -- settlement outcomes (callers wrap them in one transaction with the log row) --

    async def settled(
        self,
        hold: Hold,
        receipt: dict[str, Any],
        along: Sequence[Along] = (),
        *,
        first: Sequence[Along] = (),
        provided: Statement | None = None,
    ) -> None:
        """Settled. `first` and `provided`: a write this outcome stands on (a channel's charge), sent
        ahead of it on the condition that the claim is ours, and the condition that it applied."""
        await self._write(
            hold,
            "settled",
            (ClaimState.SETTLING,),
            state=ClaimState.SETTLED,
            sealed_payment="",
            last_error="",
            receipt=json_text.dumps(receipt),
            task_outdated=1,
            along=along,
            first=first,
            provided=provided,
        )

    async def owed(
        self, hold: Hold, *, error: str, unknown: bool, passes: int, delay: float, along: Sequence[Along] = ()
    ) -> None:
        """Owed: the next pass is due `delay` seconds from now, by the database's clock."""
        await self._write(
            hold,
            "owed",
            (ClaimState.SETTLING,),
            state=ClaimState.SETTLE_FAILED,
            last_error=error[:200],
            settle_unknown=int(unknown),
            settle_passes=passes,
            next_settle_in=delay,
            task_outdated=1,
            along=along,
        )

    async def no_charge(self, hold: Hold, receipt: dict[str, Any], error: str, along: Sequence[Along] = ()) -> None:
        """Delivered and charged nothing: terminal, kept (its nonce, unspent on chain, must buy nothing more)."""
        await self._write(
            hold,
            "no_charge",
            (ClaimState.SETTLING,),
            state=ClaimState.NO_CHARGE,
            sealed_payment="",
            last_error=error[:200],
            receipt=json_text.dumps(receipt),
            task_outdated=1,
            along=along,
        )

    async def terminal(self, hold: Hold, state: ClaimState, error: str, along: Sequence[Along] = ()) -> None:
        assert state in (ClaimState.UNSETTLED, ClaimState.NEEDS_ATTENTION), state
        # needs_attention keeps its sealed payment: an operator may re-open it (`reopen`)
        sealed: dict[str, Any] = {"sealed_payment": ""} if state == ClaimState.UNSETTLED else {}
        await self._write(
            hold,
            str(state),
            (ClaimState.SETTLING,),
            state=state,
            last_error=error[:200],
            task_outdated=1,
            along=along,
            **sealed,
        )

    async def task_synced(self, hold: Hold, *, final: bool, along: Sequence[Along] = ()) -> None:
        """The stored task now shows the claim's outcome; a final one needs no withheld answer any more."""
        self.held.pop(hold.token_digest, None)
        extra: dict[str, Any] = {"withheld": ""} if final else {}
        await self._write(hold, "task_synced", RECORDED_STATES, task_outdated=0, along=along, **extra)

    def let_go(self, hold: Hold) -> None:
        """Stop renewing: whatever is left (a task to repair) is for whoever finds the lease expired."""
        if self.held.get(hold.token_digest) == hold.fence:
            del self.held[hold.token_digest]

    # -- owed work, orphans and repair (the reconciler) ---------------------------

    async def take_owed(self, token_digest: str, *, due_only: bool = True) -> Claim | None:
        """Move one owed claim to settling for this process, under a new fence; None if it is
        not owed (any more), someone else took it, or (with `due_only`) its next pass is not due."""
        fence = mint_fence()
        schedule = f" AND next_settle_at <= {self.now}" if due_only else ""
        taken = await self.db.execute(
            f"UPDATE claims SET state = ?, owner_instance = ?, fence = ?, lease_until = {self.now} + ?,"
            f" updated_at = {self.now} WHERE token_digest = ? AND state = ?{schedule}",
            (
                ClaimState.SETTLING,
                self.instance,
                fence,
                self.lease_seconds,
                token_digest,
                ClaimState.SETTLE_FAILED,
            ),
        )
        if taken != 1:
            return None
        self.held[token_digest] = fence
        claim = await self.find(token_digest)
        return claim if claim is not None and claim.fence == fence else None

    async def put_back(self, hold: Hold, error: str, delay: float) -> None:
        """An owed claim we took but could not settle (a bug, a key we cannot use): owed again,
        its lease released, due `delay` seconds from now; its pass count unchanged."""
        self.held.pop(hold.token_digest, None)
        await self._write(
            hold,
            "put_back",
            (ClaimState.SETTLING,),
            state=ClaimState.SETTLE_FAILED,
            owner_instance="",
            lease_until=0.0,
            last_error=error[:200],
            next_settle_in=delay,
        )

    async def reopen(self, task_id: str | None = None) -> int:
        """`needs_attention` back to owed with a fresh pass budget (an operator fixed what was
        missing, an `rpc_url` say); every such claim, or the one of `task_id`. Returns how many."""
        where, args = "state = ?", [str(ClaimState.NEEDS_ATTENTION)]
        if task_id is not None:
            where, args = (where + " AND task_id = ?", [*args, task_id])
        return await self.db.execute(
            f"UPDATE claims SET state = ?, settle_passes = 0, next_settle_at = {self.now}, fence = ?,"
            f" updated_at = {self.now} WHERE {where} AND sealed_payment != ''",
            (ClaimState.SETTLE_FAILED, mint_fence(), *args),
        )

    async def due(self, *, now: bool = False, limit: int = 100) -> list[Claim]:
        """Owed claims whose next settle attempt is due (all of them with `now`)."""
        schedule = "" if now else f" AND next_settle_at <= {self.now}"
        rows = await self.db.fetch(
            f"SELECT * FROM claims WHERE state = ?{schedule} ORDER BY next_settle_at LIMIT ?",
            (ClaimState.SETTLE_FAILED, limit),
        )
        return [Claim.from_row(r) for r in rows]

    async def orphans(self, limit: int = 100) -> list[Claim]:
        """Claims left running or settling by an owner whose lease ran out (it is gone, or stalled)."""
        rows = await self.db.fetch(
            f"SELECT * FROM claims WHERE state IN (?, ?) AND lease_until < {self.now} LIMIT ?",
            (*LIVE_STATES, limit),
        )
        return [Claim.from_row(r) for r in rows if self.held.get(r["token_digest"]) != r["fence"]]

    async def take_orphan(self, claim: Claim) -> Hold | None:
        """Become the owner of an orphan under a new fence, unless its owner renewed or someone
        else took it; from then on its previous owner can write nothing to it."""
        return await self._take_lapsed(claim)

    async def orphan_settling(self, hold: Hold) -> None:
        """A settling claim whose owner is gone: owed now, and its settle may have been sent."""
        self.held.pop(hold.token_digest, None)
        await self.owed(hold, error="interrupted while settling", unknown=True, passes=0, delay=0.0)

    async def outdated(self, limit: int = 100) -> list[Claim]:
        """Claims whose outcome never reached their stored task, and whose owner is gone."""
        marks = ", ".join("?" for _ in RECORDED_STATES)
        rows = await self.db.fetch(
            f"SELECT * FROM claims WHERE task_outdated = 1 AND state IN ({marks}) AND lease_until < {self.now} LIMIT ?",
            (*RECORDED_STATES, limit),
        )
        return [Claim.from_row(r) for r in rows if self.held.get(r["token_digest"]) != r["fence"]]

    async def take_outdated(self, claim: Claim) -> Hold | None:
        """Take a claim whose task needs repair, like an orphan (same fence rule)."""
        return await self._take_lapsed(claim, " AND task_outdated = 1")

    async def _take_lapsed(self, claim: Claim, condition: str = "") -> Hold | None:
        """The one takeover of a claim whose lease ran out: a new fence, unless the row changed since
        `claim` was read (its owner renewed, someone else took it) or fails `condition`."""
        fence = mint_fence()
        taken = await self.db.execute(
            f"UPDATE claims SET owner_instance = ?, fence = ?, lease_until = {self.now} + ?, updated_at = {self.now}"
            f" WHERE token_digest = ? AND fence = ? AND state = ? AND lease_until < {self.now}{condition}",
            (self.instance, fence, self.lease_seconds, claim.token_digest, claim.fence, claim.state),
        )
        if taken != 1:
            return None
        self.held[claim.token_digest] = fence
        return Hold(claim.token_digest, fence)

    async def renew(self) -> list[Hold]:
        """Extend the lease of every claim whose work is alive here; returns the ones found lost
        (taken over after their lease lapsed, as when this process stalled past it)."""
        if not self.held:
            return []
        holds = [Hold(d, f) for d, f in self.held.items()]
        marks = ", ".join("?" for _ in holds)
        digests = [h.token_digest for h in holds]
        renewed = await self.db.execute(
            f"UPDATE claims SET lease_until = {self.now} + ? WHERE owner_instance = ? AND token_digest IN ({marks})",
            (self.lease_seconds, self.instance, *digests),
        )
        if renewed == len(holds):
            return []
        rows = await self.db.fetch(
            f"SELECT token_digest, fence FROM claims WHERE token_digest IN ({marks})", tuple(digests)
        )
        fences = {r["token_digest"]: r["fence"] for r in rows}
        lost = [h for h in holds if fences.get(h.token_digest) != h.fence and self.held.get(h.token_digest) == h.fence]
        for hold in lost:
            del self.held[hold.token_digest]
            self.on_lost(ClaimLost(hold, "renew"))
        return lost

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
            f"DELETE FROM claims WHERE state = ? AND task_outdated = 0 AND updated_at < {self.now} - ?",
            (ClaimState.SETTLED, retention_seconds),
        )

    async def _write(
        self,
        hold: Hold,
        write: str,
        expected: tuple[ClaimState, ...],
        *,
        along: Sequence[Along] = (),
        first: Sequence[Along] = (),
        provided: Statement | None = None,
        **values: Any,
    ) -> None:
        """One fenced update: names the fence and the states it expects; no row changed is `ClaimLost`.

        `lease=True` renews the lease with the write; `next_settle_in` schedules the next pass
        that many seconds from now, both by the database's clock. `along`: writes that belong
        with it (the task it delivers, its payment log row), sent in the same transaction and,
        on PostgreSQL, the same round trip; each applies only if this update did, so a lost
        claim writes nothing at all; nor does a retry of a write that landed (its answer lost):
        the update names itself (`last_write`) and `along` asks for that name. `first`: writes
        sent ahead of it, each applying only while the claim is ours in `expected`; `provided`:
        one more condition of the update (that they applied, say), whose failing, the claim
        still ours, is `Unmet`."""
        values = {**values, "last_write": mint_fence()}
        update = self._update(hold, expected, values)
        if provided is not None:
            update = and_where(update, provided)
        try:
            if not along and not first:
                changed = await self.db.execute(*update)
            else:
                ahead = [statement(self._ours(hold, expected)) for statement in first]
                ours = self._ours(hold, (values["state"],) if "state" in values else expected, values["last_write"])
                statements = [*ahead, update, *(statement(ours) for statement in along)]
                changed = (await self.db.write_together(statements))[len(ahead)]
        except DatabaseUnavailable:
            if await self._landed(hold, values["last_write"]):
                return  # it committed, and only its answer was lost on the way back
            raise
        if changed != 1:
            if provided is not None and await self._still(hold, expected):
                raise Unmet(write)
            if "state" in values and await self._still(hold, (values["state"],)):
                return  # our own earlier attempt landed (its answer was lost): the fence says nobody else
            self._lost(hold, write)

    async def _landed(self, hold: Hold, write: str) -> bool:
        """Whether the update named `write` is on the claim (asked once; no answer is a no)."""
        try:
            found = await self.db.fetchval(
                "SELECT last_write FROM claims WHERE token_digest = ? AND fence = ?", (hold.token_digest, hold.fence)
            )
        except DatabaseUnavailable:
            return False
        return bool(found == write)

    async def _still(self, hold: Hold, states: tuple[ClaimState, ...]) -> bool:
        """Whether the claim is ours, in one of `states`, now."""
        claim = await self.find(hold.token_digest)
        return claim is not None and claim.fence == hold.fence and claim.state in states

    def _ours(self, hold: Hold, states: tuple[ClaimState, ...], write: str = "") -> tuple[str, tuple[Any, ...]]:
        """The condition "this claim is still ours, in one of `states`" (and, with `write`, changed
        by that update), for writes sent with its update."""
        in_states, states = state_condition(states)
        by = " AND last_write = ?" if write else ""
        return (
            f"EXISTS (SELECT 1 FROM claims WHERE token_digest = ? AND fence = ?{in_states}{by})",
            (hold.token_digest, hold.fence, *states, *((write,) if write else ())),
        )

    def _update(self, hold: Hold, expected: tuple[ClaimState, ...], values: dict[str, Any]) -> Statement:
        columns = [f"{k} = ?" for k in values if k not in ("lease", "next_settle_in")]
        args: list[Any] = [v for k, v in values.items() if k not in ("lease", "next_settle_in")]
        if values.get("lease"):
            columns.append(f"lease_until = {self.now} + ?")
            args.append(self.lease_seconds)
        if "next_settle_in" in values:
            columns.append(f"next_settle_at = {self.now} + ?")
            args.append(values["next_settle_in"])
        columns.append(f"updated_at = {self.now}")
        in_states, expected = state_condition(expected)
        return (
            f"UPDATE claims SET {', '.join(columns)} WHERE token_digest = ? AND fence = ?{in_states}",
            (*args, hold.token_digest, hold.fence, *expected),
        )

    def _lost(self, hold: Hold, write: str) -> None:
        if self.held.get(hold.token_digest) == hold.fence:
            del self.held[hold.token_digest]
        lost = ClaimLost(hold, write)
        self.on_lost(lost)
        raise lost


@functools.lru_cache(maxsize=64)  # the code's own few sets of states: a voucher's writes ask five times
def state_condition(states: tuple[ClaimState, ...]) -> tuple[str, tuple[ClaimState, ...]]:
    """`AND state IN (...)` for a claim expected in `states`, and its values; nothing for every state
    (a claim is always in one): SQLite builds the list's lookup table on every run of a statement,
    which made a "this claim is ours" probe twice as slow as the fence alone."""
    if EVERY_STATE.issubset(states):
        return "", ()
    return f" AND state IN ({', '.join('?' for _ in states)})", states
