"""`a2a-gate-devnet pay`: send one message to a priced agent and pay for it, like a real buyer.

The paying is done by the x402 package's own httpx client (402 -> sign -> retry) with its
exact-EVM and ``upto`` client schemes (an ``upto`` offer is signed for its ceiling, and the
agent settles what the work cost), with a throwaway key unless one is given, so the paid flow can be shown end to end
on a fresh machine against the development facilitator.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from eth_account import Account
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.upto import UptoEvmClientScheme

from devnet.payer import new_private_key


async def pay(url: str, text: str, *, private_key: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """POST `message/send` to `url`, paying the 402 if one comes; returns what happened."""
    account = Account.from_key(private_key or new_private_key())
    client = x402Client()
    register_exact_evm_client(client, account)
    client.register("eip155:*", UptoEvmClientScheme(account))
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": str(uuid.uuid4()),
                "parts": [{"kind": "text", "text": text}],
            }
        },
    }
    async with x402HttpxClient(client, timeout=timeout) as http:
        response = await http.post(url, json=body)
    outcome: dict[str, Any] = {"payer": account.address, "http_status": response.status_code}
    if "PAYMENT-RESPONSE" in response.headers:
        outcome["payment_response"] = json.loads(base64.b64decode(response.headers["PAYMENT-RESPONSE"]))
    try:
        outcome["answer"] = response.json()
    except ValueError:
        outcome["answer"] = response.text[:2000]
    return outcome
