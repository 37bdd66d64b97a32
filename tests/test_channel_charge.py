"""A delivered voucher's charge, below the HTTP layer: the channel's compare-and-set, the claim
settled and its log row are one statement group, each applying only if the one it stands on did.

On a real SQLite file and on PostgreSQL (the `location` fixture): the channel is charged only
by a claim still ours, and the claim is settled only if the channel was charged by it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gate.channels import Channels
from gate.claims import ClaimLost, Claims, ClaimState, Hold
from gate.config import FacilitatorConfig
from gate.facilitator import FacilitatorClient
from gate.payment_log import PaymentLog
from gate.schemes.batch_settlement import SCHEME_NAME, read
from gate.settlement import Payment, Settler
from server.database import Database
from server.engines import open_database

NETWORK, ASSET, PRICE = "eip155:84532", "0x036cbd53842c5426634e7929541ec2318f3dcf7e", 1000
CHANNEL = "0x" + "ab" * 32
CONFIG = {
    "payer": "0x" + "11" * 20,
    "payerAuthorizer": "0x" + "11" * 20,
    "receiver": "0x" + "22" * 20,
    "receiverAuthorizer": "0x" + "33" * 20,
    "token": ASSET,
    "withdrawDelay": 900,
    "salt": "0x" + "00" * 32,
}


def voucher_payment(digest: str, cumulative: int) -> Payment:
    requirements = {
        "scheme": SCHEME_NAME,
        "network": NETWORK,
        "asset": ASSET,
        "amount": str(PRICE),
        "payTo": "0x" + "22" * 20,
    }
    inner = {
        "type": "voucher",
        "channelConfig": CONFIG,
        "voucher": {"channelId": CHANNEL, "maxClaimableAmount": str(cumulative), "signature": "0x" + "99" * 65},
    }
    payload = {"x402Version": 2, "accepted": requirements, "payload": inner}
    return Payment(digest, 2, payload, requirements, "paid-channel", CONFIG["payer"], str(PRICE), NETWORK, ASSET)


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.claims, self.channels, self.log = Claims(db, lease_seconds=30.0), Channels(db), PaymentLog(db)
        config = FacilitatorConfig(url="http://127.0.0.1:9", timeout_seconds=1, settle_attempts=1, settle_passes=1)
        self.settler = Settler(
            FacilitatorClient(config), self.claims, self.log, config, channels=self.channels, seal=lambda v, k: "sealed"
        )

    async def setup(self) -> None:
        await self.claims.create_tables()
        await self.channels.create_tables()
        await self.log.create_tables()

    async def delivered(self, payment: Payment) -> Hold:
        """A voucher's claim taken, its channel reserved, its work delivered (the claim `settling`)."""
        hold = (await self.claims.claim(payment.token_digest, "", "r", payment.agent, "")).hold
        assert hold is not None
        voucher = read(payment.payload["payload"])
        reservation = await self.channels.reserve(
            CHANNEL, voucher.max_claimable - PRICE, hold.token_digest, deposit=False
        )
        assert reservation.kind == "reserved"
        await self.claims.mark_delivered(hold, payer=payment.payer, task_id="t-" + payment.token_digest)
        return hold

    async def charged(self) -> int:
        channel = await self.channels.find(CHANNEL)
        assert channel is not None
        return channel.charged

    async def actions(self, digest: str) -> list[str]:
        rows = await self.db.fetch("SELECT action FROM payments WHERE token_digest = ? ORDER BY id", (digest,))
        return [r["action"] for r in rows]


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, or a PostgreSQL URL on a fresh schema."""
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return str(request.getfixturevalue("postgres_schema").store_url())


def run(location: str, body: Any) -> None:
    async def main() -> None:
        db = open_database(location)
        await db.open()
        try:
            store = Store(db)
            await store.setup()
            voucher = read(voucher_payment("open", PRICE).payload["payload"])
            await store.channels.open(voucher, NETWORK, ASSET, 0, None)
            await body(store)
        finally:
            await db.close()

    asyncio.run(main())


def test_a_delivered_voucher_charges_its_channel_and_settles_its_claim_together(location: str) -> None:
    async def body(store: Store) -> None:
        payment = voucher_payment("d1", PRICE)
        hold = await store.delivered(payment)
        collection = await store.settler.settle(payment, "t-d1", hold)
        assert collection.state == ClaimState.SETTLED and collection.paid
        assert await store.charged() == PRICE
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.SETTLED
        assert await store.actions("d1") == ["settle"]

    run(location, body)


def test_a_voucher_whose_channel_moved_past_its_base_is_unsettled_and_charges_nothing(location: str) -> None:
    async def body(store: Store) -> None:
        payment = voucher_payment("d1", PRICE)
        hold = await store.delivered(payment)
        # the channel charged past this voucher's base meanwhile (another request's charge)
        await store.db.execute("UPDATE channels SET charged = ? WHERE channel_id = ?", (str(5 * PRICE), CHANNEL))
        collection = await store.settler.settle(payment, "t-d1", hold)
        assert collection.state == ClaimState.UNSETTLED and not collection.paid
        assert await store.charged() == 5 * PRICE
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.UNSETTLED
        assert "settle" not in await store.actions("d1")

    run(location, body)


def test_a_voucher_whose_claim_was_taken_over_charges_nothing(location: str) -> None:
    async def body(store: Store) -> None:
        payment = voucher_payment("d1", PRICE)
        hold = await store.delivered(payment)
        await store.db.execute("UPDATE claims SET fence = 'someone else' WHERE token_digest = 'd1'")
        with pytest.raises(ClaimLost):
            await store.settler.settle(payment, "t-d1", hold)
        assert await store.charged() == 0
        assert await store.actions("d1") == []

    run(location, body)


async def claimed(store: Store, payment: Payment) -> Hold:
    """A voucher's claim taken and its channel reserved, its work running (not delivered yet)."""
    hold = (await store.claims.claim(payment.token_digest, "", "r", payment.agent, "")).hold
    assert hold is not None
    voucher = read(payment.payload["payload"])
    assert (
        await store.channels.reserve(CHANNEL, voucher.max_claimable - PRICE, hold.token_digest, deposit=False)
    ).kind == "reserved"
    return hold


def task_save(task_id: str) -> Any:
    return lambda ours: (f"INSERT INTO delivered (id) SELECT ? WHERE {ours[0]}", (task_id, *ours[1]))


def test_a_vouchers_delivery_and_its_charge_are_one_write(location: str) -> None:
    async def body(store: Store) -> None:
        await store.db.execute("CREATE TABLE delivered (id TEXT)")
        payment = voucher_payment("d1", PRICE)
        assert store.settler.charged_at_delivery(payment)
        hold = await claimed(store, payment)
        collection = await store.settler.settle_delivery(payment, "t-d1", hold, along=[task_save("t-d1")])
        assert collection is not None and collection.state == ClaimState.SETTLED and collection.paid
        assert await store.charged() == PRICE
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.SETTLED and claim.task_id == "t-d1"
        assert claim.payer == CONFIG["payer"]
        assert await store.actions("d1") == ["settle"]
        assert await store.db.fetchval("SELECT count(*) FROM delivered") == 1

    run(location, body)


def test_a_vouchers_delivery_on_a_moved_channel_writes_nothing_and_leaves_the_claim_running(location: str) -> None:
    async def body(store: Store) -> None:
        await store.db.execute("CREATE TABLE delivered (id TEXT)")
        payment = voucher_payment("d1", PRICE)
        hold = await claimed(store, payment)
        await store.db.execute("UPDATE channels SET charged = ? WHERE channel_id = ?", (str(5 * PRICE), CHANNEL))
        assert await store.settler.settle_delivery(payment, "t-d1", hold, along=[task_save("t-d1")]) is None
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.RUNNING
        assert await store.charged() == 5 * PRICE
        assert await store.actions("d1") == []
        assert await store.db.fetchval("SELECT count(*) FROM delivered") == 0

    run(location, body)


def test_a_vouchers_delivery_under_a_claim_taken_over_charges_and_saves_nothing(location: str) -> None:
    async def body(store: Store) -> None:
        await store.db.execute("CREATE TABLE delivered (id TEXT)")
        payment = voucher_payment("d1", PRICE)
        hold = await claimed(store, payment)
        await store.db.execute("UPDATE claims SET fence = 'someone else' WHERE token_digest = 'd1'")
        with pytest.raises(ClaimLost):
            await store.settler.settle_delivery(payment, "t-d1", hold, along=[task_save("t-d1")])
        assert await store.charged() == 0
        assert await store.actions("d1") == []
        assert await store.db.fetchval("SELECT count(*) FROM delivered") == 0

    run(location, body)
