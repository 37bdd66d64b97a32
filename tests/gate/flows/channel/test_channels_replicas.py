"""Two replicas on one PostgreSQL schema sharing one payment channel: each voucher counted once.

Two `a2a-gate serve` processes, one schema, one sealing key, one public URL (a voucher signed
from one replica's 402 pays at either). The payer is the x402 package's own batch-settlement
client; the facilitator is `tests.support.channel_facilitator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from x402.http import x402HTTPClient

from tests.gate.flows.channel.test_channels import PRICE, channel_client, first_payload, pay_many, write_config
from tests.support.channel_facilitator import ChannelChain, create_app
from tests.support.gate_process import GateProcess
from tests.support.paid import send_body
from tests.support.replicas import new_sealing_key
from tests.support.serve import serve_app
from tests.support.services import PostgresSchema

PUBLIC = "http://channels.example"


@pytest.fixture
def chain() -> ChannelChain:
    return ChannelChain()


@pytest.fixture
def replicas(tmp_path: Path, chain: ChannelChain, postgres_schema: PostgresSchema) -> Iterator[list[GateProcess]]:
    key = new_sealing_key()
    with serve_app(create_app(chain), wait_on_exit=False) as facilitator:
        processes = []
        for name in ("a", "b"):
            home = tmp_path / name
            home.mkdir()
            config = write_config(home, facilitator, 0, database=postgres_schema.store_url())
            text = config.read_text().replace("http://127.0.0.1:0", PUBLIC)
            text = text.replace(
                "reconcile_interval_seconds = 3600", "reconcile_interval_seconds = 1\nclaim_lease_seconds = 2"
            )
            config.write_text(text)
            processes.append(GateProcess(config, home / "gate.log", env={"A2A_GATE_SEALING_KEY": key}).start())
        try:
            yield processes
        finally:
            for process in processes:
                process.stop_later()


def charged(schema: PostgresSchema) -> list[tuple[str, str]]:
    with psycopg.connect(schema.store_url()) as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT charged, voucher_max FROM channels").fetchall()]


async def storm(urls: list[str], payload_headers: dict[str, str], bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as http:
        calls = [http.post(random.choice(urls), json=body, headers=payload_headers) for body in bodies]
        return list(await asyncio.gather(*calls))


def test_concurrent_vouchers_at_two_replicas_count_each_once(
    replicas: list[GateProcess], chain: ChannelChain, postgres_schema: PostgresSchema
) -> None:
    urls = [f"{r.url}/a2a/paid-channel" for r in replicas]
    client, _ = channel_client()
    asyncio.run(pay_many(urls[0], 1, client))  # the deposit, through replica a
    delivered = 1
    for round_ in range(15):
        # the client's next voucher, sent eight times at once to both replicas: four retries of
        # one request and four other requests carrying the same voucher
        _, payload = asyncio.run(first_payload(urls[round_ % 2], client))
        headers = x402HTTPClient(client).encode_payment_signature_header(payload)
        retry = send_body(f"round {round_}")
        bodies = [retry] * 4 + [send_body(f"round {round_} other {i}") for i in range(4)]
        answers = asyncio.run(storm(urls, headers, bodies))
        completed = {
            a.json()["result"]["id"]
            for a in answers
            if a.status_code == 200 and "result" in a.json() and a.json()["result"]["status"]["state"] == "completed"
        }
        assert len(completed) == 1, [a.text[:200] for a in answers]  # one delivery for one voucher
        refused = [a for a in answers if a.status_code == 403]
        assert all(a.json()["error"] == "payment_already_used" for a in refused)
        paid = next(a for a in answers if "PAYMENT-RESPONSE" in a.headers)
        asyncio.run(x402HTTPClient(client).process_payment_result(payload, paid.headers.get, 200))
        delivered += 1
    [(total, voucher_max)] = charged(postgres_schema)
    assert int(total) == delivered * PRICE == int(voucher_max)
    assert chain.calls["deposit"] == 1


def test_two_vouchers_on_one_base_at_two_replicas_deliver_once(
    replicas: list[GateProcess], postgres_schema: PostgresSchema
) -> None:
    """Two agents of one payTo share the payer's channel: a voucher for each, signed on the same
    charged total and sent at once to different replicas, cannot both be delivered."""
    single, double = (
        f"{r.url}/a2a/{agent}" for r, agent in zip(replicas, ("paid-channel", "paid-channel-double"), strict=True)
    )
    client, _ = channel_client()
    asyncio.run(pay_many(single, 1, client))
    won = 0
    for round_ in range(6):

        async def race(round_: int = round_) -> list[tuple[int, httpx.Response]]:
            signed = [await first_payload(url, client) for url in (single, double)]
            async with httpx.AsyncClient(timeout=30) as http:
                calls = [
                    http.post(
                        url,
                        json=send_body(f"race {round_}"),
                        headers=x402HTTPClient(client).encode_payment_signature_header(p),
                    )
                    for url, (_, p) in zip((single, double), signed, strict=True)
                ]
                answers = await asyncio.gather(*calls)
            for (_, p), answer in zip(signed, answers, strict=True):
                if "PAYMENT-RESPONSE" in answer.headers:
                    await x402HTTPClient(client).process_payment_result(p, answer.headers.get, 200)
            return [(price, a) for price, a in zip((PRICE, 2 * PRICE), answers, strict=True)]

        before = int(charged(postgres_schema)[0][0])
        outcomes = asyncio.run(race())
        delivered = [
            price
            for price, a in outcomes
            if a.status_code == 200 and "result" in a.json() and a.json()["result"]["status"]["state"] == "completed"
        ]
        assert len(delivered) <= 1, [a.text[:200] for _, a in outcomes]
        won += len(delivered)
        assert int(charged(postgres_schema)[0][0]) == before + sum(delivered)
    assert won >= 3  # the races were run, and most had a winner


def test_a_replica_killed_mid_request_loses_no_voucher_and_charges_nothing_twice(
    replicas: list[GateProcess], postgres_schema: PostgresSchema
) -> None:
    """SIGKILL while the agent runs a voucher's request: the claim's lease lapses, the other
    replica ends it (not delivered, the channel free), and the payer's retry of the same
    voucher there is delivered and charged once."""
    import threading
    import time

    a, b = replicas
    client, _ = channel_client()
    asyncio.run(pay_many(f"{a.url}/a2a/channel-slow", 1, client))  # the deposit (a short sleep)
    _, payload = asyncio.run(first_payload(f"{a.url}/a2a/channel-slow", client))
    headers = x402HTTPClient(client).encode_payment_signature_header(payload)
    body = send_body("sleep 30")

    def doomed() -> None:
        with contextlib.suppress(httpx.HTTPError):  # its replica dies under it
            httpx.post(f"{a.url}/a2a/channel-slow", json=body, headers=headers, timeout=60)

    threading.Thread(target=doomed, daemon=True).start()
    time.sleep(1.0)  # the voucher is claimed, its channel reserved, the agent sleeping
    a.kill()
    deadline = time.monotonic() + 30
    while True:
        retried = httpx.post(f"{b.url}/a2a/channel-slow", json=body, headers=headers, timeout=60)
        if retried.status_code == 200 and "result" in retried.json():
            break
        assert retried.status_code == 200 and retried.json()["error"]["data"]["code"] in (
            "in_flight",
            "channel_busy",
        ), (
            retried.status_code,
            retried.text,
        )
        assert time.monotonic() < deadline, "the killed replica's claim was never ended"
        time.sleep(0.5)
    assert retried.json()["result"]["status"]["state"] == "completed"
    assert "PAYMENT-RESPONSE" in retried.headers
    [(total, voucher_max)] = charged(postgres_schema)
    assert int(total) == 2 * PRICE == int(voucher_max)
