"""x402 v1 clients read the 402's top level: the x402 1.0 package's client pays it unchanged.

The x402 1.0 package cannot live beside the 2.x one the project uses, so it runs in its own
virtualenv (`python3 -m venv /tmp/x402v1-venv && /tmp/x402v1-venv/bin/pip install "x402<2"`,
or name another interpreter in X402_V1_PYTHON).
"""

from __future__ import annotations

import pytest

from tests.support.paid import PaidView, Payer, decode_header, send_body
from tests.support.x402_v1 import V1_PYTHON, pay_with_x402_v1


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate and facilitator; each test counts only its own payer's work (PaidView)."""
    return shared_paid


@pytest.mark.skipif(not V1_PYTHON.exists(), reason=f"no x402 1.0 virtualenv at {V1_PYTHON}")
def test_the_x402_v1_client_pays_the_402_with_x_payment(paid):
    payer = Payer()
    answer = pay_with_x402_v1(f"{paid.gate.url}/a2a/paid", payer.key)
    assert answer["status"] == 200, answer
    task = answer["body"]["result"]
    assert task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"][0]["text"] == "paid by x402 v1"
    [receipt] = task["metadata"]["x402.payment.receipts"]
    assert receipt["payer"].lower() == payer.address.lower()
    settlements = paid.ledger()["settlements"]
    assert len(settlements) == 1


def test_a_v2_client_pays_the_same_402_with_payment_signature(paid):
    response = paid.post("paid", send_body("v2"))
    assert response.status_code == 402 and response.json()["x402Version"] == 1
    from devnet.payer import encode_header, sign_payment

    token = sign_payment(decode_header(response.headers["PAYMENT-REQUIRED"]), Payer().key)
    done = paid.post("paid", send_body("v2"), {"PAYMENT-SIGNATURE": encode_header(token)})
    assert done.json()["result"]["status"]["state"] == "completed"
