"""The metered flow (`upto`): the payer authorizes a ceiling; the delivered work's priced usage is settled.

Verified like an authorization. At the delivery the usage the agent reported is priced
(`gate.price.UsagePrice`, charged by `usage_charge`), capped at the ceiling the payer
authorized, and the charge is sealed onto the claim in the transaction that records the
delivery, so whoever settles it later (the reconciler, a replay) collects that amount and no
other. An answer streamed in parts is priced at each part, and the ceiling ends the work: a part
whose usage prices past the ceiling (or cannot be priced) is refused, unrecorded and unshown,
and a part that reaches the ceiling is the last; either way the run is told to stop
(`server.execution.Stop`), and the charge is what was delivered: at most the ceiling. A delivery
priced at 0 is charged nothing: no settle call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gate.chain import Chain
from gate.claims import Claims, Hold
from gate.facilitator import FacilitatorClient
from gate.flows.authorization import AuthorizationFlow
from gate.flows.base import FACILITATOR, NOTHING, Meter, Record, SettledWrite
from gate.flows.metered.usage_charge import USAGE_INVALID, Charge, charge, charged_payment
from gate.metrics import GateMetrics
from gate.payment import Payment
from gate.price import Counts, Price, UsagePrice
from gate.sealing import KeyOnDemand
from server.database import Statement
from server.execution import Stop

# what a task stopped by its usage ceiling says (its receipt's `extra.usage.ceilingReached`)
CEILING_REACHED = "Stopped at the usage ceiling the payment authorized: nothing past it is delivered or charged."
UNPRICEABLE = "Stopped: the usage of the answer's next part could not be priced; the answer ends here."


class MeteredFlow(AuthorizationFlow):
    """An authorization of a ceiling, settled for the priced usage of the work delivered."""

    name = "metered"

    def __init__(
        self, facilitator: FacilitatorClient, chain: Chain, metrics: GateMetrics, claims: Claims, keys: KeyOnDemand
    ) -> None:
        super().__init__(facilitator, chain, metrics)
        self.claims, self.keys, self.usage_metrics = claims, keys, metrics

    def meter(self, payment: Payment, price: Price) -> Meter:
        assert price.usage is not None  # an upto price says how usage is priced
        return UsageMeter(self, payment, price.usage)

    def settles_by(self, payment: Payment) -> str:
        return NOTHING if payment.metered and payment.amount == "0" else FACILITATOR

    def settled_write(self, payment: Payment, answer: dict[str, Any]) -> SettledWrite:
        """The receipt states the usage charged (`extra.usage`); a charge of 0 notes why (its pricing's error)."""
        return SettledWrite(payment.receipt(answer), str(payment.usage.get("error", "")))

    def count_charge(self, charged: Payment) -> None:
        """A delivery's charge, counted by how it came out."""
        usage, error = charged.usage, str(charged.usage.get("error", ""))
        outcome = "capped" if usage.get("capped") else "priced"
        if usage.get("ceilingReached"):
            outcome = "stopped_at_ceiling"
        if error:
            outcome = USAGE_INVALID if error.startswith(USAGE_INVALID) else "pricing_failed"
        self.usage_metrics.usage_charges.labels(outcome).inc()


class UsageMeter:
    """One delivery's charge: its usage priced at each record, never above the ceiling."""

    in_parts = True  # an upto charge follows the work delivered: a streamed answer is delivered part by part

    def __init__(self, flow: MeteredFlow, payment: Payment, usage_price: UsagePrice) -> None:
        self.flow, self.payment, self.usage_price = flow, payment, usage_price
        self.settled = payment  # what the delivery settles: its charge as last sealed
        self.charges: list[Charge] = []  # its charge as last recorded
        self.pending: Charge | None = None

    async def price(self, used: Counts) -> Charge:
        return await charge(self.usage_price, int(self.payment.amount), used, self.payment.agent)

    async def seal(self, used: Counts, priced: Any = None) -> str:
        charged: Charge = priced or await self.price(used)
        self.pending = charged
        self.settled = charged_payment(self.payment, charged)
        return self.flow.keys.seal(self.settled.sealable(), self.payment.token_digest)

    def recorded(self) -> None:
        if self.pending is not None:
            self.charges.append(self.pending)

    async def part(self, task: dict[str, Any], used: Counts, save: Statement, record: Record) -> Stop | None:
        """One part of a streamed answer, priced before it is recorded: the ceiling ends the work."""
        charged = await self.price(used)
        if charged.error or charged.capped:  # past the ceiling, or unpriceable: refused, and the run ends
            why = UNPRICEABLE if charged.error else CEILING_REACHED
            state = "failed" if charged.error else "completed"
            if charged.capped and self.charges:  # what was delivered stays charged, marked as stopped there
                await record(task, used, None, replace(self.charges[-1], stopped=True))
            return Stop(delivered=False, state=state, why=why)
        if charged.reached:  # exactly at the ceiling: delivered, and the last part
            await record(task, used, save, replace(charged, stopped=True))
            return Stop(delivered=True, state="completed", why=CEILING_REACHED)
        await record(task, used, save, charged)
        return None

    async def charged(self, hold: Hold) -> Payment:
        """The charge the claim records (sealed with the last delivery that committed), which is what is
        settled: a chunk whose record rolled back was never shown, and is never charged."""
        claim = await self.flow.claims.find(hold.token_digest)
        if claim is None or claim.fence != hold.fence or not claim.sealed_payment:
            recorded = self.settled  # taken over: the settle's fenced write finds it so, and records nothing
        else:
            sealed = self.flow.keys.unseal(claim.sealed_payment, hold.token_digest)
            recorded = replace(Payment.unsealed(sealed, claim, ("", "", "")), payer=self.settled.payer)
        self.flow.count_charge(recorded)
        return recorded
