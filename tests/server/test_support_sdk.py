"""Proves the SDK-based test support works: upstream agents and client helpers.

Every upstream behaviour runs on a real uvicorn server; the v1.0 side is
driven by the official a2a-sdk client (tests/support/a2a_clients.py), the
v0.3 side by raw httpx JSON-RPC.  A recording server pins the exact requests
the SDK client sends and the minimal replies it accepts, which is the contract
our gate has to meet.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import httpx
import pytest
from a2a.client import A2AClientError, A2AClientTimeoutError
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support import a2a_clients as sdk
from tests.support.serve import serve_app
from tests.support.upstream_agents import BEHAVIOURS, GARBAGE_JSON, build_upstream_app

T = TypeVar("T")
V1_HEADERS = {"A2A-Version": "1.0"}
SLOW_GRACE_S = 1.8  # a little over the slow upstream's 1.5 s


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion (no pytest-asyncio on purpose)."""
    return asyncio.run(coroutine)


def v03_send(text: str, *, task_id: str | None = None, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "user",
        "messageId": f"m-{text}",
        "parts": [{"kind": "text", "text": text}],
    }
    if task_id:
        message["taskId"] = task_id
    if context_id:
        message["contextId"] = context_id
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}


def v03_get(task_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}


def rpc(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = httpx.post(url + "/", json=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def poll(
    fetch: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    """Call `fetch` until `done` holds for its result."""
    deadline = time.monotonic() + timeout
    while True:
        result = fetch()
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def texts(parts: list[dict[str, Any]]) -> list[str]:
    return [part["text"] for part in parts if "text" in part]


# --- agent card --------------------------------------------------------------


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_every_behaviour_serves_a_card_pointing_at_itself(behaviour: str) -> None:
    with serve_app(build_upstream_app(behaviour)) as url:
        card = httpx.get(url + "/.well-known/agent-card.json").json()
    assert card["supportedInterfaces"] == [
        {"url": url + "/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": url + "/", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ]
    # v0.3 compatibility fields are merged in by the SDK's card serializer.
    assert card["url"] == url + "/"
    assert card["protocolVersion"] == "0.3"
    assert card["preferredTransport"] == "JSONRPC"
    assert card["capabilities"]["streaming"] is True


def test_unknown_behaviour_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown upstream behaviour"):
        build_upstream_app("nope")


# --- v0.3 over raw httpx -----------------------------------------------------


def test_v03_echo_completes_with_artifact_and_is_gettable() -> None:
    with serve_app(build_upstream_app("echo")) as url:
        task = rpc(url, v03_send("hi"))["result"]
        fetched = rpc(url, v03_get(task["id"]))["result"]
    assert task["kind"] == "task"
    assert task["status"]["state"] == "completed"
    assert texts(task["artifacts"][0]["parts"]) == ["upstream echo: hi"]
    assert task["artifacts"][0]["parts"][0]["kind"] == "text"
    assert task["history"][0]["role"] == "user"
    assert fetched["id"] == task["id"]
    assert fetched["status"]["state"] == "completed"


def test_v03_slow_returns_working_then_completes_on_poll() -> None:
    with serve_app(build_upstream_app("slow")) as url:
        started = time.monotonic()
        task = rpc(url, v03_send("hi"))["result"]
        assert time.monotonic() - started < 1.0
        assert task["status"]["state"] == "working"
        assert "artifacts" not in task
        assert rpc(url, v03_get(task["id"]))["result"]["status"]["state"] == "working"
        final = poll(
            lambda: rpc(url, v03_get(task["id"]))["result"],
            lambda t: t["status"]["state"] == "completed",
        )
    assert final["status"]["state"] == "completed"
    assert texts(final["artifacts"][0]["parts"]) == ["upstream echo: hi"]


def test_v03_input_required_then_follow_up_completes() -> None:
    with serve_app(build_upstream_app("input-required")) as url:
        task = rpc(url, v03_send("hi"))["result"]
        assert task["status"]["state"] == "input-required"
        assert task["status"]["message"]["role"] == "agent"
        assert texts(task["status"]["message"]["parts"]) == ["need more"]
        done = rpc(url, v03_send("more", task_id=task["id"], context_id=task["contextId"]))["result"]
    assert done["id"] == task["id"]
    assert done["status"]["state"] == "completed"
    assert texts(done["artifacts"][0]["parts"]) == ["upstream got: more"]
    assert [m["role"] for m in done["history"]] == ["user", "agent", "user"]


def test_v03_fail_is_a_failed_task_result() -> None:
    with serve_app(build_upstream_app("fail")) as url:
        body = rpc(url, v03_send("hi"))
    assert "error" not in body
    assert body["result"]["status"]["state"] == "failed"
    assert texts(body["result"]["status"]["message"]["parts"]) == ["upstream broke"]


def test_v03_unknown_task_is_error_32001() -> None:
    with serve_app(build_upstream_app("echo")) as url:
        body = rpc(url, v03_get("no-such-task"))
    assert body["error"]["code"] == -32001


def test_v03_method_with_v1_version_header_is_refused() -> None:
    """A gate must not forward `A2A-Version: 1.0` on a v0.3 call."""
    with serve_app(build_upstream_app("echo")) as url:
        body = rpc(url, v03_send("hi"), headers=V1_HEADERS)
    assert body["error"]["code"] == -32603
    assert "'1.0' is not supported" in body["error"]["message"]


def test_v1_method_without_version_header_is_refused() -> None:
    body_in = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"role": "ROLE_USER", "messageId": "m", "parts": [{"text": "hi"}]}},
    }
    with serve_app(build_upstream_app("echo")) as url:
        refused = rpc(url, body_in)
        accepted = rpc(url, body_in, headers=V1_HEADERS)
    assert refused["error"]["code"] == -32009
    assert accepted["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


# --- v1.0 through the official SDK client -----------------------------------


def test_sdk_echo_send_and_get() -> None:
    with serve_app(build_upstream_app("echo")) as url:
        result = run(sdk.send_text(url, "hi"))
        task = result["task"]
        fetched = run(sdk.get_task(url, task["id"], history_length=0))
    assert set(result) == {"task"}
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == [{"text": "upstream echo: hi"}]
    assert task["history"][0]["role"] == "ROLE_USER"
    assert task["history"][0]["parts"] == [{"text": "hi"}]
    assert fetched["id"] == task["id"]
    assert "history" not in fetched


def test_sdk_slow_blocking_send_still_returns_working_then_poll() -> None:
    with serve_app(build_upstream_app("slow")) as url:
        task = run(sdk.send_text(url, "hi"))["task"]
        assert task["status"]["state"] == "TASK_STATE_WORKING"
        final = poll(
            lambda: run(sdk.get_task(url, task["id"])),
            lambda t: t["status"]["state"] == "TASK_STATE_COMPLETED",
        )
    assert final["artifacts"][0]["parts"] == [{"text": "upstream echo: hi"}]


def test_sdk_non_blocking_send_on_slow_then_cancel() -> None:
    with serve_app(build_upstream_app("slow")) as url:
        task = run(sdk.send_text(url, "hi", blocking=False))["task"]
        canceled = run(sdk.cancel_task(url, task["id"]))
        time.sleep(SLOW_GRACE_S)
        after = run(sdk.get_task(url, task["id"]))
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert after["status"]["state"] == "TASK_STATE_CANCELED"
    assert "artifacts" not in after


def test_sdk_input_required_follow_up() -> None:
    with serve_app(build_upstream_app("input-required")) as url:
        task = run(sdk.send_text(url, "hi"))["task"]
        done = run(sdk.send_text(url, "more", task_id=task["id"], context_id=task["contextId"]))["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert task["status"]["message"]["role"] == "ROLE_AGENT"
    assert task["status"]["message"]["parts"] == [{"text": "need more"}]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][0]["parts"] == [{"text": "upstream got: more"}]
    assert [m["role"] for m in done["history"]] == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"]


def test_sdk_fail() -> None:
    with serve_app(build_upstream_app("fail")) as url:
        task = run(sdk.send_text(url, "hi"))["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert task["status"]["message"]["parts"] == [{"text": "upstream broke"}]


def test_sdk_stream_echo_events() -> None:
    with serve_app(build_upstream_app("echo")) as url:
        events = run(sdk.stream_text(url, "hi"))
    assert [next(iter(e)) for e in events] == ["task", "artifactUpdate", "statusUpdate"]
    assert events[0]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert events[1]["artifactUpdate"]["artifact"]["parts"] == [{"text": "upstream echo: hi"}]
    assert events[2]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # v1.0 has no `final` flag: the stream simply ends.
    assert "final" not in events[2]["statusUpdate"]


def test_sdk_stream_input_required_ends_at_the_interruption() -> None:
    with serve_app(build_upstream_app("input-required")) as url:
        events = run(sdk.stream_text(url, "hi"))
    assert [next(iter(e)) for e in events] == ["task", "statusUpdate"]
    assert events[1]["statusUpdate"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"


def test_sdk_errors_carry_jsonrpc_codes() -> None:
    with serve_app(build_upstream_app("echo")) as url:
        missing = run(sdk.expect_a2a_error(sdk.get_task(url, "no-such-task")))
        task = run(sdk.send_text(url, "hi"))["task"]
        not_cancelable = run(sdk.expect_a2a_error(sdk.cancel_task(url, task["id"])))
    assert isinstance(missing, TaskNotFoundError)
    assert not isinstance(missing, A2AClientError)
    assert sdk.jsonrpc_error_code(missing) == -32001
    assert isinstance(not_cancelable, TaskNotCancelableError)
    assert sdk.jsonrpc_error_code(not_cancelable) == -32002


# --- broken upstreams --------------------------------------------------------


def test_raw_behaviours_over_http() -> None:
    with serve_app(build_upstream_app("garbage")) as url:
        garbage = httpx.post(url + "/", json=v03_send("hi"))
    with serve_app(build_upstream_app("garbage-json")) as url:
        garbage_json = httpx.post(url + "/", json=v03_send("hi"))
    with serve_app(build_upstream_app("http500")) as url:
        http500 = httpx.post(url + "/", json=v03_send("hi"))
    with serve_app(build_upstream_app("hang")) as url, pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/", json=v03_send("hi"), timeout=0.5)
    assert (garbage.status_code, garbage.text) == (200, "this is not json")
    assert (garbage_json.status_code, garbage_json.content) == (200, GARBAGE_JSON)
    assert http500.status_code == 500


def test_sdk_against_broken_upstreams() -> None:
    with serve_app(build_upstream_app("garbage")) as url:
        garbage = run(sdk.expect_a2a_error(sdk.send_text(url, "hi")))
    with serve_app(build_upstream_app("http500")) as url:
        http500 = run(sdk.expect_a2a_error(sdk.send_text(url, "hi")))
    with serve_app(build_upstream_app("hang")) as url:
        started = time.monotonic()
        hang = run(sdk.expect_a2a_error(sdk.send_text(url, "hi", timeout=0.5)))
        assert time.monotonic() - started < 5
    with serve_app(build_upstream_app("garbage-json")) as url:
        # Not an A2AError: the SDK parses {"weird": true} into an empty
        # SendMessageResponse and then trips over it.
        with pytest.raises(ValueError, match="neither task nor message"):
            run(sdk.send_text(url, "hi"))
        # ... and GetTask silently yields an empty Task.
        assert run(sdk.get_task(url, "t")) == {}
    assert type(garbage) is A2AClientError and "JSON Decode Error" in garbage.message
    assert type(http500) is A2AClientError and "HTTP Error 500" in http500.message
    assert isinstance(hang, A2AClientTimeoutError)
    for error in (garbage, http500, hang):
        assert sdk.jsonrpc_error_code(error) is None


# --- what the SDK client sends, and the least it accepts back ----------------


class Recorder:
    """A fake agent that records requests and answers with minimal v1.0 JSON."""

    TASK: ClassVar[dict[str, Any]] = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.app = Starlette(
            routes=[
                Route("/.well-known/agent-card.json", self.card, methods=["GET"]),
                Route("/rpc", self.rpc, methods=["POST"]),
            ]
        )

    async def card(self, request: Request) -> Response:
        self.requests.append(("GET", dict(request.headers), None))
        # The least the SDK client needs: an interface to post to.
        return JSONResponse(
            {
                "name": "recorder",
                "supportedInterfaces": [
                    {"url": str(request.base_url) + "rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
                ],
                "capabilities": {"streaming": True},
            }
        )

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(("POST", dict(request.headers), body))
        method, rid = body["method"], body["id"]
        if body["params"].get("message", {}).get("parts") == [{"text": "odd-error"}]:
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -31999, "message": "odd"}})
        if method == "SendMessage":
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": {"task": self.TASK}})
        if method in ("GetTask", "CancelTask"):
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": self.TASK})
        if method == "SendStreamingMessage":
            events = [
                {"task": self.TASK},
                {
                    "artifactUpdate": {
                        "taskId": "t1",
                        "contextId": "c1",
                        "artifact": {"artifactId": "a1", "parts": [{"text": "x"}]},
                    }
                },
                {"statusUpdate": {"taskId": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_COMPLETED"}}},
            ]

            async def frames() -> Any:
                for event in events:
                    # Bare `data:` lines, no `event:`/`id:` fields, LF only.
                    yield "data: " + json.dumps({"jsonrpc": "2.0", "id": rid, "result": event}) + "\n\n"

            return StreamingResponse(frames(), media_type="text/event-stream")
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "nope"}})

    def posts(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        return [(headers, body) for verb, headers, body in self.requests if verb == "POST"]


def test_sdk_client_wire_contract() -> None:
    recorder = Recorder()
    auth = {"Authorization": "Bearer tok"}
    with serve_app(recorder.app) as url:
        sent = run(sdk.send_text(url, "hi", headers=auth))
        sent_nb = run(sdk.send_text(url, "hi", blocking=False, task_id="t1", context_id="c1"))
        got = run(sdk.get_task(url, "t1", history_length=2, headers=auth))
        canceled = run(sdk.cancel_task(url, "t1"))
        streamed = run(sdk.stream_text(url, "hi", headers=auth))
        odd = run(sdk.expect_a2a_error(sdk.send_text(url, "odd-error")))

    assert sent == sent_nb == {"task": Recorder.TASK}
    assert got == canceled == Recorder.TASK
    assert [next(iter(e)) for e in streamed] == ["task", "artifactUpdate", "statusUpdate"]
    assert type(odd) is A2AClientError and sdk.jsonrpc_error_code(odd) == -31999

    gets = [headers for verb, headers, _ in recorder.requests if verb == "GET"]
    assert gets[0]["a2a-version"] == "1.0"
    assert gets[0]["authorization"] == "Bearer tok"  # custom headers reach the card fetch too

    posts = recorder.posts()
    for headers, body in posts:
        assert headers["a2a-version"] == "1.0"
        assert headers["content-type"] == "application/json"
        assert body["jsonrpc"] == "2.0"
        assert isinstance(body["id"], str)  # a fresh uuid4 per call

    (h_send, send), (_, send_nb), (h_get, get), (_, cancel), (h_stream, stream) = posts[:5]
    message = send["params"]["message"]
    assert send["method"] == "SendMessage"
    assert set(message) == {"messageId", "role", "parts"}
    assert message["role"] == "ROLE_USER"
    assert message["parts"] == [{"text": "hi"}]
    # Blocking is the default; the SDK still sends an empty configuration.
    assert send["params"]["configuration"] == {}
    assert h_send["authorization"] == "Bearer tok"

    assert send_nb["params"]["configuration"] == {"returnImmediately": True}
    assert send_nb["params"]["message"]["taskId"] == "t1"
    assert send_nb["params"]["message"]["contextId"] == "c1"

    assert get["method"] == "GetTask"
    assert get["params"] == {"id": "t1", "historyLength": 2}
    assert h_get["authorization"] == "Bearer tok"
    assert cancel["method"] == "CancelTask"
    assert cancel["params"] == {"id": "t1"}

    assert stream["method"] == "SendStreamingMessage"
    assert stream["params"]["configuration"] == {}
    assert h_stream["accept"] == "text/event-stream"
    assert h_stream["cache-control"] == "no-store"
    assert h_stream["authorization"] == "Bearer tok"


def test_sdk_client_speaks_v03_to_a_legacy_card() -> None:
    """A card with only top-level `url` (+ protocolVersion 0.3) gets the v0.3 dialect."""
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def card(request: Request) -> Response:
        return JSONResponse(
            {"name": "legacy", "url": str(request.base_url), "protocolVersion": "0.3.0", "capabilities": {}}
        )

    async def endpoint(request: Request) -> Response:
        body = await request.json()
        seen.append((dict(request.headers), body))
        task = {"kind": "task", "id": "t1", "contextId": "c1", "status": {"state": "working"}}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": task})

    app = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card, methods=["GET"]),
            Route("/", endpoint, methods=["POST"]),
        ]
    )
    with serve_app(app) as url:
        result = run(sdk.send_text(url, "hi", blocking=False))
    headers, body = seen[0]
    assert result == {"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}}
    assert headers["a2a-version"] == "0.3"
    assert body["method"] == "message/send"
    assert body["params"]["configuration"] == {"blocking": False}
    assert body["params"]["message"]["kind"] == "message"
    assert body["params"]["message"]["role"] == "user"
    assert body["params"]["message"]["parts"] == [{"kind": "text", "text": "hi"}]
