"""An agent's execution deadline is enforced for every backend, not only upstream ones.

The payment window a token must leave (DESIGN 4.7) is the agent's deadline plus the
settle budget: that promise holds only if no agent outlives its deadline. A paid
python agent that runs past it fails its task, uncharged, and its claim is released.
"""

from __future__ import annotations

import time

import httpx

from tests.support.gate_helpers import bearer, create_key, result, v03_message
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, Payer, paid_config, send_body

DEADLINE_AGENTS = f"""
[agents.paid-tight]
backend = "python"
callable = "tests.support.agents:slow"
deadline_seconds = 1
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""

FREE_TIGHT = """
public_url = "http://gate.example"
database = "gate.db"

[agents.tight]
backend = "python"
callable = "tests.support.agents:slow"
deadline_seconds = 1
"""


def test_a_paid_agent_past_its_deadline_fails_uncharged(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator) + DEADLINE_AGENTS), port=port)
    payer = Payer()
    started = time.monotonic()
    answer = httpx.post(
        f"{gate.url}/a2a/paid-tight",
        json=send_body("sleep 8"),
        headers=payer.header_for(gate.url, "paid-tight"),
        timeout=30,
    )
    elapsed = time.monotonic() - started
    task = answer.json()["result"]
    assert task["status"]["state"] == "failed", task
    assert "deadline" in task["status"]["message"]["parts"][0]["text"]
    assert elapsed < 6, f"the agent ran {elapsed:.1f}s past a 1s deadline"
    assert not task.get("artifacts")
    ledger = httpx.get(f"{facilitator}/dev/ledger").json()
    assert ledger["settle_calls"] == 0, ledger
    # within its deadline the same agent delivers and is charged once
    quick = httpx.post(
        f"{gate.url}/a2a/paid-tight",
        json=send_body("sleep 0.1"),
        headers=payer.header_for(gate.url, "paid-tight"),
        timeout=30,
    )
    assert quick.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"


def test_a_free_agent_past_its_deadline_fails(tmp_path, start_gate, write_config):
    config = write_config(FREE_TIGHT)
    key = create_key(config, "ops", ["tight"])
    gate = start_gate(config)
    task = result(f"{gate.url}/a2a/tight", "message/send", {"message": v03_message("sleep 8")}, headers=bearer(key))
    assert task["status"]["state"] == "failed"
    assert "deadline" in task["status"]["message"]["parts"][0]["text"]
