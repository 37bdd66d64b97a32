"""The JSON-RPC 2.0 envelope: size limit, parsing, and error answers.

Errors travel with HTTP 200 (DESIGN section 2). The body size is checked while
reading, before any parsing, so an oversized body costs nothing but its bytes.
`A2A-Version` is read on every call (absent or empty means 0.3, A2A v1.0 section
3.6.2): an unsupported version, or a method of the other dialect, is -32009.
An error of a v1.0 call carries the spec's `data` list with a `google.rpc.ErrorInfo`
whose metadata holds our own codes; a v0.3 call keeps the plain object.
"""

from __future__ import annotations

import contextvars
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from server import json_text
from server.dialects import METHODS, V03, V10, proto_json_names
from server.headers import header

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
VERSION_NOT_SUPPORTED = -32009

MESSAGES = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid params",
    INTERNAL_ERROR: "Internal error",
    TASK_NOT_FOUND: "Task not found",
    TASK_NOT_CANCELABLE: "Task cannot be canceled",
    PUSH_NOT_SUPPORTED: "Push Notification is not supported",
    UNSUPPORTED_OPERATION: "This operation is not supported",
    VERSION_NOT_SUPPORTED: "Protocol version not supported",
}

# v1.0: ErrorInfo.reason, the A2A error type in UPPER_SNAKE_CASE (spec section 9.5)
REASONS = {
    PARSE_ERROR: "JSON_PARSE",
    INVALID_REQUEST: "INVALID_REQUEST",
    METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    INVALID_PARAMS: "INVALID_PARAMS",
    INTERNAL_ERROR: "INTERNAL_ERROR",
    TASK_NOT_FOUND: "TASK_NOT_FOUND",
    TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
    PUSH_NOT_SUPPORTED: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    UNSUPPORTED_OPERATION: "UNSUPPORTED_OPERATION",
    VERSION_NOT_SUPPORTED: "VERSION_NOT_SUPPORTED",
}
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "a2a-protocol.org"

VERSION_HEADER = "a2a-version"
SUPPORTED_VERSIONS = (V03, V10)

# The dialect an error is rendered in: set by `read_call` as soon as the request names
# it, so an error raised anywhere while answering a v1.0 call carries the ErrorInfo
# list. Each request runs in its own asyncio task, hence its own context.
answering_dialect: contextvars.ContextVar[str] = contextvars.ContextVar("answering_dialect", default=V03)
# v0.3 `tasks/resubscribe` answers its errors as one server-sent event, as the a2a-sdk does
# (a v0.3 SSE client refuses a JSON body on a stream); every other error is a JSON body
errors_as_event: contextvars.ContextVar[bool] = contextvars.ContextVar("errors_as_event", default=False)
# The id of the call being answered, set by `read_call` once it is parsed: an error raised anywhere
# after that is answered with it (`server.app.answered`); None before.
answering_call: contextvars.ContextVar[str | int | None] = contextvars.ContextVar("answering_call", default=None)


class RpcError(Exception):
    """An error answer; `data` must never carry a secret."""

    def __init__(self, code: int, message: str | None = None, data: Any = None, call_id: Any = None) -> None:
        super().__init__(message or MESSAGES.get(code, "Error"))
        self.code = code
        self.message = message or MESSAGES.get(code, "Error")
        self.data = data
        self.call_id = call_id  # the request's id, once it is known


def store_unavailable() -> RpcError:
    """The task store cannot be reached now: nothing was done, the same request may be sent again."""
    return RpcError(INTERNAL_ERROR, "The task store is unavailable", {"code": "store_unavailable", "retryable": True})


def internal_error() -> RpcError:
    """A failure of ours while answering (a bug, never the input's fault): never a 500 or a trace,
    never a free pass. Nothing was charged for it, and the same request may be sent again: a paid
    one is held by its claim, which replays its answer or runs it once."""
    return RpcError(INTERNAL_ERROR, data={"code": "internal_error", "retryable": True})


def shutting_down() -> RpcError:
    """The server stopped before this request's answer was ready: the same request may be sent again."""
    return RpcError(
        INTERNAL_ERROR,
        "The server is shutting down; send the request again",
        {"code": "shutting_down", "retryable": True},
    )


@dataclass(slots=True)
class Call:
    """One parsed JSON-RPC request."""

    id: str | int | None
    method: str
    dialect: str
    operation: str  # send | stream | get | cancel | subscribe | list | push | unsupported
    params: dict[str, Any]


class JsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_text.encode(content)  # a lone surrogate a client sent still encodes


def result_response(call_id: Any, result: Any, headers: dict[str, str] | None = None) -> JsonResponse:
    return JsonResponse({"jsonrpc": "2.0", "id": call_id, "result": result}, headers=headers)


def error_body(call_id: Any, error: RpcError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if answering_dialect.get() == V10:
        body["data"] = [error_info(error)]
    elif error.data is not None:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "id": call_id, "error": body}


def error_info(error: RpcError) -> dict[str, Any]:
    """The v1.0 `google.rpc.ErrorInfo`: its metadata is a string map (protobuf), so our
    own codes travel as strings (`"retryable": "true"`)."""
    metadata = error.data if isinstance(error.data, dict) else {}
    return {
        "@type": ERROR_INFO_TYPE,
        "reason": REASONS.get(error.code, "UNKNOWN_ERROR"),
        "domain": ERROR_DOMAIN,
        "metadata": {str(k): _metadata_value(v) for k, v in metadata.items()},
    }


def _metadata_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def error_response(call_id: Any, error: RpcError) -> Response:
    body = error_body(call_id, error)
    if errors_as_event.get():
        response: Response = Response(
            b"data: " + json_text.encode(body) + b"\n\n",
            media_type="text/event-stream",
            headers={"cache-control": "no-store"},
        )
    else:
        response = JsonResponse(body)
    response.rpc_error = error.code  # type: ignore[attr-defined]  # for the request log
    return response


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or RpcError(-32600) as soon as it passes `limit` bytes.

    Read from the request's ASGI messages (`request.receive`) rather than `request.stream()`,
    an async generator the event loop registers and finalises: 2.8 against 0.8 us a request.
    The body is this function's to read, once; nothing else reads it.
    """
    declared = header(request.headers, "content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RpcError(INVALID_REQUEST, "Request body too large", {"limit": limit})
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] != "http.request":  # http.disconnect: the client left before its body ended
            raise RpcError(INVALID_REQUEST, "Request body incomplete")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RpcError(INVALID_REQUEST, "Request body too large", {"limit": limit})
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


MAX_DEPTH = 64  # objects and arrays nested deeper are refused before anything copies them


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf, which no answer can carry (allow_nan=False)
        raise ValueError("number out of range")
    return value


_STRICT = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_LONG_NUMBER = re.compile(rb"[0-9]{19}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _may_need_check(body: bytes) -> bool:
    """Whether `_check_tree` could find anything. In UTF-8 (no NUL byte: UTF-16 and -32, which
    json.loads also reads, always have one) only a \\uD800-\\uDFFF escape makes a lone
    surrogate, and a document with fewer brackets than MAX_DEPTH cannot nest that deep."""
    return (
        b"\x00" in body
        or body.count(b"[") + body.count(b"{") >= MAX_DEPTH
        or _SURROGATE_ESCAPE.search(body) is not None
    )


def _check_tree(doc: Any) -> None:
    """Refuse what parses but cannot be handled: lone surrogates (SQLite cannot bind them),
    nesting past MAX_DEPTH (copy.deepcopy in Methods.stream recurses two frames a level)."""
    stack = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            value.encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise ValueError("nested too deeply")
            if isinstance(value, dict):
                for key, item in value.items():
                    key.encode("utf-8")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


async def read_call(request: Request, limit: int) -> Call:
    """Read, parse and version-check one call; raises RpcError with its id when known."""
    version = requested_version(header(request.headers, VERSION_HEADER) or "")
    if version == V10:
        answering_dialect.set(V10)  # even an envelope error of a v1.0 client is rendered for it
    call = parse_call(await read_body(request, limit))
    answering_call.set(call.id)
    answering_dialect.set(V10 if V10 in (version, call.dialect) else V03)
    errors_as_event.set(call.method == "tasks/resubscribe")
    if version not in SUPPORTED_VERSIONS:
        raise RpcError(
            VERSION_NOT_SUPPORTED,
            f"A2A-Version {version[:16]!r} is not supported",
            {"supportedVersions": ", ".join(SUPPORTED_VERSIONS)},
            call_id=call.id,
        )
    if version != call.dialect:
        raise RpcError(
            VERSION_NOT_SUPPORTED,
            f"{call.method} is an A2A {call.dialect} method; the request is A2A-Version {version}"
            + (" (no header means 0.3)" if version == V03 and call.dialect == V10 else ""),
            {"supportedVersions": ", ".join(SUPPORTED_VERSIONS)},
            call_id=call.id,
        )
    return call


def requested_version(header: str) -> str:
    """`Major.Minor` of an A2A-Version value; empty means 0.3 (patch numbers are ignored)."""
    value = header.strip()
    if not value:
        return V03
    major, _, rest = value.partition(".")
    minor = rest.partition(".")[0] or "0"
    return f"{major}.{minor}"


def load_json(body: bytes) -> Any:
    """Strict JSON: no NaN or Infinity, no number too large for a float (ValueError).

    As `json.loads(body, ...)` reads bytes (UTF-8, -16 or -32), with one decoder made once
    (`json.loads` with options builds a new one per call). orjson reads it first, four times
    faster, unless the body holds a run of 19 digits (orjson reads an integer past 64 bits as a
    float); what orjson refuses (a BOM, UTF-16, a lone surrogate, a number past a double, bad
    JSON) goes to the standard library, which reads it or refuses it as before. Where both read
    a body they read the same value (tests/server/test_load_json.py holds them to it)."""
    if _LONG_NUMBER.search(body) is None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return load_json_stdlib(body)


def load_json_stdlib(body: bytes) -> Any:
    """`load_json` by the standard library alone (what it always was)."""
    return _STRICT.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


def parse_call(body: bytes) -> Call:
    """Parse and validate one JSON-RPC 2.0 request; raises RpcError with its id when known."""
    try:
        raw = load_json(body)
        if _may_need_check(body):
            _check_tree(raw)
    except (ValueError, RecursionError):
        raise RpcError(PARSE_ERROR) from None
    if not isinstance(raw, dict):
        raise RpcError(INVALID_REQUEST, "Batch requests are not supported" if isinstance(raw, list) else None)
    call_id = raw.get("id")
    if isinstance(call_id, bool) or not isinstance(call_id, (str, int, type(None))):
        raise RpcError(INVALID_REQUEST, "id must be a string, a number or null")
    if raw.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"', call_id=call_id)
    method = raw.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "method must be a string", call_id=call_id)
    if method not in METHODS:
        raise RpcError(METHOD_NOT_FOUND, call_id=call_id)
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object", call_id=call_id)
    dialect, operation = METHODS[method]
    if dialect == V10:
        params = proto_json_names(params)
    return Call(id=call_id, method=method, dialect=dialect, operation=operation, params=params)
