"""The in-band a2a-x402 flow against a real gate and the development facilitator.

payment-required (the original message kept) -> the paying message on the same task ->
verify -> the agent runs the ORIGINAL message -> settle -> payment-completed. Refusals
answer on the task and leave it payable; payment-rejected cancels it; streams answer SSE.
"""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from gate.in_band import error_code
from tests.support.gate_process import free_port
from tests.support.in_band import (
    ACTIVATE,
    EXTENSION_V01_CLIENT,
    EXTENSION_V02,
    forge,
    offer_v1,
    paying_body,
    payment_metadata,
    sse_results,
    task_of,
)
from tests.support.paid import Payer, paid_config, send_body

PAYMENT_MESSAGE = "Payment authorization provided"


def ask(paid, text: str, *, method: str = "message/send", headers: dict[str, str] | None = None) -> dict:
    response = paid.post("paid", send_body(text, method=method), headers or ACTIVATE)
    assert response.status_code == 200, response.text
    if "stream" in method.lower():
        [event] = sse_results(response)
        return task_of(event["result"])
    return task_of(response.json()["result"])


def artifact_text(task: dict) -> str:
    return task["artifacts"][0]["parts"][0]["text"]


def test_the_agent_answers_the_original_message_not_the_payment(paid):
    task = ask(paid, "what is the weather?")
    assert task["status"]["state"] == "input-required"
    assert payment_metadata(task)["x402.payment.status"] == "payment-required"
    assert task["history"][0]["parts"][0]["text"] == "what is the weather?"
    response = paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], Payer().sign_v1(offer_v1(task))), ACTIVATE)
    done = task_of(response.json()["result"])
    assert done["id"] == task["id"] and done["status"]["state"] == "completed"
    assert artifact_text(done) == "what is the weather?"
    metadata = payment_metadata(done)
    assert metadata["x402.payment.status"] == "payment-completed"
    assert metadata["x402.payment.receipts"][0]["success"] is True
    assert "x402.payment.required" not in done["metadata"]
    assert PAYMENT_MESSAGE not in response.text
    assert len(paid.ledger()["settlements"]) == 1
    assert response.headers["X-A2A-Extensions"] == EXTENSION_V02


@pytest.mark.parametrize("header", ["A2A-Extensions", "X-A2A-Extensions"])
def test_activation_is_echoed_in_the_header_it_came_in(paid, header):
    response = paid.post("paid", send_body("hi"), {header: f"https://example.com/other, {EXTENSION_V01_CLIENT}"})
    assert response.status_code == 200
    names = {k.lower() for k in response.headers}
    assert header.lower() in names
    assert ({"a2a-extensions", "x-a2a-extensions"} - {header.lower()}).isdisjoint(names)
    assert response.headers[header] == EXTENSION_V01_CLIENT


@pytest.mark.parametrize("method", ["message/stream", "SendStreamingMessage"])
def test_streaming_in_band_answers_every_step_as_sse(paid, method):
    task = ask(paid, "stream me", method=method)
    state = task["status"]["state"]
    assert state in ("input-required", "TASK_STATE_INPUT_REQUIRED")
    offer = offer_v1(task)
    response = paid.post(
        "paid", paying_body(PAYMENT_MESSAGE, task["id"], Payer().sign_v1(offer), method=method), ACTIVATE
    )
    events = [e["result"] for e in sse_results(response)]
    assert len(events) >= 3
    last = events[-1]
    status = last.get("statusUpdate") or last
    assert status["status"]["state"] in ("completed", "TASK_STATE_COMPLETED")
    assert status["status"]["message"]["metadata"]["x402.payment.status"] == "payment-completed"
    artifacts = [e.get("artifactUpdate", e)["artifact"] for e in events if "artifact" in e.get("artifactUpdate", e)]
    assert artifacts[0]["parts"][0]["text"] == "stream me"
    assert len(paid.ledger()["settlements"]) == 1


def test_a_refused_payment_answers_on_the_task_and_leaves_it_payable(paid):
    task = ask(paid, "pay me twice")
    payer = Payer()
    forged = payer.sign_v1(offer_v1(task))
    forged["payload"]["signature"] = forge(forged["payload"]["signature"])
    refused = paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], forged), ACTIVATE)
    assert refused.status_code == 200
    failed = task_of(refused.json()["result"])
    assert failed["id"] == task["id"] and failed["status"]["state"] == "input-required"
    metadata = payment_metadata(failed)
    assert metadata["x402.payment.status"] == "payment-failed"
    assert metadata["x402.payment.error"] == "INVALID_SIGNATURE"
    [receipt] = metadata["x402.payment.receipts"]
    assert receipt["success"] is False and receipt["errorReason"] and receipt["network"] == "base-sepolia"
    assert metadata["x402.payment.required"]["accepts"]  # payable again, with fresh requirements
    paid_now = paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], payer.sign_v1(offer_v1(failed))), ACTIVATE)
    done = task_of(paid_now.json()["result"])
    assert done["status"]["state"] == "completed" and artifact_text(done) == "pay me twice"
    assert len(paid.ledger()["settlements"]) == 1


def test_payment_rejected_by_the_client_cancels_uncharged(paid):
    task = ask(paid, "never mind")
    response = paid.post("paid", paying_body("no thanks", task["id"], None, status="payment-rejected"), ACTIVATE)
    ended = task_of(response.json()["result"])
    assert ended["status"]["state"] == "canceled"
    assert payment_metadata(ended)["x402.payment.status"] == "payment-rejected"
    late = paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], Payer().sign_v1(offer_v1(task))), ACTIVATE)
    assert late.json()["error"]["code"] == -32004  # a finished task: nothing left to pay for
    assert paid.ledger()["settlements"] == []


def test_a_retry_replays_and_the_same_token_cannot_pay_another_task(paid):
    first, second = ask(paid, "one"), ask(paid, "two")
    token = Payer().sign_v1(offer_v1(first))
    body = paying_body(PAYMENT_MESSAGE, first["id"], token)
    done = paid.post("paid", body, ACTIVATE)
    again = paid.post("paid", paying_body("retry, new messageId", first["id"], token), ACTIVATE)
    assert again.headers["X-Idempotent-Replay"] == "true"
    assert task_of(again.json()["result"])["artifacts"] == task_of(done.json()["result"])["artifacts"]
    other = paid.post("paid", paying_body(PAYMENT_MESSAGE, second["id"], token), ACTIVATE)
    metadata = payment_metadata(task_of(other.json()["result"]))
    assert (metadata["x402.payment.status"], metadata["x402.payment.error"]) == ("payment-failed", "DUPLICATE_NONCE")
    assert len(paid.ledger()["settlements"]) == 1


def test_unpaid_requests_cost_little(tmp_path, facilitator, start_gate, write_config):
    """30 unpaid in-band requests of ~1 MiB each once grew the database by 34.5 MiB."""
    port = free_port()
    text = (
        paid_config(f"http://127.0.0.1:{port}", facilitator)
        + "\n[in_band]\nmax_message_bytes = 4096\npending_per_ip = 3\n"
    )
    gate = start_gate(write_config(text), port=port)

    def post(body_text: str) -> httpx.Response:
        return httpx.post(f"{gate.url}/a2a/paid", json=send_body(body_text), headers=ACTIVATE, timeout=30)

    def size() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob("gate.db*"))

    before = size()
    big = [post("x" * 1_000_000) for _ in range(30)]
    assert {r.status_code for r in big} == {402}  # over the size cap: the HTTP 402 instead
    assert "PAYMENT-REQUIRED" in big[0].headers
    small = [post(f"small {i}") for i in range(5)]
    assert [r.status_code for r in small] == [200, 200, 200, 402, 402]  # per-caller cap
    assert size() - before < 1_000_000
    conn = sqlite3.connect(tmp_path / "gate.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 3
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("invalid_exact_evm_insufficient_balance", "INSUFFICIENT_FUNDS"),
        ("invalid_exact_evm_payload_signature", "INVALID_SIGNATURE"),
        ("payment_expired", "EXPIRED_PAYMENT"),
        ("invalid_exact_evm_payload_authorization_valid_before", "EXPIRED_PAYMENT"),
        ("authorization_nonce_already_used", "DUPLICATE_NONCE"),
        ("invalid_exact_evm_nonce_already_used", "DUPLICATE_NONCE"),
        ("invalid_network", "NETWORK_MISMATCH"),
        ("amount_mismatch", "INVALID_AMOUNT"),
        ("accepted_requirements_mismatch", "INVALID_AMOUNT"),
        ("settle_failed", "SETTLEMENT_FAILED"),
        ("unsupported_payload", "UNSUPPORTED_PAYLOAD"),  # not of the offer's kind: no signature was judged
        ("invalid_payload", "INVALID_PAYLOAD"),
        ("invalid_nonce", "INVALID_PAYLOAD"),
        ("invalid_batch_settlement_evm_payload_type", "INVALID_PAYLOAD"),
        ("resource_mismatch", "RESOURCE_MISMATCH"),
        ("payer_not_allowed", "PAYER_NOT_ALLOWED"),
        ("payment_window_too_short", "EXPIRED_PAYMENT"),
        ("unsupported_network", "NETWORK_MISMATCH"),
        ("invalid_batch_settlement_evm_voucher_signature", "INVALID_SIGNATURE"),
        ("something_no_code_names", "PAYMENT_REFUSED"),
    ],
)
def test_refusal_reasons_become_a2a_x402_codes(reason, code):
    assert error_code(reason) == code


def test_requests_awaiting_payment_expire_with_the_requirements(tmp_path):
    """A pending request lives maxTimeoutSeconds: then it can be neither paid nor counted, and it is deleted."""
    import asyncio

    from gate.config import default_settings
    from gate.gate import PaymentGate
    from server.app import Services
    from server.tasks import new_task, pending_owner, set_status

    async def run() -> None:
        services = Services(default_settings(str(tmp_path / "gate.db")), PaymentGate.from_parts)
        await services.open_store()
        try:
            store, owner = services.store, pending_owner("203.0.113.7")
            tasks = []
            for ttl in (0.05, 60):
                task = new_task(None, {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": "q"}]})
                set_status(task, "input-required")
                await store.create(task, agent="paid-echo", owner=owner, deadline_seconds=ttl)
                tasks.append(task)
            assert await store.count_pending(owner) == 2
            await asyncio.sleep(0.1)
            short, long = tasks
            assert await store.unpaid(short["id"], "paid-echo") is None
            assert await store.adopt(short["id"], "payer:0xabc", "paid-echo") is None
            assert await store.count_pending(owner) == 1
            await services.housekeeping()
            remaining = {r["id"] for r in await services.db.fetch("SELECT id FROM tasks")}
            assert remaining == {long["id"]}
            adopted = await store.adopt(long["id"], "payer:0xabc", "paid-echo")
            assert adopted is not None and await store.unpaid(long["id"], "paid-echo") is None
            assert await store.adopt(long["id"], "payer:0xdef", "paid-echo") is None  # paid for once
        finally:
            await services.db.close()

    asyncio.run(run())


def test_storms_on_one_pending_task_execute_and_charge_once(paid):
    """The same paying message many times at once, then many payers for one task at once: one execution, one charge."""
    import asyncio

    async def storm(bodies: list[dict]) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(client.post(f"{paid.gate.url}/a2a/paid", json=b, headers=ACTIVATE) for b in bodies)
            )

    task = ask(paid, "storm one")
    token = Payer().sign_v1(offer_v1(task))
    same = asyncio.run(storm([paying_body(PAYMENT_MESSAGE, task["id"], token, call_id=i) for i in range(8)]))
    kinds = []
    for response in same:
        body = response.json()
        if "result" in body:
            assert task_of(body["result"])["status"]["state"] == "completed"
            kinds.append("replay" if response.headers.get("X-Idempotent-Replay") else "done")
        else:
            assert body["error"]["data"]["code"] == "in_flight"
            kinds.append("in_flight")
    assert kinds.count("done") == 1
    assert len(paid.ledger()["settlements"]) == 1

    other = ask(paid, "storm two")
    offer = offer_v1(other)
    many = asyncio.run(
        storm([paying_body(PAYMENT_MESSAGE, other["id"], Payer().sign_v1(offer), call_id=i) for i in range(6)])
    )
    done = [r for r in many if "result" in r.json() and task_of(r.json()["result"])["status"]["state"] == "completed"]
    assert len(done) == 1
    assert artifact_text(task_of(done[0].json()["result"])) == "storm two"
    assert len(paid.ledger()["settlements"]) == 2  # one per task, whoever else tried to pay
    claims = sqlite3.connect(paid.db_path)
    try:
        states = [r[0] for r in claims.execute("SELECT state FROM claims")]
    finally:
        claims.close()
    assert states.count("settled") == 2 and set(states) <= {"settled", "released"}


def decline(paid, task_id: str) -> dict:
    response = paid.post("paid", paying_body("no thanks", task_id, None, status="payment-rejected"), ACTIVATE)
    return response.json()


def held_unpaid(paid) -> int:
    """Requests the gate holds awaiting payment right now, as its database says."""
    conn = sqlite3.connect(paid.db_path)
    try:
        return conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE owner LIKE 'payment-pending%' AND state = 'input-required'"
        ).fetchone()[0]
    finally:
        conn.close()


def test_declining_and_asking_again_never_holds_more_than_the_cap(paid):
    """Decline every request held, ask as many new ones, then send an unpaid message naming each
    declined one, round after round: the declined tasks stay canceled and the caller never
    holds more than the cap (5) awaiting payment."""
    held = [ask(paid, f"hold {i}")["id"] for i in range(5)]
    assert paid.post("paid", send_body("one too many"), ACTIVATE).status_code == 402  # the cap, at 5
    for round_ in range(3):
        declined = list(held)
        for task_id in declined:
            assert task_of(decline(paid, task_id)["result"])["status"]["state"] == "canceled"
        held = [ask(paid, f"round {round_}, {i}")["id"] for i in range(5)]  # declined ones never count
        for task_id in declined:  # revive it?
            again = paid.post("paid", send_body("still there?", task_id=task_id), ACTIVATE).json()
            if "result" in again and task_of(again["result"])["status"]["state"] == "input-required":
                held.append(task_of(again["result"])["id"])
    count = held_unpaid(paid)
    assert count <= 5, f"{count} unpaid input-required tasks held, cap 5"
    assert paid.post("paid", send_body("one too many"), ACTIVATE).status_code == 402


@pytest.mark.parametrize("paying", [False, True], ids=["unpaid", "paid"])
def test_a_message_naming_a_declined_task_is_answered_as_for_a_terminal_task(paid, paying):
    """The answer the free path gives a message to a finished task: -32004, the task unchanged, nothing verified."""
    task = ask(paid, "never mind")
    decline(paid, task["id"])
    payload = Payer().sign_v1(offer_v1(task)) if paying else None
    body = paying_body(PAYMENT_MESSAGE, task["id"], payload) if paying else send_body("again", task_id=task["id"])
    response = paid.post("paid", body, ACTIVATE)
    assert response.status_code == 200
    error = response.json()["error"]
    assert error["code"] == -32004 and "terminal" in error["message"]
    assert held_unpaid(paid) == 0
    conn = sqlite3.connect(paid.db_path)
    try:
        [(state,)] = conn.execute("SELECT state FROM tasks WHERE id = ?", (task["id"],)).fetchall()
    finally:
        conn.close()
    assert state == "canceled"
    assert paid.ledger()["verify_calls"] == 0 and paid.ledger()["settlements"] == []


@pytest.mark.parametrize("signature", ["forged", "valid"])
def test_a_decline_while_the_payment_is_verified_stays_declined(paid, signature):
    """The client declines while its payment for the task is at the facilitator: whatever the
    verify says after, the task stays canceled, nothing runs, nothing is charged."""
    import threading

    from tests.support.gate_helpers import wait_for

    task = ask(paid, "declined mid-verify")
    payload = Payer().sign_v1(offer_v1(task))
    if signature == "forged":
        payload["payload"]["signature"] = forge(payload["payload"]["signature"])
    paid.faults(verify="slow:1", count=1)
    answer: dict = {}
    payer = threading.Thread(
        target=lambda: answer.update(
            paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], payload), ACTIVATE).json()
        )
    )
    payer.start()
    wait_for(lambda: paid.ledger()["verify_calls"] == 1)
    assert task_of(decline(paid, task["id"])["result"])["status"]["state"] == "canceled"
    payer.join(30)
    assert answer["error"]["code"] == -32004, answer
    conn = sqlite3.connect(paid.db_path)
    try:
        [(state,)] = conn.execute("SELECT state FROM tasks WHERE id = ?", (task["id"],)).fetchall()
    finally:
        conn.close()
    assert state == "canceled" and held_unpaid(paid) == 0
    assert paid.ledger()["settlements"] == []


def test_declining_what_awaits_no_payment_asks_for_nothing(paid):
    """payment-rejected naming a task that awaits no payment here (unknown, expired, paid for) is
    -32001: it declines nothing, and never becomes a new request awaiting payment."""
    task = ask(paid, "pay this one")
    paid.post("paid", paying_body(PAYMENT_MESSAGE, task["id"], Payer().sign_v1(offer_v1(task))), ACTIVATE)
    for task_id in ("no-such-task", task["id"]):
        answer = decline(paid, task_id)
        assert answer.get("error", {}).get("code") == -32001, answer
    assert held_unpaid(paid) == 0


def test_a_burst_of_unpaid_requests_holds_at_most_the_cap_on_postgresql(
    tmp_path, facilitator, start_gate, write_config, postgres_schema
):
    """20 unpaid requests of one caller at once, on a store where each request's count and insert
    interleave with the others': at most the cap (5) are held awaiting payment, the rest get the 402."""
    import asyncio
    import base64
    import os

    import psycopg

    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", facilitator).replace(
        'database = "gate.db"', f'database = "{postgres_schema.store_url()}"'
    )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    gate = start_gate(write_config(text), port=port, env={"A2A_GATE_SEALING_KEY": key})

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{gate.url}/a2a/paid", json=send_body(f"burst {i}"), headers=ACTIVATE)
                    for i in range(20)
                )
            )

    answers = asyncio.run(burst())
    with psycopg.connect(postgres_schema.url, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{postgres_schema.schema}"')
        [(held,)] = conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE owner LIKE 'payment-pending%%' AND state = 'input-required'"
        ).fetchall()
    assert held <= 5, f"{held} unpaid input-required tasks held, cap 5"
    assert sorted(r.status_code for r in answers) == [200] * held + [402] * (20 - held)
