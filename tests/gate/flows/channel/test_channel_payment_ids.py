"""Payment identifiers on a payment channel: the x402 package's own batch-settlement client, with the
id added by the package's payment-identifier helper, asks twice for the same request; the second
voucher (a higher cumulative amount, signed anew) is answered from the first and charges nothing:
the channel's charged total is one price."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions, generate_payment_id
from x402.http.clients import x402_httpx_transport

from tests.gate.flows.channel.test_channels import PRICE, chain, channel_client, channel_rows, facilitator, gate
from tests.support.channel_facilitator import ChannelChain
from tests.support.gate_process import GateProcess
from tests.support.paid import send_body

pytestmark = pytest.mark.system

__all__ = ["chain", "facilitator", "gate"]  # the fixtures, bound by import


def test_a_re_signed_voucher_under_the_same_id_is_answered_from_the_first_and_charged_once(
    gate: GateProcess, chain: ChannelChain, tmp_path: Path
) -> None:
    client, _ = channel_client()
    payment_id = generate_payment_id()

    def with_id(context) -> None:  # the payer's retry keeps the id of its request
        append_payment_identifier_to_extensions(context.payment_required.extensions, payment_id)

    client.on_before_payment_creation(with_id)
    url = f"{gate.url}/a2a/paid-channel"

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body("once")) for _ in range(2)]

    first, again = asyncio.run(run())
    assert first.json()["result"]["status"]["state"] == "completed", first.text
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    (row,) = channel_rows(tmp_path / "gate.db")
    assert int(row["charged"]) == PRICE
