"""Offers that name no facilitator address, through real `a2a-gate serve` processes.

A `batch-settlement` offer without `receiver_authorizer` and an `upto` price without
`facilitator_address` take the addresses the facilitator's `/supported` advertises: the
development facilitator's, read at start. The x402 package's own channel client then pays from a
channel naming that authorizer and `a2a-gate channels claim` claims it (the facilitator signs the
claim for the key it advertised). A facilitator that is down at start: the waiting offers are
withheld (the 402 lists the others, an agent with no other answers 501) until it answers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sqlite3
import time
from pathlib import Path

import httpx
from x402.http.clients import x402_httpx_transport

from gate.config import DEV_FACILITATOR_ADDRESS, DEV_RECEIVER_AUTHORIZER
from tests.devnet.test_channels_devnet import ROOT, Devnet, fresh_client
from tests.support.channel_facilitator import RECEIVER_AUTHORIZER, ChannelChain, create_app
from tests.support.channels import assert_charged_in_turn
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, decode_header, send_body
from tests.support.serve import serve_app

PRICE = 1000
METERED = """
[agents.metered-left-to-facilitator]
description = "the echo, priced by usage"
price = { scheme = "upto", network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", ceiling = "50000", usage = { unit = "characters", unit_price = "10" } }
"""


def shipped_without_addresses(tmp_path: Path, facilitator_port: int) -> Path:
    """The shipped configuration, its paid-channel offer naming no receiver authorizer, plus an
    upto price naming no facilitator address."""
    text = (ROOT / "config" / "a2a-gate.example.toml").read_text()
    named = f'receiver_authorizer = "{DEV_RECEIVER_AUTHORIZER}", '
    assert text.count(named) == 1
    text = text.replace(named, "")
    text = text.replace('url = "http://127.0.0.1:8402"', f'url = "http://127.0.0.1:{facilitator_port}"')
    text = text.replace('database = "a2a-gate.db"', f'database = "{tmp_path / "gate.db"}"')
    config = tmp_path / "gate.toml"
    config.write_text(text + METERED)
    return config


def offered(gate_url: str, agent: str) -> list[dict[str, object]]:
    answer = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"))
    assert answer.status_code == 402, answer.text
    return list(decode_header(answer.headers["PAYMENT-REQUIRED"])["accepts"])


def test_offers_naming_no_address_take_the_facilitators_and_a_channel_pays_and_is_claimed(tmp_path: Path) -> None:
    port, facilitator_port = free_port(), free_port()
    config = shipped_without_addresses(tmp_path, facilitator_port)
    with GateProcess(
        config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
    ) as gate:
        devnet = Devnet(gate, f"http://127.0.0.1:{facilitator_port}", config)
        accepts = offered(gate.url, "paid-channel")
        assert [a["scheme"] for a in accepts] == ["exact", "batch-settlement"]
        assert accepts[1]["extra"]["receiverAuthorizer"] == DEV_RECEIVER_AUTHORIZER  # type: ignore[index]
        (metered,) = offered(gate.url, "metered-left-to-facilitator")
        assert metered["extra"]["facilitatorAddress"] == DEV_FACILITATOR_ADDRESS  # type: ignore[index]

        client = fresh_client(devnet)

        async def pay() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
                return [await http.post(f"{gate.url}/a2a/paid-channel", json=send_body(f"hi {i}")) for i in range(5)]

        answers = asyncio.run(pay())
        channel_id = assert_charged_in_turn(answers, PRICE)["extra"]["channelState"]["channelId"]
        done = devnet.cli("channels", "claim")
        assert done.returncode == 0, done.stdout + done.stderr
        assert devnet.channel(channel_id)[1] == 5 * PRICE  # the facilitator countersigned for its advertised key
        log = (tmp_path / "serve.log").read_text()
        assert "withheld" not in log, log[-3000:]


CHANNEL_ONLY = """
public_url = "http://127.0.0.1:{port}"
database = "{database}"
reconcile_interval_seconds = 1

[limits]
per_ip_per_minute = 100000
per_agent_per_minute = 100000

[facilitator]
url = "http://127.0.0.1:{facilitator_port}"
timeout_seconds = 2

[networks."eip155:84532"]  # channel offers need the chain watched for withdrawals
rpc_url = "http://127.0.0.1:{facilitator_port}/rpc"

[agents.mixed]
description = "per request, or from a channel"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}", accepts = [
  {{ scheme = "exact" }},
  {{ scheme = "batch-settlement", min_deposit = "20000" }},
] }}

[agents.channel-only]
description = "from a channel only"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}", scheme = "batch-settlement" }}
"""


def channel_only_config(tmp_path: Path) -> tuple[Path, int, int]:
    """CHANNEL_ONLY for a gate port and a facilitator port nothing listens on yet."""
    port, facilitator_port = free_port(), free_port()
    config = tmp_path / "gate.toml"
    config.write_text(
        CHANNEL_ONLY.format(
            port=port, database=tmp_path / "gate.db", facilitator_port=facilitator_port, asset=ASSET, pay_to=PAY_TO
        )
    )
    return config, port, facilitator_port


def test_offers_waiting_for_a_facilitator_down_at_start_are_withheld_until_it_answers(tmp_path: Path) -> None:
    config, port, facilitator_port = channel_only_config(tmp_path)
    with GateProcess(config, tmp_path / "serve.log", port=port) as gate:
        # nothing listens on the facilitator's port yet: what waits for it is not offered
        assert [a["scheme"] for a in offered(gate.url, "mixed")] == ["exact"]
        waiting = httpx.post(f"{gate.url}/a2a/channel-only", json=send_body("price?"))
        assert waiting.status_code == 501 and "not available" in waiting.text
        card = httpx.get(f"{gate.url}/a2a/mixed/.well-known/agent-card.json").json()
        listed = [a["scheme"] for e in card["capabilities"]["extensions"] for a in e["params"]["accepts"]]
        assert listed and set(listed) == {"exact"}
        # readiness says what waits, and does not decide on it; the gauge counts the offers withheld
        ready = httpx.get(f"{gate.url}/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["offers"] == (
            "withheld until the facilitator's /supported lists batch-settlement receiverAuthorizer"
        )
        assert "a2a_gate_offers_withheld 2.0" in httpx.get(f"{gate.url}/metrics").text
        # the facilitator comes up on its port: within a reconcile interval or two, both are offered
        with serve_app(create_app(ChannelChain()), port=facilitator_port, wait_on_exit=False):
            deadline = time.monotonic() + 15
            while len(accepts := offered(gate.url, "mixed")) < 2:
                assert time.monotonic() < deadline, accepts
                time.sleep(0.2)
            assert accepts[1]["extra"]["receiverAuthorizer"] == RECEIVER_AUTHORIZER  # type: ignore[index]
            (only,) = offered(gate.url, "channel-only")
            assert only["extra"]["receiverAuthorizer"] == RECEIVER_AUTHORIZER  # type: ignore[index]
            assert httpx.get(f"{gate.url}/readyz").json()["offers"] == "ok"
            assert "a2a_gate_offers_withheld 0.0" in httpx.get(f"{gate.url}/metrics").text
        log = (tmp_path / "serve.log").read_text()
        assert re.search(r"/supported did not answer .*withheld", log), log[-3000:]


def test_a_token_for_a_withheld_offer_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A client holding an old 402 pays the waiting offer anyway: no offer matches it, nothing is claimed."""
    config, port, _ = channel_only_config(tmp_path)
    accepted = {
        "scheme": "batch-settlement",
        "network": "eip155:84532",
        "amount": "1000",
        "asset": ASSET,
        "payTo": PAY_TO,
        "maxTimeoutSeconds": 300,
        "extra": {"name": "USDC", "version": "2", "receiverAuthorizer": RECEIVER_AUTHORIZER, "withdrawDelay": 900},
    }
    token = {"x402Version": 2, "accepted": accepted, "payload": {"type": "voucher"}, "resource": {"url": ""}}
    with GateProcess(config, tmp_path / "serve.log", port=port) as gate:
        answer = httpx.post(
            f"{gate.url}/a2a/mixed",
            json=send_body("pay"),
            headers={"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(token).encode()).decode()},
        )
        assert answer.status_code == 403 and "accepted_requirements_mismatch" in answer.text, answer.text
    with sqlite3.connect(tmp_path / "gate.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)
