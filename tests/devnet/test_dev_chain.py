"""The simulated chain as a settlement checker reads it, and what a payer can do on it alone.

Receipts in the standard JSON-RPC shape (a settlement's carries the token's
`AuthorizationUsed` and ERC-20 `Transfer` logs), and the two ways a nonce is spent
without paying payTo: the payer's own `cancelAuthorization`, and a
`transferWithAuthorization` with the same nonce sent to the token by someone else.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from eth_account import Account

from devnet.chain import AUTHORIZATION_CANCELED_TOPIC, AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC
from devnet.ledger import DEFAULT_INITIAL_BALANCE
from devnet.payer import new_private_key, sign_cancel_authorization
from tests.support import dev_facilitator_helpers as helpers
from tests.support.chain_moves import authorization, cancel, front_run, rpc
from tests.support.dev_facilitator_helpers import (
    NONCE_USED,
    OTHER_ADDRESS,
    PAY_TO,
    TX_HASH,
    USDC_BASE_SEPOLIA,
    Facilitator,
)

start, facilitator = helpers.start, helpers.facilitator
trusting, key, payer, payload = helpers.trusting, helpers.key, helpers.payer, helpers.payload


def topic(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def word(value: int) -> str:
    return "0x" + value.to_bytes(32, "big").hex()


def used_logs(facilitator: Facilitator, payer: str, nonce: str, event: str = AUTHORIZATION_USED_TOPIC) -> list:
    query = {"address": USDC_BASE_SEPOLIA, "fromBlock": "earliest", "toBlock": "latest"}
    return rpc(facilitator.url, "eth_getLogs", {**query, "topics": [event, topic(payer), nonce]})


def authorization_state(facilitator: Facilitator, payer: str, nonce: str) -> bool:
    data = "0xe94a0102" + topic(payer)[2:] + nonce[2:]
    return int(rpc(facilitator.url, "eth_call", {"to": USDC_BASE_SEPOLIA, "data": data}, "latest"), 16) != 0


def test_a_settlements_receipt_carries_authorization_used_and_the_transfer(facilitator, payload, payer):
    settled = facilitator.settle(payload)
    nonce = authorization(payload)["nonce"]

    receipt = rpc(facilitator.url, "eth_getTransactionReceipt", settled["transaction"])

    assert receipt["transactionHash"] == settled["transaction"]
    assert receipt["status"] == "0x1" and receipt["blockNumber"].startswith("0x")
    used, transfer = receipt["logs"]
    token = USDC_BASE_SEPOLIA.lower()
    assert used["address"] == token and transfer["address"] == token
    assert used["topics"] == [AUTHORIZATION_USED_TOPIC, topic(payer), nonce]
    assert transfer["topics"] == [TRANSFER_TOPIC, topic(payer), topic(PAY_TO)]
    assert transfer["data"] == word(1000)
    for index, log in enumerate(receipt["logs"]):
        assert log["transactionHash"] == settled["transaction"]
        assert log["blockNumber"] == receipt["blockNumber"]
        assert log["logIndex"] == hex(index)
    assert used_logs(facilitator, payer, nonce) == [used]  # eth_getLogs finds the same log


def test_an_unknown_transaction_has_no_receipt_and_a_malformed_hash_is_an_rpc_error(facilitator):
    assert rpc(facilitator.url, "eth_getTransactionReceipt", "0x" + "ab" * 32) is None
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getTransactionReceipt", "params": ["0x12"]}
    doc = httpx.post(f"{facilitator.url}/rpc", json=body).json()
    assert doc["error"]["code"] == -32602


def test_a_canceled_authorization_is_spent_without_a_transfer(facilitator, key, payer, payload):
    nonce = authorization(payload)["nonce"]

    tx = cancel(facilitator.url, key, payload, USDC_BASE_SEPOLIA)

    assert TX_HASH.match(tx)
    assert authorization_state(facilitator, payer, nonce) is True
    assert used_logs(facilitator, payer, nonce) == []  # no AuthorizationUsed: nothing was transferred
    [canceled] = used_logs(facilitator, payer, nonce, AUTHORIZATION_CANCELED_TOPIC)
    assert canceled["topics"] == [AUTHORIZATION_CANCELED_TOPIC, topic(payer), nonce]
    receipt = rpc(facilitator.url, "eth_getTransactionReceipt", tx)
    assert receipt["status"] == "0x1" and receipt["logs"] == [canceled]
    ledger = facilitator.ledger()
    assert ledger["settlements"] == []
    assert [c["tx_hash"] for c in ledger["cancellations"]] == [tx]
    refused = facilitator.settle(payload)
    assert refused["success"] is False and refused["errorReason"] == NONCE_USED
    assert facilitator.ledger()["settlements"] == []


def cancel_response(facilitator: Facilitator, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{facilitator.url}/dev/chain/cancelAuthorization", json=body)


def test_only_the_authorizer_can_cancel_and_only_an_unused_authorization(facilitator, key, payload):
    nonce = authorization(payload)["nonce"]
    stranger = sign_cancel_authorization(new_private_key(), asset=USDC_BASE_SEPOLIA, nonce=nonce)
    forged = {**stranger, "authorizer": Account.from_key(key).address}  # another's signature for the payer

    refused = cancel_response(facilitator, forged)

    assert refused.status_code == 400 and refused.json() == {
        "error": "reverted",
        "detail": "FiatTokenV2: invalid signature",
    }
    assert facilitator.settle(payload)["success"] is True
    again = cancel_response(facilitator, sign_cancel_authorization(key, asset=USDC_BASE_SEPOLIA, nonce=nonce))
    assert again.status_code == 400 and again.json()["detail"] == "FiatTokenV2: authorization is used or canceled"
    assert facilitator.ledger()["cancellations"] == []


def test_a_front_run_transfer_spends_the_nonce_on_someone_else(facilitator, key, payer, payload):
    nonce = authorization(payload)["nonce"]

    tx = front_run(facilitator.url, key, payload, USDC_BASE_SEPOLIA, to=OTHER_ADDRESS, value=1)

    assert authorization_state(facilitator, payer, nonce) is True
    [used] = used_logs(facilitator, payer, nonce)  # "used", by a transaction that did not pay payTo
    assert used["transactionHash"] == tx
    receipt = rpc(facilitator.url, "eth_getTransactionReceipt", tx)
    assert [log["topics"][0] for log in receipt["logs"]] == [AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC]
    transfer = receipt["logs"][1]
    assert transfer["topics"] == [TRANSFER_TOPIC, topic(payer), topic(OTHER_ADDRESS)]
    assert transfer["data"] == word(1)
    assert facilitator.balance(OTHER_ADDRESS) - DEFAULT_INITIAL_BALANCE == 1
    refused = facilitator.settle(payload)
    assert refused["success"] is False and refused["errorReason"] == NONCE_USED


def test_a_front_run_transfer_needs_the_payers_signature(facilitator, payload):
    auth = authorization(payload)
    body = {
        "asset": USDC_BASE_SEPOLIA,
        "from": auth["from"],
        "to": OTHER_ADDRESS,
        "value": "1",
        "validAfter": auth["validAfter"],
        "validBefore": auth["validBefore"],
        "nonce": auth["nonce"],
        "signature": payload["payload"]["signature"],  # signed for payTo and the price, not this
    }
    response = httpx.post(f"{facilitator.url}/dev/chain/transferWithAuthorization", json=body)
    assert response.status_code == 400 and response.json()["detail"] == "FiatTokenV2: invalid signature"
    assert facilitator.settle(payload)["success"] is True


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"asset": "0x12"}', b'{"asset": 1, "authorizer": null, "nonce": "0x", "signature": "zz"}'],
)
@pytest.mark.parametrize("function", ["cancelAuthorization", "transferWithAuthorization"])
def test_malformed_chain_transactions_are_400s(facilitator, function, body):
    response = httpx.post(f"{facilitator.url}/dev/chain/{function}", content=body)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
