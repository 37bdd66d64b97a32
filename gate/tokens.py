"""Payment tokens: finding one in a request, and the checks that need no facilitator.

Where to look, in order (DESIGN 4.5): the message metadata
``x402.payment.payload``, then the ``PAYMENT-SIGNATURE`` header (x402 v2), then the
legacy ``X-PAYMENT`` header (v1). Any malformed shape means "no token here", never
an exception. ``Authorization`` is never a token source.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from starlette.datastructures import Headers

from gate.pricing import CAIP2_FOR_V1, V1_NETWORKS, requirement_v1
from server.cards import requirement
from server.config import Price

METADATA_KEY = "x402.payment.payload"
MAX_TOKEN_BYTES = 16_384
HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class Token:
    """A payment payload that has the shape of one; nothing about it is verified yet."""

    payload: dict[str, Any]
    version: int  # x402Version: 1 or 2
    source: str  # metadata | PAYMENT-SIGNATURE | X-PAYMENT

    @cached_property  # claims, logs and sealing all ask; the canonical JSON is built once
    def digest(self) -> str:
        """Identity of the token for claims and logs; the token itself is never stored."""
        canonical = json.dumps(self.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def authorization(self) -> dict[str, Any]:
        inner = self.payload.get("payload")
        auth = inner.get("authorization") if isinstance(inner, dict) else None
        return auth if isinstance(auth, dict) else {}

    @property
    def network(self) -> str:
        if self.version == 2:
            return str(self.payload["accepted"].get("network", ""))
        return CAIP2_FOR_V1.get(str(self.payload.get("network", "")), str(self.payload.get("network", "")))


class Rejection(Exception):
    """A token refused before or by the facilitator; `reason` is safe to show the payer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def extract(metadata: Any, headers: Headers) -> Token | None:
    """The request's token, metadata first; None when there is no well-formed one."""
    if isinstance(metadata, dict):
        token = from_object(metadata.get(METADATA_KEY), "metadata")
        if token is not None:
            return token
    for header in ("payment-signature", "x-payment"):
        token = from_header(headers.get(header), header.upper())
        if token is not None:
            return token
    return None


def from_header(value: str | None, source: str) -> Token | None:
    if not value or len(value) > MAX_TOKEN_BYTES:
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
        document = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    return from_object(document, source)


def from_object(document: Any, source: str) -> Token | None:
    if not isinstance(document, dict):
        return None
    version = document.get("x402Version")
    if type(version) is not int or version not in (1, 2):
        return None
    if not isinstance(document.get("payload"), dict):
        return None
    if version == 2:
        accepted = document.get("accepted")
        if not isinstance(accepted, dict) or not all(isinstance(accepted.get(k), str) for k in ("scheme", "network", "asset", "amount", "payTo")):
            return None
    elif not all(isinstance(document.get(k), str) for k in ("scheme", "network")):
        return None
    try:
        size = len(json.dumps(document, separators=(",", ":")))
    except (ValueError, TypeError, RecursionError):
        return None
    if size > MAX_TOKEN_BYTES:
        return None
    return Token(payload=document, version=version, source=source)


def check(token: Token, price: Price, resource_url: str, now: float | None = None) -> dict[str, Any]:
    """Local checks (DESIGN 4.7); returns the requirements to send the facilitator."""
    if token.version == 2:
        accepted = token.payload["accepted"]
        wanted = requirement(price, resource_url)
        if (
            accepted["scheme"] != wanted["scheme"]
            or accepted["network"] != wanted["network"]
            or accepted["asset"].lower() != wanted["asset"].lower()
            or accepted["amount"] != wanted["amount"]
            or accepted["payTo"].lower() != wanted["payTo"].lower()
        ):
            raise Rejection("accepted_requirements_mismatch")
        resource = token.payload.get("resource")
        if isinstance(resource, dict) and isinstance(resource.get("url"), str) and resource["url"] != resource_url:
            raise Rejection("resource_mismatch")
        required = wanted
    else:
        if token.payload["scheme"] != price.scheme or token.payload["network"] != V1_NETWORKS.get(price.network, price.network):
            raise Rejection("accepted_requirements_mismatch")
        required = requirement_v1(price, resource_url)
    _check_authorization(token.authorization, price, now if now is not None else time.time())
    return required


def _check_authorization(auth: dict[str, Any], price: Price, now: float) -> None:
    """The exact-EVM authorization: recipient, value, time window, nonce shape."""
    try:
        to, value, sender, nonce = auth["to"], auth["value"], auth["from"], auth["nonce"]
        valid_after, valid_before = int(auth["validAfter"]), int(auth["validBefore"])
    except (KeyError, TypeError, ValueError):
        raise Rejection("invalid_payload") from None
    if not all(isinstance(x, str) for x in (to, value, sender, nonce)):
        raise Rejection("invalid_payload")
    if to.lower() != price.pay_to.lower():
        raise Rejection("recipient_mismatch")
    if value != price.amount:
        raise Rejection("amount_mismatch")
    if not (nonce.startswith("0x") and len(nonce) == 66 and set(nonce[2:]) <= HEX):
        raise Rejection("invalid_nonce")
    if valid_after > now:
        raise Rejection("payment_not_yet_valid")
    if valid_before <= now:
        raise Rejection("payment_expired")


def nonce_key(token: Token, asset: str) -> str:
    """Chain, asset and authorization nonce: one EVM authorization pays once, whatever wraps it."""
    auth = token.authorization
    return "|".join((token.network, asset.lower(), str(auth.get("from", "")).lower(), str(auth.get("nonce", "")).lower()))
