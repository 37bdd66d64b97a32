"""Permit2 on the development network: x402 `upto` and `exact` by Permit2, end to end.

The facilitator is the real development facilitator on a loopback port; payments are signed by the
x402 package's own clients, unchanged, with fresh keys and no approve step (the development chain
grants Permit2 every allowance); verify and settle are the x402 package's own facilitator schemes
over the simulated Permit2 and x402 proxy contracts (``devnet.permit2``). The property at the end
calls the chain through the package's facilitator scheme directly, without HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st
from x402.mechanisms.evm.constants import (
    ERR_PERMIT2_DEADLINE_EXPIRED,
    ERR_PERMIT2_INVALID_SIGNATURE,
    ERR_UPTO_FACILITATOR_MISMATCH,
    ERR_UPTO_SETTLEMENT_EXCEEDS_AMOUNT,
    X402_UPTO_PERMIT2_PROXY_ABI,
)
from x402.mechanisms.evm.upto import UptoEvmFacilitatorScheme
from x402.schemas import PaymentPayload, PaymentRequirements

from devnet.chain import DEV_NETWORK, FACILITATOR_ADDRESS, TRANSFER_TOPIC, ChainRpc, JsonRpcError, LedgerEvmSigner
from devnet.facilitator import create_facilitator_app
from devnet.ledger import DEFAULT_INITIAL_BALANCE, DevLedger, LedgerRevert
from devnet.payer import (
    invalidate_permit2_nonce,
    new_private_key,
    settle_exact_permit2,
    sign_payment,
    sign_transaction,
)
from devnet.permit2 import (
    EXACT_PROXY,
    MAX_UINT256,
    NONCE_INVALIDATION_TOPIC,
    PERMIT2,
    SETTLED_TOPIC,
    UPTO_PROXY,
    Permit2Contracts,
)
from tests.support import dev_facilitator_helpers as helpers
from tests.support.chain_moves import rpc
from tests.support.dev_facilitator_helpers import (
    OTHER_ADDRESS,
    PAY_TO,
    PRICE,
    PRICE_V1,
    TX_HASH,
    USDC_BASE_SEPOLIA,
    request_body,
)
from tests.support.dev_facilitator_helpers import payment_required as exact_payment_required
from tests.support.permit2_payments import (
    balances,
    charge,
    payment_required,
    resign_permit2,
    sign_upto,
    upto_kind,
    upto_offer,
)

pytestmark = pytest.mark.system  # real servers on loopback ports

start, facilitator = helpers.start, helpers.facilitator
key, payer = helpers.key, helpers.payer

NONCE_USED = "permit2_invalid_nonce"  # the x402 package's reason for Permit2's InvalidNonce()
CEILING = 5000
PERMIT2_EXTRA = {"name": "USDC", "version": "2", "assetTransferMethod": "permit2"}


def word(value: int | str) -> str:
    """One ABI word: an integer, or an address."""
    return f"{value:064x}" if isinstance(value, int) else "00" * 12 + value.lower().removeprefix("0x")


def eth_call(url: str, to: str, signature: str, *words: int | str) -> int:
    data = "0x" + keccak(text=signature)[:4].hex() + "".join(word(w) for w in words)
    return int(rpc(url, "eth_call", {"to": to, "data": data}, "latest"), 16)


def topic(address: str) -> str:
    return "0x" + word(address)


@pytest.fixture
def upto(facilitator) -> dict[str, Any]:
    """An upto offer with a ceiling of CEILING, built from the facilitator's /supported kind."""
    return upto_offer(upto_kind(facilitator.url), CEILING)


# -- upto -----------------------------------------------------------------------


def test_the_offer_carries_what_the_upto_client_needs(facilitator, upto):
    assert upto["amount"] == str(CEILING)
    assert upto["extra"] == {
        "assetTransferMethod": "permit2",
        "name": "USDC",
        "version": "2",
        "facilitatorAddress": FACILITATOR_ADDRESS,
    }


def test_upto_settles_the_actual_charge_from_payer_to_pay_to_once(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)  # a fresh key, no approve of its own
    auth = signed["payload"]["permit2Authorization"]
    assert auth["spender"] == UPTO_PROXY and auth["witness"]["facilitator"] == FACILITATOR_ADDRESS
    before = balances(facilitator.url, payer, PAY_TO)
    assert before[0] == DEFAULT_INITIAL_BALANCE  # every new address is funded

    verdict = facilitator.verify(signed, upto)
    assert verdict == {"isValid": True, "payer": payer}
    settled = facilitator.settle(signed, charge(upto, 1234))
    assert settled["success"] is True, settled
    assert settled["amount"] == "1234" and TX_HASH.match(settled["transaction"])
    assert balances(facilitator.url, payer, PAY_TO) == [before[0] - 1234, before[1] + 1234]

    receipt = rpc(facilitator.url, "eth_getTransactionReceipt", settled["transaction"])
    assert receipt["status"] == "0x1" and receipt["to"] == UPTO_PROXY.lower()
    moved, done = receipt["logs"]
    assert moved["address"] == USDC_BASE_SEPOLIA.lower()
    assert moved["topics"] == [TRANSFER_TOPIC, topic(payer), topic(PAY_TO)]
    assert int(moved["data"], 16) == 1234
    assert (done["address"], done["topics"]) == (UPTO_PROXY.lower(), [SETTLED_TOPIC])
    query = {"address": USDC_BASE_SEPOLIA, "topics": [TRANSFER_TOPIC, topic(payer), topic(PAY_TO)]}
    assert rpc(facilitator.url, "eth_getLogs", query) == [moved]

    nonce = int(auth["nonce"])
    assert eth_call(facilitator.url, PERMIT2, "nonceBitmap(address,uint256)", payer, nonce >> 8) == 1 << (nonce & 255)
    [row] = facilitator.ledger()["permit2_settlements"]
    assert (row["amount"], row["permitted_amount"], row["proxy"]) == ("1234", str(CEILING), UPTO_PROXY)


def test_a_second_settle_of_the_same_nonce_is_refused_and_moves_nothing(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    assert facilitator.settle(signed, charge(upto, 700))["success"] is True
    after_first = balances(facilitator.url, payer, PAY_TO)
    for amount in (700, 1, CEILING):
        again = facilitator.settle(signed, charge(upto, amount))
        assert (again["success"], again["errorReason"]) == (False, NONCE_USED), again
    assert balances(facilitator.url, payer, PAY_TO) == after_first
    assert facilitator.verify(signed, upto)["isValid"] is False  # the package simulates the settle
    assert len(facilitator.ledger()["permit2_settlements"]) == 1


def test_the_devnet_payer_signs_upto_too_above_the_clients_default_cap(facilitator, key, payer):
    """`devnet.payer.sign_payment` (the x402 client with its spend controls off) signs any upto offer."""
    ceiling = 25_000_000  # 25 USDC: the x402 client's default spend controls stop at 1
    offer = upto_offer(upto_kind(facilitator.url), ceiling)
    signed = sign_payment(payment_required(offer), key)
    assert signed["payload"]["permit2Authorization"]["permitted"]["amount"] == str(ceiling)
    assert facilitator.settle(signed, charge(offer, 24_999_999))["amount"] == "24999999"
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - 24_999_999


def test_concurrent_settles_of_one_authorization_move_money_once(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: facilitator.settle(signed, charge(upto, 100 + i)), range(8)))
    [won] = [a for a in answers if a["success"]]
    assert {a["errorReason"] for a in answers if not a["success"]} == {NONCE_USED}
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - int(won["amount"])


def test_a_settle_above_the_ceiling_is_refused_and_moves_nothing(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    refused = facilitator.settle(signed, charge(upto, CEILING + 1))
    assert (refused["success"], refused["errorReason"]) == (False, ERR_UPTO_SETTLEMENT_EXCEEDS_AMOUNT)
    assert balances(facilitator.url, payer, PAY_TO)[0] == DEFAULT_INITIAL_BALANCE
    # the authorization is still good for the ceiling itself
    assert facilitator.settle(signed, charge(upto, CEILING))["amount"] == str(CEILING)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - CEILING


def test_an_expired_authorization_is_refused(facilitator, upto, key, payer):
    expired = resign_permit2(sign_upto(upto, key), key, deadline=int(time.time()) - 1)
    assert facilitator.verify(expired, upto)["invalidReason"] == ERR_PERMIT2_DEADLINE_EXPIRED
    refused = facilitator.settle(expired, charge(upto, 10))
    assert (refused["success"], refused["errorReason"]) == (False, ERR_PERMIT2_DEADLINE_EXPIRED)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE


def test_a_witness_naming_another_facilitator_or_a_forged_signature_is_refused(facilitator, upto, key):
    signed = sign_upto(upto, key)
    elsewhere = resign_permit2(signed, key, facilitator=OTHER_ADDRESS)
    assert facilitator.verify(elsewhere, upto)["invalidReason"] == ERR_UPTO_FACILITATOR_MISMATCH
    forged = resign_permit2(signed, new_private_key())  # signed by someone else for this payer
    assert facilitator.verify(forged, upto)["invalidReason"] == ERR_PERMIT2_INVALID_SIGNATURE
    assert facilitator.settle(forged, charge(upto, 10))["errorReason"] == ERR_PERMIT2_INVALID_SIGNATURE
    assert facilitator.ledger()["permit2_settlements"] == []


def test_faults_apply_to_upto_as_to_exact(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    facilitator.faults({"verify": "invalid", "settle": "invalid", "count": 1})
    assert facilitator.verify(signed, upto) == {"isValid": False, "invalidReason": "dev_fault", "payer": payer}
    refused = facilitator.settle(signed, charge(upto, 10))
    assert (refused["errorReason"], refused["payer"]) == ("dev_fault", payer)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE
    facilitator.faults({"settle": "http500", "count": 1})
    assert facilitator.http.post("/settle", json=request_body(signed, charge(upto, 10))).status_code == 500
    facilitator.faults({"settle": "late:0.3", "count": 1})  # decided, then answered late: the money moved
    started = time.monotonic()
    assert facilitator.settle(signed, charge(upto, 10))["success"] is True
    assert time.monotonic() - started >= 0.3
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - 10


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.update(nonce="twelve"),
        lambda a: a.update(witness="to"),
        lambda a: a["witness"].update(facilitator="0x1234"),
        lambda a: a["permitted"].pop("amount"),
        lambda a: a.update(deadline=2**256),
    ],
)
def test_a_malformed_permit2_payload_is_a_400(facilitator, upto, key, change):
    signed = sign_upto(upto, key)
    change(signed["payload"]["permit2Authorization"])
    for path in ("/verify", "/settle"):
        answer = facilitator.http.post(path, json=request_body(signed, upto))
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", answer.text


def test_every_address_has_granted_permit2_and_only_permit2(facilitator, payer):
    allowance = "allowance(address,address)"
    assert eth_call(facilitator.url, USDC_BASE_SEPOLIA, allowance, payer, PERMIT2) == MAX_UINT256
    assert eth_call(facilitator.url, USDC_BASE_SEPOLIA, allowance, payer, UPTO_PROXY) == 0
    assert eth_call(facilitator.url, PERMIT2, "nonceBitmap(address,uint256)", payer, 0) == 0


def test_upto_is_not_served_without_permit2(start, key):
    bare = start(permit2=False)
    kind = {"x402Version": 2, "scheme": "upto", "network": DEV_NETWORK, "extra": {"facilitatorAddress": OTHER_ADDRESS}}
    offer = upto_offer(kind, CEILING)
    signed = sign_upto(offer, key)
    assert bare.verify(signed, offer)["invalidReason"] == "unsupported_scheme"


# -- what a payer, or anyone, can send the chain itself -------------------------------


def send_raw(url: str, raw: str) -> dict[str, Any]:
    return httpx.post(
        f"{url}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "eth_sendRawTransaction", "params": [raw]}
    ).json()


def test_a_payer_who_invalidates_its_permit2_nonce_is_never_charged(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    nonce = int(signed["payload"]["permit2Authorization"]["nonce"])
    tx = send_raw(facilitator.url, invalidate_permit2_nonce(key, nonce))["result"]
    assert eth_call(facilitator.url, PERMIT2, "nonceBitmap(address,uint256)", payer, nonce >> 8) == 1 << (nonce & 255)
    [event] = rpc(facilitator.url, "eth_getTransactionReceipt", tx)["logs"]
    assert event["topics"] == [NONCE_INVALIDATION_TOPIC, topic(payer)] and event["address"] == PERMIT2.lower()
    assert rpc(facilitator.url, "eth_getLogs", {"topics": [NONCE_INVALIDATION_TOPIC, topic(payer)]}) == [event]
    refused = facilitator.settle(signed, charge(upto, 10))
    assert (refused["success"], refused["errorReason"]) == (False, NONCE_USED)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE


def test_anyone_may_settle_an_exact_permit2_signature_but_only_to_its_pay_to(facilitator, key, payer):
    requirements = {**PRICE, "extra": PERMIT2_EXTRA}
    signed = sign_payment(exact_payment_required(extra=PERMIT2_EXTRA), key)
    stranger = new_private_key()
    tx = send_raw(facilitator.url, settle_exact_permit2(stranger, signed))["result"]
    assert balances(facilitator.url, payer, PAY_TO) == [DEFAULT_INITIAL_BALANCE - 1000, DEFAULT_INITIAL_BALANCE + 1000]
    assert rpc(facilitator.url, "eth_getTransactionReceipt", tx)["logs"][0]["topics"][2] == topic(PAY_TO)
    late = facilitator.settle(signed, requirements)  # the facilitator comes second
    assert (late["success"], late["errorReason"]) == (False, NONCE_USED)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - 1000


def test_no_one_but_the_witness_facilitator_may_settle_upto(facilitator, upto, key, payer):
    signed = sign_upto(upto, key)
    args = settle_args(signed, 10)
    types = ["((address,uint256),uint256,uint256)", "uint256", "address", "(address,address,uint256)", "bytes"]
    data = keccak(text=f"settle({','.join(types)})")[:4] + abi_encode(types, list(args))
    answer = send_raw(facilitator.url, sign_transaction(new_private_key(), UPTO_PROXY, data))
    assert answer["error"]["code"] == 3 and "UnauthorizedFacilitator" in answer["error"]["message"]
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE
    assert facilitator.settle(signed, charge(upto, 10))["success"] is True  # the authorization is intact


def test_a_raw_transaction_the_chain_cannot_read_is_an_invalid_params_error(facilitator, key):
    assert send_raw(facilitator.url, "0xdeadbeef")["error"]["code"] == -32602
    assert send_raw(facilitator.url, sign_transaction(key, PERMIT2, b"\x01\x02\x03\x04"))["error"]["code"] == -32602
    invalidate = keccak(text="invalidateUnorderedNonces(uint256,uint256)")[:4] + abi_encode(["uint256"] * 2, [0, 1])
    tx = {"type": 2, "chainId": 1, "nonce": 0, "to": PERMIT2, "value": 0, "data": invalidate}
    other_chain = Account.sign_transaction({**tx, "gas": 1, "maxFeePerGas": 1, "maxPriorityFeePerGas": 1}, key)
    answer = send_raw(facilitator.url, "0x" + bytes(other_chain.raw_transaction).hex())
    assert answer["error"] == {"code": -32000, "message": "invalid chain id"}
    assert eth_call(facilitator.url, PERMIT2, "nonceBitmap(address,uint256)", Account.from_key(key).address, 0) == 0


# -- exact by Permit2 ---------------------------------------------------------------


def test_exact_by_permit2_moves_the_price_once(facilitator, key, payer):
    requirements = {**PRICE, "extra": PERMIT2_EXTRA}
    signed = sign_payment(exact_payment_required(extra=PERMIT2_EXTRA), key)  # the x402 client, a fresh key
    assert signed["payload"]["permit2Authorization"]["spender"] == EXACT_PROXY
    assert facilitator.verify(signed, requirements) == {"isValid": True, "payer": payer}
    settled = facilitator.settle(signed, requirements)
    assert settled["success"] is True and settled["amount"] == "1000"
    assert balances(facilitator.url, payer, PAY_TO) == [DEFAULT_INITIAL_BALANCE - 1000, DEFAULT_INITIAL_BALANCE + 1000]
    moved, done = rpc(facilitator.url, "eth_getTransactionReceipt", settled["transaction"])["logs"]
    assert moved["topics"] == [TRANSFER_TOPIC, topic(payer), topic(PAY_TO)] and int(moved["data"], 16) == 1000
    assert done["address"] == EXACT_PROXY.lower()
    again = facilitator.settle(signed, requirements)
    assert (again["success"], again["errorReason"]) == (False, NONCE_USED)
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - 1000


def test_a_permit2_nonce_is_spent_once_across_both_proxies(facilitator, upto, key, payer):
    """Permit2's nonces are the owner's, whatever the spender: an exact settle spends upto's nonce too."""
    exact = sign_payment(exact_payment_required(extra=PERMIT2_EXTRA), key)
    nonce = exact["payload"]["permit2Authorization"]["nonce"]
    same_nonce = resign_permit2(sign_upto(upto, key), key, nonce=nonce)
    assert facilitator.settle(exact, {**PRICE, "extra": PERMIT2_EXTRA})["success"] is True
    assert facilitator.settle(same_nonce, charge(upto, 10))["errorReason"] == NONCE_USED
    assert balances(facilitator.url, payer)[0] == DEFAULT_INITIAL_BALANCE - 1000


def test_x402_v1_has_no_permit2(facilitator, key):
    signed = sign_payment(exact_payment_required(extra=PERMIT2_EXTRA), key)
    v1 = {"x402Version": 1, "scheme": "exact", "network": "base-sepolia", "payload": signed["payload"]}
    body = {"x402Version": 1, "paymentPayload": v1, "paymentRequirements": {**PRICE_V1, "extra": PERMIT2_EXTRA}}
    assert facilitator.http.post("/verify", json=body).json()["invalidReason"] == "unsupported_asset_transfer_method"
    assert facilitator.http.post("/settle", json=body).json()["errorReason"] == "unsupported_asset_transfer_method"


# -- the contracts on their own ----------------------------------------------------


def chain(initial_balance: int = DEFAULT_INITIAL_BALANCE) -> tuple[LedgerEvmSigner, Permit2Contracts]:
    ledger = DevLedger(":memory:", initial_balance=initial_balance)
    contracts = Permit2Contracts(ledger)
    return LedgerEvmSigner(ledger, contracts=[contracts]), contracts


def settle_args(signed: dict[str, Any], amount: int) -> tuple[Any, ...]:
    auth = signed["payload"]["permit2Authorization"]
    permit = ((auth["permitted"]["token"], int(auth["permitted"]["amount"])), int(auth["nonce"]), int(auth["deadline"]))
    witness = (auth["witness"]["to"], auth["witness"]["facilitator"], int(auth["witness"]["validAfter"]))
    return permit, amount, auth["from"], witness, bytes.fromhex(signed["payload"]["signature"][2:])


@pytest.fixture(scope="module")
def offer() -> dict[str, Any]:
    kind = {
        "x402Version": 2,
        "scheme": "upto",
        "network": DEV_NETWORK,
        "extra": {"facilitatorAddress": FACILITATOR_ADDRESS},
    }
    return upto_offer(kind, CEILING)


def test_the_upto_proxy_enforces_what_the_deployed_one_does(offer):
    (signer, contracts), key = chain(), new_private_key()
    signed = sign_upto(offer, key)

    def reverts(args: tuple[Any, ...], sender: str = FACILITATOR_ADDRESS) -> str:
        with pytest.raises(LedgerRevert) as caught:
            contracts.transact(UPTO_PROXY, "settle", args, sender)
        return caught.value.reason

    assert reverts(settle_args(signed, CEILING + 1)) == "AmountExceedsPermitted()"
    assert reverts(settle_args(signed, 10), sender=OTHER_ADDRESS) == "UnauthorizedFacilitator()"
    assert reverts(settle_args(signed, 0)) == "InvalidAmount()"
    expired = resign_permit2(signed, key, deadline=int(time.time()) - 1)
    assert reverts(settle_args(expired, 10)).startswith("SignatureExpired(")
    early = resign_permit2(signed, key, validAfter=int(time.time()) + 600)
    assert reverts(settle_args(early, 10)) == "PaymentTooEarly()"
    assert reverts(settle_args(resign_permit2(signed, new_private_key()), 10)) == "InvalidSigner()"
    redirected = (*settle_args(signed, 10)[:3], (OTHER_ADDRESS, FACILITATOR_ADDRESS, 0), settle_args(signed, 10)[4])
    assert reverts(redirected) == "InvalidSigner()"  # the witness's `to` is signed: funds go nowhere else
    payer = Account.from_key(key).address
    assert signer.get_balance(payer, USDC_BASE_SEPOLIA) == DEFAULT_INITIAL_BALANCE  # nothing moved yet
    tx = signer.write_contract(UPTO_PROXY, X402_UPTO_PERMIT2_PROXY_ABI, "settle", *settle_args(signed, 10))
    assert TX_HASH.match(tx) and signer.wait_for_transaction_receipt(tx).status == 1
    assert signer.get_balance(payer, USDC_BASE_SEPOLIA) == DEFAULT_INITIAL_BALANCE - 10
    assert reverts(settle_args(signed, 10)) == "InvalidNonce()"  # the same nonce, the same owner
    poor, _ = chain(initial_balance=5)
    with pytest.raises(LedgerRevert, match="exceeds balance"):
        poor.write_contract(UPTO_PROXY, X402_UPTO_PERMIT2_PROXY_ABI, "settle", *settle_args(sign_upto(offer, key), 6))


def test_an_eth_call_of_settle_checks_everything_and_changes_nothing(offer):
    (signer, contracts), key = chain(), new_private_key()
    signed = sign_upto(offer, key)
    payer = Account.from_key(key).address
    selector = keccak(
        text="settle(((address,uint256),uint256,uint256),uint256,address,(address,address,uint256),bytes)"
    )
    types = ["((address,uint256),uint256,uint256)", "uint256", "address", "(address,address,uint256)", "bytes"]
    data = "0x" + (selector[:4] + abi_encode(types, list(settle_args(signed, 10)))).hex()
    node = ChainRpc(signer)
    assert node.answer("eth_call", [{"to": UPTO_PROXY, "data": data, "from": FACILITATOR_ADDRESS}]) == "0x"
    with pytest.raises(JsonRpcError, match="UnauthorizedFacilitator"):  # eth_call's msg.sender is its `from`
        node.answer("eth_call", [{"to": UPTO_PROXY, "data": data, "from": OTHER_ADDRESS}])
    assert signer.get_balance(payer, USDC_BASE_SEPOLIA) == DEFAULT_INITIAL_BALANCE
    assert contracts.settlements() == [] and not contracts.nonce_used(payer, int(settle_args(signed, 0)[0][1]))


@settings(max_examples=40, deadline=None)
@given(
    ceiling=st.integers(min_value=1, max_value=10**6),  # the x402 client signs up to 1 USDC by default
    fractions=st.lists(st.fractions(min_value=0, max_value=2), min_size=1, max_size=4),
)
def test_property_an_upto_authorization_moves_the_first_charge_within_its_ceiling_once(offer, ceiling, fractions):
    """Whatever charges are asked of one authorization, the chain moves exactly one of them, the first
    between 1 and the ceiling, and never more than the ceiling; the others move nothing."""
    (signer, _), key = chain(), new_private_key()
    requirements = {**offer, "amount": str(ceiling)}
    payload = PaymentPayload.model_validate(sign_upto(requirements, key))
    scheme = UptoEvmFacilitatorScheme(signer)
    payer = Account.from_key(key).address
    amounts = [int(ceiling * f) for f in fractions]
    for amount in amounts:
        answer = scheme.settle(payload, PaymentRequirements.model_validate(charge(requirements, amount)))
        moved = DEFAULT_INITIAL_BALANCE - signer.get_balance(payer, USDC_BASE_SEPOLIA)
        assert moved <= ceiling
        if answer.success and answer.amount != "0":
            assert moved == amount == int(answer.amount)
            break
        assert moved == 0
    expected = next((a for a in amounts if 0 < a <= ceiling), 0)
    assert DEFAULT_INITIAL_BALANCE - signer.get_balance(payer, USDC_BASE_SEPOLIA) == expected
    assert signer.get_balance(PAY_TO, USDC_BASE_SEPOLIA) == DEFAULT_INITIAL_BALANCE + expected
    again = scheme.settle(payload, PaymentRequirements.model_validate(charge(requirements, 1)))
    assert again.success is (expected == 0)  # a spent nonce is spent; an unspent one still pays


def test_exact_by_permit2_rows_do_not_confuse_the_eip3009_reads(facilitator, key, payer):
    """A Permit2 settlement is not an EIP-3009 one: its nonce is no token authorization."""
    signed = sign_payment(exact_payment_required(extra=PERMIT2_EXTRA), key)
    settled = facilitator.settle(signed, {**PRICE, "extra": PERMIT2_EXTRA})
    assert settled["success"] is True
    ledger = facilitator.ledger()
    assert ledger["settlements"] == [] and len(ledger["permit2_settlements"]) == 1
    nonce = int(signed["payload"]["permit2Authorization"]["nonce"])
    assert eth_call(facilitator.url, USDC_BASE_SEPOLIA, "authorizationState(address,bytes32)", payer, nonce) == 0


def test_dev_ledger_balance_query_refuses_a_bad_address(facilitator):
    answer = facilitator.http.get("/dev/ledger", params={"address": "nope"})
    assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request")
    assert "balances" not in httpx.get(f"{facilitator.url}/dev/ledger").json()


# -- a2a-gate-devnet pay, against the x402 package's own upto resource server ---------


def test_devnet_pay_pays_an_upto_priced_resource_the_actual_charge(facilitator):
    """`a2a-gate-devnet pay` (the x402 httpx client with its upto scheme) against the x402 package's
    own resource server (its Starlette middleware, an upto route that settles 10 per character)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from x402 import x402ResourceServer
    from x402.http import FacilitatorConfig, HTTPFacilitatorClient
    from x402.http.middleware.fastapi import PaymentMiddlewareASGI, set_settlement_overrides
    from x402.mechanisms.evm.upto import UptoEvmServerScheme

    from tests.support.serve import serve_app

    async def metered(request: Request) -> JSONResponse:
        text = (await request.json())["params"]["message"]["parts"][0]["text"]
        response = JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"echo": text}})
        set_settlement_overrides(response, {"amount": str(10 * len(text))})  # the actual charge
        return response

    server = x402ResourceServer(HTTPFacilitatorClient(FacilitatorConfig(url=facilitator.url)))
    server.register(DEV_NETWORK, UptoEvmServerScheme())
    price = {"amount": str(CEILING), "asset": USDC_BASE_SEPOLIA}
    accepts = {"scheme": "upto", "payTo": PAY_TO, "price": price, "network": DEV_NETWORK}
    app = Starlette(routes=[Route("/metered", metered, methods=["POST"])])
    app.add_middleware(PaymentMiddlewareASGI, routes={"POST /metered": {"accepts": accepts}}, server=server)
    with serve_app(app) as url:
        outcomes = [run_pay(f"{url}/metered", text) for text in ("short", "a somewhat longer answer")]
    for outcome, text in zip(outcomes, ("short", "a somewhat longer answer"), strict=True):
        assert outcome["http_status"] == 200 and outcome["answer"]["result"] == {"echo": text}
        receipt = outcome["payment_response"]
        assert receipt["success"] is True and receipt["amount"] == str(10 * len(text))
        [payer_balance] = balances(facilitator.url, outcome["payer"])
        assert payer_balance == DEFAULT_INITIAL_BALANCE - 10 * len(text) > DEFAULT_INITIAL_BALANCE - CEILING
    rows = facilitator.ledger()["permit2_settlements"]
    assert [(r["amount"], r["permitted_amount"]) for r in rows] == [("50", "5000"), ("240", "5000")]


def run_pay(url: str, text: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "devnet", "pay", url, text], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("flags", "schemes"),
    [([], {"exact", "upto", "batch-settlement"}), (["--no-permit2"], {"exact", "batch-settlement"})],
)
def test_the_facilitator_serve_starts_serves_upto_unless_told_not_to(tmp_path, flags, schemes):
    """What `a2a-gate serve --dev-facilitator PORT` runs (`python -m devnet facilitator`) serves upto."""
    import subprocess
    import sys

    from gate.processes import wait_for
    from tests.support.gate_process import free_port

    port = free_port()
    command = [sys.executable, "-m", "devnet", "facilitator", "--port", str(port), "--db", str(tmp_path / "l.db")]
    process = subprocess.Popen([*command, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", process)
        kinds = httpx.get(f"http://127.0.0.1:{port}/supported").json()["kinds"]
        assert {k["scheme"] for k in kinds if k["x402Version"] == 2} == schemes
    finally:
        process.terminate()
        process.wait(timeout=10)


FIELDS = [
    ("from",),
    ("spender",),
    ("nonce",),
    ("deadline",),
    ("permitted", "token"),
    ("permitted", "amount"),
    ("witness", "to"),
    ("witness", "facilitator"),
    ("witness", "validAfter"),
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=80) | st.sampled_from(["0x", "0x" + "ab" * 20, "1e3"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[helpers.Facilitator]:
    """One facilitator for every example of a property (hypothesis reruns the test, not its fixtures)."""
    from tests.support.serve import serve_app

    app = create_facilitator_app(str(tmp_path_factory.mktemp("fuzz") / "ledger.db"))
    with serve_app(app, wait_on_exit=False) as url:
        facilitator = helpers.Facilitator(url, app)
        yield facilitator
        facilitator.http.close()


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(FIELDS), value=json_values, settle=st.booleans())
def test_property_no_permit2_field_value_is_a_500(served, offer, path, value, settle):
    """Whatever a field of an upto authorization holds, verify and settle answer a verdict or a 400."""
    signed = sign_upto(offer, new_private_key())
    target = signed["payload"]["permit2Authorization"]
    for name in path[:-1]:
        target = target[name]
    target[path[-1]] = value
    answer = served.http.post("/settle" if settle else "/verify", json=request_body(signed, charge(offer, 10)))
    assert answer.status_code in (200, 400), answer.text
    verdict = answer.json()
    assert ("success" in verdict or "isValid" in verdict) if answer.status_code == 200 else "error" in verdict
