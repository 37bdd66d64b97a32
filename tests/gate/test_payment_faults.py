"""Facilitator faults: each has its specified answer, and none of them charges.

Our outage never reads as the payer's rejection (-32603 verify_unavailable, the
claim released), and a settle that fails after delivery keeps the work delivered,
owes the charge, and is settled exactly once later.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.support import gate_helpers
from tests.support.gate_process import free_port
from tests.support.paid import PaidView, Payer, paid_config, send_body


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate, each test with its own payer and counts (PaidView); the
    reconcile command settles every owed claim of a gate, so its test has a gate of its own."""
    return shared_paid


VERIFY_UNAVAILABLE = {
    "code": -32603,
    "message": "Payment verification unavailable",
    "data": {"code": "verify_unavailable", "retryable": True},
}


@pytest.mark.parametrize("mode", ["slow:3", "http500", "malformed"])
def test_verify_outage_is_retryable_and_releases_the_claim(paid, mode):
    headers = Payer().header_for(paid.gate.url)
    paid.faults(verify=mode, count=1)
    response = paid.post("paid", send_body("x"), headers)
    assert response.status_code == 200
    assert response.json()["error"] == VERIFY_UNAVAILABLE
    assert paid.count_tasks("paid") == 0
    retry = paid.post("paid", send_body("x"), headers)  # the same token works once the facilitator does
    assert retry.json()["result"]["status"]["state"] == "completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_invalid_verdict_is_a_payment_rejection(paid):
    paid.faults(verify="invalid", count=1)
    response = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url))
    assert response.status_code == 403
    assert response.json() == {"detail": "Payment verification failed", "error": "dev_fault"}
    assert paid.ledger()["settlements"] == []


def test_refused_connection_is_verify_unavailable(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", dead)), port=port)
    # sign against the real price, then send it to a gate whose facilitator is down
    response = httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"))
    from devnet.payer import encode_header, sign_payment
    from tests.support.paid import decode_header

    token = sign_payment(decode_header(response.headers["PAYMENT-REQUIRED"]), Payer().key)
    answer = httpx.post(
        f"{gate.url}/a2a/paid", json=send_body("x"), headers={"PAYMENT-SIGNATURE": encode_header(token)}
    )
    assert answer.status_code == 200 and answer.json()["error"] == VERIFY_UNAVAILABLE


def test_settle_failing_then_recovering_settles_exactly_once(paid):
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="http500")  # every settle attempt fails until reset
    response = paid.post("paid", send_body("owed"), headers)
    task = response.json()["result"]
    assert task["status"]["state"] == "completed"  # the work was delivered and is kept
    assert task["artifacts"][0]["parts"][0]["text"] == "owed"
    metadata = task["status"]["message"]["metadata"]
    assert metadata["x402.payment.status"] == "payment-verified"
    assert metadata["x402.payment.error"].startswith("settle_unavailable")
    assert "PAYMENT-RESPONSE" not in response.headers
    assert paid.ledger()["settlements"] == []
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle_failed"]

    paid.faults()  # the facilitator recovers
    early = paid.post("paid", send_body("owed"), headers)  # the payer's retry answers from the claim ...
    assert early.headers["X-Idempotent-Replay"] == "true"
    assert early.json()["result"]["metadata"]["x402.payment.status"] == "payment-verified"
    assert paid.ledger()["settlements"] == []  # ... and spends no pass: the next one is not due
    gate_helpers.cli("reconcile", "--config", str(paid.gate.config))  # a pass collects it
    replay = paid.post("paid", send_body("owed"), headers)
    assert replay.headers["X-Idempotent-Replay"] == "true"
    assert replay.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert "PAYMENT-RESPONSE" in replay.headers
    again = paid.post("paid", send_body("owed"), headers)
    assert again.json()["result"]["id"] == task["id"]
    assert len(paid.ledger()["settlements"]) == 1
    assert paid.count_tasks("paid") == 1


def test_reconcile_command_settles_owed_work_once(own_paid):
    paid = own_paid
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="http500")
    task = paid.post("paid", send_body("later"), headers).json()["result"]
    command = [sys.executable, "-m", "gate.cli", "reconcile", "--config", str(paid.gate.config)]
    failing = subprocess.run(command, capture_output=True, text=True, timeout=60)  # still failing: say so
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "1 owed settlement(s) attempted: 1 settle_failed" in failing.stdout
    paid.faults()
    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "payment-completed" in first.stdout and "1 owed settlement(s) attempted: 1 settled" in first.stdout
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "0 owed settlement(s) attempted" in second.stdout
    assert len(paid.ledger()["settlements"]) == 1
    fetched = paid.post(
        "paid", {"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": {"id": task["id"]}}, headers
    )
    assert fetched.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle_failed", "settle_failed", "settle"]


def test_settle_refusal_the_gate_cannot_read_keeps_delivery_and_owes(paid):
    """An unknown refusal reason is "unknown", not "failed": retried, and owed while it lasts."""
    paid.faults(settle="invalid")
    task = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url)).json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-verified"
    assert task["metadata"]["x402.payment.error"] == "dev_fault"
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle_failed"]


def test_one_unreadable_refusal_is_retried_at_once(paid):
    paid.faults(settle="invalid", count=1)
    task = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url)).json()["result"]
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_client_disconnect_never_cancels_paid_work_or_its_settlement(paid):
    headers = Payer().header_for(paid.gate.url, "paid-slow")
    with pytest.raises(httpx.ReadTimeout):
        paid.post("paid-slow", send_body("sleep 1"), headers, timeout=0.3)  # the caller hangs up mid-work
    deadline = time.monotonic() + 15
    while not paid.ledger()["settlements"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(paid.ledger()["settlements"]) == 1
    replay = paid.post("paid-slow", send_body("sleep 1"), headers)  # the retry gets the delivered work
    assert replay.headers["X-Idempotent-Replay"] == "true"
    assert replay.json()["result"]["artifacts"][0]["parts"][0]["text"] == "slept 1"
