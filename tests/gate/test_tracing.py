"""Tracing in one process, spans kept in memory: a paid request (the development facilitator, real
signatures) and an API-key request leave the span tree the operator reads (the request, verify, the
agent's run, settle, the store's transactions), with the agent, scheme, network, method and outcome
named, a proxy's traceparent continued and passed on to the facilitator; and no span names any secret
the test sent (the payment header, the signature, the nonce, the API key, the payer's private key).
"""

from __future__ import annotations

import base64
import hashlib
import json
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.testclient import TestClient

from devnet.facilitator import create_facilitator_app
from devnet.payer import encode_header, sign_payment
from gate.app import build_app
from gate.config import parse_config
from server import tracing
from tests.support.dev_facilitator_helpers import PAY_TO, USDC_BASE_SEPOLIA, key
from tests.support.serve import serve_app

__all__ = ["key"]  # the fixture this module binds

API_KEY = "tracing-test-key-5b1e8c2d"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PROXY_PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
CONFIG = """
public_url = "http://testserver"
database = "gate.db"

[facilitator]
url = "{facilitator}"

[agents.echo]

[agents.broken]
backend = "python"
callable = "tests.support.agents:broken"

[agents.paid]
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[[keys]]
name = "tracer"
sha256 = "{digest}"
agents = ["echo", "broken"]
"""


def message(text: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": text}]
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"message": {"kind": "message", "role": "user", "messageId": "m1", "parts": parts}},
    }


@pytest.fixture
def facilitator(tmp_path: Path) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """The development facilitator, and the traceparent each call to it carried (by path)."""
    app = create_facilitator_app(str(tmp_path / "ledger.db"))
    heard: list[tuple[str, str]] = []

    async def listening(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            heard.append((scope["path"], dict(scope["headers"]).get(b"traceparent", b"").decode()))
        await app(scope, receive, send)

    with serve_app(listening, wait_on_exit=False) as url:
        yield url, heard


@pytest.fixture
def traced(
    tmp_path: Path, facilitator: tuple[str, list[tuple[str, str]]]
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    text = CONFIG.format(
        facilitator=facilitator[0],
        asset=USDC_BASE_SEPOLIA,
        pay_to=PAY_TO,
        digest=hashlib.sha256(API_KEY.encode()).hexdigest(),
    )
    settings = parse_config(tomllib.loads(text), base_dir=tmp_path)
    exporter = InMemorySpanExporter()
    settings = replace(settings, tracing=replace(settings.tracing, enabled=True, exporter=exporter))
    with TestClient(build_app(settings)) as client:
        yield client, exporter
    assert not tracing.active()  # the app that turned it on turned it off


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def everything_said(spans: list[ReadableSpan]) -> str:
    """Every name, attribute, event, link and resource attribute of every span, as one text."""
    said = []
    for s in spans:
        said += [s.name, json.dumps(dict(s.attributes or {})), json.dumps(dict(s.resource.attributes))]
        said += [e.name + json.dumps(dict(e.attributes or {})) for e in s.events]
        said += [json.dumps(dict(link.attributes or {})) for link in s.links]
        said.append(str(s.status.description or ""))
    return "\n".join(said).lower()


def assert_no_secret(spans: list[ReadableSpan], secrets: list[str]) -> None:
    said = everything_said(spans)
    for secret in secrets:
        assert secret and secret.lower() not in said, f"a span names a secret: {secret[:12]}..."


def test_a_paid_request_traces_verify_the_run_settle_and_the_store_and_no_secret(
    traced: tuple[TestClient, InMemorySpanExporter], facilitator: tuple[str, list[tuple[str, str]]], key: str
) -> None:
    client, exporter = traced
    required = client.post("/a2a/paid", json=message("hello, traced"))
    assert required.status_code == 402
    document = json.loads(base64.b64decode(required.headers["payment-required"]))
    payload = sign_payment(document, key)
    header = encode_header(payload)
    exporter.clear()

    answer = client.post(
        "/a2a/paid",
        json=message("hello, traced"),
        headers={"PAYMENT-SIGNATURE": header, "traceparent": PROXY_PARENT},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["status"]["state"] == "completed"
    spans = list(exporter.get_finished_spans())

    request = one(spans, "a2a.request")
    assert format(request.context.trace_id, "032x") == TRACE_ID  # the proxy's trace goes on
    assert request.parent is not None and format(request.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert dict(request.attributes or {}) == {
        "a2a.agent": "paid",
        "a2a.method": "message/send",
        "a2a.caller": "anonymous",
        "a2a.outcome": "paid",
        "http.response.status_code": 200,
        "x402.scheme": "exact",
        "x402.network": "eip155:84532",
    }
    verify, settle, run = one(spans, "facilitator.verify"), one(spans, "facilitator.settle"), one(spans, "agent.run")
    for child in (verify, settle, run):
        assert child.parent is not None and child.parent.span_id == request.context.span_id, child.name
        assert child.context.trace_id == request.context.trace_id
    assert verify.start_time < run.start_time < settle.start_time  # verify, deliver, then settle
    assert dict(verify.attributes or {}) == {
        "x402.scheme": "exact",
        "x402.network": "eip155:84532",
        "x402.outcome": "valid",
    }
    assert dict(settle.attributes or {}) == {
        "x402.scheme": "exact",
        "x402.network": "eip155:84532",
        "x402.outcome": "settled",
    }
    assert dict(run.attributes or {}) == {"a2a.agent": "paid", "a2a.outcome": "completed"}
    writes = [s for s in spans if s.name in ("store.transaction", "store.write")]
    assert writes, [s.name for s in spans]
    for write in writes:  # one span per transaction, in the request's trace, naming the engine only
        assert write.context.trace_id == request.context.trace_id
        assert set(write.attributes or {}) <= {"db.system.name", "db.statements"}
        assert (write.attributes or {})["db.system.name"] == "sqlite"
    assert len(writes) < 20  # per transaction, not per statement

    # the facilitator heard the trace: its verify and settle calls carried the request's traceparent
    calls = {path: parent for path, parent in facilitator[1] if path in ("/verify", "/settle")}
    assert set(calls) == {"/verify", "/settle"}, facilitator[1]
    assert all(parent.split("-")[1] == TRACE_ID for parent in calls.values()), calls

    authorization = payload["payload"]["authorization"]
    secrets = [header, payload["payload"]["signature"], authorization["nonce"], key.removeprefix("0x")]
    assert_no_secret(spans, [*secrets, "hello, traced"])


def test_an_api_key_request_traces_the_free_path_and_never_the_key(
    traced: tuple[TestClient, InMemorySpanExporter],
) -> None:
    client, exporter = traced
    answer = client.post("/a2a/echo", json=message("hello, free"), headers={"Authorization": f"Bearer {API_KEY}"})
    assert answer.status_code == 200, answer.text
    spans = list(exporter.get_finished_spans())
    request = one(spans, "a2a.request")
    assert request.parent is None  # no traceparent: a trace of its own
    assert dict(request.attributes or {}) == {
        "a2a.agent": "echo",
        "a2a.method": "message/send",
        "a2a.caller": "key",
        "a2a.outcome": "ok",
        "http.response.status_code": 200,
    }
    run = one(spans, "agent.run")
    assert run.parent is not None and run.parent.span_id == request.context.span_id
    assert not by_name(spans, "facilitator.verify") and not by_name(spans, "facilitator.settle")
    assert_no_secret(spans, [API_KEY, hashlib.sha256(API_KEY.encode()).hexdigest(), "hello, free"])


def test_a_span_ended_by_an_exception_is_an_error_and_keeps_nothing_of_it(
    traced: tuple[TestClient, InMemorySpanExporter],
) -> None:
    client, exporter = traced
    answer = client.post("/a2a/broken", json=message("hello"), headers={"Authorization": f"Bearer {API_KEY}"})
    assert answer.json()["result"]["status"]["state"] == "failed", answer.text
    run = one(list(exporter.get_finished_spans()), "agent.run")
    assert run.status.status_code is StatusCode.ERROR
    assert not run.events  # the exception, its message and its stack are not recorded
    assert_no_secret([run], ["agent bug", "RuntimeError"])
