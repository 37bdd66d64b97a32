"""The official a2a-sdk 1.x client (v1.0 dialect) against a real gate, on the free path.

A principal (API key) talks to the gate exactly as any A2A v1.0 client would: the
card is resolved from the gate, every RPC goes to the card's interface URL, and
results are read by the SDK. DESIGN sections 2 and 3.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from tests.conftest import FREE_CONFIG
from tests.support import a2a_clients as sdk
from tests.support.gate_helpers import artifact_texts, bearer, poll
from tests.support.gate_process import Gate, GateProcess, free_port

T = TypeVar("T")
KEY = "a2g_test-sdk-principal-key-0123456789"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """One gate for the module: every test makes tasks of its own and counts nothing global."""
    folder = tmp_path_factory.mktemp("sdk")
    port = free_port()
    text = FREE_CONFIG.replace("http://gate.example", f"http://127.0.0.1:{port}")
    text += f'\n[[keys]]\nname = "sdk"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\nagents = ["*"]\n'
    config = folder / "gate.toml"
    config.write_text(text)
    with GateProcess(config, folder / "gate.log", port=port) as process:
        yield Gate(process, bearer(KEY))


def state(task: dict[str, Any]) -> str:
    return task["status"]["state"]


def test_blocking_send_on_echo_completes_with_the_echoed_artifact(gate: Gate) -> None:
    answer = run(sdk.send_text(gate.agent("echo"), "hello gate", headers=gate.headers))

    task = answer["task"]
    assert state(task) == "TASK_STATE_COMPLETED"
    assert artifact_texts(task) == ["hello gate"]
    assert task["history"][0]["role"] == "ROLE_USER"


def test_non_blocking_send_then_poll_until_completed(gate: Gate) -> None:
    url = gate.agent("slow")
    task = run(sdk.send_text(url, "sleep 0.5", headers=gate.headers, blocking=False))["task"]
    assert state(task) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")

    final = poll(
        lambda: run(sdk.get_task(url, task["id"], headers=gate.headers)),
        lambda t: state(t) == "TASK_STATE_COMPLETED",
        timeout=10,
    )

    assert state(final) == "TASK_STATE_COMPLETED"
    assert final["id"] == task["id"]
    assert artifact_texts(final) == ["slept 0.5"]


def test_cancel_a_running_task(gate: Gate) -> None:
    url = gate.agent("slow")
    task = run(sdk.send_text(url, "sleep 30", headers=gate.headers, blocking=False))["task"]

    canceled = run(sdk.cancel_task(url, task["id"], headers=gate.headers))

    assert canceled["id"] == task["id"]
    assert state(canceled) == "TASK_STATE_CANCELED"
    assert state(run(sdk.get_task(url, task["id"], headers=gate.headers))) == "TASK_STATE_CANCELED"
    assert "artifacts" not in canceled


def test_cancel_a_completed_task_is_not_cancelable(gate: Gate) -> None:
    url = gate.agent("echo")
    task = run(sdk.send_text(url, "done already", headers=gate.headers))["task"]

    error = run(sdk.expect_a2a_error(sdk.cancel_task(url, task["id"], headers=gate.headers)))

    assert sdk.jsonrpc_error_code(error) == -32002


def test_stream_events_arrive_in_order(gate: Gate) -> None:
    events = run(sdk.stream_text(gate.agent("echo"), "streamed", headers=gate.headers))

    kinds = [next(iter(event)) for event in events]
    assert kinds == ["task", "statusUpdate", "artifactUpdate", "statusUpdate"], events
    task_id = events[0]["task"]["id"]
    assert events[1]["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
    assert events[2]["artifactUpdate"]["artifact"]["parts"] == [{"text": "streamed"}]
    assert events[3]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert {
        events[1]["statusUpdate"]["taskId"],
        events[2]["artifactUpdate"]["taskId"],
        events[3]["statusUpdate"]["taskId"],
    } == {task_id}


def test_get_honours_history_length(gate: Gate) -> None:
    url = gate.agent("interrupting")
    first = run(sdk.send_text(url, "weather?", headers=gate.headers))["task"]
    assert state(first) == "TASK_STATE_INPUT_REQUIRED"
    done = run(sdk.send_text(url, "Paris", headers=gate.headers, task_id=first["id"]))["task"]
    assert state(done) == "TASK_STATE_COMPLETED"
    assert artifact_texts(done) == ["weather in Paris: sunny"]

    full = run(sdk.get_task(url, first["id"], headers=gate.headers))
    one = run(sdk.get_task(url, first["id"], headers=gate.headers, history_length=1))
    none = run(sdk.get_task(url, first["id"], headers=gate.headers, history_length=0))

    assert [m["role"] for m in full["history"]] == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"]
    assert one["history"] == full["history"][-1:]
    assert one["history"][0]["parts"] == [{"text": "Paris"}]
    assert "history" not in none
    assert artifact_texts(none) == ["weather in Paris: sunny"]


def test_get_of_an_unknown_id_is_task_not_found(gate: Gate) -> None:
    error = run(sdk.expect_a2a_error(sdk.get_task(gate.agent("echo"), "no-such-task", headers=gate.headers)))

    assert sdk.jsonrpc_error_code(error) == -32001
