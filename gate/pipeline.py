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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gate import pricing, tokens
from gate.claims import Claim, ClaimState
from gate.facilitator import Unavailable
from gate.settlement import STATUS, Payment
from server import dialects
from server.cards import X402_EXTENSIONS, agent_url
from server.config import AgentConfig, payment_window_seconds
from server.jsonrpc import (
    INTERNAL_ERROR,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    error_response,
    read_call,
    result_response,
)
from server.methods import SendPlan, plan_send, sse, unsupported
from server.proxy import public_base_url
from server.tasks import PENDING_OWNER, agent_message, new_task, set_status, trim_history

if TYPE_CHECKING:
    from gate.gate import PaymentGate

logger = logging.getLogger("a2a_gate.gate")


async def handle_anonymous(gate: PaymentGate, request: Request, name: str) -> Response:
    settings, info = gate.services.settings, request.state.info
    # 1. per-IP, then per-agent limiter
    for limiter, key in ((gate.ip_limiter, info.client), (gate.agent_limiters, name)):
        wait = limiter.take(key)
        if wait:
            gate.metrics.limiter_refusals.labels("ip" if limiter is gate.ip_limiter else "agent").inc()
            return too_many_requests(wait)
    # 2. unknown, unexposed and unpriced agents all look the same
    agent = gate.services.agents.get(name)
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
    except Exception:  # a bug of ours: never a 500, never a free pass; a retry is safe
        logger.exception("internal error on the anonymous path")
        return error_response(call.id, RpcError(INTERNAL_ERROR, data={"code": "internal_error", "retryable": True}))


async def paid_send(gate: PaymentGate, request: Request, plan: SendPlan, agent: AgentConfig) -> Response:
    call, price, info = plan.call, agent.price, request.state.info
    assert price is not None
    resource = agent_url(public_base_url(request, gate.services.settings.public_url), agent.name)
    extension = activated_extension(request.headers)
    # 6. the token: message metadata first, then PAYMENT-SIGNATURE, then X-PAYMENT
    token = tokens.extract(plan.message.get("metadata"), request.headers)
    if token is None:
        if extension:
            info.set("payment_required", "in-band")
            return in_band_payment_required(gate, plan, agent, resource, extension)
        return gate.answers_402.response(agent.name, price, resource, agent.description)
    log = log_fields(agent, token)
    # 7. local checks; a retry of a claimed token is answered by its claim whatever the clock says
    try:
        requirements = tokens.check_payload(token, price, resource)
        if gate.claims.find(token.digest) is None:
            tokens.check_window(token, min_window=payment_window_seconds(agent, gate.services.settings.facilitator))
    except tokens.Rejection as exc:
        gate.log.append("reject", **log, error=exc.reason)
        info.set("rejected", exc.reason)
        return payment_rejected(exc.reason)
    # 8. claim, before anything is executed
    payment = Payment(token.digest, token.version, token.payload, requirements, agent.name, "", price.amount, price.network, price.asset)
    sealed = gate.sealer.seal(payment.sealable(), token.digest)
    outcome = gate.claims.claim(token.digest, tokens.nonce_key(token, price.asset), request_digest(agent.name, plan), agent.name, sealed)
    if outcome.kind == "conflict":
        gate.log.append("reject", **log, error=outcome.reason)
        info.set("rejected", outcome.reason)
        return payment_rejected(outcome.reason)
    if outcome.kind == "in_flight":
        info.set("in_flight")
        return error_response(call.id, RpcError(INTERNAL_ERROR, "Request in flight", {"code": "in_flight", "retryable": True}))
    if outcome.kind == "replay":
        assert outcome.claim is not None
        info.set("replay")
        info.payer = outcome.claim.payer
        return await replay(gate, plan, outcome.claim, payment)
    try:
        return await verified_send(gate, request, plan, agent, token, requirements, payment, extension)
    except BaseException:
        # a bug of ours (or a cancellation) before the work started: the claim must not
        # stay "running" forever and lock the payer out; after the start it is bound to
        # the execution, which releases or settles it.
        claim = gate.claims.find(token.digest)
        if claim is not None and not claim.task_id:
            gate.claims.release(token.digest)  # only ever a running claim
        raise


async def verified_send(gate: PaymentGate, request: Request, plan: SendPlan, agent: AgentConfig, token: tokens.Token,
                        requirements: dict[str, Any], payment: Payment, extension: str) -> Response:
    """Steps 9 to 12, for a claimed token."""
    call, info = plan.call, request.state.info
    log = log_fields(agent, token)
    # 9. facilitator verify
    try:
        verification = await gate.facilitator.verify(token.version, token.payload, requirements)
    except Unavailable as exc:
        gate.claims.release(token.digest)
        logger.warning("facilitator verify unavailable: %s", exc.reason)
        info.set("verify_unavailable", exc.reason)
        return error_response(call.id, verify_unavailable(exc.retry_after))
    info.payer = verification.payer
    if not verification.valid:
        gate.claims.release(token.digest)
        gate.log.append("reject", **log, payer=verification.payer, error=verification.reason)
        info.set("rejected", verification.reason)
        return payment_rejected(verification.reason)
    # 10. payer allowlist, failing closed
    if not payer_allowed(agent, verification.payer):
        gate.claims.release(token.digest)
        gate.log.append("reject", **log, payer=verification.payer, error="payer_not_allowed")
        info.set("rejected", "payer_not_allowed")
        return payment_rejected("payer_not_allowed")
    gate.log.append("verify", **log, payer=verification.payer)
    # 11. execute; 12. settle after delivery (inside the execution, shielded from disconnects)
    payment = replace(payment, payer=verification.payer)
    try:
        execution = gate.services.methods.start_send(
            plan, agent.name, f"payer:{payment.payer}", gate.settlement_for(payment), adopt_pending=True
        )
    except RpcError as exc:
        gate.claims.release(token.digest)
        gate.log.append("release", **log, payer=payment.payer, error=f"not started: {exc.message}")
        return error_response(call.id, exc)
    gate.claims.bind(token.digest, payment.payer, execution.task["id"])
    headers = {"X-A2A-Extensions": extension} if extension else {}
    if call.operation == "stream":
        info.set("ok", "stream")
        return gate.services.methods.stream(plan, execution, headers)
    result = await gate.services.methods.send(plan, execution)
    info.set(*charge_outcome(execution.task))
    return result_response(call.id, result, {**headers, **payment_response_header(execution.task)})


def log_fields(agent: AgentConfig, token: tokens.Token) -> dict[str, str]:
    """What every payment log row of this request names: the agent, the price, the token's digest."""
    assert agent.price is not None
    price = agent.price
    return dict(agent=agent.name, token_digest=token.digest, amount=price.amount, network=price.network, asset=price.asset)


def charge_outcome(task: dict[str, Any]) -> tuple[str, str]:
    """For the request log: was this request charged, owed, or free of charge?"""
    metadata = task.get("metadata") or {}
    status = metadata.get(STATUS)
    if status == "payment-completed":
        return "paid", ""
    if status == "payment-verified":
        return "paid", f"settlement owed: {metadata.get('x402.payment.error', '')}"
    return "ok", f"task {task['status']['state']}: not charged"


async def replay(gate: PaymentGate, plan: SendPlan, claim: Claim, payment: Payment) -> Response:
    """The same token with the same request: the stored answer, re-driving an owed settlement."""
    owner, call = f"payer:{claim.payer}", plan.call
    if claim.state == ClaimState.SETTLE_FAILED:
        taken = gate.claims.take_owed(claim.token_digest)
        if taken is not None:
            await gate.settle_owed(taken)
    task = gate.services.store.get(claim.task_id, owner, claim.agent)
    if task is None:
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    gate.log.append("replay", **replace(payment, payer=claim.payer).log_fields(claim.task_id))
    headers = {"X-Idempotent-Replay": "true", **payment_response_header(task)}
    task = trim_history(task, plan.history_length)
    if call.operation == "stream":
        body = sse(call.id, dialects.send_result(task, call.dialect))
        return StreamingResponse(iter([body]), media_type="text/event-stream", headers=headers)
    return result_response(call.id, dialects.send_result(task, call.dialect), headers)


async def bound_task_call(gate: PaymentGate, request: Request, call: Call, agent: AgentConfig) -> Response:
    """Task calls for a payer: every failure is the same -32001 bytes (a list, an empty page)."""
    owner = await prove_payer(gate, request, call, agent)
    methods = gate.services.methods
    if owner is None:
        if call.operation == "list":  # nothing is visible without proof
            return result_response(call.id, methods.list(call, agent.name, None))
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    try:
        if call.operation == "get":
            return result_response(call.id, methods.get(call, agent.name, owner))
        if call.operation == "subscribe":
            return methods.subscribe(call, agent.name, owner)
        if call.operation == "list":
            return result_response(call.id, methods.list(call, agent.name, owner))
        return result_response(call.id, await methods.cancel(call, agent.name, owner))
    except RpcError as exc:
        return error_response(call.id, exc)


async def prove_payer(gate: PaymentGate, request: Request, call: Call, agent: AgentConfig) -> str | None:
    """The payer owning this call: the token that paid, or a fresh token verifying to them."""
    token = tokens.extract(call.params.get("metadata"), request.headers)
    if token is None:
        return None
    claim = gate.claims.find(token.digest)
    if claim is not None and claim.payer:
        return f"payer:{claim.payer}"
    assert agent.price is not None
    try:
        resource = agent_url(public_base_url(request, gate.services.settings.public_url), agent.name)
        requirements = tokens.check(token, agent.price, resource)
        verification = await gate.facilitator.verify(token.version, token.payload, requirements)
    except (tokens.Rejection, Unavailable):
        return None
    return f"payer:{verification.payer}" if verification.valid else None


def in_band_payment_required(gate: PaymentGate, plan: SendPlan, agent: AgentConfig, resource: str, extension: str) -> Response:
    """The a2a-x402 form: a Task in input-required carrying the v1 requirements."""
    assert agent.price is not None
    store, message = gate.services.store, plan.message
    task = store.get(message.get("taskId"), PENDING_OWNER, agent.name)
    if task is None:
        task = new_task(message.get("contextId"), {k: v for k, v in message.items() if k != "taskId"})
        store.create(task, agent=agent.name, owner=PENDING_OWNER)
    metadata = {
        STATUS: "payment-required",
        "x402.payment.required": pricing.payment_required_v1(agent.price, resource, agent.description),
    }
    set_status(task, "input-required", agent_message(task, "Payment is required to use this agent.", metadata))
    task["metadata"] = metadata
    store.save(task)
    result = dialects.send_result(trim_history(task, plan.history_length), plan.call.dialect)
    return result_response(plan.call.id, result, {"X-A2A-Extensions": extension})


def activated_extension(headers: Any) -> str:
    """The x402 extension URI the client activated, if any (echoed back when used)."""
    for header in ("x-a2a-extensions", "a2a-extensions"):
        for value in headers.getlist(header):
            for uri in value.split(","):
                if uri.strip() in X402_EXTENSIONS:
                    return uri.strip()
    return ""


def request_digest(agent: str, plan: SendPlan) -> str:
    """What the request asks for: never the messageId, which clients mint per retry."""
    content = [agent, plan.call.method, plan.message["parts"], plan.message.get("taskId")]
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def payer_allowed(agent: AgentConfig, payer: str) -> bool:
    try:
        return agent.allowed_payers is None or payer.lower() in agent.allowed_payers
    except Exception:  # fail closed
        return False


def payment_response_header(task: dict[str, Any]) -> dict[str, str]:
    metadata = task.get("metadata") or {}
    receipts = metadata.get("x402.payment.receipts")
    if metadata.get(STATUS) == "payment-completed" and receipts:
        return {"PAYMENT-RESPONSE": pricing.b64_json(receipts[-1])}
    return {}


def too_many_requests(wait: float) -> JSONResponse:
    return JSONResponse({"detail": "Too many requests"}, status_code=429, headers={"Retry-After": str(max(1, math.ceil(wait)))})


def not_authenticated() -> JSONResponse:
    return JSONResponse({"detail": "Not authenticated"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def payment_rejected(reason: str) -> JSONResponse:
    return JSONResponse({"detail": "Payment verification failed", "error": reason}, status_code=403)


def verify_unavailable(retry_after: float = 0.0) -> RpcError:
    data: dict[str, Any] = {"code": "verify_unavailable", "retryable": True}
    if retry_after > 0:  # the facilitator's breaker is open: when a retry can get through
        data["retry_after"] = math.ceil(retry_after)
    return RpcError(INTERNAL_ERROR, "Payment verification unavailable", data)
