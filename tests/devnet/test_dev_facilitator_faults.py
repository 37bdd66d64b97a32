"""The development facilitator misbehaving on purpose, and refusing bad requests.

``POST /dev/faults`` makes the next verify/settle calls slow, failing, garbled
or refused; malformed verify/settle bodies must get a 400, never a crash.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from devnet.ledger import DEFAULT_INITIAL_BALANCE
from devnet.payer import sign_payment_v1
from tests.support import dev_facilitator_helpers as helpers
from tests.support.dev_facilitator_helpers import PRICE, PRICE_V1, request_body

# Shared fixtures, bound by assignment rather than imported by name: pytest finds
# fixtures among a module's attributes, and pyflakes would read every test
# parameter that names an imported fixture as a redefinition of an unused import.
start, facilitator = helpers.start, helpers.facilitator
key, payer, payload = helpers.key, helpers.payer, helpers.payload


# -- fault injection ---------------------------------------------------------------


def test_slow_fault_delays_then_answers_normally(facilitator, payload):
    facilitator.faults({"verify": "slow:0.5", "count": 1})
    started = time.monotonic()
    assert facilitator.verify(payload)["isValid"] is True
    assert time.monotonic() - started >= 0.5

    started = time.monotonic()
    assert facilitator.verify(payload)["isValid"] is True
    assert time.monotonic() - started < 0.5


def test_slow_settle_fault_still_settles(facilitator, payload):
    facilitator.faults({"settle": "slow:0.3"})
    started = time.monotonic()
    assert facilitator.settle(payload)["success"] is True
    assert time.monotonic() - started >= 0.3


def test_http500_fault(facilitator, payload):
    facilitator.faults({"verify": "http500", "settle": "http500", "count": 1})
    assert facilitator.http.post("/verify", json=request_body(payload)).status_code == 500
    response = facilitator.http.post("/settle", json=request_body(payload))
    assert response.status_code == 500
    assert response.json()["error"] == "dev_fault"
    assert facilitator.ledger()["settlements"] == []
    # count=1: the next calls are normal
    assert facilitator.verify(payload)["isValid"] is True
    assert facilitator.settle(payload)["success"] is True


def test_malformed_fault_answers_200_with_a_non_json_body(facilitator, payload):
    facilitator.faults({"verify": "malformed", "settle": "malformed"})
    for path in ("/verify", "/settle"):
        response = facilitator.http.post(path, json=request_body(payload))
        assert response.status_code == 200
        with pytest.raises(ValueError):
            response.json()
    assert facilitator.ledger()["settlements"] == []


def test_invalid_fault_refuses_without_charging(facilitator, payload, payer):
    facilitator.faults({"verify": "invalid", "settle": "invalid"})
    assert facilitator.verify(payload) == {
        "isValid": False,
        "invalidReason": "dev_fault",
        "payer": payer,
    }
    assert facilitator.settle(payload) == {
        "success": False,
        "errorReason": "dev_fault",
        "payer": payer,
        "transaction": "",
        "network": "eip155:84532",
    }
    assert facilitator.ledger()["settlements"] == []
    assert facilitator.balance(payer) == DEFAULT_INITIAL_BALANCE
    # the refusal does not depend on the body making sense
    response = facilitator.http.post("/verify", content=b"garbage")
    assert response.json() == {"isValid": False, "invalidReason": "dev_fault"}


def test_fault_without_count_lasts_until_reset(facilitator, payload):
    snapshot = facilitator.faults({"settle": "invalid"})
    assert snapshot == {
        "verify": {"mode": "none", "remaining": None},
        "settle": {"mode": "invalid", "remaining": None},
    }
    for _ in range(3):
        assert facilitator.settle(payload)["errorReason"] == "dev_fault"
    assert facilitator.verify(payload)["isValid"] is True  # verify is unaffected

    facilitator.faults({})
    assert facilitator.settle(payload)["success"] is True


def test_fault_count_applies_per_kind(facilitator, payload):
    facilitator.faults({"verify": "invalid", "settle": "invalid", "count": 2})
    assert [facilitator.verify(payload)["isValid"] for _ in range(3)] == [False, False, True]
    assert [facilitator.settle(payload)["success"] for _ in range(3)] == [False, False, True]


def test_calls_are_counted_including_faulted_ones(facilitator, payload):
    facilitator.faults({"verify": "http500", "count": 1})
    facilitator.http.post("/verify", json=request_body(payload))
    facilitator.verify(payload)
    facilitator.settle(payload)
    state = facilitator.ledger()
    assert state["verify_calls"] == 2
    assert state["settle_calls"] == 1
    assert len(state["settlements"]) == 1


@pytest.mark.parametrize(
    "spec",
    [
        {"verify": "explode"},
        {"verify": "slow:soon"},
        {"verify": "slow:-1"},
        {"settle": 5},
        {"count": -1},
        {"count": "2"},
        {"verify": "invalid", "typo": 1},
        [],
    ],
)
def test_bad_fault_spec_is_rejected(facilitator, spec):
    response = facilitator.http.post("/dev/faults", json=spec)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_fault"


# -- malformed requests ----------------------------------------------------------------


def _malformed_bodies(payload: dict[str, Any]) -> list[Any]:
    def with_auth(**fields: Any) -> dict:
        changed = copy.deepcopy(payload)
        changed["payload"]["authorization"].update(fields)
        return request_body(changed)

    def with_payload(**fields: Any) -> dict:
        return request_body({**copy.deepcopy(payload), **fields})

    no_version = copy.deepcopy(payload)
    del no_version["x402Version"]
    no_signature_hex = copy.deepcopy(payload)
    no_signature_hex["payload"]["signature"] = "0xnothex"
    return [
        b"",
        b"not json",
        b'{"paymentPayload": ',
        b"[]",
        b"[" * 100_000,
        b"\xff\xfe",
        b'"a string"',
        {},
        {"paymentPayload": payload},
        {"paymentPayload": "x", "paymentRequirements": PRICE},
        {"paymentPayload": no_version, "paymentRequirements": PRICE},
        with_payload(x402Version=3),
        {**request_body(payload), "x402Version": 1},
        with_payload(accepted=None),
        with_payload(payload={}),
        with_payload(payload={"authorization": "nope"}),
        with_auth(value="1e3"),
        with_auth(value=""),
        with_auth(value=-5),
        with_auth(value="1" * 5000),
        with_auth(value=str(2**256)),
        with_auth(value="\uff11\uff12"),  # fullwidth digits: str.isdigit() says yes
        with_auth(nonce="0x" + "ab " * 32),
        with_auth(validBefore=None),
        with_auth(nonce="0x1234"),
        with_auth(nonce=12),
        with_auth(**{"from": "alice"}),
        with_auth(to="0x12"),
        request_body(no_signature_hex),
        request_body(payload, {**PRICE, "amount": "ten"}),
        request_body(payload, {**PRICE, "payTo": "bob"}),
        request_body(payload, {**PRICE, "maxTimeoutSeconds": "soon"}),
        request_body(payload, {"scheme": "exact"}),
        request_body(payload, []),
    ]


@pytest.mark.parametrize("path", ["/verify", "/settle"])
def test_malformed_bodies_get_400(facilitator, payload, path):
    for body in _malformed_bodies(payload):
        if isinstance(body, bytes):
            response = facilitator.http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            response = facilitator.http.post(path, json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"] == "invalid_request"
    assert facilitator.ledger()["settlements"] == []
    # and the server is fine afterwards
    assert facilitator.verify(payload)["isValid"] is True


def test_v1_malformed_requirements_get_400(facilitator, key):
    payload = sign_payment_v1(PRICE_V1, key)
    for requirements in (
        {**PRICE_V1, "maxAmountRequired": "lots"},
        {k: v for k, v in PRICE_V1.items() if k != "resource"},
    ):
        response = facilitator.http.post("/verify", json=request_body(payload, requirements))
        assert response.status_code == 400


def test_oversized_body_is_refused(facilitator):
    response = facilitator.http.post("/verify", content=b"{" + b" " * (2 * 1024 * 1024) + b"}")
    assert response.status_code == 413  # Starlette's own body limit answers this one
