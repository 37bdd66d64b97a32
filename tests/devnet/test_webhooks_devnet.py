"""Webhooks of real money on the development network: `a2a-gate serve --dev-facilitator PORT` on a copy
of the shipped example with an endpoint (tests/support/webhook_receiver.py) subscribed to settlements,
channel claims and refunds. An `exact` payment, a payment channel claimed by `a2a-gate channels claim`
and refunded by `a2a-gate channels refund` (other processes: the events come from the payment log they
write, not from the serving process's memory) each reach the endpoint, signed, under the id of its log
row, with the amounts the chain moved."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

from devnet.payer import encode_header
from tests.devnet.test_channels_devnet import Devnet
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import Payer, send_body
from tests.support.shipped_config import shipped_config
from tests.support.webhook_receiver import Receiver, documented_check

SECRET = "whsec-devnet-51a7"
WEBHOOKS = """
[webhooks]
timeout_seconds = 1
lease_seconds = 3
backoff_seconds = 0.2
max_backoff_seconds = 1
poll_interval_seconds = 0.2

[[webhooks.endpoints]]
name = "books"
url = "{url}"
events = ["payment.settled", "channel.claimed", "payment.refunded"]
secret_env = "BOOKS_WEBHOOK_SECRET"
"""
EVENTS = {"settle": "payment.settled", "channel_claim": "channel.claimed", "channel_refund": "payment.refunded"}


def test_a_settlement_a_channel_claim_and_a_refund_reach_the_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BOOKS_WEBHOOK_SECRET", SECRET)  # the gate's and the commands' environment
    verified = documented_check()
    with Receiver() as receiver:
        receiver.fail_first = True  # each event refused once: retried
        config = tmp_path / "gate.toml"
        port, facilitator_port = free_port(), free_port()
        config.write_text(shipped_config(tmp_path, facilitator_port) + WEBHOOKS.format(url=receiver.url))
        serve = GateProcess(
            config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
        )
        with serve as gate:
            devnet = Devnet(gate, f"http://127.0.0.1:{facilitator_port}", config)
            token = Payer().token_for(gate.url, "paid-echo")
            headers = {"PAYMENT-SIGNATURE": encode_header(token)}
            answer = httpx.post(f"{gate.url}/a2a/paid-echo", json=send_body("exact"), headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text

            signer = EthAccountSignerWithRPC(Account.create(), rpc_url=f"{devnet.facilitator}/rpc")
            client = x402Client().register("eip155:84532", BatchSettlementEvmScheme(signer))

            async def channel_requests() -> None:
                async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
                    for i in range(3):
                        paid = await http.post(f"{gate.url}/a2a/paid-channel", json=send_body(f"channel {i}"))
                        assert paid.status_code == 200, paid.text

            asyncio.run(channel_requests())
            for command in (("channels", "claim"), ("channels", "refund", "--idle", "0")):
                done = devnet.cli(*command)
                assert done.returncode == 0, done.stdout + done.stderr
            with sqlite3.connect(tmp_path / "gate.db") as conn:
                rows = conn.execute(
                    "SELECT id, action, amount FROM payments WHERE action IN ('settle', 'channel_claim', 'channel_refund')"
                ).fetchall()
            assert {action for _, action, _ in rows} == set(EVENTS)
            expected = {f"log-{row_id}": (EVENTS[action], amount) for row_id, action, amount in rows}
            wait_for(lambda: set(receiver.delivered()) == set(expected), timeout=60)
        for event_id, attempt in receiver.delivered().items():
            assert verified(SECRET, attempt.headers, attempt.body)
            event = json.loads(attempt.body)
            assert (event["type"], event["data"]["amount"]) == expected[event_id]
        claimed = [json.loads(a.body) for a in receiver.delivered().values() if b"channel.claimed" in a.body]
        assert sum(int(e["data"]["amount"]) for e in claimed) == 3000  # the three vouchers, claimed on chain
