"""tasks/get and tasks/cancel for anonymous callers are bound to the payer.

Every failure answers the byte-identical -32001, so the answer is no oracle for
task ids.
"""

from __future__ import annotations

import time

import pytest

from devnet.payer import encode_header
from tests.support.paid import PaidView, Payer, send_body


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate and facilitator; each test counts only its own payer's work (PaidView)."""
    return shared_paid


def get_body(task_id: str, call_id: int = 7, method: str = "tasks/get") -> dict:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": {"id": task_id}}


def test_not_found_is_byte_identical_for_every_failure(paid):
    owner, stranger = Payer(), Payer()
    paying = owner.header_for(paid.gate.url)
    task = paid.post("paid", send_body("mine"), paying).json()["result"]
    stranger_paying = stranger.header_for(paid.gate.url)
    assert paid.post("paid", send_body("theirs"), stranger_paying).status_code == 200

    answers = {
        "no token": paid.post("paid", get_body(task["id"])),
        "bad token": paid.post("paid", get_body(task["id"]), {"PAYMENT-SIGNATURE": "bm90IGEgdG9rZW4="}),
        "unknown id": paid.post("paid", get_body("00000000-0000-0000-0000-000000000000"), paying),
        "another payer's task": paid.post("paid", get_body(task["id"]), stranger_paying),
        "forged fresh token": paid.post(
            "paid",
            get_body(task["id"]),
            {"PAYMENT-SIGNATURE": encode_header(_forged(stranger.token_for(paid.gate.url)))},
        ),
    }
    paid.faults(verify="http500")
    answers["facilitator down"] = paid.post("paid", get_body(task["id"]), stranger.header_for(paid.gate.url))
    paid.faults()
    expected = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"Task not found"}}'
    for name, response in answers.items():
        assert (response.status_code, response.content) == (200, expected), name

    mine = paid.post("paid", get_body(task["id"]), paying)
    assert mine.json()["result"]["id"] == task["id"]


def _forged(token: dict) -> dict:
    signature = token["payload"]["signature"]
    return {
        **token,
        "payload": {**token["payload"], "signature": signature[:-2] + ("00" if signature[-2:] != "00" else "11")},
    }


def test_a_fresh_token_of_the_same_payer_proves_ownership(paid):
    payer = Payer()
    task = paid.post("paid", send_body("x"), payer.header_for(paid.gate.url)).json()["result"]
    fresh = payer.header_for(paid.gate.url)  # never used to pay: it verifies to the same payer
    response = paid.post("paid", get_body(task["id"]), fresh)
    assert response.json()["result"]["id"] == task["id"]
    assert len(paid.ledger()["settlements"]) == 1  # proving ownership charges nothing


def test_token_in_params_metadata_proves_ownership(paid):
    payer = Payer()
    token = payer.token_for(paid.gate.url)
    task = paid.post("paid", send_body("x", metadata={"x402.payment.payload": token})).json()["result"]
    body = get_body(task["id"])
    body["params"]["metadata"] = {"x402.payment.payload": token}
    assert paid.post("paid", body).json()["result"]["id"] == task["id"]


def test_non_blocking_paid_send_can_be_polled_and_is_charged_after_delivery(paid):
    paying = Payer().header_for(paid.gate.url, "paid-slow")
    first = paid.post("paid-slow", send_body("sleep 1", blocking=False), paying).json()["result"]
    assert first["status"]["state"] in ("submitted", "working")
    assert paid.ledger()["settle_calls"] == 0
    deadline = time.monotonic() + 20
    state = first["status"]["state"]
    while state not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        polled = paid.post("paid-slow", get_body(first["id"]), paying).json()["result"]
        state = polled["status"]["state"]
    assert state == "completed"
    assert polled["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_payer_cancels_running_work_and_is_not_charged(paid):
    paying = Payer().header_for(paid.gate.url, "paid-slow")
    task = paid.post("paid-slow", send_body("sleep 5", blocking=False), paying).json()["result"]
    canceled = paid.post("paid-slow", get_body(task["id"], method="tasks/cancel"), paying).json()["result"]
    assert canceled["status"]["state"] == "canceled"
    time.sleep(0.3)
    assert paid.ledger()["settle_calls"] == 0
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
    again = paid.post("paid-slow", get_body(task["id"], method="tasks/cancel"), paying).json()
    assert again["error"]["code"] == -32002


def test_interrupted_paid_task_is_not_charged_and_continues_with_a_new_payment(paid):
    payer = Payer()
    first = paid.post("paid-interrupting", send_body("weather?"), payer.header_for(paid.gate.url, "paid-interrupting"))
    task = first.json()["result"]
    assert task["status"]["state"] == "input-required"
    assert paid.ledger()["settle_calls"] == 0
    second = paid.post(
        "paid-interrupting",
        send_body("Paris", task_id=task["id"]),
        payer.header_for(paid.gate.url, "paid-interrupting"),
    )
    done = second.json()["result"]
    assert done["id"] == task["id"] and done["status"]["state"] == "completed"
    assert done["artifacts"][-1]["parts"][0]["text"] == "weather in Paris: sunny"
    assert len(paid.ledger()["settlements"]) == 1
    # another payer cannot continue someone else's task
    third = paid.post(
        "paid-interrupting", send_body("x", task_id=task["id"]), Payer().header_for(paid.gate.url, "paid-interrupting")
    )
    assert third.json()["error"]["code"] == -32001
