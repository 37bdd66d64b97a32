"""The anonymous pipeline (DESIGN section 4), top to bottom; each step's work lives in its own module.

Each step is cheaper than the next: nothing reaches the database or the facilitator
before both limiters have passed, and nothing is executed before the token is
claimed and verified. Every answer here is one the contract names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gate import bazaar, in_band, payment_ids, payment_required, reconciler, schemes, sign_in, tokens
from gate.claims import LIVE_STATES, Claim, ClaimLost, ClaimState, Hold
from gate.config import AgentPayment, Price, payment_window_seconds
from gate.facilitator import Unavailable
from gate.flows.base import Reserved, Verdict
from gate.limiter import caller_key
from gate.parts import GateParts
from gate.payment_required import Offer
from gate.settlement import STATUS, Payment, metadata_for
from server import tracing
from server.anonymous import not_authenticated
from server.cards import agent_url
from server.config import AgentConfig
from server.frozen import evolve
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
from server.methods import SendPlan, plan_send, task_answer, unsupported
from server.proxy import public_base_url
from server.request_log import RequestInfo

logger = logging.getLogger("a2a_gate.gate")


async def handle_anonymous(parts: GateParts, request: Request, name: str, info: RequestInfo) -> Response:
    settings = parts.settings
    # 1. per-IP, then per-agent limiter (one question, one Redis command when they are shared)
    refused = await parts.limits.check(info.client, name)
    if refused is not None:
        which, wait = refused
        parts.metrics.refused[which].inc()
        return too_many_requests(wait)
    # 2. unknown, unexposed and unpriced agents all look the same
    agent, terms = parts.agents.get(name), parts.offers.agent(name)
    priced = terms.price is not None or name in parts.offers.unavailable
    if agent is None or not agent.exposed or not priced:
        return not_authenticated()
    # 3. a priced door that cannot take payment now (no facilitator, or every offer waits for what it advertises)
    if not parts.facilitator.configured or terms.price is None:
        return JSONResponse({"detail": "Payment is not available for this agent now"}, status_code=501)
    # 4. envelope; what any step raises is answered by the server (`server.app.answered`): an
    # unreachable store or a bug of ours is a retryable -32603, never a 500, never a free pass
    call = await read_call(request, settings.max_body_bytes)
    info.method = call.method
    if call.operation in ("get", "cancel", "subscribe", "list"):
        return await bound_task_call(parts, request, call, agent, terms.price, info.client)
    if call.operation not in ("send", "stream"):
        raise unsupported(call)
    if call.operation == "stream" and not agent.streaming:
        raise RpcError(UNSUPPORTED_OPERATION, "This agent does not stream")
    # 5. the message must be usable before a token is looked for
    plan = plan_send(call)
    return await paid_send(parts, request, plan, agent, terms, info)


@dataclass
class Attempt:
    """One paid request on its way through the steps: what it asks, what pays, what it holds."""

    plan: SendPlan
    agent: AgentConfig
    terms: AgentPayment
    offer: Offer
    info: RequestInfo
    active: in_band.Activation | None  # the x402 extension the client activated, if any
    pending: in_band.Pending | None  # the in-band request this message pays for, if any
    token: tokens.Token | None = None
    price: Price | None = None  # the offer the token pays (its scheme's), once known
    requirements: dict[str, Any] = field(default_factory=dict)
    payment: Payment | None = None
    hold: Hold | None = None  # the claim, once taken: every write to it names this
    reserved: Reserved | None = None  # what its flow reserved with the claim
    started: bool = False  # the execution owns the claim from here on

    @property
    def log(self) -> dict[str, Any]:
        assert self.token is not None
        return log_fields(self.price or self.offer.price, self.agent.name, self.token)


async def paid_send(
    parts: GateParts, request: Request, plan: SendPlan, agent: AgentConfig, terms: AgentPayment, info: RequestInfo
) -> Response:
    price = terms.price
    assert price is not None
    resource = agent_url(public_base_url(request, parts.settings.public_url), agent.name)
    id_required = terms.payment_identifier == "required"
    # a 402's extensions: the payment identifier's, the bazaar declaration where the agent is listed,
    # and a sign-in challenge of its own
    fresh = parts.sign_in.fresh(resource, (o.network for o in price.offers)) if terms.sign_in else None
    offer = Offer(
        agent.name,
        price,
        resource,
        agent.description,
        id_required,
        lambda: {**payment_required.extensions(id_required), **(bazaar.extension(agent) if terms.discovery else {})},
        fresh,
    )
    active = in_band.activation(request.headers)
    # a message continuing an in-band request awaiting payment pays (or declines) for its original
    pending = await parts.in_band.find_pending(plan, agent)
    if pending is not None and in_band.client_status(plan) == "payment-rejected":
        info.set("ok", "in-band payment declined: not charged")
        return await parts.in_band.declined(plan, pending, active)
    # 6. the token: message metadata first, then PAYMENT-SIGNATURE, then X-PAYMENT
    token = tokens.extract(plan.message.get("metadata"), request.headers)
    if token is None:
        if active is not None:
            info.set("payment_required", "in-band")
            caller = caller_key(info.client, parts.config.limits.ipv6_prefix)  # one household, one cap
            return await parts.in_band.payment_required(plan, offer, caller, active, pending)
        info.set("payment_required")
        return parts.answers_402.response(offer)
    attempt = Attempt(plan, agent, terms, offer, info, active, pending, token)
    # 7. local checks, against the offer of the token's own scheme; a retry of a claimed token is
    # answered by its claim whatever the clock says
    paid_offer = tokens.offer_of(token, price)
    if paid_offer is None:
        return await refuse(parts, attempt, "accepted_requirements_mismatch")
    price = attempt.price = paid_offer
    if tracing.active():  # on the request's span; off, not even the mapping is made
        tracing.annotate({"x402.scheme": price.scheme, "x402.network": price.network})
    scheme = schemes.for_price(price)  # the one kind of payload this offer takes
    flow = parts.flows.for_price(price)  # and how it is collected
    try:
        attempt.requirements = tokens.check_payload(token, price, resource)
        if flow.windowed(token):  # (a payload without a window is collectable while what it spends lives)
            window = payment_window_seconds(agent.deadline_seconds, parts.config.facilitator)
            tokens.check_window(token, min_window=window, scheme=scheme)
    except tokens.Rejection as exc:
        # the claim is read only now: a fresh token never waits for it
        if exc.reason not in tokens.WINDOW_REASONS or await parts.claims.find(token.digest) is None:
            return await refuse(parts, attempt, exc.reason)
    try:
        payment_id = payment_ids.of(token.payload)  # the payer's idempotency key, if it sent one
    except payment_ids.Invalid:
        return await refuse_identified(parts, attempt, payment_ids.INVALID)
    if payment_id is None and id_required:
        return await refuse_identified(parts, attempt, payment_ids.REQUIRED)
    # 8. claim, before anything is executed
    payment = attempt.payment = Payment(
        token.digest,
        token.version,
        token.payload,
        attempt.requirements,
        agent.name,
        "",
        price.amount,
        price.network,
        price.asset,
    )
    sealed = parts.charges.sealed_at_claim(payment)
    digest = await claim_digest(parts, agent, plan, token, pending)
    if payment_id is not None:  # another payment came with this id first: its answer, not a second charge
        first = await parts.claims.find_by_payment_id(payment_id)
        if first is not None and first.token_digest != token.digest:
            return await answer_by_id(parts, attempt, first, digest)
    nonce_key = tokens.nonce_key(token, price.asset, scheme)
    # what the flow checks now it reserves with the claim (only if the claim is taken)
    reservable = await flow.reserve_with_claim(token, price)
    along = [reservable.reserve] if reservable is not None else []
    outcome = await parts.claims.claim(
        token.digest,
        nonce_key,
        digest,
        agent.name,
        sealed,
        along=along,
        **({} if payment_id is None else {"payment_id": payment_id, "named_payer": tokens.named_payer(token)}),
    )
    if outcome.kind == "identified":  # the id was claimed a moment ago, by another payment
        assert outcome.claim is not None
        return await answer_by_id(parts, attempt, outcome.claim, digest)
    if outcome.kind == "conflict":
        behind = await flow.behind(token, price)  # paid for already: is the payer's state behind?
        if behind is not None:
            return await not_verified(parts, attempt, behind)
        return await refuse(parts, attempt, outcome.reason)
    if outcome.kind == "in_flight":
        info.set("in_flight")
        return in_flight(plan.call.id)
    if outcome.kind == "replay":
        assert outcome.claim is not None
        info.set("replay")
        info.payer = outcome.claim.payer
        return await replay(parts, plan, outcome.claim, payment, in_band.echo(active), info)
    assert outcome.hold is not None
    attempt.hold = outcome.hold
    attempt.reserved = reservable if outcome.along == (1,) else None
    try:
        return await verified_send(parts, attempt)
    except BaseException:
        # a bug of ours (or a cancellation) before the work started: the claim must not
        # stay "running" forever and lock the payer out; after the start it is bound to
        # the execution, which releases or settles it.
        if not attempt.started:
            await parts.release(attempt.hold)  # fenced: only ever our own running claim
        raise


async def refuse(parts: GateParts, attempt: Attempt, reason: str, payer: str = "") -> Response:
    """A refused payment: logged (`payer`: a verified one only), and answered 403 or, in-band, on the
    Task, whose failure receipt names the payer the payload names when none was verified."""
    await parts.log.append("reject", **attempt.log, payer=payer, error=reason)
    attempt.info.set("rejected", reason)
    if attempt.pending is not None:
        token = attempt.token
        assert token is not None
        named = payer or tokens.named_payer(token)
        return await parts.in_band.refused(
            attempt.plan, attempt.offer, attempt.pending, attempt.active, reason, named, version=token.version
        )
    return payment_rejected(reason)


async def answer_by_id(parts: GateParts, attempt: Attempt, first: Claim, digest: str) -> Response:
    """A payment under an id that another payment came with first. This one is verified (proving who
    asks), never claimed nor settled: for the first's payer and request it answers as the first does
    (its stored answer, or `in_flight` while it runs); for anyone or anything else, the one conflict
    answer, which says nothing of the first."""
    token, plan, info = attempt.token, attempt.plan, attempt.info
    assert token is not None and attempt.payment is not None
    try:
        checked = await parts.facilitator.verify(token.version, token.payload, attempt.requirements)
    except Unavailable as exc:
        logger.warning("facilitator verify unavailable: %s", exc.reason)
        info.set("verify_unavailable", exc.reason)
        return error_response(plan.call.id, verify_unavailable(exc.retry_after))
    if not checked.valid:
        return await refuse(parts, attempt, checked.reason)
    info.payer = checked.payer
    task_id = plan.message.get("taskId")
    same_request = first.request_digest == digest or (
        isinstance(task_id, str)  # an in-band request, paid again on its task after the first adopted it
        and first.task_id == task_id
        and first.request_digest == in_band.request_digest(attempt.agent.name, plan.call.method, task_id)
    )
    if not same_request or first.agent != attempt.agent.name or first.id_payer != checked.payer:
        return await refuse_identified(parts, attempt, payment_ids.CONFLICT, checked.payer)
    if first.state in LIVE_STATES:
        info.set("in_flight", "payment identifier")
        return in_flight(plan.call.id)
    info.set("replay", "payment identifier")
    return await replay(parts, plan, first, attempt.payment, in_band.echo(attempt.active), info)


# The payment identifier's refusals (gate/payment_ids.py): the status and detail each answers with.
ID_REFUSALS = {
    payment_ids.REQUIRED: (400, "Payment identifier required"),
    payment_ids.INVALID: (400, "Invalid payment identifier"),
    payment_ids.CONFLICT: (409, "Payment identifier already used"),
}


async def refuse_identified(parts: GateParts, attempt: Attempt, reason: str, payer: str = "") -> Response:
    """A payment refused for its payment identifier: logged like every refusal, and answered with the
    extension's own status (in-band, on the Task, as every refusal is)."""
    if attempt.pending is not None:
        return await refuse(parts, attempt, reason, payer)
    await parts.log.append("reject", **attempt.log, payer=payer, error=reason)
    attempt.info.set("rejected", reason)
    status, detail = ID_REFUSALS[reason]
    return JSONResponse({"detail": detail, "error": reason}, status_code=status)


async def verified_send(parts: GateParts, attempt: Attempt) -> Response:
    """Steps 9 to 12, for a claimed token (every claim write names `attempt.hold`)."""
    plan, agent, info, token, hold = attempt.plan, attempt.agent, attempt.info, attempt.token, attempt.hold
    assert token is not None and hold is not None and attempt.payment is not None
    call = plan.call
    assert attempt.price is not None
    # 9. verify, as the payment's flow does it (the facilitator's, or its own check and reservation)
    verdict = await parts.flows.for_price(attempt.price).verify(
        token, attempt.requirements, attempt.price, attempt.reserved
    )
    if verdict.kind != "ok":
        await parts.release(hold)
        return await not_verified(parts, attempt, verdict)
    info.payer = verdict.payer
    # 10. payer allowlist, failing closed
    if not payer_allowed(attempt.terms, verdict.payer):
        await parts.release(hold)
        return await refuse(parts, attempt, "payer_not_allowed", verdict.payer)
    price = attempt.price  # the offer this token pays, not the price's first
    parts.metrics.authorized.labels(price.network, price.asset).inc(int(price.amount))
    # 11. execute; 12. settle after delivery (inside the execution, shielded from disconnects)
    payment = attempt.payment = evolve(attempt.payment, payer=verdict.payer)
    owner = f"payer:{payment.payer}"
    hooks = parts.charges.hooks(
        payment,
        hold,
        withhold=attempt.terms.on_settle_failure == "withhold",
        meter=parts.flows.for_price(price).meter(payment, price),
    )
    # a new task takes the verify row and the claim's bind with its INSERT: one round trip (a task
    # the delivery stores, with the delivery's); each applies only while the claim is ours. A task
    # first written as it ends is written with its delivery, whose claim write names the task and
    # the payer itself (`Claims.delivered_settled`, `mark_delivered`): no bind then
    fresh = attempt.pending is None and plan.message.get("taskId") is None
    verified = parts.log.statement("verify", **attempt.log, payer=payment.payer, only_if=parts.claims.ours(hold))

    def with_task(task: dict[str, Any], final: bool) -> list[tuple[str, Any]]:
        return [verified] if final else [verified, parts.claims.bind_statement(hold, payment.payer, task["id"])]

    if not fresh:
        await parts.log.append("verify", **attempt.log, payer=payment.payer)
    try:
        if attempt.pending is not None:  # in-band: the agent runs the original message of the task
            execution = await parts.in_band.start_paid(attempt.pending, agent, owner, hooks)
        else:
            execution = await parts.methods.start_send(
                plan,
                agent.name,
                owner,
                hooks,
                with_writes=with_task,
            )
    except RpcError as exc:
        await parts.release(hold)
        if fresh:  # nothing was written with the task
            await parts.log.append("verify", **attempt.log, payer=payment.payer)
        await parts.log.append("release", **attempt.log, payer=payment.payer, error=f"not started: {exc.message}")
        return error_response(call.id, exc)
    attempt.started = True
    headers = in_band.echo(attempt.active)
    # a stream follows the execution from now on, before anything awaits (the work may be quick)
    streamed = parts.methods.stream(plan, execution, headers) if call.operation == "stream" else None
    if not fresh:
        try:
            await parts.claims.bind(hold, payment.payer, execution.task["id"])
        except ClaimLost:  # taken over already: the execution was revoked and delivers nothing
            pass
    if streamed is not None:
        info.set("ok", "stream")
        return streamed
    result = await parts.methods.send(plan, execution)
    info.set(*charge_outcome(execution.task))
    return result_response(call.id, result, {**headers, **payment_response_header(execution.task, payment.version)})


async def not_verified(parts: GateParts, attempt: Attempt, verdict: Verdict) -> Response:
    """A payment that cannot go on now: a retry (our outage, or what it needs is busy), the corrective
    answer of a payer whose state is behind, or a refusal."""
    info, call = attempt.info, attempt.plan.call
    info.payer = verdict.payer
    if verdict.kind == "unavailable":
        logger.warning("facilitator verify unavailable: %s", verdict.reason)
        info.set("verify_unavailable", verdict.reason)
        return error_response(call.id, verify_unavailable(verdict.retry_after))
    if verdict.kind == "busy":
        info.set("in_flight", verdict.reason)
        data = {"code": verdict.code, "retryable": True}
        return error_response(call.id, RpcError(INTERNAL_ERROR, verdict.message, data))
    if verdict.kind == "resync":
        await parts.log.append("reject", **attempt.log, payer=verdict.payer, error=verdict.reason)
        info.set("rejected", verdict.reason)
        offer = attempt.offer
        if attempt.pending is not None:
            assert attempt.token is not None
            payer = verdict.payer or tokens.named_payer(attempt.token)
            return await parts.in_band.refused(
                attempt.plan,
                offer,
                attempt.pending,
                attempt.active,
                verdict.reason,
                payer,
                verdict.state,
                attempt.token.version,
            )
        return parts.answers_402.corrective(
            offer.price, offer.resource, offer.description, verdict.reason, verdict.state, offer.all_extensions()
        )
    return await refuse(parts, attempt, verdict.reason, verdict.payer)


async def claim_digest(
    parts: GateParts, agent: AgentConfig, plan: SendPlan, token: tokens.Token, pending: in_band.Pending | None
) -> str:
    """The request a token pays for. In-band it is the task's original request, also when
    a retry comes after the task was adopted (the claim then names the same task)."""
    task_id = plan.message.get("taskId")
    if pending is not None:
        return in_band.request_digest(agent.name, plan.call.method, pending.id)
    if isinstance(task_id, str):
        claim = await parts.claims.find(token.digest)
        in_band_digest = in_band.request_digest(agent.name, plan.call.method, task_id)
        if claim is not None and claim.task_id == task_id and claim.request_digest == in_band_digest:
            return in_band_digest
    return request_digest(agent.name, plan)


def log_fields(price: Price, agent: str, token: tokens.Token) -> dict[str, str]:
    """What every payment log row of this request names: the agent, the price, the token's digest."""
    return dict(
        agent=agent,
        token_digest=token.digest,
        amount=price.amount,
        network=price.network,
        asset=price.asset,
        scheme=price.scheme,
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
    parts: GateParts, plan: SendPlan, claim: Claim, payment: Payment, headers: dict[str, str], info: RequestInfo
) -> Response:
    """The same token with the same request: the stored answer, re-driving an owed settlement. A
    task its lapsed owner never brought up to the claim's recorded outcome is repaired first, as the
    reconciler would (until then the stored task reads `working`); one being repaired is in flight."""
    owner, call = f"payer:{claim.payer}", plan.call
    shown = False
    if claim.state == ClaimState.SETTLE_FAILED:
        taken = await parts.claims.take_owed(claim.token_digest)
        if taken is not None:
            await reconciler.settle_owed(parts, taken)
            shown = True
    if claim.task_outdated and not shown:
        hold = await parts.claims.take_outdated(claim)
        if hold is None:  # its owner is storing it still, or someone else is repairing it
            info.set("in_flight", "answer being stored")
            return in_flight(call.id)
        try:
            await reconciler.show_outcome(parts, claim, hold, metadata_for(claim))
        except ClaimLost:
            info.set("in_flight", "answer being stored")
            return in_flight(call.id)
    task = await parts.store.get(claim.task_id, owner, claim.agent)
    if task is None:
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    await parts.log.append("replay", **replace(payment, payer=claim.payer).log_fields(claim.task_id))
    receipt = payment_response_header(task, payment.version)
    return task_answer(plan, task, {**headers, "X-Idempotent-Replay": "true", **receipt})


def in_flight(call_id: Any) -> Response:
    """The same token with the same request, while the first is still running (or its answer is
    still being stored): retryable."""
    data = {"code": "in_flight", "retryable": True}
    return error_response(call_id, RpcError(INTERNAL_ERROR, "Request in flight", data))


async def bound_task_call(
    parts: GateParts, request: Request, call: Call, agent: AgentConfig, price: Price, client: str
) -> Response:
    """Task calls for a payer: every failure is the same -32001 bytes (a list, an empty page)."""
    owner = await prove_payer(parts, request, call, agent, price)
    if owner is None:
        if call.operation == "list":  # nothing is visible without proof
            return result_response(call.id, await parts.methods.list(call, agent.name, None))
        return error_response(call.id, RpcError(TASK_NOT_FOUND))
    try:
        return await parts.methods.task_call(call, agent.name, owner, client)
    except RpcError as exc:
        return error_response(call.id, exc)


async def prove_payer(parts: GateParts, request: Request, call: Call, agent: AgentConfig, price: Price) -> str | None:
    """The payer owning this call: the wallet it signs in with (`SIGN-IN-WITH-X`), the token that
    paid, or a fresh token verifying to them."""
    resource = agent_url(public_base_url(request, parts.settings.public_url), agent.name)
    signed_in = request.headers.get(sign_in.HEADER)
    terms = parts.config.agents.get(agent.name)
    if signed_in is not None and terms is not None and terms.sign_in:  # where the agent offers it
        wallet = await parts.sign_in.payer(signed_in, resource)
        if wallet is not None:
            return f"payer:{wallet}"
    token = tokens.extract(call.params.get("metadata"), request.headers)
    if token is None:
        return None
    claim = await parts.claims.find(token.digest)
    if claim is not None and claim.payer:
        return f"payer:{claim.payer}"
    try:
        offer = tokens.offer_of(token, price)
        if offer is None:
            return None
        requirements = tokens.check(token, offer, resource)
        verification = await parts.facilitator.verify(token.version, token.payload, requirements)
    except (tokens.Rejection, Unavailable):
        return None
    return f"payer:{verification.payer}" if verification.valid else None


def request_digest(agent: str, plan: SendPlan) -> str:
    """What the request asks for: never the messageId, which clients mint per retry."""
    content = [agent, plan.call.method, plan.message["parts"], plan.message.get("taskId")]
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def payer_allowed(terms: AgentPayment, payer: str) -> bool:
    try:
        return terms.allowed_payers is None or payer.lower() in terms.allowed_payers
    except Exception:  # noqa: BLE001 -- fail closed
        return False


def payment_response_header(task: dict[str, Any], version: int = 2) -> dict[str, str]:
    """The receipt of a settled request: `PAYMENT-RESPONSE` (x402 v2), and for a v1 payment also
    `X-PAYMENT-RESPONSE`, where x402 1.0's own clients and middleware read it."""
    metadata = task.get("metadata") or {}
    receipts = metadata.get("x402.payment.receipts")
    if metadata.get(STATUS) != "payment-completed" or not receipts:
        return {}
    receipt = payment_required.b64_json(receipts[-1])
    return (
        {"PAYMENT-RESPONSE": receipt, "X-PAYMENT-RESPONSE": receipt} if version == 1 else {"PAYMENT-RESPONSE": receipt}
    )


# rendered once: the limiter's answer is the one an overloaded gate sends most
TOO_MANY_REQUESTS = JSONResponse({"detail": "Too many requests"}).body


def too_many_requests(wait: float) -> Response:
    return Response(
        TOO_MANY_REQUESTS,
        status_code=429,
        headers={"Retry-After": str(max(1, math.ceil(wait)))},
        media_type="application/json",
    )


def payment_rejected(reason: str) -> JSONResponse:
    return JSONResponse({"detail": "Payment verification failed", "error": reason}, status_code=403)


def verify_unavailable(retry_after: float = 0.0) -> RpcError:
    data: dict[str, Any] = {"code": "verify_unavailable", "retryable": True}
    if retry_after > 0:  # the facilitator's breaker is open: when a retry can get through
        data["retry_after"] = math.ceil(retry_after)
    return RpcError(INTERNAL_ERROR, "Payment verification unavailable", data)
