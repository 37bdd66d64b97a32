"""The payment log: append-only rows, the operator's record of every charge and refusal.

Actions: verify, reject, release (not delivered, not charged), settle (charged; the
transaction), settle_failed (one settle pass failed, retried later), write_off
(terminal: delivered, not paid), needs_attention (terminal: unknown, an operator must
look), replay. Each row names the token by its digest only; rows are never updated or
deleted by the gate.
"""

from __future__ import annotations

import time

import sqlite_utils

ACTIONS = ("verify", "reject", "settle", "settle_failed", "write_off", "needs_attention", "replay", "release")


def create_table(db: sqlite_utils.Database) -> None:
    """Create the payments table and its indexes if missing; safe from every worker at start."""
    tables = set(db.table_names())
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


class PaymentLog:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db
        create_table(db)

    def append(
        self,
        action: str,
        *,
        agent: str,
        token_digest: str,
        payer: str = "",
        amount: str = "",
        network: str = "",
        asset: str = "",
        task_id: str = "",
        transaction: str = "",
        error: str = "",
    ) -> None:
        assert action in ACTIONS, action
        self.db.conn.execute(
            "INSERT INTO payments (at, action, agent, task_id, token_digest, payer, amount, network, asset,"
            ' "transaction", error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
            (
                time.time(),
                action,
                agent,
                task_id,
                token_digest,
                payer,
                amount,
                network,
                asset,
                transaction,
                error[:200],
            ),
        )

    def rows(
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
        return list(self.db.query(sql, [*args, limit]))
