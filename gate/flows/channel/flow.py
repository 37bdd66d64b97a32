"""The channel flow (`batch-settlement`): reserve the channel, charge it with the delivery, claim on chain later.

A deposit opens a channel; each request carries a cumulative voucher for the channel's charged
total plus the price. The voucher is checked (locally while the mirrored chain state is fresh)
and its channel reserved for the request's claim (`vouchers`); the delivery advances the
channel's charged total in its own write (`settled_write`, compare-and-set on the voucher's
base, `store`); the money moves when the claim job claims the vouchers on chain (`jobs`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any

from gate import schemes
from gate.chain import ChainUnavailable
from gate.claims import only_if
from gate.config import channel_offers
from gate.facilitator import SettleAnswer
from gate.flows.base import FACILITATOR, HERE, ChainAnswer, FixedPrice, Flow, Meter, Reserved, SettledWrite, Verdict
from gate.flows.channel import jobs, vouchers
from gate.flows.channel.parts import ChannelParts
from gate.flows.channel.store import Mirror
from gate.payment import Payment
from gate.price import Price
from gate.schemes import batch_settlement
from gate.tokens import Token

# what a voucher's charge that found its channel moved says (its claim is written off)
CHANNEL_MOVED = "channel_state_changed: the channel was charged past this voucher's base"


class ChannelFlow(ChannelParts):
    """Payment channels: the channel store every replica shares, and what collects it."""

    name = "channel"

    def windowed(self, token: Token) -> bool:
        """A voucher has no window: it is claimable while the channel lives (a deposit has one)."""
        return bool(token.payload["payload"].get("type") != "voucher")

    async def reserve_with_claim(self, token: Token, price: Price) -> Reserved | None:
        return await vouchers.reservable(self.store, token, price)

    async def behind(self, token: Token, price: Price) -> Verdict | None:
        """An increment already paid for: the payer's state is behind the channel's."""
        checked = await vouchers.behind(self.store, token, price, self.keys.unseal)
        return None if checked is None else verdict(checked)

    async def verify(
        self, token: Token, requirements: dict[str, Any], price: Price, reserved: Reserved | None
    ) -> Verdict:
        """Checked here while the mirrored chain state is fresh (else by the facilitator), then reserved."""
        checked = await vouchers.check_and_reserve(
            self.store, self.facilitator, token, requirements, price, self.keys.unseal, reserved
        )
        if checked.kind == "reserved":
            self.metrics.vouchers.labels("local" if checked.local else "facilitator").inc()
        return verdict(checked)

    def meter(self, payment: Payment, price: Price) -> Meter:
        return FixedPrice(payment)

    def settles_by(self, payment: Payment) -> str:
        """A voucher is charged by the gate itself, in its delivery's write; a deposit is settled first."""
        return HERE if payment.payload["payload"].get("type") == "voucher" else FACILITATOR

    def settle_answer(self, result: SettleAnswer) -> dict[str, Any]:
        return {**result.receipt, "extra": result.extra}  # the channel's state as the deposit left it

    def settled_write(self, payment: Payment, answer: dict[str, Any]) -> SettledWrite:
        """The write that advances the channel's charged total (while the claim is ours; the claim is
        settled only if it applied), and the receipt the binding defines (`extra.chargedAmount`,
        `extra.channelState.chargedCumulativeAmount`)."""
        voucher = batch_settlement.read(payment.payload["payload"])
        price = int(payment.amount)
        base = voucher.max_claimable - price
        mirror = Mirror.read(answer.get("extra") or {}) if voucher.kind == "deposit" else None
        sealed = self.keys.seal(
            {"signature": voucher.signature, "maxClaimableAmount": str(voucher.max_claimable)}, voucher.channel_id
        )
        statement = self.store.commit_statement(voucher, base, sealed, payment.token_digest, mirror)
        state = {
            "channelId": voucher.channel_id,
            "chargedCumulativeAmount": str(voucher.max_claimable),
        }
        if mirror is not None:
            state.update(balance=str(mirror.balance), totalClaimed=str(mirror.total_claimed))
        receipt = {
            "success": True,
            "transaction": str(answer.get("transaction", "")),
            "network": payment.network,
            "payer": payment.payer or voucher.payer,
            "amount": payment.amount,
            "extra": {"chargedAmount": payment.amount, "channelState": state},
        }
        return SettledWrite(
            receipt,
            f"channel {voucher.channel_id[:18]} charged to {voucher.max_claimable}",
            first=(only_if(statement),),
            provided=self.store.charged_condition(voucher, payment.token_digest),
            unmet=CHANNEL_MOVED,
        )

    async def ask_chain(self, payment: Payment, heard: str) -> ChainAnswer:
        """A channel deposit nobody could confirm: the settlement contract says whether the channel
        holds the voucher's amount. It does: the delivered request is claimable, so it is charged
        (whichever deposit put the money there). It does not, and the deposit's authorization has
        expired: it never will, written off. Otherwise owed until it expires."""
        voucher = batch_settlement.read(payment.payload["payload"])
        if not self.chain.knows(payment.network):
            return ChainAnswer("unknown", f"{heard}; chain not asked: no rpc_url for the network")
        try:
            balance, claimed, withdrawal = await self.chain.channel(
                payment.network, batch_settlement.SETTLEMENT_CONTRACT, voucher.channel_id
            )
        except ChainUnavailable as exc:
            return ChainAnswer("unknown", f"{heard}; chain unavailable: {exc.reason}")
        if balance >= voucher.max_claimable:
            state = {"balance": str(balance), "totalClaimed": str(claimed), "withdrawRequestedAt": withdrawal}
            answer = {"transaction": "", "extra": {"channelState": state}}
            return ChainAnswer("paid", answer=answer, note="confirmed on chain: the channel holds the voucher's amount")
        scheme = schemes.for_requirements(payment.requirements)
        assert scheme is not None  # this flow was found by it
        _, valid_before = scheme.window(payment.payload["payload"])  # its collector's window
        return ChainAnswer(
            "pending",
            f"{heard}; chain: the deposit has not landed, still valid",
            valid_before=valid_before,
            expired=f"{heard}; chain: the channel lacks the voucher's amount, deposit expired",
        )

    def count_settled(self, payment: Payment) -> None:
        """Charged here; collected later, when the claim job claims it on chain (`jobs`)."""
        self.metrics.channel_charged.labels(payment.network, payment.asset).inc(int(payment.amount))
        voucher = batch_settlement.read(payment.payload["payload"])
        if voucher.kind == "voucher":  # the payer's next voucher is checked against this charge
            base = voucher.max_claimable - int(payment.amount)
            self.store.charged_here(voucher.channel_id, base, voucher.max_claimable)
        else:  # a deposit moved the mirrored state too: read again
            self.store.recent.pop(voucher.channel_id, None)

    async def create_tables(self) -> None:
        await self.store.create_tables()

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """The claim schedule, where an agent offers a channel."""
        return [jobs.claim_loop(self)] if channel_offers(self.config) else []

    async def read_state(self) -> None:
        await self.metrics.read_channels(self.store)


def of(flows: Iterable[Flow]) -> ChannelFlow:
    """The gate's channel flow, for the commands that drive its jobs (`a2a-gate channels`)."""
    return next(flow for flow in flows if isinstance(flow, ChannelFlow))


def verdict(checked: vouchers.Checked) -> Verdict:
    """A voucher's check as the pipeline reads any flow's."""
    if checked.kind == "reserved":
        return Verdict("ok", payer=checked.payer)
    if checked.kind == "mismatch":
        return Verdict("resync", payer=checked.payer, reason=checked.reason, state=checked.state)
    if checked.kind == "busy":
        return Verdict(
            "busy",
            payer=checked.payer,
            reason="channel busy",
            code="channel_busy",
            message="Another request of this channel is in flight",
        )
    if checked.kind == "unavailable":
        return Verdict("unavailable", payer=checked.payer, reason=checked.reason, retry_after=checked.retry_after)
    return Verdict("refused", payer=checked.payer, reason=checked.reason)
