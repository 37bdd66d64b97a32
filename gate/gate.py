"""The payment gate's parts, built once per process, and its background duties.

`PaymentGate.handle` is the anonymous branch of the endpoint (see `gate.pipeline`).
On start the gate resolves claims a crashed process left behind, then runs the
reconciler, which settles delivered-but-unsettled work exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from gate import in_band, sealing
from gate.chain import Chain
from gate.claims import FINAL_STATES, Claim, ClaimLost, Claims, ClaimState, Hold
from gate.facilitator import FacilitatorClient, Unavailable
from gate.limiter import AgentLimiters, CallerLimiter, RateLimit
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.pipeline import handle_anonymous
from gate.pricing import PaymentRequiredAnswers
from gate.sealing import Sealer, SealingKeyMissing, load_key
from gate.settlement import (
    ERROR,
    STATUS,
    Collection,
    Payment,
    Settler,
    attach_payment_metadata,
    metadata_for,
    verified_metadata,
    with_payment_metadata,
    withheld_metadata,
)
from server.agents import AgentRegistry
from server.anonymous import Parts
from server.cards import agent_url
from server.config import AgentConfig, Settings
from server.database import Database, commit_until_stored
from server.dialects import TERMINAL_STATES
from server.execution import Collected, OwnershipLost, Settlement
from server.methods import Methods
from server.metrics import Metrics
from server.tasks import TaskStore, agent_message, set_status

if TYPE_CHECKING:
    from gate.shared_limiter import SharedBuckets  # imports redis

logger = logging.getLogger("a2a_gate.gate")

HANDED_OVER = "settlement_handed_over: another server took this payment's claim over and records its outcome"
# A wall clock this far (as a fraction of the lease) from the database's is reported.
CLOCK_SKEW_WARNING = 0.1


class PaymentGate:
    """The anonymous path of a2a-gate (`server.anonymous.AnonymousPath`): pay per request."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        store: TaskStore,
        agents: AgentRegistry,
        methods: Methods,
        metrics: Metrics,
    ) -> None:
        self.settings, self.store, self.agents, self.methods = settings, store, agents, methods
        self.metrics = GateMetrics(metrics.registry)  # the gate's own, served beside the server's
        own_ip = CallerLimiter(settings.per_ip_per_minute, settings.limiter_max_entries, settings.ipv6_prefix)
        overrides = {a.name: a.per_agent_per_minute for a in settings.agents.values() if a.per_agent_per_minute}
        own_agents = AgentLimiters(settings.per_agent_per_minute, overrides)
        self.ip_limiter: RateLimit = own_ip
        self.agent_limiters: RateLimit = own_agents
        self.shared_buckets: SharedBuckets | None = None
        if settings.limiter_redis_url:  # several replicas: the buckets live in Redis
            from gate.shared_limiter import shared_limiters  # redis is imported only when configured

            self.shared_buckets, self.ip_limiter, self.agent_limiters = shared_limiters(
                settings, own_ip, own_agents, self.metrics
            )
        self.facilitator = FacilitatorClient(settings.facilitator, self.metrics)
        self.claims = Claims(db, settings.claim_lease_seconds)
        self.log = PaymentLog(db)
        self.chain = Chain(settings.networks)
        self.settler = Settler(
            self.facilitator,
            self.claims,
            self.log,
            settings.facilitator,
            self.metrics,
            self.chain,
            pass_interval=settings.reconcile_interval_seconds,
        )
        self.answers_402 = PaymentRequiredAnswers()
        self.background: list[asyncio.Task[None]] = []
        self.settlements: dict[Hold, Settlement] = {}  # the live executions' hooks, by the hold they write under
        self.claims.on_lost = self._claim_lost
        self.ready: tuple[float, str] = (0.0, "")
        metrics.before_scrape.append(lambda: self.metrics.read_state(self.claims))

    @functools.cached_property
    def sealer(self) -> Sealer:
        """Loaded at the first seal or unseal: `a2a-gate migrate` needs no key."""
        return Sealer(load_key(self.settings.database))

    @classmethod
    def from_parts(cls, parts: Parts) -> PaymentGate:
        """The factory `create_app(settings, anonymous=...)` is given."""
        return cls(
            settings=parts.settings,
            db=parts.db,
            store=parts.store,
            agents=parts.agents,
            methods=parts.methods,
            metrics=parts.metrics,
        )

    async def handle(self, request: Request, agent: str) -> Response:
        return await handle_anonymous(self, request, agent)

    @staticmethod
    def scrub_message(message: dict[str, Any]) -> dict[str, Any]:
        """Handed to the server: a message keeps no signed payment material, on any path."""
        return in_band.scrub(message)

    @staticmethod
    def agent_view(message: dict[str, Any]) -> dict[str, Any]:
        """Handed to the server: an agent sees no payment metadata, on any path."""
        return in_band.agent_view(message)

    @staticmethod
    def card_extensions(agent: AgentConfig, public_url: str) -> list[dict[str, Any]]:
        """Handed to the server's card: the x402 extensions a priced agent accepts."""
        return in_band.card_extensions(agent.price, agent_url(public_url, agent.name))

    def settlement_for(self, payment: Payment, hold: Hold) -> Settlement:
        """The hooks an execution calls: settle after delivery, release otherwise. Every write
        names `hold`; one that finds the claim taken over raises `OwnershipLost` to the server."""
        agent = self.agents.get(payment.agent)
        withhold = agent is not None and agent.on_settle_failure == "withhold"
        outcome: list[Collection] = []

        async def mark_delivered(withheld: dict[str, Any] | None) -> None:
            try:
                await self.claims.mark_delivered(hold, withheld)
            except ClaimLost as lost:
                self.settlements.pop(hold, None)
                raise OwnershipLost(str(lost)) from None

        async def delivered(task: dict[str, Any]) -> Collected:
            try:
                collection = await self.settler.settle(payment, task["id"], hold)
            except ClaimLost:  # delivered, then taken over while settling: the new owner records it
                collection = Collection(ClaimState.SETTLE_FAILED, verified_metadata(HANDED_OVER))
            outcome.append(collection)
            unpaid_answer = withhold and not collection.paid
            metadata = withheld_metadata(collection.metadata) if unpaid_answer else collection.metadata
            task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)  # mirrored at task.metadata
            return Collected(metadata, collection.paid)

        async def not_delivered(task: dict[str, Any]) -> None:
            async def write() -> None:
                await self.claims.release(hold)
                await self.log.append(
                    "release", **payment.log_fields(task["id"]), error=f"task {task['status']['state']}: not charged"
                )

            self.settlements.pop(hold, None)
            try:
                await commit_until_stored(self.claims.db, write, "a release")
            except ClaimLost as lost:
                raise OwnershipLost(str(lost)) from None

        async def saved() -> None:
            self.settlements.pop(hold, None)
            try:
                await self.claims.task_synced(hold, final=bool(outcome) and outcome[-1].state in FINAL_STATES)
            except ClaimLost as lost:
                raise OwnershipLost(str(lost)) from None

        def abandoned() -> None:
            self.settlements.pop(hold, None)
            self.claims.let_go(hold)

        settlement = Settlement(
            mark_delivered=mark_delivered,
            delivered=delivered,
            not_delivered=not_delivered,
            saved=saved,
            abandoned=abandoned,
            withhold=withhold,
        )
        self.settlements[hold] = settlement
        return settlement

    def _claim_lost(self, lost: ClaimLost) -> None:
        """A fenced write (or a renewal) found a claim of ours taken over: stop the work it covered."""
        logger.warning(
            "lost claim %s at %s: another process took it over after its lease lapsed;"
            " its work is stopped here and nothing more is recorded for it by this process",
            lost.hold.token_digest[:12],
            lost.write,
        )
        self.metrics.claims_lost.labels(lost.write).inc()
        settlement = self.settlements.pop(lost.hold, None)
        if settlement is not None:
            settlement.revoke()

    async def release(self, hold: Hold) -> None:
        """Release a claim of this request before its work started (a refusal, an outage); a
        claim already taken over is left to its new owner (logged and counted as lost)."""
        try:
            await self.claims.release(hold)
        except ClaimLost:
            pass

    async def readiness(self) -> dict[str, str]:
        return {"facilitator": await self.facilitator_ready(), "facilitator_breaker": self.facilitator.breaker.state}

    async def expire(self, older_than_seconds: float) -> None:
        await self.claims.expire(older_than_seconds)

    async def facilitator_ready(self, ttl: float = 10.0) -> str:
        """ "ok", "not configured", or the reason the facilitator cannot be reached (cached)."""
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
            self.metrics.facilitator_reachable.set(1 if answer == "ok" else 0)
        return answer

    async def open_store(self) -> None:
        await self.claims.create_tables()
        await self.log.create_tables()
        await self.claims.db.migrate("sealing", sealing.MIGRATIONS)

    async def check_sealing_key(self) -> None:
        """Refuse (`SealingKeyMismatch`) a key other than the one the database was sealed with;
        without a key at all there is nothing to check yet (the first seal says so)."""
        try:
            sealer = self.sealer
        except SealingKeyMissing:
            return
        await sealer.check(self.claims.db)

    async def check_clock(self) -> float:
        """This process's wall clock minus the database's, reported when it strays: leases use
        the database's clock, but token windows and log times use this one."""
        before = time.time()
        database = await self.claims.database_time()
        after = time.time()
        skew = (before + after) / 2 - database
        self.metrics.clock_skew.set(skew)
        if abs(skew) > max(1.0, CLOCK_SKEW_WARNING * self.claims.lease_seconds):
            logger.warning(
                "this process's clock differs from the database's by %+.1fs: claim leases use the"
                " database's clock, token windows and log times this one's; fix its time sync",
                skew,
            )
        return skew

    async def start(self) -> None:
        if self.shared_buckets is not None:
            await self.shared_buckets.start()
        await self.check_sealing_key()
        await self.check_clock()
        self.background.append(asyncio.create_task(self._renew_leases()))
        await self.recover()
        if self.facilitator.configured:
            self.background.append(asyncio.create_task(self._reconcile_loop()))

    async def close(self) -> None:
        for job in self.background:
            job.cancel()
        await self.facilitator.aclose()
        await self.chain.aclose()
        if self.shared_buckets is not None:
            await self.shared_buckets.close()

    async def recover(self) -> None:
        """Resolve orphans (claims whose owner's lease ran out): undelivered work is released,
        delivered work is owed, and its settle may have been sent. Each is taken under a new
        fence first, so its previous owner, should it wake up, can write nothing to it."""
        store = self.store
        for claim in await self.claims.orphans():
            hold = await self.claims.take_orphan(claim)
            if hold is None:
                continue  # its owner renewed, or another process took it
            if claim.state == ClaimState.SETTLING:
                with contextlib.suppress(ClaimLost):
                    await self.claims.orphan_settling(hold)
                continue

            async def write(claim: Claim = claim, hold: Hold = hold) -> None:
                await self.claims.release(hold)
                await self.log.append(
                    "release",
                    agent=claim.agent,
                    token_digest=claim.token_digest,
                    payer=claim.payer,
                    task_id=claim.task_id,
                    error="interrupted (its owner stopped or lost its lease): not charged",
                )
                task = await store.get(claim.task_id, f"payer:{claim.payer}", claim.agent) if claim.task_id else None
                if task is not None and task["status"]["state"] not in TERMINAL_STATES:
                    message = agent_message(task, "Interrupted by a server restart; nothing was charged.")
                    set_status(task, "failed", message)
                    await store.save(task)

            with contextlib.suppress(ClaimLost):
                await commit_until_stored(self.claims.db, write, "a release after a restart")

    async def reconcile(self, *, now: bool = False) -> list[dict[str, Any]]:
        """Settle owed claims that are due (all of them with `now`), then repair tasks left
        behind their claims; returns one outcome per claim attempted."""
        outcomes = []
        for claim in await self.claims.due(now=now):
            taken = await self.claims.take_owed(claim.token_digest, due_only=not now)
            if taken is not None:
                outcomes.append(await self.settle_owed(taken))
        for claim in await self.claims.outdated():
            hold = await self.claims.take_outdated(claim)
            if hold is not None:
                with contextlib.suppress(ClaimLost):
                    await self.show_outcome(claim, hold, metadata_for(claim))
        return outcomes

    async def reconcile_once(self) -> list[dict[str, Any]]:
        """`a2a-gate reconcile`: one pass over orphans and every owed claim, now, beside live servers
        (their claims' leases are renewed, so none is taken from them)."""
        await self.check_sealing_key()
        renewing = asyncio.create_task(self._renew_leases())
        try:
            await self.recover()
            return await self.reconcile(now=True)
        finally:
            renewing.cancel()

    async def settle_owed(self, claim: Claim) -> dict[str, Any]:
        """Settle one owed claim (already taken for this process) and show the outcome on its task.

        Whatever goes wrong between taking it and recording an outcome (a key that cannot
        unseal it, a bug) puts it back: owed again, its lease released, and logged with its cause."""
        hold = claim.hold
        summary = {"task_id": claim.task_id, "payer": claim.payer, "agent": claim.agent}
        try:
            collection = await self.settler.settle(self._owed_payment(claim), claim.task_id, hold, claim)
        except ClaimLost:
            return {**summary, "state": "lost", STATUS: "", ERROR: "taken over by another process"}
        except Exception as exc:  # noqa: BLE001 -- a stranded claim is worse than a logged bug
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            logger.error("settling owed task %s failed before an outcome (%s); it stays owed", claim.task_id, cause)
            self.metrics.reconcile_errors.inc()
            with contextlib.suppress(ClaimLost):
                await commit_until_stored(
                    self.claims.db,
                    lambda: self.claims.put_back(hold, cause, self.settings.reconcile_interval_seconds),
                    "an owed claim put back",
                )
            return {**summary, "state": str(ClaimState.SETTLE_FAILED), STATUS: "payment-verified", ERROR: cause}
        try:
            await self.show_outcome(claim, hold, collection.metadata, collection)
        except Exception:
            logger.exception("showing the outcome of task %s failed; the reconciler repairs it", claim.task_id)
            self.claims.let_go(hold)
        return {**summary, "state": str(collection.state), **collection.metadata}

    def _owed_payment(self, claim: Claim) -> Payment:
        sealed = self.sealer.unseal(claim.sealed_payment, claim.token_digest)
        config = self.agents.get(claim.agent)
        price = config.price if config is not None else None
        amount, network, asset = (price.amount, price.network, price.asset) if price else ("", "", "")
        return Payment(
            claim.token_digest,
            sealed["version"],
            sealed["payload"],
            sealed["requirements"],
            claim.agent,
            claim.payer,
            amount,
            network,
            asset,
        )

    async def show_outcome(
        self, claim: Claim, hold: Hold, metadata: dict[str, Any], collection: Collection | None = None
    ) -> None:
        """Bring a claim's stored task up to its recorded outcome (after a pass, a crash or a lost write)."""
        state = collection.state if collection is not None else claim.state
        store = self.store
        task = await store.get(claim.task_id, f"payer:{claim.payer}", claim.agent)
        if task is not None:
            if claim.withheld is None:
                attach_payment_metadata(task, metadata)
            else:
                show_withheld(task, claim.withheld, metadata, paid=state == ClaimState.SETTLED)

        async def write() -> None:
            if task is not None:
                await store.save(task)
            await self.claims.task_synced(hold, final=state in FINAL_STATES)

        await commit_until_stored(self.claims.db, write, "a repaired task")

    async def _renew_leases(self) -> None:
        """While this process lives, the claims whose work is alive here stay its own; one found
        taken over (this process stalled past its lease) has its work stopped (`_claim_lost`)."""
        interval = self.claims.lease_seconds / 3
        checks = 0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.claims.renew()
                checks += 1
                if checks % 30 == 0:
                    await self.check_clock()
            except Exception:
                logger.exception("renewing claim leases failed")

    async def _reconcile_loop(self) -> None:
        interval = self.settings.reconcile_interval_seconds
        while True:
            await asyncio.sleep(min(interval, self.claims.lease_seconds))
            try:
                await self.recover()
                await self.reconcile()
            except Exception:
                logger.exception("reconciler pass failed")


def show_withheld(task: dict[str, Any], withheld: dict[str, Any], metadata: dict[str, Any], *, paid: bool) -> None:
    """A withholding agent's task: the answer once paid, `failed` with no paid surface otherwise."""
    if paid:
        if not any(a.get("artifactId") == withheld["artifact"]["artifactId"] for a in task.get("artifacts") or []):
            task.setdefault("artifacts", []).append(withheld["artifact"])
        set_status(task, "completed", agent_message(task, withheld["text"], metadata))
    else:
        metadata = withheld_metadata(metadata)
        set_status(task, "failed", agent_message(task, "Payment failed: the answer is withheld.", metadata))
    task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)
