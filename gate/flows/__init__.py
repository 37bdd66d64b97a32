"""The ways a payment is collected, one home each, found by the scheme a payment is in.

A scheme says what a valid payload is (gate/schemes/); a flow says how its money is collected
(`base.Flow`). A new collection model is a module (or a package) here and one line in `FLOWS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gate import schemes
from gate.chain import Chain
from gate.claims import Claims
from gate.config import GateConfig
from gate.facilitator import FacilitatorClient
from gate.flows.authorization import AuthorizationFlow
from gate.flows.base import Flow
from gate.flows.channel.flow import ChannelFlow
from gate.flows.channel.store import Channels
from gate.flows.metered import MeteredFlow
from gate.metrics import GateMetrics
from gate.payment import Payment
from gate.payment_log import PaymentLog
from gate.price import Price
from gate.sealing import KeyOnDemand
from server.database import Database

__all__ = ["FLOWS", "Flow", "FlowParts", "Flows"]


@dataclass(frozen=True)
class FlowParts:
    """What the flows are built from; each takes only what it uses."""

    config: GateConfig
    db: Database
    facilitator: FacilitatorClient
    chain: Chain
    log: PaymentLog
    metrics: GateMetrics
    keys: KeyOnDemand
    claims: Claims


# x402's scheme name -> how its payments are collected
FLOWS: dict[str, Callable[[FlowParts], Flow]] = {
    "exact": lambda p: AuthorizationFlow(p.facilitator, p.chain, p.metrics),
    "upto": lambda p: MeteredFlow(p.facilitator, p.chain, p.metrics, p.claims, p.keys),
    "batch-settlement": lambda p: ChannelFlow(
        Channels(p.db), p.facilitator, p.chain, p.log, p.metrics, p.keys, p.config
    ),
}
DEFAULT = "exact"  # a payment of no known scheme is read as an authorization (its refusals unread)


class Flows:
    """The gate's flows, by scheme name."""

    def __init__(self, by_scheme: Mapping[str, Flow]) -> None:
        self.by_scheme = dict(by_scheme)

    @classmethod
    def build(cls, parts: FlowParts) -> Flows:
        return cls({name: build(parts) for name, build in FLOWS.items()})

    def __iter__(self) -> Iterator[Flow]:
        return iter(self.by_scheme.values())

    def named(self, scheme: str) -> Flow:
        return self.by_scheme.get(scheme) or self.by_scheme[DEFAULT]

    def for_price(self, price: Price) -> Flow:
        return self.named(price.scheme)

    def for_requirements(self, requirements: dict[str, Any]) -> Flow:
        scheme = schemes.for_requirements(requirements)
        return self.named(scheme.scheme if scheme is not None else "")

    def for_payment(self, payment: Payment) -> Flow:
        return self.for_requirements(payment.requirements)
