"""The ways a payment is collected, one home each, found by the scheme a payment is in.

A scheme says what a valid payload is (gate/schemes/); a flow says how its money is collected
(`base.Flow`). A new collection model is a module (or a package) here and one line in `FLOWS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gate.chain import Chain
from gate.claims import Claims
from gate.config import GateConfig
from gate.facilitator import FacilitatorClient
from gate.flows.authorization import AuthorizationFlow
from gate.flows.base import Flow, Flows
from gate.flows.channel.flow import ChannelFlow
from gate.flows.channel.store import Channels
from gate.flows.metered import MeteredFlow
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.sealing import KeyOnDemand
from server.database import Database

__all__ = ["FLOWS", "Flow", "FlowParts", "Flows", "build"]


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


def build(parts: FlowParts) -> Flows:
    """Every flow of the registry, built from `parts`."""
    return Flows({name: make(parts) for name, make in FLOWS.items()})
