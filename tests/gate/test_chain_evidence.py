"""Chain evidence is a transfer, not a flag.

When the facilitator cannot say whether a settle landed, the gate asks the chain. But
`authorizationState(payer, nonce) == used` is also what the payer gets by canceling the
authorization itself (EIP-3009 `cancelAuthorization`), or by spending the same nonce on
a 1-unit transfer to someone else before the facilitator's settle lands. Neither paid
payTo a thing: such a claim is a terminal write-off, never `settled`, and a withholding
agent's answer stays withheld. The honest case (the settle answer was lost, the transfer
to payTo landed) is still `settled` with the real transaction.

A real gate process in front of the development facilitator, whose simulated chain
answers JSON-RPC at `/rpc` and takes the payer's own transactions at `/dev/chain/...`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devnet.chain import DEV_NETWORK
from devnet.payer import encode_header
from tests.support.chain_moves import cancel, front_run, transfers_to
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body

WITHHOLDING = f"""
[agents.withheld]
backend = "python"
callable = "tests.support.agents:slow"
on_settle_failure = "withhold"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""
ANSWER = "slept 1.5"
SOMEONE_ELSE = "0x1111111111111111111111111111111111111111"


def chain_checking_gate(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    """A gate that asks the devnet chain as soon as the in-request settle attempts give no answer
    (`settle_passes = 1`: the first pass is the cap)."""
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator) + WITHHOLDING
    config = config.replace("settle_backoff_seconds = 0.05", "settle_backoff_seconds = 0.05\nsettle_passes = 1")
    config += f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    gate = start_gate(write_config(config), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def stored_documents(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return json.dumps([r[0] for r in conn.execute("SELECT document FROM tasks")])
    finally:
        conn.close()


def send_and_meanwhile(paid: PaidSetup, agent: str, headers: dict[str, str], act: Callable[[], object]) -> dict:
    """A blocking send of "sleep 1.5"; once it is verified (the agent is working), `act`."""
    answer: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: answer.update(paid.post(agent, send_body("sleep 1.5"), headers).json()))
    sender.start()
    wait_for(lambda: bool(paid.payment_rows("verify")), timeout=15)
    act()
    sender.join(60)
    return answer["result"]


def outcome(paid: PaidSetup, agent: str, headers: dict[str, str], task: dict[str, Any]) -> dict[str, Any]:
    """What the claim, the payment log, the ledger and every surface of the task say."""
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}}
    fetched = paid.post(agent, get, headers).json()["result"]
    actions = [r["action"] for r in paid.payment_rows() if r["action"] != "replay"]
    return {
        "claim": paid.claim_states(),
        "settle_rows": actions.count("settle"),
        "write_off_rows": actions.count("write_off"),
        "transfers_to_pay_to": len(transfers_to(paid.facilitator_url, PAY_TO)),
        "answer": (task["status"]["state"], task["metadata"]["x402.payment.status"]),
        "answer_shows_the_work": ANSWER in json.dumps(task),  # artifacts, history, status message
        "tasks_get_shows_the_work": ANSWER in json.dumps(fetched),
        "answer_stored": ANSWER in stored_documents(paid.db_path),
    }


SPENDS = {
    "canceled by the payer": lambda url, payer, token: cancel(url, payer.key, token, ASSET),
    "front-run to someone else": lambda url, payer, token: front_run(url, payer.key, token, ASSET, SOMEONE_ELSE),
}


@pytest.mark.parametrize("spend", list(SPENDS))
def test_a_nonce_spent_without_paying_pay_to_is_written_off_and_the_answer_stays_withheld(
    tmp_path, facilitator, start_gate, write_config, spend
):
    paid = chain_checking_gate(tmp_path, facilitator, start_gate, write_config)
    payer = Payer()
    token = payer.token_for(paid.gate.url, "withheld")
    headers = {"PAYMENT-SIGNATURE": encode_header(token)}
    paid.faults(settle="http500")  # the settle answer is unknown: the chain decides

    task = send_and_meanwhile(paid, "withheld", headers, lambda: SPENDS[spend](facilitator, payer, token))

    observed = outcome(paid, "withheld", headers, task)
    assert observed == {
        "claim": ["unsettled"],
        "settle_rows": 0,
        "write_off_rows": 1,
        "transfers_to_pay_to": 0,
        "answer": ("failed", "payment-failed"),
        "answer_shows_the_work": False,
        "tasks_get_shows_the_work": False,
        "answer_stored": False,
    }, f"observed {observed}"


def test_a_delivered_answer_whose_nonce_the_payer_spent_elsewhere_is_written_off(
    tmp_path, facilitator, start_gate, write_config
):
    """The default policy delivers before settling: the answer stays, the claim is a write-off."""
    paid = chain_checking_gate(tmp_path, facilitator, start_gate, write_config)
    payer = Payer()
    token = payer.token_for(paid.gate.url, "paid-slow")
    headers = {"PAYMENT-SIGNATURE": encode_header(token)}
    paid.faults(settle="http500")

    task = send_and_meanwhile(
        paid, "paid-slow", headers, lambda: front_run(facilitator, payer.key, token, ASSET, SOMEONE_ELSE)
    )

    observed = outcome(paid, "paid-slow", headers, task)
    assert observed == {
        "claim": ["unsettled"],
        "settle_rows": 0,
        "write_off_rows": 1,
        "transfers_to_pay_to": 0,
        "answer": ("completed", "payment-failed"),
        "answer_shows_the_work": True,
        "tasks_get_shows_the_work": True,
        "answer_stored": True,
    }, f"observed {observed}"


def test_a_lost_settle_answer_whose_transfer_landed_is_settled_with_the_real_transaction(
    tmp_path, facilitator, start_gate, write_config
):
    paid = chain_checking_gate(tmp_path, facilitator, start_gate, write_config)
    headers = Payer().header_for(paid.gate.url, "withheld")
    paid.faults(settle="late:3", count=1)  # the transfer lands now, its answer after the gate's timeout

    task = paid.post("withheld", send_body("sleep 1.5"), headers).json()["result"]

    [transfer] = transfers_to(facilitator, PAY_TO)
    observed = outcome(paid, "withheld", headers, task)
    assert observed == {
        "claim": ["settled"],
        "settle_rows": 1,
        "write_off_rows": 0,
        "transfers_to_pay_to": 1,
        "answer": ("completed", "payment-completed"),
        "answer_shows_the_work": True,
        "tasks_get_shows_the_work": True,
        "answer_stored": True,
    }, f"observed {observed}"
    assert task["metadata"]["x402.payment.receipts"][0]["transaction"] == transfer["tx_hash"]
    assert paid.payment_rows("settle")[0]["transaction"] == transfer["tx_hash"]
