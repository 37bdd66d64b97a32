"""What a payer can do on the simulated chain without the facilitator, and how to read the chain.

The development chain takes a payer's own EIP-3009 transactions at ``/dev/chain/...``:
giving an authorization up (``cancelAuthorization``) or spending its nonce on another
transfer (``transferWithAuthorization``, sent by whoever holds the signature). Either
spends the nonce, so ``authorizationState`` says "used" though payTo was never paid.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from devnet.payer import sign_cancel_authorization, sign_transfer_authorization

_ids = itertools.count(1)


def rpc(facilitator: str, method: str, *params: Any) -> Any:
    """One Ethereum JSON-RPC call to the simulated chain; its result."""
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": list(params)}
    doc = httpx.post(f"{facilitator}/rpc", json=body, timeout=10).json()
    assert "result" in doc, doc
    return doc["result"]


def authorization(payload: dict[str, Any]) -> dict[str, str]:
    """The EIP-3009 authorization a payment payload carries."""
    return payload["payload"]["authorization"]


def cancel(facilitator: str, key: str, payload: dict[str, Any], asset: str) -> str:
    """The payer cancels the authorization its payment carries; the transaction hash."""
    body = sign_cancel_authorization(key, asset=asset, nonce=authorization(payload)["nonce"])
    return _send(facilitator, "cancelAuthorization", body)


def front_run(facilitator: str, key: str, payload: dict[str, Any], asset: str, to: str, value: int = 1) -> str:
    """The payment's nonce spent first on another transfer (`value` to `to`); the transaction hash."""
    auth = authorization(payload)
    body = sign_transfer_authorization(
        key,
        asset=asset,
        to=to,
        value=value,
        nonce=auth["nonce"],
        valid_after=int(auth["validAfter"]),
        valid_before=int(auth["validBefore"]),
    )
    return _send(facilitator, "transferWithAuthorization", body)


def _send(facilitator: str, function: str, body: dict[str, str]) -> str:
    response = httpx.post(f"{facilitator}/dev/chain/{function}", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["transactionHash"]


def transfers_to(facilitator: str, pay_to: str) -> list[dict[str, Any]]:
    """The ledger's transfers to `pay_to`: what the payee was actually paid."""
    settlements = httpx.get(f"{facilitator}/dev/ledger", timeout=10).json()["settlements"]
    return [s for s in settlements if s["to_address"].lower() == pay_to.lower()]
