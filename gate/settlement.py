"""Settling delivered work: the one path shared by send, stream, replays and the reconciler.

Settle runs only after a delivery. Every answer is classified (DESIGN section 6):
- success: `settled`, with the receipt;
- a definitive refusal (bad signature, no funds, expired, a nonce used with no earlier
  attempt of ours that may have spent it): `unsettled`, written off;
- unknown (timeout, 5xx, transport, a refusal we cannot read): retried with backoff and
  jitter, then left owed for the reconciler, whose passes back off exponentially up to
  a cap. When an owed claim hears "nonce already used", or reaches the cap, the chain
  is asked (`gate.chain`): a transaction that used the authorization AND moved the
  price from the payer to payTo -> `settled` with that transaction; the nonce spent
  without such a transfer (canceled by the payer, front-run) -> `unsettled`; unused and
  expired -> `unsettled`; unused and still valid -> owed until it expires; no chain
  answer (no endpoint for the network, an outage) -> `needs_attention`.
Nothing is retried forever, and passes follow the claim's own schedule (kept by the
database's clock), whoever drives them. Each outcome is committed (claim state and
payment log row, one transaction, retried until it sticks) before anyone hears of it,
so no later error can turn a charge into "not charged"; and it is fenced: a process
that lost the claim (`ClaimLost`) records nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gate import schemes
from gate.chain import Chain, ChainUnavailable
from gate.channels import Channels, Mirror
from gate.claims import Along, Claim, Claims, ClaimState, Hold, Unmet, only_if
from gate.config import FacilitatorConfig
from gate.facilitator import FacilitatorClient, Unavailable
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.schemes import batch_settlement
from gate.schemes.base import Scheme
from gate.usage_price import Charge
from server.database import Statement, commit_until_stored
from server.dialects import INTERRUPTED_STATES, TERMINAL_STATES
from server.execution import PARTIAL
from server.tasks import agent_message, set_status

logger = logging.getLogger("a2a_gate.settlement")

STATUS = "x402.payment.status"
RECEIPTS = "x402.payment.receipts"
ERROR = "x402.payment.error"
# a cut stream's task, repaired after a crash: the parts delivered are what is charged
INTERRUPTED_IN_PARTS = "Interrupted by a server restart after part of the answer was delivered: that part is charged."


@dataclass(frozen=True)
class Payment:
    """Everything needed to settle one claim; only ever held in memory or sealed."""

    token_digest: str
    version: int
    payload: dict[str, Any]
    requirements: dict[str, Any]
    agent: str
    payer: str
    amount: str  # what is settled: the price, or an upto delivery's charge
    network: str
    asset: str
    authorized: str = ""  # what the payer signed for, when it differs from `amount` (an upto ceiling)
    usage: dict[str, Any] = field(default_factory=dict)  # an upto charge, as its receipt states it

    @property
    def metered(self) -> bool:
        return bool(self.usage)

    def log_fields(self, task_id: str = "") -> dict[str, str]:
        """What a payment log row says about this payment (never the payload itself)."""
        return {
            "agent": self.agent,
            "token_digest": self.token_digest,
            "payer": self.payer,
            "amount": self.amount,
            "authorized": self.authorized or self.amount,
            "network": self.network,
            "asset": self.asset,
            "task_id": task_id,
        }

    def sealable(self) -> dict[str, Any]:
        """What an owed settlement needs later: the signed payload and the price it was signed for
        (never the configuration of the day it is collected); an upto delivery's charge with it."""
        sealable = {
            "version": self.version,
            "payload": self.payload,
            "requirements": self.requirements,
            "price": {"amount": self.amount, "network": self.network, "asset": self.asset},
        }
        if self.metered:
            sealable["charge"] = {"authorized": self.authorized, "usage": self.usage}
        return sealable

    @classmethod
    def unsealed(cls, sealed: dict[str, Any], claim: Claim, price: tuple[str, str, str]) -> Payment:
        """The payment a claim's sealed record holds (`sealable`'s inverse); `price` (amount, network,
        asset) for a claim sealed before its price was sealed with it."""
        amount, network, asset = price
        signed = sealed.get("price")
        if isinstance(signed, dict):
            amount, network, asset = str(signed["amount"]), str(signed["network"]), str(signed["asset"])
        charged = sealed.get("charge")  # an upto delivery: its charge, sealed when it was delivered
        return cls(
            claim.token_digest,
            sealed["version"],
            sealed["payload"],
            sealed["requirements"],
            claim.agent,
            claim.payer,
            amount,
            network,
            asset,
            authorized=str(charged["authorized"]) if isinstance(charged, dict) else "",
            usage=dict(charged["usage"]) if isinstance(charged, dict) else {},
        )

    def charged(self, charge: Charge) -> Payment:
        """This (upto) payment as its delivery is settled: the requirements ask for the charge, not the ceiling."""
        amount = str(charge.amount)
        return replace(
            self,
            amount=amount,
            requirements={**self.requirements, "amount": amount},
            authorized=str(charge.ceiling),
            usage=charge.receipt(),
        )

    def receipt(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The receipt the payer is shown: the settle answer, with an upto charge's usage in `extra.usage`."""
        if not self.metered:
            return answer
        extra = answer.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        return {**answer, "amount": answer.get("amount") or self.amount, "extra": {**extra, "usage": self.usage}}


@dataclass(frozen=True)
class Collection:
    """Where one settle pass left a claim, and what the task should say about it."""

    state: ClaimState
    metadata: dict[str, Any]

    @property
    def paid(self) -> bool:
        """Nothing more is owed: settled, or an upto delivery that came to nothing."""
        return self.state in (ClaimState.SETTLED, ClaimState.NO_CHARGE)


@dataclass(frozen=True)
class Pass:
    """One settle pass: the payment, its task, and the hold every write of the pass names."""

    payment: Payment
    task_id: str
    hold: Hold

    def log_fields(self) -> dict[str, str]:
        return self.payment.log_fields(self.task_id)


def completed_metadata(receipt: dict[str, Any]) -> dict[str, Any]:
    return {STATUS: "payment-completed", RECEIPTS: [receipt]}


def verified_metadata(error: str) -> dict[str, Any]:
    return {STATUS: "payment-verified", ERROR: error}


def failed_metadata(error: str) -> dict[str, Any]:
    return {STATUS: "payment-failed", ERROR: error}


def withheld_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """A withholding agent's answer when the work is not paid (yet): `payment-failed`, with the reason."""
    return failed_metadata(metadata.get(ERROR, "settle_failed"))


def metadata_for(claim: Claim) -> dict[str, Any]:
    """What a task says about a claim in this state (the repair of a stored task)."""
    if claim.state in (ClaimState.SETTLED, ClaimState.NO_CHARGE):
        return completed_metadata(claim.receipt)
    if claim.state == ClaimState.UNSETTLED:
        return failed_metadata(claim.last_error)
    return verified_metadata(claim.last_error)


def with_payment_metadata(existing: dict[str, Any] | None, metadata: dict[str, Any]) -> dict[str, Any]:
    """The one merge rule: the previous payment keys go, the new ones come, the rest stays."""
    kept = {k: v for k, v in (existing or {}).items() if not k.startswith("x402.")}
    return {**kept, **metadata}


def attach_payment_metadata(task: dict[str, Any], metadata: dict[str, Any]) -> None:
    """Put payment metadata on the status message and mirror it at task.metadata.

    Only delivered work is settled, so a task a crash left `working` after its whole answer's
    delivery was saved is completed here; one left `working` while its answer was delivered in
    parts (its stored result artifact still marked partial) was cut by the crash: it ends `failed`,
    with the parts delivered, which are what is charged. A task that had ended (failed, canceled,
    paused, stopped at its ceiling) keeps its state.
    """
    state = task["status"]["state"]
    cut = False
    for artifact in task.get("artifacts") or []:
        marks = artifact.get("metadata")
        if isinstance(marks, dict) and marks.pop(PARTIAL, None) is not None:
            cut = True
            if not marks:
                del artifact["metadata"]
    if state not in TERMINAL_STATES | INTERRUPTED_STATES:
        if cut:
            set_status(task, "failed", agent_message(task, INTERRUPTED_IN_PARTS))
        else:
            set_status(task, "completed", agent_message(task, "Done."))
    message = task["status"].get("message") or agent_message(task, "Done.")
    message["metadata"] = with_payment_metadata(message.get("metadata"), metadata)
    task["status"]["message"] = message
    task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)


def classify(reason: str, scheme: Scheme | None) -> str:
    """A settle refusal's meaning, as the payment's scheme reads it: "refused", "nonce_used" or "unknown".

    (A payment of no known scheme cannot be read: every refusal is "unknown", and the chain is asked.)"""
    if scheme is None:
        return "unknown"
    if reason in scheme.nonce_used_reasons:
        return "nonce_used"
    return "refused" if reason in scheme.definitive_reasons else "unknown"


class Settler:
    def __init__(
        self,
        facilitator: FacilitatorClient,
        claims: Claims,
        log: PaymentLog,
        config: FacilitatorConfig,
        metrics: GateMetrics | None = None,
        chain: Chain | None = None,
        pass_interval: float = 30.0,
        channels: Channels | None = None,
        seal: Callable[[dict[str, Any], str], str] | None = None,
    ) -> None:
        self.metrics = metrics
        self.channels = channels
        self.seal = seal
        self.facilitator = facilitator
        self.claims = claims
        self.log = log
        self.chain = chain or Chain({})
        self.attempts = config.settle_attempts
        self.backoff = config.settle_backoff_seconds
        self.passes = config.settle_passes
        self.max_delay = config.settle_max_delay_seconds
        self.pass_interval = pass_interval

    async def settle(self, payment: Payment, task_id: str, hold: Hold, claim: Claim | None = None) -> Collection:
        """One settle pass for a claim already in `settling` under `hold`; its outcome is committed
        before it returns (`ClaimLost` if the claim was taken over meanwhile: nothing recorded)."""
        pass_ = Pass(payment, task_id, hold)
        if payment.metered and payment.amount == "0":  # nothing to collect: no settle, no transfer
            return await self._no_charge(pass_)
        unknown = claim.settle_unknown if claim is not None else False
        passes = claim.settle_passes if claim is not None else 0
        error = "settle_failed"
        scheme = schemes.for_requirements(payment.requirements)
        if scheme is not None and scheme.channel and payment.payload["payload"].get("type") == "voucher":
            return await self._settled(pass_, {}, "")  # a voucher is charged here; the chain sees it when claimed
        for attempt in range(1, self.attempts + 1):
            try:
                result = await self.facilitator.settle(payment.version, payment.payload, payment.requirements)
            except Unavailable as exc:
                unknown, error = True, f"settle_unavailable: {exc.reason}"
            else:
                if result.success:
                    answer = {**result.receipt, "extra": result.extra} if scheme and scheme.channel else result.receipt
                    return await self._settled(pass_, answer, result.transaction)
                verdict = classify(result.reason, scheme)
                if verdict in ("refused", "nonce_used"):
                    if unknown:  # an earlier attempt of ours may have landed: the refusal may be its doing
                        return await self._ask_chain(pass_, result.reason, passes)  # (spent, expired, no funds)
                    return await self._unsettled(pass_, result.reason)
                unknown, error = True, result.reason
            if attempt < self.attempts:
                await asyncio.sleep(jittered(self.backoff * 2 ** (attempt - 1)))
        passes += 1
        if passes >= self.passes:
            return await self._ask_chain(pass_, error, passes)
        return await self._owed(pass_, error, unknown, passes, jittered(self.pass_delay(passes)))

    def charged_at_delivery(self, payment: Payment) -> bool:
        """A channel's voucher is charged by the gate itself: with its delivery, in the same write."""
        scheme = schemes.for_requirements(payment.requirements)
        voucher = scheme is not None and scheme.channel and payment.payload["payload"].get("type") == "voucher"
        return voucher and not payment.metered

    async def settle_delivery(
        self,
        payment: Payment,
        task_id: str,
        hold: Hold,
        *,
        along: Callable[[dict[str, Any]], Sequence[Along]],
    ) -> Collection | None:
        """A voucher's delivery and its charge as one statement group (`charged_at_delivery`): the
        channel's compare-and-set while the claim is ours and running, the claim delivered and settled
        provided the channel was charged by it, its log row and what `along` makes of the outcome's
        metadata (the task in its final form). None, and nothing written, when the channel moved: the
        delivery is then recorded alone, and its settle finds the same. `ClaimLost` when the claim is
        not ours."""
        p = Pass(payment, task_id, hold)
        channel = self._channel_charge(p, {})
        assert channel is not None
        row = self._row("settle", p, transaction="", error=channel.note)
        collection = Collection(ClaimState.SETTLED, completed_metadata(channel.receipt))
        saves = along(collection.metadata)

        async def write() -> None:
            await self.claims.delivered_settled(
                hold,
                channel.receipt,
                payer=payment.payer,
                task_id=task_id,
                along=[*saves, row],  # the rows that came with the task (its verify) first
                first=[channel.charge],
                provided=channel.charged,
            )

        try:
            await commit_until_stored(self.claims.db, write, "a delivery and its charge", atomic=True)
        except Unmet:
            return None
        return self._was_settled(payment, channel.receipt)

    def pass_delay(self, passes: int) -> float:
        """The wait before pass `passes + 1`: exponential from the pass interval, capped."""
        return min(self.max_delay, self.pass_interval * 2 ** (passes - 1))

    async def _ask_chain(self, p: Pass, heard: str, passes: int) -> Collection:
        """Ground truth for an unknown settlement: the token contract's own record, as a transfer."""
        payment = p.payment
        scheme = schemes.for_requirements(payment.requirements)
        if scheme is not None and scheme.channel:
            return await self._ask_chain_for_channel(p, heard, passes, scheme)
        authorization = scheme.authorization(payment.payload, payment.requirements, payment.network) if scheme else None
        if authorization is None or not self.chain.knows(payment.network):
            why = "no rpc_url for the network" if authorization is not None else "not an EIP-3009 authorization"
            return await self._needs_attention(p, f"{heard}; chain not asked: {why}")
        pay_to = str(payment.requirements.get("payTo", ""))
        try:
            facts = await self.chain.facts(authorization, pay_to, int(payment.amount or 0))
        except (ChainUnavailable, ValueError) as exc:
            reason = exc.reason if isinstance(exc, ChainUnavailable) else "unreadable price"
            return await self._needs_attention(p, f"{heard}; chain unavailable: {reason}")
        if facts.paid:
            receipt = {
                "success": True,
                "transaction": facts.transaction,
                "network": payment.network,
                "payer": payment.payer,
                "amount": payment.amount,
            }
            return await self._settled(p, receipt, facts.transaction, note="confirmed on chain")
        if facts.used:  # spent, but not by a payment to us: canceled or front-run
            return await self._unsettled(p, f"{heard}; chain: {facts.detail}")
        left = authorization.valid_before - await self.claims.database_time()
        if left <= 0:
            return await self._unsettled(p, f"{heard}; chain: authorization unused and expired")
        # unused and still valid: it can still be collected, so it stays owed until it expires
        delay = min(jittered(self.pass_delay(passes)), left + 1.0)
        return await self._owed(p, f"{heard}; chain: authorization unused, still valid", True, passes, delay)

    async def _ask_chain_for_channel(self, p: Pass, heard: str, passes: int, scheme: Scheme) -> Collection:
        """A channel deposit nobody could confirm: the settlement contract says whether the channel
        holds the voucher's amount. It does: the delivered request is claimable, so it is charged
        (whichever deposit put the money there). It does not, and the deposit's authorization has
        expired: it never will, written off. Otherwise owed until it expires."""
        payment = p.payment
        voucher = batch_settlement.read(payment.payload["payload"])
        if not self.chain.knows(payment.network):
            return await self._needs_attention(p, f"{heard}; chain not asked: no rpc_url for the network")
        try:
            balance, claimed, withdrawal = await self.chain.channel(
                payment.network, batch_settlement.SETTLEMENT_CONTRACT, voucher.channel_id
            )
        except ChainUnavailable as exc:
            return await self._needs_attention(p, f"{heard}; chain unavailable: {exc.reason}")
        if balance >= voucher.max_claimable:
            state = {"balance": str(balance), "totalClaimed": str(claimed), "withdrawRequestedAt": withdrawal}
            answer = {"transaction": "", "extra": {"channelState": state}}
            return await self._settled(p, answer, "", note="confirmed on chain: the channel holds the voucher's amount")
        _, valid_before = scheme.window(payment.payload["payload"])  # its collector's window
        left = valid_before - await self.claims.database_time()
        if left <= 0:
            return await self._unsettled(p, f"{heard}; chain: the channel lacks the voucher's amount, deposit expired")
        delay = min(jittered(self.pass_delay(passes)), left + 1.0)
        return await self._owed(p, f"{heard}; chain: the deposit has not landed, still valid", True, passes, delay)

    async def _settled(self, p: Pass, answer: dict[str, Any], tx: str, note: str = "") -> Collection:
        channel = self._channel_charge(p, answer)
        receipt = channel.receipt if channel is not None else p.payment.receipt(answer)

        async def write() -> None:
            row = self._row("settle", p, transaction=tx, error=note or (channel.note if channel else ""))
            if channel is None:
                await self.claims.settled(p.hold, receipt, along=[row])
                return
            # the channel's compare-and-set first, and the claim settled only if it applied: one statement group
            await self.claims.settled(p.hold, receipt, along=[row], first=[channel.charge], provided=channel.charged)

        try:  # the claim's update, what it stands on and its row are one statement group: one round trip
            await commit_until_stored(self.claims.db, write, "a settlement", atomic=True)
        except Unmet:  # the channel's charged total is not this voucher's base: it never pays for this request
            return await self._unsettled(p, "channel_state_changed: the channel was charged past this voucher's base")
        return self._was_settled(p.payment, receipt)

    def _was_settled(self, payment: Payment, receipt: dict[str, Any]) -> Collection:
        """A settlement recorded: counted, and the collection the task shows. A channel's voucher is
        charged here and collected later, when the claim job claims it on chain (`gate.channel_jobs`)."""
        self._count("settled")
        if self.metrics is not None and payment.amount.isdigit():
            scheme = schemes.for_requirements(payment.requirements)
            counter = self.metrics.channel_charged if scheme is not None and scheme.channel else self.metrics.revenue
            counter.labels(payment.network, payment.asset).inc(int(payment.amount))
        return Collection(ClaimState.SETTLED, completed_metadata(receipt))

    async def _no_charge(self, p: Pass) -> Collection:
        """An upto delivery whose charge is 0 (its usage priced at nothing, or its pricing failed):
        terminal, with a receipt of 0 and no settle call; the claim stays, so its signature buys nothing more."""
        payment = p.payment
        receipt = payment.receipt(
            {"success": True, "transaction": "", "network": payment.network, "payer": payment.payer, "amount": "0"}
        )
        error = str(payment.usage.get("error", ""))

        async def write() -> None:
            row = self._row("no_charge", p, error=error or "usage priced at 0")
            await self.claims.no_charge(p.hold, receipt, error, along=[row])

        await commit_until_stored(self.claims.db, write, "a delivery charged nothing", atomic=True)
        self._count("no_charge")
        return Collection(ClaimState.NO_CHARGE, completed_metadata(receipt))

    def _channel_charge(self, p: Pass, answer: dict[str, Any]) -> ChannelCharge | None:
        """For a channel payment: the write that advances the channel's charged total, and the receipt
        the binding defines (`extra.chargedAmount`, `extra.channelState.chargedCumulativeAmount`)."""
        payment = p.payment
        scheme = schemes.for_requirements(payment.requirements)
        if scheme is None or not scheme.channel or self.channels is None or self.seal is None:
            return None
        voucher = batch_settlement.read(payment.payload["payload"])
        price = int(payment.amount)
        base = voucher.max_claimable - price
        mirror = Mirror.read(answer.get("extra") or {}) if voucher.kind == "deposit" else None
        sealed = self.seal(
            {"signature": voucher.signature, "maxClaimableAmount": str(voucher.max_claimable)}, voucher.channel_id
        )
        statement = self.channels.commit_statement(voucher, base, sealed, payment.token_digest, mirror)
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
        return ChannelCharge(
            only_if(statement),
            self.channels.charged_condition(voucher, payment.token_digest),
            receipt,
            f"channel {voucher.channel_id[:18]} charged to {voucher.max_claimable}",
        )

    async def _owed(self, p: Pass, error: str, unknown: bool, passes: int, delay: float) -> Collection:
        async def write() -> None:
            row = self._row("settle_failed", p, error=error)
            await self.claims.owed(p.hold, error=error, unknown=unknown, passes=passes, delay=delay, along=[row])

        await commit_until_stored(self.claims.db, write, "an owed settlement", atomic=True)
        if self.metrics is not None:
            self.metrics.settle_failures.inc()
        self._count("owed")
        return Collection(ClaimState.SETTLE_FAILED, verified_metadata(error))

    async def _unsettled(self, p: Pass, reason: str) -> Collection:
        async def write() -> None:
            row = self._row("write_off", p, error=reason)
            await self.claims.terminal(p.hold, ClaimState.UNSETTLED, reason, along=[row])

        await commit_until_stored(self.claims.db, write, "a write-off", atomic=True)
        self._count("unsettled")
        logger.warning("settlement written off for task %s: %s", p.task_id, reason)
        return Collection(ClaimState.UNSETTLED, failed_metadata(reason))

    async def _needs_attention(self, p: Pass, reason: str) -> Collection:
        async def write() -> None:
            row = self._row("needs_attention", p, error=reason)
            await self.claims.terminal(p.hold, ClaimState.NEEDS_ATTENTION, reason, along=[row])

        await commit_until_stored(self.claims.db, write, "a settlement needing attention", atomic=True)
        self._count("needs_attention")
        logger.warning("settlement of task %s needs attention: %s", p.task_id, reason)
        return Collection(ClaimState.NEEDS_ATTENTION, verified_metadata(reason))

    def _row(self, action: str, p: Pass, **fields: str) -> Along:
        """The payment log row of a pass's outcome, written with the claim's (and only if it is)."""
        return lambda ours: self.log.statement(action, **p.log_fields(), **fields, only_if=ours)

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.settlements.labels(outcome).inc()


@dataclass(frozen=True)
class ChannelCharge:
    """A delivered voucher's charge: the channel's compare-and-set (`charge`, while the claim is
    ours), the condition that it applied (`charged`), the receipt, the log row's note."""

    charge: Along
    charged: Statement
    receipt: dict[str, Any]
    note: str


def jittered(seconds: float) -> float:
    """Spread retries so many owed claims do not hit the facilitator in lockstep."""
    return seconds * random.uniform(0.5, 1.5)
