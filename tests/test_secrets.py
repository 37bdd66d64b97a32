"""Secrets never leave their slot: no token, signature or API key in the database or logs."""

from __future__ import annotations

import subprocess
import sys

from devnet.payer import encode_header
from tests.support.paid import Payer, send_body


def test_database_and_logs_hold_no_token_signature_or_key(paid):
    made = subprocess.run([sys.executable, "-m", "server.cli", "keys", "--config", str(paid.gate.config), "create",
                           "ops", "--agent", "echo"], capture_output=True, text=True, check=True)
    api_key = made.stdout.split("keep it secret): ")[1].split()[0]
    payer = Payer()
    secrets: list[str] = [api_key]

    def pay(agent: str = "paid", **fault: str) -> dict:
        token = payer.token_for(paid.gate.url, agent)
        header = encode_header(token)
        secrets.extend([header, token["payload"]["signature"], token["payload"]["signature"][2:]])
        if fault:
            paid.faults(**fault)
        answer = paid.post(agent, send_body("hi"), {"PAYMENT-SIGNATURE": header}).json()
        paid.faults()
        return answer

    pay()                                  # settled
    pay(settle="http500")                  # delivered, settle owed (sealed until settled)
    pay(verify="http500")       # verify unavailable
    pay("paid-broken")                     # failed work, released
    forged = payer.token_for(paid.gate.url)
    forged["payload"]["signature"] = forged["payload"]["signature"][:-2] + "00"
    paid.post("paid", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(forged)})
    paid.post("paid", send_body("x"), {"Authorization": f"Bearer {encode_header(forged)}"})
    paid.post("echo", send_body("x"), {"Authorization": f"Bearer {api_key}"})
    paid.post("paid", send_body("x", metadata={"x402.payment.payload": payer.token_for(paid.gate.url)}))
    paid.gate.stop()

    stored = b"".join(p.read_bytes() for p in paid.db_path.parent.glob("gate.db*") if p.is_file())
    log = paid.gate.log.read_text()
    assert "agent=paid" in log and "outcome=paid" in log  # the request log was written
    for secret in secrets:
        assert secret.encode() not in stored, "a secret reached the database"
        assert secret not in log, "a secret reached the log"
