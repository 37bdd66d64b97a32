"""The A2A v0.3 dialect on the free path, as raw JSON-RPC over httpx (DESIGN section 2).

v0.3 shapes: `kind` on every object, kebab-case states, `configuration.blocking`,
`final` on stream status updates. Every JSON-RPC error travels with HTTP 200.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import FREE_CONFIG
from tests.support.gate_helpers import (
    artifact_texts,
    bearer,
    error_code,
    poll,
    post,
    result,
    rpc,
    rpc_body,
    sse_events,
    v03_message,
)
from tests.support.gate_process import GateProcess

KEY = "a2g_test-v03-principal-key-0123456789"
AUTH = bearer(KEY)
MAX_BODY = 4096


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    folder = tmp_path_factory.mktemp("v03")
    config = folder / "gate.toml"
    config.write_text(
        f"max_body_bytes = {MAX_BODY}\n"
        + FREE_CONFIG
        + f'\n[[keys]]\nname = "v03"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\nagents = ["*"]\n'
    )
    with GateProcess(config, folder / "gate.log") as process:
        yield process


def url(gate: GateProcess, agent: str = "echo") -> str:
    return f"{gate.url}/a2a/{agent}"


def send(gate: GateProcess, agent: str, message: dict[str, Any], **configuration: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"message": message}
    if configuration:
        params["configuration"] = configuration
    return result(url(gate, agent), "message/send", params, AUTH)


def get(gate: GateProcess, agent: str, task_id: str, **params: Any) -> dict[str, Any]:
    return result(url(gate, agent), "tasks/get", {"id": task_id, **params}, AUTH)


def code_of(gate: GateProcess, method: str, params: dict[str, Any] | None = None, agent: str = "echo") -> int:
    return error_code(url(gate, agent), method, params, AUTH)


# --- results ------------------------------------------------------------------


def test_message_send_result_has_the_v03_shape(gate: GateProcess) -> None:
    message = v03_message("shape check")
    task = send(gate, "echo", message)

    assert task["kind"] == "task"
    assert task["status"]["state"] == "completed"
    assert task["status"]["timestamp"].endswith("Z")
    status_message = task["status"]["message"]
    assert status_message["kind"] == "message" and status_message["role"] == "agent"
    assert status_message["taskId"] == task["id"] and status_message["contextId"] == task["contextId"]
    [sent] = task["history"]
    assert sent["kind"] == "message" and sent["role"] == "user"
    assert sent["messageId"] == message["messageId"]
    assert sent["taskId"] == task["id"]
    assert sent["parts"] == [{"kind": "text", "text": "shape check"}]
    [artifact] = task["artifacts"]
    assert artifact["parts"] == [{"kind": "text", "text": "shape check"}]
    assert artifact["artifactId"]


def test_a_caller_context_id_is_kept(gate: GateProcess) -> None:
    task = send(gate, "echo", v03_message("ctx", contextId="my-context"))

    assert task["contextId"] == "my-context"


def test_non_blocking_send_then_tasks_get_until_completed(gate: GateProcess) -> None:
    task = send(gate, "slow", v03_message("sleep 0.4"), blocking=False)
    assert task["status"]["state"] in ("submitted", "working")

    final = poll(lambda: get(gate, "slow", task["id"]), lambda t: t["status"]["state"] == "completed")

    assert final["status"]["state"] == "completed"
    assert final["kind"] == "task"
    assert artifact_texts(final) == ["slept 0.4"]


def test_history_length_zero_and_one(gate: GateProcess) -> None:
    first = send(gate, "interrupting", v03_message("weather?"), historyLength=0)
    assert first["status"]["state"] == "input-required"
    assert first["history"] == []
    send(gate, "interrupting", v03_message("Oslo", taskId=first["id"]))

    full = get(gate, "interrupting", first["id"])
    none = get(gate, "interrupting", first["id"], historyLength=0)
    one = get(gate, "interrupting", first["id"], historyLength=1)

    assert [m["role"] for m in full["history"]] == ["user", "agent", "user"]
    assert none["history"] == []
    assert one["history"] == full["history"][-1:]
    assert one["history"][0]["parts"] == [{"kind": "text", "text": "Oslo"}]
    assert none["artifacts"] == full["artifacts"]


@pytest.mark.parametrize("length", [-1, "2", 1.5, True])
def test_history_length_of_the_wrong_type_is_invalid_params(gate: GateProcess, length: Any) -> None:
    task = send(gate, "echo", v03_message())

    assert code_of(gate, "tasks/get", {"id": task["id"], "historyLength": length}) == -32602


def test_tasks_cancel_a_running_task(gate: GateProcess) -> None:
    task = send(gate, "slow", v03_message("sleep 30"), blocking=False)

    canceled = result(url(gate, "slow"), "tasks/cancel", {"id": task["id"]}, AUTH)

    assert canceled["kind"] == "task"
    assert canceled["id"] == task["id"]
    assert canceled["status"]["state"] == "canceled"
    assert get(gate, "slow", task["id"])["status"]["state"] == "canceled"
    assert code_of(gate, "tasks/cancel", {"id": task["id"]}, agent="slow") == -32002


def test_cancel_an_input_required_task(gate: GateProcess) -> None:
    task = send(gate, "interrupting", v03_message("weather?"))

    canceled = result(url(gate, "interrupting"), "tasks/cancel", {"id": task["id"]}, AUTH)

    assert canceled["status"]["state"] == "canceled"
    assert (
        code_of(gate, "message/send", {"message": v03_message("Rome", taskId=task["id"])}, agent="interrupting")
        == -32004
    )


def test_message_stream_sends_ordered_events_ending_final(gate: GateProcess) -> None:
    body = rpc_body("message/stream", {"message": v03_message("streamed")}, call_id="s-1")
    with httpx.stream("POST", url(gate), json=body, headers=AUTH, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.read().decode())

    assert all(e["jsonrpc"] == "2.0" and e["id"] == "s-1" for e in events)
    results = [e["result"] for e in events]
    assert [r["kind"] for r in results] == ["task", "status-update", "artifact-update", "status-update"]
    task_id = results[0]["id"]
    assert results[0]["status"]["state"] == "submitted"
    assert results[1]["status"]["state"] == "working" and results[1]["final"] is False
    assert results[2]["artifact"]["parts"] == [{"kind": "text", "text": "streamed"}]
    assert results[3]["status"]["state"] == "completed"
    assert results[-1]["final"] is True
    assert {r["taskId"] for r in results[1:]} == {task_id}
    assert get(gate, "echo", task_id)["status"]["state"] == "completed"


def test_stream_on_an_interrupting_agent_ends_with_input_required(gate: GateProcess) -> None:
    body = rpc_body("message/stream", {"message": v03_message("weather?")})
    response = post(url(gate, "interrupting"), body, AUTH)

    events = [e["result"] for e in sse_events(response.text)]
    assert events[-1]["kind"] == "status-update"
    assert events[-1]["status"]["state"] == "input-required"
    assert events[-1]["final"] is True


# --- continuing a task ------------------------------------------------------------


def test_continue_an_input_required_task_with_its_task_id(gate: GateProcess) -> None:
    first = send(gate, "interrupting", v03_message("weather?"))
    assert first["status"]["state"] == "input-required"
    assert first["status"]["message"]["parts"] == [{"kind": "text", "text": "Which city?"}]

    second = send(gate, "interrupting", v03_message("Lisbon", taskId=first["id"]))

    assert second["id"] == first["id"]
    assert second["contextId"] == first["contextId"]
    assert second["status"]["state"] == "completed"
    assert artifact_texts(second) == ["weather in Lisbon: sunny"]


def test_continuing_a_completed_task_is_unsupported_operation(gate: GateProcess) -> None:
    """A2A 3.1.1: a message to a task in a terminal state is refused with UnsupportedOperationError."""
    task = send(gate, "echo", v03_message("once"))

    assert code_of(gate, "message/send", {"message": v03_message("twice", taskId=task["id"])}) == -32004
    assert get(gate, "echo", task["id"])["status"]["state"] == "completed"


def test_continuing_an_unknown_task_is_task_not_found(gate: GateProcess) -> None:
    assert code_of(gate, "message/send", {"message": v03_message("hi", taskId="no-such-task")}) == -32001


def test_tasks_get_of_an_unknown_or_missing_id_is_task_not_found(gate: GateProcess) -> None:
    assert code_of(gate, "tasks/get", {"id": "no-such-task"}) == -32001
    assert code_of(gate, "tasks/get", {}) == -32001
    assert code_of(gate, "tasks/cancel", {"id": 42}) == -32001


def test_a_task_of_one_agent_is_not_found_through_another(gate: GateProcess) -> None:
    task = send(gate, "echo", v03_message())

    assert code_of(gate, "tasks/get", {"id": task["id"]}, agent="slow") == -32001


# --- methods ----------------------------------------------------------------------


def test_unknown_method_is_method_not_found(gate: GateProcess) -> None:
    doc = rpc(url(gate), "message/teleport", {}, AUTH, call_id="abc")

    assert doc["id"] == "abc"
    assert doc["error"]["code"] == -32601


@pytest.mark.parametrize(
    "method",
    [
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    ],
)
def test_push_notification_methods_are_not_supported(gate: GateProcess, method: str) -> None:
    assert code_of(gate, method, {"id": "x"}) == -32003


def test_the_extended_card_is_not_supported(gate: GateProcess) -> None:
    assert code_of(gate, "agent/getAuthenticatedExtendedCard", {}) == -32004


def test_unknown_fields_are_ignored(gate: GateProcess) -> None:
    message = v03_message("extras", futureField={"x": 1})
    message["parts"][0]["shiny"] = True
    body = rpc_body(
        "message/send", {"message": message, "configuration": {"blocking": True, "newKnob": 3}, "somethingElse": [1, 2]}
    )
    body["extension"] = "ignored"

    response = post(url(gate), body, AUTH)

    assert response.status_code == 200
    task = response.json()["result"]
    assert task["status"]["state"] == "completed"
    assert artifact_texts(task) == ["extras"]


# --- envelope errors ----------------------------------------------------------------


def envelope(gate: GateProcess, body: bytes | str | Any) -> dict[str, Any]:
    response = post(url(gate), body, AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert doc["jsonrpc"] == "2.0" and "result" not in doc
    return doc


@pytest.mark.parametrize(
    "body", [b"{", b"not json", b"", b'{"jsonrpc": "2.0", "id": 1, "method": NaN}', b"\xff\xfe\x00", b'{"a": Infinity}']
)
def test_unparseable_body_is_parse_error(gate: GateProcess, body: bytes) -> None:
    doc = envelope(gate, body)

    assert doc["error"]["code"] == -32700
    assert doc["id"] is None


@pytest.mark.parametrize(
    "body,expected_id",
    [
        ({"jsonrpc": "1.0", "id": 5, "method": "message/send"}, 5),
        ({"id": 6, "method": "message/send"}, 6),
        ({"jsonrpc": "2.0", "id": 7}, 7),
        ({"jsonrpc": "2.0", "id": 8, "method": 12}, 8),
        ({"jsonrpc": "2.0", "id": {"no": 1}, "method": "tasks/get"}, None),
        ({"jsonrpc": "2.0", "id": True, "method": "tasks/get"}, None),
        ("a string", None),
        (17, None),
        (None, None),
    ],
)
def test_invalid_request(gate: GateProcess, body: Any, expected_id: Any) -> None:
    doc = envelope(gate, json.dumps(body))

    assert doc["error"]["code"] == -32600
    assert doc["id"] == expected_id


def test_batch_array_is_invalid_request(gate: GateProcess) -> None:
    batch = [rpc_body("tasks/get", {"id": "a"}, 1), rpc_body("tasks/get", {"id": "b"}, 2)]

    doc = envelope(gate, batch)

    assert doc["error"]["code"] == -32600


def test_body_over_the_limit_is_invalid_request_with_http_200(gate: GateProcess) -> None:
    body = json.dumps(rpc_body("message/send", {"message": v03_message("x" * MAX_BODY)}))

    doc = envelope(gate, body)
    assert doc["error"]["code"] == -32600

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while reading
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000].encode()

    response = httpx.post(url(gate), content=chunks(), headers=AUTH, timeout=10)
    assert response.status_code == 200
    assert response.json()["error"]["code"] == -32600


def test_params_not_an_object_is_invalid_params(gate: GateProcess) -> None:
    assert code_of(gate, "message/send", [1, 2]) == -32602  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"message": "hi"},
        {"message": {"role": "user"}},
        {"message": {"role": "user", "parts": "hi"}},
        {"message": {"role": "user", "parts": []}},
        {"message": {"role": "user", "parts": [{"kind": "text", "text": ""}]}},
        {"message": {"role": "user", "parts": [{"kind": "image", "image": "x"}, 3, None]}},
        {"message": {"role": "user", "parts": [{"kind": "file", "file": {"name": "no-content"}}]}},
        {"message": {"role": "user", "parts": [{"kind": "data", "data": None}]}},
        {"message": v03_message(), "configuration": "fast"},
        {"message": v03_message(taskId="")},
        {"message": v03_message(metadata="not an object")},
    ],
)
def test_a_message_without_usable_parts_or_of_a_bad_shape_is_invalid_params(
    gate: GateProcess, params: dict[str, Any]
) -> None:
    assert code_of(gate, "message/send", params) == -32602
    assert code_of(gate, "message/stream", params) == -32602


def test_data_and_file_parts_are_usable(gate: GateProcess) -> None:
    parts = [{"kind": "data", "data": {"n": 1}}, {"kind": "file", "file": {"uri": "https://x.example/a.txt"}}]
    task = send(gate, "echo", {"kind": "message", "role": "user", "messageId": "m", "parts": parts})

    assert task["artifacts"][0]["parts"] == parts


def test_one_interrupted_task_continued_many_times_at_once_runs_one_turn(
    tmp_path, start_gate, write_config, postgres_schema
) -> None:
    """Eight continuations of one input-required task at once, on a store where their reads and
    writes interleave: one turn runs, the others are refused, and the task has one answer."""
    import asyncio
    import base64
    import os

    from tests.support.gate_process import free_port

    port = free_port()
    text = (
        FREE_CONFIG.replace('database = "gate.db"', f'database = "{postgres_schema.store_url()}"')
        + f'\n[[keys]]\nname = "v03"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\nagents = ["*"]\n'
    )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    gate = start_gate(write_config(text), port=port, env={"A2A_GATE_SEALING_KEY": key})
    first = send(gate, "interrupting", v03_message("weather?"))

    async def continuations() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as client:
            answers = await asyncio.gather(
                *(
                    client.post(
                        url(gate, "interrupting"),
                        json=rpc_body("message/send", {"message": v03_message(f"city {i}", taskId=first["id"])}),
                        headers=AUTH,
                    )
                    for i in range(8)
                )
            )
        return [a.json() for a in answers]

    answers = asyncio.run(continuations())
    completed = [a["result"] for a in answers if "result" in a]
    assert len(completed) == 1, [a.get("error") or a["result"]["status"]["state"] for a in answers]
    # refused: still running (-32602), or already finished when looked at again (-32004)
    assert {a["error"]["code"] for a in answers if "error" in a} <= {-32602, -32004}
    final = get(gate, "interrupting", first["id"])
    asked = [m["parts"][0]["text"] for m in final["history"] if m["role"] == "user"]
    assert asked[0] == "weather?" and len(asked) == 2
    assert artifact_texts(final) == artifact_texts(completed[0])
