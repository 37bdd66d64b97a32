"""`a2a-gate-devnet pay` against an agent that offers exact, upto and a payment channel at once.

The client registers the x402 package's exact, upto and batch-settlement client schemes; ``scheme``
limits it to one. The seller here answers 402 with all three offers and has the development
facilitator verify whatever the client signed, so each case shows which offer was taken and that
the signature is one the facilitator accepts.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from eth_account import Account
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devnet.channels import DEV_RECEIVER_AUTHORIZER_KEY
from devnet.client import pay
from devnet.payer import encode_header
from tests.support import dev_facilitator_helpers as helpers
from tests.support.channels import channel_offer
from tests.support.dev_facilitator_helpers import PRICE
from tests.support.permit2_payments import upto_kind, upto_offer
from tests.support.serve import serve_app

start, facilitator = helpers.start, helpers.facilitator

RECEIVER_AUTHORIZER = Account.from_key(DEV_RECEIVER_AUTHORIZER_KEY).address


def offers(facilitator: Any) -> dict[str, dict[str, Any]]:
    return {
        "exact": dict(PRICE),
        "upto": upto_offer(upto_kind(facilitator.url), 5000),
        "batch-settlement": channel_offer(RECEIVER_AUTHORIZER),
    }


def verifying_seller(facilitator: Any, accepts: list[dict[str, Any]]) -> Starlette:
    """402 with ``accepts``; a paid retry is verified at the facilitator and answered with the verdict."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def a2a(request: Request) -> Response:
        header = request.headers.get("payment-signature")
        if header is None:
            required = {"x402Version": 2, "resource": {"url": str(request.url)}, "accepts": accepts}
            return JSONResponse({}, status_code=402, headers={"PAYMENT-REQUIRED": encode_header(required)})
        payment = json.loads(base64.b64decode(header))
        verdict = await run_in_threadpool(facilitator.verify, payment, payment["accepted"])
        seen.append((payment["accepted"]["scheme"], verdict))
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"kind": "task"}})

    app = Starlette(routes=[Route("/a2a", a2a, methods=["POST"])])
    app.state.seen = seen
    return app


@pytest.mark.parametrize("scheme", ["exact", "upto", "batch-settlement"])
def test_pay_with_a_scheme_takes_that_offer_among_all_three(facilitator, scheme):
    seller = verifying_seller(facilitator, list(offers(facilitator).values()))
    with serve_app(seller) as url:
        outcome = asyncio.run(pay(url + "/a2a", "hello", scheme=scheme))
    [(taken, verdict)] = seller.state.seen
    assert taken == scheme
    assert verdict["isValid"], verdict
    assert verdict["payer"] == outcome["payer"]


@pytest.mark.parametrize("first", ["upto", "batch-settlement"])
def test_pay_without_a_scheme_takes_the_first_offer(facilitator, first):
    by_scheme = offers(facilitator)
    accepts = [by_scheme[first], *(o for s, o in by_scheme.items() if s != first)]
    seller = verifying_seller(facilitator, accepts)
    with serve_app(seller) as url:
        asyncio.run(pay(url + "/a2a", "hello"))
    [(taken, verdict)] = seller.state.seen
    assert taken == first
    assert verdict["isValid"], verdict
