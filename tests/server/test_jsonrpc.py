"""The JSON-RPC envelope (server/jsonrpc.py): parse errors, invalid requests, methods and their dialects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.dialects import V03, V10
from server.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RpcError,
    parse_call,
)
from tests.support.gate_helpers import gate_recursion_limit

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


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
