"""The operator's console end to end: every kind of payment, read back everywhere an operator reads it.

One real `a2a-gate serve --dev-facilitator PORT` on a copy of the shipped example, with the console on
its operations listener behind a token, a webhook endpoint on a real receiver (tests/support/
webhook_receiver.py) and tracing exported over OTLP/HTTP to a collector in this test. It takes a free
call (an API key), a paid `exact` call (the x402 package's own client), a usage-priced `upto` call and
three vouchers on a payment channel (batch-settlement), then `a2a-gate channels claim`.

What the development chain moved is read from the chain itself: every ERC-20 `Transfer` to payTo
(`eth_getLogs`: the exact payment's, the upto charge's, and the sweep of the channel's claimed funds), the
channel's claimed total on the settlement contract (`channels(bytes32)`) and payTo's balance. For the
channel that is three vouchers charged 1000 each, one claim adding 3000 to the claimed total (a transaction
moving nothing to payTo) and one sweep of 3000 to payTo. The same payments, states, amounts and
transactions must be what `a2a-gate payments records`, the console's JSON API, the page in a real Chromium
(its payments table, the revenue chart and the counts), the webhook receiver (each body's signature checked
with the lines docs/operations.md prints) and the CSV export (the command's, and the API's, the same bytes)
say. Then nothing the test sent that is secret (the API key and its digest, each payment header as sent and
decoded, every signature and nonce in them, the payers' private keys, the console token, the webhook
secret) is in any page, API answer, export, webhook body or header, or span the collector received.

The test saves the screenshot docs/operations.md shows: `A2A_GATE_CONSOLE_SCREENSHOT=docs/console.png`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account

from devnet.chain import TRANSFER_TOPIC
from tests.devnet.test_channels_devnet import Devnet
from tests.devnet.test_payment_records_devnet import pay_each_way, receipt, secrets_in
from tests.support.browser import headless_chromium
from tests.support.chain_moves import rpc
from tests.support.gate_helpers import KEY_LINE, wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.otlp_collector import Collector, attributes, collecting
from tests.support.paid import ASSET, PAY_TO, send_body
from tests.support.shipped_config import shipped_config
from tests.support.webhook_receiver import Receiver, documented_check

pytestmark = pytest.mark.system  # a real gate, its development facilitator, a browser, a receiver, a collector

TOKEN_ENV, TOKEN = "A2A_GATE_METRICS_TOKEN", "ops-token-" + os.urandom(12).hex()
WEBHOOK_ENV, WEBHOOK_SECRET = "BOOKS_WEBHOOK_SECRET", "whsec-" + os.urandom(12).hex()
SCREENSHOT = "A2A_GATE_CONSOLE_SCREENSHOT"
PRICE, VOUCHERS = 1000, 3
PAID_AGENTS = ("paid-echo", "paid-metered", "paid-channel")
API_READS = ["records", "summary", "attention", "channels", "rates"]
EXPORTS = [f"export?what={what}&format={fmt}" for what in ("records", "summary") for fmt in ("csv", "json")]

# added to the shipped example: tracing to the collector, webhooks to the receiver
TRACED_AND_HOOKED = """
[tracing]
enabled = true
service_name = "gate-end-to-end"
endpoint = "{collector}"

[webhooks]
backoff_seconds = 0.2
poll_interval_seconds = 0.2

[[webhooks.endpoints]]
name = "books"
url = "{receiver}"
events = ["payment.settled", "payment.written_off", "payment.needs_attention", "channel.claimed"]
secret_env = "{secret_env}"
"""


@dataclass
class World:
    devnet: Devnet
    ops: str
    receiver: Receiver
    collector: Collector

    def api(self, path: str) -> httpx.Response:
        answer = httpx.get(f"{self.ops}/console/api/{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        return answer


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    port, facilitator_port, ops_port = free_port(), free_port(), free_port()
    with Receiver() as receiver, collecting() as (collector, endpoint):
        text = shipped_config(tmp_path, facilitator_port)
        text = text.replace('# metrics_listen = "127.0.0.1:9464"', f'metrics_listen = "127.0.0.1:{ops_port}"')
        text = text.replace(f'# metrics_token_env = "{TOKEN_ENV}"', f'metrics_token_env = "{TOKEN_ENV}"')
        assert f"127.0.0.1:{ops_port}" in text and f'\nmetrics_token_env = "{TOKEN_ENV}"' in text
        text += TRACED_AND_HOOKED.format(collector=endpoint, receiver=receiver.url, secret_env=WEBHOOK_ENV)
        config = tmp_path / "gate.toml"
        config.write_text(text)
        env = {TOKEN_ENV: TOKEN, WEBHOOK_ENV: WEBHOOK_SECRET, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        args = ["--dev-facilitator", str(facilitator_port)]
        with GateProcess(config, tmp_path / "serve.log", port=port, extra_args=args, env=env) as process:
            devnet = Devnet(process, f"http://127.0.0.1:{facilitator_port}", config)
            yield World(devnet, f"http://127.0.0.1:{ops_port}", receiver, collector)


def transfers_to_pay_to(devnet: Devnet) -> dict[str, int]:
    """Every ERC-20 Transfer of the asset to payTo on the development chain (`eth_getLogs`), summed per
    transaction: what the chain moved to the payee, and in which transactions."""
    to = "0x" + "0" * 24 + PAY_TO.lower().removeprefix("0x")
    logs = rpc(devnet.facilitator, "eth_getLogs", {"address": ASSET, "topics": [TRANSFER_TOPIC, None, to]})
    moved: dict[str, int] = {}
    for log in logs:
        moved[log["transactionHash"]] = moved.get(log["transactionHash"], 0) + int(log["data"], 16)
    return moved


def money(row: dict[str, Any]) -> tuple[str, str, str, str, str, str]:
    """What every reading of a payment must agree on."""
    return (row["agent"], row["scheme"], row["state"], str(row["amount"]), str(row["collected"]), row["transaction"])


def test_every_payment_reads_the_same_everywhere_and_as_the_chain_moved_it(world: World, tmp_path: Path) -> None:
    devnet = world.devnet
    pay_to_before = devnet.token_balance(PAY_TO)
    created = devnet.cli("keys", "create", "ops", "--agent", "echo")
    api_key = KEY_LINE.search(created.stdout).group(1)  # type: ignore[union-attr]
    free = httpx.post(
        f"{devnet.gate.url}/a2a/echo", json=send_body("free"), headers={"Authorization": f"Bearer {api_key}"}
    )
    assert free.json()["result"]["status"]["state"] == "completed", free.text

    sent: list[str] = []  # every PAYMENT-SIGNATURE header the clients sent
    exact_key, upto_key, channel_key = Account.create(), Account.create(), Account.create()
    paid, metered, vouchers = pay_each_way(devnet, (exact_key, upto_key, channel_key), VOUCHERS, sent)
    claimed = devnet.cli("channels", "claim")
    assert claimed.returncode == 0, claimed.stdout + claimed.stderr

    # what the development chain moved: the transfers to payTo (the exact payment's, the upto charge's and
    # the sweep of the channel's claimed funds), the channel's claimed total on the contract, payTo's balance
    exact_tx, upto_tx = receipt(paid)["transaction"], receipt(metered)["transaction"]
    charge = int(receipt(metered)["amount"])
    assert 0 < charge < 50000
    channel_id = receipt(vouchers[-1])["extra"]["channelState"]["channelId"]
    balance, claimed_total = devnet.channel(channel_id)
    assert claimed_total == VOUCHERS * PRICE <= balance  # charged per voucher, all of it claimed on chain
    transfers = transfers_to_pay_to(devnet)
    (sweep_tx,) = transfers.keys() - {exact_tx, upto_tx}
    assert transfers == {exact_tx: PRICE, upto_tx: charge, sweep_tx: claimed_total}
    moved = devnet.token_balance(PAY_TO) - pay_to_before
    assert moved == sum(transfers.values()) == PRICE + charge + claimed_total

    # the records, as the command prints them and as the API answers
    expected = {
        paid.json()["result"]["id"]: ("paid-echo", "exact", "settled", str(PRICE), str(PRICE), exact_tx),
        metered.json()["result"]["id"]: ("paid-metered", "upto", "settled", str(charge), str(charge), upto_tx),
    }
    records = {r["task_id"]: r for r in world.api("records").json()["records"]}
    assert records.keys() == {*expected, *(v.json()["result"]["id"] for v in vouchers)}  # the free call: none
    claim_tx = records[vouchers[0].json()["result"]["id"]]["transaction"]
    for voucher in vouchers:
        expected[voucher.json()["result"]["id"]] = (
            "paid-channel",
            "batch-settlement",
            "settled",
            *[str(PRICE)] * 2,
            claim_tx,
        )
    assert {task: money(r) for task, r in records.items()} == expected
    assert claim_tx not in transfers  # the claim adds to the contract's claimed total; the sweep pays payTo
    assert sum(int(r["collected"]) for r in records.values()) == moved
    payers = {r["agent"]: r["payer"] for r in records.values()}
    assert payers == {
        "paid-echo": exact_key.address.lower(),
        "paid-metered": upto_key.address.lower(),
        "paid-channel": channel_key.address.lower(),
    }
    listed = devnet.cli("payments", "records")
    assert listed.returncode == 0, listed.stderr
    lines = [line.split("\t") for line in listed.stdout.splitlines()]
    header, rows = lines[0], [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    assert {"state", "agent", "amount", "transaction", "task"} <= set(header), header
    by_task = {r["task"]: (r["agent"], r["scheme"], r["state"], r["amount"], r["transaction"]) for r in rows}
    assert by_task == {task: (*m[:4], m[5]) for task, m in expected.items()}

    # the CSV export, the command's and the API's: the same rows, summing to what the chain moved
    export = devnet.cli("payments", "export", "--format", "csv")
    assert export.returncode == 0, export.stderr
    api_csv = world.api("export?what=records&format=csv").text
    assert api_csv.replace("\r\n", "\n") == export.stdout.replace("\r\n", "\n")
    exported = list(csv.DictReader(io.StringIO(export.stdout)))
    assert {r["task_id"]: money(r) for r in exported} == expected and len(exported) == len(expected)
    assert sum(int(r["collected"]) for r in exported) == moved

    # the webhooks: each settlement, signed (the receiver's documented check), with the same amounts
    verified = documented_check()
    wait_for(lambda: len(settled_events(world.receiver)) >= len(expected) and bool(claim_events(world.receiver)), 30)
    for attempt in world.receiver.attempts:
        assert verified(WEBHOOK_SECRET, attempt.headers, attempt.body), attempt.headers
        assert not verified("another secret", attempt.headers, attempt.body)
    settled = settled_events(world.receiver)
    said = {e["task_id"]: (e["agent"], e["scheme"], e["amount"]) for e in settled}
    assert said == {task: (m[0], m[1], m[3]) for task, m in expected.items()}, said
    by_transaction = {e["task_id"]: e["transaction"] for e in settled if e["scheme"] != "batch-settlement"}
    assert by_transaction == {task: m[5] for task, m in expected.items() if m[1] != "batch-settlement"}
    # a voucher's payment.settled is its charge to the channel, when delivered: its transaction is the
    # channel's deposit (payer to contract, nothing to payTo) for the voucher that opened it, else none;
    # the money reaches payTo with the claim, whose event says what it added to the claimed total
    charges = [e for e in settled if e["scheme"] == "batch-settlement"]
    deposits = [e["transaction"] for e in charges if e["transaction"]]
    assert len(deposits) == 1 and deposits[0] not in transfers and deposits[0] != claim_tx, charges
    assert rpc(devnet.facilitator, "eth_getTransactionReceipt", deposits[0]) is not None
    (claim,) = claim_events(world.receiver)
    assert (claim["amount"], claim["transaction"]) == (str(claimed_total), claim_tx)
    assert sum(int(e["amount"]) for e in charges) == claimed_total

    # the page, in a real Chromium: every paid row and its amount, the chart's revenue per agent
    pages: list[str] = []
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{world.ops}/console/")
        pages.append(page.content())
        page.fill("#token", TOKEN)
        page.click("#login-form button")
        page.wait_for_selector("#console:not(.hidden)")
        for task, record in records.items():
            row = page.locator(f"#records tbody tr[data-payment-id='{record['payment_id']}']")
            row.wait_for()
            cells = row.locator("td").all_inner_texts()
            assert (cells[2], cells[4], cells[1]) == expected[task][:3], cells
            assert int(cells[5].replace(",", "")) == int(expected[task][3]), cells
        revenue = {
            agent: sum(
                int(bar.get_attribute("data-revenue") or 0)
                for bar in page.locator(f"#chart rect[data-agent='{agent}']").all()
            )
            for agent in PAID_AGENTS
        }
        assert revenue == {"paid-echo": PRICE, "paid-metered": charge, "paid-channel": claimed_total}, revenue
        assert sum(revenue.values()) == moved
        for count in ("paid requests", "settled"):
            assert page.locator(f"#tiles [data-count='{count}'] b").inner_text() == str(len(expected)), count
        # the 402s, once the process writes its request counts (every 10 s): as many as it answered
        from playwright.sync_api import expect  # (there once the browser is: tests/support/browser.py)

        asked = world.api("rates").json()["totals"]["payment_required"]
        assert asked == 2 + VOUCHERS  # each paid request's first try, without a payment
        expect(page.locator("#tiles [data-count='402s'] b")).to_have_text(str(asked), timeout=30_000)
        page.locator(
            f"#records tbody tr[data-payment-id='{records[paid.json()['result']['id']]['payment_id']}']"
        ).click()
        page.wait_for_selector("#story:not(.hidden)")
        pages.append(page.content())
        shot = tmp_path / "console.png"
        page.locator("header").scroll_into_view_if_needed()
        page.screenshot(path=str(shot))
        pages.append(page.content())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if target := os.environ.get(SCREENSHOT):
        shutil.copyfile(shot, target)

    # nothing secret anywhere: pages, answers, exports, webhook bodies and headers, spans
    answers = [world.api(path).text for path in [*API_READS, *EXPORTS]]
    devnet.gate.stop()  # its spans all exported: a process's stop sends what its batch still holds
    world.collector.wait_for("facilitator.settle", 2)
    world.collector.wait_for("agent.run", 3 + VOUCHERS)  # the free call, exact, upto and each voucher
    summary = devnet.cli("payments", "export", "--what", "summary", "--format", "json").stdout
    as_json = devnet.cli("payments", "export", "--format", "json").stdout
    hooks = [a.body.decode() + json.dumps(a.headers) for a in world.receiver.attempts]
    shown = "\n".join([*pages, *answers, listed.stdout, export.stdout, api_csv, summary, as_json, *hooks])
    secrets = secrets_sent(sent, api_key, [exact_key, upto_key, channel_key])
    kinds = [json.loads(base64.b64decode(h))["payload"].get("type", "transfer") for h in sent]
    assert kinds == ["transfer", "transfer", "deposit", *["voucher"] * (VOUCHERS - 1)]  # every payment, searched
    leaked = [s[:16] for s in secrets if s.lower() in shown.lower()]
    assert leaked == [], f"shown by the console, the exports or the webhooks: {leaked}"
    spans = b"".join(world.collector.bodies)
    in_spans = [s[:16] for s in secrets if s.lower().encode() in spans.lower()]
    in_spans += [s[:16] for s in secrets if is_hex(s) and bytes.fromhex(s) in spans]
    assert in_spans == [], f"exported in a span: {in_spans}"
    for span in world.collector.spans:
        said_in_span = json.dumps([attributes(span), [attributes(e) for e in span.events]]).lower()
        assert not [s for s in secrets if s.lower() in said_in_span], span.name


def events(receiver: Receiver, kind: str) -> list[dict[str, Any]]:
    """The data of each event of `kind` the receiver answered 200, once per event id."""
    bodies = [json.loads(a.body) for a in receiver.delivered().values()]
    return [b["data"] for b in bodies if b["type"] == kind]


def settled_events(receiver: Receiver) -> list[dict[str, Any]]:
    return events(receiver, "payment.settled")


def claim_events(receiver: Receiver) -> list[dict[str, Any]]:
    return events(receiver, "channel.claimed")


def is_hex(text: str) -> bool:
    return len(text) % 2 == 0 and all(c in "0123456789abcdef" for c in text.lower())


def secrets_sent(headers: list[str], api_key: str, keys: list[Any]) -> list[str]:
    """Everything secret the test sent: each payment header (base64, and its decoded JSON), every
    signature and nonce in them (with and without 0x), the API key and its digest, the payers' private
    keys, the console token and the webhook secret."""
    found = {api_key, hashlib.sha256(api_key.encode()).hexdigest(), TOKEN, WEBHOOK_SECRET}
    for header in headers:
        found.add(header)
        decoded = base64.b64decode(header).decode()
        found.add(decoded)
        found.add(json.dumps(json.loads(decoded), separators=(",", ":")))
    for value in secrets_in(headers):
        found.update({value, value.removeprefix("0x")})  # (searched without regard to case)
    for key in keys:
        found.update({key.key.hex(), key.key.hex().removeprefix("0x")})
    return sorted(s for s in found if s)
