"""Paying the A2A way: the a2a-x402 extension's in-band flow, a state machine on the Task.

A client that activated the extension (`A2A-Extensions` / `X-A2A-Extensions`) and sent
no token is answered with a Task in `input-required`, `x402.payment.status:
payment-required` and the requirements: `x402.payment.required`, the x402 v1 document the
a2a-x402 extension reads (the offers a v1 client signs), and `x402.payment.required.v2`, the
x402 v2 document with every offer (what x402's own A2A transport carries), so an x402 v2 client
pays any scheme in-band; its ORIGINAL message is kept (size-capped,
a few per caller, expiring with the requirements). The paying message names that
task and only carries the payment: after verify the agent runs the original message,
then the task ends `payment-completed` with receipts. A refused payment is answered on
the Task (`payment-failed`, an a2a-x402 error code, a failure receipt) and leaves it
payable again; `payment-rejected` from the client ends it, uncharged.

Signed material never stays in a message: `scrub` keeps the payment status and
drops every other `x402.*` key before a message is stored, run or echoed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from gate import payment_required
from gate.config import InBandConfig, Price
from gate.payment_required import Offer, PaymentRequiredAnswers
from gate.settlement import ERROR, RECEIPTS, STATUS
from server.config import AgentConfig
from server.dialects import TERMINAL_STATES
from server.execution import DeliveryHooks, Execution
from server.headers import values as header_values
from server.jsonrpc import TASK_NOT_FOUND, RpcError
from server.methods import Methods, SendPlan, finished, task_answer
from server.tasks import TaskStore, agent_message, new_task, pending_owner, set_status

EXTENSION_V02 = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2"
EXTENSION_V01 = "https://google-a2a.github.io/A2A/extensions/payments/x402/v0.1"  # the v0.1 spec's URI
EXTENSION_V01_CLIENT = "https://github.com/google-a2a/a2a-x402/v0.1"  # what published v0.1 clients send
EXTENSION_URIS = (EXTENSION_V02, EXTENSION_V01, EXTENSION_V01_CLIENT)
ACTIVATION_HEADERS = ("A2A-Extensions", "X-A2A-Extensions")

PREFIX = "x402."  # every a2a-x402 metadata key
REQUIRED = "x402.payment.required"  # the x402 v1 document (a2a-x402 v0.1 and v0.2 read this key)
REQUIRED_V2 = "x402.payment.required.v2"  # the x402 v2 document, every offer of the price
KEPT_KEYS = frozenset({STATUS})  # what a client's message may keep of the x402 keys

# a2a-x402 error codes (v0.1 section 8, v0.2 section 9, "common" ones: the list is open), chosen by
# what the reason names, first match wins; the refusals those codes do not cover have codes of
# their own, so that none reads as another (a payload the offer cannot take is no bad signature)
ERROR_CODES = (
    (("insufficient",), "INSUFFICIENT_FUNDS"),
    (("already_used", "duplicate"), "DUPLICATE_NONCE"),
    (("expired", "valid_before", "valid_after", "not_yet_valid", "valid_until", "window"), "EXPIRED_PAYMENT"),
    (("network",), "NETWORK_MISMATCH"),
    (("amount", "value", "recipient", "requirements", "asset", "pay_to"), "INVALID_AMOUNT"),
    (("settle",), "SETTLEMENT_FAILED"),
    (("unsupported",), "UNSUPPORTED_PAYLOAD"),  # not of the offer's kind (EIP-3009 for a Permit2 offer...)
    (("invalid_payload", "invalid_nonce", "payload_type"), "INVALID_PAYLOAD"),  # not a well-formed payload
    (("resource",), "RESOURCE_MISMATCH"),  # minted for another door
    (("payer_not_allowed",), "PAYER_NOT_ALLOWED"),  # the agent's allowlist
    (("signature", "signer"), "INVALID_SIGNATURE"),
)
FALLBACK_CODE = "PAYMENT_REFUSED"  # a reason none of the above names (the receipt's errorReason says it)


@dataclass(frozen=True)
class Activation:
    """The x402 extension URI a client activated, and the header it came in (echoed back the same way)."""

    header: str
    uri: str

    def echo(self) -> dict[str, str]:
        return {self.header: self.uri}


def activation(headers: Headers) -> Activation | None:
    for header, value in header_values(headers, ACTIVATION_HEADERS):
        for uri in value.split(","):
            if uri.strip() in EXTENSION_URIS:
                return Activation(header, uri.strip())
    return None


def echo(active: Activation | None) -> dict[str, str]:
    return active.echo() if active is not None else {}


def scrub(message: dict[str, Any]) -> dict[str, Any]:
    """The message without signed material: of the x402 keys only the payment status stays."""
    return _without_metadata(message, lambda key: key.startswith(PREFIX) and key not in KEPT_KEYS)


def agent_view(message: dict[str, Any]) -> dict[str, Any]:
    """The message as an agent sees it: no payment metadata at all (the agent's work is the same paid or not)."""
    return _without_metadata(message, lambda key: key.startswith(PREFIX))


def _without_metadata(message: dict[str, Any], dropped: Callable[[str], bool]) -> dict[str, Any]:
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or not any(isinstance(k, str) and dropped(k) for k in metadata):
        return message
    kept = {k: v for k, v in metadata.items() if not (isinstance(k, str) and dropped(k))}
    out = {k: v for k, v in message.items() if k != "metadata"}
    if kept:
        out["metadata"] = kept
    return out


def card_extensions(price: Price | None, url: str) -> list[dict[str, Any]]:
    """What a priced agent's card declares: every extension URI it accepts, none required (the
    offers as x402 v2 requirements)."""
    if price is None:
        return []
    params = {"x402Version": 2, "accepts": [payment_required.requirement(offer, url) for offer in price.offers]}
    description = "Pay per request with x402; without a payment the agent answers HTTP 402."
    return [{"uri": uri, "description": description, "required": False, "params": params} for uri in EXTENSION_URIS]


def error_code(reason: str) -> str:
    """The a2a-x402 error code for a refusal reason (the exact reason rides in the failure receipt)."""
    lowered = reason.lower().replace("batch_settlement", "")  # a scheme's name is no "settle" word
    for words, code in ERROR_CODES:
        if any(word in lowered for word in words):
            return code
    return FALLBACK_CODE


@dataclass(frozen=True)
class Pending:
    """A request awaiting its first payment: the task (with the original message it asked with), and its agent."""

    task: dict[str, Any]
    agent: str

    @property
    def id(self) -> str:
        return self.task["id"]

    @property
    def original(self) -> dict[str, Any]:
        return self.task["history"][0]


def client_status(plan: SendPlan) -> Any:
    metadata = plan.message.get("metadata")
    return metadata.get(STATUS) if isinstance(metadata, dict) else None


def request_digest(agent: str, method: str, task_id: str) -> str:
    """What an in-band payment pays for: the task's original request, which its id names.

    A retry of the same paying message (the same token for the same task) is the same
    request and replays; the same token for another task is a conflict.
    """
    content = [agent, method, "in-band", task_id]
    return hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest()


class InBand:
    """The in-band flow's steps on the task store: requests awaiting payment, paid, refused, declined."""

    def __init__(
        self, store: TaskStore, methods: Methods, limits: InBandConfig, answers_402: PaymentRequiredAnswers
    ) -> None:
        self.store, self.methods, self.answers_402 = store, methods, answers_402
        self.max_message_bytes = limits.max_message_bytes
        self.pending_per_caller = limits.pending_per_ip

    async def find_pending(self, plan: SendPlan, agent: AgentConfig) -> Pending | None:
        """The request awaiting payment this message continues (pays for, or declines), if any.

        One that ended unpaid (declined) is a finished task, answered as every finished task
        is: it is never asked for payment again, so it never counts against the cap again.
        """
        task = await self.store.unpaid(plan.message.get("taskId"), agent.name)
        if task is None:
            return None
        if task["status"]["state"] in TERMINAL_STATES:
            raise finished(task)
        return Pending(task, agent.name)

    async def store_pending(self, pending: Pending) -> None:
        """Store a request awaiting payment as it now stands, unless it changed meanwhile
        (paid for, declined, expired): then nothing is written and the caller is told why."""
        if not await self.store.save_unpaid(pending.task):
            raise await self.no_longer_pending(pending)

    async def no_longer_pending(self, pending: Pending) -> RpcError:
        """The answer for a request that stopped awaiting payment under us: finished, or gone
        (another payer adopted it, or it expired), the same -32001 as for any task not ours."""
        task = await self.store.unpaid(pending.id, pending.agent)
        if task is not None and task["status"]["state"] in TERMINAL_STATES:
            return finished(task)
        return RpcError(TASK_NOT_FOUND)

    async def payment_required(
        self,
        plan: SendPlan,
        offer: Offer,
        caller: str,
        active: Activation,
        pending: Pending | None,
    ) -> Response:
        """The Task asking for payment; over a cap (message size, requests per caller) the HTTP 402 instead."""
        store, price, resource = self.store, offer.price, offer.resource
        if pending is not None:
            task = pending.task
        elif client_status(plan) == "payment-rejected":  # it names nothing awaiting payment: nothing to decline
            raise RpcError(TASK_NOT_FOUND)
        else:
            message = scrub({k: v for k, v in plan.message.items() if k != "taskId"})
            owner = pending_owner(caller)
            too_big = len(json.dumps(message, separators=(",", ":"))) > self.max_message_bytes
            task = new_task(message.get("contextId"), message)
            ask(task, offer, {STATUS: "payment-required"}, answers=self.answers_402)
            if too_big or not await store.create_pending(
                task,
                agent=offer.agent,
                owner=owner,
                deadline_seconds=max_timeout(price, resource),
                cap=self.pending_per_caller,
            ):
                return self.answers_402.response(offer)
            return task_answer(plan, task, active.echo())
        ask(task, offer, {STATUS: "payment-required"}, answers=self.answers_402)
        await self.store_pending(pending)
        return task_answer(plan, task, active.echo())

    async def refused(
        self,
        plan: SendPlan,
        offer: Offer,
        pending: Pending,
        active: Activation | None,
        reason: str,
        payer: str = "",
        state: dict[str, dict[str, Any]] | None = None,
        version: int = 1,
    ) -> Response:
        """A refused payment, answered on the Task: payment-failed, the code, a failure receipt; payable again.
        `payer`: the one the payment names (verified or not: "" only when it names none); `state`: the
        payer's own state for a scheme (a channel's), in the requirements it is asked again with;
        `version`: the x402 version the payment came in, whose network names the receipt uses."""
        price = offer.price
        network = payment_required.V1_NETWORKS.get(price.network, price.network) if version == 1 else price.network
        receipt = {"success": False, "errorReason": reason, "network": network, "transaction": "", "payer": payer}
        code = error_code(reason)
        failure = {STATUS: "payment-failed", ERROR: code, RECEIPTS: [receipt]}
        task = pending.task
        ask(
            task,
            offer,
            failure,
            f"Payment failed ({code}); pay again to use this agent.",
            state,
            reason,
            answers=self.answers_402,
        )
        await self.store_pending(pending)
        return task_answer(plan, task, echo(active))

    async def declined(self, plan: SendPlan, pending: Pending, active: Activation | None) -> Response:
        """The client declined to pay (`payment-rejected`): the task ends, canceled, uncharged, for good."""
        task = pending.task
        metadata = {STATUS: "payment-rejected"}
        set_status(
            task, "canceled", agent_message(task, "Payment declined by the client; nothing was charged.", metadata)
        )
        task["metadata"] = metadata
        await self.store_pending(pending)
        return task_answer(plan, task, echo(active))

    async def start_paid(self, pending: Pending, agent: AgentConfig, owner: str, hooks: DeliveryHooks) -> Execution:
        """The payment is verified: the payer adopts the task and the agent runs the ORIGINAL message."""
        task = await self.store.adopt(pending.id, owner, agent.name)
        if task is None:  # paid for by someone else a moment ago, declined, or expired
            raise await self.no_longer_pending(pending)
        task.pop("metadata", None)
        return await self.methods.start_task(task, agent.name, task["history"][0], hooks)


def ask(
    task: dict[str, Any],
    offer: Offer,
    metadata: dict[str, Any],
    text: str = "Payment is required to use this agent.",
    state: dict[str, dict[str, Any]] | None = None,
    error: str = payment_required.PAYMENT_REQUIRED_ERROR,
    answers: payment_required.PaymentRequiredAnswers | None = None,
) -> None:
    """Put the task in input-required with fresh requirements, both documents, and the given payment
    metadata (a corrective one names why in `error` and carries the payer's `state`, a channel's);
    the v2 document's offers signed as `answers` signs the 402's."""
    price, resource, description = offer.price, offer.resource, offer.description
    document = payment_required.payment_required(price, resource, description, error, state, offer.all_extensions())
    metadata = {
        **metadata,
        REQUIRED: payment_required.payment_required_v1(price, resource, description, error, state),
        REQUIRED_V2: answers.signed(document)[0] if answers is not None else document,
    }
    set_status(task, "input-required", agent_message(task, text, metadata))
    task["metadata"] = metadata


def max_timeout(price: Price, resource: str) -> float:
    """How long a request may wait for its payment: the requirements' own maxTimeoutSeconds."""
    return float(payment_required.requirement_v1(price, resource)["maxTimeoutSeconds"])
