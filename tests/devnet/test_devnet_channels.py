"""The development network's payment channels: the simulated ``x402BatchSettlement`` contract
behind the development facilitator, driven over HTTP by the x402 package's own client and
server-side payload builders, on a real loopback server.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_utils import keccak
from hypothesis import event, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from x402.http import FacilitatorConfig, HTTPFacilitatorClientSync
from x402.mechanisms.evm.batch_settlement.authorizer_signer import (
    LocalAuthorizerSigner,
    sign_claim_batch,
    sign_refund,
)
from x402.mechanisms.evm.batch_settlement.client.eip3009 import create_batch_settlement_eip3009_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.permit2 import create_batch_settlement_permit2_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.scheme import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import (
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.batch_settlement.encoding import build_erc3009_deposit_nonce
from x402.mechanisms.evm.batch_settlement.facilitator.deposit_eip3009 import build_eip3009_deposit_collector_data
from x402.mechanisms.evm.batch_settlement.facilitator.deposit_permit2 import build_permit2_deposit_collector_data
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.server.channel_manager_common import ChannelManagerConfigSync
from x402.mechanisms.evm.batch_settlement.server.channel_manager_sync import BatchSettlementChannelManagerSync
from x402.mechanisms.evm.batch_settlement.server.scheme import BatchSettlementEvmScheme as ServerBatchSettlementScheme
from x402.mechanisms.evm.batch_settlement.server.scheme import BatchSettlementEvmSchemeServerConfig
from x402.mechanisms.evm.batch_settlement.server.storage import Channel as ServerChannel
from x402.mechanisms.evm.batch_settlement.server.storage import InMemoryChannelStorage
from x402.mechanisms.evm.batch_settlement.types import VoucherClaim
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequirements

from devnet.batch_settlement import EVENT_TOPICS, BatchSettlementContract
from devnet.chain import AUTHORIZATION_USED_TOPIC, LedgerEvmSigner
from devnet.channels import DEV_RECEIVER_AUTHORIZER_KEY
from devnet.client import pay
from devnet.facilitator import DEV_NETWORK, create_facilitator_app
from devnet.ledger import DevLedger, LedgerRevert
from devnet.payer import encode_header, new_private_key
from devnet.permit2 import Permit2Contracts
from tests.support import dev_facilitator_helpers
from tests.support.channels import (
    BATCH_SETTLEMENT_ADDRESS,
    WITHDRAW_DELAY,
    ChannelClient,
    channel_offer,
    claim_request,
    contract_config,
    refund_request,
    rpc,
    settle_request,
    signed_transaction,
)
from tests.support.dev_facilitator_helpers import PAY_TO, USDC_BASE_SEPOLIA, request_body
from tests.support.serve import serve_app

start = dev_facilitator_helpers.start
facilitator = dev_facilitator_helpers.facilitator

RECEIVER_AUTHORIZER = Account.from_key(DEV_RECEIVER_AUTHORIZER_KEY).address
CLAIM_FAILED = "invalid_batch_settlement_evm_claim_simulation_failed"
REFUND_FAILED = "invalid_batch_settlement_evm_refund_simulation_failed"
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()


def open_channel(facilitator: Any, offer: dict[str, Any] | None = None) -> tuple[ChannelClient, Any, str, int]:
    """A fresh payer deposits through the package's client: (client, config, channel id, deposit)."""
    offer = offer or channel_offer(RECEIVER_AUTHORIZER)
    client = ChannelClient(facilitator.url, new_private_key())
    payment = client.payment(offer)
    assert payment["payload"]["type"] == "deposit"
    verified = facilitator.verify(payment, offer)
    assert verified["isValid"], verified
    settled = facilitator.settle(payment, offer)
    assert settled["success"], settled
    config, channel_id = client.channel(payment)
    return client, config, channel_id, int(payment["payload"]["deposit"]["amount"])


def channel_state(facilitator: Any, channel_id: str) -> dict[str, Any]:
    channels = facilitator.http.get("/dev/channels").json()["channels"]
    return next(c for c in channels if c["channelId"] == channel_id)


def settle_channels(facilitator: Any) -> dict[str, Any]:
    response = facilitator.http.post("/settle", json=settle_request())
    assert response.status_code == 200, response.text
    return response.json()


def post_settle(facilitator: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = facilitator.http.post("/settle", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- the offer ---------------------------------------------------------------------------


def test_supported_advertises_the_receiver_authorizer(facilitator):
    kinds = facilitator.http.get("/supported").json()["kinds"]
    channel_kinds = [k for k in kinds if k["scheme"] == "batch-settlement"]
    assert channel_kinds == [
        {
            "x402Version": 2,
            "scheme": "batch-settlement",
            "network": DEV_NETWORK,
            "extra": {"receiverAuthorizer": RECEIVER_AUTHORIZER},
        }
    ]


def test_the_receiver_authorizer_key_is_configurable(start):
    key = new_private_key()
    custom = start(receiver_authorizer_key=key)
    kinds = custom.http.get("/supported").json()["kinds"]
    advertised = next(k for k in kinds if k["scheme"] == "batch-settlement")["extra"]["receiverAuthorizer"]
    assert advertised == Account.from_key(key).address


def test_a_bad_receiver_authorizer_key_is_refused_without_repeating_it(tmp_path):
    secret = "0x" + "ab" * 31
    with pytest.raises(ValueError, match="receiver-authorizer key") as refused:
        create_facilitator_app(str(tmp_path / "ledger.db"), receiver_authorizer_key=secret)
    assert secret[2:] not in str(refused.value) and refused.value.__cause__ is None


# -- deposit -------------------------------------------------------------------------------


def test_a_deposit_opens_a_channel_the_client_reads_through_rpc(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    client = ChannelClient(facilitator.url, new_private_key())
    payment = client.payment(offer)
    config, channel_id = client.channel(payment)
    deposit = int(payment["payload"]["deposit"]["amount"])
    before = facilitator.balance(client.address)
    assert client.channels_view(channel_id) == [0, 0]

    verified = facilitator.verify(payment, offer)
    assert verified["isValid"] and verified["extra"]["balance"] == "0"
    settled = facilitator.settle(payment, offer)

    assert settled["success"] and settled["amount"] == str(deposit)
    assert settled["extra"]["channelState"]["balance"] == str(deposit)
    assert client.channels_view(channel_id) == [deposit, 0]
    assert facilitator.balance(client.address) == before - deposit
    assert facilitator.balance(BATCH_SETTLEMENT_ADDRESS) == deposit

    receipt = rpc(facilitator.http, "eth_getTransactionReceipt", settled["transaction"])["result"]
    topics = [log["topics"][0] for log in receipt["logs"]]
    assert topics.count(TRANSFER_TOPIC) == 2  # payer -> collector -> contract
    assert EVENT_TOPICS["ChannelCreated"] in topics and EVENT_TOPICS["Deposited"] in topics
    logs = rpc(
        facilitator.http,
        "eth_getLogs",
        {"address": BATCH_SETTLEMENT_ADDRESS, "topics": [EVENT_TOPICS["ChannelCreated"], channel_id]},
    )
    assert [log["transactionHash"] for log in logs["result"]] == [settled["transaction"]]
    assert config.payer == client.address
    # The deposit spent an EIP-3009 nonce of the token, as receiveWithAuthorization does: the chain says so.
    authorization = payment["payload"]["deposit"]["authorization"]["erc3009Authorization"]
    nonce = build_erc3009_deposit_nonce(channel_id, authorization["salt"])
    used = rpc(
        facilitator.http,
        "eth_getLogs",
        {"address": USDC_BASE_SEPOLIA, "topics": [AUTHORIZATION_USED_TOPIC, _topic(client.address), nonce]},
    )
    assert [log["transactionHash"] for log in used["result"]] == [settled["transaction"]]
    state = "0x" + keccak(text="authorizationState(address,bytes32)")[:4].hex() + _topic(client.address)[2:] + nonce[2:]
    assert int(rpc(facilitator.http, "eth_call", {"to": USDC_BASE_SEPOLIA, "data": state}, "latest")["result"], 16) == 1


def _topic(address: str) -> str:
    return "0x" + "00" * 12 + address.lower()[2:]


def test_a_deposit_is_settled_once(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    client = ChannelClient(facilitator.url, new_private_key())
    payment = client.payment(offer)
    assert facilitator.settle(payment, offer)["success"]
    again = facilitator.settle(payment, offer)
    assert not again["success"]
    _, channel_id = client.channel(payment)
    assert client.channels_view(channel_id)[0] == int(payment["payload"]["deposit"]["amount"])


def test_a_deposit_with_a_forged_authorization_moves_nothing(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    client = ChannelClient(facilitator.url, new_private_key())
    payment = client.payment(offer)
    authorization = payment["payload"]["deposit"]["authorization"]["erc3009Authorization"]
    forged = ChannelClient(facilitator.url, new_private_key()).payment(offer)
    authorization["signature"] = forged["payload"]["deposit"]["authorization"]["erc3009Authorization"]["signature"]
    before = facilitator.balance(client.address)
    assert not facilitator.verify(payment, offer)["isValid"]
    assert not facilitator.settle(payment, offer)["success"]
    assert facilitator.balance(client.address) == before
    assert client.channels_view(client.channel(payment)[1]) == [0, 0]


def test_a_permit2_deposit_opens_a_channel_once(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER, assetTransferMethod="permit2")
    client = ChannelClient(facilitator.url, new_private_key())
    payment = client.payment(offer)
    assert "permit2Authorization" in payment["payload"]["deposit"]["authorization"]
    _, channel_id = client.channel(payment)
    deposit = int(payment["payload"]["deposit"]["amount"])
    before = facilitator.balance(client.address)

    assert facilitator.verify(payment, offer)["isValid"]
    settled = facilitator.settle(payment, offer)

    assert settled["success"], settled
    assert client.channels_view(channel_id) == [deposit, 0]
    assert facilitator.balance(client.address) == before - deposit
    again = facilitator.settle(payment, offer)  # the Permit2 nonce is spent
    assert not again["success"]
    assert client.channels_view(channel_id) == [deposit, 0]
    assert facilitator.balance(client.address) == before - deposit


def test_without_permit2_a_permit2_deposit_moves_nothing(start):
    plain = start(permit2=False)
    offer = channel_offer(RECEIVER_AUTHORIZER, assetTransferMethod="permit2")
    client = ChannelClient(plain.url, new_private_key())
    payment = client.payment(offer)
    before = plain.balance(client.address)
    assert not plain.verify(payment, offer)["isValid"]
    assert not plain.settle(payment, offer)["success"]
    assert plain.balance(client.address) == before


def test_vouchers_verify_against_the_channel(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    client, config, channel_id, deposit = open_channel(facilitator, offer)
    good = client.voucher_payment(offer, config, channel_id, 2000)
    assert facilitator.verify(good, offer)["isValid"]
    too_much = client.voucher_payment(offer, config, channel_id, deposit + 1)
    assert (
        facilitator.verify(too_much, offer)["invalidReason"]
        == "invalid_batch_settlement_evm_cumulative_exceeds_balance"
    )
    stranger = ChannelClient(facilitator.url, new_private_key())
    forged = stranger.voucher_payment(offer, config, channel_id, 2000)
    assert facilitator.verify(forged, offer)["invalidReason"] == "invalid_batch_settlement_evm_voucher_signature"


# -- claim and settle ------------------------------------------------------------------------


def test_claims_advance_total_claimed_and_settle_pays_exactly_the_claims(facilitator):
    first, first_config, first_id, _ = open_channel(facilitator)
    second, second_config, second_id, _ = open_channel(facilitator)
    vouchers = [first.voucher(first_id, cumulative) for cumulative in (1000, 2000, 3000)]
    latest_second = second.voucher(second_id, 1000)
    paid_before = facilitator.balance(PAY_TO)

    # The facilitator signs the batch (the channels name its receiver authorizer).
    claimed = post_settle(
        facilitator, claim_request([vouchers[1].claim(first_config), latest_second.claim(second_config)])
    )
    assert claimed["success"], claimed
    assert first.channels_view(first_id)[1] == 2000
    assert second.channels_view(second_id)[1] == 1000
    assert facilitator.balance(PAY_TO) == paid_before  # claiming moves no tokens

    # The server signs the next batch itself with the same key.
    assert post_settle(facilitator, claim_request([vouchers[2].claim(first_config)], DEV_RECEIVER_AUTHORIZER_KEY))[
        "success"
    ]
    assert first.channels_view(first_id)[1] == 3000

    settled = settle_channels(facilitator)
    assert settled["success"] and settled["amount"] == "4000"
    assert facilitator.balance(PAY_TO) == paid_before + 4000
    nothing = settle_channels(facilitator)
    assert not nothing["success"] and nothing["errorReason"] == "invalid_batch_settlement_evm_nothing_to_settle"
    assert facilitator.balance(PAY_TO) == paid_before + 4000

    receipt = rpc(facilitator.http, "eth_getTransactionReceipt", settled["transaction"])["result"]
    assert [log["topics"][0] for log in receipt["logs"]] == [TRANSFER_TOPIC, EVENT_TOPICS["Settled"]]


BAD_CLAIMS = {
    "over_voucher": "claim exceeds voucher maxClaimableAmount",
    "over_balance": "claim exceeds channel balance",
    "forged_voucher": "invalid voucher signature",
    "wrong_authorizer": "invalid receiver authorizer signature",
    "other_channel_voucher": "invalid voucher signature",
}


@pytest.mark.parametrize("case", sorted(BAD_CLAIMS))
def test_a_bad_claim_reverts_and_moves_nothing(facilitator, case):
    client, config, channel_id, deposit = open_channel(facilitator)
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 2000).claim(config)]))["success"]
    authorizer_key = None
    if case == "over_voucher":
        claim = client.voucher(channel_id, 3000).claim(config, total_claimed=3001)
    elif case == "over_balance":
        claim = client.voucher(channel_id, deposit + 1000).claim(config)
    elif case == "forged_voucher":
        claim = ChannelClient(facilitator.url, new_private_key()).voucher(channel_id, 3000).claim(config)
    elif case == "wrong_authorizer":
        claim, authorizer_key = client.voucher(channel_id, 3000).claim(config), new_private_key()
    else:
        _, _, other_id, _ = open_channel(facilitator)
        claim = client.voucher(other_id, 3000).claim(config)
    before = channel_state(facilitator, channel_id)
    paid_before = facilitator.balance(PAY_TO)

    answer = post_settle(facilitator, claim_request([claim], authorizer_key))

    assert not answer["success"] and answer["errorReason"] == CLAIM_FAILED
    assert BAD_CLAIMS[case] in answer["errorMessage"]
    assert channel_state(facilitator, channel_id) == before
    assert settle_channels(facilitator)["amount"] == "2000"
    assert facilitator.balance(PAY_TO) == paid_before + 2000


def test_an_older_smaller_voucher_claims_nothing_and_reverts_nothing(facilitator):
    """x402BatchSettlement skips a row at or below the channel's claimed total before any other check."""
    client, config, channel_id, _ = open_channel(facilitator)
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 2000).claim(config)]))["success"]
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 1000).claim(config)]))["success"]
    assert client.channels_view(channel_id)[1] == 2000
    assert settle_channels(facilitator)["amount"] == "2000"


def test_a_replayed_claim_claims_nothing_more(facilitator):
    client, config, channel_id, _ = open_channel(facilitator)
    body = claim_request([client.voucher(channel_id, 2000).claim(config)])
    assert post_settle(facilitator, body)["success"]
    assert post_settle(facilitator, body)["success"]  # the binding's no-op: the total is already there
    assert client.channels_view(channel_id)[1] == 2000
    assert settle_channels(facilitator)["amount"] == "2000"


# -- refund and withdrawal --------------------------------------------------------------------


def test_a_cooperative_refund_returns_the_unclaimed_rest(facilitator):
    client, config, channel_id, deposit = open_channel(facilitator)
    voucher = client.voucher(channel_id, 2000)
    balance_before = facilitator.balance(client.address)

    # Claims outstanding vouchers and refunds the rest in one multicall; the facilitator signs both.
    refunded = post_settle(
        facilitator, refund_request(config, channel_id, voucher, deposit - 2000, 0, [voucher.claim(config)])
    )

    assert refunded["success"], refunded
    assert refunded["amount"] == str(deposit - 2000)
    assert refunded["extra"]["channelState"]["refundNonce"] == "1"
    assert client.channels_view(channel_id) == [2000, 2000]
    assert facilitator.balance(client.address) == balance_before + deposit - 2000
    assert settle_channels(facilitator)["amount"] == "2000"

    replay = post_settle(
        facilitator, refund_request(config, channel_id, voucher, 1, 0, [], DEV_RECEIVER_AUTHORIZER_KEY)
    )
    assert not replay["success"] and replay["errorReason"] in (
        REFUND_FAILED,
        "invalid_batch_settlement_evm_refund_no_balance",
    )
    assert channel_state(facilitator, channel_id)["refundNonce"] == "1"


def test_a_refund_signed_by_someone_else_reverts(facilitator):
    client, config, channel_id, deposit = open_channel(facilitator)
    balance_before = facilitator.balance(client.address)
    voucher = client.voucher(channel_id, 0)
    answer = post_settle(facilitator, refund_request(config, channel_id, voucher, deposit, 0, [], new_private_key()))
    assert not answer["success"] and answer["errorReason"] == REFUND_FAILED
    assert facilitator.balance(client.address) == balance_before
    assert client.channels_view(channel_id) == [deposit, 0]


def test_a_timed_withdrawal_pays_the_payer_after_the_delay(facilitator):
    client, config, channel_id, deposit = open_channel(facilitator)
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 1000).claim(config)]))["success"]
    config_tuple = contract_config(config)
    balance_before = facilitator.balance(client.address)

    stranger = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(new_private_key(), "initiateWithdraw", config_tuple, 500),
    )
    assert "not authorized" in stranger["error"]["message"]
    too_much = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "initiateWithdraw", config_tuple, deposit),
    )
    assert "exceeds unclaimed" in too_much["error"]["message"]
    initiated = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "initiateWithdraw", config_tuple, deposit - 1000, nonce=1),
    )
    assert "result" in initiated, initiated
    assert channel_state(facilitator, channel_id)["withdrawRequestedAt"] > 0
    early = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "finalizeWithdraw", config_tuple, nonce=2),
    )
    assert "not elapsed" in early["error"]["message"]

    # The server may still claim during the grace period; the withdrawal then gets less.
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 1500).claim(config)]))["success"]
    assert facilitator.http.post("/dev/chain/advanceTime", json={"seconds": WITHDRAW_DELAY}).status_code == 200
    final = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "finalizeWithdraw", config_tuple, nonce=3),
    )
    assert "result" in final, final

    assert facilitator.balance(client.address) == balance_before + deposit - 1500
    assert client.channels_view(channel_id) == [1500, 1500]
    assert settle_channels(facilitator)["amount"] == "1500"
    replayed = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "finalizeWithdraw", config_tuple, nonce=3),
    )
    assert "error" in replayed


# -- faults and malformed requests ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["invalid", "http500"])
def test_faults_apply_to_channel_operations(facilitator, mode):
    client, config, channel_id, _ = open_channel(facilitator)
    facilitator.faults({"settle": mode, "count": 1})
    response = facilitator.http.post("/settle", json=claim_request([client.voucher(channel_id, 1000).claim(config)]))
    if mode == "invalid":
        assert response.json()["errorReason"] == "dev_fault"
    else:
        assert response.status_code == 500
    assert client.channels_view(channel_id)[1] == 0
    assert post_settle(facilitator, claim_request([client.voucher(channel_id, 1000).claim(config)]))["success"]


def _corrupt(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("payload", "channelConfig", "payer"), "0x12"),
        (("payload", "channelConfig", "withdrawDelay"), "soon"),
        (("payload", "voucher", "maxClaimableAmount"), -1),
        (("payload", "voucher", "signature"), "zz"),
        (("payload", "deposit", "amount"), str(2**128)),
        (("payload", "deposit", "authorization"), {}),
        (("payload", "type"), "withdraw"),
    ],
)
def test_a_malformed_channel_payload_is_a_400(facilitator, path, value):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    payment = ChannelClient(facilitator.url, new_private_key()).payment(offer)
    for endpoint in ("/verify", "/settle"):
        response = facilitator.http.post(endpoint, json=request_body(_corrupt(payment, path, value), offer))
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "invalid_request"
        assert payment["payload"]["voucher"]["signature"] not in response.text


def test_a_malformed_claim_is_a_400(facilitator):
    body = claim_request([])
    response = facilitator.http.post("/settle", json=body)
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"


def test_the_contract_answers_raw_eth_calls(facilitator):
    client, config, channel_id, deposit = open_channel(facilitator)
    data = "0x" + keccak(text="refundNonce(bytes32)")[:4].hex() + channel_id[2:]
    answer = rpc(facilitator.http, "eth_call", {"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest")
    assert int(answer["result"], 16) == 0
    bad = rpc(facilitator.http, "eth_call", {"to": BATCH_SETTLEMENT_ADDRESS, "data": "0xdeadbeef"}, "latest")
    assert bad["error"]["code"] == -32602
    assert client.channels_view(channel_id) == [deposit, 0]
    assert config.token == USDC_BASE_SEPOLIA


# -- the contract alone: money is conserved over any voucher sequence -----------------------

PROPERTY_PAYER_KEYS = ["0x" + keccak(text=f"a2a-gate channel property payer {i}").hex() for i in range(2)]
_channel = st.integers(0, 1)
_claim = st.tuples(st.integers(0, 50), st.integers(0, 1500), st.sampled_from([0, 0, 1, 700]))
_ops = st.one_of(
    st.tuples(st.just("deposit"), _channel, st.integers(1, 3000)),
    st.tuples(st.just("voucher"), _channel, st.integers(0, 4000)),
    *[st.tuples(st.just("claim"), _channel, _claim)] * 3,
    st.tuples(st.just("claim_both"), _claim, _claim),
    st.tuples(st.just("settle")),
    st.tuples(st.just("refund"), _channel, st.integers(1, 5000)),
)


@settings(max_examples=60, deadline=None)
@given(
    deposits=st.tuples(st.integers(1, 3000), st.integers(1, 3000)),
    first_vouchers=st.tuples(st.integers(1, 3000), st.integers(1, 3000)),
    ops=st.lists(_ops, min_size=2, max_size=12),
)
def test_payto_receives_exactly_the_highest_claims_and_money_is_conserved(deposits, first_vouchers, ops):
    """Two payers' channels to one receiver, random deposits, vouchers, claims (alone or batched),
    settles and refunds: each channel's state is what the model says, a batch with one bad row
    changes nothing, and payTo ends with exactly the sum of the highest claims."""
    with tempfile.TemporaryDirectory() as tmp:
        world = ContractWorld(str(Path(tmp) / "ledger.db"))
        try:
            opening = [
                (op, i, v) for i in (0, 1) for op, v in (("deposit", deposits[i]), ("voucher", first_vouchers[i]))
            ]
            world.run([*opening, *ops])
            claimed = sum(1 for c in world.channels if c.claimed)
            event(
                f"{claimed} channel(s) claimed, refunded {'some' if any(c.refund_nonce for c in world.channels) else 'nothing'}"
            )
        finally:
            world.ledger.close()


@dataclasses.dataclass
class ChannelModel:
    """What one channel must hold, kept beside the contract."""

    payer: EthAccountSigner
    config: Any
    channel_id: str
    vouchers: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    deposited: int = 0
    balance: int = 0
    claimed: int = 0
    refund_nonce: int = 0
    opened: bool = False  # a channel, once funded, exists even when drained


class ContractWorld:
    """The contract over a fresh ledger, beside a model of what it must hold."""

    def __init__(self, path: str) -> None:
        self.ledger = DevLedger(path)
        self.permit2 = Permit2Contracts(self.ledger)
        self.contract = BatchSettlementContract(self.ledger, permit2=self.permit2)
        self.signer = LedgerEvmSigner(self.ledger, contracts=[self.permit2, self.contract])
        self.offer = PaymentRequirements.model_validate(channel_offer(RECEIVER_AUTHORIZER))
        self.authorizer = LocalAuthorizerSigner(DEV_RECEIVER_AUTHORIZER_KEY)
        self.channels = []
        for key in PROPERTY_PAYER_KEYS:
            payer = EthAccountSigner(Account.from_key(key))
            config = BatchSettlementEvmScheme(payer).build_channel_config(self.offer)
            self.channels.append(ChannelModel(payer, config, compute_channel_id(config, DEV_NETWORK)))
        self.payer, self.config, self.channel_id = self.payer_config_id(0)
        self.settled = 0
        self.total = self._holdings()

    def payer_config_id(self, index: int) -> tuple[EthAccountSigner, Any, str]:
        c = self.channels[index]
        return c.payer, c.config, c.channel_id

    def _token(self, address: str) -> int:
        return self.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, address)

    def _holdings(self) -> int:
        holders = [c.payer.address for c in self.channels] + [PAY_TO, BATCH_SETTLEMENT_ADDRESS]
        return sum(self._token(a) for a in holders)

    def _send(self, function_name: str, *args: Any) -> bool:
        try:
            self.contract.transact(BATCH_SETTLEMENT_ADDRESS, function_name, args)
        except LedgerRevert:
            return False
        return True

    def run(self, ops: list[tuple[Any, ...]]) -> None:
        paid_before = self._token(PAY_TO)
        for op in ops:
            getattr(self, "_" + op[0])(*op[1:])
            self._check()
        self._settle()
        self._check()
        assert self._token(PAY_TO) - paid_before == sum(c.claimed for c in self.channels)
        assert all(c.claimed <= c.deposited for c in self.channels)

    def _check(self) -> None:
        for c in self.channels:
            record = self.contract.channel(c.channel_id)
            state = (0, 0, 0) if record is None else (record.balance, record.total_claimed, record.refund_nonce)
            assert state == (c.balance, c.claimed, c.refund_nonce)
        claimed = sum(c.claimed for c in self.channels)
        assert self.contract.receiver_totals(PAY_TO, USDC_BASE_SEPOLIA) == (claimed, self.settled)
        assert self._token(BATCH_SETTLEMENT_ADDRESS) == sum(c.balance for c in self.channels) - self.settled
        assert self._holdings() == self.total

    def _deposit(self, index: int, amount: int) -> None:
        c = self.channels[index]
        payload = create_batch_settlement_eip3009_deposit_payload(c.payer, self.offer, c.config, amount, max(amount, 1))
        data = build_eip3009_deposit_collector_data(payload)
        collector = ERC3009_DEPOSIT_COLLECTOR_ADDRESS
        assert self._send("deposit", to_contract_channel_config(c.config), amount, collector, data)
        c.deposited += amount
        c.balance += amount
        c.opened = True

    def _voucher(self, index: int, increment: int) -> None:
        c = self.channels[index]
        cumulative = (c.vouchers[-1][0] if c.vouchers else 0) + increment
        c.vouchers.append((cumulative, sign_voucher(c.payer, c.channel_id, cumulative, DEV_NETWORK).signature))

    def _row(self, index: int, pick: tuple[int, int, int]) -> tuple[VoucherClaim, bool] | None:
        """One claim row from a signed voucher, and whether the contract must accept it."""
        c = self.channels[index]
        if not c.vouchers:
            return None
        voucher_index, under, over = pick
        cumulative, signature = c.vouchers[voucher_index % len(c.vouchers)]
        total = max(0, cumulative - under) + over
        # the contract's order: at or below the claimed total a no-op, else within the voucher and the balance
        valid = total <= c.claimed or total <= min(cumulative, c.balance)
        return VoucherClaim(c.config, str(cumulative), signature, str(total)), valid

    def _submit(self, rows: list[tuple[VoucherClaim, bool]]) -> None:
        claims = [claim for claim, _ in rows]
        authorized = sign_claim_batch(self.authorizer, claims, DEV_NETWORK)
        args = [
            (
                (to_contract_channel_config(cl.channel), int(cl.max_claimable_amount)),
                bytes.fromhex(cl.signature[2:]),
                int(cl.total_claimed),
            )
            for cl in claims
        ]
        ok = self._send("claimWithSignature", args, bytes.fromhex(authorized[2:]))
        assert ok == all(valid for _, valid in rows), [(c.total_claimed, v) for c, v in rows]
        if ok:
            for claim, _ in rows:
                model = next(c for c in self.channels if c.config == claim.channel)
                model.claimed = max(model.claimed, int(claim.total_claimed))

    def _claim(self, index: int, pick: tuple[int, int, int]) -> None:
        row = self._row(index, pick)
        if row is not None:
            self._submit([row])

    def _claim_both(self, first: tuple[int, int, int], second: tuple[int, int, int]) -> None:
        rows = [self._row(0, first), self._row(1, second)]
        if rows[0] is not None and rows[1] is not None:
            self._submit([rows[0], rows[1]])

    def _settle(self) -> None:
        assert self._send("settle", PAY_TO, USDC_BASE_SEPOLIA)
        self.settled = sum(c.claimed for c in self.channels)

    def _refund(self, index: int, amount: int) -> None:
        c = self.channels[index]
        signature = sign_refund(self.authorizer, c.channel_id, amount, c.refund_nonce, DEV_NETWORK)
        args = (to_contract_channel_config(c.config), amount, c.refund_nonce, bytes.fromhex(signature[2:]))
        ok = self._send("refundWithSignature", *args)
        assert ok == c.opened
        if ok:
            c.refund_nonce += 1
            c.balance -= min(amount, c.balance - c.claimed)


def test_the_contract_checks_a_deposit_as_the_token_would(tmp_path):
    world = ContractWorld(str(tmp_path / "ledger.db"))
    payload = create_batch_settlement_eip3009_deposit_payload(world.payer, world.offer, world.config, 2000, 1000)
    data = build_eip3009_deposit_collector_data(payload)
    config = to_contract_channel_config(world.config)
    forged = create_batch_settlement_eip3009_deposit_payload(
        EthAccountSigner(Account.create()), world.offer, world.config, 2000, 1000
    )
    forged.deposit.authorization.erc3009_authorization.salt = payload.deposit.authorization.erc3009_authorization.salt
    refusals = [
        (
            ("deposit", config, 2000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, build_eip3009_deposit_collector_data(forged)),
            "invalid signature",
        ),
        (("deposit", config, 2001, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data), "invalid signature"),
        (
            ("deposit", config, 2000, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, data),
            "Permit2DepositCollector: bad collector data",
        ),
        (("deposit", config, 2000, PAY_TO, data), "unknown deposit collector"),
        (("deposit", (*config[:5], 60, config[6]), 2000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data), "withdraw delay"),
        (("deposit", config, 0, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data), "zero amount"),
    ]
    for (function_name, *args), reason in refusals:
        with pytest.raises(LedgerRevert, match=reason):
            world.contract.transact(BATCH_SETTLEMENT_ADDRESS, function_name, tuple(args))
    world._check()  # nothing moved
    world.contract.transact(
        BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 2000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    )
    with pytest.raises(LedgerRevert, match="used or canceled"):
        world.contract.transact(
            BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 2000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
        )
    assert world.contract.channel(world.channel_id).balance == 2000
    world.ledger.close()


# -- a2a-gate-devnet pay over a channel ----------------------------------------------------


def channel_seller(facilitator: Any, offer: dict[str, Any]) -> Starlette:
    """The smallest seller that takes channel payments: 402 with the offer; a deposit verified and
    settled through the facilitator; a voucher verified there for ``charged + price``; every
    answer's ``PAYMENT-RESPONSE`` carries the charge and the running total (the binding's shape)."""
    price = int(offer["amount"])
    charged = {"total": 0}
    seen: list[dict[str, Any]] = []

    async def a2a(request: Request) -> Response:
        header = request.headers.get("payment-signature")
        if header is None:
            required = {
                "x402Version": 2,
                "error": "payment required",
                "resource": {"url": str(request.url)},
                "accepts": [offer],
            }
            return JSONResponse({}, status_code=402, headers={"PAYMENT-REQUIRED": encode_header(required)})
        payment = json.loads(base64.b64decode(header))
        seen.append(payment)
        inner = payment["payload"]
        if int(inner["voucher"]["maxClaimableAmount"]) != charged["total"] + price:
            return JSONResponse({"error": "cumulative mismatch"}, status_code=402)
        verified = await run_in_threadpool(facilitator.verify, payment, offer)
        if not verified["isValid"]:
            return JSONResponse(verified, status_code=402)
        receipt: dict[str, Any] = {"success": True, "transaction": "", "network": DEV_NETWORK, "amount": ""}
        if inner["type"] == "deposit":
            settled = await run_in_threadpool(facilitator.settle, payment, offer)
            receipt.update(transaction=settled["transaction"], amount=settled["amount"])
        charged["total"] += price
        receipt["payer"] = verified["payer"]
        receipt["extra"] = {
            "chargedAmount": str(price),
            "channelState": {
                "channelId": inner["voucher"]["channelId"],
                "chargedCumulativeAmount": str(charged["total"]),
            },
        }
        return JSONResponse(
            {"jsonrpc": "2.0", "id": 1, "result": {"kind": "task"}},
            headers={"PAYMENT-RESPONSE": encode_header(receipt)},
        )

    app = Starlette(routes=[Route("/a2a", a2a, methods=["POST"])])
    app.state.seen = seen
    return app


def test_devnet_pay_pays_a_channel_priced_agent_with_one_deposit_then_vouchers(facilitator):
    offer = channel_offer(RECEIVER_AUTHORIZER)
    seller = channel_seller(facilitator, offer)
    with serve_app(seller) as seller_url:
        outcome = asyncio.run(
            pay(seller_url + "/a2a", "hello", scheme="batch-settlement", rpc_url=facilitator.url + "/rpc", count=3)
        )
    kinds = [p["payload"]["type"] for p in seller.state.seen]
    assert kinds == ["deposit", "voucher", "voucher"]
    assert [int(p["payload"]["voucher"]["maxClaimableAmount"]) for p in seller.state.seen] == [1000, 2000, 3000]
    assert [r["extra"]["channelState"]["chargedCumulativeAmount"] for r in outcome["payment_responses"]] == [
        "1000",
        "2000",
        "3000",
    ]
    channel_id = seller.state.seen[0]["payload"]["voucher"]["channelId"]
    deposit = int(seller.state.seen[0]["payload"]["deposit"]["amount"])
    assert channel_state(facilitator, channel_id)["balance"] == str(deposit)
    assert outcome["http_status"] == 200


def test_the_contract_checks_a_permit2_deposit_as_permit2_would(tmp_path):
    world = ContractWorld(str(tmp_path / "ledger.db"))
    config = to_contract_channel_config(world.config)
    payload = create_batch_settlement_permit2_deposit_payload(world.payer, world.offer, world.config, 2000, 1000)
    data = build_permit2_deposit_collector_data(payload)
    forged = create_batch_settlement_permit2_deposit_payload(
        EthAccountSigner(Account.create()), world.offer, world.config, 2000, 1000
    )
    permit2 = PERMIT2_DEPOSIT_COLLECTOR_ADDRESS
    with pytest.raises(LedgerRevert, match="InvalidSigner"):
        world.contract.transact(
            BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 2000, permit2, build_permit2_deposit_collector_data(forged))
        )
    with pytest.raises(LedgerRevert, match="InvalidSigner"):  # the signature binds the amount
        world.contract.transact(BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 1999, permit2, data))
    world._check()
    world.contract.transact(BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 2000, permit2, data))
    with pytest.raises(LedgerRevert, match="InvalidNonce"):
        world.contract.transact(BATCH_SETTLEMENT_ADDRESS, "deposit", (config, 2000, permit2, data))
    nonce = int(payload.deposit.authorization.permit2_authorization.nonce)
    assert world.permit2.nonce_used(world.payer.address, nonce)
    assert world.contract.channel(world.channel_id).balance == 2000
    world.ledger.close()


# -- the package's own server-side channel manager, over HTTP ----------------------------------


@pytest.mark.parametrize("own_authorizer", [False, True])
def test_the_packages_channel_manager_claims_settles_and_refunds_through_the_facilitator(start, own_authorizer):
    """``BatchSettlementChannelManagerSync`` with the package's HTTP facilitator client: the claim,
    settle and refund payloads the package's server side sends work over the simulated contract,
    whether the facilitator signs as receiver authorizer or the server signs with its own key."""
    facilitator = start()
    server_key = new_private_key() if own_authorizer else None
    authorizer = Account.from_key(server_key).address if server_key else RECEIVER_AUTHORIZER
    offer = channel_offer(authorizer)
    storage = InMemoryChannelStorage()
    signer = LocalAuthorizerSigner(server_key) if server_key else None
    scheme = ServerBatchSettlementScheme(
        PAY_TO, BatchSettlementEvmSchemeServerConfig(storage=storage, receiver_authorizer_signer=signer)
    )
    http_facilitator = HTTPFacilitatorClientSync(FacilitatorConfig(url=facilitator.url))
    manager = BatchSettlementChannelManagerSync(
        ChannelManagerConfigSync(
            scheme=scheme, facilitator=http_facilitator, receiver=PAY_TO, token=USDC_BASE_SEPOLIA, network=DEV_NETWORK
        )
    )
    client, config, channel_id, deposit = open_channel(facilitator, offer)
    voucher = client.voucher(channel_id, 3000)
    storage.update_channel(
        channel_id,
        lambda _: ServerChannel(
            channel_id=channel_id,
            channel_config=config,
            charged_cumulative_amount="3000",
            signed_max_claimable="3000",
            signature=voucher.signature,
            balance=str(deposit),
        ),
    )
    paid_before, payer_before = facilitator.balance(PAY_TO), facilitator.balance(client.address)

    done = manager.claim_and_settle()

    assert [c.vouchers for c in done["claims"]] == [1] and done["settle"] is not None
    assert client.channels_view(channel_id) == [deposit, 3000]
    assert facilitator.balance(PAY_TO) == paid_before + 3000
    storage.update_channel(channel_id, lambda current: dataclasses.replace(current, total_claimed="3000"))

    refunds = manager.refund([channel_id])

    assert len(refunds) == 1 and refunds[0].transaction
    assert facilitator.balance(client.address) == payer_before + deposit - 3000
    assert client.channels_view(channel_id) == [3000, 3000]
    assert storage.get(channel_id) is None  # the manager forgets a refunded channel


def test_the_trusting_benchmark_mode_runs_channels_without_recovering_signatures(start):
    """``--trust-signatures`` (benchmarks only): a channel opens, claims and settles; a claim still
    may not exceed its voucher or the balance (amounts are checked, signatures are not)."""
    trusting = start(trust_signatures=True)
    client, config, channel_id, deposit = open_channel(trusting)
    paid_before = trusting.balance(PAY_TO)
    unsigned = VoucherClaim(config, "2000", "0x" + "00" * 65, "2000")
    assert post_settle(trusting, claim_request([unsigned], new_private_key()))["success"]
    over = VoucherClaim(config, "2000", "0x" + "00" * 65, "2001")
    assert not post_settle(trusting, claim_request([over]))["success"]
    assert settle_channels(trusting)["amount"] == "2000"
    assert trusting.balance(PAY_TO) == paid_before + 2000
    assert client.channels_view(channel_id) == [deposit, 2000]


def test_the_receiver_side_may_claim_and_refund_by_its_own_transactions(facilitator):
    """``claim`` and ``refund`` without signatures: only the receiver or its authorizer may send them."""
    client, config, channel_id, deposit = open_channel(facilitator)
    voucher = client.voucher(channel_id, 2500)
    row = ((contract_config(config), voucher.cumulative), bytes.fromhex(voucher.signature[2:]), 2500)
    stranger = rpc(facilitator.http, "eth_sendRawTransaction", signed_transaction(new_private_key(), "claim", [row]))
    assert "not authorized" in stranger["error"]["message"]
    assert client.channels_view(channel_id) == [deposit, 0]

    claimed = rpc(
        facilitator.http, "eth_sendRawTransaction", signed_transaction(DEV_RECEIVER_AUTHORIZER_KEY, "claim", [row])
    )
    assert "result" in claimed, claimed
    assert client.channels_view(channel_id) == [deposit, 2500]
    receipt = rpc(facilitator.http, "eth_getTransactionReceipt", claimed["result"])["result"]
    assert EVENT_TOPICS["Claimed"] in [log["topics"][0] for log in receipt["logs"]]

    balance_before = facilitator.balance(client.address)
    stranger = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(client.key, "refund", contract_config(config), 100),
    )
    assert "not authorized" in stranger["error"]["message"]  # the payer is not the receiver side
    refunded = rpc(
        facilitator.http,
        "eth_sendRawTransaction",
        signed_transaction(DEV_RECEIVER_AUTHORIZER_KEY, "refund", contract_config(config), deposit),
    )
    assert "result" in refunded, refunded
    assert facilitator.balance(client.address) == balance_before + deposit - 2500
    assert channel_state(facilitator, channel_id)["refundNonce"] == "1"
    assert settle_channels(facilitator)["amount"] == "2500"
