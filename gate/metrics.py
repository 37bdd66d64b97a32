"""The payment gate's Prometheus metrics, registered on the server's registry (served at /metrics).

Gauges that describe stored state (claims in flight, the reconciler's backlog, terminal
settlements) are read from the database before each scrape (`read_state`).
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gate.claims import Claims, ClaimState

# The outcomes the settlement, the channel jobs and the metered flow count (their modules name them).
SETTLE_OUTCOMES = ("settled", "owed", "unsettled", "needs_attention", "no_charge")
CHANNEL_TRANSACTIONS = {
    "claim": ("ok", "failed", "unknown", "refused"),
    "settle": ("ok", "failed", "unknown"),
    "refund": ("ok", "failed", "unknown"),
}
USAGE_OUTCOMES = ("priced", "capped", "stopped_at_ceiling", "pricing_failed", "usage_invalid")
WEBHOOK_OUTCOMES = ("delivered", "failed", "given_up")


class Obliged(Protocol):
    """What holds a claim obligation (the channel store: `Channels.obligation`)."""

    async def obligation(self) -> Any: ...


class GateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.facilitator_seconds = Histogram(
            "a2a_gate_facilitator_seconds",
            "Facilitator call latency",
            ["call"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.facilitator_errors = Counter(
            "a2a_gate_facilitator_errors", "Facilitator calls without an answer", ["call", "reason"], registry=registry
        )
        self.settle_failures = Counter(
            "a2a_gate_settle_failures", "Settlements that did not succeed", registry=registry
        )
        self.settlements = Counter(
            "a2a_gate_settlements",
            "Settle passes by outcome (settled, owed, unsettled, needs_attention, no_charge)",
            ["outcome"],
            registry=registry,
        )
        # by network and asset only: an agent label could name a hidden agent (server/metrics.py)
        self.revenue = Counter(
            "a2a_gate_revenue_atomic",
            "Settled amounts (a payment channel's when its vouchers are claimed on chain), in the asset's"
            " atomic units, by network and asset",
            ["network", "asset"],
            registry=registry,
        )
        self.channel_charged = Counter(
            "a2a_gate_channel_charged_atomic",
            "Amounts delivered work charged to payment channels, in atomic units, by network and asset"
            " (collected when claimed: a2a_gate_revenue_atomic)",
            ["network", "asset"],
            registry=registry,
        )
        self.authorized = Counter(
            "a2a_gate_authorized_atomic",
            "Amounts payers authorized (verified payments: the price, or an upto ceiling), in atomic units",
            ["network", "asset"],
            registry=registry,
        )
        self.usage_charges = Counter(
            "a2a_gate_usage_charges",
            "Upto deliveries charged by usage, by how the charge came out (priced; capped: the usage priced"
            " above the ceiling, which was charged; stopped_at_ceiling: a run stopped when its usage reached"
            " the ceiling; pricing_failed: charged nothing; usage_invalid: the agent reported unusable usage,"
            " only what was delivered before it charged)",
            ["outcome"],
            registry=registry,
        )
        self.vouchers = Counter(
            "a2a_gate_channel_vouchers",
            "Channel payments accepted, by who verified them (local: the gate, facilitator: a verify call)",
            ["verified_by"],
            registry=registry,
        )
        self.channel_transactions = Counter(
            "a2a_gate_channel_transactions",
            "The gate's channel transactions (claim, settle, refund) by outcome (ok, failed, unknown)",
            ["action", "outcome"],
            registry=registry,
        )
        self.unsettled = Gauge(
            "a2a_gate_claims_unsettled", "Delivered work written off (never paid)", registry=registry
        )
        self.needs_attention = Gauge(
            "a2a_gate_claims_needs_attention", "Settlements an operator must resolve", registry=registry
        )
        self.limiter_refusals = Counter(
            "a2a_gate_limiter_refusals", "Anonymous requests refused by a limiter", ["limiter"], registry=registry
        )
        # looked up once: labels() takes a lock and checks its values, the 429's costliest step after the answer
        self.refused = {"ip": self.limiter_refusals.labels("ip"), "agent": self.limiter_refusals.labels("agent")}
        self.limiter_shared = Gauge(
            "a2a_gate_limiter_shared",
            "1 while the limiters' buckets are shared through Redis, 0 while this replica answers from its own",
            registry=registry,
        )
        self.limiter_fallbacks = Counter(
            "a2a_gate_limiter_fallbacks",
            "Times Redis stopped answering and the limiters fell back to this replica's own buckets",
            registry=registry,
        )
        self.claims_lost = Counter(
            "a2a_gate_claims_lost",
            "Claims this process found taken over by another (its lease lapsed): their work stopped here",
            ["write"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "a2a_gate_reconcile_errors",
            "Owed claims put back after an error between taking them and recording an outcome",
            registry=registry,
        )
        self.clock_skew = Gauge(
            "a2a_gate_clock_skew_seconds",
            "This process's wall clock minus the database's (leases use the database's)",
            registry=registry,
        )
        self.facilitator_reachable = Gauge(
            "a2a_gate_facilitator_reachable",
            "1 when the facilitator answered the last readiness check (GET /readyz, at most every 10 s), else 0",
            registry=registry,
        )
        self.offers_withheld = Gauge(
            "a2a_gate_offers_withheld",
            "Offers not made until the facilitator's /supported advertises the address they leave to it",
            registry=registry,
        )
        # the claim obligation (DESIGN 6): charged vouchers claimed before their payers could withdraw them
        self.channels_withdrawing = Gauge(
            "a2a_gate_channels_withdrawal_pending",
            "Payment channels whose payer asked to withdraw while charges on them are unclaimed",
            registry=registry,
        )
        self.channel_oldest_unclaimed = Gauge(
            "a2a_gate_channel_oldest_unclaimed_seconds",
            "Age of the oldest charge not yet claimed on chain, over every payment channel (0: none)",
            registry=registry,
        )
        self.channel_withdrawal_finalizable = Gauge(
            "a2a_gate_channel_withdrawal_finalizable_seconds",
            "Seconds before the earliest pending withdrawal of a channel with unclaimed charges can be finalized"
            " (negative: it can be now; absent when none is pending)",
            registry=registry,
        )
        self.channels_refused = Gauge(
            "a2a_gate_channels_refused",
            "Payment channels whose latest voucher's claim the contract refused (set aside: a2a-gate channels list)",
            registry=registry,
        )
        self.channels_claim_failing = Gauge(
            "a2a_gate_channels_claim_failing",
            "Payment channels with unclaimed charges whose claims on chain failed since the last that landed"
            " (a2a-gate channels list counts them; a2a-gate channels claim tries again)",
            registry=registry,
        )
        self.claims_in_flight = Gauge("a2a_gate_claims_in_flight", "Claims running or settling", registry=registry)
        self.reconciler_backlog = Gauge(
            "a2a_gate_reconciler_backlog", "Delivered work awaiting settlement", registry=registry
        )
        # by the endpoint's configured name (the operator's word, never a caller's)
        self.webhook_deliveries = Counter(
            "a2a_gate_webhook_deliveries",
            "Webhook delivery attempts by endpoint and outcome (delivered; failed: tried again later; given_up:"
            " out of attempts, or pushed out of a full backlog)",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.webhook_backlog = Gauge(
            "a2a_gate_webhook_backlog", "Webhook events not yet delivered, by endpoint", ["endpoint"], registry=registry
        )

        self.zero_known_outcomes()
        self.facilitator_reachable.set(float("nan"))  # not asked yet, or no facilitator configured

    def zero_known_outcomes(self) -> None:
        """Every label set a counter is known to take, at 0 from the start: Prometheus's increase()
        sees no rise from a series that did not exist, so an alert rule would miss the first one."""
        for outcome in SETTLE_OUTCOMES:
            self.settlements.labels(outcome)
        for action, outcomes in CHANNEL_TRANSACTIONS.items():
            for outcome in outcomes:
                self.channel_transactions.labels(action, outcome)
        for outcome in USAGE_OUTCOMES:
            self.usage_charges.labels(outcome)

    async def read_state(self, claims: Claims) -> None:
        """Set the gauges of stored state from the claims table (run before each scrape)."""
        self.claims_in_flight.set(await claims.count_in_flight())
        self.reconciler_backlog.set(await claims.count_owed())
        self.unsettled.set(await claims.count(ClaimState.UNSETTLED))
        self.needs_attention.set(await claims.count(ClaimState.NEEDS_ATTENTION))

    async def read_channels(self, channels: Obliged) -> None:
        """The claim obligation's gauges, over every channel with unclaimed charges."""
        state = await channels.obligation()
        self.channels_withdrawing.set(state.pending_withdrawals)
        self.channel_oldest_unclaimed.set(state.oldest_unclaimed_seconds)
        self.channels_refused.set(state.refused)
        self.channels_claim_failing.set(state.claim_failing)
        if state.finalizable_in_seconds is None:
            self.channel_withdrawal_finalizable.set(float("nan"))
        else:
            self.channel_withdrawal_finalizable.set(state.finalizable_in_seconds)
