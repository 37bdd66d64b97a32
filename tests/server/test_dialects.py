"""Dialect conversions (server/dialects.py): v0.3 and v1.0 shapes read to one canonical form and written back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server import dialects
from server.dialects import V03, V10, InvalidShape

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
