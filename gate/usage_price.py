"""A usage price: what delivered work costs, from the usage its agent reported, never above a ceiling.

An `upto` price offers its ceiling (the 402's `amount`, what the payer authorizes) and
says how a delivery's usage becomes an amount: a fixed amount plus a unit price per unit
of one named usage count (``fixed + unit_price * usage[unit]``, rounded up to a whole
atomic unit), or an operator's callable (``module:function``, called with the usage
mapping, returning whole atomic units; an `async def` is awaited, for at most
PRICING_SECONDS) for anything else. The charge is the priced usage, or the ceiling when
the usage prices above it (`Charge.capped`: an answer delivered whole, which the operator
gave away the rest of, logged and counted). A callable that raises, or answers anything
but a whole non-negative number, charges nothing (`Charge.error`): the work was delivered
and stays unpaid rather than charged a guess. So does usage that is not counts (a number
that is NaN, infinite, negative or past `server.usage.MAX_COUNT`): the agent's error.

An answer delivered in parts is priced at each part (gate/charge.py): a part whose usage
prices past the ceiling, or cannot be priced, is not delivered, and one that reaches the
ceiling is the last (`Charge.reached`): the ceiling ends the work.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from server import usage

logger = logging.getLogger("a2a_gate.gate")

PRICING_FAILED = "pricing_failed"
USAGE_INVALID = "usage_invalid"
PRICING_SECONDS = 5.0  # how long an async pricing callable may take at one delivery

Counts = dict[str, int | float]


@dataclass(frozen=True)
class UsagePrice:
    """How usage becomes atomic units: `fixed` + `unit_price` per `unit`, or `function`'s answer."""

    fixed: int = 0
    unit: str = ""  # the usage count charged per unit ("characters", "output_tokens")
    unit_price: Fraction = Fraction(0)  # atomic units per unit; may be a fraction of one
    callable: str = ""  # "module:function", when the price is an operator's code
    function: Callable[[Counts], Any] | None = field(default=None, compare=False, repr=False)

    async def priced(self, used: Counts) -> int:
        """The usage's amount in atomic units (uncapped); raises whatever the callable raises (an
        async one's TimeoutError past PRICING_SECONDS)."""
        if self.function is not None:
            amount = self.function(dict(used))
            if inspect.isawaitable(amount):
                amount = await asyncio.wait_for(amount, PRICING_SECONDS)
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise ValueError(f"the pricing callable returned {type(amount).__name__}, not a whole amount >= 0")
            return amount
        units = Fraction(str(used.get(self.unit, 0)))
        return self.fixed + math.ceil(self.unit_price * units)

    def terms(self) -> dict[str, str]:
        """What the receipt says of the rule (a callable's is its name)."""
        if self.callable:
            return {"pricing": self.callable}
        return {"unit": self.unit, "unitPrice": fraction_text(self.unit_price), "fixed": str(self.fixed)}


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


def fraction_text(value: Fraction) -> str:
    """A unit price as the decimal it was written as ("0.25"), or n/d when it has no finite decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator, twos, fives = value.denominator, 0, 0
    while denominator % 2 == 0:
        denominator, twos = denominator // 2, twos + 1
    while denominator % 5 == 0:
        denominator, fives = denominator // 5, fives + 1
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = value * 10**places
    text = str(scaled.numerator).rjust(places + 1, "0")
    return f"{text[:-places]}.{text[-places:]}"
