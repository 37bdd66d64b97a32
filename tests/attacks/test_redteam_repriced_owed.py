"""An owed claim is judged by the price its payer signed for, not by today's configuration.

A withholding agent delivers; its settle lands on chain but the answer is lost (the facilitator
answers after the gate gave up), so the claim is owed, `settle_unknown`. Before the reconciler's
pass the operator edits the configuration: the agent's price goes up, or the agent is removed
(renamed, retired). The pass hears "nonce already used" and asks the chain, which shows the
transfer of the signed price (1000) to payTo in the transaction that used the nonce. That is this
claim's payment: `settled`, and the withheld answer reaches the payer. Comparing the transfer with
the price configured now (2000, or nothing) reads it as "front-run or spent elsewhere" and writes
off work the payer paid for.

A real gate process (SQLite), `a2a-gate reconcile` on the edited configuration, and the
development facilitator whose chain answers at `/rpc`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devnet.chain import DEV_NETWORK
from tests.support.chain_moves import transfers_to
from tests.support.gate_helpers import cli
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body

PRICED = """
[agents.withheld]
backend = "python"
callable = "tests.support.agents:slow"
on_settle_failure = "withhold"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "{amount}", pay_to = "{pay_to}" }}
"""
ANSWER = "slept 0.2"


def withholding(amount: str) -> str:
    return PRICED.format(asset=ASSET, amount=amount, pay_to=PAY_TO)


@pytest.mark.parametrize("edit", ["repriced", "removed"])
def test_an_owed_claim_is_checked_against_the_price_it_was_signed_for(
    tmp_path: Path, facilitator: str, start_gate, write_config, edit: str
) -> None:
    port = free_port()
    base = paid_config(f"http://127.0.0.1:{port}", facilitator)
    base = base.replace("settle_attempts = 3", "settle_attempts = 1\nsettle_passes = 100")
    chain = f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    config = write_config(base + withholding("1000") + chain)
    paid = PaidSetup(gate=start_gate(config, port=port), facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    headers = Payer().header_for(paid.gate.url, "withheld")

    paid.faults(settle="late:3", count=1)  # settles on chain, answers after the gate gave up
    first = paid.post("withheld", send_body("sleep 0.2"), headers).json()["result"]
    assert first["status"]["state"] == "failed", first  # withheld, owed
    assert paid.claim_states() == ["settle_failed"]
    assert len(transfers_to(facilitator, PAY_TO)) == 1  # ... the payer paid 1000

    edited = base + (withholding("2000") if edit == "repriced" else "") + chain
    config.write_text(edited)
    cli("reconcile", "--config", str(config))

    rows = [r for r in paid.payment_rows() if r["action"] not in ("replay", "verify")]
    task = json.loads(paid_task_document(paid.db_path, first["id"]))
    observed = {
        "claim": paid.claim_states(),
        "actions": [r["action"] for r in rows],
        "stored_task_shows_the_answer": ANSWER in json.dumps(task),
    }
    assert observed == {
        "claim": ["settled"],
        "actions": ["settle_failed", "settle"],
        "stored_task_shows_the_answer": True,
    }, f"observed {observed}; last error {rows[-1]['error']!r}"


def paid_task_document(db: Path, task_id: str) -> str:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT document FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
    finally:
        conn.close()
