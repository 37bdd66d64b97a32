"""Exports: payment records and the daily summary as CSV or JSON, for an accounting system.

Each export is rows (`record_rows`, `summary_rows`: plain dicts of text and integers, in the column
order below, which only ever grows at its end) and an encoding (`encoded`: CSV lines, or a JSON array
written an object a line), both generators, so the command writes them to a file as they come and an
HTTP handler can stream the same chunks. Amounts are exact integers in the asset's atomic units, as
decimal text (no float ever holds one: a uint256 does not fit), always beside their asset and network;
times are UTC, ISO 8601 with milliseconds and a `Z`. Nothing secret is in any column: a payment is
named by its token's digest, never by the token, its signature or its nonce.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from gate.payment_records import PaymentRecord
from gate.payment_summary import COUNTS, SummaryRow

FORMATS = ("csv", "json")
RECORD_COLUMNS = (
    "payment_id",
    "state",
    "agent",
    "task_id",
    "payer",
    "scheme",
    "network",
    "asset",
    "amount",
    "authorized",
    "collected",
    "transaction",
    "channel",
    "started_at",
    "verified_at",
    "delivered_at",
    "settled_at",
    "updated_at",
    "settle_failures",
    "error",
    "reasons",
)
SUMMARY_COLUMNS = (
    "day",
    "agent",
    "network",
    "asset",
    "revenue",
    "authorized",
    *(name.replace(" ", "_") for name in COUNTS),
)


def utc(epoch: float | None) -> str:
    """A time as the exports write it ("" for a step that did not happen)."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_row(record: PaymentRecord) -> dict[str, Any]:
    row = {column: getattr(record, column) for column in RECORD_COLUMNS if column != "reasons"}
    for column in ("started_at", "verified_at", "delivered_at", "settled_at", "updated_at"):
        row[column] = utc(row[column])
    row["reasons"] = "; ".join(record.reasons)
    return row


async def record_rows(records: AsyncIterable[PaymentRecord]) -> AsyncIterator[dict[str, Any]]:
    async for record in records:
        yield record_row(record)


def summary_rows(rows: Iterable[SummaryRow]) -> Iterator[dict[str, Any]]:
    for row in rows:
        line: dict[str, Any] = {
            "day": row.day,
            "agent": row.agent,
            "network": row.network,
            "asset": row.asset,
            "revenue": str(row.revenue),
            "authorized": str(row.authorized),
        }
        line.update({name.replace(" ", "_"): row.count(name) for name in COUNTS})
        yield line


async def encoded(rows: AsyncIterable[dict[str, Any]], columns: tuple[str, ...], fmt: str) -> AsyncIterator[str]:
    """The rows as text chunks: CSV (a header line, then a line a row), or a JSON array (an object a line)."""
    assert fmt in FORMATS, fmt
    if fmt == "csv":
        yield _csv_line(columns)
        async for row in rows:
            yield _csv_line([row[column] for column in columns])
        return
    yield "["
    first = True
    async for row in rows:
        yield ("\n" if first else ",\n") + json.dumps({column: row[column] for column in columns}, ensure_ascii=False)
        first = False
    yield "\n]\n"


def _csv_line(values: Iterable[Any]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(values)
    return out.getvalue()


async def each(rows: Iterable[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """Rows already in hand, as the encoder takes them."""
    for row in rows:
        yield row
