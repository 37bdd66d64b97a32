"""Tasks live in the SQLite file, not in the process (DESIGN section 6).

A gate stopped and started again on the same configuration and database answers
`tasks/get` for the tasks it had, in both dialects.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FREE_CONFIG
from tests.support import a2a_clients as sdk
from tests.support.gate_helpers import (
    artifact_texts,
    bearer,
    error_code,
    result,
    status_text,
    v03_message,
)
from tests.support.gate_process import GateProcess, free_port

KEY = "a2g_restart-test-principal-key-0000000"
AUTH = bearer(KEY)


def config_text(port: int, extra: str = "") -> str:
    return (
        extra
        + FREE_CONFIG.replace("http://gate.example", f"http://127.0.0.1:{port}")
        + f'\n[[keys]]\nname = "restart"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\nagents = ["*"]\n'
    )


@pytest.fixture
def gate(write_config: Callable[..., Path], start_gate: Callable[..., GateProcess]) -> GateProcess:
    port = free_port()
    return start_gate(write_config(config_text(port)), port=port)


def restart(gate: GateProcess, *, kill: bool = False) -> None:
    gate.kill() if kill else gate.stop()
    assert gate.process is not None and gate.process.poll() is not None
    gate.start()


def test_a_completed_task_survives_a_restart(gate: GateProcess) -> None:
    url = f"{gate.url}/a2a/echo"
    sent = asyncio.run(sdk.send_text(url, "remember me", headers=AUTH))["task"]
    assert sent["status"]["state"] == "TASK_STATE_COMPLETED"

    restart(gate)

    again = asyncio.run(sdk.get_task(url, sent["id"], headers=AUTH))
    assert again == sent
    raw = result(url, "tasks/get", {"id": sent["id"]}, AUTH)
    assert raw["kind"] == "task" and raw["status"]["state"] == "completed"
    assert artifact_texts(raw) == ["remember me"]


def test_a_task_survives_a_crash_too(gate: GateProcess) -> None:
    url = f"{gate.url}/a2a/echo"
    sent = result(url, "message/send", {"message": v03_message("crash-proof")}, AUTH)

    restart(gate, kill=True)

    assert result(url, "tasks/get", {"id": sent["id"]}, AUTH) == sent


def test_an_interrupted_task_can_be_continued_after_a_restart(gate: GateProcess) -> None:
    url = f"{gate.url}/a2a/interrupting"
    first = result(url, "message/send", {"message": v03_message("weather?")}, AUTH)
    assert first["status"]["state"] == "input-required"

    restart(gate)

    done = result(url, "message/send", {"message": v03_message("Madrid", taskId=first["id"])}, AUTH)
    assert done["id"] == first["id"]
    assert done["status"]["state"] == "completed"
    assert artifact_texts(done) == ["weather in Madrid: sunny"]


def test_a_canceled_task_stays_canceled_after_a_restart(gate: GateProcess) -> None:
    url = f"{gate.url}/a2a/slow"
    task = result(url, "message/send", {"message": v03_message("sleep 30"), "configuration": {"blocking": False}}, AUTH)
    assert result(url, "tasks/cancel", {"id": task["id"]}, AUTH)["status"]["state"] == "canceled"

    restart(gate)

    assert result(url, "tasks/get", {"id": task["id"]}, AUTH)["status"]["state"] == "canceled"
    assert error_code(url, "tasks/cancel", {"id": task["id"]}, AUTH) == -32002


def test_a_graceful_stop_lets_running_work_finish(gate: GateProcess) -> None:
    url = f"{gate.url}/a2a/slow"
    task = result(
        url, "message/send", {"message": v03_message("sleep 0.5"), "configuration": {"blocking": False}}, AUTH
    )

    restart(gate)

    final = result(url, "tasks/get", {"id": task["id"]}, AUTH)
    assert final["status"]["state"] == "completed"
    assert artifact_texts(final) == ["slept 0.5"]


def test_work_lost_in_a_crash_is_failed_once_past_its_deadline(
    write_config: Callable[..., Path], start_gate: Callable[..., GateProcess]
) -> None:
    port = free_port()
    deadline = 1.0
    gate = start_gate(write_config(config_text(port, f"task_deadline_seconds = {deadline}\n")), port=port)
    url = f"{gate.url}/a2a/slow"
    started = time.monotonic()
    task = result(url, "message/send", {"message": v03_message("sleep 30"), "configuration": {"blocking": False}}, AUTH)

    gate.kill()
    time.sleep(max(0.0, deadline + 0.2 - (time.monotonic() - started)))  # the start-up housekeeping sees it stuck
    gate.start()

    final: dict[str, Any] = result(url, "tasks/get", {"id": task["id"]}, AUTH)
    assert final["status"]["state"] == "failed"
    assert "deadline" in status_text(final)
