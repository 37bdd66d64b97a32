"""A price: what an agent asks per request, and the payment schemes it takes it in.

One `Price` is one offer (one `accepts[]` entry of a 402). A price that takes several
schemes (`exact` beside `batch-settlement`, say) is its first offer with the others as
`alternatives`: every place that asks "what does this agent charge" reads the first,
the 402 and the card list `offers`, and a payment is checked against the offer of its
own scheme (`offer_for`). A usage price (`upto`) asks for a ceiling (`amount`, what the
payer authorizes) and charges the delivery's priced usage (`usage`, gate/usage_price.py),
never more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gate.usage_price import UsagePrice


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
