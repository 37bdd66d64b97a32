"""The operator's side of usage pricing (x402 `upto`), against a real gate process and the
development facilitator: a usage ceiling ends the work, pricing callables may be `async`, a usage
report the agent gets wrong is its error, and a stream cut by a crash is not read back as completed.

Ceiling 50,000 atomic units at 10 a character (5,000 characters); the agent would stream 20 chunks
of 1,000 characters (20,000), each reported as used right after it is sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from devnet.payer import encode_header
from tests.support.gate_process import free_port
from tests.support.paid import Payer, decode_header, send_body
from tests.support.upto import CEILING, UNIT_PRICE, UptoSetup, pay_with_x402, sign_upto, upto_config, upto_price

PER_CHARACTER = f'{{ unit = "characters", unit_price = "{UNIT_PRICE}" }}'


def python_agent(
    name: str, function: str, usage: str = PER_CHARACTER, backend: str = "python", ceiling: int = CEILING
) -> str:
    callable_line = f'callable = "tests.support.ceiling_agents:{function}"\n' if backend == "python" else ""
    return f'\n[agents.{name}]\nbackend = "{backend}"\n{callable_line}price = {upto_price(usage, ceiling)}\n'


AGENTS = (
    python_agent("thousands", "thousands")
    + python_agent("thousands-small-ceiling", "thousands", ceiling=5000)  # one chunk prices 10,000
    + python_agent("fifteen-hundreds", "fifteen_hundreds")
    + python_agent("ends-past-the-ceiling", "ends_past_the_ceiling")
    + python_agent("misreports", "reports_then_misreports")
    + python_agent("misreports-whole", "answers_misreported")
    + python_agent("ten-until-told", "ten_until_told")
    + python_agent("priced-async", "", '{ callable = "tests.support.ceiling_agents:per_character_async" }', "echo")
    + python_agent("priced-sync", "", '{ callable = "tests.support.ceiling_agents:per_character" }', "echo")
    + python_agent(
        "stream-priced-async", "thousands", '{ callable = "tests.support.ceiling_agents:per_character_async" }'
    )
)


@pytest.fixture
def upto(tmp_path, start_gate, write_config):
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_facilitator_app(str(tmp_path / "ledger.db")), wait_on_exit=False) as facilitator:
        port = free_port()
        config = write_config(upto_config(f"http://127.0.0.1:{port}", facilitator, AGENTS))
        yield UptoSetup(start_gate(config, port=port), facilitator, tmp_path / "gate.db")


V1 = {"A2A-Version": "1.0"}
METHODS = {  # (method, headers): send and stream, both dialects
    "message/send": {},
    "message/stream": {},
    "SendMessage": V1,
    "SendStreamingMessage": V1,
}


def final_task(answer: httpx.Response, method: str) -> dict:
    """The Task a send answers with, or the one a stream ends with (its last status, its artifacts
    as the stream delivered them), in the v0.3 shape whichever dialect answered."""
    from tests.support.gate_helpers import sse_events

    assert answer.status_code == 200, answer.text
    if method in ("message/send", "SendMessage"):
        result = answer.json()["result"]
        return result["task"] if method == "SendMessage" else result
    events = [e["result"] for e in sse_events(answer.text)]
    if method == "SendStreamingMessage":
        events = [e.get("statusUpdate") or e.get("artifactUpdate") or e.get("task") for e in events]
    text = ""  # the answer as the stream gave it: chunks appended, a whole artifact in place of them
    for event in events:
        if "artifact" in event:
            chunk = "".join(p.get("text", "") for p in event["artifact"]["parts"])
            text = text + chunk if event.get("append") else chunk
    final = events[-1]
    assert "status" in final and final.get("final", True) is True, events
    assert final["status"]["state"] not in ("working", "TASK_STATE_WORKING"), events
    return {"status": final["status"], "metadata": final.get("metadata", {}), "streamed": text, "events": events}


def delivered_text(task: dict) -> str:
    """Every character of the answer the caller was given."""
    if "streamed" in task:
        return task["streamed"]
    return "".join(p.get("text", "") for a in task.get("artifacts") or [] for p in a["parts"])


def state(task: dict) -> str:
    return task["status"]["state"].removeprefix("TASK_STATE_").lower()


def receipt_of(task: dict) -> dict:
    return task["status"]["message"]["metadata"]["x402.payment.receipts"][-1]


def agent_log(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_closed(path: Path) -> list[str]:
    deadline = time.monotonic() + 10
    while "closed" not in agent_log(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return agent_log(path)


@pytest.mark.parametrize("method", list(METHODS))
def test_the_ceiling_ends_a_stream_at_exactly_its_worth_charged_the_ceiling(upto, tmp_path, method):
    """Twenty chunks of 1,000 characters against 5,000 characters' worth: five are delivered, the
    ceiling is charged, the agent is stopped there, the task says why (send and stream, both dialects)."""
    payer = Payer()
    before = upto.balance(payer.address)
    log = tmp_path / f"agent-{method.replace('/', '-')}.log"
    answer = pay_with_x402(upto.url("thousands"), send_body(str(log), method=method), payer.key, METHODS[method])
    assert answer.status_code == 200, answer.text
    task = final_task(answer, method)
    text = delivered_text(task)
    assert len(text) == CEILING // UNIT_PRICE == 5000, len(text)
    assert [text[i * 1000 : i * 1000 + 4] for i in range(5)] == ["0000", "0001", "0002", "0003", "0004"]
    assert state(task) == "completed"
    assert "ceiling" in task["status"]["message"]["parts"][0]["text"]
    receipt = receipt_of(task)
    assert receipt["amount"] == str(CEILING) and receipt["extra"]["usage"]["ceilingReached"] is True
    assert receipt["extra"]["usage"]["units"] == {"characters": 5000}
    assert upto.balance(payer.address) == before - CEILING
    assert [t["amount"] for t in upto.transfers()] == [CEILING]
    # the agent was told to stop at the fifth chunk: it made no sixth
    assert wait_closed(log) == [f"made {i}" for i in range(5)] + ["closed"]
    time.sleep(0.3)
    assert agent_log(log)[-1] == "closed"
    # the stored task says the same
    [stored] = upto.rows("SELECT document FROM tasks")
    document = json.loads(stored["document"])
    assert document["status"]["state"] == "completed"
    assert sum(len(p["text"]) for a in document["artifacts"] for p in a["parts"]) == 5000


@pytest.mark.parametrize("method", ["message/send", "SendStreamingMessage"])
def test_a_chunk_that_would_cross_the_ceiling_is_not_delivered(upto, tmp_path, method):
    """Chunks of 1,500 characters: three (45,000) fit, the fourth would price 60,000. It is never
    shown; the work delivered is charged, and no more."""
    payer = Payer()
    before = upto.balance(payer.address)
    log = tmp_path / "agent.log"
    answer = pay_with_x402(upto.url("fifteen-hundreds"), send_body(str(log), method=method), payer.key, METHODS[method])
    task = final_task(answer, method)
    assert len(delivered_text(task)) == 4500 and state(task) == "completed"
    receipt = receipt_of(task)
    assert receipt["amount"] == "45000" and receipt["extra"]["usage"]["ceilingReached"] is True
    assert upto.balance(payer.address) == before - 45000
    assert wait_closed(log) == [f"made {i}" for i in range(4)] + ["closed"]
    if method == "SendStreamingMessage":
        assert not any("0003" in json.dumps(e) for e in task["events"])


@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_a_last_chunk_that_would_cross_the_ceiling_is_not_delivered_either(upto, method):
    """The agent's answer ends with a chunk whose usage comes with its final reply, past the ceiling:
    the answer ends with the three chunks before it, charged 45,000."""
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("ends-past-the-ceiling"), send_body("go", method=method), payer.key)
    task = final_task(answer, method)
    assert len(delivered_text(task)) == 4500 and "0003" not in delivered_text(task)
    assert state(task) == "completed" and "ceiling" in task["status"]["message"]["parts"][0]["text"]
    assert receipt_of(task)["amount"] == "45000" and receipt_of(task)["extra"]["usage"]["ceilingReached"] is True
    assert upto.balance(payer.address) == before - 45000


def test_a_first_chunk_past_the_ceiling_delivers_nothing_and_charges_nothing(upto, tmp_path):
    payer = Payer()
    before = upto.balance(payer.address)
    log = tmp_path / "agent.log"
    answer = pay_with_x402(upto.url("thousands-small-ceiling"), send_body(str(log), method="message/stream"), payer.key)
    task = final_task(answer, "message/stream")
    assert state(task) == "failed" and delivered_text(task) == ""
    assert "ceiling" in task["status"]["message"]["parts"][0]["text"]
    assert upto.balance(payer.address) == before and upto.settle_calls() == 0
    assert [r["action"] for r in upto.rows("SELECT action FROM payments WHERE action != 'verify'")] == ["release"]
    assert wait_closed(log) == ["made 0", "closed"]


def test_an_async_pricing_callable_is_awaited_and_charges_its_answer(upto):
    payer = Payer()
    before = upto.balance(payer.address)
    text = "priced by a coroutine"
    answer = pay_with_x402(upto.url("priced-async"), send_body(text), payer.key)
    task = answer.json()["result"]
    receipt = decode_header(answer.headers["PAYMENT-RESPONSE"])
    assert receipt["amount"] == str(UNIT_PRICE * len(text)), receipt
    assert "error" not in receipt["extra"]["usage"] and state(task) == "completed"
    assert upto.balance(payer.address) == before - UNIT_PRICE * len(text)
    sync = pay_with_x402(upto.url("priced-sync"), send_body(text), payer.key)
    assert decode_header(sync.headers["PAYMENT-RESPONSE"])["amount"] == str(UNIT_PRICE * len(text))
    assert upto.balance(payer.address) == before - 2 * UNIT_PRICE * len(text)


def test_an_async_pricing_callable_enforces_the_ceiling_of_a_stream(upto, tmp_path):
    payer = Payer()
    before = upto.balance(payer.address)
    log = tmp_path / "agent.log"
    answer = pay_with_x402(upto.url("stream-priced-async"), send_body(str(log), method="message/stream"), payer.key)
    task = final_task(answer, "message/stream")
    assert len(delivered_text(task)) == 5000 and receipt_of(task)["amount"] == str(CEILING)
    assert upto.balance(payer.address) == before - CEILING
    assert wait_closed(log)[-2:] == ["made 4", "closed"]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "negative", "huge", "hugeint", "text"])
@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_a_bad_usage_report_is_the_agents_error_and_only_what_was_delivered_is_charged(upto, bad, method):
    """A chunk reported well (7 characters), then one reported NaN, infinite, negative, past any
    bound (1e308 twice) or not a number: the run fails as the agent's error; the first chunk is
    charged, the second never shown; never a 500, never a task left working."""
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("misreports"), send_body(bad, method=method), payer.key)
    assert answer.status_code == 200, answer.text
    task = final_task(answer, method)
    assert state(task) == "failed", task["status"]
    assert "The agent reported usage that is not a count" in task["status"]["message"]["parts"][0]["text"]
    assert delivered_text(task) == "first; "
    assert receipt_of(task)["amount"] == str(7 * UNIT_PRICE)
    assert upto.balance(payer.address) == before - 7 * UNIT_PRICE
    [stored] = upto.rows("SELECT document FROM tasks")
    assert json.loads(stored["document"])["status"]["state"] == "failed"
    log = upto.gate.log.read_text()
    assert "Traceback" not in log and "agent misreports reported usage that is not a count" in log


@pytest.mark.parametrize("bad", ["nan", "negative", "huge", "hugeint"])
def test_a_whole_answer_with_a_bad_usage_report_is_not_delivered_nor_charged(upto, bad):
    payer = Payer()
    before = upto.balance(payer.address)
    answer = pay_with_x402(upto.url("misreports-whole"), send_body(bad), payer.key)
    assert answer.status_code == 200, answer.text
    task = answer.json()["result"]
    assert state(task) == "failed" and not task.get("artifacts")
    assert "The agent reported usage that is not a count" in task["status"]["message"]["parts"][0]["text"]
    assert "PAYMENT-RESPONSE" not in answer.headers
    assert upto.balance(payer.address) == before and upto.settle_calls() == 0
    assert [r["action"] for r in upto.rows("SELECT action FROM payments WHERE action != 'verify'")] == ["release"]
    assert upto.rows("SELECT state FROM claims") == []  # released: nothing owed, the token may be used again


def test_a_stream_cut_by_a_crash_after_three_of_ten_chunks_reads_back_failed(upto, tmp_path):
    """SIGKILL with three chunks delivered; `a2a-gate reconcile` settles them, once; the task then
    stored, read back (tasks/get) and replayed says the run was cut, not completed."""
    payer = Payer()
    before = upto.balance(payer.address)
    headers = {"PAYMENT-SIGNATURE": encode_header(sign_upto(upto.offer("ten-until-told"), payer.key))}
    seen: list[dict] = []
    three = threading.Event()
    body = send_body(str(tmp_path / "never"), method="message/stream")

    def follow() -> None:
        try:
            with httpx.stream("POST", upto.url("ten-until-told"), json=body, headers=headers, timeout=30) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data:"):
                        seen.append(json.loads(line[5:])["result"])
                        if sum(e.get("kind") == "artifact-update" for e in seen) == 3:
                            three.set()
        except httpx.HTTPError:
            pass  # the server died under the stream

    reader = threading.Thread(target=follow)
    reader.start()
    assert three.wait(15), seen
    task_id = seen[-1]["taskId"]
    upto.gate.kill()
    reader.join(15)
    time.sleep(2.5)  # the dead owner's lease runs out
    command = [sys.executable, "-m", "gate.cli", "reconcile", "--config", str(upto.gate.config)]
    subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    delivered = "".join(f"chunk {i}; " for i in range(3))
    assert upto.balance(payer.address) == before - UNIT_PRICE * len(delivered)
    [stored] = upto.rows("SELECT document FROM tasks")
    document = json.loads(stored["document"])
    assert document["status"]["state"] == "failed", document["status"]
    assert document["status"]["message"]["parts"][0]["text"] != "Done."
    assert document["metadata"]["x402.payment.status"] == "payment-completed"
    assert "".join(p["text"] for a in document["artifacts"] for p in a["parts"]) == delivered
    # a gate started again reads it back, and replays it, the same way
    upto.gate.start()
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}
    read = httpx.post(upto.url("ten-until-told"), json=get, headers=headers, timeout=30).json()["result"]
    assert read["status"]["state"] == "failed"
    again = httpx.post(upto.url("ten-until-told"), json=body, headers=headers, timeout=30)
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    replayed = final_task(again, "message/stream")
    assert state(replayed) == "failed" and receipt_of(replayed)["amount"] == str(UNIT_PRICE * len(delivered))
    assert len(upto.transfers()) == 1


def stored_task(state: str, *, partial: bool) -> dict:
    artifact = {"artifactId": "a", "name": "result", "parts": [{"kind": "text", "text": "chunk 0; "}]}
    if partial:
        artifact["metadata"] = {"partial": True}
    return {"id": "t", "contextId": "c", "status": {"state": state}, "artifacts": [artifact]}


@pytest.mark.parametrize(
    ("state", "partial", "after"),
    [
        ("working", True, "failed"),  # cut by a crash while delivered in parts
        ("submitted", True, "failed"),
        ("working", False, "completed"),  # the whole answer's delivery was saved, then the crash
        ("canceled", False, "canceled"),  # ended before a later settle pass recorded its payment
        ("failed", False, "failed"),
        ("input-required", False, "input-required"),
        ("completed", False, "completed"),
    ],
)
def test_a_repaired_task_ends_as_its_delivery_did(state, partial, after):
    from gate.settlement import attach_payment_metadata, completed_metadata

    task = stored_task(state, partial=partial)
    attach_payment_metadata(task, completed_metadata({"amount": "90"}))
    assert task["status"]["state"] == after
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert task["status"]["message"]["metadata"]["x402.payment.receipts"] == [{"amount": "90"}]
    assert "metadata" not in task["artifacts"][0]  # the mark is gone with the repair
    if partial:
        assert "part of the answer" in task["status"]["message"]["parts"][0]["text"]
