"""Permit2 payments on the development chain: offers as a resource server makes them, signed by the
x402 package's own clients, and re-signed with fields the clients never pick (a past deadline).

``upto_offer`` builds the requirements the way the x402 package's own resource server does
(``UptoEvmServerScheme.enhance_payment_requirements`` over the facilitator's ``/supported`` kind):
the ceiling as ``amount``, and the ``extra`` the ``upto`` client needs (``facilitatorAddress``, the
token's ``name`` and ``version``, ``assetTransferMethod = "permit2"``).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
from eth_account import Account
from x402 import x402ClientSync
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS, PERMIT2_WITNESS_TYPES, UPTO_PERMIT2_WITNESS_TYPES
from x402.mechanisms.evm.upto import UptoEvmClientScheme, UptoEvmServerScheme
from x402.schemas import PaymentRequired, PaymentRequirements, SupportedKind

from devnet.chain import DEV_CHAIN_ID
from tests.support.dev_facilitator_helpers import PAY_TO, USDC_BASE_SEPOLIA

EIP712_DOMAIN = [
    {"name": "name", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]


def upto_kind(facilitator: str) -> dict[str, Any]:
    """The facilitator's ``upto`` kind from ``/supported``."""
    kinds = httpx.get(f"{facilitator}/supported", timeout=10).json()["kinds"]
    [kind] = [k for k in kinds if k["scheme"] == "upto"]
    return kind


def upto_offer(kind: dict[str, Any], ceiling: int, *, pay_to: str = PAY_TO, timeout: int = 300) -> dict[str, Any]:
    """One ``upto`` PaymentRequirements (camelCase), as the x402 package's resource server builds it."""
    requirements = PaymentRequirements(
        scheme="upto",
        network=kind["network"],
        asset=USDC_BASE_SEPOLIA,
        amount=str(ceiling),
        pay_to=pay_to,
        max_timeout_seconds=timeout,
        extra={},
    )
    enhanced = UptoEvmServerScheme().enhance_payment_requirements(requirements, SupportedKind.model_validate(kind), [])
    return enhanced.model_dump(mode="json", by_alias=True, exclude_none=True)


def payment_required(requirements: dict[str, Any]) -> dict[str, Any]:
    return {"x402Version": 2, "resource": {"url": "http://127.0.0.1/a2a"}, "accepts": [requirements]}


def sign_upto(requirements: dict[str, Any], key: str) -> dict[str, Any]:
    """The x402 package's ``upto`` client, unchanged, signs for the offer's ceiling."""
    client = x402ClientSync()
    client.register("eip155:*", UptoEvmClientScheme(Account.from_key(key)))
    payload = client.create_payment_payload(PaymentRequired.model_validate(payment_required(requirements)))
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def charge(requirements: dict[str, Any], amount: int) -> dict[str, Any]:
    """The settle request's requirements for an ``upto`` payment: the actual charge as ``amount``."""
    return {**requirements, "amount": str(amount)}


def resign_permit2(payload: dict[str, Any], key: str, **fields: Any) -> dict[str, Any]:
    """Change ``permit2Authorization`` fields (``deadline``, ``nonce``; ``witness`` entries by name)
    and sign the result properly, for an exact-by-Permit2 or an ``upto`` payload."""
    changed = copy.deepcopy(payload)
    auth = changed["payload"]["permit2Authorization"]
    for name, value in fields.items():
        target = auth["witness"] if name in ("to", "facilitator", "validAfter") else auth
        target[name] = str(value) if isinstance(value, int) else value
    upto = "facilitator" in auth["witness"]
    witness: dict[str, Any] = {"to": auth["witness"]["to"], "validAfter": int(auth["witness"]["validAfter"])}
    if upto:
        witness["facilitator"] = auth["witness"]["facilitator"]
    signed = Account.from_key(key).sign_typed_data(
        full_message={
            "types": {"EIP712Domain": EIP712_DOMAIN, **(UPTO_PERMIT2_WITNESS_TYPES if upto else PERMIT2_WITNESS_TYPES)},
            "primaryType": "PermitWitnessTransferFrom",
            "domain": {"name": "Permit2", "chainId": DEV_CHAIN_ID, "verifyingContract": PERMIT2_ADDRESS},
            "message": {
                "permitted": {"token": auth["permitted"]["token"], "amount": int(auth["permitted"]["amount"])},
                "spender": auth["spender"],
                "nonce": int(auth["nonce"]),
                "deadline": int(auth["deadline"]),
                "witness": witness,
            },
        }
    )
    changed["payload"]["signature"] = "0x" + bytes(signed.signature).hex()
    return changed


def balances(facilitator: str, *addresses: str) -> list[int]:
    """Token balances on the development chain, from ``GET /dev/ledger?address=...``."""
    answer = httpx.get(f"{facilitator}/dev/ledger", params=[("address", a) for a in addresses], timeout=10).json()
    return [int(answer["balances"][a]) for a in addresses]
