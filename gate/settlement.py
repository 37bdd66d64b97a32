"""Settling delivered work: the one path shared by send, stream, replays and the reconciler.

Settle runs only after a delivery. Timeouts and transport errors are retried with
backoff; whatever the outcome, the claim and the payment log say so before the
caller hears of it. A settle that could not complete means "unknown": the work stays
delivered, marked `payment-verified` with the error, and the reconciler tries again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gate.claims import Claims
from gate.facilitator import FacilitatorClient, Unavailable
from gate.payment_log import PaymentLog
from server.config import FacilitatorConfig
from server.metrics import Metrics
from server.tasks import agent_message, set_status

STATUS = "x402.payment.status"
RECEIPTS = "x402.payment.receipts"
ERROR = "x402.payment.error"


@dataclass(frozen=True)
class Payment:
    """Everything needed to settle one claim; only ever held in memory or sealed."""

    token_digest: str
    version: int
    payload: dict[str, Any]
    requirements: dict[str, Any]
    agent: str
    payer: str
    amount: str
    network: str
    asset: str

    def log_fields(self, task_id: str = "") -> dict[str, str]:
        """What a payment log row says about this payment (never the payload itself)."""
        return dict(agent=self.agent, token_digest=self.token_digest, payer=self.payer, amount=self.amount,
                    network=self.network, asset=self.asset, task_id=task_id)

    def sealable(self) -> dict[str, Any]:
        return {"version": self.version, "payload": self.payload, "requirements": self.requirements}


def completed_metadata(receipt: dict[str, Any]) -> dict[str, Any]:
    return {STATUS: "payment-completed", RECEIPTS: [receipt]}


def verified_metadata(error: str) -> dict[str, Any]:
    return {STATUS: "payment-verified", ERROR: error}


def attach_payment_metadata(task: dict[str, Any], metadata: dict[str, Any]) -> None:
    """Put payment metadata on the status message and mirror it at task.metadata.

    Only delivered work is settled, so a task a crash left `working` after its
    delivery was saved is completed here.
    """
    if task["status"]["state"] != "completed":
        set_status(task, "completed", agent_message(task, "Done."))
    message = task["status"].get("message") or agent_message(task, "Done.")
    kept = {k: v for k, v in (message.get("metadata") or {}).items() if not k.startswith("x402.")}
    message["metadata"] = {**kept, **metadata}
    task["status"]["message"] = message
    task_kept = {k: v for k, v in (task.get("metadata") or {}).items() if not k.startswith("x402.")}
    task["metadata"] = {**task_kept, **metadata}


class Settler:
    def __init__(self, facilitator: FacilitatorClient, claims: Claims, log: PaymentLog, config: FacilitatorConfig,
                 metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self.facilitator = facilitator
        self.claims = claims
        self.log = log
        self.attempts = config.settle_attempts
        self.backoff = config.settle_backoff_seconds

    async def settle(self, payment: Payment, task_id: str) -> dict[str, Any]:
        """Settle a claim already in `settling`; returns the payment metadata for the task."""
        log = payment.log_fields(task_id)
        try:
            result = await self._settle_with_retries(payment)
        except Unavailable as exc:
            self._failed()
            self.claims.settle_failed(payment.token_digest)
            self.log.append("settle_failed", **log, error=f"settle_unavailable: {exc.reason}")
            return verified_metadata(f"settle_unavailable: {exc.reason}")
        if not result.success:
            self._failed()
            self.claims.settle_failed(payment.token_digest)
            self.log.append("settle_failed", **log, error=result.reason)
            return verified_metadata(result.reason)
        self.claims.settled(payment.token_digest)
        self.log.append("settle", **log, transaction=result.transaction)
        return completed_metadata(result.receipt)

    def _failed(self) -> None:
        if self.metrics is not None:
            self.metrics.settle_failures.inc()

    async def _settle_with_retries(self, payment: Payment):  # -> facilitator.Settlement
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return await self.facilitator.settle(payment.version, payment.payload, payment.requirements)
            except Unavailable:
                if attempt == self.attempts:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise Unavailable("no_attempts")
