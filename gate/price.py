"""A price: what an agent asks per request, and the payment scheme it takes it in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
