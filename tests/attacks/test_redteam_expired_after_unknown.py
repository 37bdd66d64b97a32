"""A settle that may have landed is never written off because the token expired since.

A withholding agent delivers; its settle reaches the facilitator, which settles on chain (the
transfer to payTo lands) but answers too late: the gate's attempt times out, "unknown", and the
claim stays owed (`settle_unknown`). The next pass comes after the authorization's `validBefore`
(an outage of some minutes, the reconciler's backoff). The facilitator then refuses the settle as
expired: x402 checks `validBefore` before the nonce, so it never says "nonce already used". The
transfer did land: the payer paid. An expiry heard after an attempt whose answer was lost is not
a verdict on that attempt; the gate must ask the chain (which knows the transaction) and record
`settled`, and the withheld answer must reach the payer.

A real gate process (SQLite) and the development facilitator, whose chain answers at `/rpc`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from devnet.chain import DEV_NETWORK
from devnet.payer import encode_header, sign_payment
from tests.support.chain_moves import transfers_to
from tests.support.gate_helpers import cli
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, decode_header, paid_config, send_body

WITHHOLDING = f"""
[agents.withheld]
backend = "python"
callable = "tests.support.agents:slow"
on_settle_failure = "withhold"
deadline_seconds = 2
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""
ANSWER = "slept 0.2"
# the window this agent needs: deadline 2 + one settle attempt (1.5 s + 2 s for a slot) + margin 6
WINDOW = 2 + 1.5 + 2 + 6 + 2


def short_lived_token(paid: PaidSetup, payer: Payer) -> dict:
    """A token that leaves the agent just the window it asks for (validBefore = now + WINDOW)."""
    response = httpx.post(f"{paid.gate.url}/a2a/withheld", json=send_body("price?"), timeout=10)
    required = decode_header(response.headers["PAYMENT-REQUIRED"])
    for offer in required["accepts"]:
        offer["maxTimeoutSeconds"] = int(WINDOW)
    return sign_payment(required, payer.key)


def test_an_expiry_heard_after_a_lost_settle_answer_is_checked_on_chain(
    tmp_path: Path, facilitator: str, start_gate, write_config
) -> None:
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator) + WITHHOLDING
    config = config.replace("settle_attempts = 3", "settle_attempts = 1\nsettle_passes = 100")
    config += f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    paid = PaidSetup(
        gate=start_gate(write_config(config), port=port), facilitator_url=facilitator, db_path=tmp_path / "gate.db"
    )
    payer = Payer()
    token = short_lived_token(paid, payer)
    headers = {"PAYMENT-SIGNATURE": encode_header(token)}
    valid_before = int(token["payload"]["authorization"]["validBefore"])

    paid.faults(settle="late:3", count=1)  # settles on chain, answers after the gate gave up
    first = paid.post("withheld", send_body("sleep 0.2"), headers).json()["result"]
    assert first["status"]["state"] == "failed", first  # withheld: the settle answer was lost
    assert paid.claim_states() == ["settle_failed"]
    assert len(transfers_to(facilitator, PAY_TO)) == 1  # ... but the transfer landed

    time.sleep(max(0.0, valid_before - 5 - time.time()))  # the facilitator now calls it expired
    cli("reconcile", "--config", str(paid.gate.config))

    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": first["id"]}}
    fetched = paid.post("withheld", get, headers).json()["result"]
    actions = [r["action"] for r in paid.payment_rows() if r["action"] not in ("replay", "verify")]
    observed = {
        "claim": paid.claim_states(),
        "transfers_to_pay_to": len(transfers_to(facilitator, PAY_TO)),
        "payer_sees_the_answer": ANSWER in json.dumps(fetched),
        "actions": actions,
    }
    assert observed == {
        "claim": ["settled"],
        "transfers_to_pay_to": 1,
        "payer_sees_the_answer": True,
        "actions": ["settle_failed", "settle"],
    }, f"observed {observed}; last error {paid.payment_rows()[-1]['error']!r}"
