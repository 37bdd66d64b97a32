"""How often a voucher-paid request writes: twice (the claim with its reservation; the delivery with its
charge and its task), counted as the transactions SQLite runs while the x402 package's own client pays;
and what the delivery writes to its claim: one update, which names the task and the payer itself.

In-process (the gate's ASGI app, the channel facilitator of `tests.support.channel_facilitator` behind
the gate's facilitator client), against a real SQLite file, one request at a time so each transaction
is that request's. A blocking send's task is written with its delivery; a streamed one first.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from x402 import x402Client
from x402.http.clients import x402_httpx_transport
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
from x402.mechanisms.evm.signers import EthAccountSigner

from gate.app import build_app
from gate.config import load_config
from tests.gate.flows.channel.test_channels import write_config
from tests.support.channel_facilitator import ChannelChain, create_app
from tests.support.paid import send_body

TABLES = ("claims", "tasks", "channels")


class Transactions:
    """The transactions SQLite ran, each as the tables its writes touched (from the trace callback)."""

    def __init__(self) -> None:
        self.done: list[set[str]] = []
        self.open: set[str] | None = None
        self.claim_updates: list[int] = []  # of each transaction: its statements updating a claim
        self.updating = 0

    def __call__(self, sql: str) -> None:
        if sql.startswith("BEGIN"):
            self.open, self.updating = set(), 0
        elif sql == "COMMIT" and self.open is not None:
            self.done.append(self.open)
            self.claim_updates.append(self.updating)
            self.open = None
        elif self.open is not None and sql.startswith(("INSERT", "UPDATE", "DELETE")):
            self.open.update(t for t in TABLES if f" {t} " in f" {sql} " or f"INTO {t} " in sql)
            self.updating += sql.startswith("UPDATE claims ")

    def of_requests(self) -> int:
        """Those that wrote a claim, a task or a channel (not the request counts' flush, say)."""
        return sum(1 for touched in self.done if touched)


async def lifespan(app: Any) -> tuple[asyncio.Queue[Any], asyncio.Queue[Any], asyncio.Task[None]]:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put)
    )
    started = await outbox.get()
    assert started["type"] == "lifespan.startup.complete", started
    return inbox, outbox, task


def test_a_voucher_paid_send_writes_twice_and_a_streamed_one_three_times(tmp_path: Path) -> None:
    async def main() -> tuple[list[int], list[int], Counter[int], int]:
        chain = ChannelChain()
        settings = load_config(write_config(tmp_path, "http://facilitator.test", 8000))
        app = build_app(settings)
        inbox, outbox, life = await lifespan(app)
        services = app.state.services
        services.anonymous.facilitator.client = httpx.AsyncClient(
            base_url="http://facilitator.test", transport=httpx.ASGITransport(app=create_app(chain))
        )
        transactions = Transactions()
        services.db.conn.set_trace_callback(transactions)
        client = x402Client().register("eip155:84532", BatchSettlementEvmScheme(EthAccountSigner(Account.create())))
        gate = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        sends, streams = [], []
        delivery_updates: Counter[int] = Counter()  # a voucher send's delivery: its claim updates
        try:
            async with httpx.AsyncClient(
                transport=x402_httpx_transport(client, gate), base_url="http://127.0.0.1:8000", timeout=30
            ) as http:
                first = await http.post("/a2a/paid-channel", json=send_body("the deposit"))
                assert "payment-response" in first.headers, first.text
                # the sends, then a stream (its receipt rides on its last event: the client resyncs
                # from a corrective 402 before a voucher after it, which would be a request of its own)
                for i, method in enumerate(["message/send"] * 3 + ["message/stream"]):
                    before = transactions.of_requests()
                    answer = await http.post("/a2a/paid-channel", json=send_body(f"voucher {i}", method=method))
                    assert answer.status_code == 200, answer.text
                    if method == "message/send":
                        assert "payment-response" in answer.headers, answer.text
                    else:
                        assert "x402.payment.receipts" in answer.text, answer.text
                    (streams if method == "message/stream" else sends).append(transactions.of_requests() - before)
                    if method == "message/send":
                        delivery_updates[transactions.claim_updates[-1]] += 1
            unnamed = await services.db.fetchval("SELECT COUNT(*) FROM claims WHERE task_id = '' OR payer = ''")
        finally:
            services.db.conn.set_trace_callback(None)
            await inbox.put({"type": "lifespan.shutdown"})
            await outbox.get()
            await life
        assert chain.calls["deposit"] == 1 and chain.calls["verify"] == 1  # the vouchers: verified by the gate
        return sends, streams, delivery_updates, unnamed

    sends, streams, delivery_updates, unnamed = asyncio.run(main())
    assert sends == [2, 2, 2]  # the claim with its reservation; the delivery with its charge and its task
    # the delivery's claim write names the task and the payer: no bind of its own beside it
    assert delivery_updates == Counter({1: 3}), delivery_updates
    assert unnamed == 0  # every claim names its task and its payer all the same
    assert streams == [3]  # a stream's task is written first (its answer names it at once), then delivered
