"""Payment channels (x402 `batch-settlement`): the state every replica shares, one row per channel.

A row holds the channel's configuration, its on-chain state as last read (balance, total
claimed, withdrawal, refund nonce, and when: `synced_at`, by the database's clock), what the
gate has charged on it (`charged`: the cumulative of every delivered request), the latest
voucher that pays for that total (sealed: a voucher is a signature and claims the money on
chain), and the one request in flight (`reserved_by`: its claim's token digest).

Every write is a compare-and-set on what it read, so two replicas never count one voucher
twice or lose one:
- a voucher reserves the channel only when `charged` is its base (maxClaimableAmount minus the
  price) and no live claim holds it; the reservation is that claim's (`gate.claims`): when the
  claim is released (undelivered work), or its owner's lease lapses and the reconciler ends it,
  the channel is free again, whatever crashed where;
- `charged` advances only at delivery, from that base to the voucher's maximum, in the same
  statement group as the delivered task, the claim's `settled` and its payment log row
  (`Settler.settle_delivery`, `flow.ChannelFlow.settled_write`).
The x402 package's own server storage does the same in one process (a dict or a file and a
lock); this is that, in SQLite or PostgreSQL, for replicas.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache, TTLCache

from gate.schemes.batch_settlement import Voucher
from server.database import Database, Migration, Statement
from server.frozen import evolve

HOLDING_STATES = ("running", "settling", "settle_failed")  # a claim in these holds its channel's reservation

_COLUMNS = (
    "channel_id TEXT PRIMARY KEY, network TEXT NOT NULL, asset TEXT NOT NULL, payer TEXT NOT NULL,"
    " receiver TEXT NOT NULL, config TEXT NOT NULL,"
    # on-chain state, as last read, and when (the database's clock)
    " balance TEXT NOT NULL DEFAULT '0', total_claimed TEXT NOT NULL DEFAULT '0',"
    " withdraw_requested_at BIGINT NOT NULL DEFAULT 0, refund_nonce TEXT NOT NULL DEFAULT '0',"
    " synced_at DOUBLE PRECISION NOT NULL DEFAULT 0,"
    # the gate's side: what delivered work has charged, the voucher for it (sealed), the request in flight
    " charged TEXT NOT NULL DEFAULT '0', voucher_max TEXT NOT NULL DEFAULT '0',"
    " voucher_digest TEXT NOT NULL DEFAULT '',"
    " sealed_voucher TEXT NOT NULL DEFAULT '', reserved_by TEXT NOT NULL DEFAULT '',"
    " charged_at DOUBLE PRECISION NOT NULL DEFAULT 0,"
    # the claim job: a claim on chain in flight (its fence and lease), and what it claims
    " claim_fence TEXT NOT NULL DEFAULT '', claim_until DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " claim_max TEXT NOT NULL DEFAULT '0', claim_unknown INTEGER NOT NULL DEFAULT 0,"
    " claim_failures INTEGER NOT NULL DEFAULT 0,"  # claims that did not land since the last one that did
    " refunded INTEGER NOT NULL DEFAULT 0,"
    " created_at DOUBLE PRECISION NOT NULL DEFAULT 0, updated_at DOUBLE PRECISION NOT NULL DEFAULT 0"
)
_STATEMENTS = (
    f"CREATE TABLE IF NOT EXISTS channels ({_COLUMNS})",
    "CREATE INDEX IF NOT EXISTS channels_charged_at ON channels (charged_at)",
)
# The claim obligation (DESIGN 6): when the channel's first unclaimed charge was made (the oldest
# money is due first; `charged_at` is the latest), and a claim the contract refused, set aside: its
# voucher's maximum (a later voucher is claimable again), why, and when. Rows holding unclaimed
# charges before this step take their creation time: never later than their first unclaimed charge.
_FIRST_CHARGE = (
    "UPDATE channels SET first_charged_at = CASE WHEN created_at > 0 THEN created_at ELSE charged_at END"
    " WHERE charged != total_claimed"
)
_ADDED = (
    "first_charged_at DOUBLE PRECISION NOT NULL DEFAULT 0",
    "refused_max TEXT NOT NULL DEFAULT ''",
    "refused_reason TEXT NOT NULL DEFAULT ''",
    "refused_at DOUBLE PRECISION NOT NULL DEFAULT 0",
)
MIGRATIONS = (Migration(_STATEMENTS), Migration.add_columns("channels", _ADDED, then=(_FIRST_CHARGE,)))
# `total_claimed`, or the decimal given if it is larger (decimals without leading zeros: longer is
# larger, then the text's order), bound four times: a uint128 does not fit either engine's integers
_AT_LEAST = (
    "CASE WHEN length(?) > length(total_claimed) OR (length(?) = length(total_claimed) AND ? > total_claimed)"
    " THEN ? ELSE total_claimed END"
)
# channels whose last read a voucher's first check may use (`Channels.recent`): a bound, not a cap on
# how many channels there are (one forgotten is read again); about 1 KiB each
RECENT_CHANNELS = 10_000
# how long a channel another writer moved is read afresh before each voucher's first check (one that
# several replicas serve in turn: what this process last saw of it is stale more often than not)
CONTENDED_SECONDS = 60.0
PAGE_SIZE = 100  # channels read at a time by the claim job's walk (`Channels.unclaimed`): a page, never a cap


@dataclass(frozen=True)
class Channel:
    """One channel row, typed (amounts as integers: uint128 values, stored as decimal text)."""

    channel_id: str
    network: str
    asset: str
    payer: str
    receiver: str
    config: dict[str, Any]
    balance: int
    total_claimed: int
    withdraw_requested_at: int
    refund_nonce: int
    synced_at: float
    charged: int
    voucher_max: int
    voucher_digest: str
    sealed_voucher: str
    reserved_by: str
    charged_at: float
    claim_fence: str = ""
    claim_until: float = 0.0
    claim_max: int = 0
    claim_unknown: bool = False
    claim_failures: int = 0
    refunded: bool = False
    first_charged_at: float = 0.0  # the first charge not yet claimed (0: none)
    refused_max: int = -1  # the voucher maximum whose claim the contract refused (-1: none)
    refused_reason: str = ""
    refused_at: float = 0.0
    now: float = 0.0  # the database's clock when the row was read

    @classmethod
    def from_row(cls, row: Any) -> Channel:
        return cls(
            channel_id=row["channel_id"],
            network=row["network"],
            asset=row["asset"],
            payer=row["payer"],
            receiver=row["receiver"],
            config=json.loads(row["config"]),
            balance=int(row["balance"]),
            total_claimed=int(row["total_claimed"]),
            withdraw_requested_at=int(row["withdraw_requested_at"]),
            refund_nonce=int(row["refund_nonce"]),
            synced_at=float(row["synced_at"]),
            charged=int(row["charged"]),
            voucher_max=int(row["voucher_max"]),
            voucher_digest=row["voucher_digest"],
            sealed_voucher=row["sealed_voucher"],
            reserved_by=row["reserved_by"],
            charged_at=float(row["charged_at"]),
            claim_fence=row["claim_fence"],
            claim_until=float(row["claim_until"]),
            claim_max=int(row["claim_max"]),
            claim_unknown=bool(row["claim_unknown"]),
            claim_failures=int(row["claim_failures"]),
            refunded=bool(row["refunded"]),
            first_charged_at=float(row["first_charged_at"]),
            refused_max=int(row["refused_max"]) if row["refused_max"] else -1,
            refused_reason=row["refused_reason"],
            refused_at=float(row["refused_at"]),
            now=float(row["now"]) if "now" in row else 0.0,
        )

    @property
    def unclaimed(self) -> int:
        return max(0, self.charged - self.total_claimed)

    @property
    def refused(self) -> bool:
        """Its latest voucher's claim was refused by the contract: set aside (terminal for that voucher)."""
        return self.refused_max == self.voucher_max

    @property
    def withdraw_delay(self) -> int:
        return int(self.config.get("withdrawDelay", 0))

    def finalizable_in(self) -> float | None:
        """Seconds before the payer's pending withdrawal can be finalized (None: none pending)."""
        if not self.withdraw_requested_at:
            return None
        return self.withdraw_requested_at + self.withdraw_delay - self.now

    def claim_state(self) -> str:
        """Its claim state, in a word or two: claimed, unclaimed, withdrawing, or refused (and why)."""
        if self.unclaimed == 0:
            return "claimed"
        if self.refused:
            return f"refused: {self.refused_reason}"
        return "withdrawing" if self.withdraw_requested_at else "unclaimed"

    def due(self, min_amount: int, max_age_seconds: float) -> bool:
        """Its unclaimed charges reach `min_amount`, or the first of them is `max_age_seconds` old, or
        its payer asked to withdraw (the unclaimed balance could go back once the delay runs out)."""
        return self.unclaimed > 0 and (
            self.unclaimed >= min_amount
            or self.now - self.first_charged_at >= max_age_seconds
            or self.withdraw_requested_at > 0
        )

    def fresh(self, ttl_seconds: float) -> bool:
        """The mirrored on-chain state is recent enough to verify a voucher against it locally."""
        return self.synced_at > 0 and self.now - self.synced_at <= ttl_seconds

    def state(self) -> dict[str, Any]:
        """The binding's `channelState`, as receipts and corrective answers carry it."""
        return {
            "channelId": self.channel_id,
            "balance": str(self.balance),
            "totalClaimed": str(self.total_claimed),
            "withdrawRequestedAt": self.withdraw_requested_at,
            "refundNonce": str(self.refund_nonce),
            "chargedCumulativeAmount": str(self.charged),
        }


def checked_fields(channel: Channel) -> tuple[Any, ...]:
    """What a voucher's first check reads of a channel (and its reservation asks to be unchanged)."""
    return (
        channel.charged,
        channel.balance,
        channel.total_claimed,
        channel.withdraw_requested_at,
        channel.synced_at,
        channel.refunded,
    )


@dataclass(frozen=True)
class Mirror:
    """On-chain channel state as a facilitator answer reports it (its `extra` or `extra.channelState`)."""

    balance: int
    total_claimed: int
    withdraw_requested_at: int
    refund_nonce: int

    @classmethod
    def read(cls, extra: dict[str, Any]) -> Mirror | None:
        """The state in a verify answer's `extra` (or a settle answer's `extra.channelState`); None if absent or odd."""
        nested = extra.get("channelState")
        state: dict[str, Any] = nested if isinstance(nested, dict) else extra
        try:
            values = [int(str(state[k])) for k in ("balance", "totalClaimed")]
            withdraw = int(str(state.get("withdrawRequestedAt", 0)))
            nonce = int(str(state.get("refundNonce", 0)))
        except (KeyError, TypeError, ValueError):
            return None
        if min(*values, withdraw, nonce) < 0:
            return None
        return cls(values[0], values[1], withdraw, nonce)


@dataclass(frozen=True)
class Obligation:
    """The claim job's backlog: channels whose payer asked to withdraw while charges are unclaimed,
    the oldest unclaimed charge's age, the least time before a pending withdrawal can be finalized
    (None: none pending), channels whose latest voucher's claim the contract refused, and channels
    whose claims failed since the last that landed."""

    pending_withdrawals: int
    oldest_unclaimed_seconds: float
    finalizable_in_seconds: float | None
    refused: int
    claim_failing: int


@dataclass(frozen=True)
class Reservation:
    """What `reserve` found: "reserved", "busy" (another live request holds the channel) or
    "mismatch" (the voucher's base is not the channel's charged total: the payer must resync)."""

    kind: str
    channel: Channel | None  # as found, when it could not be reserved


class Channels:
    def __init__(self, db: Database) -> None:
        self.db = db
        # each channel as this process last read or charged it: what the common voucher is checked
        # against before its claim, never trusted: its reservation applies only if the row still says
        # what the check read (`reserve_statement`'s `seen`)
        self.recent: LRUCache[str, Channel] = LRUCache(maxsize=RECENT_CHANNELS)
        self.contended: TTLCache[str, bool] = TTLCache(maxsize=RECENT_CHANNELS, ttl=CONTENDED_SECONDS)

    @property
    def now(self) -> str:
        return self.db.clock_sql

    async def create_tables(self) -> None:
        await self.db.migrate("channels", MIGRATIONS)

    async def find(self, channel_id: str) -> Channel | None:
        row = await self.db.fetchrow(
            f"SELECT *, {self.now} AS now FROM channels WHERE channel_id = ?", (channel_id.lower(),)
        )
        if row is None:
            return None
        channel = Channel.from_row(row)
        seen = self.recent.get(channel.channel_id)
        if seen is not None and checked_fields(seen) != checked_fields(channel):
            self.contended[channel.channel_id] = True  # moved by another writer since: read it afresh a while
        self.recent[channel.channel_id] = channel
        return channel

    async def last_seen(self, channel_id: str) -> Channel | None:
        """The channel as this process last read or charged it (read now if it has not, or if another
        writer moved it lately): a snapshot to check a voucher against, whose reservation holds only if
        the row is unchanged since."""
        key = channel_id.lower()
        seen = None if key in self.contended else self.recent.get(key)
        return seen if seen is not None else await self.find(channel_id)

    def charged_here(self, channel_id: str, base: int, charged: int) -> None:
        """This process charged the channel from `base` to `charged` (its write committed): the next
        voucher is checked against that, without reading the row again."""
        seen = self.recent.get(channel_id)
        if seen is not None:
            if seen.charged == base:
                self.recent[channel_id] = evolve(seen, charged=charged, reserved_by="")
            else:
                del self.recent[channel_id]

    async def open(self, voucher: Voucher, network: str, asset: str, charged: int, mirror: Mirror | None) -> None:
        """A channel the gate has not seen: its row, charged from what the chain says was claimed."""
        m = mirror or Mirror(0, 0, 0, 0)
        await self.db.execute(
            "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, balance, total_claimed,"
            " withdraw_requested_at, refund_nonce, synced_at, charged, voucher_max, created_at, updated_at)"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {self.now if mirror else '0'}, ?, ?, {self.now}, {self.now})"
            " ON CONFLICT DO NOTHING",
            (
                voucher.channel_id,
                network,
                asset.lower(),
                voucher.payer,
                str(voucher.config["receiver"]).lower(),
                json.dumps(voucher.config, sort_keys=True, separators=(",", ":")),
                str(m.balance),
                str(m.total_claimed),
                m.withdraw_requested_at,
                str(m.refund_nonce),
                str(charged),
                str(charged),
            ),
        )

    async def mirror(self, channel_id: str, mirror: Mirror, *, read: Channel | None = None) -> int:
        """The chain's state as a facilitator (or the chain itself) just read it; 1 if written.

        The claimed total never moves back: a state read before a claim of ours landed, written after
        that claim was recorded, would make its vouchers look unclaimed again (claimed twice, counted
        twice). With `read` (the row as it was before the chain was asked), only if nobody has claimed
        it since, nor taken it to claim: what the chain says was claimed is then no claim we recorded."""
        fenced = "" if read is None else " AND total_claimed = ? AND claim_fence = ?"
        claimed = str(mirror.total_claimed)
        return await self.db.execute(
            f"UPDATE channels SET balance = ?, total_claimed = {_AT_LEAST}, withdraw_requested_at = ?,"
            f" refund_nonce = ?, synced_at = {self.now}, updated_at = {self.now} WHERE channel_id = ?{fenced}",
            (
                str(mirror.balance),
                claimed,
                claimed,
                claimed,
                claimed,
                mirror.withdraw_requested_at,
                str(mirror.refund_nonce),
                channel_id,
                *(() if read is None else (str(read.total_claimed), read.claim_fence)),
            ),
        )

    def _free(self) -> str:
        marks = ", ".join(f"'{s}'" for s in HOLDING_STATES)
        return (
            "(reserved_by = '' OR NOT EXISTS (SELECT 1 FROM claims WHERE claims.token_digest = channels.reserved_by"
            f" AND claims.state IN ({marks})))"
        )

    def reserve_statement(
        self,
        channel_id: str,
        base: int,
        token_digest: str,
        *,
        deposit: bool,
        unheld: bool = False,
        seen: Channel | None = None,
        fresh_for: float = 0.0,
    ) -> Statement:
        """`reserve`'s write: the channel held for `token_digest`'s request if its charged total is
        `base` and nothing live holds it (a voucher's: nor is it refunded); its WHERE clause last.

        `seen`: the snapshot a voucher was checked against (`last_seen`): only if the row's on-chain
        state is still what it says (balance, claimed, no withdrawal, the same sync, and that sync
        younger than `fresh_for` seconds by the database's clock), so a check against an old read
        never reserves what a fresh one would refuse.

        `unheld`: only if no other name is on it at all. PostgreSQL rechecks a row another
        transaction just updated at its new version, but a subquery (whether the holder's claim is
        live) at the statement's snapshot, which may not show that transaction's claim yet (taken in
        the same transaction as its reservation, `vouchers.reservable`): a condition on the row
        alone sees it. Without `unheld`, the subquery lets a name left by an ended claim go; `reserve`
        sends it after taking the row's lock, in a transaction of its own, so it sees that claim."""
        open_ = "" if deposit else " AND refunded = 0"
        # a reservation in this token's name is this request's: its earlier claim was released
        # (a restart, an outage) and the claim it holds now is the one just taken
        free = "(reserved_by = '' OR reserved_by = ?)" if unheld else f"(reserved_by = ? OR {self._free()})"
        unchanged, as_seen = "", tuple[Any, ...]()
        if seen is not None:
            unchanged = (
                " AND balance = ? AND total_claimed = ? AND withdraw_requested_at = 0 AND synced_at = ?"
                f" AND synced_at >= {self.now} - ?"
            )
            as_seen = (str(seen.balance), str(seen.total_claimed), seen.synced_at, fresh_for)
        return (
            f"UPDATE channels SET reserved_by = ?, updated_at = {self.now}"
            f" WHERE channel_id = ? AND charged = ? AND {free}{open_}{unchanged}",
            (token_digest, channel_id, str(base), token_digest, *as_seen),
        )

    async def reserve(self, channel_id: str, base: int, token_digest: str, *, deposit: bool) -> Reservation:
        """Hold the channel for the request claimed under `token_digest`, if its charged total is `base`
        (and, for a voucher, the channel is not being or has not been refunded: only a deposit reopens it)."""
        taken = await self._locked(channel_id, self.reserve_statement(channel_id, base, token_digest, deposit=deposit))
        if taken == 1:
            return Reservation("reserved", None)
        channel = await self.find(channel_id)
        assert channel is not None, channel_id
        if channel.charged != base:
            return Reservation("mismatch", channel)
        return Reservation("refunded" if channel.refunded and not deposit else "busy", channel)

    async def _locked(self, channel_id: str, statement: Statement) -> int:
        """`statement` (one whose WHERE asks whether the holder's claim is live) after taking the
        row's lock, in a transaction of its own: it then sees every claim committed before it, one
        taken in the same transaction as its reservation too (see `reserve_statement`)."""
        async with self.db.transaction():
            await self.db.execute(f"UPDATE channels SET updated_at = {self.now} WHERE channel_id = ?", (channel_id,))
            return await self.db.execute(*statement)

    def commit_statement(
        self, voucher: Voucher, base: int, sealed_voucher: str, voucher_digest: str, mirror: Mirror | None
    ) -> tuple[str, tuple[Any, ...]]:
        """The write that charges a delivered request: `charged` from `base` to the voucher's maximum,
        the voucher kept (sealed) to claim it; one row or none (then someone else moved the channel)."""
        mirrored, args = "", tuple[Any, ...]()
        if mirror is not None:
            mirrored = f", balance = ?, total_claimed = ?, withdraw_requested_at = ?, synced_at = {self.now}"
            args = (str(mirror.balance), str(mirror.total_claimed), mirror.withdraw_requested_at)
        return (
            f"UPDATE channels SET charged = ?, voucher_max = ?, sealed_voucher = ?, voucher_digest = ?,"
            f" reserved_by = ''{', refunded = 0' if voucher.kind == 'deposit' else ''},"
            f" charged_at = {self.now}, updated_at = {self.now}{mirrored},"
            # the first charge since everything was claimed starts the claim's clock (old values on the right)
            f" first_charged_at = CASE WHEN charged = total_claimed OR first_charged_at = 0 THEN {self.now}"
            " ELSE first_charged_at END"
            " WHERE channel_id = ? AND charged = ?",
            (
                str(voucher.max_claimable),
                str(voucher.max_claimable),
                sealed_voucher,
                voucher_digest,
                *args,
                voucher.channel_id,
                str(base),
            ),
        )

    def charged_condition(self, voucher: Voucher, voucher_digest: str) -> tuple[str, tuple[Any, ...]]:
        """The condition "the channel is charged to this voucher" (`commit_statement` applied)."""
        return (
            "EXISTS (SELECT 1 FROM channels WHERE channel_id = ? AND charged = ? AND voucher_digest = ?)",
            (voucher.channel_id, str(voucher.max_claimable), voucher_digest),
        )

    async def let_go(self, channel_id: str, token_digest: str) -> None:
        """The request's work was not delivered: the channel is free now (its claim's end frees it too)."""
        await self.db.execute(
            f"UPDATE channels SET reserved_by = '', updated_at = {self.now} WHERE channel_id = ? AND reserved_by = ?",
            (channel_id, token_digest),
        )

    # -- the claim job -------------------------------------------------------------------

    async def unclaimed(self, page_size: int = PAGE_SIZE) -> AsyncIterator[list[Channel]]:
        """Every channel holding charges not claimed on chain, a page at a time in key order (each
        page starts after the last key of the one before): nothing caps how many are walked."""
        after = ""
        while True:
            rows = await self.db.fetch(
                f"SELECT *, {self.now} AS now FROM channels WHERE channel_id > ? AND charged != total_claimed"
                " AND sealed_voucher != '' ORDER BY channel_id LIMIT ?",
                (after, page_size),
            )
            page = [c for c in (Channel.from_row(r) for r in rows) if c.unclaimed > 0]
            if page:
                yield page
            if len(rows) < page_size:
                return
            after = rows[-1]["channel_id"]

    async def withdrawals_at_risk(self) -> list[Channel]:
        """Every channel whose payer asked to withdraw while charges are unclaimed (the webhook's event)."""
        rows = await self.db.fetch(
            f"SELECT *, {self.now} AS now FROM channels WHERE withdraw_requested_at > 0 AND charged != total_claimed"
        )
        return [c for c in (Channel.from_row(r) for r in rows) if c.unclaimed > 0]

    async def claimable(
        self, min_amount: int, max_age_seconds: float, *, max_failures: int | None = None, page_size: int = PAGE_SIZE
    ) -> list[Channel]:
        """Every channel due (`Channel.due`), pending withdrawals first, then the oldest unclaimed
        charge first; none with a claim in flight, none whose voucher's claim was refused, nor (with
        `max_failures`) one whose claims failed that often. Filtered after reading, over every page."""
        due = []
        async for page in self.unclaimed(page_size):
            for c in page:
                if c.claim_fence and c.claim_until >= c.now:
                    continue
                if c.refused or (max_failures is not None and c.claim_failures >= max_failures):
                    continue
                if c.due(min_amount, max_age_seconds):
                    due.append(c)
        due.sort(key=lambda c: (c.withdraw_requested_at == 0, c.first_charged_at))
        return due

    async def refuse(self, channel_id: str, fence: str, reason: str) -> int:
        """The contract refused this claim: set its voucher aside (no pass claims it again, nor sends it in
        a batch with others), and distrust the mirrored state (the chain has moved: the next voucher is
        verified by the facilitator)."""
        return await self.db.execute(
            f"UPDATE channels SET refused_max = claim_max, refused_reason = ?, refused_at = {self.now},"
            f" synced_at = 0, claim_fence = '', claim_unknown = 0, updated_at = {self.now}"
            " WHERE channel_id = ? AND claim_fence = ?",
            (reason[:500], channel_id, fence),
        )

    async def retry_refused(self) -> int:
        """Every voucher set aside as refused is claimable again (an operator's call: `a2a-gate channels
        claim --retry-refused`, e.g. once the payer topped the channel up); how many."""
        return await self.db.execute(
            f"UPDATE channels SET refused_max = '', refused_reason = '', updated_at = {self.now}"
            " WHERE refused_max != ''"
        )

    async def obligation(self, page_size: int = PAGE_SIZE) -> Obligation:
        """What stands between payers' withdrawals and the charges not yet claimed, over every channel."""
        pending = refused = failing = 0
        oldest: float | None = None
        finalizable: float | None = None
        async for page in self.unclaimed(page_size):
            for c in page:
                if c.refused:
                    refused += 1
                    continue
                failing += c.claim_failures > 0
                age = c.now - c.first_charged_at if c.first_charged_at else 0.0
                oldest = age if oldest is None else max(oldest, age)
                left = c.finalizable_in()
                if left is not None:
                    pending += 1
                    finalizable = left if finalizable is None else min(finalizable, left)
        return Obligation(pending, oldest or 0.0, finalizable, refused, failing)

    async def take_claim(self, channel: Channel, fence: str, lease_seconds: float) -> bool:
        """This process claims `channel`'s voucher on chain now, unless another took it first."""
        taken = await self.db.execute(
            f"UPDATE channels SET claim_fence = ?, claim_until = {self.now} + ?, claim_max = voucher_max,"
            f" updated_at = {self.now} WHERE channel_id = ? AND claim_fence = ? AND voucher_max = ?",
            (fence, lease_seconds, channel.channel_id, channel.claim_fence, str(channel.voucher_max)),
        )
        return taken == 1

    def claimed_statement(self, channel_id: str, fence: str, mirror: Mirror | None) -> tuple[str, tuple[Any, ...]]:
        """A claim landed (or the chain says it did): the claimed total, the claim no longer in flight."""
        if mirror is None:
            return (
                "UPDATE channels SET total_claimed = claim_max, claim_fence = '', claim_unknown = 0,"
                f" claim_failures = 0, updated_at = {self.now} WHERE channel_id = ? AND claim_fence = ?",
                (channel_id, fence),
            )
        return (
            f"UPDATE channels SET balance = ?, total_claimed = ?, withdraw_requested_at = ?, synced_at = {self.now},"
            f" claim_fence = '', claim_unknown = 0, claim_failures = 0, updated_at = {self.now}"
            " WHERE channel_id = ? AND claim_fence = ?",
            (str(mirror.balance), str(mirror.total_claimed), mirror.withdraw_requested_at, channel_id, fence),
        )

    async def claims_landed(self, channel_id: str) -> None:
        """The chain shows a claim of ours landed: the failures counted since are history."""
        await self.db.execute(
            f"UPDATE channels SET claim_unknown = 0, claim_failures = 0, updated_at = {self.now} WHERE channel_id = ?",
            (channel_id,),
        )

    async def claim_failed(self, channel_id: str, fence: str, unknown: bool, retry_in: float) -> None:
        """The claim did not land (or nobody knows): free to try again after `retry_in` seconds."""
        await self.db.execute(
            f"UPDATE channels SET claim_until = {self.now} + ?, claim_unknown = ?, claim_failures = claim_failures + 1,"
            f" updated_at = {self.now} WHERE channel_id = ? AND claim_fence = ?",
            (retry_in, int(unknown), channel_id, fence),
        )

    # -- refunds of idle channels ------------------------------------------------------------

    async def idle(self, idle_seconds: float, limit: int = 100) -> list[Channel]:
        """Channels holding more than they charged, unused for `idle_seconds`, with nothing in flight."""
        rows = await self.db.fetch(
            f"SELECT *, {self.now} AS now FROM channels WHERE refunded = 0 AND sealed_voucher != ''"
            f" AND charged_at < {self.now} - ? AND (claim_fence = '' OR claim_until < {self.now})"
            f" AND {self._free()} LIMIT ?",
            (idle_seconds, limit),
        )
        return [c for c in (Channel.from_row(r) for r in rows) if c.balance > c.charged]

    async def take_refund(self, channel: Channel, fence: str, lease_seconds: float) -> bool:
        """Close `channel` to vouchers and hold it for its refund, unless a request or a claim came first."""
        taken = await self._locked(
            channel.channel_id,
            (
                f"UPDATE channels SET refunded = 1, claim_fence = ?, claim_until = {self.now} + ?,"
                f" claim_max = voucher_max, updated_at = {self.now}"
                f" WHERE channel_id = ? AND claim_fence = ? AND voucher_max = ? AND {self._free()}",
                (fence, lease_seconds, channel.channel_id, channel.claim_fence, str(channel.voucher_max)),
            ),
        )
        return taken == 1

    def refunded_statement(self, channel_id: str, fence: str, mirror: Mirror) -> tuple[str, tuple[Any, ...]]:
        """The refund landed: what is left on chain (its claims batched with it), no longer in flight."""
        return (
            f"UPDATE channels SET balance = ?, total_claimed = ?, refund_nonce = ?, synced_at = {self.now},"
            f" claim_fence = '', updated_at = {self.now} WHERE channel_id = ? AND claim_fence = ?",
            (str(mirror.balance), str(mirror.total_claimed), str(mirror.refund_nonce), channel_id, fence),
        )

    async def refund_failed(self, channel_id: str, fence: str, *, unknown: bool, retry_in: float) -> None:
        """Refused: open to vouchers again. Unknown: still closed, tried again after `retry_in` (the chain decides)."""
        reopened = "" if unknown else ", refunded = 0"
        await self.db.execute(
            f"UPDATE channels SET claim_until = {self.now} + ?{reopened}, updated_at = {self.now}"
            " WHERE channel_id = ? AND claim_fence = ?",
            (retry_in, channel_id, fence),
        )

    async def listing(self, limit: int = 50) -> list[Channel]:
        rows = await self.db.fetch(
            f"SELECT *, {self.now} AS now FROM channels ORDER BY updated_at DESC LIMIT ?", (limit,)
        )
        return [Channel.from_row(r) for r in rows]

    async def totals(self) -> dict[str, int]:
        """Sums over every channel: charged by delivered work, claimed on chain, deposited."""
        rows = await self.db.fetch("SELECT charged, total_claimed, balance FROM channels")
        return {
            "charged": sum(int(r["charged"]) for r in rows),
            "claimed": sum(int(r["total_claimed"]) for r in rows),
            "balance": sum(int(r["balance"]) for r in rows),
        }
