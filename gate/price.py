"""A price: what an agent asks per request, and the payment schemes it takes it in.

One `Price` is one offer (one `accepts[]` entry of a 402). A price that takes several
schemes (`exact` beside `batch-settlement`, say) is its first offer with the others as
`alternatives`: every place that asks "what does this agent charge" reads the first,
the 402 and the card list `offers`, and a payment is checked against the offer of its
own scheme (`offer_for`). A usage price (`upto`) asks for a ceiling (`amount`, what the
payer authorizes) and charges the delivery's priced usage (`usage`, a `UsagePrice`), never
more: how usage becomes an amount is the price's (`UsagePrice`), what one delivery is charged the
metered flow's (gate/flows/metered/usage_charge.py).

A `UsagePrice` is a fixed amount plus a unit price per unit of one named usage count
(``fixed + unit_price * usage[unit]``, rounded up to a whole atomic unit), or an operator's
callable (``module:function``, called with the usage mapping, returning whole atomic units; an
`async def` is awaited, for at most PRICING_SECONDS) for anything else.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

PRICING_SECONDS = 5.0  # how long an async pricing callable may take at one delivery

Counts = dict[str, int | float]


@dataclass(frozen=True)
class Price:
    scheme: str
    network: str
    asset: str
    amount: str
    pay_to: str
    max_timeout_seconds: int = 300
    extra: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    asset_transfer_method: str = "eip3009"  # with `scheme`, names the payment scheme (gate/schemes/)
    usage: UsagePrice | None = None  # a usage price: `amount` is its ceiling, the charge is the priced usage
    alternatives: tuple[Price, ...] = ()  # the other offers of the same price, in the order the 402 lists them

    @staticmethod
    def of(offers: Sequence[Price]) -> Price:
        """One price from its offers, in the order the 402 lists them: the first, the rest its alternatives."""
        return replace(offers[0], alternatives=tuple(offers[1:]))

    @property
    def offers(self) -> tuple[Price, ...]:
        """Every offer of this price, this one first: what the 402's `accepts` lists."""
        return (self, *self.alternatives)

    def offer_for(self, scheme: str, transfer_method: str | None = None) -> Price | None:
        """The offer a payment of `scheme` is checked against (the first of that scheme when the
        transfer method is not named); None when this price takes no such scheme."""
        for offer in self.offers:
            if offer.scheme == scheme and transfer_method in (None, offer.asset_transfer_method):
                return offer
        return None


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
