"""Payment channels (x402 `batch-settlement`) through real `a2a-gate serve` processes.

The payer is the x402 package's own `BatchSettlementEvmScheme` client on an `x402Client`,
through the package's httpx transport, unchanged, with a fresh key: it reads the 402, deposits
once, then signs one cumulative voucher per request and follows the receipts. The facilitator
is `tests.support.channel_facilitator` (the binding's rules over an in-memory contract).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner

from tests.support.channel_facilitator import RECEIVER_AUTHORIZER, ChannelChain, create_app
from tests.support.channels import assert_charged_in_turn, receipt_of
from tests.support.gate_process import GateProcess
from tests.support.paid import ASSET, PAY_TO, decode_header, send_body
from tests.support.serve import serve_app

PRICE = 1000
CONFIG = """
public_url = "{public_url}"
database = "{database}"
reconcile_interval_seconds = 3600

[limits]
per_ip_per_minute = 100000
per_agent_per_minute = 100000

[facilitator]
url = "{facilitator}"
timeout_seconds = 2
settle_attempts = 2
settle_backoff_seconds = 0.05

[channels]
accept_unwatched_withdrawals = true  # the in-memory chain has no JSON-RPC to watch

[agents.paid-channel]
description = "echo, per request or from a channel"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}", accepts = [
  {{ scheme = "exact" }},
  {{ scheme = "batch-settlement", receiver_authorizer = "{authorizer}", min_deposit = "20000" }},
] }}

[agents.paid-channel-double]
description = "echo at twice the price, to the same payTo: the same channel"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "{double}", pay_to = "{pay_to}", scheme = "batch-settlement", receiver_authorizer = "{authorizer}", min_deposit = "20000" }}

[agents.channel-slow]
backend = "python"
callable = "tests.support.agents:slow"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}", scheme = "batch-settlement", receiver_authorizer = "{authorizer}", min_deposit = "20000" }}

[agents.channel-broken]
backend = "python"
callable = "tests.support.agents:broken"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}", scheme = "batch-settlement", receiver_authorizer = "{authorizer}" }}
"""


@pytest.fixture
def chain() -> ChannelChain:
    return ChannelChain()


@pytest.fixture
def facilitator(chain: ChannelChain) -> Iterator[str]:
    with serve_app(create_app(chain), wait_on_exit=False) as url:
        yield url


def write_config(tmp_path: Path, facilitator: str, port: int, database: str = "gate.db") -> Path:
    config = tmp_path / "gate.toml"
    config.write_text(
        CONFIG.format(
            public_url=f"http://127.0.0.1:{port}",
            database=database,
            facilitator=facilitator,
            asset=ASSET,
            price=PRICE,
            double=2 * PRICE,
            pay_to=PAY_TO,
            authorizer=RECEIVER_AUTHORIZER,
        )
    )
    return config


@pytest.fixture
def gate(tmp_path: Path, facilitator: str) -> Iterator[GateProcess]:
    from tests.support.gate_process import free_port

    port = free_port()
    with GateProcess(write_config(tmp_path, facilitator, port), tmp_path / "gate.log", port=port) as process:
        yield process


def channel_client() -> tuple[x402Client, BatchSettlementEvmScheme]:
    scheme = BatchSettlementEvmScheme(EthAccountSigner(Account.create()))
    return x402Client().register("eip155:84532", scheme), scheme


def channel_rows(database: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(database)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM channels")]
    finally:
        conn.close()


def test_the_402_offers_batch_settlement_beside_exact_with_the_bindings_extra(gate: GateProcess) -> None:
    answer = httpx.post(f"{gate.url}/a2a/paid-channel", json=send_body("price?"))
    assert answer.status_code == 402
    document = decode_header(answer.headers["PAYMENT-REQUIRED"])
    assert [a["scheme"] for a in document["accepts"]] == ["exact", "batch-settlement"]
    channel = document["accepts"][1]
    assert channel["extra"] == {
        "name": "USDC",
        "version": "2",
        "receiverAuthorizer": RECEIVER_AUTHORIZER,
        "withdrawDelay": 900,
        "minDeposit": "20000",
    }
    assert channel["amount"] == str(PRICE) and channel["payTo"] == PAY_TO
    card = httpx.get(f"{gate.url}/a2a/paid-channel/.well-known/agent-card.json").json()
    offered = [e["params"]["accepts"] for e in card["capabilities"]["extensions"]]
    assert offered and all([a["scheme"] for a in accepts] == ["exact", "batch-settlement"] for accepts in offered)


async def pay_many(url: str, count: int, client: x402Client, method: str = "message/send") -> list[httpx.Response]:
    answers = []
    async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
        for i in range(count):
            answers.append(await http.post(url, json=send_body(f"hello {i}", method=method)))
    return answers


def test_the_package_client_pays_a_hundred_requests_from_one_channel(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    client, _ = channel_client()
    answers = asyncio.run(pay_many(f"{gate.url}/a2a/paid-channel", 100, client))
    assert_charged_in_turn(answers, PRICE)
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == 100 * PRICE == int(row["voucher_max"])
    assert row["sealed_voucher"] and not re.search("[0-9a-fA-F]{130}", json.dumps(row))  # sealed, never in plain
    # a deposit every 20 requests (min_deposit), each verified and settled by the facilitator;
    # every other voucher verified by the gate itself
    assert chain.calls["deposit"] == 5
    assert chain.calls["verify"] < 100 / 4


async def pay_with_header(url: str, payload: Any, text: str, client: x402Client) -> httpx.Response:
    from x402.http import x402HTTPClient

    headers = x402HTTPClient(client).encode_payment_signature_header(payload)
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(url, json=send_body(text), headers=headers)


async def first_payload(url: str, client: x402Client) -> Any:
    from x402.http import x402HTTPClient

    async with httpx.AsyncClient(timeout=30) as http:
        asked = await http.post(url, json=send_body("price?"))
    required = x402HTTPClient(client).get_payment_required_response(asked.headers.get, asked.json())
    return required, await client.create_payment_payload(required)


def test_a_voucher_sent_twice_is_one_charge_and_the_same_answer(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    url = f"{gate.url}/a2a/paid-channel"
    client, _ = channel_client()

    async def run() -> tuple[httpx.Response, httpx.Response]:
        _, payload = await first_payload(url, client)
        body = send_body("once")
        from x402.http import x402HTTPClient

        headers = x402HTTPClient(client).encode_payment_signature_header(payload)
        async with httpx.AsyncClient(timeout=30) as http:
            first = await http.post(url, json=body, headers=headers)
            again = await http.post(url, json=body, headers=headers)
        return first, again

    first, again = asyncio.run(run())
    assert first.status_code == again.status_code == 200
    assert again.headers.get("X-Idempotent-Replay") == "true"
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert receipt_of(again) == receipt_of(first)
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == PRICE
    assert chain.calls["deposit"] == 1


def test_failed_work_is_not_charged_and_frees_the_channel(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    client, _ = channel_client()
    answers = asyncio.run(pay_many(f"{gate.url}/a2a/channel-broken", 2, client))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["status"]["state"] == "failed"
        assert "PAYMENT-RESPONSE" not in answer.headers
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == 0 and row["sealed_voucher"] == ""
    assert chain.calls["deposit"] == 0  # the deposit of undelivered work is never settled
    # each failed task is stored as it ended, and its log reads verify, then release
    for answer in answers:
        task_id = answer.json()["result"]["id"]
        (stored,) = gate_rows(tmp_path / "gate.db", "SELECT state FROM tasks WHERE id = ?", (task_id,))
        assert stored["state"] == "failed"
    logged = gate_rows(tmp_path / "gate.db", "SELECT token_digest, action FROM payments ORDER BY id")
    digests = list(dict.fromkeys(r["token_digest"] for r in logged))
    assert len(digests) == 2
    for digest in digests:
        assert [r["action"] for r in logged if r["token_digest"] == digest] == ["verify", "release"]


def test_a_client_behind_the_channel_gets_the_corrective_402_with_the_channel_state(
    gate: GateProcess, tmp_path: Path
) -> None:
    url = f"{gate.url}/a2a/paid-channel"
    key = Account.create()
    first = x402Client().register("eip155:84532", BatchSettlementEvmScheme(EthAccountSigner(key)))
    asyncio.run(pay_many(url, 3, first))
    # the same payer, its local state lost: it signs for charged = 0 again
    again = x402Client().register("eip155:84532", BatchSettlementEvmScheme(EthAccountSigner(key)))

    async def run() -> httpx.Response:
        _, payload = await first_payload(url, again)
        return await pay_with_header(url, payload, "resync?", again)

    answer = asyncio.run(run())
    assert answer.status_code == 402
    document = decode_header(answer.headers["PAYMENT-REQUIRED"])
    assert document["error"] == "invalid_batch_settlement_evm_cumulative_amount_mismatch"
    channel = next(a for a in document["accepts"] if a["scheme"] == "batch-settlement")
    assert channel["extra"]["channelState"]["chargedCumulativeAmount"] == str(3 * PRICE)
    assert channel["extra"]["voucherState"]["signedMaxClaimable"] == str(3 * PRICE)
    # the stored voucher is the payer's own: the package's recovery accepts it as such
    from eth_account.messages import encode_typed_data
    from x402.mechanisms.evm.batch_settlement.constants import VOUCHER_TYPES
    from x402.mechanisms.evm.batch_settlement.utils import coerce_bytes32, get_batch_settlement_eip712_domain

    signable = encode_typed_data(
        domain_data=get_batch_settlement_eip712_domain(84532),
        message_types=VOUCHER_TYPES,
        message_data={
            "channelId": coerce_bytes32(channel["extra"]["channelState"]["channelId"]),
            "maxClaimableAmount": 3 * PRICE,
        },
    )
    signer = Account.recover_message(signable, signature=channel["extra"]["voucherState"]["signature"])
    assert signer == key.address
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == 3 * PRICE


def test_a_voucher_ahead_of_the_channel_is_not_delivered_and_gets_the_corrective_402(
    gate: GateProcess, tmp_path: Path
) -> None:
    """A voucher for more than charged + price (a client that counted a request the gate never
    charged): never delivered, never charged; the 402 tells the client where the channel stands."""
    from x402.mechanisms.evm.batch_settlement.client.config import BatchSettlementEvmSchemeOptions
    from x402.mechanisms.evm.batch_settlement.client.storage import InMemoryClientChannelStorage

    url = f"{gate.url}/a2a/paid-channel"
    storage = InMemoryClientChannelStorage()
    scheme = BatchSettlementEvmScheme(
        EthAccountSigner(Account.create()), BatchSettlementEvmSchemeOptions(storage=storage)
    )
    client = x402Client().register("eip155:84532", scheme)
    asyncio.run(pay_many(url, 2, client))
    required, _ = asyncio.run(first_payload(url, client))
    offer = next(a for a in required.accepts if a.scheme == "batch-settlement")
    key = compute_channel_id(scheme.build_channel_config(offer), "eip155:84532")
    context = storage.get(key)
    assert context is not None
    context.charged_cumulative_amount = str(3 * PRICE)  # one request too many
    storage.set(key, context)

    async def run() -> httpx.Response:
        _, payload = await first_payload(url, client)
        return await pay_with_header(url, payload, "ahead", client)

    answer = asyncio.run(run())
    assert answer.status_code == 402
    document = decode_header(answer.headers["PAYMENT-REQUIRED"])
    channel = next(a for a in document["accepts"] if a["scheme"] == "batch-settlement")
    assert channel["extra"]["channelState"]["chargedCumulativeAmount"] == str(2 * PRICE)
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == 2 * PRICE
    conn = sqlite3.connect(tmp_path / "gate.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM tasks WHERE state = 'completed'").fetchone()[0] == 2
    finally:
        conn.close()


def test_a_voucher_not_signed_by_the_payer_is_refused_locally(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher

    url = f"{gate.url}/a2a/paid-channel"
    client, _ = channel_client()
    asyncio.run(pay_many(url, 1, client))

    async def run() -> httpx.Response:
        _, payload = await first_payload(url, client)
        voucher = payload.payload["voucher"]
        forged = sign_voucher(
            EthAccountSigner(Account.create()), voucher["channelId"], voucher["maxClaimableAmount"], "eip155:84532"
        )
        payload.payload["voucher"]["signature"] = forged.signature
        return await pay_with_header(url, payload, "forged", client)

    verifies = chain.calls["verify"]
    answer = asyncio.run(run())
    assert answer.status_code == 403
    assert answer.json()["error"] == "invalid_batch_settlement_evm_voucher_signature"
    assert chain.calls["verify"] == verifies  # refused by the gate itself
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == PRICE


def mangled(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A channel payload broken in the ways a client (or an attacker) can break it."""
    inner = payload["payload"]
    out = []
    for key in ("channelConfig", "voucher", "type"):
        out.append({**payload, "payload": {k: v for k, v in inner.items() if k != key}})
    out.append({**payload, "payload": {**inner, "extra": 1}})
    out.append({**payload, "payload": {**inner, "type": "refund"}})
    out.append({**payload, "payload": {**inner, "type": 7}})
    out.append({**payload, "payload": {**inner, "voucher": {**inner["voucher"], "maxClaimableAmount": "-1"}}})
    out.append({**payload, "payload": {**inner, "voucher": {**inner["voucher"], "maxClaimableAmount": str(2**128)}}})
    out.append({**payload, "payload": {**inner, "voucher": {**inner["voucher"], "signature": "0x1234"}}})
    out.append({**payload, "payload": {**inner, "voucher": {**inner["voucher"], "channelId": "0x" + "00" * 32}}})
    out.append({**payload, "payload": {**inner, "voucher": "nope"}})
    config = inner["channelConfig"]
    for key, value in (
        ("withdrawDelay", 901),
        ("withdrawDelay", "900"),
        ("salt", "0x12"),
        ("receiver", "0x" + "22" * 20),
    ):
        out.append({**payload, "payload": {**inner, "channelConfig": {**config, key: value}}})
    out.append({**payload, "payload": {**inner, "channelConfig": {**config, "payerAuthorizer": None}}})
    if "deposit" in inner:
        deposit = inner["deposit"]
        out.append({**payload, "payload": {**inner, "deposit": {**deposit, "amount": "1"}}})
        out.append(
            {**payload, "payload": {**inner, "deposit": {**deposit, "authorization": {"permit2Authorization": {}}}}}
        )
        out.append({**payload, "payload": {**inner, "deposit": {"amount": deposit["amount"]}}})
    return out


def test_broken_channel_payloads_are_refused_never_a_500_nor_a_facilitator_call(
    gate: GateProcess, chain: ChannelChain
) -> None:
    url = f"{gate.url}/a2a/paid-channel"
    client, _ = channel_client()

    async def payloads() -> list[dict[str, Any]]:
        _, deposit = await first_payload(url, client)
        return mangled(deposit.model_dump(by_alias=True, exclude_none=True))

    import base64 as b64

    for broken in asyncio.run(payloads()):
        header = b64.b64encode(json.dumps(broken).encode()).decode()
        answer = httpx.post(url, json=send_body("broken"), headers={"PAYMENT-SIGNATURE": header})
        assert answer.status_code == 403, (answer.status_code, answer.text, broken["payload"])
        assert answer.json()["detail"] == "Payment verification failed"
        assert "0x" not in answer.text  # no signature, no address echoed
        assert channel_rows_count(gate) == 0
        assert chain.calls["verify"] == 0, broken["payload"]
    assert chain.calls["verify"] == 0
    assert channel_rows_count(gate) == 0


def channel_rows_count(gate: GateProcess) -> int:
    return len(channel_rows(gate.config.parent / "gate.db"))


def test_an_in_band_voucher_behind_the_channel_answers_payment_failed_with_the_channel_state(
    gate: GateProcess,
) -> None:
    from tests.support.in_band import ACTIVATE, paying_body

    url = f"{gate.url}/a2a/paid-channel"
    key = Account.create()
    first = x402Client().register("eip155:84532", BatchSettlementEvmScheme(EthAccountSigner(key)))
    asyncio.run(pay_many(url, 2, first))
    lost = x402Client().register("eip155:84532", BatchSettlementEvmScheme(EthAccountSigner(key)))
    asked = httpx.post(url, json=send_body("in band"), headers=ACTIVATE).json()["result"]
    assert asked["status"]["state"] == "input-required"

    async def sign() -> dict[str, Any]:
        _, payload = await first_payload(url, lost)
        return payload.model_dump(by_alias=True, exclude_none=True)

    answer = httpx.post(url, json=paying_body("paying", asked["id"], asyncio.run(sign())), headers=ACTIVATE)
    task = answer.json()["result"]
    metadata = task["status"]["message"]["metadata"]
    assert metadata["x402.payment.status"] == "payment-failed"
    assert [a["scheme"] for a in metadata["x402.payment.required"]["accepts"]] == ["exact"]  # what v1 clients sign
    required = metadata["x402.payment.required.v2"]
    assert required["error"] == "invalid_batch_settlement_evm_cumulative_amount_mismatch"
    offer = next(a for a in required["accepts"] if a["scheme"] == "batch-settlement")
    assert offer["extra"]["channelState"]["chargedCumulativeAmount"] == str(2 * PRICE)
    assert task["status"]["state"] == "input-required"  # payable again, once resynced


def test_an_x402_v1_payload_for_a_channel_is_unsupported(gate: GateProcess, chain: ChannelChain) -> None:
    url = f"{gate.url}/a2a/paid-channel"
    client, _ = channel_client()

    async def sign() -> dict[str, Any]:
        _, payload = await first_payload(url, client)
        return payload.model_dump(by_alias=True, exclude_none=True)["payload"]

    v1 = {"x402Version": 1, "scheme": "batch-settlement", "network": "base-sepolia", "payload": asyncio.run(sign())}
    header = base64.b64encode(json.dumps(v1).encode()).decode()
    answer = httpx.post(url, json=send_body("v1"), headers={"X-PAYMENT": header})
    assert (answer.status_code, answer.json()["error"]) == (403, "unsupported_payload")
    assert chain.calls["verify"] == 0


def test_the_schedule_gives_up_on_a_channel_whose_claims_fail_and_the_command_tries_again(
    tmp_path: Path, facilitator: str, chain: ChannelChain
) -> None:
    from tests.support.gate_helpers import cli
    from tests.support.gate_process import free_port

    port = free_port()
    config = write_config(tmp_path, facilitator, port)
    text = config.read_text().replace("settle_attempts = 2", "settle_attempts = 2\nsettle_passes = 2")
    config.write_text(
        text.replace("[channels]\n", "[channels]\nclaim_interval_seconds = 0.2\nclaim_after_seconds = 0.1\n")
    )
    chain.refuse_claims = True
    with GateProcess(config, tmp_path / "gate.log", port=port) as gate:
        client, _ = channel_client()
        asyncio.run(pay_many(f"{gate.url}/a2a/paid-channel", 2, client))
        import time

        deadline = time.monotonic() + 15
        while chain.calls["claim"] < 2:
            assert time.monotonic() < deadline, chain.calls
            time.sleep(0.1)
        time.sleep(2.0)  # passes go on; the channel is no longer claimed by the schedule
        assert chain.calls["claim"] == 2
        conn = sqlite3.connect(tmp_path / "gate.db")
        try:
            actions = [r[0] for r in conn.execute("SELECT action FROM payments WHERE agent = '' ORDER BY id")]
        finally:
            conn.close()
        assert actions == ["channel_claim_failed", "channel_claim_failed", "needs_attention"]
        chain.refuse_claims = False
        done = cli("channels", "claim", "--config", str(config), check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        (row,) = channel_rows(tmp_path / "gate.db")
        assert int(row["total_claimed"]) == int(row["charged"]) == 2 * PRICE and row["claim_failures"] == 0
        (on_chain,) = chain.channels.values()
        assert on_chain.total_claimed == 2 * PRICE


def test_the_claim_command_without_a_facilitator_says_how_to_name_one(tmp_path: Path) -> None:
    from tests.support.gate_helpers import cli

    assert cli("migrate", "--database", str(tmp_path / "gate.db")).returncode == 0
    done = cli("channels", "claim", "--database", str(tmp_path / "gate.db"), check=False)
    assert done.returncode == 2
    assert "--facilitator URL" in done.stderr and "Traceback" not in done.stderr


def gate_rows(database: Path, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    conn = sqlite3.connect(database)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def test_a_voucher_paid_send_is_stored_with_its_delivery_and_its_record(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    """A blocking send's task is written with its delivery (one write: the task, its claim settled,
    the channel charged, the log): each delivered request's task is stored completed with its receipt,
    its claim names it and its payer, and its log reads verify, then settle."""
    client, _ = channel_client()
    answers = asyncio.run(pay_many(f"{gate.url}/a2a/paid-channel", 4, client))
    assert_charged_in_turn(answers, PRICE)
    database = tmp_path / "gate.db"
    for answer in answers:
        task = answer.json()["result"]
        (row,) = gate_rows(database, "SELECT state, document FROM tasks WHERE id = ?", (task["id"],))
        stored = json.loads(row["document"])
        assert row["state"] == stored["status"]["state"] == "completed"
        assert stored["metadata"]["x402.payment.receipts"] == task["metadata"]["x402.payment.receipts"]
        (claim,) = gate_rows(database, "SELECT * FROM claims WHERE task_id = ?", (task["id"],))
        assert claim["state"] == "settled" and claim["payer"].lower() == receipt_of(answer)["payer"].lower()
        actions = gate_rows(
            database, "SELECT action FROM payments WHERE token_digest = ? ORDER BY id", (claim["token_digest"],)
        )
        assert [a["action"] for a in actions] == ["verify", "settle"]


def test_a_vouchers_failed_work_is_stored_and_logged_verify_then_release(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    """A voucher (not a deposit: its task is stored with its delivery) whose work fails: the task is
    stored as it ended, with its verify row, before its claim is released; nothing is charged."""
    client, _ = channel_client()

    async def run() -> tuple[httpx.Response, httpx.Response]:
        (opened,) = await pay_many(f"{gate.url}/a2a/paid-channel", 1, client)
        (failed,) = await pay_many(f"{gate.url}/a2a/channel-broken", 1, client)
        return opened, failed

    opened, failed = asyncio.run(run())
    assert receipt_of(opened)["extra"]["chargedAmount"] == str(PRICE)
    task = failed.json()["result"]
    assert task["status"]["state"] == "failed" and "PAYMENT-RESPONSE" not in failed.headers
    database = tmp_path / "gate.db"
    (stored,) = gate_rows(database, "SELECT state FROM tasks WHERE id = ?", (task["id"],))
    assert stored["state"] == "failed"
    (release,) = gate_rows(database, "SELECT token_digest FROM payments WHERE action = 'release'")
    actions = gate_rows(
        database, "SELECT action FROM payments WHERE token_digest = ? ORDER BY id", (release["token_digest"],)
    )
    assert [a["action"] for a in actions] == ["verify", "release"]
    (row,) = channel_rows(database)
    assert int(row["charged"]) == PRICE and row["reserved_by"] in ("", release["token_digest"])


def test_a_channels_revenue_is_counted_when_its_vouchers_are_claimed(
    tmp_path: Path, facilitator: str, chain: ChannelChain
) -> None:
    """Delivered work charges the channel (`a2a_gate_channel_charged_atomic`); the money is the
    receiver's only once the vouchers are claimed on chain, and that is when it counts as revenue
    (`a2a_gate_revenue_atomic`), exactly the claimed amount, once."""
    from tests.support.gate_process import free_port

    def counted(text: str, name: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(name + "{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    port = free_port()
    config = write_config(tmp_path, facilitator, port)
    schedule = "[channels]\nclaim_interval_seconds = 0.2\nclaim_after_seconds = 500\n"
    config.write_text(config.read_text().replace("[channels]\n", schedule))
    with GateProcess(config, tmp_path / "gate.log", port=port) as gate:
        client, _ = channel_client()
        asyncio.run(pay_many(f"{gate.url}/a2a/paid-channel", 5, client))
        metrics = httpx.get(f"{gate.url}/metrics").text
        assert counted(metrics, "a2a_gate_channel_charged_atomic_total") == 5 * PRICE
        assert counted(metrics, "a2a_gate_revenue_atomic_total") == 0  # charged, not collected yet
        # the schedule claims it now (its oldest charge made old), the same pass the server runs
        conn = sqlite3.connect(tmp_path / "gate.db")
        try:
            with conn:
                conn.execute("UPDATE channels SET first_charged_at = first_charged_at - 7200")
        finally:
            conn.close()
        import time

        deadline = time.monotonic() + 15
        while chain.calls["claim"] < 1:
            assert time.monotonic() < deadline, chain.calls
            time.sleep(0.1)
        time.sleep(1.0)  # later passes find nothing more to claim
        metrics = httpx.get(f"{gate.url}/metrics").text
        assert counted(metrics, "a2a_gate_revenue_atomic_total") == 5 * PRICE
        assert counted(metrics, "a2a_gate_channel_charged_atomic_total") == 5 * PRICE
        assert chain.calls["claim"] == 1
