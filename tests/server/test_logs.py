"""Logs an operator can follow: with --log-json every line of the process is JSON (uvicorn's
own too), every line of a request carries its request id (and its task's id where it has one),
and the request id is echoed in `X-Request-Id`: taken from a trusted proxy when well formed,
minted otherwise."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.support.gate_helpers import create_key
from tests.support.gate_process import free_port
from tests.support.paid import Payer, paid_config, send_body

EXTRA = """
[agents.broken]
backend = "python"
callable = "tests.support.agents:broken"
"""


@pytest.fixture
def logged_gate(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", facilitator) + EXTRA
    text = text.replace("[agents.echo]", '[proxy]\ntrusted = ["127.0.0.1"]\n\n[agents.echo]', 1)
    config = write_config(text)
    gate = start_gate(config, port=port, extra_args=["--log-json"])
    return gate, create_key(config, "ops")


def test_every_line_is_json_and_every_line_of_a_request_names_it(logged_gate):
    gate, key = logged_gate
    auth = {"Authorization": f"Bearer {key}"}
    failed = httpx.post(f"{gate.url}/a2a/broken", json=send_body("x"), headers=auth)
    task_id = failed.json()["result"]["id"]
    request_id = failed.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    unpaid = httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"))
    assert unpaid.status_code == 402 and unpaid.headers["x-request-id"] != request_id
    payer = Payer()
    paid = httpx.post(f"{gate.url}/a2a/paid", json=send_body("y"), headers=payer.header_for(gate.url), timeout=30)
    assert paid.status_code == 200
    gate.stop()

    raw = [line for line in gate.log.read_text().splitlines() if line.strip()]
    lines = []
    for line in raw:
        try:
            lines.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # uvicorn's own lines are JSON too
    of_request = [line for line in lines if line.get("request_id") == request_id]
    assert {line["logger"] for line in of_request} >= {"a2a_gate.execution", "a2a_gate.requests"}
    assert all(line.get("task_id") == task_id for line in of_request)  # the agent's warning and the request line
    paid_line = next(line for line in lines if line.get("outcome") == "paid")
    assert paid_line["request_id"] == paid.headers["x-request-id"] and paid_line["task_id"]


def test_a_trusted_proxys_request_id_is_kept_and_anyone_elses_replaced(logged_gate):
    gate, key = logged_gate
    auth = {"Authorization": f"Bearer {key}"}
    kept = httpx.get(f"{gate.url}/healthz", headers={"X-Request-Id": "3f9a0c1e2b7d4e5f8a6b9c0d1e2f3a4b"})
    assert kept.headers["x-request-id"] == "3f9a0c1e2b7d4e5f8a6b9c0d1e2f3a4b"  # 127.0.0.1 is the trusted proxy
    for bad in (b"a b", b"x" * 200, "id\u2028forged".encode(), b"", b"short"):
        answer = httpx.post(f"{gate.url}/a2a/echo", json=send_body("x"), headers={**auth, "X-Request-Id": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["x-request-id"]), bad


def test_a_request_id_from_an_untrusted_peer_is_replaced(tmp_path, start_gate, write_config):
    port = free_port()
    gate = start_gate(write_config('database = "gate.db"\n\n[agents.echo]\n'), port=port)
    answer = httpx.get(f"{gate.url}/healthz", headers={"X-Request-Id": "3f9a0c1e2b7d4e5f8a6b9c0d1e2f3a4b"})
    assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["x-request-id"])
    assert answer.headers["x-request-id"] != "3f9a0c1e2b7d4e5f8a6b9c0d1e2f3a4b"
