"""The x402 facilitator over HTTP: `POST /verify`, `POST /settle`, `GET /supported`.

One pooled httpx client, a timeout on every call, and a concurrency gate (a bounded
number of calls in flight, a bounded wait for a slot). Every way the facilitator can
fail us (timeout, 5xx, refused connection, busy gate, malformed answer) raises
`Unavailable`, which is our outage and must never read as the payer's rejection.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from server.config import FacilitatorConfig
from server.metrics import Metrics


class Unavailable(Exception):
    """The facilitator could not give an answer; `reason` is a short code for logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Verification:
    valid: bool
    payer: str
    reason: str  # the facilitator's invalidReason, passed through as an opaque string


@dataclass(frozen=True)
class Settlement:
    success: bool
    transaction: str
    network: str
    payer: str
    reason: str
    receipt: dict[str, Any] = field(default_factory=dict)  # the settle response as sent


def _text(value: Any, limit: int = 200) -> str:
    return value[:limit] if isinstance(value, str) else ""


class FacilitatorClient:
    def __init__(self, config: FacilitatorConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        headers = {"content-type": "application/json"}
        if config.auth_header_env and os.environ.get(config.auth_header_env):
            headers["authorization"] = os.environ[config.auth_header_env]
        self.client = httpx.AsyncClient(
            base_url=config.url,
            headers=headers,
            timeout=config.timeout_seconds,
            # httpcore walks its whole pool on every request, so a small pool is the fast one
            limits=httpx.Limits(max_connections=config.connections, max_keepalive_connections=config.connections),
        )
        self.slots = asyncio.Semaphore(config.max_in_flight)

    @property
    def configured(self) -> bool:
        return bool(self.config.url)

    async def verify(self, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> Verification:
        doc = await self._post("/verify", version, payload, requirements)
        valid = doc.get("isValid")
        if not isinstance(valid, bool):
            raise Unavailable("malformed_verify_answer")
        payer = _text(doc.get("payer"), 64)
        if valid and not payer:
            raise Unavailable("verify_answer_without_payer")
        reason = _text(doc.get("invalidReason")) or ("" if valid else "invalid_payment")
        return Verification(valid=valid, payer=payer.lower(), reason=reason)

    async def settle(self, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> Settlement:
        doc = await self._post("/settle", version, payload, requirements)
        success = doc.get("success")
        if not isinstance(success, bool):
            raise Unavailable("malformed_settle_answer")
        receipt = {k: v for k, v in doc.items() if k in ("success", "transaction", "network", "payer", "errorReason", "amount")}
        return Settlement(
            success=success,
            transaction=_text(doc.get("transaction"), 130),
            network=_text(doc.get("network"), 64),
            payer=_text(doc.get("payer"), 64).lower(),
            reason=_text(doc.get("errorReason")) or ("" if success else "settle_failed"),
            receipt=receipt,
        )

    async def supported(self) -> dict[str, Any]:
        async with self._slot():
            try:
                response = await self.client.get("/supported")
            except httpx.HTTPError as exc:
                raise Unavailable(type(exc).__name__) from None
        if response.status_code != 200:
            raise Unavailable(f"http_{response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise Unavailable("malformed_answer") from None

    async def _post(self, path: str, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._post_once(path, version, payload, requirements)
        except Unavailable as exc:
            if self.metrics is not None:
                self.metrics.facilitator_errors.labels(path.strip("/"), exc.reason).inc()
            raise

    async def _post_once(self, path: str, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        body = {"x402Version": version, "paymentPayload": payload, "paymentRequirements": requirements}
        async with self._slot():
            started = time.perf_counter()
            try:
                response = await self.client.post(path, json=body)
            except httpx.TimeoutException:
                raise Unavailable("timeout") from None
            except httpx.HTTPError as exc:
                raise Unavailable(type(exc).__name__) from None
            finally:
                if self.metrics is not None:
                    self.metrics.facilitator_seconds.labels(path.strip("/")).observe(time.perf_counter() - started)
        if response.status_code >= 500 or response.status_code in (401, 403, 404, 408, 429):
            raise Unavailable(f"http_{response.status_code}")
        try:
            doc = response.json()
        except ValueError:
            raise Unavailable("malformed_answer") from None
        if not isinstance(doc, dict):
            raise Unavailable("malformed_answer")
        return doc

    def _slot(self) -> _Slot:
        return _Slot(self.slots, self.config.max_wait_seconds)

    async def aclose(self) -> None:
        await self.client.aclose()


class _Slot:
    """One place in the concurrency gate, waited for at most `wait` seconds."""

    def __init__(self, semaphore: asyncio.Semaphore, wait: float) -> None:
        self.semaphore = semaphore
        self.wait = wait

    async def __aenter__(self) -> None:
        try:
            await asyncio.wait_for(self.semaphore.acquire(), self.wait)
        except TimeoutError:
            raise Unavailable("busy") from None

    async def __aexit__(self, *exc: object) -> None:
        self.semaphore.release()
