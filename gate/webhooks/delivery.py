"""Delivering webhook events: at least once, retried with backoff, never on a request's path.

Every replica runs one loop per endpoint, in the background; only the holder of the endpoint's
lease (gate/webhooks/outbox.py) reads its events and sends them, so two replicas never send one
event at once. A round sends at most `max_in_flight` events at once, each bounded as a whole by
`timeout_seconds` (connect, send and the answer's head; redirects are not followed, and count as a
failure); the lease is renewed before each round and is at least three timeouts long, so a round
always ends inside it. A 2xx answer is a delivery; anything else (a status, a timeout, a refused
connection) is tried again after `backoff`, up to `max_attempts`, then given up, with a log line and
`a2a_gate_webhook_deliveries_total{outcome="given_up"}`. A dead endpoint costs its own loop's time
and nothing else: requests never wait for a delivery, nor another endpoint for this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets as random_ids
import time
from collections.abc import Callable

import httpx

from gate.flows.channel.store import Channels
from gate.metrics import WEBHOOK_OUTCOMES, GateMetrics
from gate.payment_summary import summary
from gate.webhooks import events, signing
from gate.webhooks.config import DAILY_SUMMARY, WITHDRAWAL_AT_RISK, Endpoint, WebhooksConfig
from gate.webhooks.outbox import PAGE, Delivery, LeaseLost, Outbox
from server import secret_files
from server.database import Database
from server.request_counts import day_of

logger = logging.getLogger("a2a_gate.webhooks")

ROUNDS_PER_PASS = 8  # rounds of sends before a pass looks for new events again
SLOW_DUTIES_SECONDS = 15.0  # pending withdrawals, the daily summary and old rows: looked at this often


def backoff(attempts: int, base: float, cap: float, draw: Callable[[], float] = random.random) -> float:
    """The wait after an event's `attempts`-th failure: `base` doubled each time, at most `cap`, then
    jittered down by up to half (replicas and events retrying together spread out)."""
    delay = min(cap, base * 2 ** min(attempts - 1, 60))
    return delay * (1 - draw() / 2)


class Webhooks:
    """The webhook deliveries of this process: one loop per endpoint, under its lease."""

    def __init__(
        self,
        config: WebhooksConfig,
        db: Database,
        metrics: GateMetrics,
        *,
        read_secret: Callable[[str], str | None] = secret_files.secret,
    ) -> None:
        self.config = config
        self.db = db
        self.metrics = metrics
        self.outbox = Outbox(db, owner=random_ids.token_hex(8))
        self.channels = Channels(db)
        self.read_secret = read_secret
        self.client = httpx.AsyncClient(
            timeout=config.timeout_seconds,
            follow_redirects=False,  # a redirect is a failed delivery: the operator fixes the URL
            limits=httpx.Limits(max_connections=config.max_in_flight * max(1, len(config.endpoints))),
        )  # (a proxy from the environment, HTTPS_PROXY, is used as the facilitator client uses it)
        self.slow_duties_at: dict[str, float] = {}
        self.registered: set[str] = set()  # endpoints this process has seen in the store
        for endpoint in config.endpoints:
            for outcome in WEBHOOK_OUTCOMES:
                metrics.webhook_deliveries.labels(endpoint.name, outcome)
            metrics.webhook_backlog.labels(endpoint.name).set(0)

    async def create_tables(self) -> None:
        await self.outbox.create_tables()

    async def read_state(self) -> None:
        """The backlog gauge, from the store (before each scrape)."""
        backlog = await self.outbox.backlog()
        for endpoint in self.config.endpoints:
            self.metrics.webhook_backlog.labels(endpoint.name).set(backlog.get(endpoint.name, 0))

    async def run(self) -> None:
        """Every endpoint's loop, until cancelled."""
        await asyncio.gather(*(self.loop(endpoint) for endpoint in self.config.endpoints))

    async def loop(self, endpoint: Endpoint) -> None:
        while True:
            busy = False
            try:
                busy = await self.one_pass(endpoint)
            except asyncio.CancelledError:
                raise
            except LeaseLost:
                pass  # another replica serves it now
            except Exception:  # an outage or a bug of ours: the next pass tries again
                logger.exception("webhook pass for %s failed", endpoint.name)
            if not busy:
                await asyncio.sleep(self.config.poll_interval_seconds)

    async def one_pass(self, endpoint: Endpoint) -> bool:
        """Queue what is new, then send what is due, while this process holds the endpoint's lease;
        whether there may be more to do at once."""
        config, outbox = self.config, self.outbox
        if endpoint.name not in self.registered:
            await outbox.register(endpoint.name)
            self.registered.add(endpoint.name)
        if not await outbox.take(endpoint.name, config.lease_seconds):
            return False
        await self.slow_duties(endpoint)
        read = await outbox.fill(endpoint.name, endpoint.actions, time.time())
        for row in await outbox.bound(endpoint.name, config.max_backlog):
            self.given_up(endpoint, row["event_id"], int(row["attempts"]), "the endpoint's backlog is full")
        sent = 0
        for _ in range(ROUNDS_PER_PASS):
            due = await outbox.due(endpoint.name, config.max_in_flight)
            if not due or not await outbox.take(endpoint.name, config.lease_seconds):
                break
            await asyncio.gather(*(self.deliver(endpoint, delivery) for delivery in due))
            sent += len(due)
        return read >= PAGE or sent >= ROUNDS_PER_PASS * config.max_in_flight

    async def slow_duties(self, endpoint: Endpoint) -> None:
        """Now and then: pending withdrawals, the last day's summary, and old rows forgotten."""
        now = time.time()
        if now - self.slow_duties_at.get(endpoint.name, 0.0) < SLOW_DUTIES_SECONDS:
            return
        self.slow_duties_at[endpoint.name] = now
        if endpoint.wants(WITHDRAWAL_AT_RISK):
            for channel in await self.channels.withdrawals_at_risk():
                await self.outbox.add(endpoint.name, events.withdrawal_at_risk(channel, now))
        if endpoint.wants(DAILY_SUMMARY):
            today = now - now % 86400
            day = day_of(today - 86400)
            if await self.outbox.summary_due(endpoint.name, day, today - 86400):
                rows = await summary(self.db, today - 86400, today)
                await self.outbox.add_summary(endpoint.name, day, events.daily_summary(day, rows, now))
        await self.outbox.forget_old(endpoint.name)

    async def deliver(self, endpoint: Endpoint, delivery: Delivery) -> None:
        error = await self.send(endpoint, delivery)
        name = endpoint.name
        if error is None:
            if await self.outbox.finish(name, delivery.id, "delivered", attempted=True):
                self.metrics.webhook_deliveries.labels(name, "delivered").inc()
            return
        attempts = delivery.attempts + 1
        if attempts >= self.config.max_attempts:
            if await self.outbox.finish(name, delivery.id, "given_up", error, attempted=True):
                self.given_up(endpoint, delivery.event_id, attempts, error)
            return
        delay = backoff(attempts, self.config.backoff_seconds, self.config.max_backoff_seconds)
        if await self.outbox.retry(name, delivery.id, error, delay):
            self.metrics.webhook_deliveries.labels(name, "failed").inc()
            logger.info(
                "webhook %s: event %s not delivered (%s), tried again in %.1f s", name, delivery.event_id, error, delay
            )

    def given_up(self, endpoint: Endpoint, event_id: str, attempts: int, why: str) -> None:
        self.metrics.webhook_deliveries.labels(endpoint.name, "given_up").inc()
        logger.warning("webhook %s: event %s given up after %d attempts: %s", endpoint.name, event_id, attempts, why)

    async def send(self, endpoint: Endpoint, delivery: Delivery) -> str | None:
        """POST one event, signed now; None when the endpoint took it (2xx), else why not."""
        secret = self.read_secret(endpoint.secret_env)
        if not secret or not signing.secrets_of(secret):
            return f"{endpoint.secret_env} is not set"
        body = delivery.body.encode()
        headers = signing.headers(signing.secrets_of(secret), delivery.event_id, int(time.time()), body)
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                answer = await self.client.post(endpoint.url, content=body, headers=headers)
        except TimeoutError:
            return "timeout"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if 200 <= answer.status_code < 300:
            return None
        return f"HTTP {answer.status_code}"

    async def close(self) -> None:
        if self.registered:  # (a command that only opened the store has nothing to hand over)
            with contextlib.suppress(Exception):
                await self.outbox.release(sorted(self.registered))
        await self.client.aclose()
