"""The payment gate: the anonymous path of a2a-gate (`server.anonymous.AnonymousPath`).

`PaymentGate.handle` is the anonymous branch of the endpoint (`gate.pipeline`). Its parts
are built once (`gate.parts.GateParts`); on start it resolves the claims a crashed process
left behind, then runs the reconciler (`gate.reconciler`) and the webhook deliveries (`gate.webhooks`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from gate import advertised, in_band, reconciler, sealing
from gate.chain import Chain
from gate.claims import Claims
from gate.console import console_app
from gate.facilitator import FacilitatorClient, Unavailable
from gate.flows.channel import flow as channel
from gate.flows.channel import jobs as channel_jobs
from gate.parts import GateParts
from gate.pipeline import handle_anonymous
from gate.reload import reloaded_terms
from gate.sealing import Sealer
from gate.webhooks import outbox
from server.anonymous import Parts
from server.cards import agent_url
from server.config import AgentConfig, Settings
from server.reload import Reloaded
from server.request_log import RequestInfo

# What a request on the anonymous path ends as, beside the server's outcomes (request log, metrics).
OUTCOMES = frozenset({"paid", "replay", "payment_required", "rejected", "verify_unavailable", "in_flight"})


class PaymentGate:
    """Pay per request: the gate's parts, its pipeline, and its background duties."""

    outcomes = OUTCOMES

    def __init__(self, parts: GateParts) -> None:
        self.parts = parts
        self.background: list[asyncio.Task[None]] = []
        self.asking: asyncio.Task[str] | None = None  # the readiness check a scrape started

    @classmethod
    def from_parts(cls, server: Parts) -> PaymentGate:
        """The factory `create_app(settings, anonymous=...)` is given."""
        gate = cls(GateParts.build(server))
        server.metrics.before_scrape.append(gate.ask_facilitator)
        return gate

    @property
    def claims(self) -> Claims:
        return self.parts.claims

    @property
    def facilitator(self) -> FacilitatorClient:
        return self.parts.facilitator

    @property
    def chain(self) -> Chain:
        return self.parts.chain

    @property
    def sealer(self) -> Sealer:
        return self.parts.sealer

    async def handle(self, request: Request, agent: str, info: RequestInfo) -> Response:
        return await handle_anonymous(self.parts, request, agent, info)

    @staticmethod
    def scrub_message(message: dict[str, Any]) -> dict[str, Any]:
        """Handed to the server: a message keeps no signed payment material, on any path."""
        return in_band.scrub(message)

    @staticmethod
    def agent_view(message: dict[str, Any]) -> dict[str, Any]:
        """Handed to the server: an agent sees no payment metadata, on any path."""
        return in_band.agent_view(message)

    def card_extensions(self, agent: AgentConfig, public_url: str) -> list[dict[str, Any]]:
        """Handed to the server's card: the x402 extensions a priced agent accepts."""
        return in_band.card_extensions(self.parts.offers.agent(agent.name).price, agent_url(public_url, agent.name))

    async def readiness(self) -> dict[str, str]:
        return {
            "facilitator": await self.facilitator_ready(),
            "facilitator_breaker": self.facilitator.breaker.state,
            "offers": self.parts.offers.describe(),
        }

    async def expire(self, older_than_seconds: float) -> None:
        await self.claims.expire(older_than_seconds)
        await self.parts.sign_in.expire()

    async def facilitator_ready(self, ttl: float = 10.0) -> str:
        """ "ok", "not configured", or the reason the facilitator cannot be reached (cached)."""
        parts = self.parts
        if not parts.facilitator.configured:
            return "not configured"
        checked_at, answer = parts.ready
        if time.monotonic() - checked_at > ttl:
            try:
                await parts.facilitator.supported()
                answer = "ok"
            except Unavailable as exc:
                answer = f"unavailable: {exc.reason}"
            parts.ready = (time.monotonic(), answer)
            parts.metrics.facilitator_reachable.set(1 if answer == "ok" else 0)
        return answer

    async def ask_facilitator(self) -> None:
        """Before a scrape: start the readiness check when its answer is stale (at most every 10 s),
        so `a2a_gate_facilitator_reachable` is current without a load balancer asking /readyz. The
        scrape does not wait for it (it shows the last answer): a facilitator that hangs must not
        make the metrics time out with it."""
        if self.parts.facilitator.configured and (self.asking is None or self.asking.done()):
            self.asking = asyncio.create_task(self.facilitator_ready())

    async def open_store(self) -> None:
        await self.claims.create_tables()
        for flow in self.parts.flows:
            await flow.create_tables()
        await self.parts.log.create_tables()
        await self.parts.sign_in.create_tables()
        await self.claims.db.migrate("sealing", sealing.MIGRATIONS)
        await self.claims.db.migrate("webhooks", outbox.MIGRATIONS)  # (with or without endpoints: one schema)

    async def check_sealing_key(self) -> None:
        await reconciler.check_sealing_key(self.parts)

    async def start(self) -> None:
        parts = self.parts
        if parts.shared_buckets is not None:
            await parts.shared_buckets.start()
        await reconciler.check_sealing_key(parts)
        await reconciler.check_clock(parts)
        self.background.append(asyncio.create_task(reconciler.renew_leases(parts)))
        await reconciler.recover(parts)
        if parts.facilitator.configured and parts.offers.waiting():  # addresses left to the facilitator
            await advertised.learn_from(parts.offers, parts.facilitator)  # before any 402 is rendered
            self.keep_learning()
        if parts.webhooks is not None:  # never on a request's path: a loop per endpoint, under its lease
            self.background.append(asyncio.create_task(parts.webhooks.run(), name="webhooks"))
        if parts.facilitator.configured:
            self.background.append(asyncio.create_task(reconciler.reconcile_loop(parts)))
            for flow in parts.flows:
                self.background.extend(asyncio.create_task(job) for job in flow.jobs())

    async def reload(self, settings: Settings) -> Reloaded:
        """Handed to the server (SIGHUP): the agents' terms from the file read again (`gate.reload`)."""
        parts = self.parts
        parts.config, reloaded = reloaded_terms(parts.config, settings)
        parts.offers.reprice(parts.config.agents)
        parts.answers_402.rendered.clear()  # rendered from the terms before (a price, its extensions)
        if parts.facilitator.configured and parts.offers.waiting() and not self.learning():
            await advertised.learn_from(parts.offers, parts.facilitator)  # before its 402 is rendered
            self.keep_learning()
        return reloaded

    def learning(self) -> bool:
        """Whether the offers still ask the facilitator's `/supported` for what they wait for."""
        return any(job.get_name() == "learning" and not job.done() for job in self.background)

    def keep_learning(self) -> None:
        parts = self.parts
        interval = parts.config.reconcile_interval_seconds
        stale = parts.answers_402.rendered.clear  # the 402s rendered before an offer changed
        learning = advertised.keep_learning(parts.offers, parts.facilitator, interval, stale)
        self.background.append(asyncio.create_task(learning, name="learning"))

    def console(self) -> ASGIApp:
        """Handed to the server: the operator's console (`gate.console`), on the operations listener."""
        return console_app(self.parts)

    async def close(self) -> None:
        for job in self.background:
            job.cancel()
        if self.asking is not None:
            self.asking.cancel()
        if self.parts.webhooks is not None:
            await self.parts.webhooks.close()
        await self.facilitator.aclose()
        await self.chain.aclose()
        if self.parts.shared_buckets is not None:
            await self.parts.shared_buckets.close()

    async def claim_channels(self, *, now: bool = False) -> list[dict[str, Any]]:
        return await channel_jobs.claim_due(channel.of(self.parts.flows), now=now)

    async def refund_channels(self, idle_seconds: float | None = None) -> list[dict[str, Any]]:
        return await channel_jobs.refund_idle(channel.of(self.parts.flows), idle_seconds)

    async def recover(self) -> None:
        await reconciler.recover(self.parts)

    async def reconcile(self, *, now: bool = False) -> list[dict[str, Any]]:
        return await reconciler.reconcile(self.parts, now=now)

    async def reconcile_once(self) -> list[dict[str, Any]]:
        return await reconciler.reconcile_once(self.parts)
