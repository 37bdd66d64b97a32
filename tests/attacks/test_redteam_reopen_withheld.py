"""A withheld answer survives `needs_attention`: re-opened and paid, the payer gets it.

A withholding agent delivers; its settle gets no answer (the facilitator fails with HTTP 500) and the
chain cannot be asked (no `rpc_url` for the network yet): `needs_attention`, the answer withheld,
"the sealed payment is kept: once fixed, `a2a-gate reconcile --reopen` puts it back to owed". The
operator re-opens it, the facilitator is back, the settle succeeds: the payer has paid, so the
withheld answer must now be on the task ("it appears if an owed settlement succeeds later").
The answer is kept on the claim until the claim is final; `needs_attention` is not final for the
answer if it can still be re-opened and paid.

A real gate process (SQLite), `a2a-gate reconcile --reopen`, the development facilitator.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks.test_redteam_repriced_owed import paid_task_document
from tests.support.chain_moves import transfers_to
from tests.support.gate_helpers import cli
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body

WITHHOLDING = f"""
[agents.withheld]
backend = "python"
callable = "tests.support.agents:slow"
on_settle_failure = "withhold"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""
ANSWER = "slept 0.2"


def test_a_withheld_answer_re_opened_and_paid_reaches_the_payer(
    tmp_path: Path, facilitator: str, start_gate, write_config
) -> None:
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator) + WITHHOLDING
    config = config.replace("settle_backoff_seconds = 0.05", "settle_backoff_seconds = 0.05\nsettle_passes = 1")
    paid = PaidSetup(
        gate=start_gate(write_config(config), port=port), facilitator_url=facilitator, db_path=tmp_path / "gate.db"
    )
    headers = Payer().header_for(paid.gate.url, "withheld")
    paid.faults(settle="http500")
    first = paid.post("withheld", send_body("sleep 0.2"), headers).json()["result"]
    assert first["status"]["state"] == "failed", first  # withheld
    assert paid.claim_states() == ["needs_attention"]

    paid.faults()  # the facilitator is back
    cli("reconcile", "--config", str(paid.gate.config), "--reopen", first["id"])
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": first["id"]}}
    fetched = paid.post("withheld", get, headers).json()["result"]
    observed = {
        "claim": paid.claim_states(),
        "transfers_to_pay_to": len(transfers_to(facilitator, PAY_TO)),
        "tasks_get": (fetched["status"]["state"], fetched["metadata"]["x402.payment.status"]),
        "tasks_get_shows_the_answer": ANSWER in json.dumps(fetched),
        "stored_task_shows_the_answer": ANSWER in paid_task_document(paid.db_path, first["id"]),
    }
    assert observed == {
        "claim": ["settled"],
        "transfers_to_pay_to": 1,
        "tasks_get": ("completed", "payment-completed"),
        "tasks_get_shows_the_answer": True,
        "stored_task_shows_the_answer": True,
    }, f"observed {observed}; task {json.dumps(fetched)[:600]}"
