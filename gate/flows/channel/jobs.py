"""Collecting payment channels: vouchers claimed on chain in batches, claimed funds swept to payTo.

Delivered requests only advance a channel's charged total (`store`); the money moves
when the gate claims the channel's latest voucher on the settlement contract. A pass claims
every channel whose charged total runs `claim_at_amount` ahead of what is claimed, or whose
oldest unclaimed charge is `claim_after_seconds` old (both configurable, `[channels]`), one
facilitator `settle` call (`type: "claim"`) per receiver, then sweeps the claimed funds to the
receiver (`type: "settle"`). The facilitator signs the claims with the receiver-authorizer key
it holds (the offer's `receiverAuthorizer`).

A claim is fenced like a settlement (a channel's `claim_fence` and lease, by the database's
clock): one replica claims a channel at a time. A claim's outcome is classified like an
`exact` settle: success raises the claimed total; a refusal, or an answer nobody has (timeout,
5xx), leaves the channel claimable again after a backoff. A claim is cumulative (it raises the
claimed total to the voucher's maximum), so sending it again after an unknown outcome can
never claim twice: the chain decides. Every claim, failure and sweep is a payment log row
(`channel_claim`, `channel_claim_failed`, `channel_settle`) and a metric.

After as many failed claims in a row as an owed settle gets passes (`settle_passes`), backing off
each time, the schedule stops claiming that channel and says so (`needs_attention`);
`a2a-gate channels claim` tries it again.

One row the contract refuses never sinks its batch: a refused batch is halved until the refused
rows stand alone, the rest is claimed in the same pass, and each refused row is set aside
(`refused`, terminal for its voucher: a `channel_claim_failed` and a `needs_attention` row,
`a2a_gate_channel_transactions{action="claim",outcome="refused"}`). A row is the refused one only
when another row of its batch landed or the chain shows its balance no longer backs it; when every
row is refused alone the facilitator is the likelier cause, and they are failed claims as before.

The claim obligation (DESIGN 6): every charged voucher increment is claimed before its payer could
withdraw it. Each pass walks every channel with unclaimed charges, page by page, never a capped
list: the withdrawal watch reads each from the chain, and a payer's withdrawal makes its channel due
at once; otherwise a channel is due `claim_after_seconds` after its FIRST unclaimed charge (the
oldest money first). `gate.config.claim_obligation_problems` refuses a schedule that could not
land a claim, one failure included, inside the withdraw delay an offer states.

A channel idle for `refund_after_seconds` is refunded cooperatively: what it holds beyond its
charged total goes back to its payer, its unclaimed vouchers claimed in the same transaction
(`channel_refund`). It is closed to vouchers from the moment its refund is taken (so no request
can be charged against money on its way back); a deposit opens it again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import defaultdict
from typing import Any

from gate.chain import ChainUnavailable
from gate.config import channel_offers
from gate.facilitator import SettleAnswer, Unavailable
from gate.flows.channel.parts import ChannelParts
from gate.flows.channel.store import Channel, Mirror
from gate.schemes import batch_settlement
from server.database import commit_until_stored

logger = logging.getLogger("a2a_gate.channels")

# how long one replica's claim or refund job holds a channel (its `claim_fence`, `claim_until`); not the
# request's claim lease (`claim_lease_seconds`, gate/claims.py)
CHANNEL_JOB_LEASE_SECONDS = 60.0
MAX_CLAIMS_PER_BATCH = 100


def requirements(network: str, asset: str, receiver: str) -> dict[str, Any]:
    """The requirements a claim or sweep is sent with (the binding's channel manager's)."""
    return {
        "scheme": batch_settlement.SCHEME_NAME,
        "network": network,
        "asset": asset,
        "amount": "0",
        "payTo": receiver,
        "maxTimeoutSeconds": 0,
        "extra": {},
    }


WATCH_CONCURRENCY = 8  # channels read from the chain at once by the withdrawal watch


async def watch(flow: ChannelParts) -> list[dict[str, Any]]:
    """Where the chain can be asked (`[networks] rpc_url`), read every channel with unclaimed charges,
    page by page (nothing caps how many): a claim whose answer was lost is settled by what the chain
    says it claimed, and a payer's withdrawal request makes its channel due now (it may take the
    unclaimed balance once the withdraw delay runs out)."""
    outcomes: list[dict[str, Any]] = []
    slots = asyncio.Semaphore(WATCH_CONCURRENCY)

    async def read(channel: Channel) -> list[dict[str, Any]]:
        async with slots:
            return await watch_one(flow, channel)

    async for page in flow.store.unclaimed():
        # (a claim in flight is its claimer's to record)
        watched = [c for c in page if flow.chain.knows(c.network) and not in_flight(c)]
        for found in await asyncio.gather(*(read(c) for c in watched)):
            outcomes.extend(found)
    return outcomes


def in_flight(channel: Channel) -> bool:
    return bool(channel.claim_fence) and channel.claim_until >= channel.now


async def watch_one(flow: ChannelParts, channel: Channel) -> list[dict[str, Any]]:
    try:
        balance, claimed, withdrawal = await flow.chain.channel(
            channel.network, batch_settlement.SETTLEMENT_CONTRACT, channel.channel_id
        )
    except ChainUnavailable as exc:
        logger.warning("the chain cannot say where channel %s stands: %s", channel.channel_id[:18], exc.reason)
        return []
    outcomes: list[dict[str, Any]] = []
    mirror = Mirror(balance, claimed, withdrawal, channel.refund_nonce)
    # only over the row as read: a claim taken or recorded since is its claimer's (the next pass reads again)
    if not await flow.store.mirror(channel.channel_id, mirror, read=channel):
        return []
    if claimed > channel.total_claimed:
        flow.metrics.revenue.labels(channel.network, channel.asset).inc(claimed - channel.total_claimed)
        await flow.log.append(
            "channel_claim",
            agent="",
            scheme=batch_settlement.SCHEME_NAME,
            token_digest=channel.voucher_digest,
            payer=channel.payer,
            amount=str(claimed - channel.total_claimed),
            network=channel.network,
            asset=channel.asset,
            error=f"confirmed on chain: channel {channel.channel_id[:18]} claimed to {claimed}",
        )
        outcomes.append(
            {
                "outcome": "confirmed",
                "channel": channel.channel_id,
                "claimed": claimed,
                "receiver": (channel.network, channel.asset, channel.receiver),
            }
        )
    if withdrawal and claimed < channel.charged:
        if not channel.withdraw_requested_at:
            logger.warning(
                "channel %s: its payer asked to withdraw (at %d, final after %d s) with %d unclaimed: due now",
                channel.channel_id[:18],
                withdrawal,
                channel.withdraw_delay,
                channel.charged - claimed,
            )
        outcomes.append({"outcome": "withdrawal_requested", "channel": channel.channel_id})
    return outcomes


async def claim_due(flow: ChannelParts, *, now: bool = False) -> list[dict[str, Any]]:
    """One pass: claim what is due (everything unclaimed, with `now`), then sweep; returns what happened."""
    terms = flow.config.channels
    watched = await watch(flow)
    min_amount, max_age = (0, 0.0) if now else (terms.claim_at_amount, terms.claim_after_seconds)
    # the schedule gives up on a channel after as many failed claims as an owed settle gets passes;
    # `a2a-gate channels claim` (now) tries every one again
    budget = None if now else flow.config.facilitator.settle_passes
    due = await flow.store.claimable(min_amount, max_age, max_failures=budget)
    batches: dict[tuple[str, str, str], list[Channel]] = defaultdict(list)
    for channel in due:  # pending withdrawals first, then the oldest unclaimed charge
        batches[(channel.network, channel.asset, channel.receiver)].append(channel)
    outcomes: list[dict[str, Any]] = [{k: v for k, v in o.items() if k != "receiver"} for o in watched]
    confirmed = {o["receiver"] for o in watched if o["outcome"] == "confirmed"}
    for key in confirmed - set(batches):  # claims the chain confirmed, for receivers with nothing else due
        outcomes.append(await sweep(flow, *key))
    for (network, asset, receiver), channels in batches.items():
        claimed = (network, asset, receiver) in confirmed
        for start in range(0, len(channels), MAX_CLAIMS_PER_BATCH):
            batch = channels[start : start + MAX_CLAIMS_PER_BATCH]
            done = await claim_batch(flow, network, asset, receiver, batch)
            claimed = claimed or any(o["outcome"] == "claimed" for o in done)
            outcomes.extend(done)
        if claimed:
            outcomes.append(await sweep(flow, network, asset, receiver))
    return outcomes


async def claim_batch(
    flow: ChannelParts, network: str, asset: str, receiver: str, channels: list[Channel]
) -> list[dict[str, Any]]:
    """Claim `channels` (one receiver's) in one transaction; if the contract refuses the batch, find the
    row(s) it refuses by halving it, claim the rest, and set the refused rows aside (`set_aside`): one
    voucher the contract will not take never holds back another channel's claim."""
    fence = secrets.token_hex(8)
    taken = [c for c in channels if await flow.store.take_claim(c, fence, CHANNEL_JOB_LEASE_SECONDS)]
    if not taken:
        return [{"outcome": "skipped", "channels": 0, "receiver": receiver}]
    outcomes: list[dict[str, Any]] = []
    refused: list[tuple[Channel, str]] = []

    async def attempt(rows: list[Channel]) -> None:
        try:
            answer = await send_claims(flow, network, asset, receiver, rows)
        except Unavailable as exc:  # nobody knows: the whole of it is tried again (the chain decides)
            outcomes.append(await claim_failed(flow, rows, fence, f"claim_unavailable: {exc.reason}", unknown=True))
            return
        if answer.success:
            outcomes.append(await claimed_rows(flow, network, asset, rows, fence, answer))
        elif len(rows) == 1:
            refused.append((rows[0], answer.reason))
        else:  # a refused batch: which of its rows? each half on its own
            middle = len(rows) // 2
            await attempt(rows[:middle])
            await attempt(rows[middle:])

    await attempt(taken)
    landed = any(o["outcome"] == "claimed" for o in outcomes)
    failed: list[Channel] = []
    for channel, reason in refused:
        # refused alone while another row landed, or the chain shows why: the row's own; else every row
        # was refused, which says more of the facilitator than of them: failed claims, tried again
        evidence = await refused_on_chain(flow, channel)
        if landed or evidence:
            outcomes.append(await set_aside(flow, channel, fence, evidence or reason))
        else:
            failed.append(channel)
    if failed:
        outcomes.append(await claim_failed(flow, failed, fence, refused[0][1], unknown=False))
    return outcomes


async def send_claims(flow: ChannelParts, network: str, asset: str, receiver: str, rows: list[Channel]) -> SettleAnswer:
    entries = []
    for channel in rows:
        voucher = flow.keys.unseal(channel.sealed_voucher, channel.channel_id)
        entries.append(
            {
                "voucher": {"channel": channel.config, "maxClaimableAmount": voucher["maxClaimableAmount"]},
                "signature": voucher["signature"],
                "totalClaimed": voucher["maxClaimableAmount"],
            }
        )
    wanted = requirements(network, asset, receiver)
    payload = {"x402Version": 2, "payload": {"type": "claim", "claims": entries}, "accepted": wanted}
    return await flow.facilitator.settle(2, payload, wanted)


async def claimed_rows(
    flow: ChannelParts, network: str, asset: str, taken: list[Channel], fence: str, answer: SettleAnswer
) -> dict[str, Any]:
    statements = [flow.store.claimed_statement(c.channel_id, fence, None) for c in taken]

    async def write() -> None:
        for sql, args in statements:
            await flow.store.db.execute(sql, args)
        for channel in taken:
            await flow.log.append(
                "channel_claim",
                agent="",
                scheme=batch_settlement.SCHEME_NAME,
                token_digest=channel.voucher_digest,
                payer=channel.payer,
                amount=str(channel.voucher_max - channel.total_claimed),
                network=network,
                asset=asset,
                transaction=answer.transaction,
                error=f"channel {channel.channel_id[:18]} claimed to {channel.voucher_max}",
            )

    await commit_until_stored(flow.store.db, write, "a channel claim")
    flow.metrics.channel_transactions.labels("claim", "ok").inc()
    added = sum(c.voucher_max - c.total_claimed for c in taken)
    flow.metrics.revenue.labels(network, asset).inc(added)  # collected: the chain holds it for payTo now
    logger.info(
        "claimed %d voucher(s) on chain, %d atomic units, transaction %s", len(taken), added, answer.transaction
    )
    return {"outcome": "claimed", "channels": len(taken), "amount": added, "transaction": answer.transaction}


async def refused_on_chain(flow: ChannelParts, channel: Channel) -> str:
    """Why the chain cannot take this channel's claim, where it can be asked and says so ("" otherwise):
    its balance no longer backs the voucher (the payer withdrew, or a refund went back)."""
    if not flow.chain.knows(channel.network):
        return ""
    try:
        balance, claimed, _ = await flow.chain.channel(
            channel.network, batch_settlement.SETTLEMENT_CONTRACT, channel.channel_id
        )
    except ChainUnavailable:
        return ""
    if claimed < channel.voucher_max and balance < channel.voucher_max:
        return f"the channel's balance on chain ({balance}) no longer backs its voucher ({channel.voucher_max})"
    return ""


async def set_aside(flow: ChannelParts, channel: Channel, fence: str, reason: str) -> dict[str, Any]:
    """The contract refuses this channel's claim: its voucher is `refused` (terminal: no pass sends it
    again, nor in a batch with others; a later voucher of the channel is claimable), logged for an
    operator, counted."""
    unclaimed = str(channel.voucher_max - channel.total_claimed)
    if await flow.store.refuse(channel.channel_id, fence, reason) == 0:  # taken over meanwhile: not ours
        return {"outcome": "skipped", "channel": channel.channel_id}
    fields = dict(
        agent="",
        scheme=batch_settlement.SCHEME_NAME,
        token_digest=channel.voucher_digest,
        payer=channel.payer,
        amount=unclaimed,
        network=channel.network,
        asset=channel.asset,
    )
    short = channel.channel_id[:18]
    await flow.log.append("channel_claim_failed", **fields, error=f"refused, set aside: channel {short}: {reason}")
    await flow.log.append(
        "needs_attention",
        **fields,
        error=f"channel {short}: the contract refuses its claim ({reason}); set aside, the rest claimed",
    )
    flow.metrics.channel_transactions.labels("claim", "refused").inc()
    logger.warning("channel %s: its claim of %s is refused (%s): set aside", short, unclaimed, reason)
    return {"outcome": "refused", "channel": channel.channel_id, "amount": unclaimed, "error": reason}


async def left_unclaimed(flow: ChannelParts) -> list[dict[str, Any]]:
    """Every channel still holding unclaimed charges, and why (for `a2a-gate channels claim`)."""
    passes = flow.config.facilitator.settle_passes
    left = []
    async for page in flow.store.unclaimed():
        for c in page:
            if c.refused:
                why = f"refused: {c.refused_reason}"
            elif in_flight(c) and c.claim_failures:
                why = f"{c.claim_failures} failed claim(s); next try in {c.claim_until - c.now:.0f} s"
            elif in_flight(c):
                why = "a claim in flight (another process)"
            elif c.claim_failures >= passes:
                why = f"{c.claim_failures} failed claims: the schedule stopped; a2a-gate channels claim"
            else:
                why = "not claimed"
            left.append({"channel": c.channel_id, "unclaimed": c.unclaimed, "why": why})
    return left


async def claim_failed(
    flow: ChannelParts, taken: list[Channel], fence: str, reason: str, *, unknown: bool
) -> dict[str, Any]:
    interval, passes = flow.config.channels.claim_interval_seconds, flow.config.facilitator.settle_passes
    retry_in = interval
    for channel in taken:
        retry_in = min(flow.config.facilitator.settle_max_delay_seconds, interval * 2**channel.claim_failures)
        await flow.store.claim_failed(channel.channel_id, fence, unknown, retry_in)
        fields = dict(
            agent="",
            scheme=batch_settlement.SCHEME_NAME,
            token_digest=channel.voucher_digest,
            payer=channel.payer,
            amount=str(channel.voucher_max - channel.total_claimed),
            network=channel.network,
            asset=channel.asset,
        )
        await flow.log.append("channel_claim_failed", **fields, error=reason)
        if channel.claim_failures + 1 >= passes:  # the schedule stops here: an operator's now
            error = f"channel {channel.channel_id[:18]}: {passes} claims failed ({reason}); a2a-gate channels claim"
            await flow.log.append("needs_attention", **fields, error=error)
    flow.metrics.channel_transactions.labels("claim", "unknown" if unknown else "failed").inc()
    logger.warning("a channel claim did not land (%s); claimable again in %gs", reason, retry_in)
    return {"outcome": "unknown" if unknown else "failed", "channels": len(taken), "error": reason}


async def sweep(flow: ChannelParts, network: str, asset: str, receiver: str) -> dict[str, Any]:
    """Move what is claimed for `receiver` on the contract to `receiver` itself."""
    wanted = requirements(network, asset, receiver)
    payload = {
        "x402Version": 2,
        "payload": {"type": "settle", "receiver": receiver, "token": asset},
        "accepted": wanted,
    }
    try:
        answer = await flow.facilitator.settle(2, payload, wanted)
    except Unavailable as exc:
        flow.metrics.channel_transactions.labels("settle", "unknown").inc()
        return {"outcome": "sweep_unknown", "error": exc.reason}  # claimed funds wait on the contract: the next pass
    amount = str(answer.receipt.get("amount", "")) if answer.success else ""
    await flow.log.append(
        "channel_settle",
        agent="",
        scheme=batch_settlement.SCHEME_NAME,
        token_digest="",
        payer="",
        amount=amount,
        network=network,
        asset=asset,
        transaction=answer.transaction,
        error="" if answer.success else answer.reason,
    )
    flow.metrics.channel_transactions.labels("settle", "ok" if answer.success else "failed").inc()
    return {"outcome": "swept" if answer.success else "sweep_failed", "transaction": answer.transaction}


async def refund_idle(flow: ChannelParts, idle_seconds: float | None = None) -> list[dict[str, Any]]:
    """Return what idle channels hold beyond their charged total to their payers (cooperatively,
    `refundWithSignature`, with the unclaimed vouchers claimed in the same transaction)."""
    idle = flow.config.channels.refund_after_seconds if idle_seconds is None else idle_seconds
    outcomes = []
    claimed_for: set[tuple[str, str, str]] = set()
    for channel in await flow.store.idle(idle):
        fence = secrets.token_hex(8)
        if not await flow.store.take_refund(channel, fence, CHANNEL_JOB_LEASE_SECONDS):
            continue
        outcome = await refund(flow, channel, fence)
        outcomes.append(outcome)
        if outcome["outcome"] == "refunded" and channel.voucher_max > channel.total_claimed:
            claimed_for.add((channel.network, channel.asset, channel.receiver))
    for network, asset, receiver in sorted(claimed_for):  # what the refunds claimed, to payTo
        outcomes.append(await sweep(flow, network, asset, receiver))
    return outcomes


async def refund(flow: ChannelParts, channel: Channel, fence: str) -> dict[str, Any]:
    voucher = flow.keys.unseal(channel.sealed_voucher, channel.channel_id)
    claims = []
    if channel.voucher_max > channel.total_claimed:
        claims.append(
            {
                "voucher": {"channel": channel.config, "maxClaimableAmount": voucher["maxClaimableAmount"]},
                "signature": voucher["signature"],
                "totalClaimed": voucher["maxClaimableAmount"],
            }
        )
    inner = {
        "type": "refund",
        "channelConfig": channel.config,
        "voucher": {
            "channelId": channel.channel_id,
            "maxClaimableAmount": voucher["maxClaimableAmount"],
            "signature": voucher["signature"],
        },
        "amount": str(channel.balance - channel.charged),
        "refundNonce": str(channel.refund_nonce),
        "claims": claims,
    }
    wanted = requirements(channel.network, channel.asset, channel.receiver)
    payload = {"x402Version": 2, "payload": inner, "accepted": wanted}
    retry_in = flow.config.channels.claim_interval_seconds
    try:
        answer = await flow.facilitator.settle(2, payload, wanted)
    except Unavailable as exc:
        await flow.store.refund_failed(channel.channel_id, fence, unknown=True, retry_in=retry_in)
        await refund_log(flow, channel, "", f"refund_unavailable: {exc.reason}")
        flow.metrics.channel_transactions.labels("refund", "unknown").inc()
        return {"outcome": "unknown", "channel": channel.channel_id, "error": exc.reason}
    mirror = Mirror.read(answer.extra) if answer.success else None
    if mirror is None:
        await flow.store.refund_failed(channel.channel_id, fence, unknown=False, retry_in=retry_in)
        await refund_log(flow, channel, "", answer.reason or "refund answer without the channel's state")
        flow.metrics.channel_transactions.labels("refund", "failed").inc()
        return {"outcome": "failed", "channel": channel.channel_id, "error": answer.reason}
    refunded = str(answer.receipt.get("amount", "")) or str(channel.balance - mirror.balance)
    sql, args = flow.store.refunded_statement(channel.channel_id, fence, mirror)

    async def write() -> None:
        await flow.store.db.execute(sql, args)
        await flow.log.append(
            "channel_refund",
            agent="",
            scheme=batch_settlement.SCHEME_NAME,
            token_digest=channel.voucher_digest,
            payer=channel.payer,
            amount=refunded,
            network=channel.network,
            asset=channel.asset,
            transaction=answer.transaction,
            error=f"channel {channel.channel_id[:18]} refunded; claimed to {mirror.total_claimed}",
        )

    await commit_until_stored(flow.store.db, write, "a channel refund")
    flow.metrics.channel_transactions.labels("refund", "ok").inc()
    if mirror.total_claimed > channel.total_claimed:  # the unclaimed vouchers it claimed on the way
        flow.metrics.revenue.labels(channel.network, channel.asset).inc(mirror.total_claimed - channel.total_claimed)
    return {"outcome": "refunded", "channel": channel.channel_id, "amount": refunded, "transaction": answer.transaction}


async def refund_log(flow: ChannelParts, channel: Channel, transaction: str, error: str) -> None:
    await flow.log.append(
        "channel_claim_failed",
        agent="",
        scheme=batch_settlement.SCHEME_NAME,
        token_digest=channel.voucher_digest,
        payer=channel.payer,
        amount=str(channel.balance - channel.charged),
        network=channel.network,
        asset=channel.asset,
        transaction=transaction,
        error=f"refund: {error}",
    )


async def claim_loop(flow: ChannelParts) -> None:
    """The schedule: a pass every `claim_interval_seconds`, whatever a pass meets (claims, then refunds)."""
    unwatched = sorted({offer.network for _, offer in channel_offers(flow.config)} - set(flow.chain.networks))
    if unwatched:  # only with [channels] accept_unwatched_withdrawals (or no facilitator): say so where it runs
        logger.warning(
            "payment channels on %s are not watched for withdrawals (no [networks] rpc_url): only the claim"
            " schedule stands between a payer's withdrawal and its charged vouchers",
            ", ".join(unwatched),
        )
    while True:
        await asyncio.sleep(flow.config.channels.claim_interval_seconds)
        try:
            await claim_due(flow)
            if flow.config.channels.refund_after_seconds > 0:
                await refund_idle(flow)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug of ours or an outage: the next pass tries again
            logger.exception("channel claim pass failed")
