"""A payment the gate holds for one claim: what it settles, sealed with the claim until it is collected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.claims import Claim


@dataclass(frozen=True)
class Payment:
    """Everything needed to settle one claim; only ever held in memory or sealed."""

    token_digest: str
    version: int
    payload: dict[str, Any]
    requirements: dict[str, Any]
    agent: str
    payer: str
    amount: str  # what is settled: the price, or an upto delivery's charge
    network: str
    asset: str
    authorized: str = ""  # what the payer signed for, when it differs from `amount` (an upto ceiling)
    usage: dict[str, Any] = field(default_factory=dict)  # an upto charge, as its receipt states it

    @property
    def metered(self) -> bool:
        return bool(self.usage)

    def log_fields(self, task_id: str = "") -> dict[str, str]:
        """What a payment log row says about this payment (never the payload itself)."""
        return {
            "agent": self.agent,
            "token_digest": self.token_digest,
            "payer": self.payer,
            "amount": self.amount,
            "authorized": self.authorized or self.amount,
            "network": self.network,
            "asset": self.asset,
            "scheme": str(self.requirements.get("scheme", "")),
            "task_id": task_id,
        }

    def sealable(self) -> dict[str, Any]:
        """What an owed settlement needs later: the signed payload and the price it was signed for
        (never the configuration of the day it is collected); an upto delivery's charge with it."""
        sealable = {
            "version": self.version,
            "payload": self.payload,
            "requirements": self.requirements,
            "price": {"amount": self.amount, "network": self.network, "asset": self.asset},
        }
        if self.metered:
            sealable["charge"] = {"authorized": self.authorized, "usage": self.usage}
        return sealable

    @classmethod
    def unsealed(cls, sealed: dict[str, Any], claim: Claim, price: tuple[str, str, str]) -> Payment:
        """The payment a claim's sealed record holds (`sealable`'s inverse); `price` (amount, network,
        asset) for a claim sealed before its price was sealed with it."""
        amount, network, asset = price
        signed = sealed.get("price")
        if isinstance(signed, dict):
            amount, network, asset = str(signed["amount"]), str(signed["network"]), str(signed["asset"])
        charged = sealed.get("charge")  # an upto delivery: its charge, sealed when it was delivered
        return cls(
            claim.token_digest,
            sealed["version"],
            sealed["payload"],
            sealed["requirements"],
            claim.agent,
            claim.payer,
            amount,
            network,
            asset,
            authorized=str(charged["authorized"]) if isinstance(charged, dict) else "",
            usage=dict(charged["usage"]) if isinstance(charged, dict) else {},
        )

    def receipt(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The receipt the payer is shown: the settle answer, with an upto charge's usage in `extra.usage`."""
        if not self.metered:
            return answer
        extra = answer.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        return {**answer, "amount": answer.get("amount") or self.amount, "extra": {**extra, "usage": self.usage}}
