"""A gate with usage-priced (x402 `upto`) agents, its facilitator, and the x402 package's own upto client."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.gate_process import GateProcess
from tests.support.paid import ASSET, PAY_TO, decode_header

CEILING = 50_000
UNIT_PRICE = 10  # atomic units per character
DEV_FACILITATOR = "0xFB0b6D1F8B44CAeaC383d5AC8C0b374BB08E2619"

UPTO_PRICE = (
    '{{ scheme = "upto", network = "eip155:84532", asset = "{asset}", pay_to = "{pay_to}",'
    ' ceiling = "{ceiling}", facilitator_address = "{facilitator}", usage = {usage} }}'
)


def upto_price(usage: str, ceiling: int = CEILING) -> str:
    return UPTO_PRICE.format(asset=ASSET, pay_to=PAY_TO, ceiling=ceiling, facilitator=DEV_FACILITATOR, usage=usage)


PER_CHARACTER = f'{{ unit = "characters", unit_price = "{UNIT_PRICE}" }}'

UPTO_CONFIG = f"""
public_url = "PUBLIC_URL"
database = "gate.db"
reconcile_interval_seconds = 3600
claim_lease_seconds = 2

[limits]
per_ip_per_minute = 100000
per_agent_per_minute = 100000

[facilitator]
url = "FACILITATOR_URL"
timeout_seconds = 5
settle_attempts = 2
settle_backoff_seconds = 0.05

[agents.paid-metered]
description = "the echo, per character"
price = {upto_price(PER_CHARACTER)}

[agents.paid-metered-second]
description = "the echo: a fixed price first, or per character by upto"
price = {{ network = "eip155:84532", asset = "{ASSET}", pay_to = "{PAY_TO}", accepts = [
  {{ scheme = "exact", amount = "{CEILING}" }},
  {{ scheme = "upto", ceiling = "{CEILING}", facilitator_address = "{DEV_FACILITATOR}", usage = {PER_CHARACTER} }},
] }}

[agents.paid-metered-raising]
description = "the echo, priced by a callable that raises"
price = {upto_price('{ callable = "tests.support.pricing:raises" }')}

[agents.paid-metered-capped]
description = "the echo, priced far above its ceiling"
price = {upto_price(PER_CHARACTER, ceiling=100)}

[agents.paid-metered-broken]
backend = "python"
callable = "tests.support.agents:broken"
price = {upto_price(PER_CHARACTER)}

[agents.paid-metered-chunks]
backend = "python"
callable = "tests.support.agents:metered_chunks"
price = {upto_price('{ callable = "tests.support.pricing:per_chunk" }')}

[agents.paid-metered-cut]
backend = "python"
callable = "tests.support.agents:metered_cut"
price = {upto_price('{ callable = "tests.support.pricing:per_chunk" }')}

[agents.paid-metered-waits]
backend = "python"
callable = "tests.support.agents:metered_until_told"
price = {upto_price('{ callable = "tests.support.pricing:per_chunk" }')}

[agents.paid-metered-asks]
backend = "python"
callable = "tests.support.agents:metered_asks"
price = {upto_price(PER_CHARACTER)}
"""


def upto_config(public_url: str, facilitator: str, agents: str = "") -> str:
    """The gate's configuration with the agents above, and `agents` (more `[agents.NAME]` tables) after them."""
    return (UPTO_CONFIG + agents).replace("PUBLIC_URL", public_url).replace("FACILITATOR_URL", facilitator)


def upto_client(key: str) -> Any:
    """The x402 package's own client with its own upto scheme, unchanged."""
    from eth_account import Account
    from x402 import x402Client
    from x402.mechanisms.evm.upto import UptoEvmClientScheme

    client = x402Client()
    client.register("eip155:*", UptoEvmClientScheme(Account.from_key(key)))
    return client


def pay_with_x402(url: str, body: dict[str, Any], key: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """One request through the x402 package's httpx client: 402 -> sign upto -> retry."""
    from x402.http.clients.httpx import x402HttpxClient

    async def run() -> httpx.Response:
        async with x402HttpxClient(upto_client(key), timeout=30) as http:
            return await http.post(url, json=body, headers=headers or {})

    return asyncio.run(run())


def sign_upto(payment_required: dict[str, Any], key: str) -> dict[str, Any]:
    """The upto client's payload for a 402's PaymentRequired (what its httpx client sends)."""
    from x402.schemas import PaymentRequired

    payload = upto_client_sync(key).create_payment_payload(PaymentRequired.model_validate(payment_required))
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def upto_client_sync(key: str) -> Any:
    from eth_account import Account
    from x402 import x402ClientSync
    from x402.mechanisms.evm.upto import UptoEvmClientScheme

    client = x402ClientSync()
    client.register("eip155:*", UptoEvmClientScheme(Account.from_key(key)))
    return client


@dataclass
class UptoSetup:
    gate: GateProcess
    facilitator_url: str
    db_path: Path

    def url(self, agent: str) -> str:
        return f"{self.gate.url}/a2a/{agent}"

    def ledger(self, *addresses: str) -> dict[str, Any]:
        params = [("address", a) for a in addresses] + [("asset", ASSET)]
        return dict(httpx.get(f"{self.facilitator_url}/dev/ledger", params=params, timeout=10).json())

    def balance(self, address: str) -> int:
        """The address's balance on the development chain."""
        return int(self.ledger(address)["balances"][address])

    def transfers(self) -> list[dict[str, Any]]:
        """The upto proxy's settlements on the development chain: amount, from, to, ceiling."""
        return [
            {
                "amount": int(s["amount"]),
                "from": s["from_address"],
                "to": s["to_address"],
                "ceiling": s["permitted_amount"],
            }
            for s in self.ledger()["permit2_settlements"]
        ]

    def settle_calls(self) -> int:
        return int(self.ledger()["settle_calls"])

    def offer(self, agent: str) -> dict[str, Any]:
        from tests.support.paid import send_body

        answer = httpx.post(self.url(agent), json=send_body("price?"))
        assert answer.status_code == 402, answer.text
        return decode_header(answer.headers["PAYMENT-REQUIRED"])

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()
