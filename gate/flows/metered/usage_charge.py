"""A usage charge: what one delivery of a usage price (`gate.price.UsagePrice`) is charged.

The charge is the priced usage, or the ceiling when the usage prices above it (`Charge.capped`:
an answer delivered whole, which the operator gave away the rest of, logged and counted). A
pricing callable that raises, or answers anything but a whole non-negative number, charges
nothing (`Charge.error`): the work was delivered and stays unpaid rather than charged a guess. So
does usage that is not counts (a number that is NaN, infinite, negative or past
`server.usage.MAX_COUNT`): the agent's error.

An answer delivered in parts is priced at each part (`flow.UsageMeter`): a part whose usage
prices past the ceiling, or cannot be priced, is not delivered, and one that reaches the
ceiling is the last (`Charge.reached`): the ceiling ends the work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from gate.payment import Payment
from gate.price import Counts, UsagePrice
from server import usage

logger = logging.getLogger("a2a_gate.gate")

PRICING_FAILED = "pricing_failed"
USAGE_INVALID = "usage_invalid"


@dataclass(frozen=True)
class Charge:
    """What one delivery is charged: `amount` (settled), the usage it was priced from, and the ceiling."""

    amount: int
    ceiling: int
    used: Counts
    priced: int | None  # None: the pricing failed
    terms: dict[str, str]
    error: str = ""
    stopped: bool = False  # the work was stopped at the ceiling: what came after was not delivered

    @property
    def capped(self) -> bool:
        return self.priced is not None and self.priced > self.ceiling

    @property
    def reached(self) -> bool:
        """The usage prices at the ceiling or past it: nothing more can be delivered for it."""
        return self.priced is not None and self.priced >= self.ceiling

    def receipt(self) -> dict[str, Any]:
        """The receipt's `extra.usage`: units, rule, priced amount, the amount charged and the ceiling."""
        described: dict[str, Any] = {"units": dict(self.used), **self.terms}
        described["amount"] = str(self.amount)
        described["ceiling"] = str(self.ceiling)
        if self.priced is not None:
            described["priced"] = str(self.priced)
        if self.capped:
            described["capped"] = True
        if self.error:
            described["error"] = self.error
        if self.stopped:
            described["ceilingReached"] = True
        return described


def usage_problem(used: Counts) -> str:
    """What makes `used` no usage report ("" when it is one): a count that is no number, NaN,
    infinite, negative or past `server.usage.MAX_COUNT` (the server refuses them before; this is
    the gate's own check of what it prices)."""
    try:
        usage.checked(used)
    except usage.BadUsage as bad:
        return str(bad)
    return ""


async def charge(price: UsagePrice, ceiling: int, used: Counts, agent: str = "") -> Charge:
    """min(priced usage, ceiling); nothing when the usage is not counts, or the pricing fails
    (logged, with its cause)."""
    if problem := usage_problem(used):
        logger.error("agent %s: its usage is not counts (%s); the delivery is charged nothing", agent, problem)
        return Charge(0, ceiling, {}, None, price.terms(), f"{USAGE_INVALID}: {problem}")
    try:
        priced = await price.priced(used)
    except Exception as exc:  # the operator's pricing code: its failure charges nothing
        logger.error(
            "agent %s: pricing its usage failed (%s); the delivery is charged nothing",
            agent,
            type(exc).__name__,
            exc_info=exc,
        )
        return Charge(0, ceiling, used, None, price.terms(), f"{PRICING_FAILED}: {type(exc).__name__}")
    if priced > ceiling:
        logger.warning(
            "agent %s: usage priced at %d, above the ceiling %d the payer authorized; charged the ceiling",
            agent,
            priced,
            ceiling,
        )
    return Charge(min(priced, ceiling), ceiling, used, priced, price.terms())


def charged_payment(payment: Payment, charge: Charge) -> Payment:
    """The (upto) `payment` as its delivery is settled: the requirements ask for the charge, not the ceiling."""
    amount = str(charge.amount)
    return replace(
        payment,
        amount=amount,
        requirements={**payment.requirements, "amount": amount},
        authorized=str(charge.ceiling),
        usage=charge.receipt(),
    )
