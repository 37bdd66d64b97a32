"""Usage pricing (x402 `upto`) against a real gate process and the x402 package's own upto client.

The facilitator is the development facilitator: the x402 package's upto facilitator scheme over
the development chain with Permit2 and x402's upto proxy (devnet/permit2.py). The payer authorizes the ceiling; the gate settles the
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
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_facilitator_app(str(tmp_path / "ledger.db")), wait_on_exit=False) as facilitator:
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
    # metrics count both: what was authorized, what was charged
    import httpx

    metrics = httpx.get(f"{upto.gate.url}/metrics").text
    money = 'asset="0x036CbD53842c5426634e7929541eC2318f3dCF7e",network="eip155:84532"'
    assert f"a2a_gate_authorized_atomic_total{{{money}}} {float(CEILING)}" in metrics
    assert f"a2a_gate_revenue_atomic_total{{{money}}} {float(charged)}" in metrics
    assert 'a2a_gate_usage_charges_total{outcome="priced"} 1.0' in metrics
    # and `a2a-gate payments` shows the charged amount beside the authorized one
    import subprocess
    import sys

    listing = subprocess.run(
        [sys.executable, "-m", "gate.cli", "payments", "--action", "settle", "--config", str(upto.gate.config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = listing.splitlines()
    columns = dict(zip(header.split("\t"), row.split("\t"), strict=True))
    assert (columns["amount"], columns["authorized"]) == (str(charged), str(CEILING))


def test_an_upto_offer_after_a_fixed_one_charges_the_priced_usage(upto):
    """The price's first offer is `exact`: an upto payment is still charged by its own offer's usage."""
    assert [a["scheme"] for a in upto.offer("paid-metered-second")["accepts"]] == ["exact", "upto"]
    payer = Payer()
    before = upto.balance(payer.address)
    text = "second offer"
    answer = pay_with_x402(upto.url("paid-metered-second"), send_body(text), payer.key)
    assert answer.status_code == 200, answer.text
    charged = UNIT_PRICE * len(text)
    assert receipts(answer)[0]["amount"] == str(charged) and charged < CEILING
    assert upto.balance(payer.address) == before - charged


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
    assert len(upto.transfers()) == 1 and upto.settle_calls() == 1


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
    assert upto.settle_calls() == 0 and upto.transfers() == []
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
    assert upto.balance(payer.address) == before and upto.settle_calls() == 0
    assert upto.rows("SELECT action FROM payments WHERE action IN ('settle', 'no_charge')") == []


def stream_events(answer) -> list[dict]:
    from tests.support.gate_helpers import sse_events

    return [event.get("result", event) for event in sse_events(answer.text)]


def chunk_price(chunks: list[str]) -> int:
    """tests.support.pricing:per_chunk for these chunks."""
    return 100 * len(chunks) + sum(len(c) for c in chunks)


def test_a_stream_is_delivered_chunk_by_chunk_and_charged_its_usage(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("paid-metered-chunks"), send_body("go", method="message/stream"), payer.key)
    assert answer.status_code == 200, answer.text
    events = stream_events(answer)
    chunks = [e["artifact"]["parts"][0]["text"] for e in events if e.get("kind") == "artifact-update"]
    expected = [f"chunk {i} of go; " for i in range(5)]
    assert chunks[:5] == expected and chunks[5] == "".join(expected)  # each chunk, then the whole answer
    final = events[-1]
    assert final["final"] is True and final["status"]["state"] == "completed"
    [receipt] = final["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["amount"] == str(chunk_price(expected))
    assert receipt["extra"]["usage"]["units"] == {"chunks": 5, "characters": sum(map(len, expected))}
    assert upto.balance(payer.address) == before - chunk_price(expected)
    assert len(upto.transfers()) == 1


def test_a_stream_cut_after_two_of_five_chunks_settles_exactly_those_two(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("paid-metered-cut"), send_body("go", method="message/stream"), payer.key)
    events = stream_events(answer)
    chunks = [e["artifact"]["parts"][0]["text"] for e in events if e.get("kind") == "artifact-update"]
    delivered = ["chunk 0; ", "chunk 1; "]
    assert chunks == delivered
    final = events[-1]
    assert final["status"]["state"] == "failed"
    [receipt] = final["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["amount"] == str(chunk_price(delivered)) and receipt["success"] is True
    assert upto.balance(payer.address) == before - chunk_price(delivered)
    # the stored task keeps what was delivered, and what it was charged
    import httpx

    task_id = final["taskId"]
    [claim] = upto.rows("SELECT state, task_id FROM claims")
    assert claim == {"state": "settled", "task_id": task_id}
    [settle] = upto.rows("SELECT amount, authorized FROM payments WHERE action = 'settle'")
    assert settle == {"amount": str(chunk_price(delivered)), "authorized": str(CEILING)}
    assert httpx.get(f"{upto.gate.url}/healthz").status_code == 200


def test_a_stream_canceled_after_two_chunks_settles_what_was_delivered(upto, tmp_path):
    import threading

    import httpx

    from devnet.payer import encode_header
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)
    headers = {"PAYMENT-SIGNATURE": encode_header(sign_upto(upto.offer("paid-metered-waits"), payer.key))}
    signal = tmp_path / "never"
    seen: list[dict] = []
    two = threading.Event()

    def follow() -> None:
        body = send_body(str(signal), method="message/stream")
        with httpx.stream("POST", upto.url("paid-metered-waits"), json=body, headers=headers, timeout=30) as answer:
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    import json

                    seen.append(json.loads(line[5:])["result"])
                    if sum(e.get("kind") == "artifact-update" for e in seen) == 2:
                        two.set()

    reader = threading.Thread(target=follow)
    reader.start()
    assert two.wait(15), seen
    task_id = seen[-1]["taskId"]
    cancel = {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": task_id}}
    canceled = httpx.post(upto.url("paid-metered-waits"), json=cancel, headers=headers, timeout=30).json()
    reader.join(15)
    assert canceled["result"]["status"]["state"] == "canceled", canceled
    delivered = ["chunk 0; ", "chunk 1; "]
    final = seen[-1]
    assert final["final"] is True and final["status"]["state"] == "canceled"
    [receipt] = final["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["amount"] == str(chunk_price(delivered))
    assert upto.balance(payer.address) == before - chunk_price(delivered)


def test_v1_dialect_send_message_is_charged_its_usage(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    text = "v1 dialect"
    answer = pay_with_x402(
        upto.url("paid-metered"), send_body(text, method="SendMessage"), payer.key, {"A2A-Version": "1.0"}
    )
    task = answer.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    receipt = task["metadata"]["x402.payment.receipts"][-1]
    assert receipt == decode_header(answer.headers["PAYMENT-RESPONSE"])
    assert receipt["amount"] == str(UNIT_PRICE * len(text))
    assert upto.balance(payer.address) == before - UNIT_PRICE * len(text)


@pytest.mark.parametrize("method", ["message/send", "SendMessage"])
def test_a_non_blocking_send_polled_with_tasks_get_is_charged_once(upto, method):
    import httpx

    from devnet.payer import encode_header
    from tests.support.gate_helpers import poll
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)
    headers = {"PAYMENT-SIGNATURE": encode_header(sign_upto(upto.offer("paid-metered-chunks"), payer.key))}
    if method == "SendMessage":
        headers["A2A-Version"] = "1.0"
    started = httpx.post(
        upto.url("paid-metered-chunks"), json=send_body("later", method=method, blocking=False), headers=headers
    ).json()["result"]
    task_id = started["task"]["id"] if "task" in started else started["id"]
    get = {"jsonrpc": "2.0", "id": 3, "method": "tasks/get" if method == "message/send" else "GetTask"}
    get["params"] = {"id": task_id}

    def fetch() -> dict:
        return httpx.post(upto.url("paid-metered-chunks"), json=get, headers=headers).json()["result"]

    done = poll(fetch, lambda t: "receipts" in str(t.get("metadata", {})))
    expected = [f"chunk {i} of later; " for i in range(5)]
    assert done["metadata"]["x402.payment.receipts"][-1]["amount"] == str(chunk_price(expected))
    assert upto.balance(payer.address) == before - chunk_price(expected)
    assert len(upto.transfers()) == 1


def test_each_turn_of_an_input_required_task_is_charged_what_it_delivered(upto):
    import httpx

    from devnet.payer import encode_header
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)

    def paying() -> dict[str, str]:
        return {"PAYMENT-SIGNATURE": encode_header(sign_upto(upto.offer("paid-metered-asks"), payer.key))}

    first = httpx.post(upto.url("paid-metered-asks"), json=send_body("weather?"), headers=paying(), timeout=30)
    task = first.json()["result"]
    assert task["status"]["state"] == "input-required"
    turn_one = UNIT_PRICE * len("looking up ")
    assert receipts(first)[0]["amount"] == str(turn_one)  # the pause settled what the turn delivered
    assert upto.balance(payer.address) == before - turn_one
    second = httpx.post(
        upto.url("paid-metered-asks"), json=send_body("Paris", task_id=task["id"]), headers=paying(), timeout=30
    )
    done = second.json()["result"]
    assert done["id"] == task["id"] and done["status"]["state"] == "completed"
    turn_two = UNIT_PRICE * len("forecast for Paris: sunny")
    assert receipts(second)[0]["amount"] == str(turn_two)
    assert upto.balance(payer.address) == before - turn_one - turn_two
    assert [t["amount"] for t in upto.transfers()] == [turn_one, turn_two]


def test_an_in_band_payment_is_offered_the_ceiling_and_charged_the_usage(upto):
    import httpx

    from tests.support.in_band import ACTIVATE, REQUIRED_V2, paying_body, payment_metadata, task_of
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)
    text = "in band, metered"
    asked = httpx.post(upto.url("paid-metered"), json=send_body(text), headers=ACTIVATE).json()["result"]
    assert task_of(asked)["status"]["state"] == "input-required"
    metadata = payment_metadata(task_of(asked))
    assert metadata["x402.payment.required"]["accepts"] == []  # no x402 v1 client signs upto
    # the payer signs the x402 v2 document beside it (the upto client speaks v2 only)
    required = metadata[REQUIRED_V2]
    [offer] = required["accepts"]
    assert offer["scheme"] == "upto" and offer["amount"] == str(CEILING)
    assert offer["extra"]["facilitatorAddress"] and offer["extra"]["assetTransferMethod"] == "permit2"
    payload = sign_upto(required, payer.key)
    paid = httpx.post(
        upto.url("paid-metered"), json=paying_body("pay", asked["id"], payload), headers=ACTIVATE, timeout=30
    )
    task = task_of(paid.json()["result"])
    assert task["status"]["state"] == "completed"
    [receipt] = task["metadata"]["x402.payment.receipts"]
    assert receipt == decode_header(paid.headers["PAYMENT-RESPONSE"])
    assert receipt["amount"] == str(UNIT_PRICE * len(text))  # the original message's answer, not "pay"
    assert upto.balance(payer.address) == before - UNIT_PRICE * len(text)


RAISING_COPY = """
[agents.paid-metered-raising]
description = "paid-metered, priced by a callable that raises"
price = { scheme = "upto", network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", ceiling = "50000", facilitator_address = "0xFB0b6D1F8B44CAeaC383d5AC8C0b374BB08E2619", usage = { callable = "operator_pricing:price" } }
"""


def test_the_example_configuration_serves_paid_metered_with_the_dev_facilitator(tmp_path):
    """The first README command on the shipped example, with a raising copy of the agent beside it."""
    import shutil

    from tests.support.gate_process import GateProcess

    config = tmp_path / "a2a-gate.toml"
    shutil.copy("config/a2a-gate.example.toml", config)
    with config.open("a") as file:
        file.write(RAISING_COPY)
    (tmp_path / "operator_pricing.py").write_text("def price(usage):\n    raise ZeroDivisionError('oops')\n")
    facilitator_port = free_port()
    gate = GateProcess(config, tmp_path / "gate.log", extra_args=["--dev-facilitator", str(facilitator_port)])
    gate.start(timeout=90)
    try:
        upto = UptoSetup(gate, f"http://127.0.0.1:{facilitator_port}", tmp_path / "a2a-gate.db")
        [accepted] = upto.offer("paid-metered")["accepts"]
        assert (accepted["scheme"], accepted["amount"]) == ("upto", "50000")
        payer = Payer()
        before = upto.balance(payer.address)
        amounts = []
        for text in ("hi", "a longer answer"):
            answer = pay_with_x402(upto.url("paid-metered"), send_body(text), payer.key)
            header, receipt = receipts(answer)
            assert header == receipt and receipt["extra"]["usage"]["units"] == {"characters": len(text)}
            amounts.append(int(receipt["amount"]))
        assert amounts == [10 * 2, 10 * 15] and max(amounts) < 50000
        assert upto.balance(payer.address) == before - sum(amounts)
        assert [t["amount"] for t in upto.transfers()] == amounts  # once each
        free = pay_with_x402(upto.url("paid-metered-raising"), send_body("no charge"), payer.key)
        assert free.status_code == 200 and receipts(free)[0]["amount"] == "0"
        assert upto.balance(payer.address) == before - sum(amounts) and len(upto.transfers()) == 2
        assert "pricing its usage failed (ZeroDivisionError)" in (tmp_path / "gate.log").read_text()
    finally:
        gate.stop()


def test_a_v1_dialect_stream_is_charged_chunk_by_chunk_too(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    body = send_body("v1", method="SendStreamingMessage")
    answer = pay_with_x402(upto.url("paid-metered-chunks"), body, payer.key, {"A2A-Version": "1.0"})
    assert answer.status_code == 200, answer.text
    events = stream_events(answer)
    chunks = [e["artifactUpdate"]["artifact"]["parts"][0]["text"] for e in events if "artifactUpdate" in e]
    expected = [f"chunk {i} of v1; " for i in range(5)]
    assert chunks[:5] == expected
    final = [e["statusUpdate"] for e in events if "statusUpdate" in e][-1]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    [receipt] = final["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["amount"] == str(chunk_price(expected))
    assert upto.balance(payer.address) == before - chunk_price(expected)


def test_a_crash_after_two_streamed_chunks_leaves_them_owed_and_they_are_settled_once(upto, tmp_path):
    """SIGKILL with two chunks delivered: the claim is owed for exactly those (its charge was sealed
    with each chunk's record), and `a2a-gate reconcile` collects that amount, once."""
    import json
    import subprocess
    import sys
    import threading
    import time

    import httpx

    from devnet.payer import encode_header
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)
    headers = {"PAYMENT-SIGNATURE": encode_header(sign_upto(upto.offer("paid-metered-waits"), payer.key))}
    seen: list[dict] = []
    two = threading.Event()

    def follow() -> None:
        body = send_body(str(tmp_path / "never"), method="message/stream")
        try:
            with httpx.stream("POST", upto.url("paid-metered-waits"), json=body, headers=headers, timeout=30) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data:"):
                        seen.append(json.loads(line[5:])["result"])
                        if sum(e.get("kind") == "artifact-update" for e in seen) == 2:
                            two.set()
        except httpx.HTTPError:
            pass  # the server died under the stream

    reader = threading.Thread(target=follow)
    reader.start()
    assert two.wait(15), seen
    upto.gate.kill()
    reader.join(15)
    assert upto.balance(payer.address) == before and upto.settle_calls() == 0  # nothing settled yet
    [claim] = upto.rows("SELECT state FROM claims")
    assert claim["state"] == "settling"  # delivered in part: owed, never released
    time.sleep(2.5)  # the dead owner's lease runs out
    command = [sys.executable, "-m", "gate.cli", "reconcile", "--config", str(upto.gate.config)]
    subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    delivered = ["chunk 0; ", "chunk 1; "]
    assert upto.balance(payer.address) == before - chunk_price(delivered)
    [claim] = upto.rows("SELECT state, receipt FROM claims")
    assert claim["state"] == "settled" and json.loads(claim["receipt"])["amount"] == str(chunk_price(delivered))
    subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    assert len(upto.transfers()) == 1  # once


def test_an_in_band_stream_of_an_upto_agent_is_charged_chunk_by_chunk(upto):
    import httpx

    from tests.support.in_band import ACTIVATE, REQUIRED_V2, paying_body, payment_metadata, sse_results, task_of
    from tests.support.upto import sign_upto

    payer = Payer()
    before = upto.balance(payer.address)
    asked = httpx.post(upto.url("paid-metered-chunks"), json=send_body("ib"), headers=ACTIVATE).json()["result"]
    payload = sign_upto(payment_metadata(task_of(asked))[REQUIRED_V2], payer.key)
    body = paying_body("pay", asked["id"], payload, method="message/stream")
    answer = httpx.post(upto.url("paid-metered-chunks"), json=body, headers=ACTIVATE, timeout=30)
    events = [r["result"] for r in sse_results(answer)]
    chunks = [e["artifact"]["parts"][0]["text"] for e in events if e.get("kind") == "artifact-update"]
    expected = [f"chunk {i} of ib; " for i in range(5)]
    assert chunks[:5] == expected
    final = events[-1]
    assert final["status"]["state"] == "completed"
    [receipt] = final["status"]["message"]["metadata"]["x402.payment.receipts"]
    assert receipt["amount"] == str(chunk_price(expected))
    assert upto.balance(payer.address) == before - chunk_price(expected)


def test_an_x402_v1_payment_for_an_upto_agent_is_refused_not_a_500(upto):
    """x402 v1 has no upto: a v1 payload (X-PAYMENT) shaped like one is refused with a reason."""
    import httpx

    from devnet.payer import encode_header
    from tests.support.upto import sign_upto

    signed = sign_upto(upto.offer("paid-metered"), Payer().key)
    v1 = {"x402Version": 1, "scheme": "upto", "network": "base-sepolia", "payload": signed["payload"]}
    answer = httpx.post(
        upto.url("paid-metered"), json=send_body("v1"), headers={"X-PAYMENT": encode_header(v1)}, timeout=30
    )
    assert answer.status_code == 403, answer.text
    assert answer.json()["detail"] == "Payment verification failed" and answer.json()["error"]
    assert upto.transfers() == []
