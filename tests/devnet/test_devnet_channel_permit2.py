"""A payment channel funded by Permit2, beside the Permit2 payments on the same development chain.

The channel contract's Permit2 deposit collector calls the chain's own Permit2 (``devnet.permit2``),
so a deposit signed by the x402 package's batch-settlement client with ``assetTransferMethod =
"permit2"`` spends a nonce from the same bitmap as x402's Permit2 proxies and the payer's own
``invalidateUnorderedNonces``. The facilitator is the real development facilitator on a loopback
port; verify and settle are the package's own scheme. (The collector's own checks, on the contract
directly, are in ``tests/devnet/test_devnet_channels.py``.)
"""

from __future__ import annotations

from typing import Any

from eth_account import Account
from eth_utils import keccak

from devnet.batch_settlement import EVENT_TOPICS
from devnet.channels import DEV_RECEIVER_AUTHORIZER_KEY
from devnet.ledger import DEFAULT_INITIAL_BALANCE
from devnet.payer import invalidate_permit2_nonce, new_private_key
from devnet.permit2 import PERMIT2
from tests.support import dev_facilitator_helpers as helpers
from tests.support.channels import BATCH_SETTLEMENT_ADDRESS, ChannelClient, channel_offer, rpc

start, facilitator = helpers.start, helpers.facilitator

RECEIVER_AUTHORIZER = Account.from_key(DEV_RECEIVER_AUTHORIZER_KEY).address
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()
NONCE_BITMAP = keccak(text="nonceBitmap(address,uint256)")[:4]


def permit2_deposit(facilitator: Any) -> tuple[ChannelClient, str, dict[str, Any], dict[str, Any]]:
    """A fresh payer's Permit2 deposit, as the package's client builds it: (client, key, payment, offer)."""
    offer = channel_offer(RECEIVER_AUTHORIZER, assetTransferMethod="permit2")
    key = new_private_key()
    client = ChannelClient(facilitator.url, key)
    payment = client.payment(offer)
    assert payment["payload"]["type"] == "deposit"
    assert set(payment["payload"]["deposit"]["authorization"]) == {"permit2Authorization"}
    return client, key, payment, offer


def permit2_nonce(payment: dict[str, Any]) -> int:
    return int(payment["payload"]["deposit"]["authorization"]["permit2Authorization"]["nonce"])


def nonce_spent(facilitator: Any, owner: str, nonce: int) -> bool:
    """Permit2's ``nonceBitmap(owner, nonce >> 8)`` through ``/rpc``, as a wallet reads it."""
    data = "0x" + NONCE_BITMAP.hex() + "00" * 12 + owner.lower()[2:] + f"{nonce >> 8:064x}"
    bitmap = int(rpc(facilitator.http, "eth_call", {"to": PERMIT2, "data": data}, "latest")["result"], 16)
    return bool(bitmap >> (nonce & 255) & 1)


def test_verify_spends_no_permit2_nonce_and_settle_spends_it_in_the_deposits_transaction(facilitator):
    client, _, payment, offer = permit2_deposit(facilitator)
    deposit, nonce = int(payment["payload"]["deposit"]["amount"]), permit2_nonce(payment)

    assert facilitator.verify(payment, offer)["isValid"]
    assert not nonce_spent(facilitator, client.address, nonce)  # verify's eth_call rolled back
    settled = facilitator.settle(payment, offer)

    assert settled["success"] and settled["amount"] == str(deposit), settled
    assert nonce_spent(facilitator, client.address, nonce)
    assert facilitator.balance(client.address) == DEFAULT_INITIAL_BALANCE - deposit
    assert facilitator.balance(BATCH_SETTLEMENT_ADDRESS) == deposit
    receipt = rpc(facilitator.http, "eth_getTransactionReceipt", settled["transaction"])["result"]
    [transfer] = [log for log in receipt["logs"] if log["topics"][0] == TRANSFER_TOPIC]
    assert [t[-40:] for t in transfer["topics"][1:]] == [
        client.address.lower()[2:],
        BATCH_SETTLEMENT_ADDRESS.lower()[2:],
    ]
    assert int(transfer["data"], 16) == deposit
    assert EVENT_TOPICS["Deposited"] in [log["topics"][0] for log in receipt["logs"]]


def test_a_payer_who_invalidates_the_deposits_permit2_nonce_is_never_charged(facilitator):
    client, key, payment, offer = permit2_deposit(facilitator)
    nonce = permit2_nonce(payment)
    assert "result" in rpc(facilitator.http, "eth_sendRawTransaction", invalidate_permit2_nonce(key, nonce))

    refused = facilitator.settle(payment, offer)

    assert (refused["success"], refused["errorMessage"]) == (False, "execution reverted: InvalidNonce()")
    assert facilitator.balance(client.address) == DEFAULT_INITIAL_BALANCE
    assert client.channels_view(client.channel(payment)[1]) == [0, 0]


def test_vouchers_ride_a_channel_funded_by_permit2(facilitator):
    client, _, payment, offer = permit2_deposit(facilitator)
    assert facilitator.settle(payment, offer)["success"]
    config, channel_id = client.channel(payment)
    cumulative = int(payment["payload"]["voucher"]["maxClaimableAmount"]) + int(offer["amount"])

    verified = facilitator.verify(client.voucher_payment(offer, config, channel_id, cumulative), offer)

    assert verified["isValid"], verified
    assert verified["payer"] == client.address
