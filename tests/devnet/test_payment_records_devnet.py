"""Payment records and exports of real payments: free, `exact`, `upto` and a payment channel.

`a2a-gate serve --dev-facilitator PORT` on a copy of the shipped example, paid by the x402 package's
own clients (exact, upto, batch-settlement) through its httpx transport, then `a2a-gate channels
claim`. `a2a-gate payments records` and `payments export` (CSV and JSON) must show each payment with
the amounts the development chain moved to payTo, and nothing the payers sent that is secret: no
token, signature, nonce or API key appears in them.
"""

# ruff: noqa: F811  (the `devnet` fixture, imported, is each test's argument)
from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
from eth_account import Account
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme

from tests.devnet.test_channels_devnet import Devnet, devnet  # noqa: F401  (the fixture)
from tests.support.gate_helpers import KEY_LINE
from tests.support.paid import PAY_TO, send_body

PRICE, CHANNEL_REQUESTS = 1000, 3


def pay(devnet: Devnet, agent: str, client: x402Client, texts: list[str], sent: list[str]) -> list[httpx.Response]:
    """Each text as one paid request to `agent`, through the package's transport; every payment header sent kept."""

    class Recording(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if "PAYMENT-SIGNATURE" in request.headers:
                sent.append(request.headers["PAYMENT-SIGNATURE"])
            return await super().handle_async_request(request)

    async def run() -> list[httpx.Response]:
        transport = x402_httpx_transport(client, Recording())
        async with httpx.AsyncClient(transport=transport, timeout=30) as http:
            return [await http.post(f"{devnet.gate.url}/a2a/{agent}", json=send_body(text)) for text in texts]

    answers = asyncio.run(run())
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["status"]["state"] == "completed", answer.text
    return answers


def pay_each_way(
    devnet: Devnet, keys: tuple[Any, Any, Any], vouchers: int, sent: list[str]
) -> tuple[httpx.Response, httpx.Response, list[httpx.Response]]:
    """One `exact` payment (`paid-echo`), one `upto` (`paid-metered`) and `vouchers` requests on one
    channel (`paid-channel`), by the x402 package's own clients, one key each (exact, upto, channel)."""
    exact_key, upto_key, channel_key = keys
    exact = x402Client()
    register_exact_evm_client(exact, exact_key)
    (paid,) = pay(devnet, "paid-echo", exact, ["hello, paid"], sent)
    upto = x402Client().register("eip155:*", UptoEvmClientScheme(upto_key))
    (metered,) = pay(devnet, "paid-metered", upto, ["hello, metered world"], sent)
    channel_client = x402Client().register(
        "eip155:84532",
        BatchSettlementEvmScheme(EthAccountSignerWithRPC(channel_key, rpc_url=f"{devnet.facilitator}/rpc")),
    )
    return paid, metered, pay(devnet, "paid-channel", channel_client, [f"voucher {i}" for i in range(vouchers)], sent)


def receipt(answer: httpx.Response) -> dict[str, Any]:
    return json.loads(base64.b64decode(answer.headers["PAYMENT-RESPONSE"]))


def secrets_in(headers: list[str]) -> Iterator[str]:
    """What a payment header holds that must never be shown: the header itself, every signature and nonce."""
    for header in headers:
        yield header
        text = base64.b64decode(header).decode()
        yield from re.findall(r'"(?:signature|nonce)"\s*:\s*"([^"]+)"', text)


def test_every_kind_of_payment_is_a_record_with_the_amounts_the_chain_moved(devnet: Devnet) -> None:
    pay_to_before = devnet.token_balance(PAY_TO)
    created = devnet.cli("keys", "create", "ops", "--agent", "echo")
    key = KEY_LINE.search(created.stdout).group(1)  # type: ignore[union-attr]
    free = httpx.post(f"{devnet.gate.url}/a2a/echo", json=send_body("free"), headers={"Authorization": f"Bearer {key}"})
    assert free.json()["result"]["status"]["state"] == "completed"

    sent: list[str] = []
    exact_key, upto_key, channel_key = Account.create(), Account.create(), Account.create()
    paid, metered, vouchers = pay_each_way(devnet, (exact_key, upto_key, channel_key), CHANNEL_REQUESTS, sent)
    claimed = devnet.cli("channels", "claim")
    assert claimed.returncode == 0, claimed.stdout + claimed.stderr

    charge = int(receipt(metered)["amount"])
    assert 0 < charge < 50000
    moved = devnet.token_balance(PAY_TO) - pay_to_before
    assert moved == PRICE + charge + CHANNEL_REQUESTS * PRICE  # what the development chain moved to payTo

    export = devnet.cli("payments", "export", "--format", "csv", "--since", "1h")
    assert export.returncode == 0, export.stderr
    lines = list(csv.DictReader(io.StringIO(export.stdout)))
    by_agent: dict[str, list[dict[str, str]]] = {}
    for line in lines:
        by_agent.setdefault(line["agent"], []).append(line)
    assert "echo" not in by_agent  # the free path writes no payment
    (exact_row,) = by_agent["paid-echo"]
    assert (exact_row["state"], exact_row["scheme"], exact_row["amount"], exact_row["authorized"]) == (
        "settled",
        "exact",
        "1000",
        "1000",
    )
    assert exact_row["payer"] == exact_key.address.lower() and exact_row["transaction"] == receipt(paid)["transaction"]
    assert exact_row["task_id"] == paid.json()["result"]["id"] and exact_row["settled_at"].endswith("Z")
    (upto_row,) = by_agent["paid-metered"]
    assert (upto_row["state"], upto_row["scheme"], upto_row["amount"], upto_row["authorized"]) == (
        "settled",
        "upto",
        str(charge),
        "50000",
    )
    assert upto_row["transaction"] == receipt(metered)["transaction"]
    channel_rows = by_agent["paid-channel"]
    assert [r["state"] for r in channel_rows] == ["settled"] * CHANNEL_REQUESTS
    assert {r["scheme"] for r in channel_rows} == {"batch-settlement"}
    assert [r["task_id"] for r in channel_rows] == [v.json()["result"]["id"] for v in vouchers]
    channel_id = receipt(vouchers[-1])["extra"]["channelState"]["channelId"]
    assert {r["channel"] for r in channel_rows} == {channel_id[:18]}
    assert all(r["transaction"] and r["transaction"] != channel_rows[0]["payment_id"] for r in channel_rows)
    assert sum(int(line["collected"]) for line in lines) == moved
    assert {(line["asset"], line["network"]) for line in lines} == {
        ("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "eip155:84532")
    }
    assert list(lines[0]) == export.stdout.splitlines()[0].split(",")

    as_json = devnet.cli("payments", "export", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    objects = json.loads(as_json.stdout)
    assert [{k: str(v) for k, v in o.items()} for o in objects] == lines  # the same rows; counts as numbers
    assert {type(o["amount"]) for o in objects} == {str} and {type(o["settle_failures"]) for o in objects} == {int}
    summary = devnet.cli("payments", "export", "--what", "summary", "--format", "json")
    revenue = sum(int(row["revenue"]) for row in json.loads(summary.stdout))
    assert revenue == moved  # the summary counts a channel's charges when delivered; all are claimed here
    listed = devnet.cli("payments", "records", "--agent", "paid-channel", "--state", "settled")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1 + CHANNEL_REQUESTS
    assert devnet.cli("payments", "records", "--state", "owed").stdout.count("\n") == 1  # the header alone
    log = devnet.cli("payments", "--action", "settle")  # the log, as before
    assert log.returncode == 0 and log.stdout.startswith("time (UTC)\taction")

    shown = export.stdout + as_json.stdout + summary.stdout + listed.stdout
    found = [s for s in (key, *secrets_in(sent)) if s and s.lower() in shown.lower()]
    assert sent and found == []
    for account in (exact_key, upto_key, channel_key):
        assert account.key.hex().removeprefix("0x") not in shown
