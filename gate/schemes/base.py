"""What a payment scheme is to the gate: one small interface, and the refusal it raises.

A scheme is one kind of signed payload (x402's `exact` with EIP-3009, `exact` with
Permit2, ...). The gate asks it everything that depends on the kind: whether a payload
is one, every key of it checked; which nonce it spends (one nonce, one claim, whatever
wraps it); its validity window; what the chain can say of it; and which settle
refusals mean it can never be collected. Extraction, normal form, the `accepted`
requirement and the claim itself stay the gate's, the same for every scheme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from gate.price import Price

ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
NONCE = re.compile(r"0x[0-9a-fA-F]{64}")
SIGNATURE = re.compile(r"0x(?:[0-9a-fA-F]{2})+")
UINT = re.compile(r"0|[1-9][0-9]{0,77}")  # canonical decimal uint256: no sign, no leading zeros, no `_`
# As the chain answers them: anchored, matched with `.match`.
CHAIN_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
WORD = re.compile(r"^0x[0-9a-fA-F]{64}$")

# Settle refusals that mean the payment cannot be collected whatever the scheme (plain names).
GENERIC_DEFINITIVE_REASONS = frozenset(
    {"invalid_signature", "insufficient_funds", "insufficient_balance", "expired", "authorization_expired"}
)
NONCE_USED_REASONS = frozenset({"invalid_exact_evm_nonce_already_used", "nonce_already_used"})


class Rejection(Exception):
    """A token refused before or by the facilitator; `reason` is safe to show the payer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def address_at(document: Any, *path: str) -> str:
    """The 0x address at `path` in a payload of any shape, lowercase; "" where there is none."""
    for key in path:
        document = document.get(key) if isinstance(document, dict) else None
    return document.lower() if isinstance(document, str) and ADDRESS.fullmatch(document) else ""


@dataclass(frozen=True)
class Authorization:
    """An EIP-3009 authorization a payment carries, as the chain knows it (`gate.chain`)."""

    network: str
    asset: str  # 0x address, lowercase
    authorizer: str  # 0x address, lowercase
    nonce: str  # 0x + 64 hex digits, lowercase
    valid_before: int


class Scheme(Protocol):
    """One kind of payment payload, as the gate reads, claims and collects it."""

    scheme: str  # x402's scheme name (`accepts[].scheme`)
    transfer_method: str  # how the asset moves (`extra.assetTransferMethod`; "eip3009" when absent)
    versions: tuple[int, ...]  # the x402 versions its payloads may come in
    # whether x402 v1 clients sign it as offered: only those offers are in a v1 document (the
    # x402 packages' v1 clients sign `exact` by EIP-3009 whatever the offer says, and sign no other scheme)
    v1_signable: bool
    # `extra` keys the facilitator advertises for the scheme's kind in /supported, which an offer may
    # leave to it (an address it signs or settles with; `gate.advertised` fills them in)
    advertised: tuple[str, ...]
    definitive_reasons: frozenset[str]  # settle refusals that mean "never": written off, not retried
    nonce_used_reasons: frozenset[str]  # settle refusals that mean "this nonce is spent"

    def extra(self) -> dict[str, Any]:
        """What the scheme adds to the requirements' `extra` (the client signs the kind it is offered)."""

    def check(self, inner: dict[str, Any], price: Price) -> None:
        """Every key of the signed `payload`: shape, recipient, value, nonce; `Rejection` otherwise."""

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        """(valid after, valid before) in seconds; `Rejection("invalid_payload")` when unreadable."""

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        """The claim's nonce key: the nonce this payload spends on chain, however it is wrapped."""

    def named_payer(self, inner: dict[str, Any]) -> str:
        """The address the payload says pays (lowercase), unverified; "" when it names none of this kind."""

    def authorization(
        self, payload: dict[str, Any], requirements: dict[str, Any], network: str
    ) -> Authorization | None:
        """What to ask the chain about this payment's nonce; None: the chain cannot be asked for it."""
