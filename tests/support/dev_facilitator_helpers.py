"""Shared constants, payment helpers and fixtures for the dev facilitator tests.

The fixtures here are not registered globally (``tests/conftest.py`` has its own
``facilitator``, a bare URL); each test module that wants them binds them as
module attributes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from eth_account import Account

from devnet.facilitator import DEV_NETWORK, create_facilitator_app
from devnet.payer import new_private_key, sign_payment
from tests.support.serve import serve_app

# The canonical price used across the project.
USDC_BASE_SEPOLIA = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
PRICE: dict[str, Any] = {
    "scheme": "exact",
    "network": "eip155:84532",
    "asset": USDC_BASE_SEPOLIA,
    "amount": "1000",
    "payTo": PAY_TO,
    "maxTimeoutSeconds": 300,
    "extra": {"name": "USDC", "version": "2"},
}
PRICE_V1: dict[str, Any] = {
    "scheme": "exact",
    "network": "base-sepolia",
    "maxAmountRequired": "1000",
    "resource": "http://127.0.0.1/a2a",
    "description": "one A2A call",
    "mimeType": "application/json",
    "payTo": PAY_TO,
    "maxTimeoutSeconds": 300,
    "asset": USDC_BASE_SEPOLIA,
    "extra": {"name": "USDC", "version": "2"},
}
OTHER_ADDRESS = "0x1111111111111111111111111111111111111111"
TX_HASH = re.compile(r"^0x[0-9a-f]{64}$")

NONCE_USED = "invalid_exact_evm_nonce_already_used"
BAD_SIGNATURE = "invalid_exact_evm_payload_signature"
EXPIRED = "invalid_exact_evm_payload_authorization_valid_before"
NOT_YET_VALID = "invalid_exact_evm_payload_authorization_valid_after"
INSUFFICIENT = "invalid_exact_evm_insufficient_balance"


def payment_required(**overrides: Any) -> dict[str, Any]:
    """A v2 PaymentRequired document, as the gate puts in ``PAYMENT-REQUIRED``."""
    return {
        "x402Version": 2,
        "error": "payment required",
        "resource": {"url": "http://127.0.0.1/a2a"},
        "accepts": [{**PRICE, **overrides}],
    }


def request_body(payload: dict[str, Any], requirements: dict[str, Any] | None = None) -> dict:
    return {
        "x402Version": payload["x402Version"],
        "paymentPayload": payload,
        "paymentRequirements": PRICE if requirements is None else requirements,
    }


def tamper(payload: dict[str, Any], position: int = 10) -> dict[str, Any]:
    """Flip one hex digit of the signature (inside r, so it stays well formed)."""
    tampered = copy.deepcopy(payload)
    signature = tampered["payload"]["signature"]
    flipped = "0" if signature[position] != "0" else "1"
    tampered["payload"]["signature"] = signature[:position] + flipped + signature[position + 1 :]
    return tampered


def resign(payload: dict[str, Any], key: str, **authorization: Any) -> dict[str, Any]:
    """Change authorization fields and sign them properly (for windows the client never picks)."""
    changed = copy.deepcopy(payload)
    auth = changed["payload"]["authorization"]
    auth.update({k: str(v) for k, v in authorization.items()})
    signed = Account.from_key(key).sign_typed_data(
        domain_data={
            "name": "USDC",
            "version": "2",
            "chainId": 84532,
            "verifyingContract": USDC_BASE_SEPOLIA,
        },
        message_types={
            "TransferWithAuthorization": [
                {"name": "from", "type": "address"},
                {"name": "to", "type": "address"},
                {"name": "value", "type": "uint256"},
                {"name": "validAfter", "type": "uint256"},
                {"name": "validBefore", "type": "uint256"},
                {"name": "nonce", "type": "bytes32"},
            ]
        },
        message_data={
            "from": auth["from"],
            "to": auth["to"],
            "value": int(auth["value"]),
            "validAfter": int(auth["validAfter"]),
            "validBefore": int(auth["validBefore"]),
            "nonce": auth["nonce"],
        },
    )
    changed["payload"]["signature"] = "0x" + bytes(signed.signature).hex()
    return changed


class Facilitator:
    """A running facilitator and an HTTP client for it."""

    def __init__(self, url: str, app: Any) -> None:
        self.url = url
        self.app = app
        self.http = httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=100))

    def verify(self, payload: dict, requirements: dict | None = None) -> dict:
        response = self.http.post("/verify", json=request_body(payload, requirements))
        assert response.status_code == 200, response.text
        return response.json()

    def settle(self, payload: dict, requirements: dict | None = None) -> dict:
        response = self.http.post("/settle", json=request_body(payload, requirements))
        assert response.status_code == 200, response.text
        return response.json()

    def faults(self, spec: dict) -> dict:
        response = self.http.post("/dev/faults", json=spec)
        assert response.status_code == 200, response.text
        return response.json()

    def ledger(self) -> dict:
        return self.http.get("/dev/ledger").json()

    def balance(self, address: str) -> int:
        return self.app.state.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, address)


@pytest.fixture
def start(tmp_path) -> Iterator[Any]:
    """Start facilitators: ``start(**create_facilitator_app kwargs)``."""
    with ExitStack() as stack:

        def _start(db_name: str = "ledger.db", **kwargs: Any) -> Facilitator:
            app = create_facilitator_app(str(tmp_path / db_name), **kwargs)
            url = stack.enter_context(serve_app(app, wait_on_exit=False))
            facilitator = Facilitator(url, app)
            stack.callback(facilitator.http.close)
            return facilitator

        yield _start


@pytest.fixture
def facilitator(start) -> Facilitator:
    return start()


@pytest.fixture
def trusting(start) -> Facilitator:
    return start(trust_signatures=True)


@pytest.fixture
def key() -> str:
    return new_private_key()


@pytest.fixture
def payer(key) -> str:
    return Account.from_key(key).address


@pytest.fixture
def payload(key) -> dict[str, Any]:
    return sign_payment(payment_required(), key)
