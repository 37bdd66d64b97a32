"""What an operator sees: metrics, health, readiness, JSON log lines, the payments command."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.gate_process import free_port
from tests.support.paid import PaidView, Payer, paid_config, send_body


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate; the metrics test counts everything a gate did, so it has its own (own_paid)."""
    return shared_paid


def test_metrics_count_requests_payments_and_refusals(own_paid):
    paid = own_paid
    payer = Payer()
    paid.post("paid", send_body("x"), payer.header_for(paid.gate.url))
    paid.faults(settle="http500")
    paid.post("paid", send_body("y"), payer.header_for(paid.gate.url))
    paid.faults()
    paid.post("nope", send_body("x"))
    text = httpx.get(f"{paid.gate.url}/metrics").text
    assert metric(text, "a2a_gate_requests_total", agent="paid", caller="anonymous", outcome="paid") == 2
    assert metric(text, "a2a_gate_requests_total", agent="paid", outcome="payment_required") == 2
    assert metric(text, "a2a_gate_requests_total", agent="unknown", outcome="unauthenticated") == 1
    assert metric(text, "a2a_gate_facilitator_seconds_count", call="verify") == 2
    assert metric(text, "a2a_gate_settle_failures_total") == 1
    assert metric(text, "a2a_gate_reconciler_backlog") == 1
    assert metric(text, "a2a_gate_claims_in_flight") == 0


def test_health_and_readiness(paid):
    assert httpx.get(f"{paid.gate.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{paid.gate.url}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "database": "ok", "facilitator": "ok"}


def test_readiness_fails_when_the_facilitator_is_unreachable(tmp_path, start_gate, write_config):
    port = free_port()
    gate = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}")), port=port
    )
    ready = httpx.get(f"{gate.url}/readyz")
    assert ready.status_code == 503
    assert ready.json()["facilitator"].startswith("unavailable")


def test_json_log_lines_name_the_request_and_never_the_token(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    gate = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port}", facilitator)), port=port, extra_args=["--log-json"]
    )
    payer = Payer()
    header = payer.header_for(gate.url)
    httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"), headers=header, timeout=30)
    gate.stop()
    lines = [json.loads(line) for line in gate.log.read_text().splitlines() if line.startswith("{")]
    requests = [line for line in lines if line["logger"] == "a2a_gate.requests"]
    paid_line = next(line for line in requests if line["outcome"] == "paid")
    assert paid_line["agent"] == "paid" and paid_line["method"] == "message/send"
    assert paid_line["payer"] == payer.address.lower() and paid_line["latency_ms"] > 0
    assert header["PAYMENT-SIGNATURE"] not in gate.log.read_text()


def test_payments_command_lists_the_log(paid):
    paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url))
    out = subprocess.run(
        [sys.executable, "-m", "gate.cli", "payments", "--config", str(paid.gate.config), "--action", "settle"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "\tsettle\tpaid\t0x" in out and "\t1000\t0x" in out
