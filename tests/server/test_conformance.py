"""A2A conformance against a real gate: resubscription, ListTasks, version negotiation,
error details, card caching, required fields and paths, push methods.

The official a2a-sdk 1.x client where it has the method (subscribe, list_tasks, the
errors it surfaces), raw JSON-RPC elsewhere. A2A v1.0 sections 3.1.4, 3.1.6, 3.3.4,
3.6, 8.6 and 9.5; v0.3 section 7.9.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from a2a.types.a2a_pb2 import ListTasksRequest, SubscribeToTaskRequest, TaskState
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.conftest import FREE_CONFIG
from tests.support import a2a_clients as sdk
from tests.support.gate_helpers import artifact_texts, bearer, poll, post, rpc, rpc_body, sse_events, v03_message
from tests.support.gate_process import Gate, GateProcess, free_port
from tests.support.paid import PaidView, Payer, send_body
from tests.support.serve import serve_app

T = TypeVar("T")
KEY = "a2g_conformance-principal-key-0123456789"
OTHER_KEY = "a2g_conformance-other-principal-key-0000"
V1 = {"A2A-Version": "1.0"}


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def keys_table(*keys: tuple[str, str]) -> str:
    return "".join(
        f'\n[[keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\nagents = ["*"]\n'
        for name, key in keys
    )


NO_STREAM = """
[agents.flat]
streaming = false
"""


# Keys no other test uses, for tests that count or list everything a caller owns.
OWN_KEYS = [f"a2g_conformance-own-key-{i:02d}-000000000000" for i in range(8)]


@pytest.fixture(scope="module")
def module_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """One gate for the module: tests that list a caller's tasks use a key of their own (`own_keys`)."""
    folder = tmp_path_factory.mktemp("conformance")
    port = free_port()
    text = FREE_CONFIG.replace("http://gate.example", f"http://127.0.0.1:{port}") + NO_STREAM
    text += keys_table(("conformance", KEY), ("other", OTHER_KEY))
    text += keys_table(*((f"own-{i}", key) for i, key in enumerate(OWN_KEYS)))
    config = folder / "gate.toml"
    config.write_text(text)
    with GateProcess(config, folder / "gate.log", port=port) as process:
        yield process


@pytest.fixture(scope="module")
def unused_keys() -> Iterator[str]:
    return iter(OWN_KEYS)


@pytest.fixture
def gate(module_gate: GateProcess) -> Gate:
    return Gate(module_gate, bearer(KEY))


@pytest.fixture
def own_keys(unused_keys: Iterator[str]) -> Callable[[], dict[str, str]]:
    """Authorization headers of keys no other test has used: the caller's tasks are only this test's."""
    return lambda: bearer(next(unused_keys))


def state(task: dict[str, Any]) -> str:
    return task["status"]["state"]


# --- SDK helpers for the two methods tests/support/a2a_clients.py does not wrap ------


async def subscribe(url: str, task_id: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    async with sdk.sdk_client(url, headers=headers, streaming=True) as client:
        return [MessageToDict(e) async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]


async def list_tasks(url: str, headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    async with sdk.sdk_client(url, headers=headers) as client:
        return MessageToDict(
            await client.list_tasks(ListTasksRequest(**fields)), always_print_fields_with_no_presence=True
        )


# --- resubscription -------------------------------------------------------------------


def test_subscribe_follows_a_running_task_to_its_end(gate: Gate) -> None:
    url = gate.agent("slow")
    task = run(sdk.send_text(url, "sleep 1", headers=gate.headers, blocking=False))["task"]

    events = run(subscribe(url, task["id"], gate.headers))

    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "task" and events[0]["task"]["id"] == task["id"], events
    assert state(events[0]["task"]) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    assert kinds[1:] == ["artifactUpdate", "statusUpdate"], events
    assert events[1]["artifactUpdate"]["artifact"]["parts"] == [{"text": "slept 1"}]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_subscribe_to_a_finished_task_is_unsupported_operation(gate: Gate) -> None:
    url = gate.agent("echo")
    task = run(sdk.send_text(url, "done", headers=gate.headers))["task"]

    error = run(sdk.expect_a2a_error(subscribe(url, task["id"], gate.headers)))

    assert sdk.jsonrpc_error_code(error) == -32004


def test_subscribe_to_an_unknown_or_foreign_task_is_task_not_found(gate: Gate) -> None:
    url = gate.agent("slow")
    task = run(sdk.send_text(url, "sleep 2", headers=gate.headers, blocking=False))["task"]

    unknown = run(sdk.expect_a2a_error(subscribe(url, "00000000-0000-4000-8000-000000000000", gate.headers)))
    foreign = run(sdk.expect_a2a_error(subscribe(url, task["id"], bearer(OTHER_KEY))))

    assert sdk.jsonrpc_error_code(unknown) == sdk.jsonrpc_error_code(foreign) == -32001


def test_subscribe_on_an_agent_that_does_not_stream_is_unsupported(gate: Gate) -> None:
    task = rpc(gate.agent("flat"), "message/send", {"message": v03_message("x")}, gate.headers)["result"]

    doc = rpc(gate.agent("flat"), "SubscribeToTask", {"id": task["id"]}, {**gate.headers, **V1})

    assert doc["error"]["code"] == -32004


def test_v03_resubscribe_errors_arrive_as_an_event(gate: Gate) -> None:
    """A v0.3 SSE client refuses a JSON body on a stream: the error is the stream's one event."""
    response = post(gate.agent("echo"), rpc_body("tasks/resubscribe", {"id": "nope"}, call_id="r"), gate.headers)

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert sse_events(response.text) == [
        {"jsonrpc": "2.0", "id": "r", "error": {"code": -32001, "message": "Task not found"}}
    ]


def test_v03_resubscribe_streams_the_task_then_events_with_final(gate: Gate) -> None:
    url = gate.agent("slow")
    params = {"message": v03_message("sleep 1"), "configuration": {"blocking": False}}
    task = rpc(url, "message/send", params, gate.headers)["result"]

    response = post(url, rpc_body("tasks/resubscribe", {"id": task["id"]}, call_id="r1"), gate.headers, timeout=20)

    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e["result"] for e in sse_events(response.text)]
    assert all(e["id"] == "r1" for e in sse_events(response.text))
    assert [e["kind"] for e in events] == ["task", "artifact-update", "status-update"], events
    assert events[-1]["final"] is True and events[-1]["status"]["state"] == "completed"


def test_subscribe_to_an_interrupted_task_follows_its_next_turn_to_the_end(gate: Gate) -> None:
    """input-required is not terminal: the stream stays open until the caller's next
    message has finished the task."""
    url = gate.agent("interrupting")
    task = run(sdk.send_text(url, "weather?", headers=gate.headers))["task"]

    async def subscribe_then_answer() -> list[dict[str, Any]]:
        stream = asyncio.ensure_future(subscribe(url, task["id"], gate.headers))
        await asyncio.sleep(1.0)
        assert not stream.done()
        await sdk.send_text(url, "Oslo", headers=gate.headers, task_id=task["id"])
        return await asyncio.wait_for(stream, 10)

    events = run(subscribe_then_answer())

    assert state(events[0]["task"]) == "TASK_STATE_INPUT_REQUIRED"
    assert [e["artifactUpdate"]["artifact"]["parts"] for e in events if "artifactUpdate" in e] == [
        [{"text": "weather in Oslo: sunny"}]
    ]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_subscribe_follows_a_task_another_worker_runs(gate: Gate, start_gate: Callable[..., GateProcess]) -> None:
    """Two processes on one database, as two workers are: the task runs in the first, the
    stream is served by the second, which follows it through the store. (Raw JSON-RPC: the
    SDK would post to the card's URL, which names the first process.)"""
    second = start_gate(gate.process.config)
    url = gate.agent("slow")
    task = run(sdk.send_text(url, "sleep 1.5", headers=gate.headers, blocking=False))["task"]

    response = post(
        f"{second.url}/a2a/slow",
        rpc_body("SubscribeToTask", {"id": task["id"]}, call_id="w"),
        {**gate.headers, **V1},
        timeout=20,
    )

    events = [e["result"] for e in sse_events(response.text)]
    assert events[0]["task"]["id"] == task["id"]
    assert [next(iter(e)) for e in events[1:]] == ["artifactUpdate", "statusUpdate"], events
    assert events[1]["artifactUpdate"]["artifact"]["parts"] == [{"text": "slept 1.5"}]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_cancel_reaches_a_task_another_worker_runs(gate: Gate, start_gate: Callable[..., GateProcess]) -> None:
    """`tasks/cancel` answered by a process other than the runner: the request travels through
    the store, the runner stops the work, and both processes then show the task canceled."""
    second = start_gate(gate.process.config)
    task = rpc(
        gate.agent("slow"),
        "message/send",
        {"message": v03_message("sleep 30"), "configuration": {"blocking": False}},
        gate.headers,
    )["result"]

    canceled = rpc(f"{second.url}/a2a/slow", "tasks/cancel", {"id": task["id"]}, gate.headers)

    assert canceled["result"]["status"]["state"] == "canceled", canceled
    on_runner = rpc(gate.agent("slow"), "tasks/get", {"id": task["id"]}, gate.headers)["result"]
    assert on_runner["status"]["state"] == "canceled"
    assert artifact_texts(on_runner) == []  # the work stopped: nothing was delivered


# --- ListTasks --------------------------------------------------------------------------


def test_list_tasks_is_scoped_to_the_caller_newest_first(gate: Gate, own_keys) -> None:
    url, me, them = gate.agent("echo"), own_keys(), own_keys()
    mine = [run(sdk.send_text(url, f"mine {i}", headers=me))["task"]["id"] for i in range(3)]
    theirs = run(sdk.send_text(url, "theirs", headers=them))["task"]["id"]

    page = run(list_tasks(url, me))
    other = run(list_tasks(url, them))

    assert [t["id"] for t in page["tasks"]] == mine[::-1]
    assert page["totalSize"] == 3 and page["nextPageToken"] == "" and page["pageSize"] == 50
    assert [t["id"] for t in other["tasks"]] == [theirs]
    raw = rpc(url, "ListTasks", {}, {**me, **V1})["result"]
    assert all("artifacts" not in t for t in raw["tasks"])  # includeArtifacts defaults to false: omitted


def test_list_tasks_pages_with_a_cursor(gate: Gate, own_keys) -> None:
    url, me = gate.agent("echo"), own_keys()
    sent = [run(sdk.send_text(url, f"t{i}", headers=me))["task"]["id"] for i in range(5)]

    seen, token, pages = [], "", 0
    while pages < 5:
        page = run(list_tasks(url, me, page_size=2, page_token=token))
        assert page["totalSize"] == 5 and page["pageSize"] == 2
        seen += [t["id"] for t in page["tasks"]]
        token, pages = page["nextPageToken"], pages + 1
        if not token:
            break

    assert pages == 3 and seen == sent[::-1]


def test_list_tasks_filters(gate: Gate, own_keys) -> None:
    url, me = gate.agent("interrupting"), own_keys()
    paused = run(sdk.send_text(url, "weather?", headers=me))["task"]
    context = paused["contextId"]
    asked = run(sdk.send_text(url, "weather?", headers=me))["task"]
    done = run(sdk.send_text(url, "Rome", headers=me, task_id=asked["id"]))["task"]

    by_context = run(list_tasks(url, me, context_id=context))
    by_state = run(list_tasks(url, me, status=TaskState.TASK_STATE_COMPLETED, include_artifacts=True))
    no_history = rpc(url, "ListTasks", {"historyLength": 0}, {**me, **V1})["result"]

    assert [t["id"] for t in by_context["tasks"]] == [paused["id"]]
    assert [t["id"] for t in by_state["tasks"]] == [done["id"]]
    assert artifact_texts(by_state["tasks"][0]) == ["weather in Rome: sunny"]
    assert all("history" not in t for t in no_history["tasks"]) and len(no_history["tasks"]) == 2


@pytest.mark.parametrize(
    "params",
    [
        {"pageSize": 0},
        {"pageSize": 101},
        {"pageToken": "not-ours"},
        {"status": "TASK_STATE_RUNNING"},
        {"historyLength": -1},
        {"statusTimestampAfter": "yesterday"},
    ],
)
def test_list_tasks_refuses_bad_parameters(gate: Gate, params: dict[str, Any]) -> None:
    doc = rpc(gate.agent("echo"), "ListTasks", params, {**gate.headers, **V1})

    assert doc["error"]["code"] == -32602


def test_list_tasks_after_a_timestamp(gate: Gate, own_keys) -> None:
    url, me = gate.agent("echo"), own_keys()
    old = run(sdk.send_text(url, "old", headers=me))["task"]
    new = run(sdk.send_text(url, "new", headers=me))["task"]

    params = {"statusTimestampAfter": old["status"]["timestamp"]}
    page = rpc(url, "ListTasks", params, {**me, **V1})["result"]

    assert [t["id"] for t in page["tasks"]] == [new["id"]]


def test_tasks_list_is_not_a_v03_method(gate: Gate) -> None:
    assert rpc(gate.agent("echo"), "tasks/list", {}, gate.headers)["error"]["code"] == -32601


# --- version negotiation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "headers", [{"A2A-Version": "99.0"}, {"A2A-Version": "2"}, {"A2A-Version": "0.2"}, {}, {"A2A-Version": ""}]
)
def test_a_v10_method_under_another_version_is_version_not_supported(gate: Gate, headers: dict[str, str]) -> None:
    message = {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}

    doc = rpc(gate.agent("echo"), "SendMessage", {"message": message}, {**gate.headers, **headers})

    assert doc["error"]["code"] == -32009, doc


def test_version_numbers_ignore_the_patch_and_v03_is_the_default(gate: Gate) -> None:
    url = gate.agent("echo")
    v1_message = {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hi"}]}

    assert "result" in rpc(url, "SendMessage", {"message": v1_message}, {**gate.headers, "A2A-Version": "1.0.2"})
    assert "result" in rpc(url, "message/send", {"message": v03_message()}, {**gate.headers, "A2A-Version": "0.3.0"})
    assert "result" in rpc(url, "message/send", {"message": v03_message()}, gate.headers)
    assert rpc(url, "message/send", {"message": v03_message()}, {**gate.headers, **V1})["error"]["code"] == -32009


def test_v10_params_are_read_by_either_protobuf_json_name(gate: Gate) -> None:
    """A ProtoJSON parser accepts `history_length` as well as `historyLength` (the TCK sends the
    first); the JSON name wins when both are sent; Struct contents keep their keys."""
    url, headers = gate.agent("interrupting"), {**gate.headers, **V1}
    message = {
        "role": "ROLE_USER",
        "message_id": "m-snake",
        "parts": [{"data": {"a_b": 1}}],
        "metadata": {"some_key": True},
    }
    task = rpc(url, "SendMessage", {"message": message}, headers)["result"]["task"]

    snake = rpc(url, "GetTask", {"id": task["id"], "history_length": 1}, headers)["result"]
    both = rpc(url, "GetTask", {"id": task["id"], "history_length": 1, "historyLength": 0}, headers)["result"]

    assert len(task["history"]) == 2 and task["history"][0]["messageId"] == "m-snake"
    assert task["history"][0]["parts"] == [{"data": {"a_b": 1}}]
    assert task["history"][0]["metadata"] == {"some_key": True}
    assert len(snake["history"]) == 1 and "history" not in both


def test_the_card_declares_both_versions_at_the_url_to_post_to(gate: Gate) -> None:
    card = httpx.get(f"{gate.agent('echo')}/.well-known/agent-card.json").json()

    interfaces = {(i["protocolVersion"], i["url"], i["protocolBinding"]) for i in card["supportedInterfaces"]}
    assert interfaces == {("1.0", gate.agent("echo"), "JSONRPC"), ("0.3", gate.agent("echo"), "JSONRPC")}


# --- error details ----------------------------------------------------------------------


def test_v10_errors_carry_error_info_and_v03_errors_a_plain_object(gate: Gate) -> None:
    url = gate.agent("echo")
    v1 = rpc(url, "GetTask", {"id": "nope"}, {**gate.headers, **V1}, call_id=3)
    v03 = rpc(url, "tasks/get", {"id": "nope"}, gate.headers, call_id=3)

    assert v1["error"] == {
        "code": -32001,
        "message": "Task not found",
        "data": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "TASK_NOT_FOUND",
                "domain": "a2a-protocol.org",
                "metadata": {},
            }
        ],
    }
    assert v03["error"] == {"code": -32001, "message": "Task not found"}


def test_the_sdk_client_surfaces_our_codes_from_error_info(tmp_path: Path, start_gate, write_config) -> None:
    """A facilitator outage on a v1.0 paid send: the SDK's InternalError carries
    `verify_unavailable` and `retryable` from the ErrorInfo metadata."""
    from devnet.payer import encode_header, sign_payment
    from tests.support.paid import Payer, decode_header, paid_config, send_body

    port = free_port()
    down = f"http://127.0.0.1:{free_port()}"
    paid = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", down)), port=port)
    required = httpx.post(f"{paid.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"]
    token = encode_header(sign_payment(decode_header(required), Payer().key))

    error = run(sdk.expect_a2a_error(sdk.send_text(f"{paid.url}/a2a/paid", "x", headers={"PAYMENT-SIGNATURE": token})))

    assert sdk.jsonrpc_error_code(error) == -32603
    assert error.data == {"code": "verify_unavailable", "retryable": "true"}


def test_an_envelope_error_of_a_v10_client_is_rendered_for_it(gate: Gate) -> None:
    response = post(gate.agent("echo"), b"{not json", {**gate.headers, **V1})

    assert response.json()["error"]["data"][0]["reason"] == "JSON_PARSE"


# --- card caching -----------------------------------------------------------------------


def test_card_has_a_strong_etag_and_answers_304(gate: Gate) -> None:
    for url in (f"{gate.agent('echo')}/.well-known/agent-card.json", f"{gate.process.url}/.well-known/agent-card.json"):
        first = httpx.get(url)
        tag = first.headers["etag"]
        assert tag.startswith('"') and tag.endswith('"')
        assert tag == f'"{hashlib.sha256(first.content).hexdigest()[:32]}"'
        assert "max-age=" in first.headers["cache-control"]

        again = httpx.get(url, headers={"If-None-Match": tag})
        listed = httpx.get(url, headers={"If-None-Match": f'"other", W/{tag}'})
        stale = httpx.get(url, headers={"If-None-Match": '"stale"'})

        assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", tag)
        assert "max-age=" in again.headers["cache-control"]
        assert listed.status_code == 304
        assert stale.status_code == 200 and stale.content == first.content


def test_card_last_modified_and_if_modified_since(gate: Gate) -> None:
    url = f"{gate.agent('echo')}/.well-known/agent-card.json"
    first = httpx.get(url)
    stamp = first.headers["last-modified"]

    assert httpx.get(url, headers={"If-Modified-Since": stamp}).status_code == 304
    assert httpx.get(url, headers={"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"}).status_code == 200
    assert httpx.get(url, headers={"If-Modified-Since": "not a date"}).status_code == 200
    # If-None-Match decides when both are sent
    assert httpx.get(url, headers={"If-None-Match": '"stale"', "If-Modified-Since": stamp}).status_code == 200


def test_cards_of_different_agents_have_different_etags(gate: Gate) -> None:
    tags = {httpx.get(f"{gate.agent(name)}/.well-known/agent-card.json").headers["etag"] for name in ("echo", "slow")}
    assert len(tags) == 2


# --- required fields, paths, push -------------------------------------------------------


@pytest.mark.parametrize(
    "method,message,headers",
    [
        ("message/send", {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}, {}),
        ("message/stream", {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}, {}),
        ("SendMessage", {"role": "ROLE_USER", "parts": [{"text": "hi"}]}, V1),
    ],
)
def test_a_message_without_message_id_is_invalid_params(gate: Gate, method: str, message: dict, headers: dict) -> None:
    doc = rpc(gate.agent("echo"), method, {"message": message}, {**gate.headers, **headers})

    assert doc["error"]["code"] == -32602 and "messageId" in doc["error"]["message"]


def test_the_agent_url_with_a_trailing_slash_is_served_not_redirected(gate: Gate) -> None:
    response = httpx.post(
        gate.agent("echo") + "/",
        json=rpc_body("message/send", {"message": v03_message("slash")}),
        headers=gate.headers,
        follow_redirects=False,
    )

    assert response.status_code == 200
    assert artifact_texts(response.json()["result"]) == ["slash"]


@pytest.mark.parametrize(
    "method,headers",
    [
        ("tasks/pushNotificationConfig/set", {}),
        ("tasks/pushNotificationConfig/get", {}),
        ("tasks/pushNotificationConfig/list", {}),
        ("tasks/pushNotificationConfig/delete", {}),
        ("CreateTaskPushNotificationConfig", V1),
        ("GetTaskPushNotificationConfig", V1),
        ("ListTaskPushNotificationConfigs", V1),
        ("DeleteTaskPushNotificationConfig", V1),
    ],
)
def test_every_push_method_is_push_not_supported(gate: Gate, method: str, headers: dict) -> None:
    card = httpx.get(f"{gate.agent('echo')}/.well-known/agent-card.json").json()
    assert card["capabilities"]["pushNotifications"] is False

    doc = rpc(gate.agent("echo"), method, {"id": "x", "taskId": "x"}, {**gate.headers, **headers})

    assert doc["error"]["code"] == -32003


def test_no_extended_card(gate: Gate) -> None:
    assert rpc(gate.agent("echo"), "GetExtendedAgentCard", {}, {**gate.headers, **V1})["error"]["code"] == -32004


# --- the anonymous path: bound to the payer ---------------------------------------------


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate, for the anonymous tests; each pays with payers of its own (PaidView)."""
    return shared_paid


def resubscribe_body(task_id: str) -> dict[str, Any]:
    return rpc_body("tasks/resubscribe", {"id": task_id}, call_id=9)


def test_anonymous_subscribe_is_bound_to_the_payer(paid) -> None:
    payer, stranger = Payer(), Payer()
    paying = payer.header_for(paid.gate.url, "paid-slow")
    task = paid.post("paid-slow", send_body("sleep 1.5", blocking=False), paying).json()["result"]

    refusals = [
        paid.post("paid-slow", resubscribe_body(task["id"])),
        paid.post("paid-slow", resubscribe_body(task["id"]), {"PAYMENT-SIGNATURE": "bm90IGEgdG9rZW4="}),
        paid.post("paid-slow", resubscribe_body(task["id"]), stranger.header_for(paid.gate.url, "paid-slow")),
        paid.post("paid-slow", resubscribe_body("00000000-0000-4000-8000-000000000000"), paying),
    ]
    stream = paid.post("paid-slow", resubscribe_body(task["id"]), paying)

    expected = b'data: {"jsonrpc":"2.0","id":9,"error":{"code":-32001,"message":"Task not found"}}\n\n'
    assert [(r.status_code, r.content) for r in refusals] == [(200, expected)] * 4
    events = [e["result"] for e in sse_events(stream.text)]
    assert events[0]["kind"] == "task" and events[-1]["final"] is True
    assert events[-1]["status"]["state"] == "completed"
    assert events[-1]["metadata"]["x402.payment.status"] == "payment-completed"


def test_anonymous_list_shows_a_payer_only_their_own_tasks(paid) -> None:
    payer, stranger = Payer(), Payer()
    first = payer.header_for(paid.gate.url)
    mine = [
        paid.post("paid", send_body(f"mine {i}"), first if i == 0 else payer.header_for(paid.gate.url)).json()[
            "result"
        ]["id"]
        for i in range(2)
    ]
    theirs = paid.post("paid", send_body("theirs"), stranger.header_for(paid.gate.url)).json()["result"]["id"]
    body = rpc_body("ListTasks", {}, call_id=4)

    anonymous = paid.post("paid", body, V1).json()["result"]
    as_payer = paid.post("paid", body, {**V1, **first}).json()["result"]  # the token that paid
    fresh = paid.post("paid", body, {**V1, **payer.header_for(paid.gate.url)}).json()["result"]
    as_stranger = paid.post("paid", body, {**V1, **stranger.header_for(paid.gate.url)}).json()["result"]

    assert anonymous == {"tasks": [], "nextPageToken": "", "pageSize": 50, "totalSize": 0}
    assert [t["id"] for t in as_payer["tasks"]] == mine[::-1] == [t["id"] for t in fresh["tasks"]]
    assert [t["id"] for t in as_stranger["tasks"]] == [theirs]
    assert len(paid.ledger()["settlements"]) == 3  # listing charges nothing


# --- upstream agents: partial work kept, cancel forwarded ------------------------------


@dataclass
class FakeUpstream:
    """A raw A2A upstream: `/agree`, `/refuse` and `/gone` run a task until asked to cancel
    (agreeing, refusing then completing, or having forgotten it); `/paused` asks for input
    with partial work attached. It keeps every method it was sent."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    credentials: list[str | None] = field(default_factory=list)  # each request's Authorization

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> JSONResponse:
            mode, doc = request.path_params["mode"], await request.json()
            self.calls.append((mode, doc["method"], doc.get("params") or {}))
            self.credentials.append(request.headers.get("authorization"))
            return JSONResponse({"jsonrpc": "2.0", "id": doc["id"], **self.answer(mode, doc["method"])})

        return Starlette(routes=[Route("/{mode}", endpoint, methods=["POST"])])

    def answer(self, mode: str, method: str) -> dict[str, Any]:
        refused = any(m == mode and c == "tasks/cancel" for m, c, _ in self.calls)
        if mode == "paused" and method == "message/send":
            return {
                "result": task(
                    "input-required",
                    artifacts=[{"artifactId": "p", "parts": [{"kind": "text", "text": "draft so far"}]}],
                    message="Shall I go on?",
                )
            }
        if method == "tasks/cancel":
            if mode == "gone":
                return {"error": {"code": -32001, "message": "Task not found"}}
            if mode == "refuse":
                return {"error": {"code": -32002, "message": "Task cannot be canceled"}}
            return {"result": task("canceled")}
        if mode == "refuse" and refused and method == "tasks/get":
            return {
                "result": task(
                    "completed", artifacts=[{"artifactId": "a", "parts": [{"kind": "text", "text": "finished anyway"}]}]
                )
            }
        return {"result": task("working")}


def task(state: str, artifacts: list | None = None, message: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "task", "id": "up-task", "contextId": "up-ctx", "status": {"state": state}}
    if message:
        doc["status"]["message"] = {
            "kind": "message",
            "role": "agent",
            "messageId": "s",
            "parts": [{"kind": "text", "text": message}],
        }
    if artifacts:
        doc["artifacts"] = artifacts
    return doc


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gate, FakeUpstream]]:
    """One gate and upstream for the module: each test drives an upstream mode no other test uses."""
    folder = tmp_path_factory.mktemp("fronted")
    upstream = FakeUpstream()
    with serve_app(upstream.app()) as base:
        tables = "".join(
            f'\n[agents.up-{mode}]\nbackend = "upstream"\nurl = "{base}/{mode}"\npoll_interval_seconds = 0.1\n'
            for mode in ("agree", "refuse", "gone", "paused")
        )
        config = folder / "gate.toml"
        config.write_text(tables + keys_table(("conformance", KEY)))
        with GateProcess(config, folder / "gate.log") as gate:
            yield Gate(gate, bearer(KEY)), upstream


def start_upstream_task(gate: Gate, agent: str, upstream: FakeUpstream) -> dict[str, Any]:
    params = {"message": v03_message("work"), "configuration": {"blocking": False}}
    task = rpc(gate.agent(agent), "message/send", params, gate.headers)["result"]
    poll(
        lambda: {"polled": any(m == agent[3:] and c == "tasks/get" for m, c, _ in upstream.calls)},
        lambda d: d["polled"],
    )
    return task


@pytest.mark.parametrize("mode", ["agree", "gone"])
def test_cancel_is_forwarded_and_agreed(fronted: tuple[Gate, FakeUpstream], mode: str) -> None:
    gate, upstream = fronted
    task = start_upstream_task(gate, f"up-{mode}", upstream)

    canceled = rpc(gate.agent(f"up-{mode}"), "tasks/cancel", {"id": task["id"]}, gate.headers)["result"]

    assert canceled["status"]["state"] == "canceled"
    assert (mode, "tasks/cancel", {"id": "up-task"}) in upstream.calls
    assert upstream.credentials and set(upstream.credentials) == {None}  # the caller's key never travels


def test_a_cancel_the_upstream_refuses_leaves_our_task_running(fronted: tuple[Gate, FakeUpstream]) -> None:
    gate, upstream = fronted
    task = start_upstream_task(gate, "up-refuse", upstream)

    doc = rpc(gate.agent("up-refuse"), "tasks/cancel", {"id": task["id"]}, gate.headers)
    final = poll(
        lambda: rpc(gate.agent("up-refuse"), "tasks/get", {"id": task["id"]}, gate.headers)["result"],
        lambda t: t["status"]["state"] == "completed",
    )

    assert doc["error"]["code"] == -32002
    assert artifact_texts(final) == ["finished anyway"]


def test_an_interrupted_upstream_keeps_its_partial_work_and_cancel_reaches_it(
    fronted: tuple[Gate, FakeUpstream],
) -> None:
    gate, upstream = fronted

    paused = rpc(gate.agent("up-paused"), "message/send", {"message": v03_message("draft")}, gate.headers)["result"]
    canceled = rpc(gate.agent("up-paused"), "tasks/cancel", {"id": paused["id"]}, gate.headers)["result"]

    assert paused["status"]["state"] == "input-required"
    assert artifact_texts(paused) == ["draft so far"]
    assert canceled["status"]["state"] == "canceled"
    assert ("paused", "tasks/cancel", {"id": "up-task"}) in upstream.calls
