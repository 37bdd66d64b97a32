"""`a2a-gate-devnet pay` exits 0 only for a paid answer: what each other answer says on its one line.

The processes themselves (a refusal, an unreachable gate, an offer the client cannot sign) are run
by tests/system/test_install_extras.py from a newcomer's virtualenv (the gate and ./devnet alone);
these are the answers a development gate rarely gives on demand.
"""

from __future__ import annotations

import pytest

from devnet.cli import not_paid

RECEIPT = {"success": True, "transaction": "0xab", "network": "eip155:84532", "amount": "1000"}


def task(state: str, **metadata: object) -> dict:
    return {"kind": "task", "id": "t", "status": {"state": state}, "metadata": metadata}


def outcome(answer: object, status: int = 200, **extra: object) -> dict:
    return {"payer": "0x1", "http_status": status, "answer": answer, **extra}


PAID = task("completed", **{"x402.payment.status": "payment-completed", "x402.payment.receipts": [RECEIPT]})


def test_a_paid_answer_is_success() -> None:
    assert not_paid(outcome({"jsonrpc": "2.0", "id": 1, "result": PAID}, payment_response=RECEIPT)) == ""
    three = outcome({"result": PAID}, payment_response=RECEIPT, payment_responses=[RECEIPT] * 3)
    assert not_paid(three, 3) == ""


@pytest.mark.parametrize(
    ("result", "count", "says"),
    [
        (outcome({"detail": "Payment required"}, 402), 1, "HTTP 402: Payment required"),
        (
            outcome({"detail": "Payment verification failed", "error": "insufficient_funds"}, 403),
            1,
            "insufficient_funds",
        ),
        (outcome("<html>bad gateway</html>", 502), 1, "HTTP 502"),
        (
            outcome(
                {
                    "error": {
                        "code": -32603,
                        "message": "Payment verification unavailable",
                        "data": {"code": "verify_unavailable", "retryable": True},
                    }
                }
            ),
            1,
            "JSON-RPC error -32603 (verify_unavailable)",
        ),
        (
            outcome({"result": task("failed", **{"x402.payment.status": "payment-failed"})}),
            1,
            "the task ended failed (payment-failed)",
        ),
        (
            outcome(
                {
                    "result": task(
                        "completed",
                        **{"x402.payment.status": "payment-verified", "x402.payment.error": "settle_timeout"},
                    )
                }
            ),
            1,
            "not paid: payment-verified: settle_timeout",
        ),
        (outcome({"result": task("completed")}), 1, "not paid: no payment status"),
        (outcome({"result": PAID}), 1, "0 of 1 requests carry a payment receipt"),
        (outcome({"result": PAID}, payment_response=RECEIPT, payment_responses=[RECEIPT]), 2, "1 of 2 requests"),
        (outcome("not json"), 1, "the answer is not JSON"),
    ],
)
def test_every_other_answer_is_a_refusal(result: dict, count: int, says: str) -> None:
    problem = not_paid(result, count)
    assert says in problem, problem
    assert "\n" not in problem


def test_a_plain_x402_resource_is_paid_when_its_receipt_says_success() -> None:
    """Not an A2A task (the x402 package's own resource server answering JSON): the receipt decides."""
    plain = {"jsonrpc": "2.0", "id": 1, "result": {"echo": "short"}}
    assert not_paid(outcome(plain, payment_response=RECEIPT)) == ""
    assert not_paid(outcome(plain)) == "0 of 1 requests carry a payment receipt"
    refused = {**RECEIPT, "success": False}
    assert not_paid(outcome(plain, payment_response=refused)) == "not paid: the receipt does not say success"
