"""The development facilitator, end to end: real uvicorn, real SQLite, real signatures.

Payments are signed by ``devnet.payer`` (the x402 package's own client) and
decided by the x402 package's own exact-EVM facilitator schemes; only the chain
is simulated. Fault injection and malformed requests are in
``test_dev_facilitator_faults.py``, the ledger and signer on their own in
``test_dev_ledger.py``.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from eth_abi import encode
from eth_account import Account
from x402.http import FacilitatorConfig, HTTPFacilitatorClientSync
from x402.mechanisms.evm.constants import ERC6492_MAGIC_VALUE
from x402.schemas import PaymentPayload, PaymentRequirements

from devnet.facilitator import DEV_NETWORK
from devnet.ledger import DEFAULT_INITIAL_BALANCE
from devnet.payer import encode_header, new_private_key, sign_payment, sign_payment_v1
from tests.support import dev_facilitator_helpers as helpers
from tests.support.dev_facilitator_helpers import (
    BAD_SIGNATURE,
    EXPIRED,
    INSUFFICIENT,
    NONCE_USED,
    NOT_YET_VALID,
    OTHER_ADDRESS,
    PAY_TO,
    PRICE,
    PRICE_V1,
    TX_HASH,
    USDC_BASE_SEPOLIA,
    payment_required,
    request_body,
    resign,
    tamper,
)

pytestmark = pytest.mark.system  # real servers on loopback ports

# Shared fixtures, bound by assignment rather than imported by name: pytest finds
# fixtures among a module's attributes, and pyflakes would read every test
# parameter that names an imported fixture as a redefinition of an unused import.
start, facilitator, trusting = helpers.start, helpers.facilitator, helpers.trusting
key, payer, payload = helpers.key, helpers.payer, helpers.payload


# -- the payer ---------------------------------------------------------------


def test_sign_payment_produces_a_v2_payload_for_the_chosen_offer(key, payer):
    required = payment_required()
    required["accepts"].insert(0, {**PRICE, "amount": "5000"})
    payload = sign_payment(required, key, accept_index=1)

    assert payload["x402Version"] == 2
    assert payload["accepted"] == PRICE
    assert payload["resource"] == {"url": "http://127.0.0.1/a2a"}
    auth = payload["payload"]["authorization"]
    assert auth["from"] == payer
    assert auth["to"] == PAY_TO
    assert auth["value"] == "1000"
    assert re.fullmatch(r"0x[0-9a-f]{64}", auth["nonce"])
    assert re.fullmatch(r"0x[0-9a-f]{130}", payload["payload"]["signature"])
    with pytest.raises(IndexError):
        sign_payment(required, key, accept_index=2)


def test_encode_header_is_base64_of_compact_json(payload):
    decoded = base64.b64decode(encode_header(payload))
    assert json.loads(decoded) == payload
    assert b" " not in decoded


def test_new_private_key_is_a_fresh_key():
    first, second = new_private_key(), new_private_key()
    assert first != second
    assert re.fullmatch(r"0x[0-9a-f]{64}", first)
    Account.from_key(first)


# -- plain endpoints -----------------------------------------------------------


def test_supported_lists_v2_and_v1_exact_and_v2_upto_and_batch_settlement_on_base_sepolia(facilitator):
    body = facilitator.http.get("/supported").json()
    kinds = {(k["x402Version"], k["scheme"], k["network"]) for k in body["kinds"]}
    assert kinds == {
        (2, "exact", "eip155:84532"),
        (2, "upto", "eip155:84532"),
        (1, "exact", "base-sepolia"),
        (2, "batch-settlement", "eip155:84532"),
    }
    assert body["extensions"] == []
    [signer] = body["signers"]["eip155:*"]
    [upto] = [k for k in body["kinds"] if k["scheme"] == "upto"]
    assert upto["extra"] == {"facilitatorAddress": signer}  # the witness's facilitator, who alone may settle


def test_healthz(facilitator):
    response = facilitator.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


# -- verify and settle -------------------------------------------------------------


def test_valid_payment_verifies_with_the_payer_address(facilitator, payload, payer):
    assert facilitator.verify(payload) == {"isValid": True, "payer": payer}


def test_verify_is_a_dry_run(facilitator, payload, payer):
    for _ in range(3):
        assert facilitator.verify(payload)["isValid"] is True
    state = facilitator.ledger()
    assert state["settlements"] == []
    assert state["verify_calls"] == 3
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE


def test_settle_moves_the_balance_once(facilitator, payload, payer):
    result = facilitator.settle(payload)

    assert result["success"] is True
    assert result["payer"] == payer
    assert result["network"] == "eip155:84532"
    assert result["amount"] == "1000"
    assert TX_HASH.match(result["transaction"])
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000
    assert facilitator.balance(PAY_TO) == DEFAULT_INITIAL_BALANCE + 1000
    (settlement,) = facilitator.ledger()["settlements"]
    assert settlement["tx_hash"] == result["transaction"]
    assert settlement["from_address"] == payer
    assert settlement["to_address"] == PAY_TO
    assert settlement["amount"] == "1000"
    assert settlement["nonce"] == payload["payload"]["authorization"]["nonce"]


def test_a_nonce_settles_only_once(facilitator, payload, payer):
    assert facilitator.settle(payload)["success"] is True

    again = facilitator.settle(payload)
    assert again["success"] is False
    assert again["errorReason"] == NONCE_USED
    assert again["transaction"] == ""
    # verify simulates the transfer, so it sees the spent nonce too
    assert facilitator.verify(payload) == {
        "isValid": False,
        "invalidReason": NONCE_USED,
        "invalidMessage": "execution reverted: FiatTokenV2: authorization is used or canceled",
        "payer": payer,
    }
    assert len(facilitator.ledger()["settlements"]) == 1
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"amount": "2000"}, "invalid_exact_evm_payload_authorization_value_mismatch"),
        ({"amount": "999"}, "invalid_exact_evm_payload_authorization_value_mismatch"),
        ({"payTo": OTHER_ADDRESS}, "invalid_exact_evm_payload_recipient_mismatch"),
        ({"network": "eip155:8453"}, "network_mismatch"),
        ({"extra": {}}, "missing_eip712_domain"),
        # x402 never compares the asset directly: it is part of the signed
        # EIP-712 domain, so another asset means a signature that does not match.
        ({"asset": OTHER_ADDRESS}, BAD_SIGNATURE),
    ],
)
def test_payment_not_matching_the_requirements_is_invalid(facilitator, payload, change, reason):
    requirements = {**PRICE, **change}
    verdict = facilitator.verify(payload, requirements)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == reason

    settled = facilitator.settle(payload, requirements)
    assert settled["success"] is False
    assert settled["errorReason"] == reason
    assert facilitator.ledger()["settlements"] == []


def test_payment_signed_for_an_unsupported_network_is_invalid(facilitator, key):
    payload = sign_payment(payment_required(network="eip155:8453"), key)
    requirements = {**PRICE, "network": "eip155:8453"}
    verdict = facilitator.verify(payload, requirements)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == "invalid_network"
    settled = facilitator.settle(payload, requirements)
    assert settled["success"] is False
    assert settled["errorReason"] == "invalid_network"


def test_payment_in_a_token_the_chain_does_not_have_is_invalid(facilitator, key):
    payload = sign_payment(payment_required(asset=OTHER_ADDRESS), key)
    verdict = facilitator.verify(payload, {**PRICE, "asset": OTHER_ADDRESS})
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == "asset_not_deployed_contract"


def test_wrong_token_domain_name_is_caught_by_the_token(facilitator, key):
    # The signature matches the requirements' domain but not the token's real one.
    wrong = {**PRICE, "extra": {"name": "USD Coin", "version": "2"}}
    payload = sign_payment(payment_required(extra=wrong["extra"]), key)
    verdict = facilitator.verify(payload, wrong)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == BAD_SIGNATURE


def test_tampered_signature_is_invalid(facilitator, payload, payer):
    tampered = tamper(payload)
    verdict = facilitator.verify(tampered)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == BAD_SIGNATURE
    assert verdict["payer"] == payer

    settled = facilitator.settle(tampered)
    assert settled["success"] is False
    assert settled["errorReason"] == BAD_SIGNATURE
    assert facilitator.ledger()["settlements"] == []
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE


def test_payment_claiming_someone_elses_funds_is_invalid(facilitator, payload):
    forged = copy.deepcopy(payload)
    forged["payload"]["authorization"]["from"] = OTHER_ADDRESS
    verdict = facilitator.verify(forged)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == BAD_SIGNATURE
    assert facilitator.settle(forged)["success"] is False


def test_expired_authorization_is_invalid(facilitator, key):
    # The client sets validBefore = now + maxTimeoutSeconds; x402 wants 6 s of slack.
    payload = sign_payment(payment_required(maxTimeoutSeconds=1), key)
    verdict = facilitator.verify(payload)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == EXPIRED
    assert facilitator.settle(payload)["errorReason"] == EXPIRED


def test_authorization_valid_only_in_the_future_is_invalid(facilitator, payload, key):
    later = resign(payload, key, validAfter=int(time.time()) + 3600)
    assert facilitator.verify(resign(payload, key))["isValid"] is True  # resign itself is sound
    verdict = facilitator.verify(later)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == NOT_YET_VALID
    assert facilitator.settle(later)["errorReason"] == NOT_YET_VALID


def test_insufficient_balance(start, payload, payer):
    poor = start(initial_balance=999)
    verdict = poor.verify(payload)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == INSUFFICIENT
    settled = poor.settle(payload)
    assert settled["success"] is False
    assert settled["errorReason"] == INSUFFICIENT

    poor.app.state.ledger.set_balance(DEV_NETWORK, USDC_BASE_SEPOLIA, payer, 1000)
    assert poor.settle(payload)["success"] is True
    assert poor.balance(payer) == 0


def test_fifty_concurrent_settles_of_one_payload_settle_once(facilitator, payload, payer):
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(lambda _: facilitator.settle(payload), range(50)))

    successes = [r for r in results if r["success"]]
    assert len(successes) == 1
    assert {r["errorReason"] for r in results if not r["success"]} == {NONCE_USED}
    assert len(facilitator.ledger()["settlements"]) == 1
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000


def test_two_facilitators_sharing_one_ledger_settle_once(start, payload, payer):
    first = start("shared.db")
    second = start("shared.db")
    both = [first, second] * 25
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(lambda f: f.settle(payload), both))

    assert sum(r["success"] for r in results) == 1
    assert len(first.ledger()["settlements"]) == 1
    assert first.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000


def test_v1_payment_verifies_and_settles(facilitator, key, payer):
    payload = sign_payment_v1(PRICE_V1, key)
    assert payload["x402Version"] == 1
    assert payload["scheme"] == "exact"
    assert payload["network"] == "base-sepolia"

    assert facilitator.verify(payload, PRICE_V1) == {"isValid": True, "payer": payer}
    settled = facilitator.settle(payload, PRICE_V1)
    assert settled["success"] is True
    assert settled["network"] == "base-sepolia"
    assert settled["amount"] == "1000"
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000

    again = facilitator.settle(payload, PRICE_V1)
    assert again["success"] is False
    assert again["errorReason"] == NONCE_USED
    verdict = facilitator.verify(payload, PRICE_V1)
    assert verdict["invalidReason"] == NONCE_USED


def test_v1_payment_with_the_wrong_amount_is_invalid(facilitator, key):
    payload = sign_payment_v1(PRICE_V1, key)
    verdict = facilitator.verify(payload, {**PRICE_V1, "maxAmountRequired": "2000"})
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == "invalid_exact_evm_payload_authorization_value_mismatch"


def test_v1_tampered_signature_is_invalid(facilitator, key):
    payload = tamper(sign_payment_v1(PRICE_V1, key))
    verdict = facilitator.verify(payload, PRICE_V1)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == BAD_SIGNATURE


def test_v1_and_v2_share_the_chains_nonces(facilitator, key):
    v1 = sign_payment_v1(PRICE_V1, key)
    nonce = v1["payload"]["authorization"]["nonce"]
    v2 = resign(sign_payment(payment_required(), key), key, nonce=nonce)
    assert facilitator.settle(v1, PRICE_V1)["success"] is True
    assert facilitator.settle(v2)["errorReason"] == NONCE_USED


def test_without_permit2_a_permit2_payment_fails_cleanly(start, key):
    facilitator = start(permit2=False)
    assert [k["scheme"] for k in facilitator.http.get("/supported").json()["kinds"]] == [
        "exact",
        "batch-settlement",
        "exact",
    ]
    extra = {"name": "USDC", "version": "2", "assetTransferMethod": "permit2"}
    payload = sign_payment(payment_required(extra=extra), key)
    requirements = {**PRICE, "extra": extra}
    assert "permit2Authorization" in payload["payload"]
    verdict = facilitator.verify(payload, requirements)
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == "unsupported_asset_transfer_method"
    settled = facilitator.settle(payload, requirements)
    assert settled["success"] is False
    assert settled["errorReason"] == "unsupported_asset_transfer_method"


def test_smart_wallet_signatures_fail_cleanly(facilitator, payload):
    inner = bytes.fromhex(payload["payload"]["signature"][2:])
    wrapped = encode(["address", "bytes", "bytes"], [OTHER_ADDRESS, b"\x01\x02", inner])
    erc6492 = copy.deepcopy(payload)
    erc6492["payload"]["signature"] = "0x" + (wrapped + ERC6492_MAGIC_VALUE).hex()
    assert facilitator.verify(erc6492)["invalidReason"] == "eip6492_factory_not_allowed"
    assert facilitator.settle(erc6492)["errorReason"] == "eip6492_factory_not_allowed"

    eip1271 = copy.deepcopy(payload)
    eip1271["payload"]["signature"] = "0x" + (inner * 2).hex()
    reason = "invalid_exact_evm_payload_undeployed_smart_wallet"
    assert facilitator.verify(eip1271)["invalidReason"] == reason
    assert facilitator.settle(eip1271)["errorReason"] == reason
    assert facilitator.ledger()["settlements"] == []


# -- dev-trusting mode -------------------------------------------------------------


def test_trust_mode_accepts_a_tampered_signature_but_tracks_the_nonce(trusting, payload, payer):
    tampered = tamper(payload)
    assert trusting.verify(tampered) == {"isValid": True, "payer": payer}
    assert trusting.settle(tampered)["success"] is True
    assert trusting.balance(payer) == DEFAULT_INITIAL_BALANCE - 1000

    reused = tamper(payload, position=20)  # same nonce, different garbage
    assert trusting.verify(reused)["invalidReason"] == NONCE_USED
    again = trusting.settle(reused)
    assert again["success"] is False
    assert again["errorReason"] == NONCE_USED
    assert len(trusting.ledger()["settlements"]) == 1


def test_trust_mode_still_checks_amount_recipient_time_and_balance(start, key, payload):
    trusting = start(trust_signatures=True, initial_balance=500)
    assert trusting.verify(payload, {**PRICE, "amount": "2000"})["invalidReason"] == (
        "invalid_exact_evm_payload_authorization_value_mismatch"
    )
    assert trusting.verify(payload, {**PRICE, "payTo": OTHER_ADDRESS})["invalidReason"] == (
        "invalid_exact_evm_payload_recipient_mismatch"
    )
    expired = sign_payment(payment_required(maxTimeoutSeconds=1), key)
    assert trusting.verify(expired)["invalidReason"] == EXPIRED
    assert trusting.verify(payload)["invalidReason"] == INSUFFICIENT
    assert trusting.settle(payload)["errorReason"] == INSUFFICIENT


def test_trust_mode_v1(trusting, key, payer):
    payload = tamper(sign_payment_v1(PRICE_V1, key))
    assert trusting.verify(payload, PRICE_V1) == {"isValid": True, "payer": payer}
    assert trusting.settle(payload, PRICE_V1)["success"] is True
    assert trusting.settle(payload, PRICE_V1)["errorReason"] == NONCE_USED


# -- auth ----------------------------------------------------------------------------


def test_auth_token_is_required_except_for_healthz(start, payload):
    guarded = start(auth_token="s3cret")
    assert guarded.http.get("/healthz").status_code == 200
    for method, path in [
        ("POST", "/verify"),
        ("POST", "/settle"),
        ("GET", "/supported"),
        ("POST", "/dev/faults"),
        ("GET", "/dev/ledger"),
    ]:
        response = guarded.http.request(method, path, json=request_body(payload))
        assert response.status_code == 401, path
        assert response.json() == {"error": "unauthorized"}
    wrong = guarded.http.post("/verify", json=request_body(payload), headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401

    good = {"Authorization": "Bearer s3cret"}
    response = guarded.http.post("/verify", json=request_body(payload), headers=good)
    assert response.status_code == 200
    assert response.json()["isValid"] is True
    assert guarded.http.get("/dev/ledger", headers=good).json()["verify_calls"] == 1


# -- the x402 package's own HTTP facilitator client ---------------------------------------


def test_x402_http_facilitator_client_can_use_it(facilitator, payload, payer):
    client = HTTPFacilitatorClientSync(FacilitatorConfig(url=facilitator.url))
    model = PaymentPayload.model_validate(payload)
    requirements = PaymentRequirements.model_validate(PRICE)

    supported = client.get_supported()
    assert {k.network for k in supported.kinds} == {"eip155:84532", "base-sepolia"}
    verdict = client.verify(model, requirements)
    assert verdict.is_valid is True
    assert verdict.payer == payer
    settled = client.settle(model, requirements)
    assert settled.success is True
    assert settled.amount == "1000"
    assert client.settle(model, requirements).error_reason == NONCE_USED


# -- hygiene -----------------------------------------------------------------------


def test_signatures_are_never_logged(facilitator, payload, caplog):
    caplog.set_level(logging.DEBUG)
    facilitator.verify(payload)
    facilitator.settle(payload)
    facilitator.settle(payload)
    facilitator.verify(tamper(payload))
    signature = payload["payload"]["signature"]
    assert signature[2:].lower() not in caplog.text.lower()
    assert signature[10:40] not in caplog.text
