"""The claim obligation, below the HTTP layer: the claim job walks EVERY channel with unclaimed
charges (pages by key, never a capped list filtered afterwards), a channel is due by its FIRST
unclaimed charge, a refused voucher is set aside, and the gauges say what stands between payers'
withdrawals and the money not yet claimed. On a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gate.flows.channel.store import MIGRATIONS, Channels
from gate.metrics import GateMetrics
from server.database import Database
from server.engines import open_database
from tests.gate.flows.channel.test_channel_charge import Store, voucher_payment


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return str(request.getfixturevalue("postgres_schema").store_url())


def on(location: str, body: Any) -> None:
    async def main() -> None:
        db = open_database(location)
        await db.open()
        try:
            await body(db)
        finally:
            await db.close()

    asyncio.run(main())


async def add(
    db: Database, n: int, *, charged: int, claimed: int = 0, withdraw_at: int = 0, age: float = 0.0, key: str = ""
) -> str:
    """A channel row holding `charged - claimed` unclaimed, its first unclaimed charge `age` seconds ago."""
    channel_id = "0x" + (key or f"{n:064x}")
    now = float(await db.fetchval(f"SELECT {db.clock_sql} AS now"))
    await db.execute(
        "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, balance, total_claimed,"
        " withdraw_requested_at, charged, voucher_max, sealed_voucher, charged_at, first_charged_at, created_at)"
        " VALUES (?, 'eip155:84532', '0xa', '0xp', '0xr', ?, '100000', ?, ?, ?, ?, 'sealed', ?, ?, ?)",
        (
            channel_id,
            json.dumps({"withdrawDelay": 900}),
            str(claimed),
            withdraw_at,
            str(charged),
            str(charged),
            now,
            now - age,
            now - age,
        ),
    )
    return channel_id


def test_every_channel_with_unclaimed_charges_is_walked_past_any_page(location: str) -> None:
    """250 channels hold unclaimed charges (more than two pages of 100): all are claimable now, and
    the one whose payer asked to withdraw comes first, though its charge is the newest."""

    async def body(db: Database) -> None:
        channels = Channels(db)
        await channels.create_tables()
        for n in range(1, 251):
            await add(db, n, charged=1000, age=60.0 - n * 0.1)
        await add(db, 0, charged=5000, key="f" * 64, withdraw_at=1)  # sorts last by key, charged last
        for n in range(251, 261):  # claimed in full: nothing to walk
            await add(db, n, charged=1000, claimed=1000)
        everything = await channels.claimable(0, 0.0)
        assert len(everything) == 251
        assert everything[0].channel_id == "0x" + "f" * 64
        # due by the schedule (an hour old or a million unclaimed): only the withdrawing one, over every page
        due = await channels.claimable(1_000_000, 3600.0)
        assert [c.channel_id for c in due] == ["0x" + "f" * 64]
        pages = [len(page) async for page in channels.unclaimed(page_size=7)]
        assert sum(pages) == 251 and max(pages) == 7

    on(location, body)


def test_a_channel_is_due_by_its_first_unclaimed_charge_not_its_last(location: str) -> None:
    """Charges keep coming on a busy channel: its claim's clock started at the first one not yet claimed."""

    async def body(db: Database) -> None:
        channels = Channels(db)
        await channels.create_tables()
        await add(db, 1, charged=3000, age=400.0)  # first unclaimed charge 400 s ago; its last, now
        await add(db, 2, charged=3000, age=100.0)
        due = await channels.claimable(1_000_000, 300.0)
        assert [c.channel_id for c in due] == ["0x" + f"{1:064x}"]
        assert due[0].now - due[0].charged_at < 60  # charged just now, due all the same

    on(location, body)


def test_the_first_unclaimed_charge_is_kept_until_everything_is_claimed(location: str) -> None:
    async def body(db: Database) -> None:
        store = Store(db)
        await store.setup()
        from gate.schemes.batch_settlement import read
        from tests.gate.flows.channel.test_channel_charge import NETWORK

        voucher = read(voucher_payment("open", 1000).payload["payload"])
        await store.channels.open(voucher, NETWORK, "0xa", 0, None)

        async def first_charged() -> float:
            return float(await db.fetchval("SELECT first_charged_at FROM channels"))

        for i, cumulative in enumerate((1000, 2000), start=1):
            payment = voucher_payment(f"d{i}", cumulative)
            await store.settler.settle(payment, f"t-d{i}", await store.delivered(payment))
            if i == 1:
                assert await first_charged() > 0
                await db.execute("UPDATE channels SET first_charged_at = 1.0")  # a marker for the first charge
        assert await first_charged() == 1.0  # the second charge did not move it
        await db.execute("UPDATE channels SET total_claimed = charged")  # a claim landed: nothing unclaimed
        payment = voucher_payment("d3", 3000)
        await store.settler.settle(payment, "t-d3", await store.delivered(payment))
        assert await first_charged() > 1.0  # the next charge starts the clock again

    on(location, body)


def test_the_migration_dates_unclaimed_charges_from_the_channels_creation(location: str) -> None:
    """A table from before the column: a channel holding unclaimed charges is due from its creation
    (never later than its first unclaimed charge), one with nothing unclaimed is left at 0."""

    async def body(db: Database) -> None:
        await db.migrate("channels", MIGRATIONS[:1])
        for channel_id, charged in (("0x01", "3000"), ("0x02", "0")):
            await db.execute(
                "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, charged, created_at,"
                " charged_at) VALUES (?, 'n', 'a', 'p', 'r', '{}', ?, 100.0, 500.0)",
                (channel_id, charged),
            )
        await Channels(db).create_tables()
        rows = await db.fetch("SELECT channel_id, first_charged_at FROM channels ORDER BY channel_id")
        assert [(r["channel_id"], float(r["first_charged_at"])) for r in rows] == [("0x01", 100.0), ("0x02", 0.0)]

    on(location, body)


def test_a_refused_voucher_is_set_aside_until_a_later_one(location: str) -> None:
    async def body(db: Database) -> None:
        channels = Channels(db)
        await channels.create_tables()
        refused_id = await add(db, 1, charged=2000)
        await add(db, 2, charged=1000)
        (refused,) = [c for c in await channels.claimable(0, 0.0) if c.channel_id == refused_id]
        assert await channels.take_claim(refused, "fence", 60.0)
        assert await channels.refuse(refused_id, "fence", "claim exceeds channel balance") == 1
        assert [c.channel_id for c in await channels.claimable(0, 0.0)] == ["0x" + f"{2:064x}"]
        channel = await channels.find(refused_id)
        assert channel is not None and channel.refused and channel.synced_at == 0
        assert await channels.retry_refused() == 1  # the operator's call: the same voucher again
        (again,) = [c for c in await channels.claimable(0, 0.0) if c.channel_id == refused_id]
        assert await channels.take_claim(again, "fence 2", 60.0)
        assert await channels.refuse(refused_id, "fence 2", "claim exceeds channel balance") == 1
        await db.execute(
            "UPDATE channels SET charged = '3000', voucher_max = '3000' WHERE channel_id = ?", (refused_id,)
        )
        assert len(await channels.claimable(0, 0.0)) == 2  # a later voucher is claimable again

    on(location, body)


def test_the_gauges_say_what_stands_between_withdrawals_and_the_unclaimed_money(location: str) -> None:
    from prometheus_client import CollectorRegistry

    async def body(db: Database) -> None:
        channels = Channels(db)
        await channels.create_tables()
        now = int(float(await db.fetchval(f"SELECT {db.clock_sql} AS now")))
        for n in range(1, 131):  # more than a page
            await add(db, n, charged=1000, age=10.0)
        await add(db, 200, charged=1000, age=500.0, withdraw_at=now - 600)  # final in about 300 s
        await add(db, 201, charged=1000, withdraw_at=now - 100)
        await add(db, 202, charged=1000, claimed=1000, withdraw_at=now - 800)  # nothing unclaimed: not counted
        failing = await add(db, 203, charged=1000)
        await db.execute("UPDATE channels SET claim_failures = 2 WHERE channel_id = ?", (failing,))
        metrics = GateMetrics(CollectorRegistry())
        await metrics.read_channels(channels)
        registry = metrics.registry
        assert registry.get_sample_value("a2a_gate_channels_withdrawal_pending") == 2
        assert 499 <= (registry.get_sample_value("a2a_gate_channel_oldest_unclaimed_seconds") or 0) < 560
        left = registry.get_sample_value("a2a_gate_channel_withdrawal_finalizable_seconds") or 0
        assert 240 <= left <= 301
        assert registry.get_sample_value("a2a_gate_channels_refused") == 0
        assert registry.get_sample_value("a2a_gate_channels_claim_failing") == 1  # A2AGateChannelClaimsFailing

    on(location, body)


def test_a_state_read_before_a_claim_landed_never_moves_the_claimed_total_back(location: str) -> None:
    """The watch reads the chain while a claim of ours lands and is recorded: written after it, that
    older state would make the claimed vouchers look unclaimed again (claimed and counted twice)."""
    from gate.flows.channel.store import Mirror

    async def body(db: Database) -> None:
        channels = Channels(db)
        await channels.create_tables()
        channel_id = await add(db, 1, charged=1000)
        (before,) = await channels.claimable(0, 0.0)  # the watch's read: nothing claimed yet
        assert await channels.take_claim(before, "claimer", 60.0)
        sql, args = channels.claimed_statement(channel_id, "claimer", None)
        await db.execute(sql, args)  # the claim landed and is recorded
        stale = Mirror(balance=100000, total_claimed=0, withdraw_requested_at=0, refund_nonce=0)
        assert await channels.mirror(channel_id, stale, read=before) == 0  # not over a row that moved
        await channels.mirror(channel_id, stale)  # a facilitator's older answer
        found = await channels.find(channel_id)
        assert found is not None and found.total_claimed == 1000 and found.unclaimed == 0
        for total in (999, 10**30, 10**30 - 1, 2**128 - 1, 12):  # numerically, past any integer column
            await channels.mirror(channel_id, Mirror(2**128 - 1, total, 0, 0))
        found = await channels.find(channel_id)
        assert found is not None and found.total_claimed == 2**128 - 1

    on(location, body)
