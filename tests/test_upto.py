"""Usage pricing (x402 `upto`) against a real gate process and the x402 package's own upto client.

The facilitator runs the x402 package's upto facilitator scheme over the development ledger
(tests/support/upto_facilitator.py). The payer authorizes the ceiling; the gate settles the
usage the agent reported, priced, once; the payer's balance falls by exactly the receipt's
amount; undelivered work and a pricing that fails move nothing.
"""

from __future__ import annotations

import pytest

from tests.support.gate_process import free_port
from tests.support.paid import Payer, decode_header, send_body
from tests.support.upto import CEILING, UNIT_PRICE, UptoSetup, pay_with_x402, upto_config


@pytest.fixture
def upto(tmp_path, start_gate, write_config):
    from tests.support.serve import serve_app
    from tests.support.upto_facilitator import create_upto_facilitator_app

    with serve_app(create_upto_facilitator_app(str(tmp_path / "ledger.db")), wait_on_exit=False) as facilitator:
        port = free_port()
        config = write_config(upto_config(f"http://127.0.0.1:{port}", facilitator))
        yield UptoSetup(start_gate(config, port=port), facilitator, tmp_path / "gate.db")


def receipts(answer) -> tuple[dict, dict]:
    """The receipt in PAYMENT-RESPONSE and the last of the task's `x402.payment.receipts`."""
    task = answer.json()["result"]
    return decode_header(answer.headers["PAYMENT-RESPONSE"]), task["metadata"]["x402.payment.receipts"][-1]


def test_the_402_offers_upto_with_the_ceiling_and_what_the_upto_client_needs(upto):
    [accepted] = upto.offer("paid-metered")["accepts"]
    assert accepted["scheme"] == "upto" and accepted["amount"] == str(CEILING)
    extra = accepted["extra"]
    assert extra["assetTransferMethod"] == "permit2"
    assert extra["facilitatorAddress"] == "0xFB0b6D1F8B44CAeaC383d5AC8C0b374BB08E2619"
    assert extra["name"] and extra["version"]


def test_a_blocking_send_settles_the_priced_usage_once_below_the_ceiling(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    text = "metered hello"
    answer = pay_with_x402(upto.url("paid-metered"), send_body(text), payer.key)
    assert answer.status_code == 200, answer.text
    task = answer.json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    header, receipt = receipts(answer)
    assert header == receipt
    charged = UNIT_PRICE * len(text)
    assert receipt["amount"] == str(charged) and charged < CEILING
    usage = receipt["extra"]["usage"]
    assert usage["units"] == {"characters": len(text)}
    assert (usage["unit"], usage["unitPrice"], usage["amount"], usage["ceiling"]) == (
        "characters",
        str(UNIT_PRICE),
        str(charged),
        str(CEILING),
    )
    assert upto.balance(payer.address) == before - charged
    [transfer] = upto.transfers()
    assert transfer["amount"] == charged and transfer["from"] == payer.address
    # the payment log says what was authorized and what was charged
    [settle] = upto.rows("SELECT amount, authorized, payer FROM payments WHERE action = 'settle'")
    assert settle == {"amount": str(charged), "authorized": str(CEILING), "payer": payer.address.lower()}
    [verify] = upto.rows("SELECT amount, authorized FROM payments WHERE action = 'verify'")
    assert verify == {"amount": str(CEILING), "authorized": str(CEILING)}


def test_a_longer_answer_costs_more(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    short = pay_with_x402(upto.url("paid-metered"), send_body("short"), payer.key)
    middle = upto.balance(payer.address)
    long = pay_with_x402(upto.url("paid-metered"), send_body("a much longer answer than that"), payer.key)
    after = upto.balance(payer.address)
    assert before - middle == int(receipts(short)[0]["amount"]) == UNIT_PRICE * 5
    assert middle - after == int(receipts(long)[0]["amount"]) == UNIT_PRICE * 30
    assert before - middle < middle - after


def test_a_replay_of_the_signature_settles_nothing_more(upto):
    from devnet.payer import encode_header
    from tests.support.upto import sign_upto

    payer = Payer()
    signed = sign_upto(upto.offer("paid-metered"), payer.key)
    headers = {"PAYMENT-SIGNATURE": encode_header(signed)}
    import httpx

    first = httpx.post(upto.url("paid-metered"), json=send_body("once"), headers=headers, timeout=30)
    again = httpx.post(upto.url("paid-metered"), json=send_body("once"), headers=headers, timeout=30)
    other = httpx.post(upto.url("paid-metered"), json=send_body("other work"), headers=headers, timeout=30)
    assert first.status_code == 200 and again.headers.get("X-Idempotent-Replay") == "true"
    assert receipts(again)[0] == receipts(first)[0]
    assert (other.status_code, other.json()["error"]) == (403, "payment_already_used")
    assert len(upto.transfers()) == 1 and upto.counts()["settle"] == 1


def test_usage_priced_above_the_ceiling_is_charged_the_ceiling(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("paid-metered-capped"), send_body("twenty-one characters"), payer.key)
    header, _ = receipts(answer)
    assert header["amount"] == "100" and header["extra"]["usage"]["capped"] is True
    assert header["extra"]["usage"]["priced"] == str(UNIT_PRICE * 21)
    assert upto.balance(payer.address) == before - 100


def test_a_pricing_callable_that_raises_charges_nothing(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("paid-metered-raising"), send_body("free, by accident"), payer.key)
    assert answer.status_code == 200, answer.text
    task = answer.json()["result"]
    assert task["status"]["state"] == "completed" and task["artifacts"]
    header, receipt = receipts(answer)
    assert header == receipt and receipt["amount"] == "0" and receipt["transaction"] == ""
    assert receipt["extra"]["usage"]["error"] == "pricing_failed: RuntimeError"
    assert upto.balance(payer.address) == before
    assert upto.counts()["settle"] == 0 and upto.transfers() == []
    [claim] = upto.rows("SELECT state, last_error FROM claims")
    assert claim == {"state": "no_charge", "last_error": "pricing_failed: RuntimeError"}
    [row] = upto.rows("SELECT amount, authorized, error FROM payments WHERE action = 'no_charge'")
    assert row == {"amount": "0", "authorized": str(CEILING), "error": "pricing_failed: RuntimeError"}


def test_a_failed_task_moves_nothing(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("paid-metered-broken"), send_body("fail"), payer.key)
    assert answer.json()["result"]["status"]["state"] == "failed"
    assert "PAYMENT-RESPONSE" not in answer.headers
    assert upto.balance(payer.address) == before and upto.counts()["settle"] == 0
    assert upto.rows("SELECT action FROM payments WHERE action IN ('settle', 'no_charge')") == []
