"""The gate's components, built once per process: the one place that composes them.

Each step of the anonymous pipeline, the reconciler and the in-band flow is handed these
parts (never the gate object), and uses only what it names of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gate import config as gate_config
from gate import flows as payment_flows
from gate.advertised import Offers
from gate.chain import Chain
from gate.charge import Charges, LiveDeliveries
from gate.claims import ClaimLost, Claims, Hold
from gate.config import GateConfig
from gate.facilitator import FacilitatorClient
from gate.flows import FlowParts, Flows
from gate.in_band import InBand
from gate.limiter import AgentLimiters, CallerLimiter, Limits, RateLimits
from gate.metrics import GateMetrics
from gate.offer_receipt import OfferReceipts
from gate.payment_log import PaymentLog
from gate.payment_required import PaymentRequiredAnswers
from gate.sealing import KeyOnDemand, Sealer
from gate.settlement import Settler
from gate.sign_in import NONCE_LABEL, SignIn
from gate.webhooks.delivery import Webhooks
from server.anonymous import Parts
from server.config import Settings
from server.methods import Methods
from server.registry import AgentRegistry
from server.tasks import TaskStore

if TYPE_CHECKING:
    from gate.shared_limiter import SharedBuckets  # imports redis


@dataclass(eq=False)
class GateParts:
    """The gate's components, and the server's parts they build on."""

    settings: Settings
    config: GateConfig
    store: TaskStore
    agents: AgentRegistry
    methods: Methods
    metrics: GateMetrics
    limits: RateLimits  # per-IP, then per-agent
    facilitator: FacilitatorClient
    claims: Claims
    flows: Flows  # how each scheme's payment is collected
    keys: KeyOnDemand
    log: PaymentLog
    chain: Chain
    settler: Settler
    charges: Charges
    answers_402: PaymentRequiredAnswers
    in_band: InBand
    offers: Offers  # what each agent can be offered now (addresses the facilitator advertises filled in)
    sign_in: SignIn  # payers signing in with their wallet to read their tasks
    shared_buckets: SharedBuckets | None = None
    webhooks: Webhooks | None = None  # with [[webhooks.endpoints]]: their deliveries
    ready: tuple[float, str] = field(default=(0.0, ""))  # the facilitator's last readiness answer, cached

    @classmethod
    def build(cls, server: Parts) -> GateParts:
        settings = server.settings
        config = gate_config.of(settings)
        limits = config.limits
        metrics = GateMetrics(server.metrics.registry)  # the gate's own, served beside the server's
        own_ip = CallerLimiter(limits.per_ip_per_minute, limits.max_entries, limits.ipv6_prefix)
        overrides = {a.name: a.per_agent_per_minute for a in config.agents.values() if a.per_agent_per_minute}
        own_agents = AgentLimiters(limits.per_agent_per_minute, overrides)
        local_limits = Limits(own_ip, own_agents)
        rate_limits: RateLimits = local_limits
        shared_buckets = None
        if limits.redis_url:  # several replicas: the buckets live in Redis
            from gate.shared_limiter import shared_limiters  # redis is imported only when configured

            shared_buckets, rate_limits = shared_limiters(limits, local_limits, metrics)
        facilitator = FacilitatorClient(config.facilitator, metrics)
        live = LiveDeliveries(metrics)
        claims = Claims(server.db, config.claim_lease_seconds, on_lost=live.lost)
        log = PaymentLog(server.db)
        chain = Chain(config.networks)
        keys = KeyOnDemand(settings.database)
        flows = payment_flows.build(FlowParts(config, server.db, facilitator, chain, log, metrics, keys, claims))
        signs = OfferReceipts(server.signing_key, config.offer_receipt.format) if server.signing_key else None
        settler = Settler(
            facilitator,
            claims,
            log,
            config.facilitator,
            flows,
            metrics,
            pass_interval=config.reconcile_interval_seconds,
            receipts=signs,
            public_url=settings.public_url,
        )
        answers_402 = PaymentRequiredAnswers(offers=signs)
        server.metrics.before_scrape.append(lambda: metrics.read_state(claims))
        server.metrics.before_scrape.extend(flow.read_state for flow in flows)
        offers = Offers(config.agents)

        async def count_withheld() -> None:
            metrics.offers_withheld.set(len(offers.waiting()))

        server.metrics.before_scrape.append(count_withheld)
        webhooks = Webhooks(config.webhooks, server.db, metrics) if config.webhooks.endpoints else None
        if webhooks is not None:
            server.metrics.before_scrape.append(webhooks.read_state)
        parts = cls(
            settings=settings,
            config=config,
            store=server.store,
            agents=server.agents,
            methods=server.methods,
            metrics=metrics,
            limits=rate_limits,
            facilitator=facilitator,
            claims=claims,
            flows=flows,
            keys=keys,
            log=log,
            chain=chain,
            settler=settler,
            charges=Charges(claims, settler, log, live, keys),
            answers_402=answers_402,
            in_band=InBand(server.store, server.methods, config.in_band, answers_402),
            offers=offers,
            sign_in=SignIn(server.db, lambda: keys.sealer.derive(NONCE_LABEL)),
            shared_buckets=shared_buckets,
            webhooks=webhooks,
        )
        return parts

    @property
    def sealer(self) -> Sealer:
        """Loaded at the first seal or unseal: `a2a-gate migrate` needs no key."""
        return self.keys.sealer

    async def release(self, hold: Hold) -> None:
        """Release a claim of this request before its work started (a refusal, an outage); a
        claim already taken over is left to its new owner (logged and counted as lost)."""
        try:
            await self.claims.release(hold)
        except ClaimLost:
            pass
