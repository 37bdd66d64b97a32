"""SIGKILL mid-flight: nothing is executed twice, nothing undelivered is charged,
delivered work is settled exactly once after a restart, and no log row is lost."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body


def claim_states(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT state FROM claims")]
    finally:
        conn.close()


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def setup(tmp_path: Path, facilitator: str, write_config) -> PaidSetup:
    port = free_port()
    config = write_config(paid_config(f"http://127.0.0.1:{port}", facilitator, reconcile=0.5))
    gate = GateProcess(config, tmp_path / "gate.log", port=port).start()
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def test_kill_between_delivery_and_settlement_settles_once_after_restart(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url)
        paid.faults(settle="slow:15", count=1)  # the first settle hangs past our kill
        sender = threading.Thread(target=lambda: _swallow(lambda: paid.post("paid", send_body("x"), headers, timeout=10)))
        sender.start()
        wait_for(lambda: claim_states(paid.db_path) == ["settling"])
        paid.gate.kill()
        sender.join()
        assert paid.ledger()["settlements"] == []

        paid.gate.start()  # same database: the claim is owed and the reconciler settles it
        wait_for(lambda: len(paid.ledger()["settlements"]) == 1)
        wait_for(lambda: claim_states(paid.db_path) == ["settled"])
        time.sleep(1.5)  # a few more reconciler passes: still exactly one charge
        assert len(paid.ledger()["settlements"]) == 1
        assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle"]
        task_id = paid.payment_rows("settle")[0]["task_id"]
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task_id}}
        task = paid.post("paid", body, headers).json()["result"]
        assert task["status"]["state"] == "completed"
        assert task["metadata"]["x402.payment.status"] == "payment-completed"
        replay = paid.post("paid", send_body("x"), headers)  # the payer's retry replays, no second charge
        assert replay.headers["X-Idempotent-Replay"] == "true"
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()


def test_claim_left_running_by_a_killed_process_is_released_uncharged(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url, "paid-slow")
        task = paid.post("paid-slow", send_body("sleep 30", blocking=False), headers).json()["result"]
        wait_for(lambda: claim_states(paid.db_path) == ["running"])
        paid.gate.kill()
        paid.gate.start()
        assert claim_states(paid.db_path) == []
        assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
        # the claim is gone, so ownership is proven by the token verifying to the payer again
        after = paid.post("paid-slow", body, headers).json()["result"]
        assert after["status"]["state"] == "failed"
        assert paid.ledger()["settle_calls"] == 0
        retry = paid.post("paid-slow", send_body("sleep 0.1"), headers)  # the payer may use the token again
        assert retry.json()["result"]["status"]["state"] == "completed"
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()


def _swallow(call) -> None:
    try:
        call()
    except Exception:
        pass
