"""A failure of ours while answering is one answer on both paths, caught in one place
(`server.app.answered`): a bug is -32603 `internal_error` (retryable) with the call's id, an
unreachable store -32603 `store_unavailable`, over HTTP 200, never a 500 or a trace in the body,
wherever the request was when it happened (before the envelope was read, or after).
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gate import pipeline
from gate.app import build_app
from gate.config import parse_config
from server.database import DatabaseUnavailable
from server.methods import Methods
from server.principals import Principals
from tests.server.test_seam import CONFIG, KEY  # a key for every agent, a free `echo`, a `priced` one

OPS = {"Authorization": f"Bearer {KEY}"}
SECRET = "a detail of ours 0xdeadbeef"
INTERNAL = {"code": -32603, "message": "Internal error", "data": {"code": "internal_error", "retryable": True}}
STORE = {
    "code": -32603,
    "message": "The task store is unavailable",
    "data": {"code": "store_unavailable", "retryable": True},
}


def send(call_id: Any = 7, method: str = "message/send") -> dict[str, Any]:
    message = {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": {"message": message}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = parse_config(tomllib.loads(CONFIG), base_dir=tmp_path)
    with TestClient(build_app(settings)) as client:  # raises whatever the app lets through
        yield client


def fail_with(error: BaseException) -> Any:
    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise error

    return failing


@pytest.fixture
def free_path_fails(monkeypatch: pytest.MonkeyPatch) -> Any:
    return lambda error: monkeypatch.setattr(Methods, "start_send", fail_with(error))


@pytest.fixture
def paid_path_fails(monkeypatch: pytest.MonkeyPatch) -> Any:
    return lambda error: monkeypatch.setattr(pipeline, "paid_send", fail_with(error))


def error_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    assert SECRET not in response.text and "Traceback" not in response.text
    body = response.json()
    assert set(body) == {"jsonrpc", "id", "error"}
    return body


def test_a_bug_on_either_path_is_the_same_retryable_internal_error(
    client: TestClient, free_path_fails: Any, paid_path_fails: Any, caplog: pytest.LogCaptureFixture
) -> None:
    free_path_fails(RuntimeError(SECRET))
    paid_path_fails(RuntimeError(SECRET))
    with caplog.at_level(logging.ERROR, logger="a2a_gate"):
        free = error_of(client.post("/a2a/echo", json=send("free"), headers=OPS))
        paid = error_of(client.post("/a2a/priced", json=send("paid")))
    assert free == {"jsonrpc": "2.0", "id": "free", "error": INTERNAL}
    assert paid == {"jsonrpc": "2.0", "id": "paid", "error": INTERNAL}
    logged = [r for r in caplog.records if r.getMessage().startswith("internal error in message/send")]
    assert len(logged) == 2 and all(r.exc_info for r in logged)  # the trace is the operator's, in the log


def test_an_unreachable_store_on_either_path_is_the_same_retryable_answer(
    client: TestClient, free_path_fails: Any, paid_path_fails: Any
) -> None:
    free_path_fails(DatabaseUnavailable("down"))
    paid_path_fails(DatabaseUnavailable("down"))
    free = error_of(client.post("/a2a/echo", json=send(), headers=OPS))
    paid = error_of(client.post("/a2a/priced", json=send()))
    assert free == paid == {"jsonrpc": "2.0", "id": 7, "error": STORE}


@pytest.mark.parametrize("headers", [OPS, {}], ids=["principal", "anonymous"])
def test_a_failure_before_the_envelope_is_read_is_answered_without_an_id(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    monkeypatch.setattr(Principals, "identify", fail_with(RuntimeError(SECRET)))
    assert error_of(client.post("/a2a/echo", json=send(), headers=headers)) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": INTERNAL,
    }
    monkeypatch.setattr(Principals, "identify", fail_with(DatabaseUnavailable("down")))
    assert error_of(client.post("/a2a/echo", json=send(), headers=headers))["error"] == STORE


def test_a_v10_call_gets_the_internal_error_as_an_error_info(client: TestClient, paid_path_fails: Any) -> None:
    paid_path_fails(RuntimeError(SECRET))
    message = {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}
    body = {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": message}}
    error = error_of(client.post("/a2a/priced", json=body, headers={"A2A-Version": "1.0"}))["error"]
    assert (error["code"], error["message"]) == (-32603, "Internal error")
    assert error["data"][0]["reason"] == "INTERNAL_ERROR"
    assert error["data"][0]["metadata"] == {"code": "internal_error", "retryable": "true"}


def test_an_envelope_error_keeps_its_own_answer(client: TestClient) -> None:
    response = client.post("/a2a/echo", content=b"{not json", headers=OPS)
    assert error_of(response)["error"]["code"] == -32700
    unknown = client.post("/a2a/priced", json={"jsonrpc": "2.0", "id": 9, "method": "nope"})
    assert error_of(unknown) == {"jsonrpc": "2.0", "id": 9, "error": {"code": -32601, "message": "Method not found"}}
