"""Settling delivered work: the one path shared by send, stream, replays and the reconciler.

Settle runs only after a delivery. Every answer is classified (DESIGN section 6):
- success: `settled`, with the receipt;
- a definitive refusal (bad signature, no funds, expired, a nonce used with no earlier
  attempt of ours that may have spent it): `unsettled`, written off;
- unknown (timeout, 5xx, transport, a refusal we cannot read): retried with backoff and
  jitter, then left owed for the reconciler, whose passes back off exponentially up to
  a cap. When an owed claim hears "nonce already used", or reaches the cap, the chain
  is asked, as the payment's flow asks it (`gate.flows`; an authorization's: a transaction
  that used it AND moved the price from the payer to payTo): paid -> `settled` with that
  transaction; spent without such a transfer (canceled by the payer, front-run) ->
  `unsettled`; not yet collected -> owed until it expires, `unsettled` after; no chain
  answer (no endpoint for the network, an outage) -> `needs_attention`.
How a payment is asked for, recorded and counted is its flow's (`Flow.settles_by`,
`settled_write`, `count_settled`); the passes, their budget and the outcomes are this module's.
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
from dataclasses import dataclass
from typing import Any

from gate import schemes
from gate.claims import Along, Claim, Claims, ClaimState, Hold, Unmet
from gate.config import FacilitatorConfig
from gate.facilitator import FacilitatorClient, Unavailable
from gate.flows.base import HERE, NOTHING, Flows
from gate.metrics import GateMetrics
from gate.offer_receipt import OfferReceipts
from gate.payment import Payment
from gate.payment_log import PaymentLog
from gate.schemes.base import Scheme
from server.database import commit_until_stored
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


def resource_url(payment: Payment, public_url: str) -> str:
    """The door a payment paid at, as its 402 named it: the v2 payload's `resource.url` (checked
    against the door when the payment was read), a v1 requirement's `resource`, else the agent's URL."""
    resource = payment.payload.get("resource") if isinstance(payment.payload, dict) else None
    if isinstance(resource, dict) and isinstance(resource.get("url"), str) and resource["url"]:
        return str(resource["url"])
    if isinstance(payment.requirements.get("resource"), str) and payment.requirements["resource"]:
        return str(payment.requirements["resource"])
    return f"{public_url}/a2a/{payment.agent}"


def classify(reason: str, scheme: Scheme | None) -> str:
    """A settle refusal's meaning, as the payment's scheme reads it: "refused", "nonce_used" or "unknown".

    (A payment of no known scheme cannot be read: every refusal is "unknown", and the chain is asked.)"""
    if scheme is None:
        return "unknown"
    if reason in scheme.nonce_used_reasons:
        return "nonce_used"
    return "refused" if reason in scheme.definitive_reasons else "unknown"


class Settler:
    """Settles delivered payments, each as its flow collects it (`gate.flows`), and records every outcome."""

    def __init__(
        self,
        facilitator: FacilitatorClient,
        claims: Claims,
        log: PaymentLog,
        config: FacilitatorConfig,
        flows: Flows,
        metrics: GateMetrics | None = None,
        pass_interval: float = 30.0,
        receipts: OfferReceipts | None = None,
        public_url: str = "",
    ) -> None:
        self.receipts = receipts  # with a signing key: each receipt signed before it is stored
        self.public_url = public_url
        self.metrics = metrics
        self.flows = flows
        self.facilitator = facilitator
        self.claims = claims
        self.log = log
        self.attempts = config.settle_attempts
        self.backoff = config.settle_backoff_seconds
        self.passes = config.settle_passes
        self.max_delay = config.settle_max_delay_seconds
        self.pass_interval = pass_interval

    async def settle(self, payment: Payment, task_id: str, hold: Hold, claim: Claim | None = None) -> Collection:
        """One settle pass for a claim already in `settling` under `hold`; its outcome is committed
        before it returns (`ClaimLost` if the claim was taken over meanwhile: nothing recorded)."""
        pass_ = Pass(payment, task_id, hold)
        flow = self.flows.for_payment(payment)
        settles_by = flow.settles_by(payment)
        if settles_by == NOTHING:  # nothing to collect: no settle, no transfer
            return await self._no_charge(pass_)
        unknown = claim.settle_unknown if claim is not None else False
        passes = claim.settle_passes if claim is not None else 0
        error = "settle_failed"
        scheme = schemes.for_requirements(payment.requirements)
        if settles_by == HERE:  # charged by the settled write itself
            return await self._settled(pass_, {}, "")
        for attempt in range(1, self.attempts + 1):
            try:
                result = await self.facilitator.settle(payment.version, payment.payload, payment.requirements)
            except Unavailable as exc:
                unknown, error = True, f"settle_unavailable: {exc.reason}"
            else:
                if result.success:
                    return await self._settled(pass_, flow.settle_answer(result), result.transaction)
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

    def signed(self, p: Pass, receipt: dict[str, Any]) -> dict[str, Any]:
        """The receipt as stored and shown: signed (`gate.offer_receipt`) when a key signs receipts.
        Signed once, before it is stored, so a replay shows the same signature."""
        if self.receipts is None:
            return receipt
        return self.receipts.receipt(p.payment, p.task_id, receipt, resource_url(p.payment, self.public_url))

    def charged_at_delivery(self, payment: Payment) -> bool:
        """A payment the gate charges itself (`HERE`): with its delivery, in the same write."""
        return self.flows.for_payment(payment).settles_by(payment) == HERE

    async def settle_delivery(
        self,
        payment: Payment,
        task_id: str,
        hold: Hold,
        *,
        along: Callable[[dict[str, Any]], Sequence[Along]],
    ) -> Collection | None:
        """A delivery and its charge as one statement group (`charged_at_delivery`): the write the
        charge stands on while the claim is ours and running, the claim delivered and settled provided
        that write applied, its log row and what `along` makes of the outcome's metadata (the task in
        its final form). None, and nothing written, when the write it stands on did not apply: the
        delivery is then recorded alone, and its settle finds the same. `ClaimLost` when the claim is
        not ours."""
        p = Pass(payment, task_id, hold)
        written = self.flows.for_payment(payment).settled_write(payment, {})
        receipt = self.signed(p, written.receipt)
        row = self._row("settle", p, transaction="", error=written.note)
        collection = Collection(ClaimState.SETTLED, completed_metadata(receipt))
        saves = along(collection.metadata)

        async def write() -> None:
            await self.claims.delivered_settled(
                hold,
                receipt,
                payer=payment.payer,
                task_id=task_id,
                along=[*saves, row],  # the rows that came with the task (its verify) first
                first=written.first,
                provided=written.provided,
            )

        try:
            await commit_until_stored(self.claims.db, write, "a delivery and its charge", atomic=True)
        except Unmet:
            return None
        return self._was_settled(payment, receipt)

    def pass_delay(self, passes: int) -> float:
        """The wait before pass `passes + 1`: exponential from the pass interval, capped."""
        return min(self.max_delay, self.pass_interval * 2 ** (passes - 1))

    async def _ask_chain(self, p: Pass, heard: str, passes: int) -> Collection:
        """Ground truth for an unknown settlement, as the payment's flow asks the chain for it."""
        found = await self.flows.for_payment(p.payment).ask_chain(p.payment, heard)
        if found.kind == "paid":
            return await self._settled(p, found.answer, found.transaction, note=found.note)
        if found.kind == "unpaid":
            return await self._unsettled(p, found.reason)
        if found.kind != "pending":
            return await self._needs_attention(p, found.reason)
        left = found.valid_before - await self.claims.database_time()
        if left <= 0:
            return await self._unsettled(p, found.expired)
        # still collectable: it stays owed until it expires
        delay = min(jittered(self.pass_delay(passes)), left + 1.0)
        return await self._owed(p, found.reason, True, passes, delay)

    async def _settled(self, p: Pass, answer: dict[str, Any], tx: str, note: str = "") -> Collection:
        written = self.flows.for_payment(p.payment).settled_write(p.payment, answer)
        receipt = self.signed(p, written.receipt)

        async def write() -> None:
            row = self._row("settle", p, transaction=tx, error=note or written.note)
            # the write it stands on first, and the claim settled only if it applied: one statement group
            await self.claims.settled(p.hold, receipt, along=[row], first=written.first, provided=written.provided)

        try:  # the claim's update, what it stands on and its row are one statement group: one round trip
            await commit_until_stored(self.claims.db, write, "a settlement", atomic=True)
        except Unmet:  # what it stands on did not apply: it never pays for this request
            return await self._unsettled(p, written.unmet)
        return self._was_settled(p.payment, receipt)

    def _was_settled(self, payment: Payment, receipt: dict[str, Any]) -> Collection:
        """A settlement recorded: counted (where its flow counts its money), and the collection the task shows."""
        self._count("settled")
        if payment.amount.isdigit():
            self.flows.for_payment(payment).count_settled(payment)
        return Collection(ClaimState.SETTLED, completed_metadata(receipt))

    async def _no_charge(self, p: Pass) -> Collection:
        """An upto delivery whose charge is 0 (its usage priced at nothing, or its pricing failed):
        terminal, with a receipt of 0 and no settle call; the claim stays, so its signature buys nothing more."""
        payment = p.payment
        zero = {"success": True, "transaction": "", "network": payment.network, "payer": payment.payer, "amount": "0"}
        written = self.flows.for_payment(payment).settled_write(payment, zero)
        receipt, error = self.signed(p, written.receipt), written.note

        async def write() -> None:
            row = self._row("no_charge", p, error=error or "usage priced at 0")
            await self.claims.no_charge(p.hold, receipt, error, along=[row])

        await commit_until_stored(self.claims.db, write, "a delivery charged nothing", atomic=True)
        self._count("no_charge")
        return Collection(ClaimState.NO_CHARGE, completed_metadata(receipt))

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


def jittered(seconds: float) -> float:
    """Spread retries so many owed claims do not hit the facilitator in lockstep."""
    return seconds * random.uniform(0.5, 1.5)
