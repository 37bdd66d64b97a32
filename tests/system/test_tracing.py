"""Tracing through real processes: `a2a-gate serve --dev-facilitator` with `[tracing]` on exports its spans
over OTLP/HTTP to a collector in this test (the protobuf decoded with opentelemetry-proto): a paid request
and an API-key request, the tree and attributes an operator reads, a proxy's traceparent continued, and no
secret the test sent in any byte the collector received. With tracing off, serving the same requests
imports nothing of OpenTelemetry (an import of it is refused, as on an install without the extra).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devnet.payer import encode_header, new_private_key, sign_payment
from tests.support.gate_process import GateProcess, free_port
from tests.support.otlp_collector import Collector, attributes, collecting
from tests.support.paid import ASSET, PAY_TO

API_KEY = "otlp-test-key-7d4f0a9e"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PROXY_PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
CONFIG = f"""
database = "gate.db"

[agents.echo]

[agents.paid]
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[[keys]]
name = "tracer"
sha256 = "{hashlib.sha256(API_KEY.encode()).hexdigest()}"
agents = ["echo"]
"""


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    with collecting() as received:
        yield received


def message(text: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": text}]
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"message": {"kind": "message", "role": "user", "messageId": "m1", "parts": parts}},
    }


def pay(url: str, key: str, text: str, **headers: str) -> tuple[httpx.Response, str, dict[str, Any]]:
    """A 402, then the same request paid with a fresh signature: the answer, the header, the payload."""
    required = httpx.post(url, json=message(text), timeout=30)
    assert required.status_code == 402, required.text
    payload = sign_payment(json.loads(base64.b64decode(required.headers["payment-required"])), key)
    header = encode_header(payload)
    answer = httpx.post(url, json=message(text), headers={"PAYMENT-SIGNATURE": header, **headers}, timeout=60)
    return answer, header, payload


def test_serve_exports_the_span_tree_over_otlp_and_never_a_secret(
    tmp_path: Path, collector: tuple[Collector, str]
) -> None:
    received, endpoint = collector
    config = tmp_path / "gate.toml"
    config.write_text(
        CONFIG + f'\n[tracing]\nenabled = true\nservice_name = "gate-under-test"\nendpoint = "{endpoint}"\n'
    )
    key = new_private_key()
    gate = GateProcess(
        config,
        tmp_path / "gate.log",
        extra_args=["--dev-facilitator", str(free_port())],
        env={"OTEL_BSP_SCHEDULE_DELAY": "200"},  # the batch leaves within a fifth of a second
    )
    with gate:
        answer, header, payload = pay(f"{gate.url}/a2a/paid", key, "hello, exported", traceparent=PROXY_PARENT)
        assert answer.status_code == 200 and answer.json()["result"]["status"]["state"] == "completed", answer.text
        free = httpx.post(
            f"{gate.url}/a2a/echo", json=message("hello, free"), headers={"Authorization": f"Bearer {API_KEY}"}
        )
        assert free.status_code == 200, free.text
        requests = received.wait_for("a2a.request", 3)  # the 402, the paid request, the free one
        received.wait_for("facilitator.settle", 1)
        received.wait_for("agent.run", 2)

    paid = [s for s in requests if s.trace_id.hex() == TRACE_ID]
    assert len(paid) == 1, [attributes(s) for s in requests]
    request = paid[0]
    assert request.parent_span_id.hex() == "b7ad6b7169203331"  # the proxy's span is its parent
    assert attributes(request) == {
        "a2a.agent": "paid",
        "a2a.method": "message/send",
        "a2a.caller": "anonymous",
        "a2a.outcome": "paid",
        "http.response.status_code": 200,
        "x402.scheme": "exact",
        "x402.network": "eip155:84532",
    }
    in_trace = [s for s in received.spans if s.trace_id.hex() == TRACE_ID]
    children = {s.name: s for s in in_trace if s.parent_span_id == request.span_id}
    assert {"facilitator.verify", "facilitator.settle", "agent.run"} <= children.keys(), [s.name for s in in_trace]
    assert attributes(children["facilitator.verify"])["x402.outcome"] == "valid"
    assert attributes(children["facilitator.settle"])["x402.outcome"] == "settled"
    assert attributes(children["agent.run"]) == {"a2a.agent": "paid", "a2a.outcome": "completed"}
    assert any(s.name in ("store.transaction", "store.write") for s in in_trace)
    assert all(r.get("service.name") == "gate-under-test" for r in received.resources), received.resources

    free_request = [s for s in requests if attributes(s).get("a2a.caller") == "key"]
    assert len(free_request) == 1 and attributes(free_request[0])["a2a.agent"] == "echo"

    # not one byte the collector received names a secret the test sent
    everything = b"".join(received.bodies).lower()
    authorization = payload["payload"]["authorization"]
    secrets = [header, payload["payload"]["signature"], authorization["nonce"], key.removeprefix("0x"), API_KEY]
    secrets += [hashlib.sha256(API_KEY.encode()).hexdigest(), "hello, exported", "hello, free"]
    for secret in secrets:
        digits = secret.lower().removeprefix("0x")
        assert digits.encode() not in everything, f"exported: {secret[:12]}..."
        if len(digits) % 2 == 0 and all(c in "0123456789abcdef" for c in digits):  # nor as raw bytes
            assert bytes.fromhex(digits) not in b"".join(received.bodies), f"exported as bytes: {secret[:12]}..."


# Serving with tracing off, under a finder that refuses (and records) any import of OpenTelemetry:
# the same refusal an install without the `otel` extra gives.
WATCH_IMPORTS = """
import runpy, sys

record, python, *argv = sys.argv[1:]

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            with open(record, "a") as out:
                out.write(name + "\\n")
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Refuse())
sys.argv = [python, *argv[2:]]  # what `python -m gate.cli ...` would see
runpy.run_module("gate.cli", run_name="__main__", alter_sys=True)
"""


def test_serving_with_tracing_off_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(CONFIG)
    script, record = tmp_path / "watch_imports.py", tmp_path / "imports.txt"
    script.write_text(WATCH_IMPORTS)
    gate = GateProcess(
        config,
        tmp_path / "gate.log",
        extra_args=["--dev-facilitator", str(free_port())],
        prefix=[sys.executable, str(script), str(record)],
    )
    with gate:
        answer, _, _ = pay(f"{gate.url}/a2a/paid", new_private_key(), "hello, untraced")
        assert answer.status_code == 200 and answer.json()["result"]["status"]["state"] == "completed", answer.text
        free = httpx.post(f"{gate.url}/a2a/echo", json=message("hello"), headers={"Authorization": f"Bearer {API_KEY}"})
        assert free.status_code == 200, free.text
        gate.stop()  # its whole life, start to exit, under the finder
    assert not record.exists(), f"serving imported {record.read_text().split()}"
