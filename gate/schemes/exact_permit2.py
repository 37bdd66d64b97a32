"""x402 `exact` on EVM with Permit2: the payer signs a `PermitWitnessTransferFrom` for x402's proxy.

Offered when a price says `asset_transfer_method = "permit2"` (the requirements'
`extra.assetTransferMethod`, which x402 clients sign by). The payload is exactly
``{permit2Authorization, signature}``; the authorization is exactly ``{from, permitted: {token,
amount}, spender, nonce, deadline, witness: {to, validAfter}}``, every field checked here: the
spender is x402's Permit2 proxy (which sends only to `witness.to`), the token is the price's
asset, `witness.to` its payTo, the amount its amount. Permit2 spends a nonce per owner, whatever
the token, so the claim is on (network, owner, nonce): one signature, however wrapped, is one claim.

The chain is not asked about Permit2 nonces (its bitmap needs an endpoint reading of its own): an
owed Permit2 settlement the facilitator cannot confirm ends as `needs_attention`, never guessed.
"""

from __future__ import annotations

from typing import Any

from gate.price import Price
from gate.schemes.base import (
    ADDRESS,
    GENERIC_DEFINITIVE_REASONS,
    NONCE_USED_REASONS,
    SIGNATURE,
    UINT,
    Authorization,
    Rejection,
    address_at,
)

# x402ExactPermit2Proxy: the one spender x402 clients sign for; it transfers only to the witness's `to`.
PROXY = "0x402085c248eea27d92e8b30b2c58ed07f9e20001"
PAYLOAD_KEYS = frozenset({"permit2Authorization", "signature"})
AUTHORIZATION_KEYS = frozenset({"from", "permitted", "spender", "nonce", "deadline", "witness"})
PERMITTED_KEYS = frozenset({"token", "amount"})
WITNESS_KEYS = frozenset({"to", "validAfter"})

DEFINITIVE_REASONS = GENERIC_DEFINITIVE_REASONS | {
    "invalid_permit2_signature",
    "permit2_deadline_expired",
    "permit2_insufficient_balance",
    "permit2_allowance_required",
    "invalid_permit2_spender",
    "invalid_permit2_recipient_mismatch",
    "permit2_amount_mismatch",
    "permit2_token_mismatch",
}


def _authorization(inner: dict[str, Any]) -> dict[str, Any]:
    auth = inner.get("permit2Authorization")
    return auth if isinstance(auth, dict) else {}


class ExactPermit2:
    scheme = "exact"
    transfer_method = "permit2"
    versions: tuple[int, ...] = (1, 2)  # x402 versions its payloads may come in
    v1_signable = False  # x402 v1 clients sign EIP-3009 for every `exact` offer: only v2 ones sign this
    advertised: tuple[str, ...] = ()
    definitive_reasons = DEFINITIVE_REASONS
    nonce_used_reasons = NONCE_USED_REASONS

    def extra(self) -> dict[str, Any]:
        return {"assetTransferMethod": "permit2"}

    def check(self, inner: dict[str, Any], price: Price) -> None:
        check_permit2(inner, price, PROXY, WITNESS_KEYS)

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        return permit2_window(inner)

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        return permit2_nonce_key(inner, network)

    def named_payer(self, inner: dict[str, Any]) -> str:
        return address_at(inner, "permit2Authorization", "from")

    def authorization(
        self, payload: dict[str, Any], requirements: dict[str, Any], network: str
    ) -> Authorization | None:
        return None  # see the module's docstring: the chain is not asked for Permit2


def check_permit2(inner: dict[str, Any], price: Price, spender: str, witness_keys: frozenset[str]) -> dict[str, Any]:
    """Every key of a Permit2 `PermitWitnessTransferFrom` payload for `spender`, its witness exactly
    `witness_keys` (each a string); the authorization, or `Rejection`. Shared by exact and upto."""
    if "permit2Authorization" not in inner or "authorization" in inner:
        raise Rejection("unsupported_payload")  # EIP-3009, or two authorizations in one payload
    auth = inner["permit2Authorization"]
    if set(inner) != PAYLOAD_KEYS or not isinstance(auth, dict) or set(auth) != AUTHORIZATION_KEYS:
        raise Rejection("invalid_payload")
    permitted, witness = auth["permitted"], auth["witness"]
    if not isinstance(permitted, dict) or set(permitted) != PERMITTED_KEYS:
        raise Rejection("invalid_payload")
    if not isinstance(witness, dict) or set(witness) != witness_keys:
        raise Rejection("invalid_payload")
    fields = [auth["from"], auth["spender"], auth["nonce"], auth["deadline"], inner["signature"]]
    fields += [permitted["token"], permitted["amount"], *witness.values()]
    if not all(isinstance(v, str) for v in fields):
        raise Rejection("invalid_payload")
    addresses = (
        auth["from"],
        auth["spender"],
        permitted["token"],
        *(witness[k] for k in witness_keys - {"validAfter"}),
    )
    if not all(ADDRESS.fullmatch(a) for a in addresses) or not SIGNATURE.fullmatch(inner["signature"]):
        raise Rejection("invalid_payload")
    numbers = (auth["nonce"], auth["deadline"], permitted["amount"], witness["validAfter"])
    if not all(UINT.fullmatch(n) for n in numbers):
        raise Rejection("invalid_payload")
    if auth["spender"].lower() != spender:
        raise Rejection("invalid_permit2_spender")
    if permitted["token"].lower() != price.asset.lower():
        raise Rejection("asset_mismatch")
    if witness["to"].lower() != price.pay_to.lower():
        raise Rejection("recipient_mismatch")
    if permitted["amount"] != price.amount:
        raise Rejection("amount_mismatch")
    return auth


def permit2_window(inner: dict[str, Any]) -> tuple[int, int]:
    """(witness.validAfter, deadline) of a Permit2 payload; `Rejection("invalid_payload")` when unreadable."""
    auth = _authorization(inner)
    witness = auth.get("witness")
    try:
        return int(witness["validAfter"]), int(auth["deadline"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise Rejection("invalid_payload") from None


def permit2_nonce_key(inner: dict[str, Any], network: str) -> str:
    """Network, Permit2, owner and nonce: Permit2's nonces are the owner's, across every token and spender."""
    auth = _authorization(inner)
    return "|".join((network, "permit2", str(auth.get("from", "")).lower(), str(auth.get("nonce", ""))))


SCHEME = ExactPermit2()
