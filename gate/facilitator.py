"""The x402 facilitator over HTTP: `POST /verify`, `POST /settle`, `GET /supported`.

One pooled httpx client, a timeout on every call, and a concurrency gate (a bounded
number of calls in flight, a bounded wait for a slot). Every way the facilitator can
fail us (timeout, 5xx, refused connection, busy gate, malformed answer, its refusal of
our credentials) raises `Unavailable`, which is our outage and must never read as the
payer's rejection. Its 400 or 422 for a payload is the payer's problem: an invalid
payment (`invalid_payload`). A circuit breaker (`gate.breaker`) answers verify calls at
once while the facilitator is down. Credentials come from `auth_header_env` (a fixed
header) or `auth` (a callable minting headers for every call, e.g. a short-lived JWT).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pkgutil
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from prometheus_client import Counter, Gauge

from gate.breaker import OPEN, STATE_VALUES, CircuitBreaker
from gate.config import FacilitatorConfig
from gate.metrics import GateMetrics
from server import json_text, tracing
from server.secret_files import secret

logger = logging.getLogger("a2a_gate.gate")

PAYER_STATUSES = (400, 413, 422)  # the facilitator refuses the payload itself: the payer's problem
REASON_CODE = re.compile(r"[a-z0-9_]{1,64}")  # a facilitator's reason a span may name: a code, nothing it echoed


class Unavailable(Exception):
    """The facilitator could not give an answer; `reason` is a short code for logs.

    `retry_after` is a hint in seconds for the client (set while the breaker is open).
    """

    def __init__(self, reason: str, retry_after: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class PayloadRefused(Exception):
    """The facilitator answered 400/422: the payment payload is malformed in its eyes."""


@dataclass(frozen=True)
class Verification:
    valid: bool
    payer: str
    reason: str  # the facilitator's invalidReason, passed through as an opaque string
    extra: dict[str, Any] = field(default_factory=dict)  # what the scheme adds (a channel's on-chain state)


@dataclass(frozen=True)
class SettleAnswer:
    """The facilitator's answer to one settle call (its SettleResponse)."""

    success: bool
    transaction: str
    network: str
    payer: str
    reason: str
    receipt: dict[str, Any] = field(default_factory=dict)  # the settle response as sent
    extra: dict[str, Any] = field(default_factory=dict)  # what the scheme adds (a channel's on-chain state)


def _text(value: Any, limit: int = 200) -> str:
    return value[:limit] if isinstance(value, str) else ""


def load_auth(target: str) -> Callable[[], Any] | None:
    """The `auth` callable, ``package.module:callable``; it returns the x402 package's
    `create_headers` shape: ``{"verify": {...}, "settle": {...}, "supported": {...}}``."""
    if not target:
        return None
    function = pkgutil.resolve_name(target)
    if not callable(function):
        raise TypeError(f"facilitator.auth: {target} is not callable")
    return function


# A call that failed on the way (the facilitator may or may not have acted): httpx's errors, and
# aiohttp's that its transport does not map to one (a response it cannot parse, say).
TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError)


class FacilitatorClient:
    def __init__(self, config: FacilitatorConfig, metrics: GateMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.auth = load_auth(config.auth)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_seconds)
        if metrics is not None:
            self._watch(metrics)
        headers = {"content-type": "application/json"}
        credential = secret(config.auth_header_env) if config.auth_header_env else None
        if credential:
            headers["authorization"] = credential
        limits = httpx.Limits(max_connections=config.connections, max_keepalive_connections=config.connections)
        self.client = httpx.AsyncClient(
            base_url=config.url,
            headers=headers,
            timeout=config.timeout_seconds,
            limits=limits,
            # aiohttp's connection pool behind httpx's interface: httpcore's walks every pooled
            # connection on each call (with two system calls each), 600-900 us of CPU a call here
            # against 270-320 us; a proxy from the environment still goes through httpx's own
            transport=AiohttpTransport(limits=limits),
        )
        self.slots = asyncio.Semaphore(config.max_in_flight)
        self.urls: dict[str, httpx.URL] = {}  # by path (`url`)

    @property
    def configured(self) -> bool:
        return bool(self.config.url)

    def _watch(self, metrics: GateMetrics) -> None:
        state = Gauge(
            "a2a_gate_facilitator_breaker_state",
            "Facilitator circuit breaker: 0 closed, 1 half-open, 2 open",
            registry=metrics.registry,
        )
        state.set_function(lambda: STATE_VALUES[self.breaker.state])
        self.breaker_trips = Counter(
            "a2a_gate_facilitator_breaker_opened", "Times the facilitator breaker opened", registry=metrics.registry
        )

    async def verify(self, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> Verification:
        try:
            doc = await self._post("/verify", version, payload, requirements)
        except PayloadRefused:
            return Verification(valid=False, payer="", reason="invalid_payload")
        valid = doc.get("isValid")
        if not isinstance(valid, bool):
            raise Unavailable("malformed_verify_answer")
        payer = _text(doc.get("payer"), 64)
        if valid and not payer:
            raise Unavailable("verify_answer_without_payer")
        reason = _text(doc.get("invalidReason")) or ("" if valid else "invalid_payment")
        extra = doc.get("extra")
        return Verification(
            valid=valid, payer=payer.lower(), reason=reason, extra=extra if isinstance(extra, dict) else {}
        )

    async def settle(self, version: int, payload: dict[str, Any], requirements: dict[str, Any]) -> SettleAnswer:
        try:
            doc = await self._post("/settle", version, payload, requirements)
        except PayloadRefused:
            return SettleAnswer(success=False, transaction="", network="", payer="", reason="invalid_payload")
        success = doc.get("success")
        if not isinstance(success, bool):
            raise Unavailable("malformed_settle_answer")
        receipt = {
            k: v for k, v in doc.items() if k in ("success", "transaction", "network", "payer", "errorReason", "amount")
        }
        return SettleAnswer(
            success=success,
            transaction=_text(doc.get("transaction"), 130),
            network=_text(doc.get("network"), 64),
            payer=_text(doc.get("payer"), 64).lower(),
            reason=_text(doc.get("errorReason")) or ("" if success else "settle_failed"),
            receipt=receipt,
            extra=doc["extra"] if isinstance(doc.get("extra"), dict) else {},
        )

    async def supported(self) -> dict[str, Any]:
        async with self._slot():
            try:
                response = await self.client.get("/supported", headers=await self._auth_headers("supported"))
            except TRANSPORT_ERRORS as exc:
                raise Unavailable(type(exc).__name__) from None
        if response.status_code != 200:
            raise Unavailable(f"http_{response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise Unavailable("malformed_answer") from None

    async def _post(
        self, path: str, version: int, payload: dict[str, Any], requirements: dict[str, Any]
    ) -> dict[str, Any]:
        """One call, in a span of its own when traced: the scheme, the network and the outcome,
        never the payload (its signature) nor the facilitator's credentials."""
        if not tracing.active():
            return await self._call(path, version, payload, requirements)
        call = path.strip("/")
        named = {
            "x402.scheme": _text(requirements.get("scheme"), 64),
            "x402.network": _text(requirements.get("network"), 64),
        }
        with tracing.span(f"facilitator.{call}", named, kind="client") as span:
            try:
                doc = await self._call(path, version, payload, requirements)
            except PayloadRefused:
                span.set_attribute("x402.outcome", "invalid_payload")
                raise
            except Unavailable as exc:
                span.set_attribute("x402.outcome", "unavailable")
                span.set_attribute("x402.reason", exc.reason)
                raise
            key, good, bad, why = ("isValid", "valid", "invalid", "invalidReason")
            if call == "settle":
                key, good, bad, why = ("success", "settled", "not_settled", "errorReason")
            span.set_attribute("x402.outcome", good if doc.get(key) is True else bad)
            reason = doc.get(why)
            if isinstance(reason, str) and REASON_CODE.fullmatch(reason):
                span.set_attribute("x402.reason", reason)
            return doc

    async def _call(
        self, path: str, version: int, payload: dict[str, Any], requirements: dict[str, Any]
    ) -> dict[str, Any]:
        """One call through the breaker: verify is refused at once while it is open; every
        answer or failure of the facilitator itself (never our own busy gate) moves it."""
        call = path.strip("/")
        if call == "verify" and not self.breaker.allow():
            if self.metrics is not None:
                self.metrics.facilitator_errors.labels(call, "circuit_open").inc()
            raise Unavailable("circuit_open", retry_after=self.breaker.retry_after())
        verdict = None
        try:
            doc = await self._post_once(path, version, payload, requirements)
            verdict = True
            return doc
        except PayloadRefused:
            verdict = True  # the facilitator is up: it answered
            raise
        except Unavailable as exc:
            verdict = None if exc.reason in ("busy", "auth_failed", "closed") else False  # ours, not its
            if self.metrics is not None:
                self.metrics.facilitator_errors.labels(call, exc.reason).inc()
            raise
        finally:
            self._record(verdict)

    def _record(self, verdict: bool | None) -> None:
        if verdict is None:
            self.breaker.abandoned()
        elif verdict:
            self.breaker.succeeded()
        else:
            was_open = self.breaker.state == OPEN
            self.breaker.failed()
            if not was_open and self.breaker.state == OPEN:
                logger.warning(
                    "facilitator breaker open for %gs after %d failures", self.breaker.cooldown, self.breaker.failures
                )
                if self.metrics is not None:
                    self.breaker_trips.inc()

    async def _auth_headers(self, call: str) -> dict[str, str]:
        """Headers the `auth` callable mints for this call; its failure is ours, never the payer's."""
        if self.auth is None:
            return {}
        try:
            minted = self.auth()
            if inspect.isawaitable(minted):
                minted = await minted
            headers = minted.get(call, {}) if isinstance(minted, dict) else None
            if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
            ):
                raise TypeError("auth must return {call: {header: value}}")
        except Exception as exc:  # noqa: BLE001 - any failure of the operator's callable; its message may hold a credential
            logger.warning("facilitator auth callable failed: %s", type(exc).__name__)
            raise Unavailable("auth_failed") from None
        return headers

    async def _post_once(
        self, path: str, version: int, payload: dict[str, Any], requirements: dict[str, Any]
    ) -> dict[str, Any]:
        if self.client.is_closed:  # the gate is stopping: what a call would settle stays owed, for the reconciler
            raise Unavailable("closed")
        body = {"x402Version": version, "paymentPayload": payload, "paymentRequirements": requirements}
        headers = await self._auth_headers(path.strip("/"))
        if tracing.active():  # the request's trace goes on at a facilitator that traces (a copy: the callable's dict)
            headers = {**headers}
            tracing.inject(headers)
        async with self._slot():
            started = time.perf_counter()
            try:
                response = await self.client.post(self.url(path), content=json_text.encode(body), headers=headers)
            except httpx.TimeoutException:
                raise Unavailable("timeout") from None
            except TRANSPORT_ERRORS as exc:
                raise Unavailable(type(exc).__name__) from None
            finally:
                if self.metrics is not None:
                    self.metrics.facilitator_seconds.labels(path.strip("/")).observe(time.perf_counter() - started)
        if response.status_code in PAYER_STATUSES:
            raise PayloadRefused(f"http_{response.status_code}")
        if response.status_code != 200:  # 5xx, and 401/403/404/408/429...: our credentials, our URL, our outage
            raise Unavailable(f"http_{response.status_code}")
        try:
            doc = response.json()
        except ValueError:
            raise Unavailable("malformed_answer") from None
        if not isinstance(doc, dict):
            raise Unavailable("malformed_answer")
        return doc

    def url(self, path: str) -> httpx.URL:
        """A path's URL under the facilitator's, joined once as httpx joins it: httpx parses and joins a
        relative URL on every request, which with its standard-library `json=` encoding (`_post_once`
        sends `json_text`'s compact UTF-8 instead) was about 100 of a call's 150 us of request building."""
        url = self.urls.get(path)
        if url is None:
            base = self.client.base_url
            url = self.urls[path] = base.copy_with(raw_path=base.raw_path + path.lstrip("/").encode("ascii"))
        return url

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
