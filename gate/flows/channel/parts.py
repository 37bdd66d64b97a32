"""What the channel flow and its jobs are built with: the channel store and the parts collecting it needs."""

from __future__ import annotations

from dataclasses import dataclass

from gate.chain import Chain
from gate.config import GateConfig
from gate.facilitator import FacilitatorClient
from gate.flows.channel.store import Channels
from gate.metrics import GateMetrics
from gate.payment_log import PaymentLog
from gate.sealing import KeyOnDemand


@dataclass(eq=False)
class ChannelParts:
    store: Channels
    facilitator: FacilitatorClient
    chain: Chain
    log: PaymentLog
    metrics: GateMetrics
    keys: KeyOnDemand  # seals the vouchers kept to claim on chain
    config: GateConfig  # the claim schedule (`[channels]`) and the settle budget it shares
