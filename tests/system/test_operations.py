"""What an operator sees: metrics, health, readiness, JSON log lines, the payments command."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PaidView, Payer, paid_config, send_body


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
    # revenue: the one settled request's price, labelled by network and asset only (never an agent)
    revenue = [line for line in text.splitlines() if line.startswith("a2a_gate_revenue_atomic_total")]
    assert revenue == [f'a2a_gate_revenue_atomic_total{{asset="{ASSET}",network="eip155:84532"}} 1000.0']


def test_payments_summary_reports_per_agent_and_day(own_paid):
    import time as clock

    paid, payer = own_paid, Payer()
    for _ in range(2):
        assert paid.post("paid", send_body("x")).status_code == 402
    paid.post("paid", send_body("x"), payer.header_for(paid.gate.url))
    paid.faults(settle="http500")
    paid.post("paid", send_body("y"), payer.header_for(paid.gate.url))
    paid.faults()
    broken = paid.post("paid-broken", send_body("z"), payer.header_for(paid.gate.url, "paid-broken"))
    assert broken.json()["result"]["status"]["state"] == "failed"  # verified, not delivered: released
    paid.gate.stop()  # the 402s are counted in memory and stored at shutdown (or every 10 s)
    out = subprocess.run(
        [sys.executable, "-m", "gate.cli", "payments", "--summary", "--config", str(paid.gate.config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, *rows = out.splitlines()
    assert header.split("\t")[:3] == ["day (UTC)", "agent", "402s"]
    today = clock.strftime("%Y-%m-%d", clock.gmtime())
    line = next(r for r in rows if r.startswith(f"{today}\tpaid\t"))
    row = dict(zip(header.split("\t"), line.split("\t"), strict=True))
    assert row["402s"] == "4"  # the two unpaid sends, and the two 402s the payer read the price from
    assert row["verified"] == "2" and row["settled"] == "1"
    assert row["revenue (atomic units, asset@network)"] == f"1000 {ASSET}@eip155:84532"
    assert int(row["settle failures"]) >= 1 and row["owed"] == "1" and row["written off"] == "0"
    assert row["released"] == "0"
    line = next(r for r in rows if r.startswith(f"{today}\tpaid-broken\t"))
    row = dict(zip(header.split("\t"), line.split("\t"), strict=True))
    assert row["verified"] == "1" and row["released"] == "1" and row["settled"] == "0"


def test_health_and_readiness(paid):
    assert httpx.get(f"{paid.gate.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{paid.gate.url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "database": "ok",
        "facilitator": "ok",
        "facilitator_breaker": "closed",
        "offers": "ok",
    }


def test_readiness_is_the_replicas_own_the_facilitator_only_reported(start_gate, write_config, own_postgres):
    """A facilitator that does not answer leaves the replica ready (its free path serves; its paid
    path answers verify_unavailable itself) and says so in /readyz and the metrics; a store that
    does not answer is what makes it unready."""
    import base64
    import os

    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}")  # a closed port
    text = text.replace('database = "gate.db"', f'database = "{own_postgres.url}"')
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    gate = start_gate(write_config(text), port=port, env={"A2A_GATE_SEALING_KEY": key})
    ready = httpx.get(f"{gate.url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready" and body["database"] == "ok"
    assert body["facilitator"].startswith("unavailable") and body["facilitator_breaker"] == "closed"
    text = httpx.get(f"{gate.url}/metrics").text
    assert metric(text, "a2a_gate_facilitator_reachable") == 0
    assert "a2a_gate_facilitator_breaker_state 0.0" in text
    paid = httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"), headers=Payer().header_for(gate.url), timeout=30)
    assert paid.json()["error"]["data"]["code"] == "verify_unavailable"

    own_postgres.stop()
    unready = httpx.get(f"{gate.url}/readyz", timeout=10)
    assert unready.status_code == 503 and unready.json()["database"].startswith("error")


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
    assert out.splitlines()[0] == "time (UTC)\taction\tagent\tpayer\tamount\tauthorized\ttransaction\terror\ttask"
    assert "\tsettle\tpaid\t0x" in out and "\t1000\t0x" in out
