"""The operator's side of payment channels, attacked from outside against real `a2a-gate serve`
processes and the development chain (`--dev-facilitator`): every charged voucher is claimed before
its payer could withdraw it, and one claim the contract refuses never sinks the others.

A payer here is the x402 package's own batch-settlement client (a fresh key the development ledger
funds); its withdrawal is its own signed `initiateWithdraw` / `finalizeWithdraw` transactions on the
chain's `/rpc`, and "waiting out the withdraw delay" is `/dev/chain/advanceTime` (the contract's
clock; the gate's is the real one, so whatever the gate does, it does before the test moves on).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
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
from eth_account.signers.local import LocalAccount
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.http.clients.httpx import PaymentError
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC

from tests.support.channels import contract_config, receipt_of, signed_transaction
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, send_body
from tests.support.shipped_config import shipped_config

ROOT = Path(__file__).parents[2]
PRICE = 1000
DELAY = 900  # the shipped offer's withdraw_delay_seconds
SETTLEMENT_CONTRACT = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003"


def config_text(tmp_path: Path, facilitator_port: int, channels: str, *, watched: bool = True) -> str:
    """The shipped example (tests.support.shipped_config) watching the development chain unless
    `watched` is false, generous limits, and `channels` as its [channels] table's keys."""
    # a claim of a hundred vouchers on a loaded machine: a facilitator call may take a while
    return shipped_config(
        tmp_path, facilitator_port, watched=watched, per_minute=100000, facilitator_timeout=30, channels=channels
    )


@dataclass
class Devnet:
    gate: GateProcess
    facilitator: str
    config: Path

    def rpc(self, method: str, params: list[Any]) -> Any:
        answer = httpx.post(
            f"{self.facilitator}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        ).json()
        return answer

    def call(self, data: str, to: str = SETTLEMENT_CONTRACT) -> str:
        return str(self.rpc("eth_call", [{"to": to, "data": data}, "latest"])["result"]).removeprefix("0x")

    def channel(self, channel_id: str) -> tuple[int, int]:
        """`channels(bytes32)` on the settlement contract: (balance, total claimed)."""
        from eth_utils import keccak

        word = self.call("0x" + keccak(text="channels(bytes32)")[:4].hex() + channel_id.removeprefix("0x"))
        return int(word[:64], 16), int(word[64:128], 16)

    def token_balance(self, address: str) -> int:
        return int(self.call("0x70a08231" + "00" * 12 + address.lower().removeprefix("0x"), ASSET), 16)

    def send(self, key: str, function: str, *args: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.rpc("eth_sendRawTransaction", [signed_transaction(key, function, *args)])
        return answer

    def advance(self, seconds: int) -> None:
        httpx.post(f"{self.facilitator}/dev/chain/advanceTime", json={"seconds": seconds}).raise_for_status()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gate.cli", *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )

    def stored_config(self, channel_id: str) -> tuple[Any, ...]:
        """The channel's configuration as the gate keeps it, in the contract's tuple form."""
        conn = sqlite3.connect(self.config.parent / "gate.db")
        try:
            ((config,),) = conn.execute("SELECT config FROM channels WHERE channel_id = ?", (channel_id,)).fetchall()
        finally:
            conn.close()
        return contract_config(ChannelConfig.from_dict(json.loads(config)))

    def wait_claimed(self, channel_id: str, amount: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.channel(channel_id)[1] < amount:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True


@dataclass
class Payer:
    account: LocalAccount
    client: x402Client

    @property
    def key(self) -> str:
        return "0x" + bytes(self.account.key).hex()


def new_payer(devnet: Devnet) -> Payer:
    account = Account.create()
    signer = EthAccountSignerWithRPC(account, rpc_url=f"{devnet.facilitator}/rpc")
    return Payer(account, x402Client().register("eip155:84532", BatchSettlementEvmScheme(signer)))


async def pay(url: str, payer: Payer, count: int) -> str:
    """`count` requests paid from `payer`'s channel, each delivered and charged; the channel's id."""
    async with httpx.AsyncClient(transport=x402_httpx_transport(payer.client), timeout=60) as http:
        answers = [await http.post(url, json=send_body(f"request {i}")) for i in range(count)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
    receipt = receipt_of(answers[-1])["extra"]["channelState"]
    assert receipt["chargedCumulativeAmount"] == str(count * PRICE)
    return str(receipt["channelId"])


def serve(tmp_path: Path, channels: str, *, watched: bool = True) -> Iterator[Devnet]:
    port, facilitator_port = free_port(), free_port()
    config = tmp_path / "gate.toml"
    config.write_text(config_text(tmp_path, facilitator_port, channels, watched=watched))
    process = GateProcess(
        config, tmp_path / "serve.log", port=port, extra_args=["--dev-facilitator", str(facilitator_port)]
    )
    with process:
        yield Devnet(process, f"http://127.0.0.1:{facilitator_port}", config)


# the schedule alone never claims while a test runs (a first unclaimed charge is due after 500 s),
# and it fits the 900 s delay: 500 + 3 x 1 + 2 x (30 + 2) <= 900 - 300
PROMPT = "claim_interval_seconds = 1\nclaim_after_seconds = 500"


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[Devnet]:
    yield from serve(tmp_path, PROMPT)


def withdraw_after_delay(devnet: Devnet, payer: Payer, channel_id: str, seen_within: float) -> tuple[int, bool]:
    """The payer asks to withdraw everything unclaimed, waits the delay, finalizes: what it got back,
    and whether the gate had claimed the charges before the delay was up."""
    config = devnet.stored_config(channel_id)
    balance, claimed = devnet.channel(channel_id)
    before = devnet.token_balance(payer.account.address)
    initiated = devnet.send(payer.key, "initiateWithdraw", config, balance - claimed)
    assert "result" in initiated, initiated
    claimed_in_time = devnet.wait_claimed(channel_id, devnet_charged(devnet, channel_id), seen_within)
    devnet.advance(DELAY)
    final = devnet.send(payer.key, "finalizeWithdraw", config)
    assert "result" in final, final
    return devnet.token_balance(payer.account.address) - before, claimed_in_time


def devnet_charged(devnet: Devnet, channel_id: str) -> int:
    conn = sqlite3.connect(devnet.config.parent / "gate.db")
    try:
        ((charged,),) = conn.execute("SELECT charged FROM channels WHERE channel_id = ?", (channel_id,)).fetchall()
        return int(charged)
    finally:
        conn.close()


def wait_swept(devnet: Devnet, before: int, amount: int, seconds: float = 15) -> int:
    deadline = time.monotonic() + seconds
    while devnet.token_balance(PAY_TO) - before < amount and time.monotonic() < deadline:
        time.sleep(0.25)
    return devnet.token_balance(PAY_TO) - before


def test_a_configuration_that_cannot_claim_before_a_withdrawal_is_refused(tmp_path: Path) -> None:
    """The attack's configuration (no watch; a schedule that is never due inside the delay) stops
    `check-config` and `serve`, exit 2, one line naming the key; the explicit opt-out is a warning."""
    port = free_port()

    def run(text: str, *command: str) -> subprocess.CompletedProcess[str]:
        config = tmp_path / "gate.toml"
        config.write_text(text)
        return subprocess.run(
            [sys.executable, "-m", "gate.cli", *command, "--config", str(config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )

    unwatched = config_text(tmp_path, port, "claim_interval_seconds = 15\nclaim_after_seconds = 30", watched=False)
    for command in (("check-config",), ("serve", "--port", str(free_port()))):
        refused = run(unwatched, *command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.splitlines()
        assert 'networks."eip155:84532".rpc_url: required' in line and "accept_unwatched_withdrawals" in line

    late = config_text(tmp_path, port, "claim_after_seconds = 3600")  # the old default, the 900 s delay
    for command in (("check-config",), ("serve", "--port", str(free_port()))):
        refused = run(late, *command)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.splitlines()
        assert "channels.claim_after_seconds:" in line and "withdraw delay 900 s" in line

    opted_out = config_text(
        tmp_path, port, "claim_after_seconds = 30\naccept_unwatched_withdrawals = true", watched=False
    )
    accepted = run(opted_out, "check-config")
    assert accepted.returncode == 0, accepted.stderr
    assert "warning:" in accepted.stderr and "channels.accept_unwatched_withdrawals" in accepted.stderr
    assert run(config_text(tmp_path, port, ""), "check-config").returncode == 0  # the defaults fit


def test_a_payer_who_withdraws_after_five_requests_has_paid_for_them(devnet: Devnet) -> None:
    """Five requests delivered, then the payer's timed withdrawal: the gate sees it on the chain and
    claims at once; when the delay is up the payer gets back only what it did not spend."""
    url = f"{devnet.gate.url}/a2a/paid-channel"
    payer = new_payer(devnet)
    pay_to_before = devnet.token_balance(PAY_TO)
    channel_id = asyncio.run(pay(url, payer, 5))
    balance, claimed = devnet.channel(channel_id)
    assert claimed == 0  # nothing due by the schedule yet
    returned, claimed_in_time = withdraw_after_delay(devnet, payer, channel_id, seen_within=20)
    assert claimed_in_time, "the charges were not claimed before the payer could withdraw them"
    assert devnet.channel(channel_id) == (5 * PRICE, 5 * PRICE)
    assert returned == balance - 5 * PRICE
    assert wait_swept(devnet, pay_to_before, 5 * PRICE) == 5 * PRICE
    metrics = httpx.get(f"{devnet.gate.url}/metrics").text
    assert "a2a_gate_channels_withdrawal_pending 0.0" in metrics


def test_a_payer_who_asked_to_withdraw_gets_no_more_work_on_credit(devnet: Devnet) -> None:
    """After its withdrawal request, a payer's next voucher would be a charge the gate might never
    claim: sent the moment the withdrawal can be finalized and finalized straight after, it took
    the work back for free. Once the gate has seen the request, the channel takes no more charges
    (403, the gate's `withdrawal_pending` reason), and the payer gets back exactly what it did not spend."""
    url = f"{devnet.gate.url}/a2a/paid-channel"
    payer = new_payer(devnet)
    channel_id = asyncio.run(pay(url, payer, 5))
    config = devnet.stored_config(channel_id)
    balance, claimed = devnet.channel(channel_id)
    before = devnet.token_balance(payer.account.address)
    assert "result" in devnet.send(payer.key, "initiateWithdraw", config, balance - claimed)
    assert devnet.wait_claimed(channel_id, 5 * PRICE, 20)  # seen on the chain: claimed at once
    devnet.advance(DELAY)  # the withdrawal may be finalized now

    async def one_more() -> httpx.Response:
        async with httpx.AsyncClient(transport=x402_httpx_transport(payer.client), timeout=60) as http:
            return await http.post(url, json=send_body("one more, on credit"))

    try:
        late = asyncio.run(one_more())
        status, text = late.status_code, late.text
    except PaymentError as exc:  # the client gives up on a refusal it cannot fix
        status, text = 403, str(exc)
    assert status == 403 and "withdrawal_pending" in text, (status, text)
    assert devnet_charged(devnet, channel_id) == 5 * PRICE  # nothing delivered, nothing charged
    assert "result" in devnet.send(payer.key, "finalizeWithdraw", config)
    assert devnet.token_balance(payer.account.address) - before == balance - 5 * PRICE
    assert devnet.channel(channel_id)[1] == 5 * PRICE


def test_a_hundred_decoy_channels_do_not_hide_a_withdrawing_payer(devnet: Devnet) -> None:
    """105 channels with one charge each (more than any page), then the target's five charges (its
    last charge the newest) and its withdrawal: the watch reads every channel, the target's is
    claimed before the delay is up; `a2a-gate channels claim` then claims every decoy, leaving none."""
    url = f"{devnet.gate.url}/a2a/paid-channel"

    async def decoys(count: int) -> list[str]:
        slots = asyncio.Semaphore(4)

        async def one() -> str:
            async with slots:
                for _ in range(2):  # a decoy whose deposit did not go through on a loaded machine: another
                    try:
                        return await pay(url, new_payer(devnet), 1)
                    except PaymentError:
                        pass
                return await pay(url, new_payer(devnet), 1)

        return list(await asyncio.gather(*(one() for _ in range(count))))

    decoy_ids = asyncio.run(decoys(105))
    target = new_payer(devnet)
    channel_id = asyncio.run(pay(url, target, 5))
    balance, _ = devnet.channel(channel_id)
    returned, claimed_in_time = withdraw_after_delay(devnet, target, channel_id, seen_within=30)
    assert claimed_in_time, "the target's charges were not claimed before it could withdraw them"
    assert returned == balance - 5 * PRICE
    assert all(devnet.channel(d)[1] == 0 for d in decoy_ids[:3])  # the decoys are not due yet

    done = devnet.cli("channels", "claim")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith(f"{len(decoy_ids)} channel(s) claimed ({len(decoy_ids) * PRICE}")
    assert "0 left with unclaimed charges" in done.stdout
    assert all(devnet.channel(d)[1] == PRICE for d in decoy_ids)


@pytest.fixture
def slow_devnet(tmp_path: Path) -> Iterator[Devnet]:
    """No pass of the schedule while a test runs (the first is 150 s after the start; 80 + 3 x 150 + 2 x 32 <= 600), and a file
    without the chain's rpc_url: `a2a-gate channels claim` knows only the facilitator."""
    yield from serve(tmp_path, "claim_interval_seconds = 150\nclaim_after_seconds = 80", watched=False)


def test_one_refused_claim_does_not_sink_the_rest_of_its_batch(slow_devnet: Devnet) -> None:
    """Four payers pay one payTo; one of them takes its deposit back before the gate claims.
    `a2a-gate channels claim` sends the four in one batch: the contract refuses it (that channel's
    balance no longer backs its voucher); the gate finds the refused row, claims the other three in
    the same pass and sets it aside as `refused`."""
    devnet = slow_devnet
    url = f"{devnet.gate.url}/a2a/paid-channel"
    honest = [new_payer(devnet) for _ in range(3)]
    thief = new_payer(devnet)
    pay_to_before = devnet.token_balance(PAY_TO)

    async def everyone() -> list[str]:
        return [await pay(url, p, 3) for p in [*honest[:2], thief, honest[2]]]

    *first, stolen, last = asyncio.run(everyone())
    honest_ids = [*first, last]
    deposit, _ = devnet.channel(stolen)
    returned, claimed_in_time = withdraw_after_delay(devnet, thief, stolen, seen_within=0)
    assert not claimed_in_time and returned == deposit  # its whole deposit: nobody claimed in time

    done = devnet.cli("channels", "claim")
    assert done.returncode == 1, done.stdout + done.stderr  # something refused: an operator must look
    assert [c for c in honest_ids if devnet.channel(c)[1] != 3 * PRICE] == []
    assert wait_swept(devnet, pay_to_before, 9 * PRICE) == 9 * PRICE
    refused = [line for line in done.stdout.splitlines() if line.startswith("outcome=refused")]
    assert len(refused) == 1 and f"channel={stolen}" in refused[0], done.stdout
    assert (
        done.stdout.splitlines()[-1] == "3 channel(s) claimed (9000 atomic units); 1 left with unclaimed"
        " charges (1 refused)"
    )

    listed = devnet.cli("channels", "list").stdout
    (row,) = [line for line in listed.splitlines() if line.startswith(stolen)]
    assert row.split("\t")[-1].startswith("refused: ")
    attention = devnet.cli("payments", "--action", "needs_attention").stdout
    assert stolen[:18] in attention and "set aside" in attention
    metrics = httpx.get(f"{devnet.gate.url}/metrics").text
    assert "a2a_gate_channels_refused 1.0" in metrics

    again = devnet.cli("channels", "claim")  # set aside: never sent again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "outcome=claimed" not in again.stdout and "outcome=refused" not in again.stdout
    assert f"outcome=left\tchannel={stolen}\tunclaimed={3 * PRICE}\twhy=refused: " in again.stdout
