"""The hooks one paid execution calls: settle after delivery, release otherwise.

An upto payment is charged at its delivery: the usage the agent reported is priced
(gate/usage_price.py), capped at the ceiling the payer authorized, and the charge is
sealed onto the claim in the transaction that records the delivery, so whoever
settles it later (the reconciler, a replay) collects that amount and no other. An answer
streamed in parts is priced at each part, and the ceiling ends the work: a part whose
usage prices past the ceiling (or cannot be priced) is refused, unrecorded and unshown,
and a part that reaches the ceiling is the last; either way the run is told to stop
(`server.execution.Stop`), and the charge is what was delivered: at most the ceiling.

`Charges.hooks(payment, hold)` is what the server's execution is handed
(`server.execution.DeliveryHooks`). Every write names the execution's `hold`; one that finds
the claim taken over raises `OwnershipLost` to the server, and a claim found lost by any
write (or a renewal) revokes the live execution it covered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gate.claims import ENDED_STATES, Along, ClaimLost, Claims, ClaimState, Hold, only_if
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.sealing import Sealer
from gate.settlement import (
    Collection,
    Payment,
    Settler,
    verified_metadata,
    with_payment_metadata,
    withheld_metadata,
)
from gate.usage_price import USAGE_INVALID, Charge, Counts, UsagePrice, charge
from server.database import Statement, commit_until_stored
from server.execution import Collected, DeliveryHooks, OwnershipLost, Stop

logger = logging.getLogger("a2a_gate.gate")

HANDED_OVER = "settlement_handed_over: another server took this payment's claim over and records its outcome"
# what a task stopped by its usage ceiling says (its receipt's `extra.usage.ceilingReached`)
CEILING_REACHED = "Stopped at the usage ceiling the payment authorized: nothing past it is delivered or charged."
UNPRICEABLE = "Stopped: the usage of the answer's next part could not be priced; the answer ends here."


class Charges:
    """The live paid executions' hooks, by the hold they write under."""

    def __init__(self, claims: Claims, settler: Settler, log: PaymentLog, metrics: GateMetrics) -> None:
        self.claims, self.settler, self.log, self.metrics = claims, settler, log, metrics
        self.live: dict[Hold, DeliveryHooks] = {}
        claims.on_lost = self.lost

    def hooks(
        self,
        payment: Payment,
        hold: Hold,
        *,
        withhold: bool,
        usage_price: UsagePrice | None = None,
        sealer: Sealer | None = None,
    ) -> DeliveryHooks:
        """The hooks an execution calls for `payment`, claimed under `hold`; with a `usage_price`
        (upto), the delivery is charged its priced usage, sealed with `sealer`."""
        claims, live = self.claims, self.live
        outcome: list[Collection] = []
        settled = [payment]  # what the delivery settles: the payment, or its upto charge
        marked: list[bool] = []  # the claim is marked delivered (a first chunk, or the whole answer)
        charges: list[Charge] = []  # an upto delivery's charge as last recorded
        one_write = self.settler.charged_at_delivery(payment)  # charged by the gate's own write: deliver_final

        async def mark_delivered(
            task: dict[str, Any],
            withheld: dict[str, Any] | None,
            used: Counts,
            save: Statement | None,
            charged: Charge | None = None,
        ) -> None:
            along = [] if save is None else [only_if(save)]  # the work is saved only if the delivery is ours
            sealed = ""
            if usage_price is not None:
                charged = charged or await charge(usage_price, int(payment.amount), used, payment.agent)
                sealed = seal(charged)
            try:
                if marked:  # delivered in part already: the charge follows what is delivered now
                    await claims.recharge(hold, sealed, along=along)
                else:  # it names the payer and the task too: a delivery is findable even if its bind failed
                    await claims.mark_delivered(
                        hold, withheld, payer=payment.payer, task_id=task["id"], sealed=sealed, along=along
                    )
            except ClaimLost as lost:
                live.pop(hold, None)
                raise OwnershipLost(str(lost)) from None
            marked.append(True)
            if charged is not None:
                charges.append(charged)

        def seal(charged: Charge) -> str:
            assert sealer is not None
            settled[0] = payment.charged(charged)
            return sealer.seal(settled[0].sealable(), payment.token_digest)

        async def deliver_part(task: dict[str, Any], used: Counts, save: Statement) -> Stop | None:
            """One part of a streamed answer, priced before it is recorded: the ceiling ends the work."""
            assert usage_price is not None
            charged = await charge(usage_price, int(payment.amount), used, payment.agent)
            if charged.error or charged.capped:  # past the ceiling, or unpriceable: refused, and the run ends
                why = UNPRICEABLE if charged.error else CEILING_REACHED
                state = "failed" if charged.error else "completed"
                if charged.capped and charges:  # what was delivered stays charged, marked as stopped there
                    await mark_delivered(task, None, used, None, replace(charges[-1], stopped=True))
                return Stop(delivered=False, state=state, why=why)
            if charged.reached:  # exactly at the ceiling: delivered, and the last part
                await mark_delivered(task, None, used, save, replace(charged, stopped=True))
                return Stop(delivered=True, state="completed", why=CEILING_REACHED)
            await mark_delivered(task, None, used, save, charged)
            return None

        async def deliver_final(
            task: dict[str, Any], used: Counts, final: Callable[[dict[str, Any]], Sequence[Statement]]
        ) -> Collected | None:
            def saves(metadata: dict[str, Any]) -> list[Along]:  # the task ends as the outcome says
                task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)
                return [only_if(statement) for statement in final(metadata)]

            try:
                collection = await self.settler.settle_delivery(payment, task["id"], hold, along=saves)
            except ClaimLost as lost:
                live.pop(hold, None)
                raise OwnershipLost(str(lost)) from None
            if collection is None:  # what its charge stood on moved: the plain hooks record it (its settle too)
                return None
            live.pop(hold, None)
            outcome.append(collection)
            return Collected(collection.metadata, collection.paid)

        async def delivered(task: dict[str, Any]) -> Collected:
            if usage_price is not None:
                assert sealer is not None
                settled[0] = await self.recorded_charge(hold, sealer, settled[0])
                self.count_charge(settled[0])
            try:
                collection = await self.settler.settle(settled[0], task["id"], hold)
            except ClaimLost:  # delivered, then taken over while settling: the new owner records it
                collection = Collection(ClaimState.SETTLE_FAILED, verified_metadata(HANDED_OVER))
            outcome.append(collection)
            unpaid_answer = withhold and not collection.paid
            metadata = withheld_metadata(collection.metadata) if unpaid_answer else collection.metadata
            task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)  # mirrored at task.metadata
            return Collected(metadata, collection.paid)

        async def not_delivered(task: dict[str, Any]) -> None:
            async def write() -> None:
                await claims.release(hold)
                await self.log.append(
                    "release", **payment.log_fields(task["id"]), error=f"task {task['status']['state']}: not charged"
                )

            live.pop(hold, None)
            try:
                await commit_until_stored(claims.db, write, "a release")
            except ClaimLost as lost:
                raise OwnershipLost(str(lost)) from None

        async def saved(save: Statement) -> None:
            live.pop(hold, None)
            final = bool(outcome) and outcome[-1].state in ENDED_STATES
            try:
                await claims.task_synced(hold, final=final, along=[only_if(save)])
            except ClaimLost as lost:
                raise OwnershipLost(str(lost)) from None

        def abandoned() -> None:
            live.pop(hold, None)
            claims.let_go(hold)

        hooks = DeliveryHooks(
            mark_delivered=mark_delivered,
            delivered=delivered,
            not_delivered=not_delivered,
            saved=saved,
            abandoned=abandoned,
            withhold=withhold,
            # an upto charge follows the work delivered: a streamed answer is delivered chunk by chunk
            deliver_part=deliver_part if usage_price is not None and not withhold else None,
            # a payment the gate charges itself: the delivery, its charge and the final task in one write
            deliver_final=deliver_final if one_write and not withhold else None,
        )
        live[hold] = hooks
        return hooks

    async def recorded_charge(self, hold: Hold, sealer: Sealer, latest: Payment) -> Payment:
        """The upto charge the claim records (sealed with the last delivery that committed), which is
        what is settled: a chunk whose record rolled back was never shown, and is never charged."""
        claim = await self.claims.find(hold.token_digest)
        if claim is None or claim.fence != hold.fence or not claim.sealed_payment:
            return latest  # taken over: the settle's fenced write finds it so, and records nothing
        recorded = Payment.unsealed(sealer.unseal(claim.sealed_payment, hold.token_digest), claim, ("", "", ""))
        return replace(recorded, payer=latest.payer)

    def count_charge(self, charged: Payment) -> None:
        """An upto delivery's charge, counted by how it came out."""
        usage, error = charged.usage, str(charged.usage.get("error", ""))
        outcome = "capped" if usage.get("capped") else "priced"
        if usage.get("ceilingReached"):
            outcome = "stopped_at_ceiling"
        if error:
            outcome = USAGE_INVALID if error.startswith(USAGE_INVALID) else "pricing_failed"
        self.metrics.usage_charges.labels(outcome).inc()

    def lost(self, lost: ClaimLost) -> None:
        """A fenced write (or a renewal) found a claim of ours taken over: stop the work it covered."""
        logger.warning(
            "lost claim %s at %s: another process took it over after its lease lapsed;"
            " its work is stopped here and nothing more is recorded for it by this process",
            lost.hold.token_digest[:12],
            lost.write,
        )
        self.metrics.claims_lost.labels(lost.write).inc()
        hooks = self.live.pop(lost.hold, None)
        if hooks is not None:
            hooks.revoke()
