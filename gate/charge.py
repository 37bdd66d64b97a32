"""The hooks one paid execution calls: record the delivery, settle after it, release otherwise.

What a delivery is charged is its flow's (`gate.flows`, a `Meter`): the price, or a charge priced
from the work delivered and sealed onto the claim in the transaction that records the delivery,
so whoever settles it later (the reconciler, a replay) collects that amount and no other. A
meter that charges part by part has a streamed answer delivered part by part, and may end the
run (`server.execution.Stop`).

`Charges.hooks(payment, hold, meter=...)` is what the server's execution is handed
(`server.execution.DeliveryHooks`). Every write names the execution's `hold`; one that finds
the claim taken over raises `OwnershipLost` to the server, and a claim found lost by any
write (or a renewal) revokes the live execution it covered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from gate.claims import ENDED_STATES, Along, ClaimLost, Claims, ClaimState, Hold, only_if
from gate.flows.base import FixedPrice, Meter
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.sealing import KeyOnDemand
from gate.settlement import (
    Collection,
    Payment,
    Settler,
    verified_metadata,
    with_payment_metadata,
    withheld_metadata,
)
from server.database import Statement, commit_until_stored
from server.execution import Collected, DeliveryHooks, DeliveryMode, OwnershipLost, Stop
from server.usage import Counts

logger = logging.getLogger("a2a_gate.gate")

HANDED_OVER = "settlement_handed_over: another server took this payment's claim over and records its outcome"


class LiveDeliveries:
    """The paid executions live in this process, by the hold they write under: a claim found lost
    (`Claims(on_lost=...)`) stops the work it covered."""

    def __init__(self, metrics: GateMetrics) -> None:
        self.metrics = metrics
        self.live: dict[Hold, PaidDelivery] = {}

    def lost(self, lost: ClaimLost) -> None:
        """A fenced write (or a renewal) found a claim of ours taken over: stop the work it covered."""
        logger.warning(
            "lost claim %s at %s: another process took it over after its lease lapsed;"
            " its work is stopped here and nothing more is recorded for it by this process",
            lost.hold.token_digest[:12],
            lost.write,
        )
        self.metrics.claims_lost.labels(lost.write).inc()
        delivery = self.live.pop(lost.hold, None)
        if delivery is not None:
            delivery.revoke()


class Charges:
    """The hooks of each paid execution, kept live until its outcome is recorded."""

    def __init__(
        self, claims: Claims, settler: Settler, log: PaymentLog, live: LiveDeliveries, keys: KeyOnDemand
    ) -> None:
        self.claims, self.settler, self.log, self.live, self.keys = claims, settler, log, live.live, keys

    def sealed_at_claim(self, payment: Payment) -> str:
        """What the claim keeps of `payment` from its start: sealed, for whoever settles it later; nothing
        for a payment the gate charges in its delivery's own write (`Settler.charged_at_delivery`), which
        is sealed onto its claim only if its delivery is recorded apart from its charge (`mark_delivered`)."""
        return (
            ""
            if self.settler.charged_at_delivery(payment)
            else self.keys.seal(payment.sealable(), payment.token_digest)
        )

    def hooks(self, payment: Payment, hold: Hold, *, withhold: bool, meter: Meter | None = None) -> DeliveryHooks:
        """The hooks an execution calls for `payment`, claimed under `hold`, its delivery charged as
        `meter` says (by default: the price)."""
        meter = meter or FixedPrice(payment)
        if withhold:  # settled before the answer leaves
            mode = DeliveryMode.WITHHELD
        elif meter.in_parts:  # a charge that follows the work delivered: a streamed answer, chunk by chunk
            mode = DeliveryMode.IN_PARTS
        elif self.settler.charged_at_delivery(payment):  # the gate charges it itself, in the delivery's write
            mode = DeliveryMode.ONE_WRITE
        else:
            mode = DeliveryMode.WHOLE
        delivery = self.live[hold] = PaidDelivery(self, payment, hold, mode, meter)
        return delivery


class PaidDelivery:
    """One paid execution's hooks (`server.execution.DeliveryHooks`), each write under its `hold`."""

    def __init__(self, charges: Charges, payment: Payment, hold: Hold, mode: DeliveryMode, meter: Meter) -> None:
        self.charges, self.claims, self.settler = charges, charges.claims, charges.settler
        self.payment, self.hold, self.mode, self.meter = payment, hold, mode, meter
        self.outcome: list[Collection] = []
        self.marked = False  # the claim is marked delivered (a first chunk, or the whole answer)
        self.revoke: Callable[[], None] = lambda: None

    def started(self, revoke: Callable[[], None]) -> None:
        self.revoke = revoke

    def gone(self) -> None:
        """No longer live here: a lost claim has nothing of this execution left to stop."""
        self.charges.live.pop(self.hold, None)

    async def mark_delivered(
        self,
        task: dict[str, Any],
        withheld: dict[str, Any] | None,
        used: Counts,
        save: Statement | None,
        priced: Any = None,
    ) -> None:
        along = [] if save is None else [only_if(save)]  # the work is saved only if the delivery is ours
        sealed = await self.meter.seal(used, priced)
        if not sealed and not self.marked and self.settler.charged_at_delivery(self.payment):
            # claimed unsealed (`Charges.sealed_at_claim`), delivered apart from its charge: whoever
            # settles it later (a takeover, the reconciler) reads the payment from the claim
            sealed = self.charges.keys.seal(self.payment.sealable(), self.payment.token_digest)
        try:
            if self.marked:  # delivered in part already: the charge follows what is delivered now
                await self.claims.recharge(self.hold, sealed, along=along)
            else:  # it names the payer and the task too: a delivery is findable even if its bind failed
                await self.claims.mark_delivered(
                    self.hold, withheld, payer=self.payment.payer, task_id=task["id"], sealed=sealed, along=along
                )
        except ClaimLost as lost:
            self.gone()
            raise OwnershipLost(str(lost)) from None
        self.marked = True
        self.meter.recorded()

    async def record_part(self, task: dict[str, Any], used: Counts, save: Statement | None, priced: Any) -> None:
        await self.mark_delivered(task, None, used, save, priced)

    async def deliver_part(self, task: dict[str, Any], used: Counts, save: Statement) -> Stop | None:
        """One part of a streamed answer, charged by the meter before it is recorded."""
        return await self.meter.part(task, used, save, self.record_part)

    async def deliver_final(
        self, task: dict[str, Any], used: Counts, final: Callable[[dict[str, Any]], Sequence[Statement]]
    ) -> Collected | None:
        def saves(metadata: dict[str, Any]) -> list[Along]:  # the task ends as the outcome says
            task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)
            return [only_if(statement) for statement in final(metadata)]

        try:
            collection = await self.settler.settle_delivery(self.payment, task["id"], self.hold, along=saves)
        except ClaimLost as lost:
            self.gone()
            raise OwnershipLost(str(lost)) from None
        if collection is None:  # what its charge stood on moved: the plain hooks record it (its settle too)
            return None
        self.gone()
        self.outcome.append(collection)
        return Collected(collection.metadata, collection.paid)

    async def delivered(self, task: dict[str, Any]) -> Collected:
        settled = await self.meter.charged(self.hold)
        try:
            collection = await self.settler.settle(settled, task["id"], self.hold)
        except ClaimLost:  # delivered, then taken over while settling: the new owner records it
            collection = Collection(ClaimState.SETTLE_FAILED, verified_metadata(HANDED_OVER))
        self.outcome.append(collection)
        unpaid_answer = self.mode is DeliveryMode.WITHHELD and not collection.paid
        metadata = withheld_metadata(collection.metadata) if unpaid_answer else collection.metadata
        task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)  # mirrored at task.metadata
        return Collected(metadata, collection.paid)

    async def not_delivered(self, task: dict[str, Any]) -> None:
        payment, claims = self.payment, self.claims

        async def write() -> None:
            await claims.release(self.hold)
            await self.charges.log.append(
                "release", **payment.log_fields(task["id"]), error=f"task {task['status']['state']}: not charged"
            )

        self.gone()
        try:
            await commit_until_stored(claims.db, write, "a release")
        except ClaimLost as lost:
            raise OwnershipLost(str(lost)) from None

    async def saved(self, save: Statement) -> None:
        self.gone()
        final = bool(self.outcome) and self.outcome[-1].state in ENDED_STATES
        try:
            await self.claims.task_synced(self.hold, final=final, along=[only_if(save)])
        except ClaimLost as lost:
            raise OwnershipLost(str(lost)) from None

    def abandoned(self) -> None:
        self.gone()
        self.claims.let_go(self.hold)
