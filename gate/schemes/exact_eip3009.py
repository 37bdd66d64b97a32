"""x402 `exact` on EVM with EIP-3009 (`transferWithAuthorization`): the payer signs one transfer.

The payload is exactly ``{signature, authorization}`` with the six authorization fields in
canonical spellings; its nonce is the token contract's `authorizationState(from, nonce)`,
which the chain answers (`gate.chain`), with the transfer to payTo as the evidence of payment.
"""

from __future__ import annotations

from typing import Any

from gate.price import Price
from gate.schemes.base import (
    ADDRESS,
    CHAIN_ADDRESS,
    GENERIC_DEFINITIVE_REASONS,
    NONCE,
    NONCE_USED_REASONS,
    SIGNATURE,
    UINT,
    WORD,
    Authorization,
    Rejection,
    address_at,
)

PAYLOAD_KEYS = frozenset({"signature", "authorization"})
AUTHORIZATION_KEYS = frozenset({"from", "to", "value", "validAfter", "validBefore", "nonce"})

DEFINITIVE_REASONS = GENERIC_DEFINITIVE_REASONS | {
    "invalid_exact_evm_payload_signature",
    "invalid_exact_evm_insufficient_balance",
    "invalid_exact_evm_payload_authorization_valid_before",
    "invalid_exact_evm_payload_recipient_mismatch",
    "invalid_exact_evm_payload_authorization_value_mismatch",
}


def _authorization(inner: dict[str, Any]) -> dict[str, Any]:
    auth = inner.get("authorization")
    return auth if isinstance(auth, dict) else {}


class ExactEip3009:
    scheme = "exact"
    transfer_method = "eip3009"
    versions: tuple[int, ...] = (1, 2)  # x402 versions its payloads may come in
    v1_signable = True  # what every x402 v1 client signs for `exact`
    advertised: tuple[str, ...] = ()
    definitive_reasons = DEFINITIVE_REASONS
    nonce_used_reasons = NONCE_USED_REASONS

    def extra(self) -> dict[str, Any]:
        return {}  # x402's default transfer method: no `assetTransferMethod` needed

    def check(self, inner: dict[str, Any], price: Price) -> None:
        if "authorization" not in inner or "permit2Authorization" in inner:
            raise Rejection("unsupported_payload")  # Permit2, or anything else this scheme cannot claim exactly
        auth = inner["authorization"]
        if set(inner) != PAYLOAD_KEYS or not isinstance(auth, dict) or set(auth) != AUTHORIZATION_KEYS:
            raise Rejection("invalid_payload")
        if not all(isinstance(v, str) for v in auth.values()) or not isinstance(inner["signature"], str):
            raise Rejection("invalid_payload")
        if not (
            ADDRESS.fullmatch(auth["from"])
            and ADDRESS.fullmatch(auth["to"])
            and SIGNATURE.fullmatch(inner["signature"])
        ):
            raise Rejection("invalid_payload")
        if not all(UINT.fullmatch(auth[k]) for k in ("value", "validAfter", "validBefore")):
            raise Rejection("invalid_payload")
        if auth["to"].lower() != price.pay_to.lower():
            raise Rejection("recipient_mismatch")
        if auth["value"] != price.amount:
            raise Rejection("amount_mismatch")
        if not NONCE.fullmatch(auth["nonce"]):
            raise Rejection("invalid_nonce")

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        auth = _authorization(inner)
        try:
            return int(auth["validAfter"]), int(auth["validBefore"])
        except (KeyError, TypeError, ValueError):
            raise Rejection("invalid_payload") from None

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        """Chain, asset and authorization nonce: one EVM authorization pays once, whatever wraps it."""
        auth = _authorization(inner)
        return "|".join((network, asset.lower(), str(auth.get("from", "")).lower(), str(auth.get("nonce", "")).lower()))

    def named_payer(self, inner: dict[str, Any]) -> str:
        return address_at(inner, "authorization", "from")

    def authorization(
        self, payload: dict[str, Any], requirements: dict[str, Any], network: str
    ) -> Authorization | None:
        """The EIP-3009 authorization of a payload, as the chain knows it; None for any other shape."""
        inner = payload.get("payload")
        auth = inner.get("authorization") if isinstance(inner, dict) else None
        if not isinstance(auth, dict):
            return None
        asset, authorizer, nonce = requirements.get("asset"), auth.get("from"), auth.get("nonce")
        if not (isinstance(asset, str) and isinstance(authorizer, str) and isinstance(nonce, str)):
            return None
        if not (CHAIN_ADDRESS.match(asset) and CHAIN_ADDRESS.match(authorizer) and WORD.match(nonce)):
            return None
        try:
            valid_before = int(auth["validBefore"])
        except (KeyError, ValueError, TypeError):
            return None
        return Authorization(
            network=network,
            asset=asset.lower(),
            authorizer=authorizer.lower(),
            nonce=nonce.lower(),
            valid_before=valid_before,
        )


SCHEME = ExactEip3009()
