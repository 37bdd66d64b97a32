"""Webhooks without a network: the backoff, the signature and the receiving side's documented check,
the configuration's refusals, and the outbox on a real SQLite store (the cursor over the payment log,
the lease, the bound, the summary and withdrawal events). Deliveries to a real receiving server:
tests/system/test_webhooks.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gate.config import of, parse_config
from gate.flows.channel.store import Channels
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.webhooks import signing
from gate.webhooks.config import Endpoint, WebhooksConfig
from gate.webhooks.delivery import Webhooks, backoff
from gate.webhooks.outbox import LeaseLost, Outbox, advance
from server.config import ConfigError
from server.database import Database
from server.engines import open_database
from tests.support.webhook_receiver import documented_check

# -- backoff ---------------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base_up_to_the_cap():
    assert [backoff(n, 1.0, 60.0, draw=lambda: 0.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(10_000, 1.0, 60.0, draw=lambda: 0.0) == 60  # no overflow, however many failures


def test_backoff_jitter_takes_up_to_half_and_never_passes_the_cap():
    assert backoff(3, 1.0, 60.0, draw=lambda: 1.0) == 2.0
    for n in range(1, 30):
        assert 0.5 * min(60, 2 ** (n - 1)) <= backoff(n, 1.0, 60.0) <= 60.0


# -- signatures ------------------------------------------------------------------------------------


def test_the_documented_check_accepts_a_signed_event_and_nothing_else():
    verified = documented_check()
    body = b'{"id":"log-7","type":"payment.settled"}'
    now = int(time.time())
    headers = signing.headers(["s3cr3t"], "log-7", now, body)
    assert headers[signing.SIGNATURE].startswith("v1=")
    assert verified("s3cr3t", headers, body)
    assert not verified("s3cr3t", headers, body + b" ")  # the body changed
    assert not verified("other", headers, body)  # another secret
    assert not verified("s3cr3t", {**headers, signing.EVENT_ID: "log-8"}, body)  # another id, same signature
    old = signing.headers(["s3cr3t"], "log-7", now - 3600, body)
    assert not verified("s3cr3t", old, body)  # a replay an hour later


def test_during_a_rotation_each_secret_signs():
    verified = documented_check()
    body, now = b"{}", int(time.time())
    headers = signing.headers(signing.secrets_of("new, old"), "log-1", now, body)
    assert verified("new", headers, body) and verified("old", headers, body)
    assert len(headers[signing.SIGNATURE].split()) == 2


# -- configuration ---------------------------------------------------------------------------------


def problems(webhooks: dict[str, Any], tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        of(parse_config({"webhooks": webhooks}, base_dir=tmp_path))
    return str(refused.value)


ENDPOINT = {"name": "books", "url": "https://example.com/hook", "events": ["payment.settled"], "secret_env": "X"}


def test_a_good_endpoint_is_read(tmp_path: Path):
    config = of(parse_config({"webhooks": {"endpoints": [ENDPOINT]}}, base_dir=tmp_path)).webhooks
    assert config.endpoints == (Endpoint("books", "https://example.com/hook", ("payment.settled",), "X"),)
    assert config.endpoints[0].actions == {"settle": "payment.settled"}


@pytest.mark.parametrize(
    ("endpoint", "names"),
    [
        ({**ENDPOINT, "secret": "s3cr3t"}, "webhooks.endpoints[0].secret: a secret never goes in the configuration"),
        ({**ENDPOINT, "events": ["payment.maybe"]}, "webhooks.endpoints[0].events[0]: must be one of"),
        ({**ENDPOINT, "events": []}, "webhooks.endpoints[0].events: required"),
        ({k: v for k, v in ENDPOINT.items() if k != "url"}, "webhooks.endpoints[0].url: required"),
        ({**ENDPOINT, "url": "ftp://example.com"}, "webhooks.endpoints[0].url: must be an http(s) URL"),
        ({k: v for k, v in ENDPOINT.items() if k != "secret_env"}, "webhooks.endpoints[0].secret_env: required"),
        ({**ENDPOINT, "name": "two words"}, "webhooks.endpoints[0].name"),
        ({**ENDPOINT, "retries": 3}, "webhooks.endpoints[0].retries: unknown key"),
    ],
)
def test_a_broken_endpoint_is_refused_naming_its_key(tmp_path: Path, endpoint: dict[str, Any], names: str):
    assert names in problems({"endpoints": [endpoint]}, tmp_path)


def test_two_endpoints_of_one_name_are_refused(tmp_path: Path):
    assert "webhooks.endpoints[1].name: 'books' names two endpoints" in problems(
        {"endpoints": [ENDPOINT, ENDPOINT]}, tmp_path
    )


def test_a_lease_shorter_than_three_sends_and_a_cap_below_the_base_are_refused(tmp_path: Path):
    said = problems({"timeout_seconds": 30, "lease_seconds": 60, "endpoints": [ENDPOINT]}, tmp_path)
    assert "webhooks.lease_seconds: must be at least 3 x timeout_seconds (90)" in said
    said = problems({"backoff_seconds": 10, "max_backoff_seconds": 5}, tmp_path)
    assert "webhooks.max_backoff_seconds: must be at least backoff_seconds" in said


# -- the outbox ------------------------------------------------------------------------------------


def test_the_cursor_stops_before_a_young_gap_and_passes_an_old_one():
    now = 1000.0
    assert advance(4, [(5, now), (6, now), (7, now)], now) == 7
    assert advance(4, [(5, now), (7, now)], now) == 5  # 6 may still commit
    assert advance(4, [(5, now - 61), (7, now - 61), (8, now)], now) == 8  # 6 rolled back long ago
    assert advance(4, [(6, now)], now) == 4


def run(tmp_path: Path, test: Callable[[Database], Awaitable[None]]) -> None:
    async def main() -> None:
        db = open_database(str(tmp_path / "gate.db"))
        await db.open()
        try:
            await PaymentLog(db).create_tables()
            await Channels(db).create_tables()
            await Outbox(db, "x").create_tables()
            await test(db)
        finally:
            await db.close()

    asyncio.run(main())


async def log_rows(db: Database, *actions: str) -> None:
    log = PaymentLog(db)
    for action in actions:
        await log.append(action, agent="paid", token_digest=f"d-{action}", payer="0xab", amount="1000")


async def pending(db: Database, endpoint: str) -> list[dict[str, Any]]:
    return await db.fetch(
        "SELECT event_id, type, body, state, attempts FROM webhook_deliveries WHERE endpoint = ? ORDER BY id",
        (endpoint,),
    )


def test_an_endpoint_gets_the_rows_it_subscribes_to_from_its_first_start_on(tmp_path: Path):
    async def test(db: Database) -> None:
        await log_rows(db, "settle")  # before the endpoint existed: not its event
        outbox = Outbox(db, "replica-a")
        await outbox.register("books")
        assert await outbox.take("books", 60)
        await log_rows(db, "verify", "settle", "write_off", "channel_claim")
        assert await outbox.fill("books", {"settle": "payment.settled", "write_off": "payment.written_off"}, 0) == 4
        owed = await pending(db, "books")
        assert [(r["type"], r["state"]) for r in owed] == [
            ("payment.settled", "pending"),
            ("payment.written_off", "pending"),
        ]
        body = json.loads(owed[0]["body"])
        assert body["id"] == owed[0]["event_id"] and body["data"]["payment_id"] == "d-settle"
        # read again: nothing new, nothing twice
        assert await outbox.fill("books", {"settle": "payment.settled", "write_off": "payment.written_off"}, 0) == 0
        assert len(await pending(db, "books")) == 2

    run(tmp_path, test)


def test_one_replica_holds_an_endpoint_until_its_lease_lapses_and_then_writes_nothing(tmp_path: Path):
    async def test(db: Database) -> None:
        a, b = Outbox(db, "replica-a"), Outbox(db, "replica-b")
        await a.register("books")
        assert await a.take("books", 0.3)
        assert not await b.take("books", 60)
        await log_rows(db, "settle")
        await a.fill("books", {"settle": "payment.settled"}, 0)
        [delivery] = await a.due("books", 10)
        await asyncio.sleep(0.5)
        assert await b.take("books", 60)  # a froze past its lease
        assert not await a.take("books", 60)
        with pytest.raises(LeaseLost):
            await a.fill("books", {"settle": "payment.settled"}, 0)
        assert not await a.finish("books", delivery.id, "delivered", attempted=True)  # fenced
        assert not await a.retry("books", delivery.id, "HTTP 500", 1)
        assert (await pending(db, "books"))[0]["state"] == "pending"
        assert await b.finish("books", delivery.id, "delivered", attempted=True)

    run(tmp_path, test)


def hooks(db: Database, **settings: Any) -> tuple[Webhooks, GateMetrics]:
    endpoint = Endpoint("books", "http://127.0.0.1:9/", ("payment.settled",), "HOOK_SECRET")
    metrics = GateMetrics(CollectorRegistry())
    config = WebhooksConfig(endpoints=(endpoint,), **settings)
    return Webhooks(config, db, metrics, read_secret=lambda _: "s3cr3t"), metrics


def counted(metrics: GateMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "a2a_gate_webhook_deliveries_total", {"endpoint": "books", "outcome": outcome}
    )
    return value or 0.0


def test_past_the_backlog_bound_the_oldest_are_given_up_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    async def test(db: Database) -> None:
        webhooks, metrics = hooks(db, max_backlog=3)
        attempts: list[str] = []

        async def refused(endpoint: Endpoint, delivery: Any) -> str:
            attempts.append(delivery.event_id)
            return "HTTP 500"

        webhooks.send = refused  # type: ignore[method-assign]
        endpoint = webhooks.config.endpoints[0]
        await webhooks.one_pass(endpoint)  # starts the endpoint at the end of the log
        await log_rows(db, *["settle"] * 5)
        with caplog.at_level(logging.WARNING, "a2a_gate.webhooks"):
            await webhooks.one_pass(endpoint)
        owed = await pending(db, "books")
        assert [r["state"] for r in owed] == ["given_up", "given_up", "pending", "pending", "pending"]
        assert counted(metrics, "given_up") == 2 and counted(metrics, "failed") == 3
        assert attempts == [r["event_id"] for r in owed[2:]]  # the given-up ones were never sent
        given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
        assert given_up == [
            f"webhook books: event {r['event_id']} given up after 0 attempts: the endpoint's backlog is full"
            for r in owed[:2]
        ]
        await webhooks.read_state()
        assert metrics.registry.get_sample_value("a2a_gate_webhook_backlog", {"endpoint": "books"}) == 3
        await webhooks.client.aclose()

    run(tmp_path, test)


def test_an_event_out_of_attempts_is_given_up(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    async def test(db: Database) -> None:
        webhooks, metrics = hooks(db, max_attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.01)

        async def refused(endpoint: Endpoint, delivery: Any) -> str:
            return "timeout"

        webhooks.send = refused  # type: ignore[method-assign]
        endpoint = webhooks.config.endpoints[0]
        await webhooks.one_pass(endpoint)
        await log_rows(db, "settle")
        for _ in range(4):
            await webhooks.one_pass(endpoint)
            await asyncio.sleep(0.05)
        [row] = await pending(db, "books")
        assert (row["state"], row["attempts"]) == ("given_up", 3)
        assert counted(metrics, "failed") == 2 and counted(metrics, "given_up") == 1
        assert f"event {row['event_id']} given up after 3 attempts: timeout" in caplog.text
        await webhooks.client.aclose()

    run(tmp_path, test)


def test_a_pending_withdrawal_and_the_last_days_summary_are_events_once(tmp_path: Path):
    async def test(db: Database) -> None:
        endpoint = Endpoint("books", "http://127.0.0.1:9/", ("channel.withdrawal_at_risk", "summary.daily"), "S")
        webhooks = Webhooks(WebhooksConfig(endpoints=(endpoint,)), db, GateMetrics(CollectorRegistry()))
        await db.execute(
            "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, charged, total_claimed,"
            " withdraw_requested_at) VALUES ('0xc1', 'eip155:84532', '0xa', '0xp', '0xr', '{\"withdrawDelay\": 900}',"
            " '5000', '1000', 1700000000)"
        )
        await webhooks.outbox.register("books")
        await db.execute("UPDATE webhook_endpoints SET created_at = created_at - 2 * 86400")
        assert await webhooks.outbox.take("books", 60)
        for _ in range(2):
            webhooks.slow_duties_at.clear()
            await webhooks.slow_duties(endpoint)
        owed = await pending(db, "books")
        assert [r["type"] for r in owed] == ["channel.withdrawal_at_risk", "summary.daily"]
        withdrawal = json.loads(owed[0]["body"])["data"]
        assert withdrawal["unclaimed"] == "4000" and withdrawal["finalizable_at"] == 1700000900
        yesterday = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
        assert owed[1]["event_id"] == f"summary-{yesterday}"
        await webhooks.client.aclose()

    run(tmp_path, test)
