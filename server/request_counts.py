"""Answers counted per day, agent and outcome, kept in the store for the operator's reports
(`a2a-gate payments --summary`: how many callers were asked to pay, how many paid).

Counted in memory and added to the store every FLUSH_SECONDS and at shutdown, so an
answer costs no write of its own (a 402 is the cheapest answer there is, and a flood of
them must stay cheap). The agent is its public label (`server.metrics.agent_label`) and
the outcomes a fixed set: the counts stay a few rows a day however many callers there are.
With several workers or replicas each adds its own counts.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from server.database import Database, DatabaseUnavailable, Migration

logger = logging.getLogger("a2a_gate.request_counts")

FLUSH_SECONDS = 10.0
COUNTED = frozenset({"payment_required", "paid", "replay", "rejected", "verify_unavailable", "limited"})

_TABLE = (
    "CREATE TABLE IF NOT EXISTS request_counts (day TEXT, agent TEXT, outcome TEXT, count {integer},"
    " PRIMARY KEY (day, agent, outcome))"
)
MIGRATIONS = (Migration(sqlite=(_TABLE.format(integer="INTEGER"),), postgresql=(_TABLE.format(integer="BIGINT"),)),)


def day_of(at: float) -> str:
    """The UTC day of a timestamp, as the reports name it."""
    return time.strftime("%Y-%m-%d", time.gmtime(at))


class RequestCounts:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.pending: Counter[tuple[str, str, str]] = Counter()
        self.day, self.day_starts = "", -86400.0  # the UTC day being counted, and when it began

    async def create_tables(self) -> None:
        await self.db.migrate("request_counts", MIGRATIONS)

    def count(self, agent: str, outcome: str) -> None:
        if outcome in COUNTED:
            now = time.time()
            if not self.day_starts <= now < self.day_starts + 86400:  # formatted once a day, not per answer
                self.day, self.day_starts = day_of(now), now // 86400 * 86400
            self.pending[(self.day, agent, outcome)] += 1

    async def flush(self) -> None:
        """Add the counts gathered since the last flush; kept for the next one if the store is away."""
        pending, self.pending = self.pending, Counter()
        if not pending:
            return
        try:
            async with self.db.transaction():
                for (day, agent, outcome), n in sorted(pending.items()):
                    await self.db.execute(
                        "INSERT INTO request_counts (day, agent, outcome, count) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (day, agent, outcome)"
                        " DO UPDATE SET count = request_counts.count + excluded.count",
                        (day, agent, outcome, n),
                    )
        except DatabaseUnavailable as exc:
            logger.warning("request counts not stored yet: %s", exc)
            self.pending.update(pending)

    async def read(self, since_day: str) -> dict[tuple[str, str, str], int]:
        rows = await self.db.fetch("SELECT day, agent, outcome, count FROM request_counts WHERE day >= ?", (since_day,))
        return {(r["day"], r["agent"], r["outcome"]): int(r["count"]) for r in rows}
