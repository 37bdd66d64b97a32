"""Payment records: one per payment (a token, a voucher increment, a usage charge), with its whole story.

A record says what became of one payment: refused, verified, delivered, then settled, owed, written
off, needing attention or charged nothing (a voucher: charged to its channel, then settled when the
channel's claim on chain covers it), or released undelivered; an idle channel's refund is a record of
its own. It names the payer, agent, task, scheme, network, asset, the amount charged and the amount
authorized, the transaction that moved the money, when each step happened and the reason of every
refusal or failure. The payment log (`gate.payment_log`) stays the audit trail; a console, the exports
(`gate.payment_exports`) and webhooks read records.

Records are derived when they are read, never written: from the payment log (every step of a payment
is one of its rows, written in the same transaction as the change it reports, and keyed by the
token's digest) and the claims table (a claim still alive says where a payment stands now: running,
settling, owed again after `reconcile --reopen`). Why not rows of their own, kept beside the change:
- every paid request would pay for one more write, and the voucher path's CPU per request is being
  cut (its delivery is one statement group: task, claim, channel and log row); a record table would
  be another row, index and rowcount on every voucher, for a view an operator reads now and then;
- replicas share one PostgreSQL, so a record table written by each would be one more place for two
  writers to disagree after a takeover; the log's rows are fenced with the claim's own update (a
  process that lost its claim writes none), so what is derived from them is right by construction;
- the log already holds every fact a record states; a record kept apart could only drift from it.
The cost is on the read side: a query reads a window of the log by `(action, at)` (its index), then
each payment's rows by digest (its index): proportional to the payments shown, never the whole log.

A channel's voucher is linked to the claim that collected it through the notes the channel flow
writes on its rows ("channel 0x<16 hex> charged to N", "... claimed to M"): the first claim (or
refund, or claim confirmed on chain) of that channel to a total of at least N settled it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.claims import Claim, ClaimState
from server.database import Database

# The states a record can be in, as the exports name them.
STATES = (
    "rejected",  # refused before any work: local checks, the facilitator, the allowlist, a reused token
    "verified",  # verified; the work is running (its claim is live)
    "delivered",  # delivered; its settlement is under way now
    "released",  # not delivered (the agent failed, the payer canceled, a restart): nothing charged
    "settled",  # paid: the transaction moved `amount` to payTo (a voucher: its channel's claim on chain)
    "charged",  # a voucher charged to its channel, not yet claimed on chain
    "owed",  # delivered; a settle pass failed and another is scheduled
    "written_off",  # delivered, never paid: refused for good, or expired
    "needs_attention",  # nobody could decide: an operator must look (`reconcile --reopen`)
    "no_charge",  # an upto delivery priced at 0, or whose pricing failed
    "refunded",  # an idle channel's balance beyond its charges went back to its payer
)
# what a live claim's state says about its payment (a claim's state beats the log's last row:
# it moves without a row of its own, as when an operator re-opens one that needed attention)
_BY_CLAIM = {
    ClaimState.RUNNING: "verified",
    ClaimState.SETTLING: "delivered",
    ClaimState.SETTLE_FAILED: "owed",
    ClaimState.SETTLED: "settled",
    ClaimState.UNSETTLED: "written_off",
    ClaimState.NEEDS_ATTENTION: "needs_attention",
    ClaimState.NO_CHARGE: "no_charge",
}
_BY_OUTCOME = {
    "settle": "settled",
    "settle_failed": "owed",
    "write_off": "written_off",
    "needs_attention": "needs_attention",
    "no_charge": "no_charge",
    "release": "released",
}
_DELIVERED = ("settle", "settle_failed", "write_off", "needs_attention", "no_charge")  # a delivery's outcomes
_STARTS = ("verify", "reject")  # a payment's story begins with one of these
_CHANNEL_ROWS = ("channel_claim", "channel_refund", "channel_claim_failed", "needs_attention")
# the notes the channel flow writes (gate/flows/channel/flow.py and jobs.py): which channel, and to what total
_NOTE = re.compile(r"channel (0x[0-9a-fA-F]{16})\b(?:.*?\b(charged|claimed) to (\d+))?")
PAGE = 200  # payments read at a time


@dataclass(frozen=True)
class Step:
    """One row of a payment's story, as the log holds it."""

    at: float
    action: str
    error: str = ""
    transaction: str = ""


@dataclass(frozen=True)
class PaymentRecord:
    """One payment and what became of it. Amounts are the asset's atomic units, as decimal text."""

    payment_id: str  # the token's digest (a channel refund: "refund-" and its log row's id)
    state: str  # one of STATES
    agent: str
    task_id: str
    payer: str
    scheme: str
    network: str
    asset: str
    amount: str  # what the delivery is charged (an upto charge; the price); "0" when nothing is
    authorized: str  # what the payer signed for (the price, an upto ceiling)
    collected: str  # what reached payTo: `amount` once settled, else "0"
    transaction: str  # the one that moved the money (a voucher: its channel's claim)
    channel: str  # a voucher's or refund's channel (the first 18 characters of its id)
    started_at: float
    verified_at: float | None
    delivered_at: float | None  # when its delivery's first settle outcome was recorded
    settled_at: float | None  # when the money moved (a voucher: the claim on chain)
    updated_at: float
    settle_failures: int  # settle passes (a voucher: claims of its channel) that did not land
    error: str  # the reason that stands: why it is refused, owed, written off, needs attention
    reasons: tuple[str, ...]  # every refusal or failure on the way, oldest first, each once
    steps: tuple[Step, ...] = field(default=(), compare=False)


def channel_note(note: str) -> tuple[str, str, int] | None:
    """(channel, "charged" or "claimed" or "", total) from a note the channel flow wrote; None if none."""
    found = _NOTE.search(note or "")
    if found is None:
        return None
    return found.group(1).lower(), found.group(2) or "", int(found.group(3) or 0)


def derive(
    rows: Sequence[dict[str, Any]], claim: Claim | None = None, channel_rows: Iterable[dict[str, Any]] = ()
) -> PaymentRecord:
    """The record of one payment: its log rows (oldest first, one token digest), its claim if it is
    still there, and the channel job rows of its channel (claims, refunds, failures; any order)."""
    assert rows, "a payment has at least one row"
    first, steps = rows[0], tuple(Step(r["at"], r["action"], r["error"] or "", r["transaction"] or "") for r in rows)
    verifies = [r for r in rows if r["action"] == "verify"]
    outcomes = [r for r in rows if r["action"] in _BY_OUTCOME]
    last = outcomes[-1] if outcomes else None
    delivered = next((r for r in rows if r["action"] in _DELIVERED), None)
    settled = next((r for r in reversed(rows) if r["action"] == "settle"), None)

    def latest(column: str) -> str:
        return next((str(r[column]) for r in reversed(rows) if r.get(column)), "")

    if claim is not None:
        state = _BY_CLAIM[claim.state]
        error = claim.last_error if state in ("owed", "written_off", "needs_attention", "no_charge") else ""
    elif last is not None:
        state, error = _BY_OUTCOME[last["action"]], last["error"] or ""
    elif verifies:
        state, error = "verified", ""
    else:
        state, error = "rejected", rows[-1]["error"] or ""
    if state == "settled":
        error = ""
    basis = last if last is not None and last["action"] != "release" else (verifies[-1] if verifies else first)
    amount = "0" if state in ("rejected", "released") else str(basis["amount"] or "")
    authorized = str((verifies[-1] if verifies else first).get("authorized") or first["amount"] or "")
    transaction = settled["transaction"] or "" if settled is not None and state == "settled" else ""
    settled_at = settled["at"] if settled is not None and state == "settled" else None
    failures = sum(1 for r in rows if r["action"] == "settle_failed")
    reasons = [r["error"] for r in rows if r["action"] in ("reject", "settle_failed", "write_off", "needs_attention")]
    updated = rows[-1]["at"]
    note = channel_note(settled["error"]) if settled is not None else None
    channel = note[0] if note else ""
    if settled is not None and note is not None and note[1] == "charged" and state == "settled":
        # a channel's charge: settled when its channel's claim on chain reaches this voucher's total
        state, transaction, settled_at, charged_at = "charged", "", None, settled["at"]
        for row in sorted(channel_rows, key=lambda r: (r["at"], r.get("id", 0))):
            said = channel_note(row["error"] or "")
            if said is None or said[0] != channel or row["at"] < charged_at:
                continue
            updated = max(updated, row["at"])
            if row["action"] in ("channel_claim", "channel_refund") and said[1] == "claimed" and said[2] >= note[2]:
                state, transaction, settled_at, error = "settled", row["transaction"] or "", row["at"], ""
                break
            if row["action"] == "channel_claim_failed":
                failures += 1
                reasons.append(row["error"] or "")
                error = row["error"] or ""
            elif row["action"] == "needs_attention":
                state, error = "needs_attention", row["error"] or ""
                reasons.append(error)
    return PaymentRecord(
        payment_id=first["token_digest"],
        state=state,
        agent=first["agent"],
        task_id=latest("task_id"),
        payer=latest("payer"),
        scheme=latest("scheme"),
        network=str(first["network"] or basis["network"] or ""),
        asset=str(first["asset"] or basis["asset"] or ""),
        amount=amount,
        authorized=authorized,
        collected=amount if state == "settled" else "0",
        transaction=transaction,
        channel=channel,
        started_at=first["at"],
        verified_at=verifies[0]["at"] if verifies else None,
        delivered_at=delivered["at"] if delivered is not None else None,
        settled_at=settled_at,
        updated_at=updated,
        settle_failures=failures,
        error=error,
        reasons=tuple(dict.fromkeys(reason for reason in reasons if reason)),
        steps=steps,
    )


def refund_record(row: dict[str, Any]) -> PaymentRecord:
    """An idle channel's refund: what went back to its payer, and the transaction."""
    note = channel_note(row["error"] or "")
    return PaymentRecord(
        payment_id=f"refund-{row['id']}",
        state="refunded",
        agent=row["agent"] or "",
        task_id="",
        payer=row["payer"] or "",
        scheme=row.get("scheme") or "",
        network=row["network"] or "",
        asset=row["asset"] or "",
        amount=str(row["amount"] or "0"),
        authorized=str(row["amount"] or "0"),
        collected="0",
        transaction=row["transaction"] or "",
        channel=note[0] if note else "",
        started_at=row["at"],
        verified_at=None,
        delivered_at=None,
        settled_at=row["at"],
        updated_at=row["at"],
        settle_failures=0,
        error="",
        reasons=(),
        steps=(Step(row["at"], row["action"], row["error"] or "", row["transaction"] or ""),),
    )


@dataclass(frozen=True)
class Filters:
    """Which records: begun in [since, until) (epoch seconds), of an agent, a payer, in a state."""

    since: float = 0.0
    until: float = float("inf")
    agent: str = ""
    payer: str = ""
    state: str = ""


class PaymentRecords:
    """Records read from the payment log and the claims of one database (either engine)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def read(self, filters: Filters, *, newest_first: bool = False) -> AsyncIterator[PaymentRecord]:
        """Every record the filters take, in the order they began (or the reverse), read a page at a time."""
        order = "DESC" if newest_first else "ASC"
        after: tuple[float, int] | None = None
        until = min(filters.until, 1e18)  # a bound both engines take
        while True:
            where = ["action IN ('verify', 'reject', 'channel_refund')", "at >= ?", "at < ?"]
            args: list[Any] = [filters.since, until]
            if filters.agent:
                where.append("agent = ?")
                args.append(filters.agent)
            if filters.payer:
                where.append("payer = ?")
                args.append(filters.payer.lower())
            if after is not None:
                where.append("(at < ? OR (at = ? AND id < ?))" if newest_first else "(at > ? OR (at = ? AND id > ?))")
                args += [after[0], after[0], after[1]]
            starts = await self.db.fetch(
                f"SELECT id, at, action, token_digest FROM payments WHERE {' AND '.join(where)}"
                f" ORDER BY at {order}, id {order} LIMIT ?",
                (*args, PAGE),
            )
            if not starts:
                return
            after = (starts[-1]["at"], starts[-1]["id"])
            for record in await self._records(starts):
                if not filters.state or record.state == filters.state:
                    yield record
            if len(starts) < PAGE:
                return

    async def _records(self, starts: list[dict[str, Any]]) -> list[PaymentRecord]:
        """The records these starting rows begin, in their order (a payment once: at its first start)."""
        refunds = [s["id"] for s in starts if s["action"] == "channel_refund"]
        digests = list(dict.fromkeys(s["token_digest"] for s in starts if s["action"] != "channel_refund"))
        by_digest: dict[str, list[dict[str, Any]]] = {}
        claims: dict[str, Claim] = {}
        if digests:
            marks = ", ".join("?" for _ in digests)
            for row in await self.db.fetch(
                f"SELECT * FROM payments WHERE token_digest IN ({marks}) AND agent != '' ORDER BY id", digests
            ):
                by_digest.setdefault(row["token_digest"], []).append(row)
            for row in await self.db.fetch(f"SELECT * FROM claims WHERE token_digest IN ({marks})", digests):
                claims[row["token_digest"]] = Claim.from_row(row)
        refund_rows: dict[int, dict[str, Any]] = {}
        if refunds:
            marks = ", ".join("?" for _ in refunds)
            refund_rows = {
                r["id"]: r for r in await self.db.fetch(f"SELECT * FROM payments WHERE id IN ({marks})", refunds)
            }
        channel_rows = await self._channel_rows(by_digest)
        records = []
        for start in starts:
            if start["action"] == "channel_refund":
                if start["id"] in refund_rows:
                    records.append(refund_record(refund_rows[start["id"]]))
                continue
            rows = by_digest.get(start["token_digest"], [])
            began = next((r for r in rows if r["action"] in _STARTS), None)
            if began is None or began["id"] != start["id"]:
                continue  # not this payment's first start (a retry after a release, a reuse refused later)
            note = next((channel_note(r["error"]) for r in rows if r["action"] == "settle"), None)
            linked = channel_rows.get(note[0], []) if note else []
            records.append(derive(rows, claims.get(start["token_digest"]), linked))
        return records

    async def _channel_rows(self, by_digest: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        """The channel job rows (claims, refunds, their failures) after the earliest charge among these payments."""
        charged = [
            r["at"]
            for rows in by_digest.values()
            for r in rows
            if r["action"] == "settle" and (note := channel_note(r["error"])) is not None and note[1] == "charged"
        ]
        if not charged:
            return {}
        marks = ", ".join("?" for _ in _CHANNEL_ROWS)
        found: dict[str, list[dict[str, Any]]] = {}
        for row in await self.db.fetch(
            f"SELECT * FROM payments WHERE action IN ({marks}) AND at >= ? AND agent = '' ORDER BY id",
            (*_CHANNEL_ROWS, min(charged)),
        ):
            note = channel_note(row["error"] or "")
            if note is not None:
                found.setdefault(note[0], []).append(row)
        return found
