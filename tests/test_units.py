"""Fast unit tests: dialect conversions, configuration checks, the JSON-RPC envelope,
principals, and `a2a-gate check-config` on broken files."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.config import parse_config
from server import dialects
from server.config import ApiKey, ConfigError
from server.database import Database
from server.dialects import V03, V10, InvalidShape
from server.engines import open_database
from server.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
    parse_call,
)
from server.principals import (
    Principal,
    Principals,
    bearer,
    create_key,
    create_tables,
    digest,
    list_keys,
    revoke_key,
)
from tests.support.gate_helpers import cli, gate_recursion_limit

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


# --- dialects -----------------------------------------------------------------------


@pytest.mark.parametrize("state", dialects.STATES_V03)
def test_every_state_round_trips_through_v10(state: str) -> None:
    v10 = dialects.status_out_v10({"state": state})["state"]

    assert v10 == "TASK_STATE_" + state.upper().replace("-", "_")
    assert dialects.state_from_any(v10) == state
    assert dialects.state_from_any(state) == state


@pytest.mark.parametrize("value", ["TASK_STATE_UNSPECIFIED", "done", "COMPLETED", "", None, 3, ["completed"]])
def test_unknown_states_are_none(value: Any) -> None:
    assert dialects.state_from_any(value) is None


def test_an_unknown_internal_state_goes_out_as_unspecified() -> None:
    assert dialects.status_out_v10({"state": "bogus"}) == {"state": "TASK_STATE_UNSPECIFIED"}


@pytest.mark.parametrize("role", ["user", "agent"])
def test_roles_round_trip(role: str) -> None:
    message = {"kind": "message", "role": role, "messageId": "m", "parts": [{"kind": "text", "text": "hi"}]}

    out = dialects.message_out_v10(message)

    assert out["role"] == f"ROLE_{role.upper()}"
    assert "kind" not in out and out["parts"] == [{"text": "hi"}]
    back = dialects.message_from_any(out)
    assert back == message


V03_PARTS = [
    {"kind": "text", "text": "hello"},
    {"kind": "data", "data": {"a": [1, 2, {"b": None}]}},
    {"kind": "data", "data": 0},
    {"kind": "file", "file": {"uri": "https://x.example/f.pdf", "mimeType": "application/pdf", "name": "f.pdf"}},
    {"kind": "file", "file": {"bytes": "aGVsbG8=", "mimeType": "text/plain"}},
    {"kind": "text", "text": "with metadata", "metadata": {"k": "v"}},
]
V10_PARTS = [
    {"text": "hello"},
    {"data": {"a": [1, 2, {"b": None}]}},
    {"data": 0},
    {"url": "https://x.example/f.pdf", "mediaType": "application/pdf", "filename": "f.pdf"},
    {"raw": "aGVsbG8=", "mediaType": "text/plain"},
    {"text": "with metadata", "metadata": {"k": "v"}},
]


@pytest.mark.parametrize("v03,v10", list(zip(V03_PARTS, V10_PARTS, strict=True)))
def test_parts_convert_both_ways(v03: dict[str, Any], v10: dict[str, Any]) -> None:
    assert dialects.part_out_v10(v03) == v10
    assert dialects.part_in_v10(v10) == v03
    assert dialects.part_in_v03(v03) == v03


@pytest.mark.parametrize(
    "part",
    [
        None,
        "text",
        {},
        {"kind": "text"},
        {"kind": "text", "text": ""},
        {"kind": "text", "text": 5},
        {"kind": "data"},
        {"kind": "data", "data": None},
        {"kind": "file", "file": {}},
        {"kind": "file", "file": {"uri": ""}},
        {"kind": "file", "file": "https://x"},
        {"kind": "image", "image": "x"},
    ],
)
def test_unusable_v03_parts_are_dropped(part: Any) -> None:
    assert dialects.part_in_v03(part) is None


@pytest.mark.parametrize("part", [None, {}, {"text": ""}, {"data": None}, {"url": ""}, {"raw": 5}, {"image": "x"}])
def test_unusable_v10_parts_are_dropped(part: Any) -> None:
    assert dialects.part_in_v10(part) is None


def test_a_v03_text_part_may_omit_kind() -> None:
    assert dialects.part_in_v03({"text": "hi"}) == {"kind": "text", "text": "hi"}


def test_message_in_reads_both_dialects_to_the_same_canonical_message() -> None:
    v03 = {
        "kind": "message",
        "role": "user",
        "messageId": "m1",
        "contextId": "c1",
        "parts": V03_PARTS,
        "metadata": {"x": 1},
        "extensions": ["urn:e"],
        "referenceTaskIds": ["t0"],
        "unknown": True,
    }
    v10 = {
        "role": "ROLE_USER",
        "messageId": "m1",
        "contextId": "c1",
        "parts": V10_PARTS,
        "metadata": {"x": 1},
        "extensions": ["urn:e"],
        "referenceTaskIds": ["t0"],
        "unknown": True,
    }

    canonical = dialects.message_in(v03, V03)

    assert canonical == dialects.message_in(v10, V10)
    assert canonical["kind"] == "message" and canonical["role"] == "user"
    assert canonical["parts"] == V03_PARTS
    assert "unknown" not in canonical


def test_message_in_keeps_usable_parts_and_refuses_none() -> None:
    message = {
        "messageId": "m",
        "role": "user",
        "parts": [{"kind": "text", "text": ""}, {"kind": "text", "text": "kept"}, 7],
    }

    assert dialects.message_in(message, V03)["parts"] == [{"kind": "text", "text": "kept"}]
    with pytest.raises(InvalidShape, match="no usable parts"):
        dialects.message_in({"messageId": "m", "parts": [{"kind": "text", "text": ""}]}, V03)


@pytest.mark.parametrize(
    "raw,match",
    [
        (None, "params.message must be an object"),
        ({"parts": {}}, "parts must be a list"),
        ({"parts": [{"text": "x"}], "messageId": "m", "taskId": ""}, "taskId must be a non-empty string"),
        ({"parts": [{"text": "x"}], "messageId": 5}, "messageId must be a non-empty string"),
        ({"parts": [{"text": "x"}]}, "messageId is required"),
        ({"parts": [{"text": "x"}], "messageId": "m", "contextId": "c" * 257}, "contextId must be a non-empty string"),
        ({"parts": [{"text": "x"}], "messageId": "m", "metadata": []}, "metadata must be an object"),
        ({"parts": [{"text": "x"}], "messageId": "m"}, "role is required"),
        ({"parts": [{"text": "x"}], "messageId": "m", "role": "ROLE_USER"}, "role is required"),
    ],
)
def test_message_in_errors_name_the_field(raw: Any, match: str) -> None:
    with pytest.raises(InvalidShape, match=match):
        dialects.message_in(raw, V03)


def canonical_task() -> dict[str, Any]:
    user = {
        "kind": "message",
        "role": "user",
        "messageId": "m1",
        "taskId": "t",
        "contextId": "c",
        "parts": [{"kind": "text", "text": "q"}],
    }
    agent = {
        "kind": "message",
        "role": "agent",
        "messageId": "m2",
        "taskId": "t",
        "contextId": "c",
        "parts": [{"kind": "text", "text": "a"}],
        "metadata": {"m": 1},
    }
    return {
        "kind": "task",
        "id": "t",
        "contextId": "c",
        "status": {"state": "input-required", "timestamp": "2026-01-01T00:00:00.000Z", "message": agent},
        "history": [user, agent],
        "artifacts": [{"artifactId": "a1", "name": "r", "parts": V03_PARTS}],
        "metadata": {"k": "v"},
    }


def test_task_out_is_the_canonical_task_for_v03_and_the_v10_shape_for_v10() -> None:
    task = canonical_task()

    assert dialects.task_out(task, V03) is task
    out = dialects.task_out(task, V10)
    assert set(out) == {"id", "contextId", "status", "artifacts", "history", "metadata"}
    assert out["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert out["status"]["message"]["role"] == "ROLE_AGENT"
    assert out["status"]["message"]["metadata"] == {"m": 1}
    assert out["artifacts"][0]["parts"] == V10_PARTS
    assert [m["role"] for m in out["history"]] == ["ROLE_USER", "ROLE_AGENT"]
    assert "kind" not in json.dumps(out)


def test_empty_history_and_artifacts_are_left_out_of_v10() -> None:
    task = {**canonical_task(), "history": [], "artifacts": [], "metadata": {}}

    assert set(dialects.task_out(task, V10)) == {"id", "contextId", "status"}


def test_send_results_are_wrapped_by_kind_in_v10() -> None:
    task = canonical_task()
    message = task["history"][0]

    assert dialects.send_result(task, V03) is task
    assert set(dialects.send_result(task, V10)) == {"task"}
    assert dialects.send_result(message, V10) == {"message": dialects.message_out_v10(message)}


def test_stream_events_in_v10() -> None:
    status = {"kind": "status-update", "taskId": "t", "contextId": "c", "status": {"state": "working"}, "final": False}
    artifact = {
        "kind": "artifact-update",
        "taskId": "t",
        "contextId": "c",
        "lastChunk": True,
        "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "x"}]},
    }

    assert dialects.event_out(status, V03) is status
    assert dialects.event_out(status, V10) == {
        "statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}
    }
    assert dialects.event_out(artifact, V10) == {
        "artifactUpdate": {
            "taskId": "t",
            "contextId": "c",
            "lastChunk": True,
            "artifact": {"artifactId": "a", "parts": [{"text": "x"}]},
        }
    }
    assert set(dialects.event_out(canonical_task(), V10)) == {"task"}


@pytest.mark.parametrize("value,expected", [(None, None), (0, 0), (3, 3), (10**30, 10**30)])
def test_history_length(value: Any, expected: int | None) -> None:
    assert dialects.history_length(value) == expected


@pytest.mark.parametrize("value", [-1, True, False, 1.0, "2", [], {}])
def test_history_length_refuses_what_is_not_a_count(value: Any) -> None:
    with pytest.raises(InvalidShape):
        dialects.history_length(value)


JSON_DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=10,
)
METADATA = st.dictionaries(st.text(min_size=1, max_size=5), JSON_DATA, min_size=1, max_size=2)
CANONICAL_PART = st.one_of(
    st.builds(lambda t: {"kind": "text", "text": t}, st.text(min_size=1)),
    st.builds(lambda d: {"kind": "data", "data": d}, JSON_DATA.filter(lambda d: d is not None)),
    st.builds(
        lambda u, m, n: {"kind": "file", "file": {"uri": u, **m, **n}},
        st.text(min_size=1),
        st.just({}) | st.builds(lambda v: {"mimeType": v}, st.text()),
        st.just({}) | st.builds(lambda v: {"name": v}, st.text()),
    ),
    st.builds(
        lambda b, m: {"kind": "file", "file": {"bytes": b, **m}},
        st.text(min_size=1),
        st.just({}) | st.builds(lambda v: {"mimeType": v}, st.text()),
    ),
).flatmap(lambda part: st.just(part) | METADATA.map(lambda meta: {**part, "metadata": meta}))


@settings(max_examples=300, deadline=None)
@given(st.lists(CANONICAL_PART, min_size=1, max_size=4), st.sampled_from(["user", "agent"]))
def test_any_canonical_message_survives_a_v10_round_trip(parts: list[dict[str, Any]], role: str) -> None:
    message = {"kind": "message", "role": role, "messageId": "m", "parts": parts}

    v10 = json.loads(json.dumps(dialects.message_out_v10(message)))  # over the wire

    assert dialects.message_from_any(v10) == message
    if role == "user":
        assert dialects.message_in(v10, V10) == message


# --- configuration --------------------------------------------------------------------


PRICE = {"network": "eip155:84532", "asset": USDC, "amount": "1000", "pay_to": ADDRESS}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, base_dir=Path("/tmp"), source="gate.toml")
    assert all(p.startswith("gate.toml: ") for p in caught.value.problems)
    return [p.removeprefix("gate.toml: ") for p in caught.value.problems]


def priced(**price: Any) -> dict[str, Any]:
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**PRICE, **price}}}}


def test_a_good_configuration_reads() -> None:
    settings_ = parse_config(
        {**priced(), "public_url": "https://gate.example/", "database": "x.db"}, base_dir=Path("/srv")
    )

    assert settings_.public_url == "https://gate.example"
    assert settings_.database == "/srv/x.db"
    price = settings_.anonymous.price("paid")
    assert price is not None and price.amount == "1000" and price.extra == {"name": "USDC", "version": "2"}
    assert settings_.warnings == ()


@pytest.mark.parametrize("amount", ["-5", "1.5", "0", "abc", "", 0, -1, 1.5, True, "1" * 79, "1e3", " 100"])
def test_a_bad_amount_is_reported_with_its_path(amount: Any) -> None:
    [problem] = problems(priced(amount=amount))

    assert problem.startswith("agents.paid.price.amount: must be a positive whole number")


def test_an_integer_amount_is_accepted() -> None:
    price = parse_config(priced(amount=2500), base_dir=Path("/tmp")).anonymous.price("paid")
    assert price is not None and price.amount == "2500"


@pytest.mark.parametrize("field", ["pay_to", "asset"])
@pytest.mark.parametrize("address", ["0x123", "209693Bc6afc0C5328bA36FaF03C514EF312287C", ADDRESS + "0", 5, ""])
def test_a_bad_address_is_reported_with_its_path(field: str, address: Any) -> None:
    found = problems(priced(**{field: address}))

    assert any(p.startswith(f"agents.paid.price.{field}: must be") for p in found), found


def test_bad_payer_allowlist_entries_are_reported_by_index() -> None:
    raw = priced()
    raw["agents"]["paid"]["allowed_payers"] = [ADDRESS, "0xnope", 7]

    assert problems(raw) == [
        "agents.paid.allowed_payers[1]: must be a 0x address (40 hex digits)",
        "agents.paid.allowed_payers[2]: must be a 0x address (40 hex digits)",
    ]


@pytest.mark.parametrize(
    "raw,path",
    [
        ({"colour": "blue"}, "colour"),
        ({"limits": {"per_second": 1}}, "limits.per_second"),
        ({"facilitator": {"token": "x"}}, "facilitator.token"),
        ({"agents": {"echo": {"prize": 1}}}, "agents.echo.prize"),
        ({"agents": {"echo": {"skills": [{"id": "s", "level": 3}]}}}, "agents.echo.skills[0].level"),
        ({"agents": {"echo": {}}, "keys": [{"sha256": "a" * 64, "agents": ["echo"], "secret": "x"}]}, "keys[0].secret"),
        ({**priced(), "agents": {"paid": {"price": {**PRICE, "currency": "USD"}}}}, "agents.paid.price.currency"),
    ],
)
def test_unknown_keys_are_reported_with_their_path(raw: dict[str, Any], path: str) -> None:
    assert f"{path}: unknown key" in problems(raw)


@pytest.mark.parametrize("url", ["ftp://agent.example/", "agent.example", "file:///etc/passwd", "http://"])
def test_an_upstream_url_must_be_http(url: str) -> None:
    [problem] = problems({"agents": {"up": {"backend": "upstream", "url": url}}})

    assert problem.startswith("agents.up.url: must be an http(s) URL")


def test_an_upstream_needs_a_url_and_a_python_agent_a_callable() -> None:
    found = problems({"agents": {"up": {"backend": "upstream"}, "py": {"backend": "python", "callable": "nope"}}})

    assert found == [
        "agents.up.url: required for an upstream agent",
        "agents.py.callable: required for a python agent, as 'package.module:function'",
    ]


def test_a_priced_agent_without_a_facilitator_is_a_warning_naming_the_key() -> None:
    settings_ = parse_config({"agents": {"paid": {"price": PRICE}}}, base_dir=Path("/tmp"), source="gate.toml")

    [warning] = settings_.warnings
    assert warning.startswith("gate.toml: facilitator.url: missing")


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "colour": "x",
            "max_body_bytes": 0,
            "limits": {"per_ip_per_minute": "many"},
            "facilitator": {"url": "ftp://f"},
            "agents": {"paid": {"price": {**PRICE, "amount": "1.5", "pay_to": "x"}}},
            "keys": [{"sha256": "ABC"}],
        }
    )

    assert sorted(p.split(":")[0] for p in found) == sorted(
        [
            "colour",
            "limits.per_ip_per_minute",
            "keys[0].sha256",
            "facilitator.url",
            "agents.paid.price.pay_to",
            "agents.paid.price.amount",
            "max_body_bytes",
        ]
    )


@pytest.mark.parametrize(
    "raw,path",
    [
        ({"task_deadline_seconds": float("nan")}, "task_deadline_seconds"),
        ({"agents": {"a": {"timeout_seconds": float("nan")}}}, "agents.a.timeout_seconds"),
        ({"agents": {"a": {"deadline_seconds": float("nan")}}}, "agents.a.deadline_seconds"),
    ],
)
def test_nan_is_not_a_positive_number(raw: dict[str, Any], path: str) -> None:
    """TOML has `nan`; `nan <= 0` is False, so it passed the "greater than 0" check (BUG)."""
    assert any(p.startswith(f"{path}: ") for p in problems(raw))


@pytest.mark.parametrize(
    "raw,path",
    [
        (priced(amount="²"), "agents.paid.price.amount"),  # str.isdigit() is true, int() refuses it
        ({"public_url": "http://[::1"}, "public_url"),  # urlsplit raises ValueError
        ({"agents": {"up": {"backend": "upstream", "url": "http://[nope"}}}, "agents.up.url"),
        (
            {"agents": {"echo": {}}, "keys": [{"sha256": "a" * 64, "agents": [["echo"]]}]},
            "keys[0].agents",
        ),  # unhashable
    ],
)
def test_odd_values_are_problems_not_crashes(raw: dict[str, Any], path: str) -> None:
    """Each of these raised ValueError / TypeError out of parse_config (BUG): a traceback
    from `a2a-gate check-config` instead of one `error:` line."""
    assert any(p.startswith(f"{path}: ") for p in problems(raw))


# --- the JSON-RPC envelope --------------------------------------------------------------


def rpc_error(body: bytes | str) -> RpcError:
    with gate_recursion_limit(), pytest.raises(RpcError) as caught:
        parse_call(body.encode() if isinstance(body, str) else body)
    return caught.value


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"nul", b'{"a": NaN}', b'{"a": -Infinity}', b"\xff", b"[" * 100_000, b'{"jsonrpc": "2.0"} trailing'],
)
def test_parse_errors(body: bytes) -> None:
    error = rpc_error(body)

    assert error.code == PARSE_ERROR and error.call_id is None


@pytest.mark.parametrize(
    "body,call_id",
    [
        ("[]", None),
        ('[{"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}]', None),
        ("1", None),
        ('"x"', None),
        ("null", None),
        ('{"id": 1.5, "jsonrpc": "2.0", "method": "tasks/get"}', None),
        ('{"id": true, "jsonrpc": "2.0", "method": "tasks/get"}', None),
        ('{"id": [1], "jsonrpc": "2.0", "method": "tasks/get"}', None),
        ('{"id": 3, "jsonrpc": "1.0", "method": "tasks/get"}', 3),
        ('{"id": 3, "jsonrpc": 2.0, "method": "tasks/get"}', 3),
        ('{"id": "a", "method": "tasks/get"}', "a"),
        ('{"id": "a", "jsonrpc": "2.0"}', "a"),
        ('{"id": "a", "jsonrpc": "2.0", "method": ["tasks/get"]}', "a"),
    ],
)
def test_invalid_requests(body: str, call_id: Any) -> None:
    error = rpc_error(body)

    assert error.code == INVALID_REQUEST
    assert error.call_id == call_id


def test_a_batch_is_named_as_such() -> None:
    assert "Batch" in rpc_error("[]").message


def test_unknown_method_keeps_the_id() -> None:
    error = rpc_error('{"jsonrpc": "2.0", "id": 9, "method": "tasks/teleport"}')

    assert error.code == METHOD_NOT_FOUND and error.call_id == 9


@pytest.mark.parametrize("params", ["[]", '"x"', "1", "null"])
def test_params_must_be_an_object(params: str) -> None:
    error = rpc_error('{"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": PARAMS}'.replace("PARAMS", params))

    assert error.code == INVALID_PARAMS and error.call_id == 9


@pytest.mark.parametrize(
    "method,dialect,operation",
    [
        ("message/send", V03, "send"),
        ("message/stream", V03, "stream"),
        ("tasks/get", V03, "get"),
        ("tasks/cancel", V03, "cancel"),
        ("tasks/pushNotificationConfig/set", V03, "push"),
        ("SendMessage", V10, "send"),
        ("SendStreamingMessage", V10, "stream"),
        ("GetTask", V10, "get"),
        ("CancelTask", V10, "cancel"),
        ("ListTasks", V10, "list"),
        ("CreateTaskPushNotificationConfig", V10, "push"),
    ],
)
def test_methods_map_to_a_dialect_and_an_operation(method: str, dialect: str, operation: str) -> None:
    call = parse_call(json.dumps({"jsonrpc": "2.0", "id": "x", "method": method, "params": {"a": 1}, "b": 2}).encode())

    assert (call.id, call.method, call.dialect, call.operation, call.params) == (
        "x",
        method,
        dialect,
        operation,
        {"a": 1},
    )


def test_missing_params_and_null_id_are_fine() -> None:
    call = parse_call(b'{"jsonrpc": "2.0", "id": null, "method": "GetTask"}')

    assert call.id is None and call.params == {}


# --- principals -------------------------------------------------------------------------


def test_digest_is_sha256_hex() -> None:
    assert digest("a2g_abc") == hashlib.sha256(b"a2g_abc").hexdigest()


@pytest.mark.parametrize(
    "header,expected",
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic abc", None),
        ("Token abc", None),
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        ("Bearer a b", "a b"),
    ],
)
def test_bearer(header: str | None, expected: str | None) -> None:
    assert bearer(header) == expected


async def keys_database() -> Database:
    db = open_database(":memory:")
    await db.open()
    await create_tables(db)
    return db


def test_identify_configured_and_stored_keys() -> None:
    async def run() -> None:
        db = await keys_database()
        configured = ApiKey(name="ops", sha256=digest("a2g_ops"), agents=("echo",))
        gone = ApiKey(name="gone", sha256=digest("a2g_gone"), agents=("*",), revoked=True)
        key, stored_digest = await create_key(db, "svc", ["echo", "slow"])
        principals = Principals(db, (configured, gone), cache_seconds=0.05)

        assert await principals.identify(None) is None
        assert await principals.identify("Bearer a2g_unknown") is None
        assert await principals.identify(f"Basic {key}") is None
        assert await principals.identify("Bearer a2g_ops") == Principal("ops", ("echo",))
        ops = await principals.identify("Bearer a2g_ops")
        assert ops is not None and ops.may_use("echo") and not ops.may_use("slow") and ops.owner == "key:ops"
        svc = await principals.identify(f"Bearer {key}")
        assert svc == Principal("svc", ("echo", "slow")) and stored_digest == digest(key)
        old = await principals.identify("Bearer a2g_gone")
        assert old is not None and old.revoked and not old.may_use("echo")

        assert await revoke_key(db, "svc") == 1
        assert await revoke_key(db, "nobody") == 0
        await asyncio.sleep(0.1)  # past the cache
        refused = await principals.identify(f"Bearer {key}")
        assert refused is not None and refused.revoked and not refused.may_use("echo")

    asyncio.run(run())


def test_wildcard_keys_may_use_any_agent() -> None:
    assert Principal("root", ("*",)).may_use("anything")
    assert not Principal("root", ("*",), revoked=True).may_use("anything")
    assert not Principal("none", ()).may_use("echo")


def test_created_keys_are_stored_only_as_digests() -> None:
    async def run() -> None:
        db = await keys_database()
        key, _ = await create_key(db, "svc", ["*"])

        assert key.startswith("a2g_") and len(key) > 40
        rows = await db.fetch("SELECT * FROM api_keys")
        assert key not in json.dumps(rows)
        assert (await list_keys(db))[0]["sha256"] == digest(key)
        with pytest.raises(ValueError, match="exists already"):
            await create_key(db, "svc", ["*"])

    asyncio.run(run())


# --- the CLI on broken files ----------------------------------------------------------------


BROKEN = f"""
colour = "blue"
max_body_bytes = -1

[limits]
per_ip_per_minute = "many"

[facilitator]
url = "ftp://facilitator.example"

[agents.paid.price]
network = "base"
asset = "0x123"
amount = "1.5"
pay_to = "{ADDRESS}"

[agents.up]
backend = "upstream"
url = "ftp://agent.example"

[[keys]]
sha256 = "abc"
"""
BROKEN_PATHS = [
    "colour",
    "max_body_bytes",
    "limits.per_ip_per_minute",
    "facilitator.url",
    "agents.paid.price.network",
    "agents.paid.price.asset",
    "agents.paid.price.amount",
    "agents.up.url",
    "keys[0].sha256",
]


def test_check_config_prints_one_error_line_per_problem(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(BROKEN)

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith(f"error: {config}: ") for line in lines), lines
    assert sorted(line.split(": ")[2] for line in lines) == sorted(BROKEN_PATHS)


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, "no such file"),
        ("this is = = not toml", "not valid TOML"),
    ],
)
def test_check_config_on_unreadable_files(tmp_path: Path, text: str | None, expected: str) -> None:
    config = tmp_path / "gate.toml"
    if text is not None:
        config.write_text(text)

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and expected in line


def test_check_config_on_a_good_file(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[agents.echo]\n[agents.paid.price]\nnetwork = "eip155:84532"\n'
        f'asset = "{USDC}"\namount = "10"\npay_to = "{ADDRESS}"\n'
    )

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 0, done.stderr
    assert "OK (2 agents, 1 priced" in done.stdout
    assert done.stderr.startswith("warning: ") and "facilitator.url" in done.stderr


def test_check_config_never_shows_a_traceback_for_odd_values(tmp_path: Path) -> None:
    """`public_url = "http://[::1"` made urlsplit raise: exit 1 and a traceback (BUG)."""
    config = tmp_path / "gate.toml"
    config.write_text('public_url = "http://[::1"\n[agents.echo]\n')

    done = cli("check-config", str(config), check=False)

    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {config}: public_url: ")


def test_request_counts_name_each_answer_by_its_own_utc_day(monkeypatch) -> None:
    """The day's name is formatted once a day; an answer after midnight (or a clock set back)
    still counts on its own day."""
    import time as time_module

    from server import request_counts

    counts = request_counts.RequestCounts(db=None)  # type: ignore[arg-type]  # counting touches no store
    midnight = 1_796_083_200.0  # 2026-12-01T00:00:00Z
    for at, outcome in ((midnight - 1, "paid"), (midnight, "paid"), (midnight + 5, "limited"), (midnight - 2, "paid")):
        monkeypatch.setattr(time_module, "time", lambda at=at: at)
        counts.count("echo", outcome)
    counts.count("echo", "ok")  # not a counted outcome
    assert dict(counts.pending) == {
        ("2026-11-30", "echo", "paid"): 2,
        ("2026-12-01", "echo", "paid"): 1,
        ("2026-12-01", "echo", "limited"): 1,
    }
