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
