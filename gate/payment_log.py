"""The payment log: append-only rows, the operator's record of every charge and refusal.

Actions: verify, reject, release (not delivered, not charged), settle (charged; the
transaction), settle_failed (one settle pass failed, retried later), write_off
(terminal: delivered, not paid), needs_attention (terminal: unknown, an operator must
look), no_charge (terminal: an upto delivery charged nothing), replay; and for payment channels
channel_claim, channel_claim_failed, channel_settle and channel_refund (the gate's own
transactions on the settlement contract). `amount` is what the row's payment is charged (an upto
delivery's priced usage), `authorized` what its payer signed for (the same, but for an upto
ceiling), `scheme` the x402 scheme it was paid in (empty on rows written before the column). Each
row names the token by its digest only; rows are never updated or deleted by the gate. What a
payment became, read from its rows, is `gate.payment_records`'.
"""

from __future__ import annotations

import time
from typing import Any

from server.database import Database, Migration, Statement

ACTIONS = (
    "verify",
    "reject",
    "settle",
    "settle_failed",
    "write_off",
    "needs_attention",
    "replay",
    "release",
    "no_charge",
    # payment channels (`batch-settlement`): the gate's own transactions on the settlement contract
    "channel_claim",  # vouchers claimed on chain (the transaction; amount: what it added to the claimed total)
    "channel_claim_failed",  # a claim that did not land, or whose outcome the facilitator could not say
    "channel_settle",  # claimed funds swept to payTo
    "channel_refund",  # an idle channel's unclaimed balance returned to its payer
)


_COLUMNS = (
    " at DOUBLE PRECISION,"
    " action TEXT,"  # one of ACTIONS
    " agent TEXT, task_id TEXT, token_digest TEXT, payer TEXT, amount TEXT, network TEXT, asset TEXT,"
    ' "transaction" TEXT, error TEXT'
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_payments_token_digest ON payments (token_digest)",
    "CREATE INDEX IF NOT EXISTS idx_payments_action_at ON payments (action, at)",
)
_TABLE = "CREATE TABLE IF NOT EXISTS payments (id {key} PRIMARY KEY,{columns})"
MIGRATIONS = (
    Migration(
        sqlite=(_TABLE.format(key="INTEGER", columns=_COLUMNS), *_INDEXES),
        postgresql=(_TABLE.format(key="BIGSERIAL", columns=_COLUMNS), *_INDEXES),
    ),
    Migration.add_columns("payments", ("authorized TEXT NOT NULL DEFAULT ''",)),  # what the payer authorized (upto)
    # the scheme a row's payment is in: a record says it, and tells a channel's charge from a settlement
    Migration.add_columns("payments", ("scheme TEXT NOT NULL DEFAULT ''",)),
)


_ROW_COLUMNS = (
    'at, action, agent, task_id, token_digest, payer, amount, authorized, network, asset, scheme, "transaction", error'
)
_ROW_MARKS = ["?"] * len(_ROW_COLUMNS.split(","))  # one a column, as `statement` orders its values
_INSERT = f"INSERT INTO payments ({_ROW_COLUMNS}) VALUES ({', '.join(_ROW_MARKS)})"
# the same row as a SELECT, for a condition: typed like the columns (PostgreSQL reads an untyped
# literal of a SELECT list as text)
_INSERT_SELECT = (
    f"INSERT INTO payments ({_ROW_COLUMNS}) SELECT CAST(? AS DOUBLE PRECISION), {', '.join(_ROW_MARKS[1:])}"
)


class PaymentLog:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_tables(self) -> None:
        await self.db.migrate("payments", MIGRATIONS)

    async def append(self, action: str, **fields: Any) -> None:
        await self.db.execute(*self.statement(action, **fields))

    def statement(
        self,
        action: str,
        *,
        agent: str,
        token_digest: str,
        payer: str = "",
        amount: str = "",
        authorized: str = "",
        network: str = "",
        asset: str = "",
        scheme: str = "",
        task_id: str = "",
        transaction: str = "",
        error: str = "",
        only_if: tuple[str, tuple[Any, ...]] | None = None,
    ) -> Statement:
        """The row's INSERT, to send with other writes; `only_if` (SQL and its arguments): the
        row is written only when that condition holds as the statement runs."""
        assert action in ACTIONS, action
        values = (
            time.time(),
            action,
            agent,
            task_id,
            token_digest,
            payer,
            amount,
            authorized or amount,
            network,
            asset,
            scheme,
            transaction,
            error[:200],
        )
        if only_if is None:
            return _INSERT, values
        condition, condition_args = only_if
        return f"{_INSERT_SELECT} WHERE {condition}", (*values, *condition_args)

    async def rows(
        self, *, agent: str | None = None, payer: str | None = None, action: str | None = None, limit: int = 50
    ) -> list[dict]:
        where, args = [], []
        for column, value in (("agent", agent), ("payer", payer.lower() if payer else None), ("action", action)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        sql = (
            "SELECT * FROM payments" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        )
        return await self.db.fetch(sql, [*args, limit])
