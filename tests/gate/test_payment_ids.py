"""Payment identifiers (x402 `payment-identifier`): a re-signed retry of the same request under the
same id is answered from the first payment, charged and delivered once.

A real gate in front of the development facilitator; every payment is signed by the x402 package's
own client, with the id added by the package's own helper (`append_payment_identifier_to_extensions`)
to the extensions the gate's 402 declares. What was charged is read from the development chain.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    append_payment_identifier_to_extensions,
    generate_payment_id,
)

from devnet.payer import encode_header, sign_payment
from tests.support.chain_moves import transfers_to
from tests.support.paid import PAY_TO, PaidSetup, Payer, decode_header, send_body

pytestmark = pytest.mark.system


def asked(gate_url: str, agent: str = "paid") -> dict[str, Any]:
    """The gate's 402 document for `agent`."""
    response = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"), timeout=10)
    assert response.status_code == 402, response.text
    return decode_header(response.headers["PAYMENT-REQUIRED"])


def signed_with_id(document: dict[str, Any], payer: Payer, payment_id: str | None) -> dict[str, Any]:
    """A fresh signature (a new nonce) for the 402 `document`, carrying `payment_id` as the x402
    client helper adds it to the extensions the server declared."""
    extensions = dict(document.get("extensions") or {})
    if payment_id is not None:
        append_payment_identifier_to_extensions(extensions, payment_id)
    return sign_payment({**document, "extensions": extensions}, payer.key)


def header(payload: dict[str, Any]) -> dict[str, str]:
    return {"PAYMENT-SIGNATURE": encode_header(payload)}


def charged(paid: PaidSetup, payer: Payer) -> list[dict[str, Any]]:
    """The transfers from `payer` to payTo on the development chain."""
    return [t for t in transfers_to(paid.facilitator_url, PAY_TO) if t["from_address"].lower() == payer.address.lower()]


def test_a_re_signed_retry_under_the_same_id_is_charged_and_delivered_once(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    assert PAYMENT_IDENTIFIER in (document.get("extensions") or {})
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert first.status_code == 200, first.text
    assert first.json()["result"]["status"]["state"] == "completed"
    again = paid.post("paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert again.status_code == 200, again.text
    assert again.headers.get("X-Idempotent-Replay") == "true"
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert len(charged(paid, payer)) == 1
    assert paid.count_tasks("paid") == 1


CONFLICT = {"detail": "Payment identifier already used", "error": "payment_identifier_conflict"}


def test_another_payer_under_the_id_is_refused_and_learns_nothing(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    owner, other, payment_id = Payer(), Payer(), generate_payment_id()
    first = paid.post("paid", send_body("mine"), header(signed_with_id(document, owner, payment_id)))
    assert first.json()["result"]["status"]["state"] == "completed"
    stolen = paid.post("paid", send_body("mine"), header(signed_with_id(document, other, payment_id)))
    assert stolen.status_code == 409, stolen.text
    assert stolen.json() == CONFLICT  # not the first's task, payer or answer
    assert "X-Idempotent-Replay" not in stolen.headers and "PAYMENT-RESPONSE" not in stolen.headers
    assert charged(paid, other) == [] and len(charged(paid, owner)) == 1
    assert paid.count_tasks("paid") == 1
    assert [r["error"] for r in paid.payment_rows("reject")] == ["payment_identifier_conflict"]


def test_another_request_under_the_id_is_refused_with_the_same_answer(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("one thing"), header(signed_with_id(document, payer, payment_id)))
    assert first.json()["result"]["status"]["state"] == "completed"
    other = paid.post("paid", send_body("another thing"), header(signed_with_id(document, payer, payment_id)))
    assert other.status_code == 409 and other.json() == CONFLICT
    elsewhere = paid.post(
        "paid-slow",
        send_body("one thing"),
        header(signed_with_id(asked(paid.gate.url, "paid-slow"), payer, payment_id)),
    )
    assert elsewhere.status_code == 409 and elsewhere.content == other.content
    assert len(charged(paid, payer)) == 1 and paid.count_tasks("paid") == 1


def test_a_payment_without_an_id_is_untouched_by_another_payments_id(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    payer = Payer()
    paid.post("paid", send_body("x"), header(signed_with_id(document, payer, generate_payment_id())))
    plain = paid.post("paid", send_body("x"), header(signed_with_id(document, payer, None)))
    assert plain.json()["result"]["status"]["state"] == "completed"
    assert "X-Idempotent-Replay" not in plain.headers
    assert len(charged(paid, payer)) == 2


def test_a_retry_while_the_first_runs_is_in_flight_then_its_answer(paid: PaidSetup) -> None:
    import threading

    document = asked(paid.gate.url, "paid-slow")
    payer, payment_id = Payer(), generate_payment_id()
    answers: list[httpx.Response] = []
    first = threading.Thread(
        target=lambda: answers.append(
            paid.post("paid-slow", send_body("sleep 3"), header(signed_with_id(document, payer, payment_id)))
        )
    )
    first.start()
    from tests.support.gate_helpers import wait_for

    wait_for(lambda: bool(paid.payment_rows("verify")))
    running = paid.post("paid-slow", send_body("sleep 3"), header(signed_with_id(document, payer, payment_id)))
    assert running.status_code == 200
    assert running.json()["error"]["code"] == -32603
    assert running.json()["error"]["data"] == {"code": "in_flight", "retryable": True}
    first.join(30)
    done = paid.post("paid-slow", send_body("sleep 3"), header(signed_with_id(document, payer, payment_id)))
    assert done.headers.get("X-Idempotent-Replay") == "true"
    assert done.json()["result"]["id"] == answers[0].json()["result"]["id"]
    assert len(charged(paid, payer)) == 1 and paid.count_tasks("paid-slow") == 1


@pytest.mark.parametrize("method", ["message/stream", "SendStreamingMessage", "SendMessage"])
def test_every_send_method_of_both_dialects_answers_a_re_signed_retry_from_the_first(
    paid: PaidSetup, method: str
) -> None:
    from tests.support.in_band import sse_results

    document = asked(paid.gate.url)
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("both", method=method), header(signed_with_id(document, payer, payment_id)))
    assert first.status_code == 200, first.text
    again = paid.post("paid", send_body("both", method=method), header(signed_with_id(document, payer, payment_id)))
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    if method in ("message/stream", "SendStreamingMessage"):
        [event] = sse_results(again)
        task = event["result"].get("task", event["result"])
    else:
        task = again.json()["result"]["task"]
    assert task["id"] == paid_task_ids(paid)[0]
    assert len(charged(paid, payer)) == 1 and paid.count_tasks("paid") == 1


def paid_task_ids(paid: PaidSetup) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(paid.db_path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM tasks WHERE owner LIKE 'payer:%' ORDER BY rowid")]
    finally:
        conn.close()


def test_in_band_a_re_signed_payment_under_the_id_is_answered_from_the_first(paid: PaidSetup) -> None:
    from tests.support.in_band import ACTIVATE, paying_body, payment_metadata

    payer, payment_id = Payer(), generate_payment_id()
    asking = paid.post("paid", send_body("in band"), ACTIVATE)
    task = asking.json()["result"]
    document = payment_metadata(task)["x402.payment.required.v2"]
    assert document["extensions"][PAYMENT_IDENTIFIER]["info"] == {"required": False}
    first = paid.post("paid", paying_body("pay", task["id"], signed_with_id(document, payer, payment_id)), ACTIVATE)
    assert first.json()["result"]["status"]["state"] == "completed", first.text
    again = paid.post("paid", paying_body("pay", task["id"], signed_with_id(document, payer, payment_id)), ACTIVATE)
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert again.json()["result"]["id"] == task["id"]
    assert len(charged(paid, payer)) == 1
    # another payer under the id, on the task the first adopted: the plain conflict answer
    stolen = paid.post("paid", paying_body("pay", task["id"], signed_with_id(document, Payer(), payment_id)), ACTIVATE)
    assert stolen.status_code == 409 and stolen.json() == CONFLICT
    # the same payer paying another in-band request under the id: refused on that request's Task
    other = paid.post("paid", send_body("another in band"), ACTIVATE).json()["result"]
    retried = paid.post("paid", paying_body("pay", other["id"], signed_with_id(document, payer, payment_id)), ACTIVATE)
    refused = payment_metadata(retried.json()["result"])
    assert refused["x402.payment.status"] == "payment-failed"
    assert refused["x402.payment.receipts"][0]["errorReason"] == "payment_identifier_conflict"
    assert retried.json()["result"]["status"]["state"] == "input-required"  # payable again, under a new id
    assert len(charged(paid, payer)) == 1


def test_a_malformed_id_is_refused_with_its_answer(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    payer = Payer()
    extensions = {
        PAYMENT_IDENTIFIER: {**document["extensions"][PAYMENT_IDENTIFIER], "info": {"required": False, "id": "short"}}
    }
    payload = sign_payment({**document, "extensions": extensions}, payer.key)
    refused = paid.post("paid", send_body("x"), header(payload))
    assert refused.status_code == 400
    assert refused.json() == {"detail": "Invalid payment identifier", "error": "invalid_payment_identifier"}
    assert charged(paid, payer) == []


def test_the_same_id_after_a_restart_is_still_answered_from_the_first(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("durable"), header(signed_with_id(document, payer, payment_id)))
    paid.gate.stop()
    paid.gate.start()
    again = paid.post("paid", send_body("durable"), header(signed_with_id(document, payer, payment_id)))
    assert again.headers.get("X-Idempotent-Replay") == "true"
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert len(charged(paid, payer)) == 1 and paid.count_tasks("paid") == 1


def test_an_agent_that_requires_an_id_declares_it_and_refuses_a_payment_without_one(
    tmp_path, facilitator: str, write_config, start_gate
) -> None:
    from tests.support.paid import ASSET, start_paid_gate

    required = (
        '\n[agents.paid-with-id]\npayment_identifier = "required"\n'
        f'price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}\n'
    )
    setup, _ = start_paid_gate(tmp_path, facilitator, write_config, after=required)
    try:
        document = asked(setup.gate.url, "paid-with-id")
        assert document["extensions"][PAYMENT_IDENTIFIER]["info"] == {"required": True}
        assert asked(setup.gate.url)["extensions"][PAYMENT_IDENTIFIER]["info"] == {"required": False}
        payer = Payer()
        without = setup.post("paid-with-id", send_body("x"), header(signed_with_id(document, payer, None)))
        assert without.status_code == 400
        assert without.json() == {"detail": "Payment identifier required", "error": "payment_identifier_required"}
        with_id = setup.post(
            "paid-with-id", send_body("x"), header(signed_with_id(document, payer, generate_payment_id()))
        )
        assert with_id.json()["result"]["status"]["state"] == "completed"
        assert len(charged(setup, payer)) == 1
    finally:
        setup.gate.stop()


def test_a_reload_that_requires_an_id_is_declared_and_enforced_from_the_next_request(
    tmp_path, facilitator: str, write_config
) -> None:
    import signal

    from tests.support.gate_helpers import wait_for
    from tests.support.paid import start_paid_gate

    setup, text = start_paid_gate(tmp_path, facilitator, write_config)
    try:
        assert asked(setup.gate.url)["extensions"][PAYMENT_IDENTIFIER]["info"] == {"required": False}
        setup.gate.config.write_text(
            text.replace("[agents.paid]\n", '[agents.paid]\npayment_identifier = "required"\n')
        )
        assert setup.gate.process is not None
        setup.gate.process.send_signal(signal.SIGHUP)
        wait_for(lambda: asked(setup.gate.url)["extensions"][PAYMENT_IDENTIFIER]["info"] == {"required": True})
        refused = setup.post("paid", send_body("x"), header(signed_with_id(asked(setup.gate.url), Payer(), None)))
        assert refused.status_code == 400 and refused.json()["error"] == "payment_identifier_required"
    finally:
        setup.gate.stop()


def test_a_retry_under_the_id_is_verified_first_and_an_outage_is_retryable(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("proof"), header(signed_with_id(document, payer, payment_id)))
    assert first.json()["result"]["status"]["state"] == "completed"
    paid.faults(verify="http500")
    down = paid.post("paid", send_body("proof"), header(signed_with_id(document, payer, payment_id)))
    assert down.status_code == 200 and down.json()["error"]["data"]["code"] == "verify_unavailable"
    paid.faults(verify="invalid")
    refused = paid.post("paid", send_body("proof"), header(signed_with_id(document, payer, payment_id)))
    assert refused.status_code == 403 and refused.json()["detail"] == "Payment verification failed"
    paid.faults()
    again = paid.post("paid", send_body("proof"), header(signed_with_id(document, payer, payment_id)))
    assert again.headers.get("X-Idempotent-Replay") == "true"
    assert len(charged(paid, payer)) == 1


@pytest.mark.parametrize("method", ["message/send", "SendMessage"])
def test_a_payment_in_message_metadata_under_the_id_is_answered_from_the_first(paid: PaidSetup, method: str) -> None:
    document = asked(paid.gate.url)
    payer, payment_id = Payer(), generate_payment_id()

    def body() -> dict[str, Any]:
        payload = signed_with_id(document, payer, payment_id)
        return send_body("in metadata", method=method, metadata={"x402.payment.payload": payload})

    first = paid.post("paid", body())
    assert first.status_code == 200, first.text
    again = paid.post("paid", body())
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert again.json()["result"] == first.json()["result"]
    assert len(charged(paid, payer)) == 1 and paid.count_tasks("paid") == 1
