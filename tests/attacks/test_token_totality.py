"""Any token content, however odd, is a token or "no token" on a real gate: never an exception.

A header or metadata value holding `Infinity`, NaN, a lone surrogate, a huge integer,
deep nesting or duplicate keys must answer like any other bad token: a 402 or a 403
on `message/send`, and on `tasks/get` the byte-identical -32001 every payer-bound
failure gives, with no traceback in the log. A protobuf Struct's `1.0` is the integer
`1`, and the same token sent once as `1` and once as `1.0` is one token.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.support.gate_helpers import unexpected_tracebacks
from tests.support.paid import PaidView, Payer, send_body


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate and facilitator; each test counts only its own payer's work (PaidView)."""
    return shared_paid


NOT_FOUND = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"Task not found"}}'


def b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def raw_json(token: dict, **replace: str) -> str:
    """The token as JSON text, with some values swapped for raw JSON (Infinity, escapes...)."""
    text = json.dumps(token, separators=(",", ":"))
    for field, raw in replace.items():
        value = json.dumps(token["payload"]["authorization"][field])
        text = text.replace(f'"{field}":{value}', f'"{field}":{raw}', 1)
    return text


def odd_tokens(token: dict) -> dict[str, str]:
    """Header values built from a real signed token, each with one odd piece of JSON."""
    deep = "[" * 5000 + "]" * 5000
    auth = token["payload"]["authorization"]
    return {
        "Infinity validBefore": b64(raw_json(token, validBefore="Infinity")),
        "-Infinity validAfter": b64(raw_json(token, validAfter="-Infinity")),
        "NaN value": b64(raw_json(token, value="NaN")),
        "bare Infinity": b64("Infinity"),
        "lone surrogate from": b64(raw_json(token, **{"from": '"\\ud800"'})),
        "lone surrogate nonce": b64(raw_json(token, nonce='"0x\\udfff' + "0" * 62 + '"')),
        "lone surrogate raw bytes": b64('{"x402Version":2,"payload":{},"accepted":"\udc80"}'),
        "huge integer validBefore": b64(raw_json(token, validBefore="9" * 5000)),
        "huge integer version": b64(raw_json(token).replace('"x402Version":2', '"x402Version":' + "1" * 400, 1)),
        "float validBefore": b64(raw_json(token, validBefore=f"{int(auth['validBefore'])}.5")),
        "deep nesting": b64('{"x402Version":2,"payload":' + deep + "}"),
        "deep nesting in payload": b64(raw_json(token).replace('"signature":', '"x":' + deep + ',"signature":', 1)),
        "duplicate keys": b64(raw_json(token).replace('{"from":', '{"to":"0x' + "ab" * 20 + '","from":', 1)),
        "odd base64 (cut short)": b64(raw_json(token))[:-1],
        "odd base64 (padding inside)": b64(raw_json(token))[:8] + "=" + b64(raw_json(token))[8:],
        "odd base64 (url-safe)": base64.urlsafe_b64encode(raw_json(token).encode()).decode() + "-_",
        "not base64": "%%%% not base64 \u00ff",
        "raw surrogate bytes": "\xed\xa0\x80" + b64(raw_json(token)),
    }


def get_body(task_id: str) -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": task_id}}


@pytest.mark.parametrize("header", ["PAYMENT-SIGNATURE", "X-PAYMENT"])
def test_odd_token_content_never_raises_and_tasks_get_stays_identical(paid, header):
    payer = Payer()
    task = paid.post("paid", send_body("mine"), payer.header_for(paid.gate.url)).json()["result"]
    for name, value in odd_tokens(payer.token_for(paid.gate.url)).items():
        raw = {header: value.encode("latin-1")}  # header bytes as they arrive, whatever they are
        sent = paid.post("paid", send_body("odd"), raw)
        assert sent.status_code in (402, 403), (name, sent.status_code, sent.text)
        got = paid.post("paid", get_body(task["id"]), raw)
        assert (got.status_code, got.content) == (200, NOT_FOUND), (name, got.text)
    log = paid.gate.log.read_text(errors="replace")
    assert unexpected_tracebacks(log) == []
    assert "internal error" not in log


def test_odd_values_in_metadata_never_raise(paid):
    payer = Payer()
    token = payer.token_for(paid.gate.url)
    task = paid.post("paid", send_body("mine"), payer.header_for(paid.gate.url)).json()["result"]
    odd_values = {
        "Infinity": "Infinity",
        "NaN": "NaN",
        "surrogate": '"\\ud800"',
        "huge": "9" * 4000,
        "fraction": "1.5",
        "deep": "[" * 3000 + "]" * 3000,
    }
    for name, raw in odd_values.items():
        for where in ("validBefore", "from"):
            odd = json.loads(json.dumps(token))
            odd["payload"]["authorization"][where] = "@ODD@"
            text = json.dumps(send_body("odd", metadata={"x402.payment.payload": odd})).replace('"@ODD@"', raw)
            sent = _post_raw(paid, "paid", text)
            assert sent.status_code in (200, 402, 403), (name, where, sent.status_code, sent.text)
            if sent.status_code == 200:  # only the envelope's own refusals may answer as JSON-RPC
                assert sent.json()["error"]["code"] in (-32700, -32600, -32602), (name, where, sent.text)
        body = get_body(task["id"])
        body["params"]["metadata"] = {"x402.payment.payload": "@ODD@"}
        got = _post_raw(paid, "paid", json.dumps(body).replace('"@ODD@"', raw))
        assert got.status_code == 200 and got.json()["error"]["code"] in (-32001, -32700, -32600), (name, got.text)
    log = paid.gate.log.read_text(errors="replace")
    assert unexpected_tracebacks(log) == []


def _post_raw(paid, agent: str, text: str):
    import httpx

    return httpx.post(
        f"{paid.gate.url}/a2a/{agent}",
        content=text.encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json"},
        timeout=30,
    )


def test_a_whole_number_float_is_the_integer_and_one_token(paid):
    """The a2a-sdk 1.x carries metadata as a protobuf Struct: `x402Version` arrives as 1.0 / 2.0."""
    payer = Payer()
    token = payer.token_for(paid.gate.url)
    as_float = json.loads(json.dumps(token).replace('"x402Version": 2', '"x402Version": 2.0', 1))
    assert as_float["x402Version"] == 2.0 and isinstance(as_float["x402Version"], float)
    body = send_body("struct", metadata={"x402.payment.payload": as_float})
    first = paid.post("paid", body)
    assert first.status_code == 200, first.text
    assert first.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    # the same token as an integer, the same request: one token, so a replay, not a second delivery
    body["params"]["message"]["metadata"] = {"x402.payment.payload": token}
    again = paid.post("paid", body)
    assert again.status_code == 200 and again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert paid.count_tasks("paid") == 1
    assert len(paid.ledger()["settlements"]) == 1
    # a non-whole version is no token at all: the price again
    fraction = json.loads(json.dumps(token).replace('"x402Version": 2', '"x402Version": 2.5', 1))
    assert paid.post("paid", send_body("x", metadata={"x402.payment.payload": fraction})).status_code == 402
