"""The payment schemes the gate takes, one module each, found by the names a price gives.

An agent's price names its scheme and transfer method (`scheme = "exact"`,
`asset_transfer_method = "eip3009"`; `scheme = "upto"` is always Permit2); its 402 offers
that scheme, and every payload for it is read by that scheme's module alone. A new scheme
is a module behind `base.Scheme` and one entry here.
"""

from __future__ import annotations

from typing import Any

from gate.price import Price
from gate.schemes import batch_settlement, exact_eip3009, exact_permit2, upto_permit2
from gate.schemes.base import Rejection, Scheme

__all__ = ["SCHEMES", "Rejection", "Scheme", "for_price", "for_requirements", "named", "named_payer", "v1_signable"]

SCHEMES: dict[tuple[str, str], Scheme] = {
    (s.scheme, s.transfer_method): s
    for s in (
        exact_eip3009.SCHEME,
        exact_permit2.SCHEME,
        upto_permit2.SCHEME,
        batch_settlement.SCHEME,
        batch_settlement.PERMIT2_SCHEME,
    )
}
DEFAULT_TRANSFER_METHOD = "eip3009"


def named(scheme: str, transfer_method: str) -> Scheme | None:
    return SCHEMES.get((scheme, transfer_method))


def for_price(price: Price) -> Scheme:
    """The scheme a (validated) price takes payment in."""
    return SCHEMES[(price.scheme, price.asset_transfer_method)]


def for_requirements(requirements: dict[str, Any]) -> Scheme | None:
    """The scheme of requirements the gate itself wrote (v1 or v2): its price's."""
    extra = requirements.get("extra")
    method = extra.get("assetTransferMethod") if isinstance(extra, dict) else None
    return named(str(requirements.get("scheme", "")), method if isinstance(method, str) else DEFAULT_TRANSFER_METHOD)


def v1_signable(price: Price) -> bool:
    """Whether an x402 v1 client signs this offer as offered (a v1 document lists only those)."""
    return for_price(price).v1_signable


def named_payer(inner: Any) -> str:
    """The payer a signed payload of any scheme names (unverified, lowercase), "" when none does:
    a refusal names who it refused even when the payload is not of the offer's kind."""
    if not isinstance(inner, dict):
        return ""
    for scheme in SCHEMES.values():
        payer = scheme.named_payer(inner)
        if payer:
            return payer
    return ""
