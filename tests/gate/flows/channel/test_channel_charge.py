"""A delivered voucher's charge, below the HTTP layer: the channel's compare-and-set, the claim
settled and its log row are one statement group, each applying only if the one it stands on did.

On a real SQLite file and on PostgreSQL (the `location` fixture): the channel is charged only
by a claim still ours, and the claim is settled only if the channel was charged by it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gate.chain import Chain
from gate.claims import ClaimLost, Claims, ClaimState, Hold
from gate.config import FacilitatorConfig, GateConfig, Price
from gate.facilitator import FacilitatorClient
from gate.flows import Flows
from gate.flows.channel import vouchers
from gate.flows.channel.flow import ChannelFlow
from gate.flows.channel.store import Channels, Mirror
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.schemes.batch_settlement import SCHEME_NAME, read
from gate.settlement import Payment, Settler
from gate.tokens import Token
from server.database import Database, DatabaseUnavailable
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


class Sealed:
    """Seals every voucher as the same text: the store's writes are what these tests read."""

    def seal(self, document: dict[str, Any], context: str) -> str:
        return "sealed"


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.claims, self.channels, self.log = Claims(db, lease_seconds=30.0), Channels(db), PaymentLog(db)
        config = FacilitatorConfig(url="http://127.0.0.1:9", timeout_seconds=1, settle_attempts=1, settle_passes=1)
        facilitator, metrics = FacilitatorClient(config), GateMetrics(CollectorRegistry())
        self.metrics = metrics
        flow = ChannelFlow(self.channels, facilitator, Chain({}), self.log, metrics, Sealed(), GateConfig(config))
        self.settler = Settler(facilitator, self.claims, self.log, config, Flows({SCHEME_NAME: flow}))

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


def run(location: str, body: Any, opened: Any = None) -> None:
    """`body(store)` on a store with one channel: `opened(store)` opens it (by default, unmirrored)."""

    async def main() -> None:
        db = open_database(location)
        await db.open()
        try:
            store = Store(db)
            await store.setup()
            if opened is None:
                voucher = read(voucher_payment("open", PRICE).payload["payload"])
                await store.channels.open(voucher, NETWORK, ASSET, 0, None)
            else:
                await opened(store)
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


async def delivering(store: Store) -> tuple[Payment, Hold]:
    """The voucher `d1`'s work running under its claim, and a table standing for its task's row."""
    await store.db.execute("CREATE TABLE delivered (id TEXT)")
    payment = voucher_payment("d1", PRICE)
    return payment, await claimed(store, payment)


async def nothing_recorded(store: Store) -> None:
    """No settle row and no task saved for `d1`."""
    assert await store.actions("d1") == []
    assert await store.db.fetchval("SELECT count(*) FROM delivered") == 0


def task_save(task_id: str) -> Any:
    return lambda ours: (f"INSERT INTO delivered (id) SELECT ? WHERE {ours[0]}", (task_id, *ours[1]))


def test_a_vouchers_delivery_and_its_charge_are_one_write(location: str) -> None:
    async def body(store: Store) -> None:
        await store.db.execute("CREATE TABLE delivered (id TEXT)")
        payment = voucher_payment("d1", PRICE)
        assert store.settler.charged_at_delivery(payment)
        hold = await claimed(store, payment)
        collection = await store.settler.settle_delivery(
            payment, "t-d1", hold, along=lambda metadata: [task_save("t-d1")]
        )
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
        payment, hold = await delivering(store)
        await store.db.execute("UPDATE channels SET charged = ? WHERE channel_id = ?", (str(5 * PRICE), CHANNEL))
        assert (
            await store.settler.settle_delivery(payment, "t-d1", hold, along=lambda metadata: [task_save("t-d1")])
            is None
        )
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.RUNNING
        assert await store.charged() == 5 * PRICE
        await nothing_recorded(store)

    run(location, body)


def test_a_vouchers_delivery_under_a_claim_taken_over_charges_and_saves_nothing(location: str) -> None:
    async def body(store: Store) -> None:
        payment, hold = await delivering(store)
        await store.db.execute("UPDATE claims SET fence = 'someone else' WHERE token_digest = 'd1'")
        with pytest.raises(ClaimLost):
            await store.settler.settle_delivery(payment, "t-d1", hold, along=lambda metadata: [task_save("t-d1")])
        assert await store.charged() == 0
        await nothing_recorded(store)

    run(location, body)


# -- a voucher checked before its claim reserves its channel with the claim --------------------


def signed_voucher_token(account: Any, request: str, cumulative: int) -> Token:
    """A voucher token signed by `account` (the channel's payer authorizer) for `cumulative`;
    `request` tells two tokens of the same voucher apart (their resource)."""
    from gate.schemes.batch_settlement import voucher_digest

    signature = account.unsafe_sign_hash(voucher_digest(CHANNEL, cumulative, NETWORK)).signature.hex()
    payment = voucher_payment(request, cumulative)
    inner = payment.payload["payload"]
    config = {**CONFIG, "payer": account.address, "payerAuthorizer": account.address}
    inner = {**inner, "channelConfig": config, "voucher": {**inner["voucher"], "signature": "0x" + signature}}
    payload = {**payment.payload, "payload": inner, "resource": {"url": f"http://gate/{request}"}}
    return Token(payload=payload, version=2, source="PAYMENT-SIGNATURE")


def price() -> Price:
    return Price(scheme=SCHEME_NAME, network=NETWORK, asset=ASSET, amount=str(PRICE), pay_to="0x" + "22" * 20)


def run_with_account(location: str, body: Any) -> None:
    """`body(store, account)`: the channel's payer authorizer is `account`, its mirror fresh."""
    from eth_account import Account

    account = Account.create()

    async def opened(store: Store) -> None:
        voucher = read(signed_voucher_token(account, "open", PRICE).payload["payload"])
        await store.channels.open(voucher, NETWORK, ASSET, 0, Mirror(10 * PRICE, 0, 0, 0))

    async def with_account(store: Store) -> None:
        await body(store, account)

    run(location, with_account, opened)


def test_a_fresh_channels_voucher_is_reserved_with_its_claim_and_a_retry_reserves_nothing(location: str) -> None:
    async def body(store: Store, account: Any) -> None:
        token = signed_voucher_token(account, "v1", PRICE)
        reservable = await vouchers.reservable(store.channels, token, price())
        assert reservable is not None and reservable.payer == account.address.lower()
        outcome = await store.claims.claim(token.digest, "", "r", "paid-channel", "", along=[reservable.reserve])
        assert outcome.kind == "new" and outcome.along == (1,)
        channel = await store.channels.find(CHANNEL)
        assert channel is not None and channel.reserved_by == token.digest
        # the same voucher again: its claim is taken, so its reservation is not made again
        await store.db.execute("UPDATE channels SET reserved_by = '' WHERE channel_id = ?", (CHANNEL,))
        again = await store.claims.claim(token.digest, "", "r", "paid-channel", "", along=[reservable.reserve])
        assert again.kind == "in_flight"
        channel = await store.channels.find(CHANNEL)
        assert channel is not None and channel.reserved_by == ""

    run_with_account(location, body)


def test_two_vouchers_on_one_base_claimed_at_once_reserve_the_channel_once(location: str) -> None:
    """Both checked before either claim is taken (the channel unheld for both), then both claims
    with their reservations at once, each in its own transaction: one reserves, the other not
    (on PostgreSQL the second waits on the row, then finds it held: `unheld` is a condition on the
    row itself, which a concurrent transaction's claim in a subquery would not be)."""

    async def body(store: Store, account: Any) -> None:
        for round_ in range(8):
            tokens = [signed_voucher_token(account, f"r{round_}-{i}", PRICE) for i in range(2)]
            checked = [await vouchers.reservable(store.channels, t, price()) for t in tokens]
            assert all(c is not None for c in checked)
            outcomes = await asyncio.gather(
                *(
                    store.claims.claim(t.digest, "", t.digest, "paid-channel", "", along=[c.reserve])
                    for t, c in zip(tokens, checked, strict=True)
                    if c is not None
                )
            )
            assert sorted(o.along for o in outcomes) == [(0,), (1,)], outcomes
            assert not await reserved_with_claim(store, signed_voucher_token(account, f"r{round_}-x", PRICE))  # held
            await store.db.execute("UPDATE channels SET reserved_by = '' WHERE channel_id = ?", (CHANNEL,))

    run_with_account(location, body)


def counting_reads(channels: Channels) -> list[str]:
    """The channel ids `channels` reads rows of from now on, in order."""
    reads: list[str] = []
    find = channels.find

    async def counted(channel_id: str) -> Any:
        reads.append(channel_id)
        return await find(channel_id)

    channels.find = counted  # type: ignore[method-assign]
    return reads


async def reserved_with_claim(store: Store, token: Token) -> bool:
    """Whether `token`'s voucher, checked before its claim, reserves its channel with the claim."""
    checked = await vouchers.reservable(store.channels, token, price())
    if checked is None:
        return False
    outcome = await store.claims.claim(token.digest, "", token.digest, "paid-channel", "", along=[checked.reserve])
    assert outcome.kind == "new"
    return outcome.along == (1,)


def test_only_a_fresh_channels_well_signed_voucher_at_its_base_is_checked_before_its_claim(location: str) -> None:
    from eth_account import Account

    async def body(store: Store, account: Any) -> None:
        async def free() -> None:
            await store.db.execute("UPDATE channels SET reserved_by = '' WHERE channel_id = ?", (CHANNEL,))

        assert await reserved_with_claim(store, signed_voucher_token(account, "v0", PRICE))
        await free()
        # not at the channel's base, beyond its balance, signed by someone else, or a stale mirror
        assert not await reserved_with_claim(store, signed_voucher_token(account, "v1", 2 * PRICE))
        await store.db.execute("UPDATE channels SET charged = ? WHERE channel_id = ?", (str(10 * PRICE), CHANNEL))
        assert not await reserved_with_claim(store, signed_voucher_token(account, "v2", 11 * PRICE))
        await store.db.execute("UPDATE channels SET charged = '0' WHERE channel_id = ?", (CHANNEL,))
        forged = signed_voucher_token(Account.create(), "v3", PRICE)
        forged.payload["payload"]["channelConfig"] = signed_voucher_token(account, "v3", PRICE).payload["payload"][
            "channelConfig"
        ]
        assert not await reserved_with_claim(store, forged)
        await store.db.execute("UPDATE channels SET synced_at = 1 WHERE channel_id = ?", (CHANNEL,))
        assert not await reserved_with_claim(store, signed_voucher_token(account, "v4", PRICE))
        store.channels.recent.clear()  # read afresh: the stale mirror is seen before the claim
        assert await vouchers.reservable(store.channels, signed_voucher_token(account, "v5", PRICE), price()) is None

    run_with_account(location, body)


# What the row can say since this process last saw it, each a reason a fresh read would not reserve
MOVED_SINCE_SEEN = {
    "charged by another replica": f"charged = '{PRICE}'",
    "balance lowered": f"balance = '{PRICE - 1}'",
    "claimed up to the voucher": f"total_claimed = '{PRICE}'",
    "withdrawal requested": "withdraw_requested_at = 1",
    "mirror gone stale": "synced_at = 1",
    "mirror synced again": "synced_at = synced_at + 1",
    "refunded": "refunded = 1",
}


@pytest.mark.parametrize("moved", MOVED_SINCE_SEEN)
def test_a_voucher_checked_against_what_this_process_last_saw_reserves_nothing_the_row_no_longer_says(
    location: str, moved: str
) -> None:
    """The operator's side of checking a voucher before its claim without reading its channel: the
    snapshot it was checked against is a hint, never an authority. Whatever changed in the row since
    (another replica's charge, the chain watcher's withdrawal or claim, a stale mirror), the
    reservation made with the claim does not apply, and the full check after the claim reads it."""

    async def body(store: Store, account: Any) -> None:
        assert await vouchers.reservable(store.channels, signed_voucher_token(account, "seen", PRICE), price())
        await store.db.execute(f"UPDATE channels SET {MOVED_SINCE_SEEN[moved]} WHERE channel_id = ?", (CHANNEL,))
        assert not await reserved_with_claim(store, signed_voucher_token(account, "after", PRICE))
        channel = await store.channels.find(CHANNEL)
        assert channel is not None and channel.reserved_by == ""

    run_with_account(location, body)


def test_the_voucher_after_one_this_process_charged_is_checked_without_reading_its_channel(location: str) -> None:
    """The channel flow's charge leaves what it wrote as the channel's last sight: the payer's next
    voucher is checked and reserved with its claim, and no channel row is read for it."""

    async def body(store: Store, account: Any) -> None:
        first = signed_voucher_token(account, "first", PRICE)
        assert await reserved_with_claim(store, first)
        await store.db.execute(
            "UPDATE channels SET charged = ?, reserved_by = '' WHERE channel_id = ?", (str(PRICE), CHANNEL)
        )
        flow = store.settler.flows.for_price(price())
        flow.count_settled(replace(voucher_payment(first.digest, PRICE), payload=first.payload))
        reads = counting_reads(store.channels)
        assert await reserved_with_claim(store, signed_voucher_token(account, "second", 2 * PRICE))
        assert reads == []

    run_with_account(location, body)


def test_a_vouchers_delivery_with_its_final_task_leaves_the_claim_in_sync(location: str) -> None:
    """The task's final form goes with the delivery, built from the outcome's metadata (the receipt),
    so the claim needs no later write: it is settled and its task up to date."""

    async def body(store: Store) -> None:
        payment, hold = await delivering(store)
        shown: list[dict[str, Any]] = []

        def final(metadata: dict[str, Any]) -> list[Any]:
            shown.append(metadata)
            return [task_save("t-d1")]

        collection = await store.settler.settle_delivery(payment, "t-d1", hold, along=final)
        assert collection is not None and shown == [collection.metadata]
        receipt = shown[0]["x402.payment.receipts"][-1]
        assert receipt["extra"]["channelState"]["chargedCumulativeAmount"] == str(PRICE)
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.SETTLED and not claim.task_outdated
        assert "d1" not in store.claims.held  # nothing left to renew
        assert await store.db.fetchval("SELECT count(*) FROM delivered") == 1

    run(location, body)


def test_a_voucher_reserved_after_its_claim_and_one_reserved_with_its_claim_at_once_reserve_once(
    location: str,
) -> None:
    """One voucher on the full check (its claim first, then `reserve`), another checked before its
    claim and reserved with it, at once: one reservation (on PostgreSQL the full check's subquery
    would not see the other's claim, committed with its reservation while the statement waited)."""

    async def body(store: Store, account: Any) -> None:
        for round_ in range(8):
            late, early = (signed_voucher_token(account, f"r{round_}-{i}", PRICE) for i in range(2))
            assert (await store.claims.claim(late.digest, "", late.digest, "paid-channel", "")).hold is not None
            checked = await vouchers.reservable(store.channels, early, price())
            assert checked is not None
            claimed_early, reserved_late = await asyncio.gather(
                store.claims.claim(early.digest, "", early.digest, "paid-channel", "", along=[checked.reserve]),
                store.channels.reserve(CHANNEL, 0, late.digest, deposit=False),
            )
            assert sorted([claimed_early.along[0], int(reserved_late.kind == "reserved")]) == [0, 1]
            await store.db.execute("UPDATE channels SET reserved_by = '' WHERE channel_id = ?", (CHANNEL,))

    run_with_account(location, body)


def test_a_refund_taken_as_a_voucher_is_reserved_with_its_claim_takes_the_channel_or_leaves_it(
    location: str,
) -> None:
    """The refund job closing an idle channel while a voucher reserves it with its claim: one of the
    two gets it, never both (a refund must not close a channel a request is charging)."""

    async def body(store: Store, account: Any) -> None:
        for round_ in range(8):
            token = signed_voucher_token(account, f"r{round_}", PRICE)
            checked = await vouchers.reservable(store.channels, token, price())
            channel = await store.channels.find(CHANNEL)
            assert checked is not None and channel is not None
            claimed, refund = await asyncio.gather(
                store.claims.claim(token.digest, "", token.digest, "paid-channel", "", along=[checked.reserve]),
                store.channels.take_refund(channel, f"fence-{round_}", 60.0),
            )
            assert sorted([claimed.along[0], int(refund)]) == [0, 1], (claimed.along, refund)
            await store.db.execute(
                "UPDATE channels SET reserved_by = '', refunded = 0, claim_fence = '' WHERE channel_id = ?", (CHANNEL,)
            )

    run_with_account(location, body)


def test_a_delivery_write_whose_answer_was_lost_is_not_taken_for_a_takeover(location: str) -> None:
    """The delivery's write commits, its answer is lost (the connection dropped after COMMIT), and
    `commit_until_stored` sends it again: the claim is ours and settled already, so the retry is
    that write's success, not a claim lost to another process."""

    async def body(store: Store) -> None:
        payment, hold = await delivering(store)
        write_together = store.db.write_together
        lost: list[bool] = []

        async def answer_lost_once(statements: Any) -> list[int]:
            counts = await write_together(statements)
            if not lost:
                lost.append(True)
                raise DatabaseUnavailable("connection lost after COMMIT")
            return counts

        store.db.write_together = answer_lost_once  # type: ignore[method-assign]
        collection = await store.settler.settle_delivery(
            payment, "t-d1", hold, along=lambda metadata: [task_save("t-d1")]
        )
        assert lost and collection is not None and collection.state == ClaimState.SETTLED
        assert await store.charged() == PRICE
        assert await store.actions("d1") == ["settle"]
        assert await store.db.fetchval("SELECT count(*) FROM delivered") == 1

    run(location, body)


def test_a_fenced_write_whose_answer_was_lost_is_found_landed_without_a_retry(location: str) -> None:
    """A delivery recorded outside any retry loop (`Claims.mark_delivered`): its write commits and its
    answer is lost; the claim names that very write (`last_write`), so the write is its success."""

    async def body(store: Store) -> None:
        payment = voucher_payment("d1", PRICE)
        hold = await claimed(store, payment)
        execute = store.db.execute

        async def answer_lost_once(sql: str, args: Any = ()) -> int:
            store.db.execute = execute  # type: ignore[method-assign]
            await execute(sql, args)
            raise DatabaseUnavailable("connection lost after COMMIT")

        store.db.execute = answer_lost_once  # type: ignore[method-assign]
        await store.claims.mark_delivered(hold, payer=payment.payer, task_id="t-d1")
        assert store.db.execute == execute  # the lost answer was met
        claim = await store.claims.find("d1")
        assert claim is not None and claim.state == ClaimState.SETTLING

    run(location, body)


def test_a_voucher_is_claimed_unsealed_and_sealed_onto_its_claim_once_delivered_apart_from_its_charge(
    location: str,
) -> None:
    """A voucher is charged in its delivery's own write, so its claim keeps no sealed copy of it while
    the work runs (nothing reads one: undelivered work is released). When its delivery is recorded
    apart from its charge (the channel moved under it, a withheld answer), the claim is `settling` and
    whoever takes it over settles it from the claim: the payment is sealed onto it in that write."""
    from gate.charge import Charges, LiveDeliveries

    async def body(store: Store) -> None:
        payment = voucher_payment("s1", PRICE)
        charges = Charges(store.claims, store.settler, store.log, LiveDeliveries(store.metrics), Sealed())
        assert charges.sealed_at_claim(payment) == ""
        hold = await claimed(store, payment)
        running = await store.claims.find("s1")
        assert running is not None and running.sealed_payment == ""
        delivery = charges.hooks(payment, hold, withhold=False)
        await delivery.mark_delivered({"id": "t-s1"}, None, {}, None)
        settling = await store.claims.find("s1")
        assert settling is not None and settling.state == ClaimState.SETTLING
        assert settling.sealed_payment == "sealed"

    run(location, body)


def test_a_channel_another_writer_moved_is_read_afresh_before_each_voucher_for_a_while(location: str) -> None:
    """Replicas serving one channel in turn: what this process last saw of it is stale more often
    than not, and a check against it costs the full check after the claim. Once a read finds the
    row moved by another writer, each voucher's first check reads the row first, as it did before
    there was a last sight to use, so such a channel costs no more than that."""

    async def body(store: Store, account: Any) -> None:
        assert await store.channels.find(CHANNEL) is not None  # this process's last sight
        await store.db.execute("UPDATE channels SET charged = ? WHERE channel_id = ?", (str(PRICE), CHANNEL))
        assert not await reserved_with_claim(store, signed_voucher_token(account, "stale", 2 * PRICE))
        assert CHANNEL not in store.channels.contended
        await store.channels.find(CHANNEL)  # the full check's read, after the claim
        assert CHANNEL in store.channels.contended
        reads = counting_reads(store.channels)
        assert await reserved_with_claim(store, signed_voucher_token(account, "fresh", 2 * PRICE))
        assert reads == [CHANNEL]

    run_with_account(location, body)
