"""`backend = "a2a-sdk"`: an a2a-sdk `AgentExecutor` hosted in a real `a2a-gate serve` process.

Called with the official a2a-sdk client (v1.0) on the free path, as a stock client calls
any A2A server: send, stream, cancel, input-required then continued; and a priced copy
paid through the development facilitator, delivered once and settled once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.a2a_clients import cancel_task, expect_a2a_error, jsonrpc_error_code, send_text, stream_text
from tests.support.docs_examples import examples, write_example
from tests.support.gate_helpers import (
    bearer,
    create_key,
    result,
    sse_events,
    status_text,
    v03_message,
    wait_for,
)
from tests.support.gate_process import Gate, GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body

MORE_AGENTS = """
[agents.streaming]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:make_streaming"

[agents.waiting]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:WaitingExecutor"

[agents.asking]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:AskingExecutor"

[agents.at-once]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:MessageExecutor"

[agents.broken]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:BrokenExecutor"

[agents.status-answer]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:StatusAnswerExecutor"

[agents.stubborn]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:StubbornExecutor"
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    folder = tmp_path_factory.mktemp("sdk")
    config = write_example("a2a-sdk", folder)
    config.write_text(config.read_text() + MORE_AGENTS)
    key = create_key(config, "sdk")
    with GateProcess(config, folder / "gate.log") as process:
        yield Gate(process, bearer(key))


def texts(artifacts: list[dict[str, Any]]) -> list[str]:
    return [p["text"] for a in artifacts for p in a["parts"] if "text" in p]


def test_send_runs_the_executor_and_answers_its_artifact(gate: Gate) -> None:
    answer = asyncio.run(send_text(gate.agent("counter"), "one two three", headers=gate.headers))
    task = answer["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert texts(task["artifacts"]) == ["3 words"]


def test_stream_carries_the_executors_events_as_they_come(gate: Gate) -> None:
    events = asyncio.run(stream_text(gate.agent("streaming"), "hi", headers=gate.headers))
    updates = [e["statusUpdate"] for e in events if "statusUpdate" in e]
    reading = [u for u in updates if u["status"].get("message", {}).get("parts") == [{"text": "reading..."}]]
    assert reading and reading[0]["status"]["state"] == "TASK_STATE_WORKING", updates
    chunks = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert [texts([c["artifact"]]) for c in chunks] == [["sdk heard: "], ["hi"], ["sdk heard: ", "hi"]]
    assert chunks[-1]["lastChunk"] is True
    assert updates[-1]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_cancel_stops_execute_and_calls_the_executors_cancel(gate: Gate, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    started = asyncio.run(send_text(gate.agent("waiting"), str(marker), headers=gate.headers, blocking=False))
    task_id = started["task"]["id"]
    canceled = asyncio.run(cancel_task(gate.agent("waiting"), task_id, headers=gate.headers))
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED", canceled
    assert marker.read_text() == f"cancel asked for {task_id}"


def test_input_required_pauses_and_a_continued_turn_runs_execute_again_with_the_history(gate: Gate) -> None:
    asked = asyncio.run(send_text(gate.agent("asking"), "weather?", headers=gate.headers))["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", asked
    assert asked["status"]["message"]["parts"] == [{"text": "Which city?"}]
    answered = asyncio.run(
        send_text(
            gate.agent("asking"), "Paris", headers=gate.headers, task_id=asked["id"], context_id=asked["contextId"]
        )
    )["task"]
    assert answered["id"] == asked["id"]
    assert answered["status"]["state"] == "TASK_STATE_COMPLETED", answered
    assert texts(answered["artifacts"]) == ["weather in Paris: sunny (1)"]


def test_a_paused_task_is_canceled_through_the_executors_cancel(gate: Gate) -> None:
    asked = asyncio.run(send_text(gate.agent("asking"), "weather?", headers=gate.headers))["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    canceled = asyncio.run(cancel_task(gate.agent("asking"), asked["id"], headers=gate.headers))
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED", canceled


def test_an_executor_whose_cancel_raises_refuses_the_cancel(gate: Gate) -> None:
    asked = asyncio.run(send_text(gate.agent("stubborn"), "weather?", headers=gate.headers))["task"]
    error = asyncio.run(expect_a2a_error(cancel_task(gate.agent("stubborn"), asked["id"], headers=gate.headers)))
    assert jsonrpc_error_code(error) == -32002


def test_a_part_the_sdk_cannot_read_fails_the_task_as_the_messages_fault(gate: Gate) -> None:
    message = v03_message("x")
    message["parts"] = [{"kind": "file", "file": {"bytes": "not base64!!", "mimeType": "text/plain"}}]
    task = result(gate.agent("counter"), "message/send", {"message": message}, gate.headers)
    assert task["status"]["state"] == "failed", task
    assert "base64" in status_text(task)
    assert "agent counter raised" not in gate.process.log.read_text()


def test_an_executors_message_is_the_answer(gate: Gate) -> None:
    task = asyncio.run(send_text(gate.agent("at-once"), "hi", headers=gate.headers))["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert texts(task["artifacts"]) == ["at once: hi"]


def test_an_executor_that_completes_with_a_status_message_answers_with_it(gate: Gate) -> None:
    task = asyncio.run(send_text(gate.agent("status-answer"), "hi", headers=gate.headers))["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert texts(task["artifacts"]) == ["done: hi"]


def test_an_executor_that_raises_fails_its_task_and_is_logged(gate: Gate) -> None:
    task = asyncio.run(send_text(gate.agent("broken"), "hi", headers=gate.headers))["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED", task
    assert not task.get("artifacts")  # its half answer was not delivered
    log = gate.process.log
    wait_for(lambda: "outcome=agent_error" in log.read_text())
    assert "agent broken raised ValueError: executor bug" in log.read_text()


PRICED = f"""
[agents.paid-counter]
backend = "a2a-sdk"
executor = "sdk_agent:CountingExecutor"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.paid-asking]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:AskingExecutor"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.paid-streaming]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:StreamingExecutor"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.paid-waiting]
backend = "a2a-sdk"
executor = "tests.support.sdk_agents:WaitingExecutor"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""


@pytest.fixture
def priced(tmp_path: Path, facilitator: str, start_gate) -> PaidSetup:
    (tmp_path / "sdk_agent.py").write_text(examples()["a2a-sdk/sdk_agent.py"])
    port = free_port()
    config = tmp_path / "gate.toml"
    config.write_text(paid_config(f"http://127.0.0.1:{port}", facilitator) + PRICED)
    return PaidSetup(gate=start_gate(config, port=port), facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def test_a_paid_executor_is_delivered_once_and_settled_once(priced: PaidSetup) -> None:
    payer = Payer()
    response = priced.post("paid-counter", send_body("a b c d"), payer.header_for(priced.gate.url, "paid-counter"))
    task = response.json()["result"]
    assert task["status"]["state"] == "completed", task
    assert texts(task["artifacts"]) == ["4 words"]
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert priced.count_tasks("paid-counter") == 1
    wait_for(lambda: len(priced.payment_rows("settle")) == 1)
    assert len(priced.ledger()["settlements"]) == 1


def test_a_paid_executors_question_is_not_charged_and_its_answer_is(priced: PaidSetup) -> None:
    payer = Payer()  # a task is its payer's: the next turn is paid by the same one
    asked = priced.post("paid-asking", send_body("weather?"), payer.header_for(priced.gate.url, "paid-asking")).json()[
        "result"
    ]
    assert asked["status"]["state"] == "input-required", asked
    assert priced.ledger()["settlements"] == []
    body = send_body("Oslo", task_id=asked["id"])
    answered = priced.post("paid-asking", body, payer.header_for(priced.gate.url, "paid-asking")).json()["result"]
    assert answered["status"]["state"] == "completed", answered
    assert texts(answered["artifacts"]) == ["weather in Oslo: sunny (1)"]
    assert len(priced.ledger()["settlements"]) == 1


def test_a_paid_executor_streams_and_is_settled_once(priced: PaidSetup) -> None:
    headers = Payer().header_for(priced.gate.url, "paid-streaming")
    response = priced.post("paid-streaming", send_body("hi", method="message/stream"), headers)
    events = [e["result"] for e in sse_events(response.text)]
    chunks = [e["artifact"]["parts"] for e in events if e["kind"] == "artifact-update"]
    # a paid answer is sent whole, once its delivery is recorded
    assert chunks == [[{"kind": "text", "text": "sdk heard: "}, {"kind": "text", "text": "hi"}]]
    assert events[-1]["status"]["state"] == "completed"
    assert events[-1]["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(priced.ledger()["settlements"]) == 1


def test_a_paid_executor_canceled_by_its_payer_charges_nothing(priced: PaidSetup, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    headers = Payer().header_for(priced.gate.url, "paid-waiting")  # also the proof the task is the payer's
    started = priced.post("paid-waiting", send_body(str(marker), blocking=False), headers).json()["result"]
    body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": started["id"]}}
    canceled = priced.post("paid-waiting", body, headers).json()["result"]
    assert canceled["status"]["state"] == "canceled", canceled
    assert marker.read_text() == f"cancel asked for {started['id']}"
    assert priced.ledger()["settlements"] == []


def test_an_executor_reports_its_usage_in_its_events_metadata() -> None:
    """`metadata.usage` of each event, summed: what a usage price charges."""
    from server.agents import AgentRequest, NoProgress
    from server.config import AgentConfig
    from server.sdk_backend import SdkBackend

    backend = SdkBackend(AgentConfig(name="m", backend="a2a-sdk", executor="tests.support.sdk_agents:MeteredExecutor"))
    message = {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}
    request = AgentRequest(message=message, history=[message], task_id="t1", context_id="c1")
    reply = asyncio.run(backend.run(request, NoProgress()))
    assert reply.state == "completed" and reply.usage == {"output_tokens": 7}
