"""SIGTERM drains: requests stop, running work gets `[http] drain_seconds` to finish, and
what is still undelivered then is stopped and released uncharged at once (not a lease later)."""

from __future__ import annotations

import time

from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body

DRAIN = "[http]\ndrain_seconds = 1\n"


def test_sigterm_stops_undelivered_work_and_releases_its_claim_uncharged(tmp_path, facilitator, write_config):
    port = free_port()
    # a long lease: without the drain's release the claim would stay "running" for minutes
    config = write_config("claim_lease_seconds = 300\n" + paid_config(f"http://127.0.0.1:{port}", facilitator) + DRAIN)
    gate = GateProcess(config, tmp_path / "gate.log", port=port).start()
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    headers = Payer().header_for(gate.url, "paid-slow")
    task = paid.post("paid-slow", send_body("sleep 30", blocking=False), headers).json()["result"]
    wait_for(lambda: paid.claim_states() == ["running"])

    started = time.monotonic()
    gate.stop()  # SIGTERM
    assert gate.process is not None and gate.process.returncode == 143  # a graceful exit on SIGTERM
    assert time.monotonic() - started < 10  # the drain, not the 30 s of work

    assert paid.claim_states() == []  # released by the drain, not left for a lease
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
    assert paid.ledger()["settle_calls"] == 0
    gate.start()
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
        after = paid.post("paid-slow", body, headers).json()["result"]
        assert after["status"]["state"] == "canceled"
        assert "shutdown" in after["status"]["message"]["parts"][0]["text"]
        retry = paid.post("paid-slow", send_body("sleep 0.1"), headers)  # the token was not spent
        assert retry.json()["result"]["status"]["state"] == "completed"
    finally:
        gate.stop()
