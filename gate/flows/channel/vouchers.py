"""A channel payment's verify step (DESIGN 4.9 for `batch-settlement`): check it, then reserve its channel.

A voucher must be for the channel's charged total plus the price. One that is not gets the
binding's corrective answer carrying the channel's state, so the client resynchronises; the
last voucher's own signature rides along (`voucherState`) only when the request's voucher is
signed by the channel's payer authorizer, so only the payer learns it back. An EOA voucher
is verified here (ecrecover) while the mirrored on-chain state is fresh: its signer, and a
maximum within the balance and above what is claimed. A deposit, a contract wallet's voucher,
a channel the gate has not seen and a stale mirror go to the facilitator, whose answer
refreshes the mirror. Then the channel is reserved for this request's claim (`store`).
The common voucher (an EOA's, at the base of a fresh channel nobody holds) is checked before its
claim is taken (`reservable`), against the channel as this process last read or charged it, and its
reservation goes with the claim's INSERT, applying only if the row still says what was checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.claims import only_if
from gate.config import fresh_seconds
from gate.facilitator import FacilitatorClient, Unavailable
from gate.flows.base import Reserved
from gate.flows.channel.store import Channel, Channels, Mirror
from gate.price import Price
from gate.schemes import batch_settlement
from gate.schemes.batch_settlement import Voucher
from gate.tokens import Token


@dataclass(frozen=True)
class Checked:
    """The outcome: "reserved" (go on), "refused" (`reason`), "mismatch" (resync: `state`),
    "busy" (another request holds the channel), or "unavailable" (the facilitator: `reason`)."""

    kind: str
    payer: str = ""
    reason: str = ""
    state: dict[str, dict[str, Any]] = field(default_factory=dict)  # the corrective answer's, per scheme
    local: bool = False  # verified by the gate itself, no facilitator call
    retry_after: float = 0.0


async def reservable(channels: Channels, token: Token, price: Price) -> Reserved | None:
    """The common case, checked before the claim is taken: an EOA's voucher at the base of a channel
    nobody holds, whose mirrored state is fresh, within its balance and above what is claimed, signed
    by its payer authorizer. Its reservation then goes with the claim (one write, applying only if the claim was
    just taken). None for anything else, which `check_and_reserve` checks after the claim."""
    inner = token.payload["payload"]
    voucher = batch_settlement.read(inner)
    if voucher.kind != "voucher" or not batch_settlement.local_verifiable(voucher.config):
        return None
    base = voucher.max_claimable - int(price.amount)
    # as this process last saw it (no read for the channel it just charged); the reservation holds
    # only if the row is unchanged since, and by the database's clock the sync is still fresh
    channel = await channels.last_seen(voucher.channel_id)
    if channel is None or channel.charged != base or channel.refunded:
        return None  # (whether another request holds it, only the reservation can tell)
    if channel.withdraw_requested_at:
        return None  # refused by check_and_reserve
    fresh_for = fresh_seconds(int(voucher.config["withdrawDelay"]))
    if not channel.fresh(fresh_for):  # as of its read; the reservation asks the database's clock now
        return None
    if not channel.total_claimed < voucher.max_claimable <= channel.balance:
        return None
    if not batch_settlement.voucher_signer_matches(voucher.config, inner["voucher"], price.network):
        return None
    reserve = channels.reserve_statement(
        voucher.channel_id, base, token.digest, deposit=False, unheld=True, seen=channel, fresh_for=fresh_for
    )
    return Reserved(voucher.payer, only_if(reserve))


async def check_and_reserve(
    channels: Channels,
    facilitator: FacilitatorClient,
    token: Token,
    requirements: dict[str, Any],
    price: Price,
    unseal: Any,
    reserved: Reserved | None = None,
) -> Checked:
    """Check a claimed channel payment and reserve its channel; `reserved`: it was checked before
    the claim (`reservable`) and reserved with it."""
    if reserved is not None:
        return Checked("reserved", payer=reserved.payer, local=True)
    inner = token.payload["payload"]
    voucher = batch_settlement.read(inner)
    amount = int(price.amount)
    base = voucher.max_claimable - amount
    # an EOA's voucher (in a deposit too) is checked here first: a forgery never costs a facilitator call
    eoa = batch_settlement.local_verifiable(voucher.config)
    if eoa and not batch_settlement.voucher_signer_matches(voucher.config, inner["voucher"], price.network):
        return Checked("refused", payer=voucher.payer, reason=batch_settlement.INVALID_VOUCHER_SIGNATURE)
    channel = await channels.find(voucher.channel_id)
    verified_by_facilitator = False
    mirror_read: Mirror | None = None
    if channel is None:  # a channel the gate has not seen: the chain (through the facilitator) says what it holds
        try:
            verification = await facilitator.verify(token.version, token.payload, requirements)
        except Unavailable as exc:
            return Checked("unavailable", reason=exc.reason, retry_after=exc.retry_after)
        if not verification.valid:
            return Checked("refused", payer=verification.payer, reason=verification.reason)
        mirror_read = mirror = Mirror.read(verification.extra)
        await channels.open(voucher, price.network, price.asset, mirror.total_claimed if mirror else 0, mirror)
        channel = await channels.find(voucher.channel_id)
        assert channel is not None
        verified_by_facilitator = True
    if channel.charged != base:
        return mismatch(channel, voucher, price.network, unseal, signed_by_payer=eoa)
    local = False
    if not verified_by_facilitator:
        local = voucher.kind == "voucher" and eoa and channel.fresh(fresh_seconds(int(voucher.config["withdrawDelay"])))
        if local:
            if voucher.max_claimable > channel.balance:
                return Checked("refused", payer=voucher.payer, reason=batch_settlement.EXCEEDS_BALANCE)
            if voucher.max_claimable <= channel.total_claimed:
                return Checked("refused", payer=voucher.payer, reason=batch_settlement.BELOW_CLAIMED)
        else:
            try:
                verification = await facilitator.verify(token.version, token.payload, requirements)
            except Unavailable as exc:
                return Checked("unavailable", reason=exc.reason, retry_after=exc.retry_after)
            if not verification.valid:
                return Checked("refused", payer=verification.payer, reason=verification.reason)
            mirror_read = Mirror.read(verification.extra)
            if mirror_read is not None:
                await channels.mirror(voucher.channel_id, mirror_read)
    if withdrawal_pending(channel, mirror_read):
        return Checked("refused", payer=voucher.payer, reason=batch_settlement.WITHDRAWAL_PENDING)
    reservation = await channels.reserve(voucher.channel_id, base, token.digest, deposit=voucher.kind == "deposit")
    if reservation.kind == "mismatch":
        assert reservation.channel is not None
        return mismatch(reservation.channel, voucher, price.network, unseal, signed_by_payer=eoa)
    if reservation.kind == "refunded":  # its balance went back to the payer: a deposit opens it again
        return Checked("refused", payer=voucher.payer, reason=batch_settlement.EXCEEDS_BALANCE)
    if reservation.kind == "busy":
        return Checked("busy", payer=voucher.payer, reason=batch_settlement.CHANNEL_BUSY)
    return Checked("reserved", payer=voucher.payer, local=local)


def withdrawal_pending(channel: Channel, mirror: Mirror | None) -> bool:
    """Whether the payer has asked (as last read from the chain: `mirror` when this request read it)
    to withdraw: the channel takes no more charges, since one made now might not be claimed before
    the withdrawal can be finalized (the operator's side of the claim obligation; the charges before
    it are claimed at once)."""
    return (mirror.withdraw_requested_at if mirror is not None else channel.withdraw_requested_at) > 0


async def behind(channels: Channels, token: Token, price: Price, unseal: Any) -> Checked | None:
    """For a voucher whose increment is claimed already: the corrective answer when the channel
    has moved past its base (a client that lost its state resyncs); None otherwise."""
    voucher = batch_settlement.read(token.payload["payload"])
    channel = await channels.find(voucher.channel_id)
    if channel is None or channel.charged == voucher.max_claimable - int(price.amount):
        return None
    return mismatch(channel, voucher, price.network, unseal)


def mismatch(
    channel: Channel, voucher: Voucher, network: str, unseal: Any, *, signed_by_payer: bool | None = None
) -> Checked:
    """The corrective answer's channel state; with the last voucher only for the payer's own signer."""
    extra: dict[str, Any] = {"channelState": channel.state()}
    if signed_by_payer is None:
        signed_by_payer = batch_settlement.local_verifiable(voucher.config) and batch_settlement.voucher_signer_matches(
            voucher.config,
            {
                "channelId": voucher.channel_id,
                "maxClaimableAmount": str(voucher.max_claimable),
                "signature": voucher.signature,
            },
            network,
        )
    if signed_by_payer and channel.sealed_voucher:
        last = unseal(channel.sealed_voucher, channel.channel_id)
        extra["voucherState"] = {"signedMaxClaimable": last["maxClaimableAmount"], "signature": last["signature"]}
    return Checked(
        "mismatch",
        payer=voucher.payer,
        reason=batch_settlement.CUMULATIVE_MISMATCH,
        state={batch_settlement.SCHEME_NAME: extra},
    )
