"""The daily summary: per UTC day, agent and money (asset on a network), what the payment log counts.

`a2a-gate payments --summary` prints it per day and agent; the exports (`gate.payment_exports`) give
it per money as well, so every amount is one integer in one asset's atomic units. 402s name no money
(an offer may list several): they are counted on the day's and agent's row with an empty network and
asset. Read from the log and the per-day request counts only: nothing on the request path writes for it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from server.database import Database
from server.request_counts import RequestCounts, day_of

# the counters of a summary row, in the order the text report and the exports give them
COUNTS = (
    "402s",
    "verified",
    "settled",
    "charged nothing",
    "released",
    "settle failures",
    "owed",
    "written off",
    "needs attention",
)
_NAMED = {
    "verify": "verified",
    "write_off": "written off",
    "needs_attention": "needs attention",
    "release": "released",
    "no_charge": "charged nothing",
}


@dataclass
class SummaryRow:
    """One day's, agent's and money's counts; `revenue` and `authorized` in the asset's atomic units."""

    day: str
    agent: str
    network: str
    asset: str
    revenue: int = 0
    authorized: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    owed: set[str] = field(default_factory=set)  # token digests still owed, first failed that day

    def count(self, name: str) -> int:
        return len(self.owed) if name == "owed" else self.counts[name]


async def summary(db: Database, since: float, until: float = float("inf"), agent: str = "") -> list[SummaryRow]:
    """Every row from `since` to `until` (epoch seconds), by day, agent, network and asset."""
    counts = RequestCounts(db)
    await counts.create_tables()
    rows = await db.fetch(
        "SELECT at, agent, action, network, asset, amount, authorized, token_digest FROM payments"
        " WHERE at >= ? AND at < ? AND action IN"
        " ('verify', 'settle', 'settle_failed', 'write_off', 'needs_attention', 'no_charge', 'release')",
        (since, min(until, 1e18)),
    )
    ended = await db.fetch(
        "SELECT DISTINCT token_digest FROM payments"
        " WHERE action IN ('settle', 'write_off', 'needs_attention', 'no_charge')"
    )
    finished = {r["token_digest"] for r in ended}
    table: dict[tuple[str, str, str, str], SummaryRow] = {}

    def line(day: str, name: str, network: str, asset: str) -> SummaryRow:
        return table.setdefault((day, name, network, asset), SummaryRow(day, name, network, asset))

    last_day = day_of(until) if until != float("inf") else None
    for (day, name, outcome), n in (await counts.read(day_of(since))).items():
        if outcome == "payment_required" and (not agent or name == agent) and (last_day is None or day <= last_day):
            line(day, name, "", "").counts["402s"] += n
    for row in rows:
        if agent and row["agent"] != agent:
            continue
        entry, action = line(day_of(row["at"]), row["agent"], row["network"] or "", row["asset"] or ""), row["action"]
        if action == "settle":
            entry.counts["settled"] += 1
            entry.revenue += int(row["amount"] or 0)
        elif action == "settle_failed":
            entry.counts["settle failures"] += 1
            if row["token_digest"] not in finished:
                entry.owed.add(row["token_digest"])
        else:
            if action == "verify":
                entry.authorized += int(row["authorized"] or row["amount"] or 0)
            entry.counts[_NAMED[action]] += 1
    return [table[key] for key in sorted(table)]
