"""Helpers for the in-band a2a-x402 flow: activation headers, paying messages, SSE answers."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.paid import send_body

EXTENSION_V02 = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2"
EXTENSION_V01_SPEC = "https://google-a2a.github.io/A2A/extensions/payments/x402/v0.1"
EXTENSION_V01_CLIENT = "https://github.com/google-a2a/a2a-x402/v0.1"
ACTIVATE = {"X-A2A-Extensions": EXTENSION_V02}


def paying_body(
    text: str,
    task_id: str,
    payload: dict[str, Any] | None,
    *,
    method: str = "message/send",
    status: str = "payment-submitted",
    call_id: Any = 1,
) -> dict[str, Any]:
    """The client's paying message: same taskId, the status, and the payload in metadata."""
    metadata: dict[str, Any] = {"x402.payment.status": status}
    if payload is not None:
        metadata["x402.payment.payload"] = payload
    return send_body(text, method=method, task_id=task_id, metadata=metadata, call_id=call_id)


def forge(signature: str) -> str:
    """A signature with one byte of `r` changed: it recovers no payer who signed anything."""
    flipped = "%02x" % (int(signature[10:12], 16) ^ 0xFF)
    return signature[:10] + flipped + signature[12:]


def sse_results(response: httpx.Response) -> list[dict[str, Any]]:
    """Every `data:` event of an SSE answer, as JSON-RPC responses."""
    assert response.headers["content-type"].startswith("text/event-stream"), response.text[:300]
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def task_of(result: dict[str, Any]) -> dict[str, Any]:
    """The Task in a send result of either dialect."""
    return result.get("task", result)


def payment_metadata(task: dict[str, Any]) -> dict[str, Any]:
    return task["status"]["message"]["metadata"]


def offer_v1(task: dict[str, Any]) -> dict[str, Any]:
    """The v1 requirements an in-band payment-required Task carries."""
    [offer] = payment_metadata(task)["x402.payment.required"]["accepts"]
    return offer


REQUIRED_V2 = "x402.payment.required.v2"
STREAMING = ("message/stream", "SendStreamingMessage")


class X402InBandPayer:
    """A payer that pays in-band from the Task's x402 v2 document with the x402 package's own v2
    client, unchanged, through its public API: `create_payment_payload` for the document it reads,
    and `handle_payment_response` with the receipt the Task carries (as the package's HTTP client
    does with `PAYMENT-RESPONSE`), so a channel client follows its channel from one request to the
    next. Every scheme the gate offers is registered: `exact` (EIP-3009 and Permit2), `upto`,
    `batch-settlement` (reading the chain through the development facilitator's `/rpc`)."""

    def __init__(self, facilitator_url: str) -> None:
        from eth_account import Account
        from x402 import x402ClientSync
        from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
        from x402.mechanisms.evm.exact import register_exact_evm_client
        from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
        from x402.mechanisms.evm.upto import UptoEvmClientScheme

        self.account = Account.create()
        self.address = self.account.address
        self.client = x402ClientSync()
        register_exact_evm_client(self.client, self.account)
        self.client.register("eip155:*", UptoEvmClientScheme(self.account))
        signer = EthAccountSignerWithRPC(self.account, rpc_url=facilitator_url + "/rpc")
        self.client.register("eip155:*", BatchSettlementEvmScheme(signer))
        self.client.set_spend_controls(False)  # a test payer signs whatever ceiling it is offered

    def sign(self, task: dict[str, Any]) -> Any:
        """The PaymentPayload (the package's model) for the v2 document an input-required Task carries."""
        from x402.schemas import PaymentRequired

        required = PaymentRequired.model_validate(payment_metadata(task)[REQUIRED_V2])
        return self.client.create_payment_payload(required)

    def follow(self, payload: Any, final: dict[str, Any]) -> None:
        """Hand the package's client what the gate answered: the receipt of a paid task, or the fresh
        v2 document of a refused payment (a channel's corrective state rides in it)."""
        from x402.schemas import PaymentRequired, PaymentResponseContext, SettleResponse

        metadata = final["status"]["message"]["metadata"]
        receipts = metadata.get("x402.payment.receipts") or []
        settled = SettleResponse.model_validate(receipts[-1]) if receipts and receipts[-1]["success"] else None
        required = PaymentRequired.model_validate(metadata[REQUIRED_V2]) if REQUIRED_V2 in metadata else None
        context = PaymentResponseContext(
            payment_payload=payload, requirements=payload.accepted, settle_response=settled, payment_required=required
        )
        self.client.handle_payment_response(context)


def final_task(response: httpx.Response, method: str) -> dict[str, Any]:
    """The task as a send or a stream leaves it: the result, or the last status event's task state
    (its status, artifacts gathered from the artifact events)."""
    assert response.status_code == 200, response.text[:500]
    if method not in STREAMING:
        body = response.json()
        assert "result" in body, body
        return task_of(body["result"])
    events = [event["result"] for event in sse_results(response)]
    artifacts = []
    for event in events:
        update = event.get("artifactUpdate", event)
        if "artifact" in update:
            artifacts.append(update["artifact"])
    last = events[-1]
    status = last.get("statusUpdate") or task_of(last)
    return {"id": status.get("taskId", status.get("id")), "status": status["status"], "artifacts": artifacts}


def pay_in_band(
    gate_url: str, agent: str, payer: X402InBandPayer, text: str, method: str = "message/send"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ask (no token, the extension activated), pay from the Task's v2 document on the same task,
    follow the answer: (the payment-required Task, the task as the paying message left it)."""
    from tests.support.paid import send_body, versioned

    url = f"{gate_url}/a2a/{agent}"
    asked = send_body(text, method=method)
    first = final_task(httpx.post(url, json=asked, headers=versioned(asked, dict(ACTIVATE)), timeout=30), method)
    payload = payer.sign(first)
    paying = paying_body(
        "payment attached",
        first["id"],
        payload.model_dump(mode="json", by_alias=True, exclude_none=True),
        method=method,
    )
    answer = httpx.post(url, json=paying, headers=versioned(paying, dict(ACTIVATE)), timeout=60)
    final = final_task(answer, method)
    payer.follow(payload, final)
    return first, final
