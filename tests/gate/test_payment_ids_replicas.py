"""Payment identifiers across replicas on one PostgreSQL: a re-signed retry under an id is answered
from the first payment whichever replica takes it, also after every replica restarted, and two
payments racing under one id on two replicas are charged and delivered once (the database's unique
key decides). Payments are signed by the x402 package's client, the id added by its own helper."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from x402.extensions.payment_identifier import generate_payment_id

from tests.gate.test_payment_ids import header, signed_with_id
from tests.support import replicas as support
from tests.support.chain_moves import transfers_to
from tests.support.gate_process import GateProcess
from tests.support.paid import PAY_TO, Payer, decode_header, send_body
from tests.support.replicas import post

pytestmark = pytest.mark.system

replicas = support.replicas  # the fixture, bound by assignment (see tests/support/dev_facilitator_helpers.py)


def asked(gate: GateProcess, agent: str = "paid") -> dict[str, Any]:
    response = post(gate, agent, send_body("price?"), {})
    assert response.status_code == 402, response.text
    return decode_header(response.headers["PAYMENT-REQUIRED"])


def charged(facilitator: str, payer: Payer) -> int:
    """How many transfers from `payer` to payTo the development chain holds."""
    return len([t for t in transfers_to(facilitator, PAY_TO) if t["from_address"].lower() == payer.address.lower()])


def test_a_re_signed_retry_on_another_replica_and_after_a_restart_is_charged_and_delivered_once(replicas) -> None:
    a = replicas.start("a", lease=5, reconcile=0.5)
    b = replicas.start("b", lease=5, reconcile=0.5)
    document = asked(a)
    payer, payment_id = Payer(), generate_payment_id()
    first = post(a, "paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert first.json()["result"]["status"]["state"] == "completed", first.text
    task_id = first.json()["result"]["id"]
    on_b = post(b, "paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert on_b.headers.get("X-Idempotent-Replay") == "true", on_b.text
    assert on_b.json()["result"]["id"] == task_id
    stolen = post(b, "paid", send_body("once"), header(signed_with_id(document, Payer(), payment_id)))
    assert stolen.status_code == 409 and stolen.json()["error"] == "payment_identifier_conflict"
    a.stop()
    b.stop()
    c = replicas.start("c", lease=5, reconcile=0.5)
    after = post(c, "paid", send_body("once"), header(signed_with_id(asked(c), payer, payment_id)))
    assert after.headers.get("X-Idempotent-Replay") == "true", after.text
    assert after.json()["result"]["id"] == task_id
    assert charged(replicas.facilitator, payer) == 1
    assert replicas.completed_tasks(payer.address) == 1


def test_two_payments_racing_under_one_id_on_two_replicas_are_charged_and_delivered_once(replicas) -> None:
    a = replicas.start("a", lease=5, reconcile=0.5)
    b = replicas.start("b", lease=5, reconcile=0.5)
    document = asked(a, "paid-slow")
    payer, payment_id = Payer(), generate_payment_id()
    payloads = [signed_with_id(document, payer, payment_id) for _ in range(2)]
    answers: dict[str, httpx.Response] = {}
    go = threading.Barrier(2)

    def send(name: str, gate: GateProcess, payload: dict[str, Any]) -> None:
        go.wait()
        answers[name] = post(gate, "paid-slow", send_body("sleep 2"), header(payload))

    senders = [
        threading.Thread(target=send, args=(name, gate, payload))
        for name, gate, payload in (("a", a, payloads[0]), ("b", b, payloads[1]))
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    completed = [
        r for r in answers.values() if r.json().get("result", {}).get("status", {}).get("state") == "completed"
    ]
    waiting = [r for r in answers.values() if r.json().get("error", {}).get("data", {}).get("code") == "in_flight"]
    assert len(completed) == 1 and len(waiting) == 1, {k: v.text for k, v in answers.items()}
    assert charged(replicas.facilitator, payer) == 1
    assert replicas.completed_tasks(payer.address) == 1
    assert [r[0] for r in replicas.rows("SELECT COUNT(*) FROM claims WHERE payment_id = %s", payment_id)] == [1]
