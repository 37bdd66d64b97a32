"""The `upstream` backend (DESIGN section 9): another A2A server behind the gate.

End to end against real a2a-sdk upstream agents served on uvicorn, plus unit tests
of `server.upstream.parse_answer`, the one function every upstream answer goes
through, which must never raise.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.upstream import Malformed, Result, RpcFailure, Running, parse_answer
from tests.support.gate_helpers import (
    artifact_texts,
    bearer,
    gate_recursion_limit,
    poll,
    post,
    result,
    rpc,
    rpc_body,
    sse_events,
    status_text,
    v03_message,
)
from tests.support.gate_process import GateProcess, free_port
from tests.support.serve import serve_app
from tests.support.upstream_agents import BEHAVIOURS, build_upstream_app

KEY = "a2g_upstream-test-principal-key-000000"
AUTH = bearer(KEY)
OPERATOR_CREDENTIAL = "Bearer operator-upstream-credential"


@dataclass
class Recorder:
    """A tiny upstream that completes every request and keeps what it was sent."""

    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> JSONResponse:
            body = await request.body()
            self.requests.append((dict(request.headers), body))
            task = {
                "kind": "task",
                "id": "up-1",
                "contextId": "up-ctx",
                "status": {"state": "completed"},
                "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": "recorded"}]}],
            }
            return JSONResponse({"jsonrpc": "2.0", "id": json.loads(body).get("id"), "result": task})

        return Starlette(routes=[Route("/", endpoint, methods=["POST"])])


ODD_ANSWERS = {  # JSON an upstream may send that parses, but that no answer of ours could carry as is
    "surrogate": b'{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"u","contextId":"c","status":'
    b'{"state":"completed"},"artifacts":[{"artifactId":"a","parts":[{"kind":"text","text":"odd \\ud800"}]}]}}',
    "huge-number": b'{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"u","contextId":"c","status":'
    b'{"state":"completed"},"artifacts":[{"artifactId":"a","parts":[{"kind":"data","data":{"n":1e400}}]}]}}',
}


def odd_upstream() -> Starlette:
    def route(name: str) -> Route:
        async def endpoint(request: Request) -> Response:
            return Response(ODD_ANSWERS[name], media_type="application/json")

        return Route(f"/{name}", endpoint, methods=["POST"])

    return Starlette(routes=[route(name) for name in ODD_ANSWERS])


@dataclass
class Fleet:
    gate: GateProcess
    upstreams: dict[str, str]
    recorder: Recorder
    database: Path

    def url(self, agent: str) -> str:
        return f"{self.gate.url}/a2a/{agent}"


def agent_table(name: str, url: str, **extra: Any) -> str:
    lines = [
        f"[agents.{name}]",
        'backend = "upstream"',
        f'url = "{url}"',
        "poll_interval_seconds = 0.1",
        "timeout_seconds = 5.0",
        "deadline_seconds = 10.0",
    ]
    for key, value in extra.items():
        lines = [line for line in lines if not line.startswith(f"{key} =")]
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One gate in front of every kind of upstream, for the module (each upstream stops in the
    background at the end: the hanging one holds its server for the 1 s grace)."""
    folder = tmp_path_factory.mktemp("upstream")
    recorder = Recorder()
    with (
        serve_app(build_upstream_app("echo"), wait_on_exit=False) as echo,
        serve_app(build_upstream_app("slow"), wait_on_exit=False) as slow,
        serve_app(build_upstream_app("input-required"), wait_on_exit=False) as asking,
        serve_app(build_upstream_app("fail"), wait_on_exit=False) as fail,
        serve_app(build_upstream_app("hang"), wait_on_exit=False) as hang,
        serve_app(build_upstream_app("garbage"), wait_on_exit=False) as garbage,
        serve_app(build_upstream_app("garbage-json"), wait_on_exit=False) as garbage_json,
        serve_app(build_upstream_app("http500"), wait_on_exit=False) as http500,
        serve_app(recorder.app(), wait_on_exit=False) as recording,
        serve_app(odd_upstream(), wait_on_exit=False) as odd,
    ):
        upstreams = {
            "echo": echo,
            "slow": slow,
            "input-required": asking,
            "fail": fail,
            "hang": hang,
            "garbage": garbage,
            "garbage-json": garbage_json,
            "http500": http500,
        }
        assert set(upstreams) == set(BEHAVIOURS)
        tables = [agent_table(f"up-{name}", url + "/") for name, url in upstreams.items() if name != "hang"]
        tables.append(agent_table("up-hang", hang, timeout_seconds=1))
        tables.append(agent_table("up-slow-deadline", slow, deadline_seconds=0.3))
        tables.append(agent_table("up-down", f"http://127.0.0.1:{free_port()}"))
        tables.append(agent_table("recorder", recording, upstream_auth_env="A2A_GATE_TEST_UPSTREAM_AUTH"))
        tables.append(agent_table("recorder-plain", recording))
        tables += [agent_table(f"odd-{name}", f"{odd}/{name}") for name in ODD_ANSWERS]
        config = folder / "gate.toml"
        config.write_text(
            'public_url = "http://gate.example"\ndatabase = "gate.db"\n\n'
            + "\n".join(tables)
            + f'\n[[keys]]\nname = "up"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\nagents = ["*"]\n'
        )
        env = {"A2A_GATE_TEST_UPSTREAM_AUTH": OPERATOR_CREDENTIAL}
        with GateProcess(config, folder / "gate.log", env=env) as gate:
            yield Fleet(gate, upstreams, recorder, folder / "gate.db")


def send(fleet: Fleet, agent: str, text: str = "hi", **fields: Any) -> dict[str, Any]:
    response = post(
        fleet.url(agent), rpc_body("message/send", {"message": v03_message(text, **fields)}), AUTH, timeout=20
    )
    assert response.status_code == 200, response.text
    doc = response.json()
    assert "result" in doc, doc
    return doc["result"]


def get(fleet: Fleet, agent: str, task_id: str) -> dict[str, Any]:
    return result(fleet.url(agent), "tasks/get", {"id": task_id}, AUTH)


def backend_ref(fleet: Fleet, task_id: str) -> dict[str, Any]:
    with sqlite3.connect(fleet.database) as db:
        [(ref,)] = db.execute("SELECT backend_ref FROM tasks WHERE id = ?", (task_id,)).fetchall()
    return json.loads(ref)


# --- end to end ---------------------------------------------------------------------


def test_echo_upstream_completes_with_its_artifact(fleet: Fleet) -> None:
    task = send(fleet, "up-echo", "ping")

    assert task["status"]["state"] == "completed"
    assert artifact_texts(task) == ["upstream echo: ping"]
    assert backend_ref(fleet, task["id"])["upstream_task_id"]


def test_echo_upstream_through_a_stream(fleet: Fleet) -> None:
    response = post(fleet.url("up-echo"), rpc_body("message/stream", {"message": v03_message("flow")}), AUTH)

    events = [e["result"] for e in sse_events(response.text)]
    assert events[-1]["final"] is True and events[-1]["status"]["state"] == "completed"
    artifacts = [e["artifact"] for e in events if e["kind"] == "artifact-update"]
    assert [p["text"] for a in artifacts for p in a["parts"]] == ["upstream echo: flow"]


def test_slow_upstream_is_polled_until_it_completes(fleet: Fleet) -> None:
    task = send(fleet, "up-slow", "patience")

    assert task["status"]["state"] == "completed"
    assert artifact_texts(task) == ["upstream echo: patience"]


def test_slow_upstream_polled_by_a_non_blocking_caller(fleet: Fleet) -> None:
    params = {"message": v03_message("later"), "configuration": {"blocking": False}}
    task = result(fleet.url("up-slow"), "message/send", params, AUTH)
    assert task["status"]["state"] in ("submitted", "working")

    final = poll(lambda: get(fleet, "up-slow", task["id"]), lambda t: t["status"]["state"] == "completed")

    assert artifact_texts(final) == ["upstream echo: later"]


def test_an_upstream_past_its_deadline_fails_the_task(fleet: Fleet) -> None:
    task = send(fleet, "up-slow-deadline", "too slow")

    assert task["status"]["state"] == "failed"
    assert "did not finish within 0.3s" in status_text(task)
    assert not artifact_texts(task)


def test_input_required_upstream_is_continued_with_the_task_id(fleet: Fleet) -> None:
    first = send(fleet, "up-input-required", "question")
    assert first["status"]["state"] == "input-required"
    assert "need more" in status_text(first)
    upstream_task = backend_ref(fleet, first["id"])["upstream_task_id"]

    second = send(fleet, "up-input-required", "the answer", taskId=first["id"])

    assert second["id"] == first["id"]
    assert second["status"]["state"] == "completed"
    assert artifact_texts(second) == ["upstream got: the answer"]
    assert backend_ref(fleet, first["id"])["upstream_task_id"] == upstream_task
    # the follow-up went to the upstream's own task
    upstream = rpc(fleet.upstreams["input-required"] + "/", "tasks/get", {"id": upstream_task})["result"]
    assert upstream["status"]["state"] == "completed"
    assert [m["parts"][0]["text"] for m in upstream["history"] if m["role"] == "user"] == ["question", "the answer"]


def test_failed_upstream_fails_the_task_with_its_reason(fleet: Fleet) -> None:
    task = send(fleet, "up-fail")

    assert task["status"]["state"] == "failed"
    assert "upstream task failed" in status_text(task)
    assert "upstream broke" in status_text(task)
    assert not artifact_texts(task)


def test_hanging_upstream_times_out_into_a_failed_task(fleet: Fleet) -> None:
    task = send(fleet, "up-hang")

    assert task["status"]["state"] == "failed"
    assert "timed out after 1s" in status_text(task)


@pytest.mark.parametrize(
    "agent,reason",
    [
        ("up-garbage", "body is not JSON"),
        ("up-garbage-json", "neither a Task nor a Message"),
        ("up-http500", "HTTP 500"),
        ("up-down", "unreachable"),
    ],
)
def test_broken_upstreams_fail_the_task_with_a_clear_reason(fleet: Fleet, agent: str, reason: str) -> None:
    task = send(fleet, agent)

    assert task["status"]["state"] == "failed"
    assert reason in status_text(task)
    assert status_text(task).startswith("upstream agent failed")
    assert get(fleet, agent, task["id"])["status"]["state"] == "failed"


def test_broken_upstreams_are_logged_without_the_callers_secrets(fleet: Fleet) -> None:
    send(fleet, "up-garbage")
    log = fleet.gate.log.read_text(errors="replace")

    assert "up-garbage" in log
    assert KEY not in log and "Traceback" not in log


def test_the_callers_credentials_never_reach_the_upstream(fleet: Fleet) -> None:
    fleet.recorder.requests.clear()
    headers = {
        **AUTH,
        "PAYMENT-SIGNATURE": "eyJzZWNyZXQiOiAidG9rZW4ifQ==",
        "X-PAYMENT": "legacy-token",
        "Cookie": "session=caller",
        "X-A2A-Extensions": "https://example.com/ext",
    }
    message = v03_message("forward me", metadata={"x402.payment.payload": {"secret": "token"}, "note": "kept"})

    for agent in ("recorder", "recorder-plain"):
        response = post(fleet.url(agent), rpc_body("message/send", {"message": message}), headers)
        assert response.json()["result"]["status"]["state"] == "completed"

    (with_credential, sent), (plain, _) = fleet.recorder.requests
    assert with_credential["authorization"] == OPERATOR_CREDENTIAL
    assert "authorization" not in plain
    for recorded in (with_credential, plain):
        assert not {"payment-signature", "x-payment", "cookie", "x-a2a-extensions"} & set(recorded)
        assert KEY not in json.dumps(recorded)
    forwarded = json.loads(sent)
    assert forwarded["method"] == "message/send"
    assert forwarded["params"]["message"]["parts"] == [{"kind": "text", "text": "forward me"}]
    assert KEY.encode() not in sent and b"x402" not in sent and b"secret" not in sent


@pytest.mark.parametrize("name", sorted(ODD_ANSWERS))
def test_odd_upstream_output_never_becomes_an_internal_error(fleet: Fleet, name: str) -> None:
    """An upstream's lone surrogate or out-of-range number: our task still has an answer
    (completed or failed), never a -32603 for a task that ran (and on the paid path, was paid)."""
    for method in ("message/send", "SendMessage"):
        message = (
            v03_message("hi")
            if method == "message/send"
            else {"role": "ROLE_USER", "messageId": "m", "parts": [{"text": "hi"}]}
        )
        version = {"A2A-Version": "1.0"} if method == "SendMessage" else {}
        response = post(fleet.url(f"odd-{name}"), rpc_body(method, {"message": message}), {**AUTH, **version})
        assert response.status_code == 200
        doc = response.json()
        assert "result" in doc, doc


# --- parse_answer -------------------------------------------------------------------


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def ok(result_doc: Any) -> bytes:
    return body({"jsonrpc": "2.0", "id": 1, "result": result_doc})


V03_TASK = {
    "kind": "task",
    "id": "t1",
    "contextId": "c1",
    "status": {
        "state": "completed",
        "message": {
            "kind": "message",
            "role": "agent",
            "messageId": "m",
            "parts": [{"kind": "text", "text": "all done"}],
        },
    },
    "artifacts": [
        {"artifactId": "a1", "parts": [{"kind": "text", "text": "answer"}, {"kind": "data", "data": {"n": 1}}]}
    ],
}
V10_TASK = {
    "id": "t2",
    "contextId": "c2",
    "status": {
        "state": "TASK_STATE_COMPLETED",
        "message": {"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "fine"}]},
    },
    "artifacts": [
        {"artifactId": "a", "parts": [{"text": "v1 answer"}, {"url": "https://x.example/f", "mediaType": "text/plain"}]}
    ],
}


@pytest.mark.parametrize("status_code", [201, 204, 301, 400, 401, 404, 500, 502, 503])
def test_parse_answer_non_200_is_malformed(status_code: int) -> None:
    assert parse_answer(status_code, ok(V03_TASK)) == Malformed(f"HTTP {status_code}")


@pytest.mark.parametrize("raw", [b"", b"this is not json", b"\xff\xfe", b"[" * 100_000, b'{"a": }', b"NaN x"])
def test_parse_answer_non_json_is_malformed(raw: bytes) -> None:
    with gate_recursion_limit():
        assert parse_answer(200, raw) == Malformed("body is not JSON")


@pytest.mark.parametrize("doc", [[], [1], "s", 3, None, True])
def test_parse_answer_non_object_is_malformed(doc: Any) -> None:
    assert isinstance(parse_answer(200, body(doc)), Malformed)


@pytest.mark.parametrize(
    "doc",
    [
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "result": None},
        {"jsonrpc": "2.0", "id": 1, "result": [V03_TASK]},
        {"jsonrpc": "2.0", "id": 1, "result": "completed"},
        {"jsonrpc": "2.0", "id": 1, "error": "broken"},
        {"jsonrpc": "2.0", "id": 1, "result": {"weird": True}},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    ],
)
def test_parse_answer_without_a_usable_result_is_malformed(doc: Any) -> None:
    assert isinstance(parse_answer(200, body(doc)), Malformed)


def test_parse_answer_errors() -> None:
    assert parse_answer(200, body({"error": {"code": -32001, "message": "Task not found"}})) == RpcFailure(
        -32001, "Task not found"
    )
    assert parse_answer(200, body({"error": {"code": True, "message": 5}})) == RpcFailure(0, "")
    assert parse_answer(200, body({"error": {"code": "-32000"}})) == RpcFailure(0, "")
    long = parse_answer(200, body({"error": {"code": 1, "message": "x" * 1000}}))
    assert isinstance(long, RpcFailure) and len(long.message) == 200
    # an error wins over a result in the same answer
    assert isinstance(parse_answer(200, body({"error": {"code": 2}, "result": V03_TASK})), RpcFailure)


def test_parse_answer_v03_completed_task() -> None:
    answer = parse_answer(200, ok(V03_TASK))

    assert answer == Result(
        "completed", [{"kind": "text", "text": "answer"}, {"kind": "data", "data": {"n": 1}}], "all done", "t1", "c1"
    )


def test_parse_answer_v10_wrapped_task() -> None:
    answer = parse_answer(200, ok({"task": V10_TASK}))

    assert isinstance(answer, Result)
    assert answer.state == "completed" and answer.task_id == "t2" and answer.context_id == "c2"
    assert answer.parts == [
        {"kind": "text", "text": "v1 answer"},
        {"kind": "file", "file": {"uri": "https://x.example/f", "mimeType": "text/plain"}},
    ]
    assert answer.text == "fine"
    assert parse_answer(200, ok(V10_TASK)) == answer  # unwrapped (GetTask) too


def test_parse_answer_messages() -> None:
    v03 = {"kind": "message", "role": "agent", "messageId": "m", "parts": [{"kind": "text", "text": "hello"}]}
    v10 = {"message": {"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "hello"}]}}

    expected = Result("completed", [{"kind": "text", "text": "hello"}], "hello")
    assert parse_answer(200, ok(v03)) == expected
    assert parse_answer(200, ok(v10)) == expected
    assert isinstance(parse_answer(200, ok({**v03, "parts": [{"kind": "text", "text": ""}]})), Malformed)
    assert isinstance(parse_answer(200, ok({"message": {"role": "ROLE_AGENT", "parts": []}})), Malformed)


def test_parse_answer_completed_task_without_artifacts_uses_the_status_message() -> None:
    task = {**V03_TASK, "artifacts": []}

    answer = parse_answer(200, ok(task))

    assert isinstance(answer, Result) and answer.parts == [{"kind": "text", "text": "all done"}]


@pytest.mark.parametrize("state", ["submitted", "working", "TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"])
def test_parse_answer_running_task(state: str) -> None:
    task = {"id": "t9", "contextId": "c9", "status": {"state": state}}

    assert parse_answer(200, ok(task)) == Running("t9", "c9")
    assert parse_answer(200, ok({"task": task})) == Running("t9", "c9")
    assert parse_answer(200, ok({**task, "contextId": 5})) == Running("t9", "")


@pytest.mark.parametrize(
    "state,expected",
    [
        ("input-required", "input-required"),
        ("TASK_STATE_INPUT_REQUIRED", "input-required"),
        ("auth-required", "auth-required"),
        ("TASK_STATE_AUTH_REQUIRED", "auth-required"),
        ("failed", "failed"),
        ("TASK_STATE_FAILED", "failed"),
        ("canceled", "canceled"),
        ("rejected", "rejected"),
        ("TASK_STATE_REJECTED", "rejected"),
    ],
)
def test_parse_answer_finished_or_interrupted_task(state: str, expected: str) -> None:
    task = {
        "id": "t",
        "status": {"state": state, "message": {"role": "agent", "parts": [{"kind": "text", "text": "why"}]}},
    }

    answer = parse_answer(200, ok(task))

    assert answer == Result(expected, [], "why", "t", "")


@pytest.mark.parametrize(
    "task",
    [
        {"id": "t", "status": {"state": "done"}},
        {"id": "t", "status": {"state": "TASK_STATE_UNSPECIFIED"}},
        {"id": "t", "status": {"state": None}},
        {"id": "t", "status": {}},
        {"id": "t", "status": "completed"},
        {"id": 5, "status": {"state": "completed"}},
        {"status": {"state": "completed"}},
    ],
)
def test_parse_answer_bad_tasks_are_malformed(task: dict[str, Any]) -> None:
    assert isinstance(parse_answer(200, ok(task)), Malformed)


def test_parse_answer_ignores_junk_inside_a_good_task() -> None:
    task = {
        "id": "t",
        "kind": "task",
        "status": {"state": "completed", "message": "not a message"},
        "artifacts": [None, 5, {"parts": "x"}, {"parts": [None, {"kind": "text"}, {"kind": "text", "text": "kept"}]}],
        "unknown": {"deep": [1, 2, 3]},
    }

    assert parse_answer(200, ok(task)) == Result("completed", [{"kind": "text", "text": "kept"}], "", "t", "")


def test_parse_answer_text_is_bounded() -> None:
    task = {**V03_TASK, "status": {"state": "failed", "message": {"role": "agent", "parts": [{"text": "y" * 5000}]}}}

    answer = parse_answer(200, ok(task))

    assert isinstance(answer, Result) and len(answer.text) == 500


ANSWER_TYPES = (Result, Running, RpcFailure, Malformed)
KEYS = st.sampled_from(
    [
        "jsonrpc",
        "id",
        "result",
        "error",
        "code",
        "message",
        "task",
        "status",
        "state",
        "kind",
        "parts",
        "text",
        "data",
        "file",
        "uri",
        "bytes",
        "url",
        "raw",
        "role",
        "artifacts",
        "contextId",
        "taskId",
        "messageId",
        "metadata",
        "mediaType",
        "mimeType",
        "name",
        "x",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(
        [
            "completed",
            "working",
            "input-required",
            "TASK_STATE_COMPLETED",
            "TASK_STATE_WORKING",
            "ROLE_AGENT",
            "agent",
            "user",
            "task",
            "message",
            "text",
            "data",
            "file",
            "2.0",
        ]
    )
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=40,
)


def check(answer: Any) -> None:
    assert isinstance(answer, ANSWER_TYPES)
    if isinstance(answer, Result):
        assert all(isinstance(p, dict) and p["kind"] in ("text", "data", "file") for p in answer.parts)
        assert isinstance(answer.text, str) and len(answer.text) <= 500
    if isinstance(answer, Running):
        assert isinstance(answer.task_id, str)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=100, max_value=599), st.binary(max_size=300))
def test_parse_answer_never_raises_for_arbitrary_bytes(status_code: int, raw: bytes) -> None:
    check(parse_answer(status_code, raw))


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES)
def test_parse_answer_never_raises_for_arbitrary_json(doc: Any) -> None:
    check(parse_answer(200, json.dumps(doc).encode()))
    check(parse_answer(200, json.dumps({"jsonrpc": "2.0", "id": 1, "result": doc}).encode()))
    check(parse_answer(200, json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"task": doc}}).encode()))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, JSON_VALUES, max_size=6), st.sampled_from(["status", "message", "artifacts", "parts"]))
def test_parse_answer_never_raises_for_task_like_shapes(doc: dict[str, Any], key: str) -> None:
    task = {"id": "t", "status": {"state": "completed"}, **doc}
    check(parse_answer(200, ok(task)))
    check(parse_answer(200, ok({"task": {"id": "t", "status": {**doc, "state": "completed"}, key: doc.get(key)}})))
    check(parse_answer(200, ok({"role": "ROLE_AGENT", "parts": [doc, {"text": "x"}]})))


@pytest.mark.parametrize(
    ("answer", "usage"),
    [
        ({**V03_TASK, "metadata": {"usage": {"output_tokens": 12, "calls": 1.0}}}, {"output_tokens": 12, "calls": 1}),
        (
            {
                **V10_TASK,
                "status": {
                    **V10_TASK["status"],
                    "message": {**V10_TASK["status"]["message"], "metadata": {"usage": {"pages": 3}}},
                },
            },
            {"pages": 3},
        ),
        (
            {
                "kind": "message",
                "role": "agent",
                "messageId": "m",
                "parts": [{"kind": "text", "text": "hi"}],
                "metadata": {"usage": {"chars": 2}},
            },
            {"chars": 2},
        ),
        (
            {**V03_TASK, "metadata": {"usage": {"bad": -1, "nan": "x", "ok": 4}}},
            {"bad": -1, "ok": 4},
        ),  # what is no number is dropped; a number that is not a count is carried, and fails the run (below)
        ({**V03_TASK, "metadata": {"usage": [1, 2]}}, {}),
        (V03_TASK, {}),
    ],
)
def test_an_upstream_reports_its_usage_in_its_metadata(answer, usage):
    """`metadata.usage` of the upstream's Task, its final status message or its Message answer."""
    from server.config import AgentConfig
    from server.upstream import UpstreamBackend

    parsed = parse_answer(200, ok(answer))
    assert isinstance(parsed, Result) and parsed.usage == usage
    reply = UpstreamBackend(AgentConfig(name="u", url="http://127.0.0.1:9/")).reply(parsed)
    assert reply.state == "completed" and reply.usage == usage


@pytest.mark.parametrize("bad", [-1, -0.5, 1e308, 10**15 + 1])  # (JSON carries no NaN nor infinity)
def test_an_upstream_usage_count_that_is_not_a_count_is_its_error(bad):
    """Negative or past the bound: carried as it came, never silently left out, and
    refused where the work is delivered (the upstream's error: its run fails, nothing charged)."""
    from server import usage

    parsed = parse_answer(200, ok({**V03_TASK, "metadata": {"usage": {"bad": bad, "ok": 4}}}))
    assert isinstance(parsed, Result) and parsed.usage["ok"] == 4 and "bad" in parsed.usage
    with pytest.raises(usage.BadUsage):
        usage.checked(parsed.usage)
