"""Property tests of the envelope against a real gate (DESIGN sections 2, 4 and 7).

Whatever a client sends — arbitrary bytes, arbitrary JSON, JSON-RPC-shaped objects
with random methods, params and ids, NaN literals, huge numbers, deep nesting, odd
unicode, random Authorization / A2A-Version / Content-Type headers — the gate answers
with no 500 and no stack trace in its log, and the answer is one the contract names:
a JSON-RPC response (exactly one of result / error, a contract error code, the
request's id echoed) or a 401/402/403/404/429/501 JSON body with a `detail`.

One gate serves the whole module; a principal key lets requests reach dispatch, and
anonymous requests go through the payment gate of a priced agent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devnet.payer import encode_header, new_private_key, sign_payment
from server.dialects import METHODS
from tests.conftest import FREE_CONFIG
from tests.support.gate_process import GateProcess
from tests.support.serve import serve_app

KEY = "a2g_fuzz-principal-key-00000000000000"
LIMITED_KEY = "a2g_fuzz-limited-key-000000000000000"
CONTRACT_CODES = {-32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003, -32004, -32009}
RETRYABLE_INTERNAL = {"in_flight", "verify_unavailable"}
HTTP_REFUSALS = {401, 402, 403, 404, 429, 501}
AGENTS = ["echo", "interrupting", "paid", "hidden", "no-such-agent"]
PRICED = """
[limits]
per_ip_per_minute = 1000000
per_agent_per_minute = 1000000

[facilitator]
url = "{facilitator}"
timeout_seconds = 2.0

[agents.paid]
[agents.paid.price]
network = "eip155:84532"
asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
amount = "1000"
pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
"""
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def key_entry(name: str, key: str, agents: list[str]) -> str:
    return f'\n[[keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\nagents = {json.dumps(agents)}\n'


PAYER = "0x1111111111111111111111111111111111111111"


def approving_facilitator(calls: list[str]) -> Starlette:
    """Verifies and settles everything, and records each call."""

    async def verify(request: Request) -> JSONResponse:
        calls.append("verify")
        return JSONResponse({"isValid": True, "payer": PAYER})

    async def settle(request: Request) -> JSONResponse:
        calls.append("settle")
        return JSONResponse(
            {"success": True, "transaction": "0x" + "cd" * 32, "network": "eip155:84532", "payer": PAYER}
        )

    return Starlette(routes=[Route("/verify", verify, methods=["POST"]), Route("/settle", settle, methods=["POST"])])


@dataclass
class Target:
    gate: GateProcess
    client: httpx.Client
    facilitator_calls: list[str]
    log_offset: int = 0

    def post(self, agent: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        raw = {name: value.encode("latin-1") for name, value in headers.items()}  # any byte a header may hold
        return self.client.post(f"{self.gate.url}/a2a/{agent}", content=body, headers=raw)

    def new_log(self) -> str:
        data = self.gate.log.read_bytes()
        fresh, self.log_offset = data[self.log_offset :], len(data)
        return fresh.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("fuzz")
    config = folder / "gate.toml"
    calls: list[str] = []
    with serve_app(approving_facilitator(calls)) as facilitator:
        config.write_text(
            "max_body_bytes = 65536\n"
            + FREE_CONFIG
            + PRICED.format(facilitator=facilitator)
            + key_entry("fuzz", KEY, ["echo", "interrupting", "paid"])
            + key_entry("limited", LIMITED_KEY, ["slow"])
        )
        with GateProcess(config, folder / "gate.log") as gate, httpx.Client(timeout=15) as client:
            yield Target(gate, client, calls)


# --- what a good answer is --------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What the answer to a body must say about its id."""

    parse_error_ok: bool  # the body is not JSON, or JSON no answer could carry
    echo: bool  # the answer must carry the request's id
    call_id: Any = None


ANSWERABLE_DEPTH = 64


def answerable(doc: Any) -> bool:
    """False for JSON that parses but that an answer could not faithfully carry:
    a lone surrogate, a number out of float range, nesting past ANSWERABLE_DEPTH."""
    stack = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(value, float) and not math.isfinite(value):
            return False
        elif isinstance(value, (dict, list)):
            if depth >= ANSWERABLE_DEPTH:
                return False
            items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
            for key, item in items:
                stack.append((item, depth + 1))
                if key is not None:
                    stack.append((key, depth + 1))
    return True


def tally(what: str) -> None:
    """Count outcomes for `--hypothesis-show-statistics` (outside a property: nothing)."""
    if currently_in_test_context():
        event(what)


def _no_constants(name: str) -> None:
    raise ValueError(name)


def expected(body: bytes) -> Expected:
    try:
        doc = json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return Expected(parse_error_ok=True, echo=False)
    call_id = doc.get("id") if isinstance(doc, dict) else None
    echo = (
        isinstance(doc, dict)
        and doc.get("jsonrpc") == "2.0"
        and not isinstance(call_id, bool)
        and isinstance(call_id, (str, int, type(None)))
    )
    return Expected(parse_error_ok=not answerable(doc), echo=echo, call_id=call_id)


def check_rpc(doc: Any, expect: Expected) -> None:
    assert isinstance(doc, dict), doc
    assert doc.get("jsonrpc") == "2.0", doc
    assert ("result" in doc) != ("error" in doc), doc
    code = doc["error"]["code"] if "error" in doc else None
    tally(f"JSON-RPC {code if code is not None else 'result'}")
    if code == -32700:
        assert expect.parse_error_ok, doc
        assert doc["id"] is None, doc
    elif expect.echo:
        assert doc["id"] == expect.call_id, (doc, expect)
    if "error" in doc:
        error = doc["error"]
        assert error["code"] in CONTRACT_CODES, error
        assert isinstance(error["message"], str) and error["message"], error
        if error["code"] == -32603:  # our bug unless it is a named, retryable condition
            assert isinstance(error.get("data"), dict) and error["data"].get("code") in RETRYABLE_INTERNAL, error
    else:
        assert isinstance(doc["result"], dict), doc


def sse_documents(text: str) -> list[Any]:
    documents = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if lines:
            documents.append(json.loads("\n".join(lines)))
    return documents


def check(target: Target, agent: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    target.new_log()  # what earlier requests logged after their answer is theirs, not this one's
    try:
        response = target.post(agent, body, headers)
    finally:
        log = target.new_log()
        assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert response.status_code != 500, response.text
    tally(f"HTTP {response.status_code}")
    content_type = response.headers.get("content-type", "")
    if response.status_code == 200 and content_type.startswith("text/event-stream"):
        events = sse_documents(response.text)
        assert events, response.text
        for document in events:
            check_rpc(document, expected(body))
        return response
    assert content_type.startswith("application/json"), (response.status_code, content_type, response.text)
    doc = response.json()
    if response.status_code == 200:
        check_rpc(doc, expected(body))
    else:
        assert response.status_code in HTTP_REFUSALS, (response.status_code, response.text)
        assert isinstance(doc, dict) and isinstance(doc.get("detail"), str), doc
    return response


# --- strategies -------------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udbff", "\ud83d\ude00"])  # the last is a valid pair
WORDS = st.sampled_from(
    [
        "",
        " ",
        "2.0",
        "1.0",
        "user",
        "agent",
        "ROLE_USER",
        "ROLE_AGENT",
        "text",
        "data",
        "file",
        "message",
        "task",
        "completed",
        "input-required",
        "TASK_STATE_COMPLETED",
        "x402.payment.payload",
        "sleep 0",
        "\x00",
        "é",
        "中文",
        "\u202e",
        "🙂",
    ]
)
TEXT = st.text(max_size=24) | WORDS
ODD_TEXT = TEXT | SURROGATES  # only in a few places, so most requests stay answerable
NUMBERS = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=-(10**300), max_value=10**300)
    | st.floats(allow_nan=False, allow_infinity=False)
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
KEYS = st.sampled_from(
    [
        "kind",
        "text",
        "data",
        "file",
        "parts",
        "role",
        "id",
        "taskId",
        "messageId",
        "metadata",
        "x402.payment.payload",
        "x402Version",
        "accepted",
        "payload",
    ]
) | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(KEYS, c, max_size=4), max_leaves=20)
RARELY = st.none() | st.none() | st.none()  # absent (None is "not given") more often than not

PART = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["text", "data", "file", "image"]) | JSON,
        "text": ODD_TEXT | JSON,
        "data": JSON,
        "file": st.fixed_dictionaries(
            {}, optional={"uri": TEXT | JSON, "bytes": TEXT | JSON, "mimeType": TEXT | JSON, "name": TEXT | JSON}
        )
        | JSON,
        "url": TEXT | JSON,
        "raw": TEXT | JSON,
        "mediaType": TEXT | JSON,
        "metadata": JSON,
    },
)
USABLE_PART = (
    st.fixed_dictionaries(
        {"kind": st.just("text"), "text": st.text(min_size=1, max_size=40)}, optional={"metadata": JSON}
    )
    | st.fixed_dictionaries({"text": st.text(min_size=1, max_size=40)})
    | st.fixed_dictionaries({"kind": st.just("data"), "data": JSON.map(lambda v: 0 if v is None else v)})
    | st.fixed_dictionaries({"data": JSON.map(lambda v: 0 if v is None else v)})
)
TOKEN_LIKE = st.fixed_dictionaries(
    {"x402Version": st.sampled_from([1, 2]) | JSON},
    optional={
        "accepted": JSON,
        "payload": JSON,
        "scheme": JSON,
        "network": JSON,
        "resource": JSON,
    },
)
MESSAGE = st.fixed_dictionaries(
    {"parts": st.lists(USABLE_PART | USABLE_PART | PART | JSON, max_size=3) | JSON},
    optional={
        "role": st.sampled_from(["user", "agent", "ROLE_USER"]) | JSON,
        "kind": st.just("message") | JSON,
        "messageId": st.uuids().map(str) | TEXT | JSON,
        "taskId": RARELY | TEXT | JSON,
        "contextId": RARELY | TEXT | JSON,
        "metadata": st.dictionaries(st.just("x402.payment.payload") | KEYS, TOKEN_LIKE | JSON, max_size=2) | JSON,
        "referenceTaskIds": JSON,
        "extensions": JSON,
    },
)
CONFIGURATION = st.fixed_dictionaries(
    {},
    optional={
        "blocking": st.booleans() | JSON,
        "returnImmediately": st.booleans() | JSON,
        "historyLength": NUMBERS | JSON,
        "acceptedOutputModes": JSON,
    },
)
PARAMS = (
    st.fixed_dictionaries(
        {},
        optional={
            "message": MESSAGE | MESSAGE | JSON,
            "configuration": CONFIGURATION | JSON,
            "id": TEXT | JSON,
            "historyLength": NUMBERS | JSON,
            "metadata": st.dictionaries(st.just("x402.payment.payload") | KEYS, TOKEN_LIKE | JSON, max_size=2),
        },
    )
    | JSON
)
IDS = (
    st.none()
    | st.integers()
    | st.integers(min_value=10**30, max_value=10**300)
    | ODD_TEXT
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.lists(st.integers(), max_size=2)
)
OPERATIONS = st.sampled_from(
    [
        "message/send",
        "message/stream",
        "tasks/get",
        "tasks/cancel",
        "SendMessage",
        "SendStreamingMessage",
        "GetTask",
        "CancelTask",
    ]
)
METHOD = OPERATIONS | OPERATIONS | OPERATIONS | st.sampled_from(sorted(METHODS)) | ODD_TEXT | JSON
ANY_REQUEST = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0") | JSON, "method": METHOD},
    optional={"id": IDS, "params": PARAMS, "extra": JSON},
)
GOOD_IDS = st.none() | st.integers() | st.text(max_size=12)
SEND_REQUEST = st.fixed_dictionaries(
    {  # a well-formed send, odd only in its details
        "jsonrpc": st.just("2.0"),
        "id": GOOD_IDS,
        "method": st.sampled_from(["message/send", "message/stream", "SendMessage", "SendStreamingMessage"]),
        "params": st.fixed_dictionaries(
            {
                "message": st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "ROLE_USER"]),
                        "parts": st.tuples(
                            st.lists(USABLE_PART, min_size=1, max_size=2), st.lists(PART | JSON, max_size=2)
                        ).map(lambda both: both[0] + both[1]),
                    },
                    optional={
                        "messageId": st.uuids().map(str) | TEXT,
                        "kind": st.just("message"),
                        "metadata": st.dictionaries(KEYS, JSON, max_size=2),
                        "extensions": JSON,
                        "referenceTaskIds": JSON,
                        "contextId": st.uuids().map(str),
                    },
                )
            },
            optional={"configuration": CONFIGURATION, "metadata": st.dictionaries(KEYS, JSON, max_size=2), "x": JSON},
        ),
    },
    optional={"extra": JSON},
)
TASK_REQUEST = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "id": GOOD_IDS,
        "method": st.sampled_from(["tasks/get", "tasks/cancel", "GetTask", "CancelTask"]),
        "params": st.fixed_dictionaries(
            {"id": st.uuids().map(str) | TEXT | JSON}, optional={"historyLength": NUMBERS | JSON, "metadata": JSON}
        ),
    }
)
REQUEST = SEND_REQUEST | TASK_REQUEST | ANY_REQUEST
MOSTLY_PRINCIPAL = st.sampled_from([False, False, False, True])  # anonymous one time in four

HEADER_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40) | st.binary(max_size=30).map(
    lambda b: bytes(c for c in b if c >= 0x21 and c != 0x7F).decode("latin-1")
)
AUTHORIZATION = st.sampled_from(
    [f"Bearer {KEY}", f"Bearer {LIMITED_KEY}", f"bearer {KEY}", f"Bearer {KEY}x", "Bearer", "Basic Zm9vOmJhcg=="]
) | HEADER_TEXT.map(lambda s: f"Bearer {s}".strip())
PAYMENT_HEADER = (
    HEADER_TEXT
    | JSON.map(lambda v: base64.b64encode(json.dumps(v).encode()).decode())
    | TOKEN_LIKE.map(lambda v: base64.b64encode(json.dumps(v).encode()).decode())
)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "Authorization": AUTHORIZATION,
        "A2A-Version": st.sampled_from(["1.0", "0.3", "0.3.0", "2"]) | HEADER_TEXT,
        "Content-Type": st.sampled_from(
            ["application/json", "text/plain", "application/json; charset=latin-1", "multipart/form-data; boundary=x"]
        )
        | HEADER_TEXT,
        "PAYMENT-SIGNATURE": PAYMENT_HEADER,
        "X-PAYMENT": PAYMENT_HEADER,
        "X-A2A-Extensions": st.sampled_from(
            [
                "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2",
                "https://github.com/google-a2a/a2a-x402/v0.1",
            ]
        )
        | HEADER_TEXT,
    },
)
PRINCIPAL = {"Authorization": f"Bearer {KEY}"}


def fill(template: str, **values: str) -> bytes:
    """A raw JSON text with each NAME in `template` replaced by its literal."""
    for name, literal in values.items():
        template = template.replace(name, literal)
    return template.encode()


def versioned(method: Any, headers: dict[str, str]) -> dict[str, str]:
    """A v1.0 method travels with `A2A-Version: 1.0`, as v1.0 clients send it (without it the
    call is v0.3 and answers -32009, which would leave the v1.0 paths unexplored)."""
    return {**headers, "A2A-Version": "1.0"} if isinstance(method, str) and method[:1].isupper() else headers


def nested_request(method: str, nested: str) -> bytes:
    return fill(
        '{"jsonrpc":"2.0","id":1,"method":"METHOD","params":{"message":{"role":"user","messageId":"m",'
        '"parts":[{"kind":"data","data":NESTED},{"text":"x"}]}}}',
        METHOD=method,
        NESTED=nested,
    )


def encode(value: Any) -> bytes:
    """JSON text; NaN / Infinity floats come out as the bare literals."""
    return json.dumps(value, ensure_ascii=True).encode()


# --- properties -------------------------------------------------------------------


@settings(FUZZ, max_examples=300)
@given(body=st.binary(max_size=2000), agent=st.sampled_from(AGENTS), anonymous=st.booleans())
@example(body=b"", agent="echo", anonymous=False)
@example(body=b"\xef\xbb\xbf{}", agent="echo", anonymous=False)
@example(body=b"\x00" * 10, agent="paid", anonymous=True)
def test_arbitrary_bytes(target: Target, body: bytes, agent: str, anonymous: bool) -> None:
    check(target, agent, body, {} if anonymous else PRINCIPAL)


@settings(FUZZ, max_examples=300)
@given(value=JSON, agent=st.sampled_from(AGENTS), anonymous=st.booleans())
def test_arbitrary_json_values(target: Target, value: Any, agent: str, anonymous: bool) -> None:
    check(target, agent, encode(value), {} if anonymous else PRINCIPAL)


@settings(FUZZ, max_examples=1500)
@given(request=REQUEST, agent=st.sampled_from(["echo", "echo", "interrupting", "paid"]), anonymous=MOSTLY_PRINCIPAL)
@example(
    request={
        "jsonrpc": "2.0",
        "method": "message/send",
        "id": 1,
        "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}},
    },
    agent="echo",
    anonymous=False,
)
@example(
    request={
        "jsonrpc": "2.0",
        "method": "SendStreamingMessage",
        "id": "s",
        "params": {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    },
    agent="echo",
    anonymous=False,
)
def test_json_rpc_shaped_requests(target: Target, request: dict[str, Any], agent: str, anonymous: bool) -> None:
    check(target, agent, encode(request), versioned(request.get("method"), {} if anonymous else PRINCIPAL))


LITERALS = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "1e-400",
        "123456789" * 20,
        "9" * 5000,
        "-0",
        "0.0e99999",
        '"\\ud800"',
        '"\\udfff\\ud800"',
        "null",
        "[]",
        "{}",
    ]
)


@settings(FUZZ, max_examples=200)
@given(
    data=LITERALS,
    history=LITERALS,
    call_id=LITERALS,
    method=st.sampled_from(
        [
            "message/send",
            "message/stream",
            "SendMessage",
            "SendStreamingMessage",
            "tasks/get",
            "GetTask",
            "tasks/cancel",
        ]
    ),
)
def test_odd_number_and_string_literals(target: Target, data: str, history: str, call_id: str, method: str) -> None:
    body = fill(
        '{"jsonrpc":"2.0","id":ID,"method":"METHOD","params":{"id":DATA,"historyLength":HISTORY,"message":'
        '{"role":"user","messageId":"m","parts":[{"kind":"data","data":DATA},{"text":DATA}]},'
        '"configuration":{"historyLength":HISTORY}}}',
        ID=call_id,
        METHOD=method,
        DATA=data,
        HISTORY=history,
    )
    check(target, "echo", body, versioned(method, PRINCIPAL))


@settings(FUZZ, max_examples=80)
@given(
    depth=st.integers(min_value=1, max_value=3000),
    brackets=st.sampled_from(["[]", "{}"]),
    method=st.sampled_from(["message/send", "message/stream", "SendMessage", "SendStreamingMessage"]),
)
@example(depth=600, brackets="[]", method="message/stream")
@example(depth=2500, brackets="[]", method="SendStreamingMessage")
def test_deep_nesting(target: Target, depth: int, brackets: str, method: str) -> None:
    opening, closing = ("[", "]") if brackets == "[]" else ('{"a":', "}")
    nested = opening * depth + ("1" if brackets == "{}" else "") + closing * depth
    check(target, "echo", nested_request(method, nested), versioned(method, PRINCIPAL))


@settings(FUZZ, max_examples=400)
@given(
    headers=HEADERS,
    agent=st.sampled_from(AGENTS),
    method=st.sampled_from(["message/send", "SendMessage", "tasks/get", "GetTask", "message/stream"]),
)
def test_random_headers(target: Target, headers: dict[str, str], agent: str, method: str) -> None:
    body = encode(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": method,
            "params": {"id": "t", "message": {"role": "user", "parts": [{"kind": "text", "text": "hi"}]}},
        }
    )
    check(target, agent, body, headers)


# A well-formed send in each dialect, every field of its message (and of its parts) present, so that
# one field replaced by any JSON value is the only thing wrong with it (a broken neighbour would be
# refused first and hide the field's own reading).
GOOD_MESSAGE = {
    "0.3": {
        "kind": "message",
        "role": "user",
        "messageId": "m-1",
        "contextId": "c-1",
        "metadata": {"k": "v"},
        "referenceTaskIds": ["t-0"],
        "extensions": ["https://example.com/ext"],
        "parts": [
            {"kind": "text", "text": "hi", "metadata": {"k": 1}},
            {"kind": "data", "data": {"a": 1}},
            {"kind": "file", "file": {"uri": "https://example.com/f", "mimeType": "text/plain", "name": "f"}},
        ],
    },
    "1.0": {
        "role": "ROLE_USER",
        "messageId": "m-1",
        "contextId": "c-1",
        "metadata": {"k": "v"},
        "referenceTaskIds": ["t-0"],
        "extensions": ["https://example.com/ext"],
        "parts": [
            {"text": "hi", "metadata": {"k": 1}, "mediaType": "text/plain"},
            {"data": {"a": 1}},
            {"url": "https://example.com/f", "mediaType": "text/plain", "filename": "f"},
            {"raw": "aGk=", "mediaType": "text/plain"},
        ],
    },
}


def field_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index under `value`, as paths (the containers themselves included)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    paths = []
    for key, inner in items:
        paths.append((*prefix, key))
        paths += field_paths(inner, (*prefix, key))
    return paths


MESSAGE_FIELDS = {version: field_paths(message) for version, message in GOOD_MESSAGE.items()}
# keys a client might add that the good message does not carry
EXTRA_FIELDS = [("taskId",), ("parts", 0, "kind"), ("parts", 0, "file"), ("parts", 0, "url"), ("parts", 1, "text")]
SEND_METHODS = {"0.3": ["message/send", "message/stream"], "1.0": ["SendMessage", "SendStreamingMessage"]}


@st.composite
def one_field_replaced(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    version = draw(st.sampled_from(sorted(GOOD_MESSAGE)))
    message = json.loads(json.dumps(GOOD_MESSAGE[version]))
    path = draw(st.sampled_from(MESSAGE_FIELDS[version] + EXTRA_FIELDS))
    value = draw(JSON | JSON | st.sampled_from([{}, [], [[]], {"a": {}}, ["user"], {"user": 1}, 1e300, -1, True]))
    *parents, last = path
    container: Any = message
    for key in parents:
        container = container[key]
    container[last] = value
    tally(f"replaced {'.'.join(str(p) for p in path if not isinstance(p, int))}")
    return version, message


@settings(FUZZ, max_examples=600)
@given(
    replaced=one_field_replaced(),
    stream=st.booleans(),
    agent=st.sampled_from(["echo", "echo", "paid"]),
    anonymous=MOSTLY_PRINCIPAL,
)
@example(replaced=("0.3", {**GOOD_MESSAGE["0.3"], "role": {}}), stream=False, agent="echo", anonymous=False)
@example(replaced=("0.3", {**GOOD_MESSAGE["0.3"], "role": ["user"]}), stream=True, agent="paid", anonymous=True)
def test_any_json_value_in_any_message_field(
    target: Target, replaced: tuple[str, dict[str, Any]], stream: bool, agent: str, anonymous: bool
) -> None:
    """One field of a well-formed message (its parts' fields too) holding any JSON value: never a
    5xx, never -32603 but a named retryable condition, never a traceback in the log."""
    version, message = replaced
    method = SEND_METHODS[version][stream]
    body = encode({"jsonrpc": "2.0", "id": 3, "method": method, "params": {"message": message}})
    check(target, agent, body, versioned(method, {} if anonymous else PRINCIPAL))


# --- the bugs the properties found, pinned one by one ------------------------------


@pytest.mark.parametrize("role", [{}, {"user": 1}, [], ["user"], [[]]], ids=["{}", "object", "[]", "list", "nested"])
@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_a_role_that_is_an_object_or_an_array_is_invalid_params(target: Target, role: Any, method: str) -> None:
    """An unhashable role in the v0.3 role check was a TypeError: -32603 "retryable" and a traceback."""
    message = {**GOOD_MESSAGE["0.3"], "role": role}
    response = check(
        target, "echo", encode({"jsonrpc": "2.0", "id": 9, "method": method, "params": {"message": message}}), PRINCIPAL
    )
    answer = (
        sse_documents(response.text)[0]
        if response.headers["content-type"].startswith("text/event-stream")
        else response.json()
    )
    assert answer["error"]["code"] == -32602, answer
    assert "role" in answer["error"]["message"] + json.dumps(answer["error"].get("data")), answer


def test_a_lone_surrogate_in_the_id_is_not_a_500(target: Target) -> None:
    """An id holding a lone UTF-16 surrogate (legal JSON escape) crashed the error answer."""
    for method in ("no/such/method", "tasks/get"):
        body = b'{"jsonrpc":"2.0","id":"\\ud800","method":"%s","params":{"id":"x"}}' % method.encode()
        check(target, "echo", body, PRINCIPAL)


def test_a_lone_surrogate_in_a_message_is_answered(target: Target) -> None:
    """Sends and streams of text with a lone surrogate: an answer, not -32603 or a cut stream."""
    for method in ("message/send", "message/stream"):
        body = (
            b'{"jsonrpc":"2.0","id":1,"method":"%s","params":{"message":{"role":"user","messageId":"m",'
            b'"parts":[{"kind":"text","text":"a\\ud800"}]}}}' % method.encode()
        )
        check(target, "echo", body, PRINCIPAL)


def test_a_lone_surrogate_in_a_task_id_is_answered(target: Target) -> None:
    """tasks/get and tasks/cancel hand the id to SQLite, which cannot encode it: -32603 and a traceback."""
    for method in ("tasks/get", "tasks/cancel", "GetTask"):
        check(
            target,
            "echo",
            fill('{"jsonrpc":"2.0","id":1,"method":"METHOD","params":{"id":"\\ud800"}}', METHOD=method),
            versioned(method, PRINCIPAL),
        )


def test_an_out_of_range_number_is_not_an_internal_error(target: Target) -> None:
    """1e400 parses to float('inf'): the task ran, but its answer could never be rendered."""
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"role":"user","messageId":"m",'
        b'"parts":[{"kind":"data","data":1e400}]}}}'
    )
    check(target, "echo", body, PRINCIPAL)


@pytest.mark.parametrize("depth", [600, 2500])
def test_a_deeply_nested_stream_request_is_not_an_internal_error(target: Target, depth: int) -> None:
    """message/stream deep-copies the task, two frames per level: a body that parses
    (under recursion limit 1000: 600 levels; under 4000: 2500) overflows in the copy."""
    nested = "[" * depth + "]" * depth
    for method in ("message/stream", "SendStreamingMessage"):
        check(target, "echo", nested_request(method, nested), versioned(method, PRINCIPAL))


@pytest.mark.parametrize("depth", [600, 2500])
def test_a_paid_stream_is_never_charged_without_an_answer(target: Target, depth: int) -> None:
    """On the paid path the stream's deep copy fails after verify and start: the payer got
    -32603 while the work ran and was settled, i.e. charged for an answer never sent."""
    required = target.post("paid", nested_request("message/stream", "1"), {})
    assert required.status_code == 402
    token = encode_header(sign_payment(required.json()["payment_required"], new_private_key()))
    target.facilitator_calls.clear()
    nested = "[" * depth + "]" * depth

    response = target.post("paid", nested_request("message/stream", nested), {"PAYMENT-SIGNATURE": token})

    assert response.status_code == 200
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return  # answered: the stream carries the task and its settlement
    answer = response.json()
    if "error" in answer:  # refused: then nothing may be charged, now or once the work ends
        deadline = time.monotonic() + 3
        while "settle" not in target.facilitator_calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "settle" not in target.facilitator_calls, f"charged for a request answered {answer}"
