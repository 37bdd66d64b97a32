"""Payment channels end to end on the development network, as the README's first command serves them.

`a2a-gate serve --config config/a2a-gate.example.toml --dev-facilitator PORT` (a copy of the
shipped file whose database lives in the test's directory), the `paid-channel` agent, and the
x402 package's own `BatchSettlementEvmScheme` client on an `x402Client`, unchanged, through the
package's httpx transport, with a fresh key the development ledger funds and the package's
`EthAccountSignerWithRPC` on the development chain's `/rpc`. Then `a2a-gate channels claim`:
the settlement contract's claimed total reaches the charged total, and payTo receives exactly it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

from tests.support.channels import assert_charged_in_turn, receipt_of
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, send_body
from tests.support.shipped_config import shipped_config

ROOT = Path(__file__).parents[2]
PRICE = 1000
SETTLEMENT_CONTRACT = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003"


@dataclass
class Devnet:
    gate: GateProcess
    facilitator: str
    config: Path

    def rpc(self, method: str, params: list[Any]) -> Any:
        answer = httpx.post(
            f"{self.facilitator}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        ).json()
        return answer["result"]

    def channel(self, channel_id: str) -> tuple[int, int]:
        """`channels(bytes32)` on the settlement contract: (balance, total claimed)."""
        from eth_utils import keccak

        data = "0x" + keccak(text="channels(bytes32)")[:4].hex() + channel_id.removeprefix("0x")
        word = self.rpc("eth_call", [{"to": SETTLEMENT_CONTRACT, "data": data}, "latest"]).removeprefix("0x")
        return int(word[:64], 16), int(word[64:128], 16)

    def token_balance(self, address: str) -> int:
        data = "0x70a08231" + "00" * 12 + address.lower().removeprefix("0x")
        return int(self.rpc("eth_call", [{"to": ASSET, "data": data}, "latest"]), 16)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gate.cli", *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[Devnet]:
    config = tmp_path / "gate.toml"
    port, facilitator_port = free_port(), free_port()  # two ports of their own (never port + 1)
    config.write_text(shipped_config(tmp_path, facilitator_port))
    process = GateProcess(
        config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
    )
    with process:
        yield Devnet(process, f"http://127.0.0.1:{facilitator_port}", config)


PERMIT2_AGENT = """
[agents.paid-channel-permit2]
description = "Echoes, from a payment channel funded through Permit2"
price = { network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", scheme = "batch-settlement", asset_transfer_method = "permit2", receiver_authorizer = "0xE40b4B07d90d26934b21e6E463a286988E28deeF", min_deposit = "10000" }
"""


@pytest.fixture
def permit2_devnet(tmp_path: Path) -> Iterator[Devnet]:
    """The shipped configuration, with a channel-priced agent whose deposits go through Permit2."""
    config = tmp_path / "gate.toml"
    port, facilitator_port = free_port(), free_port()
    config.write_text(shipped_config(tmp_path, facilitator_port) + PERMIT2_AGENT)
    process = GateProcess(
        config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
    )
    with process:
        yield Devnet(process, f"http://127.0.0.1:{facilitator_port}", config)


def test_a_channel_funded_through_permit2_pays_like_any_other(permit2_devnet: Devnet) -> None:
    """`asset_transfer_method = "permit2"`: the 402 says so (`extra.assetTransferMethod`), the package's
    client deposits through the Permit2 collector, the facilitator settles the deposit, the vouchers
    ride the channel, and the claim pays payTo exactly the charged total."""
    devnet = permit2_devnet
    url = f"{devnet.gate.url}/a2a/paid-channel-permit2"
    asked = httpx.post(url, json=send_body("price?"))
    offer = json.loads(base64.b64decode(asked.headers["PAYMENT-REQUIRED"]))["accepts"][0]
    assert (offer["scheme"], offer["extra"]["assetTransferMethod"]) == ("batch-settlement", "permit2")
    client = fresh_client(devnet)
    pay_to_before = devnet.token_balance(PAY_TO)
    seen: list[dict[str, Any]] = []

    class Recording(httpx.AsyncHTTPTransport):  # what the package's transport sends, payment included
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            signature = request.headers.get("PAYMENT-SIGNATURE")
            if signature:
                seen.append(json.loads(base64.b64decode(signature))["payload"])
            return await super().handle_async_request(request)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client, Recording()), timeout=30) as http:
            return [await http.post(url, json=send_body(f"hello {i}")) for i in range(12)]

    answers = asyncio.run(run())
    channel_id = assert_charged_in_turn(answers, PRICE)["extra"]["channelState"]["channelId"]
    deposits = [p for p in seen if p["type"] == "deposit"]
    assert deposits and all(set(p["deposit"]["authorization"]) == {"permit2Authorization"} for p in deposits)
    assert charged(devnet, channel_id) == 12 * PRICE
    balance, _ = devnet.channel(channel_id)
    assert balance >= 12 * PRICE
    done = devnet.cli("channels", "claim")
    assert done.returncode == 0, done.stdout + done.stderr
    assert devnet.channel(channel_id)[1] == 12 * PRICE
    assert devnet.token_balance(PAY_TO) - pay_to_before == 12 * PRICE


def fresh_client(devnet: Devnet) -> x402Client:
    signer = EthAccountSignerWithRPC(Account.create(), rpc_url=f"{devnet.facilitator}/rpc")
    return x402Client().register("eip155:84532", BatchSettlementEvmScheme(signer))


def test_a_fresh_payer_opens_a_channel_pays_a_hundred_requests_and_the_claim_pays_pay_to(devnet: Devnet) -> None:
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)
    verify_calls_before = httpx.get(f"{devnet.facilitator}/dev/ledger").json()["verify_calls"]
    pay_to_before = devnet.token_balance(PAY_TO)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"hello {i}")) for i in range(100)]

    answers = asyncio.run(run())
    channel_id = assert_charged_in_turn(answers, PRICE)["extra"]["channelState"]["channelId"]
    verify_calls = httpx.get(f"{devnet.facilitator}/dev/ledger").json()["verify_calls"] - verify_calls_before
    assert verify_calls < 100 / 4  # deposits (every ten requests here) and stale mirrors only
    balance, claimed = devnet.channel(channel_id)
    assert balance >= 100 * PRICE and claimed <= 100 * PRICE  # deposited (the schedule may have claimed some)

    done = devnet.cli("channels", "claim")
    assert done.returncode == 0, done.stdout + done.stderr
    assert devnet.channel(channel_id)[1] == 100 * PRICE  # the chain's total claimed is the charged total
    assert devnet.token_balance(PAY_TO) - pay_to_before == 100 * PRICE  # swept to payTo, exactly
    listed = devnet.cli("channels", "list")
    assert channel_id in listed.stdout and f"\t{100 * PRICE}\t{100 * PRICE}\t" in listed.stdout
    rows = devnet.cli("payments", "--action", "channel_claim").stdout
    assert channel_id[:18] in rows
    assert "channel_settle" in devnet.cli("payments", "--action", "channel_settle").stdout


def charged(devnet: Devnet, channel_id: str) -> int:
    import sqlite3

    conn = sqlite3.connect(devnet.config.parent / "gate.db")
    try:
        (row,) = conn.execute("SELECT charged FROM channels WHERE channel_id = ?", (channel_id,)).fetchall()
        return int(row[0])
    finally:
        conn.close()


def final_task(answer: httpx.Response) -> dict[str, Any]:
    """The last Task state an answer carries (a send's result, or a stream's last event)."""
    if answer.headers["content-type"].startswith("text/event-stream"):
        events = [json.loads(line[5:])["result"] for line in answer.text.splitlines() if line.startswith("data:")]
        last = events[-1]
        return last.get("statusUpdate") or last.get("task") or last
    result = answer.json()["result"]
    return result.get("task", result)


STATE_DONE = ("completed", "TASK_STATE_COMPLETED")


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("message/send", {}),
        ("SendMessage", {"A2A-Version": "1.0"}),
        ("message/stream", {}),
        ("SendStreamingMessage", {"A2A-Version": "1.0"}),
    ],
)
def test_every_header_path_pays_from_the_channel(devnet: Devnet, method: str, headers: dict[str, str]) -> None:
    """A stream's receipt rides on its last event (its headers left before the work was done), so
    the package's client resyncs from the corrective 402 before its next voucher: still one
    charge per delivered request."""
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"hi {i}", method=method), headers=headers) for i in range(12)]

    answers = asyncio.run(run())
    channel_id = ""
    for answer in answers:
        assert answer.status_code == 200, answer.text
        task = final_task(answer)
        assert task["status"]["state"] in STATE_DONE
        receipts = task["status"]["message"]["metadata"]["x402.payment.receipts"]
        channel_id = receipts[-1]["extra"]["channelState"]["channelId"]
    assert charged(devnet, channel_id) == 12 * PRICE


async def in_band_pay(
    http: httpx.AsyncClient, url: str, client: x402Client, text: str, method: str, headers: dict[str, str]
) -> dict[str, Any]:
    """The a2a-x402 in-band flow with the package's client: ask, sign the Task's x402 v2 document, pay on
    the task; receipts (and corrective answers) are handed to the client's own payment-response hooks."""
    from x402.http import x402HTTPClient
    from x402.schemas import PaymentRequired

    from tests.support.in_band import ACTIVATE, paying_body

    payments = x402HTTPClient(client)
    asked = final_task(await http.post(url, json=send_body(text, method=method), headers={**ACTIVATE, **headers}))
    for _ in range(2):  # a corrective answer, then the payment it resynced for
        document = asked["status"]["message"]["metadata"]["x402.payment.required.v2"]
        payload = await client.create_payment_payload(PaymentRequired.model_validate(document))
        body = paying_body("paying", asked["id"], payload.model_dump(by_alias=True, exclude_none=True), method=method)
        task = final_task(await http.post(url, json=body, headers={**ACTIVATE, **headers}))
        metadata = task["status"]["message"]["metadata"]
        if metadata["x402.payment.status"] == "payment-completed":
            receipt = base64.b64encode(json.dumps(metadata["x402.payment.receipts"][-1]).encode()).decode()
            await payments.process_payment_result(payload, {"PAYMENT-RESPONSE": receipt}.get, 200)
            return task
        corrective = metadata["x402.payment.required.v2"]  # the channel's state in its offer's extra
        encoded = base64.b64encode(json.dumps(corrective).encode()).decode()
        recovered = await payments.process_payment_result(payload, {"PAYMENT-REQUIRED": encoded}.get, 402)
        assert recovered.recovered, metadata
        asked = task
    raise AssertionError("not paid after a resync")


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("message/send", {}),
        ("SendMessage", {"A2A-Version": "1.0"}),
        ("message/stream", {}),
        ("SendStreamingMessage", {"A2A-Version": "1.0"}),
    ],
)
def test_every_in_band_path_pays_from_the_channel(devnet: Devnet, method: str, headers: dict[str, str]) -> None:
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as http:
            return [await in_band_pay(http, url, client, f"in band {i}", method, headers) for i in range(12)]

    tasks = asyncio.run(run())
    channel_id = ""
    for i, task in enumerate(tasks, start=1):
        assert task["status"]["state"] in STATE_DONE
        receipt = task["status"]["message"]["metadata"]["x402.payment.receipts"][-1]
        assert receipt["extra"]["chargedAmount"] == str(PRICE)
        assert receipt["extra"]["channelState"]["chargedCumulativeAmount"] == str(i * PRICE)
        channel_id = receipt["extra"]["channelState"]["channelId"]
    assert charged(devnet, channel_id) == 12 * PRICE


def test_an_idle_channel_is_refunded_to_its_payer_with_its_vouchers_claimed(devnet: Devnet) -> None:
    url = f"{devnet.gate.url}/a2a/paid-channel"
    key = Account.create()
    signer = EthAccountSignerWithRPC(key, rpc_url=f"{devnet.facilitator}/rpc")
    client = x402Client().register("eip155:84532", BatchSettlementEvmScheme(signer))

    async def run(count: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"then idle {i}")) for i in range(count)]

    pay_to_before = devnet.token_balance(PAY_TO)
    answers = asyncio.run(run(3))
    channel_id = receipt_of(answers[-1])["extra"]["channelState"]["channelId"]
    deposited, _ = devnet.channel(channel_id)
    payer_before = devnet.token_balance(key.address)

    done = devnet.cli("channels", "refund", "--idle", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert devnet.channel(channel_id)[1] == 3 * PRICE  # the vouchers were claimed with the refund
    assert devnet.token_balance(key.address) - payer_before == deposited - 3 * PRICE  # the rest went back
    assert devnet.token_balance(PAY_TO) - pay_to_before == 3 * PRICE  # and what it claimed, to payTo
    assert "channel_refund" in devnet.cli("payments", "--action", "channel_refund").stdout
    assert devnet.cli("channels", "claim").returncode == 0  # nothing left to claim, nothing claimed twice
    assert devnet.channel(channel_id)[1] == 3 * PRICE
    assert devnet.token_balance(PAY_TO) - pay_to_before == 3 * PRICE
    # a voucher on the refunded channel is refused: its money went back (a deposit opens it again)
    again = asyncio.run(run(1))[0]
    assert again.status_code == 403, again.text
    assert again.json()["error"] == "invalid_batch_settlement_evm_cumulative_exceeds_balance"


def test_the_first_readme_command_serves_paid_channel_with_the_dev_facilitators_authorizer(tmp_path: Path) -> None:
    """`a2a-gate serve --dev-facilitator PORT` on the embedded defaults: `paid-channel`'s 402 lists
    batch-settlement beside exact, naming the receiver authorizer the facilitator advertises."""
    port, facilitator_port = free_port(), free_port()  # two ports of their own (never port + 1)
    command = [
        sys.executable,
        "-m",
        "gate.cli",
        "serve",
        "--port",
        str(port),
        "--dev-facilitator",
        str(facilitator_port),
    ]
    with open(tmp_path / "serve.log", "wb") as out:
        serve = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.1)
        answer = httpx.post(f"http://127.0.0.1:{port}/a2a/paid-channel", json=send_body("price?"))
        assert answer.status_code == 402
        document = json.loads(base64.b64decode(answer.headers["PAYMENT-REQUIRED"]))
        assert [a["scheme"] for a in document["accepts"]] == ["exact", "batch-settlement"]
        extra = document["accepts"][1]["extra"]
        assert {"receiverAuthorizer", "withdrawDelay", "name", "version", "minDeposit"} <= set(extra)
        kinds = httpx.get(f"http://127.0.0.1:{facilitator_port}/supported").json()["kinds"]
        advertised = {k["extra"]["receiverAuthorizer"] for k in kinds if k["scheme"] == "batch-settlement"}
        assert extra["receiverAuthorizer"] in advertised
    finally:
        serve.terminate()
        serve.wait(timeout=20)


@pytest.fixture
def devnet_with_chain(tmp_path: Path) -> Iterator[Devnet]:
    """The shipped example, with the development chain's JSON-RPC as the network's ground truth, a
    facilitator timeout of 2 s and a claim pass every second."""
    port, facilitator_port = free_port(), free_port()  # two ports of their own (never port + 1)
    config = tmp_path / "gate.toml"
    config.write_text(shipped_config(tmp_path, facilitator_port, facilitator_timeout=2, claim_interval=1))
    process = GateProcess(
        config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
    )
    with process:
        yield Devnet(process, f"http://127.0.0.1:{facilitator_port}", config)


def test_a_claim_whose_answer_is_lost_is_settled_by_the_chain_never_claimed_twice(devnet_with_chain: Devnet) -> None:
    devnet = devnet_with_chain
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"lost claim {i}")) for i in range(3)]

    pay_to_before = devnet.token_balance(PAY_TO)
    channel_id = receipt_of(asyncio.run(run())[-1])["extra"]["channelState"]["channelId"]
    # the facilitator claims on chain, then answers too late: the gate does not know it landed
    httpx.post(f"{devnet.facilitator}/dev/faults", json={"settle": "late:4", "count": 1}).raise_for_status()
    first = devnet.cli("channels", "claim")
    assert first.returncode == 1 and "outcome=unknown" in first.stdout, first.stdout + first.stderr
    assert devnet.channel(channel_id)[1] == 3 * PRICE  # it did land
    time.sleep(4)  # the claim's retry time and the late answer pass (the serving gate's schedule runs too)
    second = devnet.cli("channels", "claim")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "outcome=claimed" not in second.stdout  # the chain said it landed: no second claim
    assert devnet.channel(channel_id)[1] == 3 * PRICE
    assert devnet.token_balance(PAY_TO) - pay_to_before == 3 * PRICE  # swept once the chain confirmed it
    rows = [r for r in devnet.cli("payments", "--action", "channel_claim").stdout.splitlines()[1:] if r]
    assert len(rows) == 1 and "confirmed on chain" in rows[0], rows


def test_the_gates_own_schedule_claims_the_charged_total_within_a_minute(devnet: Devnet) -> None:
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"scheduled {i}")) for i in range(10)]

    pay_to_before = devnet.token_balance(PAY_TO)
    answers = asyncio.run(run())
    paid = time.monotonic()
    channel_id = receipt_of(answers[-1])["extra"]["channelState"]["channelId"]
    while devnet.channel(channel_id)[1] < 10 * PRICE:
        assert time.monotonic() - paid < 60, "not claimed within a minute"
        time.sleep(1)
    assert devnet.channel(channel_id)[1] == 10 * PRICE
    deadline = time.monotonic() + 10
    while devnet.token_balance(PAY_TO) - pay_to_before < 10 * PRICE and time.monotonic() < deadline:
        time.sleep(0.5)
    assert devnet.token_balance(PAY_TO) - pay_to_before == 10 * PRICE
