"""The anonymous pipeline (DESIGN section 4), top to bottom, one module per step.

Each step is cheaper than the next: nothing reaches the database or the facilitator
before both limiters have passed, and nothing is executed before the token is
claimed and verified. Every answer here is one the contract names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gate import in_band, pricing, tokens
from gate.claims import Claim, ClaimLost, ClaimState, Hold
from gate.facilitator import Unavailable
from gate.limiter import caller_key
from gate.settlement import STATUS, Payment
from server.anonymous import not_authenticated
from server.cards import agent_url
from server.config import AgentConfig, payment_window_seconds
from server.database import DatabaseUnavailable
from server.jsonrpc import (
    INTERNAL_ERROR,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    error_response,
    read_call,
    result_response,
    store_unavailable,
)
from server.methods import SendPlan, plan_send, task_answer, unsupported
from server.proxy import public_base_url

if TYPE_CHECKING:
    from gate.gate import PaymentGate

logger = logging.getLogger("a2a_gate.gate")


async def handle_anonymous(gate: PaymentGate, request: Request, name: str) -> Response:
    settings, info = gate.settings, request.state.info
    # 1. per-IP, then per-agent limiter
    for limiter, key in ((gate.ip_limiter, info.client), (gate.agent_limiters, name)):
        wait = await limiter.check(key)
        if wait:
            gate.metrics.limiter_refusals.labels("ip" if limiter is gate.ip_limiter else "agent").inc()
            return too_many_requests(wait)
    # 2. unknown, unexposed and unpriced agents all look the same
    agent = gate.agents.get(name)
    if agent is None or not agent.exposed or agent.price is None:
        return not_authenticated()
    # 3. a priced door that cannot take payment now
    if not gate.facilitator.configured:
        return JSONResponse({"detail": "Payment is not available for this agent now"}, status_code=501)
    # 4. envelope
    try:
        call = await read_call(request, settings.max_body_bytes)
    except RpcError as exc:
        return error_response(exc.call_id, exc)
    info.method = call.method
    try:
        if call.operation in ("get", "cancel", "subscribe", "list"):
            return await bound_task_call(gate, request, call, agent)
        if call.operation not in ("send", "stream"):
            raise unsupported(call)
        if call.operation == "stream" and not agent.streaming:
            raise RpcError(UNSUPPORTED_OPERATION, "This agent does not stream")
        # 5. the message must be usable before a token is looked for
        plan = plan_send(call)
        return await paid_send(gate, request, plan, agent)
    except RpcError as exc:
        return error_response(call.id, exc)
    except DatabaseUnavailable as exc:  # nothing runs without a claim; a retry is safe
        logger.warning("the task store is unavailable: %s", exc)
        info.set("store_unavailable")
        return error_response(call.id, store_unavailable())
    except Exception:  # a bug of ours: never a 500, never a free pass; a retry is safe
        logger.exception("internal error on the anonymous path")
        return error_response(call.id, RpcError(INTERNAL_ERROR, data={"code": "internal_error", "retryable": True}))


async def paid_send(gate: PaymentGate, request: Request, plan: SendPlan, agent: AgentConfig) -> Response:
    call, price, info = plan.call, agent.price, request.state.info
    assert price is not None
    resource = agent_url(public_base_url(request, gate.settings.public_url), agent.name)
    active = in_band.activation(request.headers)
    # a message continuing an in-band request awaiting payment pays (or declines) for its original
    pending = await in_band.find_pending(gate, plan, agent)
    if pending is not None and in_band.client_status(plan) == "payment-rejected":
        info.set("ok", "in-band payment declined: not charged")
        return await in_band.declined(gate, plan, pending, active)
    # 6. the token: message metadata first, then PAYMENT-SIGNATURE, then X-PAYMENT
    token = tokens.extract(plan.message.get("metadata"), request.headers)
    if token is None:
        if active is not None:
            info.set("payment_required", "in-band")
            caller = caller_key(info.client, gate.settings.ipv6_prefix)  # one household, one cap
            return await in_band.payment_required(gate, plan, agent, resource, caller, active, pending)
        return gate.answers_402.response(agent.name, price, resource, agent.description)
    log = log_fields(agent, token)

    async def refuse(reason: str, payer: str = "") -> Response:
        await gate.log.append("reject", **log, payer=payer, error=reason)
        info.set("rejected", reason)
        if pending is not None:
            return await in_band.refused(gate, plan, agent, resource, pending, active, reason, payer)
        return payment_rejected(reason)

    # 7. local checks; a retry of a claimed token is answered by its claim whatever the clock says
    try:
        requirements = tokens.check_payload(token, price, resource)
        if await gate.claims.find(token.digest) is None:
            tokens.check_window(token, min_window=payment_window_seconds(agent, gate.settings.facilitator))
    except tokens.Rejection as exc:
        return await refuse(exc.reason)
    # 8. claim, before anything is executed
    payment = Payment(
        token.digest,
        token.version,
        token.payload,
        requirements,
        agent.name,
        "",
        price.amount,
        price.network,
        price.asset,
    )
    sealed = gate.sealer.seal(payment.sealable(), token.digest)
    digest = await claim_digest(gate, agent, plan, token, pending)
    outcome = await gate.claims.claim(token.digest, tokens.nonce_key(token, price.asset), digest, agent.name, sealed)
    if outcome.kind == "conflict":
        return await refuse(outcome.reason)
    if outcome.kind == "in_flight":
        info.set("in_flight")
        return error_response(
            call.id, RpcError(INTERNAL_ERROR, "Request in flight", {"code": "in_flight", "retryable": True})
        )
    if outcome.kind == "replay":
        assert outcome.claim is not None
        info.set("replay")
        info.payer = outcome.claim.payer
        return await replay(gate, plan, outcome.claim, payment, in_band.echo(active))
    assert outcome.hold is not None
    hold, started = outcome.hold, list[bool]()
    try:
        return await verified_send(
            gate, request, plan, agent, token, requirements, payment, hold, active, pending, refuse, started
        )
    except BaseException:
        # a bug of ours (or a cancellation) before the work started: the claim must not
        # stay "running" forever and lock the payer out; after the start it is bound to
        # the execution, which releases or settles it.
        if not started:
            await gate.release(hold)  # fenced: only ever our own running claim
        raise


async def verified_send(
    gate: PaymentGate,
    request: Request,
    plan: SendPlan,
    agent: AgentConfig,
    token: tokens.Token,
    requirements: dict[str, Any],
    payment: Payment,
    hold: Hold,
    active: in_band.Activation | None,
    pending: in_band.Pending | None,
    refuse: Callable[[str, str], Awaitable[Response]],
    started: list[bool],
) -> Response:
    """Steps 9 to 12, for a claimed token (every claim write names `hold`)."""
    call, info = plan.call, request.state.info
    log = log_fields(agent, token)
    # 9. facilitator verify
    try:
        verification = await gate.facilitator.verify(token.version, token.payload, requirements)
    except Unavailable as exc:
        await gate.release(hold)
        logger.warning("facilitator verify unavailable: %s", exc.reason)
        info.set("verify_unavailable", exc.reason)
        return error_response(call.id, verify_unavailable(exc.retry_after))
    info.payer = verification.payer
    if not verification.valid:
        await gate.release(hold)
        return await refuse(verification.reason, verification.payer)
    # 10. payer allowlist, failing closed
    if not payer_allowed(agent, verification.payer):
        await gate.release(hold)
        return await refuse("payer_not_allowed", verification.payer)
    await gate.log.append("verify", **log, payer=verification.payer)
    # 11. execute; 12. settle after delivery (inside the execution, shielded from disconnects)
    payment = replace(payment, payer=verification.payer)
    owner, settlement = f"payer:{payment.payer}", gate.settlement_for(payment, hold)
    try:
        if pending is not None:  # in-band: the agent runs the original message of the task
            execution = await in_band.start_paid(gate, pending, agent, owner, settlement)
        else:
            execution = await gate.methods.start_send(plan, agent.name, owner, settlement)
    except RpcError as exc:
        await gate.release(hold)
        await gate.log.append("release", **log, payer=payment.payer, error=f"not started: {exc.message}")
        return error_response(call.id, exc)
    started.append(True)
    headers = in_band.echo(active)
    # a stream follows the execution from now on, before anything awaits (the work may be quick)
    streamed = gate.methods.stream(plan, execution, headers) if call.operation == "stream" else None
    try:
        await gate.claims.bind(hold, payment.payer, execution.task["id"])
    except ClaimLost:  # taken over already: the execution was revoked and delivers nothing
        pass
    if streamed is not None:
        info.set("ok", "stream")
        return streamed
    result = await gate.methods.send(plan, execution)
    info.set(*charge_outcome(execution.task))
    return result_response(call.id, result, {**headers, **payment_response_header(execution.task)})


async def claim_digest(
    gate: PaymentGate, agent: AgentConfig, plan: SendPlan, token: tokens.Token, pending: in_band.Pending | None
) -> str:
    """The request a token pays for. In-band it is the task's original request, also when
    a retry comes after the task was adopted (the claim then names the same task)."""
    task_id = plan.message.get("taskId")
    if pending is not None:
        return in_band.request_digest(agent.name, plan.call.method, pending.id)
    if isinstance(task_id, str):
        claim = await gate.claims.find(token.digest)
        in_band_digest = in_band.request_digest(agent.name, plan.call.method, task_id)
        if claim is not None and claim.task_id == task_id and claim.request_digest == in_band_digest:
            return in_band_digest
    return request_digest(agent.name, plan)


def log_fields(agent: AgentConfig, token: tokens.Token) -> dict[str, str]:
    """What every payment log row of this request names: the agent, the price, the token's digest."""
    assert agent.price is not None
    price = agent.price
    return dict(
        agent=agent.name, token_digest=token.digest, amount=price.amount, network=price.network, asset=price.asset
    )


def charge_outcome(task: dict[str, Any]) -> tuple[str, str]:
    """For the request log: was this request charged, owed, or free of charge?"""
    metadata = task.get("metadata") or {}
    status = metadata.get(STATUS)
    if status == "payment-completed":
        return "paid", ""
    if status == "payment-verified":
        return "paid", f"settlement owed: {metadata.get('x402.payment.error', '')}"
    return "ok", f"task {task['status']['state']}: not charged"


async def replay(
    gate: PaymentGate, plan: SendPlan, claim: Claim, payment: Payment, headers: dict[str, str]
) -> Response:
    """The same token with the same request: the stored answer, re-driving an owed settlement."""
    owner, call = f"payer:{claim.payer}", plan.call
    if claim.state == ClaimState.SETTLE_FAILED:
        taken = await gate.claims.take_owed(claim.token_digest)
        if taken is not None:
            await gate.settle_owed(taken)
    task = await gate.store.get(claim.task_id, owner, claim.agent)
    if task is None:
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    await gate.log.append("replay", **replace(payment, payer=claim.payer).log_fields(claim.task_id))
    return task_answer(plan, task, {**headers, "X-Idempotent-Replay": "true", **payment_response_header(task)})


async def bound_task_call(gate: PaymentGate, request: Request, call: Call, agent: AgentConfig) -> Response:
    """Task calls for a payer: every failure is the same -32001 bytes (a list, an empty page)."""
    owner = await prove_payer(gate, request, call, agent)
    methods = gate.methods
    if owner is None:
        if call.operation == "list":  # nothing is visible without proof
            return result_response(call.id, await methods.list(call, agent.name, None))
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    try:
        if call.operation == "get":
            return result_response(call.id, await methods.get(call, agent.name, owner))
        if call.operation == "subscribe":
            return await methods.subscribe(call, agent.name, owner)
        if call.operation == "list":
            return result_response(call.id, await methods.list(call, agent.name, owner))
        return result_response(call.id, await methods.cancel(call, agent.name, owner))
    except RpcError as exc:
        return error_response(call.id, exc)


async def prove_payer(gate: PaymentGate, request: Request, call: Call, agent: AgentConfig) -> str | None:
    """The payer owning this call: the token that paid, or a fresh token verifying to them."""
    token = tokens.extract(call.params.get("metadata"), request.headers)
    if token is None:
        return None
    claim = await gate.claims.find(token.digest)
    if claim is not None and claim.payer:
        return f"payer:{claim.payer}"
    assert agent.price is not None
    try:
        resource = agent_url(public_base_url(request, gate.settings.public_url), agent.name)
        requirements = tokens.check(token, agent.price, resource)
        verification = await gate.facilitator.verify(token.version, token.payload, requirements)
    except (tokens.Rejection, Unavailable):
        return None
    return f"payer:{verification.payer}" if verification.valid else None


def request_digest(agent: str, plan: SendPlan) -> str:
    """What the request asks for: never the messageId, which clients mint per retry."""
    content = [agent, plan.call.method, plan.message["parts"], plan.message.get("taskId")]
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def payer_allowed(agent: AgentConfig, payer: str) -> bool:
    try:
        return agent.allowed_payers is None or payer.lower() in agent.allowed_payers
    except Exception:  # noqa: BLE001 -- fail closed
        return False


def payment_response_header(task: dict[str, Any]) -> dict[str, str]:
    metadata = task.get("metadata") or {}
    receipts = metadata.get("x402.payment.receipts")
    if metadata.get(STATUS) == "payment-completed" and receipts:
        return {"PAYMENT-RESPONSE": pricing.b64_json(receipts[-1])}
    return {}


def too_many_requests(wait: float) -> JSONResponse:
    return JSONResponse(
        {"detail": "Too many requests"}, status_code=429, headers={"Retry-After": str(max(1, math.ceil(wait)))}
    )


def payment_rejected(reason: str) -> JSONResponse:
    return JSONResponse({"detail": "Payment verification failed", "error": reason}, status_code=403)


def verify_unavailable(retry_after: float = 0.0) -> RpcError:
    data: dict[str, Any] = {"code": "verify_unavailable", "retryable": True}
    if retry_after > 0:  # the facilitator's breaker is open: when a retry can get through
        data["retry_after"] = math.ceil(retry_after)
    return RpcError(INTERNAL_ERROR, "Payment verification unavailable", data)
