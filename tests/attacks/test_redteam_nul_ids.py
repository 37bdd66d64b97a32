"""A NUL character in an id a client sends is an answer, never an internal error or a traceback.

PostgreSQL text cannot hold U+0000, so a query binding such an id fails in the driver
(`psycopg.DataError`). JSON carries it easily (`"\\u0000"`). Every one of these requests is
something any anonymous client can send, most of them without paying; each must get the answer
the contract names for an id that matches nothing (a 402 for an unpaid send, -32001 for a task
call, -32602 for a malformed parameter), and the log no traceback.

One `a2a-gate serve` on PostgreSQL, the development facilitator.
"""

from __future__ import annotations

from typing import Any

import pytest

from devnet.payer import encode_header
from tests.support import replicas as support
from tests.support.gate_helpers import bearer, create_key
from tests.support.paid import Payer, send_body
from tests.support.replicas import post

replicas = support.replicas

NUL_ID = "task\u0000id"
IN_BAND = {"X-A2A-Extensions": "https://github.com/google-a2a/a2a-x402/v0.1"}


def with_context(body: dict[str, Any]) -> dict[str, Any]:
    body["params"]["message"]["contextId"] = NUL_ID
    return body


def requests(headers: dict[str, str], fresh: dict[str, str]) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(what, body, headers): an unpaid send continuing a NUL task id, in-band too, task calls by a
    payer, and a paid send (a fresh token) naming a NUL context id."""
    v1 = {**headers, "A2A-Version": "1.0"}
    return [
        ("paid send, contextId", with_context(send_body("x")), fresh),
        ("unpaid send, taskId", send_body("x", task_id=NUL_ID), {}),
        ("unpaid in-band send, taskId", send_body("x", task_id=NUL_ID), IN_BAND),
        ("tasks/get", {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": NUL_ID}}, headers),
        ("tasks/cancel", {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": NUL_ID}}, headers),
        (
            "ListTasks contextId",
            {"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {"contextId": NUL_ID}},
            v1,
        ),
    ]


@pytest.fixture
def gate_and_payer(replicas) -> tuple[Any, dict[str, str]]:
    gate = replicas.start("a", lease=3, reconcile=3600)
    headers = {"PAYMENT-SIGNATURE": encode_header(Payer().token_for(gate.url, "paid"))}
    assert post(gate, "paid", send_body("paid for"), headers).status_code == 200  # the token now proves its payer
    return gate, headers


def test_a_nul_in_an_id_is_never_an_internal_error(gate_and_payer) -> None:
    gate, headers = gate_and_payer
    internal = {}
    fresh = {"PAYMENT-SIGNATURE": encode_header(Payer().token_for(gate.url, "paid"))}
    for what, body, sent in requests(headers, fresh):
        answer = post(gate, "paid", body, sent)
        if answer.status_code >= 500 or '"code":-32603' in answer.text:
            internal[what] = answer.text[:160]
    log = gate.log.read_text()
    tracebacks = [line[:200] for line in log.splitlines() if "Traceback" in line or "DataError" in line]
    assert (internal, tracebacks) == ({}, []), f"internal errors {internal}; log {tracebacks[:4]}"


def test_a_nul_in_an_id_on_the_free_path_is_never_an_internal_error(replicas) -> None:
    """The same ids from a principal (an API key allowed for the free `echo` agent)."""
    gate = replicas.start("a", lease=3, reconcile=3600)
    key = create_key(gate.config, "nul-probe", ["echo"])
    headers = bearer(key)
    bodies = {
        "send, taskId": send_body("x", task_id=NUL_ID),
        "send, contextId": with_context(send_body("x")),
        "resubscribe": {"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe", "params": {"id": NUL_ID}},
        "tasks/get": {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": NUL_ID}},
        "tasks/cancel": {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": NUL_ID}},
    }
    internal = {}
    for what, body in bodies.items():
        answer = post(gate, "echo", body, headers)
        if answer.status_code >= 500 or '"code":-32603' in answer.text:
            internal[what] = answer.text[:160]
    tracebacks = [
        line[:200] for line in gate.log.read_text().splitlines() if "Traceback" in line or "DataError" in line
    ]
    assert (internal, tracebacks) == ({}, []), f"internal errors {internal}; log {tracebacks[:4]}"
