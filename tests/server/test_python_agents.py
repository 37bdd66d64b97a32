"""An operator's own Python agents, served by a real `a2a-gate serve` process.

A module beside the configuration file, an agent that raises, an agent that streams
as an async generator (free and paid, a withholding one too), and the message and
task states such agents meet.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.docs_examples import examples, write_example
from tests.support.gate_helpers import (
    artifact_texts,
    bearer,
    create_key,
    result,
    rpc,
    sse_events,
    status_text,
    v03_message,
    wait_for,
)
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, make_poor_after_verify, paid_config, send_body

BOOM = """
[agents.boom]
backend = "python"
callable = "boom:answer"

[agents.interrupting]
backend = "python"
callable = "tests.support.agents:ask_then_answer"

[agents.echo-in-error]
backend = "python"
callable = "boom:echo_in_error"

[agents.told]
backend = "python"
callable = "tests.support.agents:writes_when_told"

[agents.streams-then-asks]
backend = "python"
callable = "tests.support.agents:streams_then_asks"
"""

BOOM_PY = """
async def answer(request):
    raise RuntimeError("the weather service is down")


async def echo_in_error(request):
    raise RuntimeError("bad input: " + request.text)
"""


def free_gate(
    tmp_path: Path, start_gate: Callable[..., GateProcess], config: Path
) -> tuple[GateProcess, dict[str, str]]:
    key = create_key(config, "me")
    return start_gate(config), bearer(key)


def boom_gate(tmp_path: Path, start_gate: Callable[..., GateProcess]) -> tuple[GateProcess, dict[str, str]]:
    (tmp_path / "boom.py").write_text(BOOM_PY)
    config = tmp_path / "gate.toml"
    config.write_text(BOOM)
    return free_gate(tmp_path, start_gate, config)


def stream(url: str, body: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return [event["result"] for event in sse_events(response.text)]


def request_lines(log: Path, agent: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if "a2a_gate.requests" in line and f"agent={agent}" in line]


# --- a module beside the configuration ------------------------------------------


def test_a_module_beside_the_config_is_served_from_another_directory(tmp_path: Path, start_gate) -> None:
    config = write_example("callable", tmp_path / "site")
    gate, auth = free_gate(tmp_path, start_gate, config)  # started with the repository as its cwd
    task = result(f"{gate.url}/a2a/mine", "message/send", {"message": v03_message("hi")}, auth)
    assert task["status"]["state"] == "completed", task
    assert artifact_texts(task) == ["You said: hi"]


# --- an agent that raises ------------------------------------------------------------


def test_an_agent_that_raises_is_logged_with_its_message_and_traceback(tmp_path: Path, start_gate) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    task = result(f"{gate.url}/a2a/boom", "message/send", {"message": v03_message("hi")}, auth)
    assert task["status"]["state"] == "failed"
    assert "the weather service is down" not in json.dumps(task)  # the caller sees no internals
    log = tmp_path / "gate.log"
    wait_for(lambda: bool(request_lines(log, "boom")))
    text = log.read_text()
    assert "agent boom raised RuntimeError: the weather service is down" in text
    assert "Traceback (most recent call last)" in text
    assert 'boom.py", line 3, in answer' in text
    [line] = request_lines(log, "boom")
    assert "outcome=agent_error" in line, line


def test_a_callers_text_in_an_agents_exception_cannot_forge_a_log_line(tmp_path: Path, start_gate) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    forged = "x\n2001-01-01T00:00:00Z INFO a2a_gate.requests agent=forged outcome=paid\u2028also"
    task = result(f"{gate.url}/a2a/echo-in-error", "message/send", {"message": v03_message(forged)}, auth)
    assert task["status"]["state"] == "failed"
    log = tmp_path / "gate.log"
    wait_for(lambda: bool(request_lines(log, "echo-in-error")))
    lines = log.read_text().split("\n")
    assert not [line for line in lines if line.startswith("2001-01-01")], lines
    assert "\u2028" not in log.read_text()
    assert any(line.startswith("    RuntimeError: bad input: x") for line in lines)


def test_a_paid_agent_that_raises_is_an_agent_error_and_charges_nothing(paid: PaidSetup, tmp_path: Path) -> None:
    response = paid.post("paid-broken", send_body("x"), Payer().header_for(paid.gate.url, "paid-broken"))
    task = response.json()["result"]
    assert task["status"]["state"] == "failed"
    assert paid.ledger()["settlements"] == []
    log = tmp_path / "gate.log"
    wait_for(lambda: any("outcome=agent_error" in line for line in request_lines(log, "paid-broken")))
    assert "agent paid-broken raised RuntimeError: agent bug" in log.read_text()
    assert "Traceback (most recent call last)" in log.read_text()


# --- streaming agents (async generators) -----------------------------------------------


def test_a_streaming_agent_streams_its_chunks_and_sends_the_whole_answer(tmp_path: Path, start_gate) -> None:
    gate, auth = free_gate(tmp_path, start_gate, write_example("streaming", tmp_path))
    url = f"{gate.url}/a2a/writer"
    events = stream(url, {**send_body("one two three", method="message/stream")}, auth)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task" and kinds[-1] == "status-update", kinds
    thinking = [e for e in events if e["kind"] == "status-update" and status_text(e) == "thinking..."]
    assert thinking and thinking[0]["status"]["state"] == "working" and thinking[0]["final"] is False
    chunks = [e for e in events if e["kind"] == "artifact-update"]
    assert [c["artifact"]["parts"][0]["text"] for c in chunks] == ["one ", "two ", "three ", "one two three "]
    assert [c.get("append") for c in chunks] == [False, True, True, False]
    assert [c["lastChunk"] for c in chunks] == [False, False, False, True]
    assert len({c["artifact"]["artifactId"] for c in chunks}) == 1  # one artifact, built up then whole
    assert events[-1]["status"]["state"] == "completed" and events[-1]["final"] is True

    task = result(url, "message/send", {"message": v03_message("four five")}, auth)
    assert task["status"]["state"] == "completed"
    assert [a["parts"] for a in task["artifacts"]] == [[{"kind": "text", "text": "four five "}]]


def test_stream_subscribers_see_each_chunk_while_the_agent_still_runs(tmp_path: Path, start_gate) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    go = tmp_path / "go"
    seen: list[dict[str, Any]] = []
    body = send_body(str(go), method="message/stream")
    with httpx.stream("POST", f"{gate.url}/a2a/told", json=body, headers=auth, timeout=30) as response:
        buffer = ""
        for piece in response.iter_text():
            buffer += piece
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                if block.startswith("data:"):
                    event = json.loads(block[5:])["result"]
                    seen.append(event)
                    if event["kind"] == "artifact-update" and event["artifact"]["parts"][0]["text"] == "first ":
                        go.touch()  # the agent waits for this: only a live stream gets here
    texts = [e["artifact"]["parts"][0]["text"] for e in seen if e["kind"] == "artifact-update"]
    assert texts == ["first ", "second", "first second"]
    assert seen[-1]["status"]["state"] == "completed"


def test_a_streaming_agent_pauses_with_a_status_and_ends_with_a_reply(tmp_path: Path, start_gate) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    url = f"{gate.url}/a2a/streams-then-asks"
    asked = result(url, "message/send", {"message": v03_message("weather?")}, auth)
    assert asked["status"]["state"] == "input-required"
    assert status_text(asked) == "Which city?"
    body = {"message": v03_message("Rome", taskId=asked["id"])}
    answered = result(url, "message/send", body, auth)
    assert answered["status"]["state"] == "completed"
    assert artifact_texts(answered)[-1] == "Rome: sunny"  # the reply it yielded, not the chunks before it


STREAMING_PAID = f"""
[agents.paid-writer]
backend = "python"
callable = "writer:write"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.paid-half-writer]
backend = "python"
callable = "tests.support.agents:streams_then_raises"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.withheld-writer]
backend = "python"
callable = "tests.support.agents:slow_writer"
on_settle_failure = "withhold"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""


def streaming_paid(tmp_path: Path, facilitator: str, start_gate) -> PaidSetup:
    (tmp_path / "writer.py").write_text(examples()["streaming/writer.py"])
    port = free_port()
    config = tmp_path / "gate.toml"
    config.write_text(paid_config(f"http://127.0.0.1:{port}", facilitator) + STREAMING_PAID)
    gate = start_gate(config, port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def test_a_paid_streaming_agent_is_delivered_and_settled_once(tmp_path: Path, facilitator: str, start_gate) -> None:
    paid = streaming_paid(tmp_path, facilitator, start_gate)
    headers = Payer().header_for(paid.gate.url, "paid-writer")
    events = stream(f"{paid.gate.url}/a2a/paid-writer", send_body("pay me", method="message/stream"), headers)
    chunks = [e["artifact"]["parts"][0]["text"] for e in events if e["kind"] == "artifact-update"]
    assert chunks == ["pay me "]  # a paid answer is sent whole, once its delivery is recorded
    final = events[-1]
    assert final["status"]["state"] == "completed"
    assert final["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1
    assert len(paid.payment_rows("settle")) == 1


def test_a_paid_streaming_agent_that_fails_midway_charges_nothing(tmp_path: Path, facilitator: str, start_gate) -> None:
    paid = streaming_paid(tmp_path, facilitator, start_gate)
    headers = Payer().header_for(paid.gate.url, "paid-half-writer")
    events = stream(f"{paid.gate.url}/a2a/paid-half-writer", send_body("x", method="message/stream"), headers)
    assert events[-1]["status"]["state"] == "failed"
    assert paid.ledger()["settlements"] == []
    assert paid.payment_rows("settle") == []
    assert paid.claim_states() == []  # released: the same token may pay for a retry


def test_a_withholding_streaming_agent_shows_nothing_it_yields_when_the_payment_fails(
    tmp_path: Path, facilitator: str, start_gate
) -> None:
    paid = streaming_paid(tmp_path, facilitator, start_gate)
    payer = Payer()
    headers = payer.header_for(paid.gate.url, "withheld-writer")
    answer: list[str] = []

    def read() -> None:
        response = httpx.post(
            f"{paid.gate.url}/a2a/withheld-writer",
            json=send_body("sleep 1.5", method="message/stream"),
            headers=headers,
            timeout=30,
        )
        answer.append(response.text)

    reader = threading.Thread(target=read)
    reader.start()
    make_poor_after_verify(paid, tmp_path / "ledger.db", payer)
    reader.join(30)
    events = [event["result"] for event in sse_events(answer[0])]
    assert events[-1]["status"]["state"] == "failed"
    assert events[-1]["metadata"]["x402.payment.status"] == "payment-failed"
    assert "ALPHA" not in answer[0] and "OMEGA" not in answer[0], answer[0]
    assert paid.ledger()["settlements"] == []


def test_a_withholding_streaming_agent_sends_the_whole_answer_once_paid(
    tmp_path: Path, facilitator: str, start_gate
) -> None:
    paid = streaming_paid(tmp_path, facilitator, start_gate)
    headers = Payer().header_for(paid.gate.url, "withheld-writer")
    events = stream(f"{paid.gate.url}/a2a/withheld-writer", send_body("sleep 0.1", method="message/stream"), headers)
    chunks = [e for e in events if e["kind"] == "artifact-update"]
    assert [c["artifact"]["parts"][0]["text"] for c in chunks] == ["ALPHA OMEGA"]
    assert events[-1]["metadata"]["x402.payment.status"] == "payment-completed"
    assert not [e for e in events if e["kind"] == "status-update" and "ALPHA" in status_text(e)]


# --- what such agents meet ----------------------------------------------------------------


def test_a_v03_message_without_a_role_is_invalid_params_on_both_paths(
    tmp_path: Path, start_gate, shared_paid: PaidSetup
) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    message = v03_message("hi")
    del message["role"]
    free = rpc(f"{gate.url}/a2a/interrupting", "message/send", {"message": message}, auth)
    assert free["error"]["code"] == -32602, free
    assert "role" in free["error"]["message"]
    body = send_body("hi")
    del body["params"]["message"]["role"]
    paid = shared_paid.post("paid", body)  # no token: the message is read before any is looked for
    assert paid.status_code == 200, paid.text
    assert paid.json()["error"]["code"] == -32602


def test_a_continued_task_reports_working_not_submitted(tmp_path: Path, start_gate) -> None:
    gate, auth = boom_gate(tmp_path, start_gate)
    url = f"{gate.url}/a2a/interrupting"
    asked = result(url, "message/send", {"message": v03_message("weather?")}, auth)
    assert asked["status"]["state"] == "input-required"
    events = stream(url, send_body("Paris", method="message/stream", task_id=asked["id"]), auth)
    assert events[0]["status"]["state"] == "working", events[0]
    assert "submitted" not in [e["status"]["state"] for e in events if "status" in e]
    assert events[-1]["status"]["state"] == "completed"
