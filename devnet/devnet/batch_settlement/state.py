"""The contract's storage: a channel's record and a receiver's totals in the ledger's SQLite file
(tables ``bs_*``), the transactions it mined and their logs, and one transaction in flight."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from eth_utils import to_checksum_address

from ..chain import _log
from .abi import Config

if TYPE_CHECKING:
    import sqlite_utils


@dataclass
class ChannelRecord:
    """One channel's stored state (amounts are uint128, kept as Python ints)."""

    channel_id: str
    config: Config
    balance: int = 0
    total_claimed: int = 0
    refund_nonce: int = 0
    withdraw_amount: int = 0
    withdraw_initiated_at: int = 0

    @property
    def payer(self) -> str:
        return self.config[0]

    @property
    def payer_authorizer(self) -> str:
        return self.config[1]

    @property
    def receiver(self) -> str:
        return self.config[2]

    @property
    def receiver_authorizer(self) -> str:
        return self.config[3]

    @property
    def token(self) -> str:
        return self.config[4]

    @property
    def withdraw_delay(self) -> int:
        return self.config[5]

    @property
    def unclaimed(self) -> int:
        return self.balance - self.total_claimed


@dataclass
class Execution:
    """One transaction (or simulation) in flight: its sender, its clock, the logs it emits."""

    db: sqlite_utils.Database
    sender: str
    now: int
    tx_hash: str
    logs: list[tuple[str, list[str], str]] = field(default_factory=list)

    def emit(self, address: str, topics: list[str], data: bytes = b"") -> None:
        self.logs.append((to_checksum_address(address), topics, "0x" + data.hex()))


def create_tables(db: sqlite_utils.Database) -> None:
    db.execute(
        "CREATE TABLE IF NOT EXISTS bs_channels (channel_id TEXT PRIMARY KEY, config TEXT NOT NULL,"
        " balance TEXT NOT NULL, total_claimed TEXT NOT NULL, refund_nonce TEXT NOT NULL,"
        " withdraw_amount TEXT NOT NULL, withdraw_initiated_at INTEGER NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS bs_receivers (receiver TEXT NOT NULL, token TEXT NOT NULL,"
        " total_claimed TEXT NOT NULL, total_settled TEXT NOT NULL, PRIMARY KEY (receiver, token))"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS bs_transactions (tx_hash TEXT PRIMARY KEY, function TEXT NOT NULL,"
        " sender TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS bs_logs (tx_hash TEXT NOT NULL, log_index INTEGER NOT NULL,"
        " address TEXT NOT NULL, topic0 TEXT, topic1 TEXT, topic2 TEXT, topic3 TEXT, data TEXT NOT NULL,"
        " PRIMARY KEY (tx_hash, log_index))"
    )
    db.execute("CREATE INDEX IF NOT EXISTS bs_logs_topic0 ON bs_logs (topic0, topic1)")


def load_channel(db: sqlite_utils.Database, channel_id: str) -> ChannelRecord | None:
    row = db.execute(
        "SELECT config, balance, total_claimed, refund_nonce, withdraw_amount, withdraw_initiated_at"
        " FROM bs_channels WHERE channel_id = ?",
        [channel_id],
    ).fetchone()
    if row is None:
        return None
    stored = json.loads(row[0])
    config = (*stored[:5], int(stored[5]), bytes.fromhex(stored[6]))
    return ChannelRecord(
        channel_id=channel_id,
        config=config,
        balance=int(row[1]),
        total_claimed=int(row[2]),
        refund_nonce=int(row[3]),
        withdraw_amount=int(row[4]),
        withdraw_initiated_at=int(row[5]),
    )


def store_channel(db: sqlite_utils.Database, record: ChannelRecord) -> None:
    config = json.dumps([*record.config[:6], record.config[6].hex()])
    db.execute(
        "INSERT INTO bs_channels (channel_id, config, balance, total_claimed, refund_nonce, withdraw_amount,"
        " withdraw_initiated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (channel_id) DO UPDATE SET"
        " balance = excluded.balance, total_claimed = excluded.total_claimed,"
        " refund_nonce = excluded.refund_nonce, withdraw_amount = excluded.withdraw_amount,"
        " withdraw_initiated_at = excluded.withdraw_initiated_at",
        [
            record.channel_id,
            config,
            str(record.balance),
            str(record.total_claimed),
            str(record.refund_nonce),
            str(record.withdraw_amount),
            record.withdraw_initiated_at,
        ],
    )


def load_receiver(db: sqlite_utils.Database, receiver: str, token: str) -> tuple[int, int]:
    """``receivers(receiver, token)``: (totalClaimed, totalSettled)."""
    row = db.execute(
        "SELECT total_claimed, total_settled FROM bs_receivers WHERE receiver = ? AND token = ?",
        [receiver, token],
    ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def store_receiver(db: sqlite_utils.Database, receiver: str, token: str, claimed: int, settled: int) -> None:
    db.execute(
        "INSERT INTO bs_receivers (receiver, token, total_claimed, total_settled) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (receiver, token) DO UPDATE SET total_claimed = excluded.total_claimed,"
        " total_settled = excluded.total_settled",
        [receiver, token, str(claimed), str(settled)],
    )


def store_transaction(db: sqlite_utils.Database, ex: Execution, function: str) -> None:
    """A mined transaction and the logs it emitted, in order."""
    db.execute(
        "INSERT INTO bs_transactions (tx_hash, function, sender, created_at) VALUES (?, ?, ?, ?)",
        [ex.tx_hash, function, ex.sender, datetime.now(UTC).isoformat()],
    )
    for index, (address, topics, data) in enumerate(ex.logs):
        padded = [*topics, None, None, None, None][:4]
        db.execute(
            "INSERT INTO bs_logs (tx_hash, log_index, address, topic0, topic1, topic2, topic3, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [ex.tx_hash, index, address.lower(), *padded, data],
        )


def log_rows(db: sqlite_utils.Database, where: str, params: list[Any]) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT tx_hash, log_index, address, topic0, topic1, topic2, topic3, data FROM bs_logs"
        f" WHERE {where} ORDER BY rowid",
        params,
    ).fetchall()
    return [_log(r[2], [t for t in r[3:7] if t is not None], r[7], r[0], r[1]) for r in rows]
