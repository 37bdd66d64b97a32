"""`a2a-gate-devnet pay`: send one message to a priced agent and pay for it, like a real buyer.

The paying is done by the x402 package's own httpx client (402 -> sign -> retry) with its
client schemes: ``exact`` (one signed transfer per request), ``upto`` (an offer is signed for its
ceiling, and the agent settles what the work cost) and ``batch-settlement`` (a channel: one
deposit, then a voucher per request), with a throwaway key unless one is given, so the paid flow
can be shown end to end on a fresh machine against the development facilitator. ``scheme``
limits the client to one of them. With ``rpc_url`` (the
development facilitator's ``/rpc``) the channel client reads the channel's state from the
chain (``channels(bytes32)``, through ``EthAccountSignerWithRPC``) instead of depositing anew
each time the command runs; ``count`` sends that many messages on one client, so the
requests after the first ride the channel's vouchers.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from eth_account import Account
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.batch_settlement import SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.batch_settlement.client.scheme import BatchSettlementEvmScheme
from x402.mechanisms.evm.constants import SCHEME_EXACT, SCHEME_UPTO
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme

from devnet.payer import new_private_key

#: The schemes ``pay`` can pay with.
SCHEMES = (SCHEME_EXACT, SCHEME_UPTO, SCHEME_BATCH_SETTLEMENT)


async def pay(
    url: str,
    text: str,
    *,
    private_key: str | None = None,
    timeout: float = 60.0,
    scheme: str | None = None,
    rpc_url: str | None = None,
    count: int = 1,
) -> dict[str, Any]:
    """POST `message/send` to `url` `count` times, paying each 402; returns what happened
    (the last answer, with every payment response in ``payment_responses``)."""
    account = Account.from_key(private_key or new_private_key())
    client = x402Client()
    if scheme in (None, SCHEME_EXACT):
        register_exact_evm_client(client, account)
    if scheme in (None, SCHEME_UPTO):
        client.register("eip155:*", UptoEvmClientScheme(account))
    if scheme in (None, SCHEME_BATCH_SETTLEMENT):
        signer = EthAccountSignerWithRPC(account, rpc_url) if rpc_url else EthAccountSigner(account)
        client.register("eip155:*", BatchSettlementEvmScheme(signer))
    outcome: dict[str, Any] = {"payer": account.address}
    responses = []
    async with x402HttpxClient(client, timeout=timeout) as http:
        for _ in range(count):
            outcome.update(await _send(http, url, text))
            if "payment_response" in outcome:
                responses.append(outcome["payment_response"])
    if count > 1:
        outcome["payment_responses"] = responses
    return outcome


async def _send(http: x402HttpxClient, url: str, text: str) -> dict[str, Any]:
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
    response = await http.post(url, json=body)
    outcome: dict[str, Any] = {"http_status": response.status_code}
    if "PAYMENT-RESPONSE" in response.headers:
        outcome["payment_response"] = json.loads(base64.b64decode(response.headers["PAYMENT-RESPONSE"]))
    try:
        outcome["answer"] = response.json()
    except ValueError:
        outcome["answer"] = response.text[:2000]
    return outcome
