"""Sign x402 payments the way a real buyer does, for tests, benchmarks and the CLI.

The signing itself is the x402 package's client (``x402ClientSync`` with the
exact-EVM client schemes and an eth-account key), so a payment produced here
is byte-for-byte what a real x402 buyer would send.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from eth_account import Account
from x402 import x402ClientSync
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.schemas import PaymentRequired, PaymentRequiredV1

__all__ = ["encode_header", "new_private_key", "sign_payment", "sign_payment_v1"]


def _client(private_key: str) -> x402ClientSync:
    client = x402ClientSync()
    register_exact_evm_client(client, Account.from_key(private_key))
    # A test payer must be able to sign what it is asked to sign, including
    # offers a careful wallet would refuse (unknown assets, large amounts);
    # the client's default spend controls would silently filter those out.
    client.set_spend_controls(False)
    return client


def sign_payment(payment_required: dict[str, Any], private_key: str, *, accept_index: int = 0) -> dict[str, Any]:
    """Sign ``accepts[accept_index]`` of a v2 PaymentRequired; return the PaymentPayload.

    Both documents are camelCase dicts, as they travel in the
    ``PAYMENT-REQUIRED`` and ``PAYMENT-SIGNATURE`` headers.
    """
    accepts = payment_required.get("accepts") or []
    if not 0 <= accept_index < len(accepts):
        raise IndexError(f"accept_index {accept_index} out of range ({len(accepts)} offers)")
    # Offer the client just the chosen requirement so its selector cannot pick another.
    offer = {**payment_required, "accepts": [accepts[accept_index]]}
    chosen = PaymentRequired.model_validate(offer)
    payload = _client(private_key).create_payment_payload(chosen)
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def sign_payment_v1(requirements_v1: dict[str, Any], private_key: str) -> dict[str, Any]:
    """Sign one v1 PaymentRequirements (``maxAmountRequired``, network ``base-sepolia``...)."""
    required = PaymentRequiredV1.model_validate({"x402Version": 1, "accepts": [requirements_v1]})
    payload = _client(private_key).create_payment_payload(required)
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def encode_header(payload: dict[str, Any]) -> str:
    """Standard base64 of the compact JSON: the ``PAYMENT-SIGNATURE`` header value."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def new_private_key() -> str:
    """A fresh throwaway key, 0x-prefixed hex."""
    return "0x" + bytes(Account.create().key).hex()
