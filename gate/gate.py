"""The payment gate's parts, built once per process, and its background duties.

`PaymentGate.handle` is the anonymous branch of the endpoint (see `gate.pipeline`).
On start the gate resolves claims a crashed process left behind, then runs the
reconciler, which settles delivered-but-unsettled work exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from gate.claims import RUNNING, SETTLING, Claims
from gate.facilitator import FacilitatorClient, Unavailable
from gate.limiter import AgentLimiters, CallerLimiter
from gate.payment_log import PaymentLog
from gate.pipeline import handle_anonymous
from gate.pricing import PaymentRequiredAnswers
from gate.sealing import Sealer, load_key
from gate.settlement import Payment, Settler, attach_payment_metadata
from server.dialects import TERMINAL_STATES
from server.execution import Settlement
from server.tasks import agent_message, set_status

if TYPE_CHECKING:
    from server.app import Services

logger = logging.getLogger("a2a_gate.gate")


class PaymentGate:
    def __init__(self, services: Services) -> None:
        settings = services.settings
        self.services = services
        self.ip_limiter = CallerLimiter(settings.per_ip_per_minute, settings.limiter_max_entries, settings.ipv6_prefix)
        overrides = {a.name: a.per_agent_per_minute for a in settings.agents.values() if a.per_agent_per_minute}
        self.agent_limiters = AgentLimiters(settings.per_agent_per_minute, overrides)
        self.metrics = services.metrics
        self.facilitator = FacilitatorClient(settings.facilitator, services.metrics)
        self.claims = Claims(services.db)
        self.log = PaymentLog(services.db)
        self.sealer = Sealer(load_key(settings.database))
        self.settler = Settler(self.facilitator, self.claims, self.log, settings.facilitator, services.metrics)
        self.answers_402 = PaymentRequiredAnswers()
        self.reconciler: asyncio.Task[None] | None = None
        self.ready: tuple[float, str] = (0.0, "")
        services.metrics.watch_state(self.claims.count_in_flight, self.claims.count_owed)

    async def handle(self, request: Request, agent: str) -> Response:
        return await handle_anonymous(self, request, agent)

    def settlement_for(self, payment: Payment) -> Settlement:
        """The hooks an execution calls: settle after delivery, release otherwise."""

        def mark_delivered() -> None:
            self.claims.settling(payment.token_digest)

        async def delivered(task: dict[str, Any]) -> dict[str, Any]:
            return await self.settler.settle(payment, task["id"])

        async def not_delivered(task: dict[str, Any]) -> None:
            self.claims.release(payment.token_digest)
            self.log.append("release", **payment.log_fields(task["id"]),
                            error=f"task {task['status']['state']}: not charged")

        return Settlement(mark_delivered=mark_delivered, delivered=delivered, not_delivered=not_delivered)

    async def facilitator_ready(self, ttl: float = 10.0) -> str:
        """"ok", "not configured", or the reason the facilitator cannot be reached (cached)."""
        if not self.facilitator.configured:
            return "not configured"
        checked_at, answer = self.ready
        if time.monotonic() - checked_at > ttl:
            try:
                await self.facilitator.supported()
                answer = "ok"
            except Unavailable as exc:
                answer = f"unavailable: {exc.reason}"
            self.ready = (time.monotonic(), answer)
        return answer

    async def start(self) -> None:
        self.recover()
        if self.facilitator.configured:
            self.reconciler = asyncio.create_task(self._reconcile_loop())

    async def close(self) -> None:
        if self.reconciler is not None:
            self.reconciler.cancel()
        await self.facilitator.aclose()

    def recover(self) -> None:
        """Resolve claims of a crashed process: undelivered work is released, delivered work is owed."""
        store = self.services.store
        for row in self.claims.orphans():
            if row["state"] == SETTLING:
                self.claims.settle_failed(row["token_digest"])
                continue
            assert row["state"] == RUNNING
            self.claims.release(row["token_digest"])
            self.log.append("release", agent=row["agent"], token_digest=row["token_digest"], payer=row["payer"],
                            task_id=row["task_id"], error="interrupted by a restart: not charged")
            task = store.get(row["task_id"], f"payer:{row['payer']}", row["agent"]) if row["task_id"] else None
            if task is not None and task["status"]["state"] not in TERMINAL_STATES:
                set_status(task, "failed", agent_message(task, "Interrupted by a server restart; nothing was charged."))
                store.save(task)

    async def reconcile(self, older_than: float = 0.0) -> list[dict[str, Any]]:
        """Settle owed claims once each; returns one outcome per claim attempted."""
        outcomes = []
        for row in self.claims.owed(older_than=older_than):
            if not self.claims.take_owed(row["token_digest"]):
                continue
            payload = self.sealer.unseal(row["sealed_payment"], row["token_digest"])
            outcomes.append(await self.settle_owed(row, payload))
        return outcomes

    async def settle_owed(self, row: dict[str, Any], sealed: dict[str, Any]) -> dict[str, Any]:
        """Settle one owed claim (already taken for this process) and update its task."""
        config = self.services.agents.get(row["agent"])
        price = config.price if config is not None else None
        amount, network, asset = (price.amount, price.network, price.asset) if price else ("", "", "")
        payment = Payment(row["token_digest"], sealed["version"], sealed["payload"], sealed["requirements"],
                          row["agent"], row["payer"], amount, network, asset)
        metadata = await self.settler.settle(payment, row["task_id"])
        store = self.services.store
        task = store.get(row["task_id"], f"payer:{row['payer']}", row["agent"])
        if task is not None:
            attach_payment_metadata(task, metadata)
            store.save(task)
        return {"task_id": row["task_id"], "payer": row["payer"], "agent": row["agent"], **metadata}

    async def _reconcile_loop(self) -> None:
        interval = self.services.settings.reconcile_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reconcile(older_than=interval)
            except Exception:
                logger.exception("reconciler pass failed")
