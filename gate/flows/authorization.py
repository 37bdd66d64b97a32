"""The authorization flow (`exact`, EIP-3009 or Permit2): verify, deliver, settle.

The payer signs one transfer of the price. The facilitator verifies it before the work (a dry
run that passes again and again until settlement: the claim makes it one delivery), and settles
it after the delivery. A settle nobody could confirm is resolved by asking the token contract
(or Permit2) whether the authorization was used, and by a transfer to payTo (`gate.chain`).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from gate import schemes
from gate.chain import Chain, ChainUnavailable
from gate.facilitator import FacilitatorClient, SettleAnswer, Unavailable
from gate.flows.base import FACILITATOR, ChainAnswer, FixedPrice, Meter, Reserved, SettledWrite, Verdict
from gate.metrics import GateMetrics
from gate.payment import Payment
from gate.price import Price
from gate.tokens import Token


class AuthorizationFlow:
    """One signed transfer per request: verified by the facilitator, settled after the delivery."""

    name = "authorization"

    def __init__(self, facilitator: FacilitatorClient, chain: Chain, metrics: GateMetrics | None = None) -> None:
        self.facilitator, self.chain, self.metrics = facilitator, chain, metrics

    def windowed(self, token: Token) -> bool:
        return True

    async def reserve_with_claim(self, token: Token, price: Price) -> Reserved | None:
        return None

    async def behind(self, token: Token, price: Price) -> Verdict | None:
        return None

    async def verify(
        self, token: Token, requirements: dict[str, Any], price: Price, reserved: Reserved | None
    ) -> Verdict:
        try:
            verification = await self.facilitator.verify(token.version, token.payload, requirements)
        except Unavailable as exc:
            return Verdict("unavailable", reason=exc.reason, retry_after=exc.retry_after)
        if not verification.valid:
            return Verdict("refused", payer=verification.payer, reason=verification.reason)
        return Verdict("ok", payer=verification.payer)

    def meter(self, payment: Payment, price: Price) -> Meter:
        return FixedPrice(payment)

    def settles_by(self, payment: Payment) -> str:
        return FACILITATOR

    def settle_answer(self, result: SettleAnswer) -> dict[str, Any]:
        return result.receipt

    def settled_write(self, payment: Payment, answer: dict[str, Any]) -> SettledWrite:
        return SettledWrite(answer)

    async def ask_chain(self, payment: Payment, heard: str) -> ChainAnswer:
        """The token contract's own record, as a transfer: used AND moved the price to payTo is paid."""
        scheme = schemes.for_requirements(payment.requirements)
        authorization = scheme.authorization(payment.payload, payment.requirements, payment.network) if scheme else None
        if authorization is None or not self.chain.knows(payment.network):
            why = "no rpc_url for the network" if authorization is not None else "not an EIP-3009 authorization"
            return ChainAnswer("unknown", f"{heard}; chain not asked: {why}")
        pay_to = str(payment.requirements.get("payTo", ""))
        try:
            facts = await self.chain.facts(authorization, pay_to, int(payment.amount or 0))
        except (ChainUnavailable, ValueError) as exc:
            reason = exc.reason if isinstance(exc, ChainUnavailable) else "unreadable price"
            return ChainAnswer("unknown", f"{heard}; chain unavailable: {reason}")
        if facts.paid:
            receipt = {
                "success": True,
                "transaction": facts.transaction,
                "network": payment.network,
                "payer": payment.payer,
                "amount": payment.amount,
            }
            return ChainAnswer("paid", answer=receipt, transaction=facts.transaction, note="confirmed on chain")
        if facts.used:  # spent, but not by a payment to us: canceled or front-run
            return ChainAnswer("unpaid", f"{heard}; chain: {facts.detail}")
        # unused: it can still be collected until it expires
        return ChainAnswer(
            "pending",
            f"{heard}; chain: authorization unused, still valid",
            valid_before=authorization.valid_before,
            expired=f"{heard}; chain: authorization unused and expired",
        )

    def count_settled(self, payment: Payment) -> None:
        if self.metrics is not None:
            self.metrics.revenue.labels(payment.network, payment.asset).inc(int(payment.amount))

    async def create_tables(self) -> None:
        return None

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        return []

    async def read_state(self) -> None:
        return None
