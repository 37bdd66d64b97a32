"""x402 `upto` on EVM (always Permit2): the payer authorizes a ceiling, the gate settles what was used.

The payload is a Permit2 `PermitWitnessTransferFrom` like `exact`'s (exactly
``{permit2Authorization, signature}``, every field checked) for x402's upto proxy, whose
witness also names the facilitator allowed to settle it (``{to, facilitator, validAfter}``):
the token is the price's asset, `witness.to` its payTo, `witness.facilitator` the
`facilitatorAddress` the 402 offered, `permitted.amount` its ceiling. The claim is on
(network, owner, Permit2 nonce), the same key as `exact` with Permit2: one Permit2 nonce
is one claim whichever scheme wraps it. The settle asks for the charged amount
(`requirements.amount`), which the facilitator checks is at most the permitted one.

As for `exact` with Permit2, the chain is not asked about Permit2 nonces: an owed upto
settlement the facilitator cannot confirm ends as `needs_attention`.
"""

from __future__ import annotations

from typing import Any

from gate.price import Price
from gate.schemes.base import GENERIC_DEFINITIVE_REASONS, NONCE_USED_REASONS, Rejection
from gate.schemes.exact_permit2 import DEFINITIVE_REASONS as PERMIT2_REASONS
from gate.schemes.exact_permit2 import ExactPermit2, check_permit2

# x402UptoPermit2Proxy: the one spender x402's upto clients sign for.
PROXY = "0x4020a4f3b7b90cca423b9fabcc0ce57c6c240002"
WITNESS_KEYS = frozenset({"to", "facilitator", "validAfter"})

DEFINITIVE_REASONS = (
    GENERIC_DEFINITIVE_REASONS
    | PERMIT2_REASONS
    | {
        "invalid_upto_evm_payload_settlement_exceeds_amount",
        "upto_facilitator_mismatch",
        "upto_amount_exceeds_permitted",
        "upto_unauthorized_facilitator",
        "invalid_upto_evm_scheme",
        "invalid_upto_evm_network_mismatch",
        "permit2_invalid_amount",
        "permit2_payment_too_early",
    }
)
UPTO_NONCE_USED_REASONS = NONCE_USED_REASONS | {"permit2_invalid_nonce"}


class UptoPermit2(ExactPermit2):
    """`exact` by Permit2 with another spender and witness: its extra, window, nonce key and chain
    reading are the same (one Permit2 nonce, one claim)."""

    scheme = "upto"
    advertised = ("facilitatorAddress",)  # the address the facilitator settles from (the permit's witness)
    definitive_reasons = DEFINITIVE_REASONS
    nonce_used_reasons = UPTO_NONCE_USED_REASONS

    def check(self, inner: dict[str, Any], price: Price) -> None:
        auth = check_permit2(inner, price, PROXY, WITNESS_KEYS)
        offered = str(price.extra.get("facilitatorAddress", ""))
        if auth["witness"]["facilitator"].lower() != offered.lower():
            raise Rejection("upto_facilitator_mismatch")


SCHEME = UptoPermit2()
