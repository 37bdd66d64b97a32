"""A price: what an agent asks per request, and the payment scheme it takes it in.

A usage price (`upto`) asks for a ceiling (`amount`, what the payer authorizes) and
charges the delivery's priced usage (`usage`, gate/usage_price.py), never more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
