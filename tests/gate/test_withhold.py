"""`on_settle_failure = "withhold"`: settle before the answer leaves; unpaid, it never does.

A real gate process in front of the development facilitator. The paid surface is the
agent's answer ("slept ..."): it must appear nowhere (answer, artifacts, history,
status message, stored task, tasks/get, replays, stream events) unless the work is paid.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import httpx

from tests.support import gate_helpers
from tests.support.gate_helpers import sse_events
from tests.support.gate_process import free_port
from tests.support.paid import (
    ASSET,
    PAY_TO,
    PaidSetup,
    Payer,
    make_poor_after_verify,
    paid_config,
    send_body,
    send_refused_at_settle,
)

WITHHOLDING = f"""
[agents.withheld]
backend = "python"
callable = "tests.support.agents:slow"
on_settle_failure = "withhold"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""
ANSWER = "slept 1.5"


def withholding_gate(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    port = free_port()
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator) + WITHHOLDING), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def stored_documents(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return json.dumps([r[0] for r in conn.execute("SELECT document FROM tasks")])
    finally:
        conn.close()


def assert_no_paid_surface(task: dict) -> None:
    assert task["status"]["state"] == "failed"
    assert task["metadata"]["x402.payment.status"] == "payment-failed"
    assert task["metadata"]["x402.payment.error"] == "invalid_exact_evm_insufficient_balance"
    assert not task.get("artifacts")
    assert [m for m in task.get("history") or [] if m["role"] == "agent"] == []
    assert ANSWER not in json.dumps(task)


def test_withheld_answer_is_delivered_once_paid(tmp_path, facilitator, start_gate, write_config):
    paid = withholding_gate(tmp_path, facilitator, start_gate, write_config)
    task = paid.post("withheld", send_body("sleep 1.5"), Payer().header_for(paid.gate.url, "withheld")).json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert task["artifacts"][0]["parts"][0]["text"] == ANSWER


def test_withheld_stream_sends_the_answer_only_after_the_settlement(tmp_path, facilitator, start_gate, write_config):
    paid = withholding_gate(tmp_path, facilitator, start_gate, write_config)
    headers = Payer().header_for(paid.gate.url, "withheld")
    paid.faults(settle="slow:1", count=1)  # the settlement takes a second to land
    events, settled_when_answer_arrived = [], None
    with httpx.stream(
        "POST",
        f"{paid.gate.url}/a2a/withheld",
        json=send_body("sleep 1.5", method="message/stream"),
        headers=headers,
        timeout=30,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:])["result"])
                if events[-1].get("kind") == "artifact-update":
                    settled_when_answer_arrived = len(paid.ledger()["settlements"])
    assert settled_when_answer_arrived == 1  # the artifact event waited for the settle result
    assert ANSWER not in json.dumps([e for e in events if e.get("kind") != "artifact-update"][:-1])
    assert events[-1]["status"]["state"] == "completed"
    assert events[-1]["metadata"]["x402.payment.status"] == "payment-completed"


def test_refused_settlement_withholds_the_answer_everywhere(tmp_path, facilitator, start_gate, write_config):
    paid = withholding_gate(tmp_path, facilitator, start_gate, write_config)
    payer = Payer()
    headers = payer.header_for(paid.gate.url, "withheld")
    task = send_refused_at_settle(paid, "withheld", "sleep 1.5", headers, tmp_path / "ledger.db", payer)["result"]
    assert_no_paid_surface(task)
    fetched = paid.post(
        "withheld", {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}}, headers
    ).json()["result"]
    assert_no_paid_surface(fetched)
    replay = paid.post("withheld", send_body("sleep 1.5"), headers)
    assert replay.headers["X-Idempotent-Replay"] == "true"
    assert_no_paid_surface(replay.json()["result"])
    assert ANSWER not in stored_documents(paid.db_path)
    assert [r["action"] for r in paid.payment_rows() if r["action"] != "replay"] == ["verify", "write_off"]


def test_refused_settlement_streams_no_artifact(tmp_path, facilitator, start_gate, write_config):
    paid = withholding_gate(tmp_path, facilitator, start_gate, write_config)
    payer = Payer()
    headers = payer.header_for(paid.gate.url, "withheld")
    body: dict = {}

    def stream() -> None:
        with httpx.stream(
            "POST",
            f"{paid.gate.url}/a2a/withheld",
            json=send_body("sleep 1.5", method="message/stream"),
            headers=headers,
            timeout=30,
        ) as response:
            body["text"] = response.read().decode()

    sender = threading.Thread(target=stream)
    sender.start()
    make_poor_after_verify(paid, tmp_path / "ledger.db", payer)
    sender.join(30)
    events = [e["result"] for e in sse_events(body["text"])]
    assert ANSWER not in body["text"]
    assert [e for e in events if e.get("kind") == "artifact-update"] == []
    final = events[-1]
    assert final["final"] is True and final["status"]["state"] == "failed"
    assert final["metadata"]["x402.payment.status"] == "payment-failed"


def test_withheld_answer_appears_when_an_owed_settlement_succeeds_later(
    tmp_path, facilitator, start_gate, write_config
):
    paid = withholding_gate(tmp_path, facilitator, start_gate, write_config)
    headers = Payer().header_for(paid.gate.url, "withheld")
    paid.faults(settle="http500")  # an outage: unknown, owed
    task = paid.post("withheld", send_body("sleep 1.5"), headers).json()["result"]
    assert task["status"]["state"] == "failed"
    assert task["metadata"]["x402.payment.status"] == "payment-failed"
    assert ANSWER not in json.dumps(task) and ANSWER not in stored_documents(paid.db_path)
    paid.faults()  # the facilitator recovers
    # the payer's retry answers from the claim: its next pass is not due, so it spends none
    early = paid.post("withheld", send_body("sleep 1.5"), headers).json()["result"]
    assert early["status"]["state"] == "failed" and ANSWER not in json.dumps(early)
    assert paid.ledger()["settlements"] == []
    gate_helpers.cli("reconcile", "--config", str(paid.gate.config))  # the operator's pass: every owed claim, now
    replay = paid.post("withheld", send_body("sleep 1.5"), headers).json()["result"]
    assert replay["status"]["state"] == "completed"
    assert replay["metadata"]["x402.payment.status"] == "payment-completed"
    assert replay["artifacts"][0]["parts"][0]["text"] == ANSWER
    assert len(paid.ledger()["settlements"]) == 1
