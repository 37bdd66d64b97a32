"""The README's first calls and its "Paying from code", and docs/paying.md, run as they stand.

One gate started as the README's first command starts it (`a2a-gate serve --dev-facilitator`, the
embedded defaults) on free loopback ports; each example is taken from its page unchanged but for
those ports and run as a reader runs it (`python NAME`, the shell block with bash, the TypeScript
program with the page's own `npm install` and `npx tsx` lines). The checks are the page's own
promises: what each example prints, and for the payments what moved on the development chain.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account

from tests.support.readme_examples import (
    DevGate,
    command_line,
    dev_gate,
    example,
    typescript_packages,
    typescript_project,
)

README, PAYING = "README.md", "docs/paying.md"
AGENTS = ["echo", "paid-echo", "paid-metered", "paid-channel"]  # the embedded defaults, all exposed
PRICE = 1000  # paid-echo: 0.001 USDC


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevGate]:
    with dev_gate(tmp_path_factory.mktemp("reader")) as running:
        yield running


def json_documents(text: str) -> list[Any]:
    """The JSON documents printed one after another (curl prints no newline between them)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        document, at = decoder.raw_decode(text, at)
        found.append(document)
    return found


def ran(run: Any) -> str:
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    return run.stdout


def test_first_calls_then_the_a2a_sdk_client_with_the_api_key(gate: DevGate) -> None:
    """The README's first terminal: the free curl call with a new key, the 402, two payments and the
    payment log; then, in the same terminal, `python sdk_call.py` with that key."""
    (gate.folder / "sdk_call.py").write_text(gate.localize(example(README, "sdk_call.py")))
    script = gate.localize(example(README, "first-calls.sh")) + "\npython sdk_call.py\n"

    out = ran(gate.shell(script))

    assert out.splitlines()[-1] == "TASK_STATE_COMPLETED hello", out[-2000:]
    free = json.JSONDecoder().raw_decode(out)[0]  # the curl call with the key (curl adds no newline)
    assert free["result"]["status"]["state"] == "completed", free
    assert "HTTP/1.1 402" in out and "payment-required:" in out.lower(), out[:3000]
    assert out.count("payment-completed") >= 2, out  # both devnet payments
    keys = ran(gate.shell("a2a-gate keys list"))
    assert "me" in keys.split(), keys


def test_discovery_lists_every_agent_with_its_card(gate: DevGate) -> None:
    out = ran(gate.shell(gate.localize(example(README, "discovery.sh"))))

    index, card = json_documents(out)
    listed = {agent["name"]: agent for agent in index["agents"]}
    assert sorted(listed) == sorted(AGENTS), index
    for name, agent in listed.items():
        assert agent["url"] == f"{gate.url}/a2a/{name}", agent
        assert agent["card"] == f"{gate.url}/a2a/{name}/.well-known/agent-card.json", agent
        assert httpx.get(agent["card"], timeout=10).json()["name"] == name
    assert card["name"] == "paid-echo", card
    # the index's offers are the ones the 402 makes
    refusal = httpx.post(listed["paid-echo"]["url"], json=send("hello"), timeout=10)
    assert refusal.status_code == 402, refusal.text
    required = json.loads(base64.b64decode(refusal.headers["PAYMENT-REQUIRED"]))
    offers = [offer for extension in listed["paid-echo"]["extensions"] for offer in extension["params"]["accepts"]]
    assert offers == required["accepts"], (offers, required["accepts"])
    assert [(o["scheme"], o["amount"]) for o in offers] == [("exact", str(PRICE))]


def test_paying_from_python(gate: DevGate) -> None:
    """The README's first "Paying from code" block, with a throwaway key."""
    out = ran(gate.python("pay.py", example(README, "pay.py")))

    assert out.strip() == "payment-completed", out


def test_paying_once_under_a_payment_identifier(gate: DevGate) -> None:
    """docs/paying.md's payment identifier block: the x402 client signs twice under one id; the second
    answer is the first's, replayed, and the payer is charged once on the development chain."""
    ledger = f"http://127.0.0.1:{gate.facilitator_port}/dev/ledger"
    settled_before = len(httpx.get(ledger, timeout=10).json()["settlements"])

    out = ran(gate.python("pay_once.py", example(PAYING, "pay_once.py")))

    (first, task), (second, again) = (line.split() for line in out.strip().splitlines())
    assert (first, second) == ("paid", "true") and task == again, out
    assert len(httpx.get(ledger, timeout=10).json()["settlements"]) == settled_before + 1


def test_paying_from_a_channel(gate: DevGate) -> None:
    """docs/paying.md's channel block: the x402 package's own batch-settlement client, registered under
    "eip155:*" like the other schemes, pays three requests from one channel; claimed, they reach payTo."""
    pay_to = offer(gate, "paid-channel")["payTo"]
    gate.claim_channels()  # what earlier tests charged is on chain before the first reading
    before = gate.balance(pay_to)

    out = ran(gate.python("pay_channel.py", example(PAYING, "pay_channel.py")))

    assert out.split() == ["payment-completed"] * 3, out
    assert "channels=1\tamount=3000\t" in gate.claim_channels()
    assert gate.balance(pay_to)[pay_to] == before[pay_to] + 3 * PRICE


def test_a_payer_lists_and_reads_its_own_tasks(gate: DevGate) -> None:
    """docs/paying.md: two payments, then ListTasks and GetTask with the last token as proof. Another
    payer's task at the same agent (paid first here) is not in the page."""
    other = ran(gate.shell(f'a2a-gate-devnet pay {gate.url}/a2a/paid-echo "someone else"'))
    assert json.loads(other)["payment_response"]["success"] is True, other

    out = ran(gate.python("list_tasks.py", example(PAYING, "list_tasks.py")))

    assert out.splitlines() == ["['TASK_STATE_COMPLETED', 'TASK_STATE_COMPLETED']", "first"], out


def test_paying_from_typescript(gate: DevGate, tmp_path: Path) -> None:
    """docs/paying.md: @x402/fetch with an @x402/evm signer over a viem account, given to @a2a-js/sdk's
    client, pays paid-echo; the payer is charged exactly the price on the development chain."""
    script = example(PAYING, "typescript.sh")
    packages = typescript_packages(command_line(script, "npm install"))
    project = typescript_project(packages, tmp_path / "pay-ts", "pay.mts", gate.localize(example(PAYING, "pay.mts")))
    checked = gate.shell(
        "node_modules/.bin/tsc --noEmit --strict --skipLibCheck --module nodenext --moduleResolution nodenext"
        " --target es2022 pay.mts",
        cwd=project,
    )
    assert checked.returncode == 0, f"the example does not type-check:\n{checked.stdout}{checked.stderr}"
    pay_to = offer(gate)["payTo"]
    stranger = Account.from_key(secrets.token_bytes(32)).address  # never seen: the starting balance
    gate.claim_channels()  # a channel's charges, claimed on their schedule, would land on the same payTo
    before = gate.balance(pay_to, stranger)

    out = ran(gate.shell(command_line(script, "npx tsx"), cwd=project))

    outcome = json.loads(out.splitlines()[-1])
    payer, receipt = outcome["payer"], outcome["receipt"]
    assert outcome["state"] == "TASK_STATE_COMPLETED", outcome
    assert receipt["success"] is True and receipt["amount"] == str(PRICE), receipt
    assert receipt["payer"] == payer and receipt["network"] == "eip155:84532", receipt
    after = gate.balance(pay_to, payer)
    assert after[payer] == before[stranger] - PRICE, (before, after)
    assert after[pay_to] == before[pay_to] + PRICE, (before, after)


def send(text: str) -> dict[str, Any]:
    message = {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": text}]}
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}


def offer(gate: DevGate, agent: str = "paid-echo") -> dict[str, Any]:
    refusal = httpx.post(f"{gate.url}/a2a/{agent}", json=send("hello"), timeout=10)
    return json.loads(base64.b64decode(refusal.headers["PAYMENT-REQUIRED"]))["accepts"][0]
