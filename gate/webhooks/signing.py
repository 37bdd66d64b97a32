"""Webhook signatures: HMAC-SHA256 over the event id, a timestamp and the body, as Stripe and
Standard Webhooks sign theirs, so a receiver can tell our events from forgeries and replays.

Three headers travel with each POST: the event's id (`A2A-Gate-Event-Id`, the same on every retry:
a receiver deduplicates on it), the time of this attempt (`A2A-Gate-Timestamp`, Unix seconds: a
receiver refuses old ones), and `A2A-Gate-Signature: v1=<hex>`, the HMAC of `{id}.{timestamp}.{body}`
with the endpoint's secret. A secret variable may hold several secrets separated by commas (a
rotation): each signs, and the header lists one `v1=` per secret, separated by spaces. The
receiving side's check is in docs/operations.md ("Webhooks"), and a test runs exactly those lines.
"""

from __future__ import annotations

import hashlib
import hmac

EVENT_ID = "A2A-Gate-Event-Id"
TIMESTAMP = "A2A-Gate-Timestamp"
SIGNATURE = "A2A-Gate-Signature"


def secrets_of(value: str) -> list[str]:
    """The secrets a variable holds: one, or several separated by commas (during a rotation)."""
    return [s.strip() for s in value.split(",") if s.strip()]


def signature(secrets: list[str], event_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{event_id}.{timestamp}.".encode() + body
    return " ".join("v1=" + hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets)


def headers(secrets: list[str], event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers one delivery attempt carries."""
    return {
        "Content-Type": "application/json",
        EVENT_ID: event_id,
        TIMESTAMP: str(timestamp),
        SIGNATURE: signature(secrets, event_id, timestamp, body),
    }
