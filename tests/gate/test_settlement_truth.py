"""Settlement ground truth: every settle answer ends in a state, and money never moves silently.

Real gate processes in front of the development facilitator, whose simulated chain also
answers Ethereum JSON-RPC (`eth_call authorizationState`, `eth_getLogs`) at `/rpc`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from devnet.chain import DEV_NETWORK
from tests.support import gate_helpers
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PaidSetup, Payer, paid_config, send_body, send_refused_at_settle


def gate_with(
    tmp_path: Path, facilitator: str, start_gate, write_config, *, rpc: bool = True, passes: int = 3
) -> PaidSetup:
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator)
    config = config.replace("settle_backoff_seconds = 0.05", f"settle_backoff_seconds = 0.05\nsettle_passes = {passes}")
    if rpc:
        config += f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    gate = start_gate(write_config(config), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def claim_rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM claims")]
    finally:
        conn.close()


def cli(paid: PaidSetup, *args: str) -> str:
    return gate_helpers.cli(*args, "--config", str(paid.gate.config)).stdout


def metric(paid: PaidSetup, name: str) -> float:
    for line in httpx.get(f"{paid.gate.url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_settle_answer_lost_but_transfer_landed_is_settled_from_the_chain(
    tmp_path, facilitator, start_gate, write_config
):
    """Finding 5: the settle times out, the transfer lands; "nonce used" must not loop forever."""
    paid = gate_with(tmp_path, facilitator, start_gate, write_config)
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="late:3", count=1)  # the transfer lands now, its answer after our timeout
    task = paid.post("paid", send_body("landed"), headers).json()["result"]
    [settlement] = paid.ledger()["settlements"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert task["metadata"]["x402.payment.receipts"][0]["transaction"] == settlement["tx_hash"]
    for _ in range(3):  # the payer's retries and reconciler passes change nothing
        replay = paid.post("paid", send_body("landed"), headers)
        assert replay.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert "0 owed settlement(s) attempted" in cli(paid, "reconcile")
    actions = [r["action"] for r in paid.payment_rows() if r["action"] != "replay"]
    assert actions == ["verify", "settle"]
    assert paid.payment_rows("settle")[0]["transaction"] == settlement["tx_hash"]
    assert paid.payment_rows("settle")[0]["error"] == "confirmed on chain"
    assert [c["state"] for c in claim_rows(paid.db_path)] == ["settled"]
    assert len(paid.ledger()["settlements"]) == 1


def test_settle_unknown_without_a_chain_endpoint_needs_attention_once(tmp_path, facilitator, start_gate, write_config):
    paid = gate_with(tmp_path, facilitator, start_gate, write_config, rpc=False)
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="late:3", count=1)
    task = paid.post("paid", send_body("unknown"), headers).json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-verified"
    assert "no rpc_url" in task["metadata"]["x402.payment.error"]
    for _ in range(2):
        paid.post("paid", send_body("unknown"), headers)
    assert "0 owed settlement(s) attempted" in cli(paid, "reconcile")
    assert [r["action"] for r in paid.payment_rows() if r["action"] != "replay"] == ["verify", "needs_attention"]
    assert [c["state"] for c in claim_rows(paid.db_path)] == ["needs_attention"]
    listed = cli(paid, "payments", "--needs-attention")
    assert task["id"] in listed and "needs_attention" in listed and "no rpc_url" in listed
    assert metric(paid, "a2a_gate_claims_needs_attention") == 1


def test_settle_definitively_refused_is_written_off(tmp_path, facilitator, start_gate, write_config):
    """Insufficient funds at settle time: terminal `unsettled`, never retried."""
    paid = gate_with(tmp_path, facilitator, start_gate, write_config)
    payer = Payer()
    headers = payer.header_for(paid.gate.url, "paid-slow")
    # spent elsewhere while the agent works
    task = send_refused_at_settle(paid, "paid-slow", "sleep 1.5", headers, tmp_path / "ledger.db", payer)["result"]
    assert task["status"]["state"] == "completed"  # deliver (the default): the work was delivered
    assert task["metadata"]["x402.payment.status"] == "payment-failed"
    assert task["metadata"]["x402.payment.error"] == "invalid_exact_evm_insufficient_balance"
    settle_calls = paid.ledger()["settle_calls"]
    replay = paid.post("paid-slow", send_body("sleep 1.5"), headers).json()["result"]
    assert replay["metadata"]["x402.payment.status"] == "payment-failed"
    assert "0 owed settlement(s) attempted" in cli(paid, "reconcile")
    assert paid.ledger()["settle_calls"] == settle_calls  # never retried
    assert [r["action"] for r in paid.payment_rows() if r["action"] != "replay"] == ["verify", "write_off"]
    listed = cli(paid, "payments", "--unsettled")
    assert "invalid_exact_evm_insufficient_balance" in listed and task["id"] in listed
    assert metric(paid, "a2a_gate_claims_unsettled") == 1
    assert paid.ledger()["settlements"] == []


def test_owed_settlement_reaching_the_cap_asks_the_chain(tmp_path, facilitator, start_gate, write_config):
    """An outage that outlasts the pass budget: the chain decides, and an authorization it says is
    unused and still valid stays owed (it can still be collected), due again before it expires."""
    paid = gate_with(tmp_path, facilitator, start_gate, write_config, passes=2)
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="http500")
    task = paid.post("paid", send_body("outage"), headers).json()["result"]
    assert task["metadata"]["x402.payment.status"] == "payment-verified"
    owed = gate_helpers.cli("reconcile", "--config", str(paid.gate.config), check=False)
    assert owed.returncode == 1  # still owed after the pass: the operator's to look at
    assert "1 owed settlement(s) attempted: 1 settle_failed" in owed.stdout  # pass 2 = the cap: the chain says unused
    [claim] = claim_rows(paid.db_path)
    assert claim["state"] == "settle_failed"  # not final: the authorization is still valid
    rows = paid.payment_rows()
    assert [r["action"] for r in rows] == ["verify", "settle_failed", "settle_failed"]
    assert "authorization unused, still valid" in rows[-1]["error"]
    assert paid.ledger()["settlements"] == []
    paid.faults()  # the facilitator is back: the next pass collects it
    assert "1 owed settlement(s) attempted" in cli(paid, "reconcile")
    assert [c["state"] for c in claim_rows(paid.db_path)] == ["settled"]
    assert len(paid.ledger()["settlements"]) == 1


def test_lock_held_when_settle_returns_never_turns_a_charge_into_not_charged(
    tmp_path, facilitator, start_gate, write_config
):
    """Finding 4: the database is locked past its busy timeout exactly when the facilitator says "settled"."""
    paid = gate_with(tmp_path, facilitator, start_gate, write_config)
    headers = Payer().header_for(paid.gate.url)
    paid.faults(settle="late:1", count=1)  # the money moves now, the answer comes in a second
    answer: dict = {}
    sender = threading.Thread(
        target=lambda: answer.update(paid.post("paid", send_body("locked"), headers, timeout=60).json())
    )
    sender.start()
    deadline = time.monotonic() + 10
    while not paid.ledger()["settlements"] and time.monotonic() < deadline:
        time.sleep(0.02)
    lock = sqlite3.connect(paid.db_path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # held past the gate's 10 s busy timeout
    time.sleep(12)
    lock.execute("ROLLBACK")
    lock.close()
    sender.join(60)
    task = answer["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-completed"
    assert [c["state"] for c in claim_rows(paid.db_path)] == ["settled"]
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
    stored = paid.post("paid", body, headers).json()["result"]
    assert stored["status"]["state"] == "completed"
    assert stored["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1


@pytest.mark.parametrize("method", ["eth_call", "eth_getLogs"])
def test_dev_chain_answers_json_rpc_for_unknown_authorizations(facilitator, method):
    nonce = "0x" + "ab" * 32
    authorizer = "0x" + "00" * 12 + "11" * 20
    if method == "eth_call":
        params = [{"to": ASSET, "data": "0xe94a0102" + authorizer[2:] + nonce[2:]}, "latest"]
        expected = "0x" + "00" * 32
    else:
        from devnet.chain import AUTHORIZATION_USED_TOPIC

        params = [{"address": ASSET, "topics": [AUTHORIZATION_USED_TOPIC, authorizer, nonce]}]
        expected = []
    doc = httpx.post(f"{facilitator}/rpc", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).json()
    assert doc == {"jsonrpc": "2.0", "id": 7, "result": expected}
