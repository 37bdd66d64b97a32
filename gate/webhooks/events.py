"""What an event says: its id, its type and its body, from what the store already holds.

Three sources, none written on a request's path:
- a payment log row (settle, write_off, needs_attention, channel_refund, channel_claim): the row
  was written in the same transaction as the money change it reports, so the event exists exactly
  when the change does; its id is `log-<row id>`;
- a channel whose payer asked to withdraw while charges are unclaimed (`withdraw_requested_at`,
  set by the channel watcher's mirror of the chain, gate/flows/channel/jobs.py): one event per
  withdrawal request, id `withdrawal-<channel>-<requested at>`;
- the daily summary of a UTC day that has ended (gate/payment_summary.py), id `summary-<day>`.

A body names no token, signature or nonce: a payment is named by the digest the log keeps
(`payment_id`, as `a2a-gate payments records` shows it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gate.flows.channel.store import Channel
from gate.payment_exports import summary_rows, utc
from gate.payment_summary import SummaryRow
from gate.webhooks.config import DAILY_SUMMARY, WITHDRAWAL_AT_RISK


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    body: str  # the JSON text POSTed, the same bytes on every attempt


def _body(event_id: str, event_type: str, created: float, data: dict[str, Any]) -> str:
    document = {"id": event_id, "type": event_type, "created_at": utc(created), "data": data}
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def from_log_row(row: dict[str, Any], event_type: str) -> Event:
    event_id = f"log-{row['id']}"
    data = {
        "payment_id": row["token_digest"] or "",
        "agent": row["agent"] or "",
        "task_id": row["task_id"] or "",
        "payer": row["payer"] or "",
        "scheme": row.get("scheme") or "",
        "amount": row["amount"] or "",
        "authorized": row.get("authorized") or "",
        "network": row["network"] or "",
        "asset": row["asset"] or "",
        "transaction": row["transaction"] or "",
        "error": row["error"] or "",
        "log_id": row["id"],
    }
    return Event(event_id, event_type, _body(event_id, event_type, float(row["at"]), data))


def withdrawal_at_risk(channel: Channel, now: float) -> Event:
    event_id = f"withdrawal-{channel.channel_id}-{channel.withdraw_requested_at}"
    data = {
        "channel_id": channel.channel_id,
        "payer": channel.payer,
        "network": channel.network,
        "asset": channel.asset,
        "receiver": channel.receiver,
        "unclaimed": str(channel.unclaimed),
        "withdraw_requested_at": channel.withdraw_requested_at,
        "finalizable_at": channel.withdraw_requested_at + channel.withdraw_delay,
    }
    return Event(event_id, WITHDRAWAL_AT_RISK, _body(event_id, WITHDRAWAL_AT_RISK, now, data))


def daily_summary(day: str, rows: list[SummaryRow], now: float) -> Event:
    event_id = f"summary-{day}"
    data = {"day": day, "rows": list(summary_rows(rows))}
    return Event(event_id, DAILY_SUMMARY, _body(event_id, DAILY_SUMMARY, now, data))
