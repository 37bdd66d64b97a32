"""What a priced agent asks for: the x402 PaymentRequired documents and answers.

The HTTP form is x402 v2 (header `PAYMENT-REQUIRED`, standard base64, plus the same
document in the body as `payment_required`); the body's top level also speaks x402 v1
(`x402Version: 1`, v1 `accepts`, `error`), which is all an x402 1.x client reads, so
both generations of clients pay from the same 402. The in-band form, for clients that
activated the a2a-x402 extension, is an `input-required` Task carrying both: the x402
v1 requirements that extension's spec reads, and the v2 document beside them (x402's own
A2A transport), which is what `exact` by Permit2, `upto` and `batch-settlement` are paid from.

A v1 document lists only the offers an x402 v1 client signs as offered (`exact` by EIP-3009):
the x402 packages' v1 clients sign EIP-3009 for any `exact` offer and no other scheme, so a
Permit2 offer there would only buy them a refusal. With none left its `accepts` is empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pybase64
from cachetools import LRUCache
from starlette.responses import JSONResponse, Response

from gate import payment_ids, schemes
from gate.price import Price
from server import json_text

if TYPE_CHECKING:
    from gate.offer_receipt import OfferReceipts

# CAIP-2 ids and the x402 v1 network names for the same chains.
V1_NETWORKS = {
    "eip155:8453": "base",
    "eip155:84532": "base-sepolia",
    "eip155:43114": "avalanche",
    "eip155:43113": "avalanche-fuji",
    "eip155:137": "polygon",
    "eip155:80002": "polygon-amoy",
    "eip155:1": "ethereum",
    "eip155:11155111": "sepolia",
}
CAIP2_FOR_V1 = {v: k for k, v in V1_NETWORKS.items()}

PAYMENT_REQUIRED_ERROR = "Payment required to use this agent"


@dataclass(slots=True)
class Offer:
    """What one request is asked to pay: the agent, its price, and the door its token is minted for."""

    agent: str
    price: Price
    resource: str  # <public base>/a2a/{agent}: tokens that sign their resource name it
    description: str = ""
    id_required: bool = False  # the agent requires a payment identifier
    # the v2 document's `extensions`, made when a document is: the same in every document (`extensions`),
    # and each document's own (`fresh`: a sign-in challenge)
    extensions: Callable[[], dict[str, Any]] = field(default=lambda: {})
    fresh: Callable[[], dict[str, Any]] | None = None

    def all_extensions(self) -> dict[str, Any]:
        return {**self.extensions(), **(self.fresh() if self.fresh is not None else {})}


def extensions(id_required: bool) -> dict[str, Any]:
    """The x402 extensions every v2 document of an agent declares whatever else it carries (the
    payment identifier's); the others (discovery, a sign-in challenge) come with its `Offer`."""
    return {payment_ids.KEY: payment_ids.declaration(id_required)}


def requirement(price: Price, resource: str) -> dict[str, Any]:
    """The x402 v2 PaymentRequirements an agent advertises."""
    return {
        "scheme": price.scheme,
        "network": price.network,
        "asset": price.asset,
        "amount": price.amount,
        "payTo": price.pay_to,
        "maxTimeoutSeconds": price.max_timeout_seconds,
        "extra": offered_extra(price),
    }


def offered_extra(price: Price) -> dict[str, Any]:
    """The requirements' `extra`: the asset's EIP-712 domain, and what the scheme asks the signer for."""
    return {**price.extra, **schemes.for_price(price).extra()}


def b64_json(document: dict[str, Any]) -> str:
    return pybase64.b64encode(json_text.encode(document)).decode("ascii")


def with_state(offered: dict[str, Any], state: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """An offered requirement with the payer's own state for its scheme added to its `extra`
    (a channel's, in a corrective answer: `batch-settlement`'s `channelState`)."""
    added = (state or {}).get(offered["scheme"])
    return {**offered, "extra": {**offered["extra"], **added}} if added else offered


def payment_required(
    price: Price,
    resource_url: str,
    description: str = "",
    error: str = PAYMENT_REQUIRED_ERROR,
    state: dict[str, dict[str, Any]] | None = None,
    extensions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The x402 v2 PaymentRequired document, every offer of the price; `resource.url` names this door."""
    resource: dict[str, Any] = {"url": resource_url, "mimeType": "application/json"}
    if description:
        resource["description"] = description
    accepts = [with_state(requirement(offer, resource_url), state) for offer in price.offers]
    document = {"x402Version": 2, "error": error, "resource": resource, "accepts": accepts}
    if extensions:
        document["extensions"] = extensions
    return document


def requirement_v1(price: Price, resource_url: str, description: str = "") -> dict[str, Any]:
    """The same price as x402 v1 PaymentRequirements (the a2a-x402 extension's shape)."""
    return {
        "scheme": price.scheme,
        "network": V1_NETWORKS.get(price.network, price.network),
        "maxAmountRequired": price.amount,
        "resource": resource_url,
        "description": description,
        "mimeType": "application/json",
        "payTo": price.pay_to,
        "maxTimeoutSeconds": price.max_timeout_seconds,
        "asset": price.asset,
        "extra": offered_extra(price),
    }


def payment_required_v1(
    price: Price,
    resource_url: str,
    description: str = "",
    error: str = PAYMENT_REQUIRED_ERROR,
    state: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The offers an x402 v1 client can sign, as v1 PaymentRequirements (none: an empty `accepts`)."""
    accepts = [
        with_state(requirement_v1(offer, resource_url, description), state)
        for offer in price.offers
        if schemes.v1_signable(offer)
    ]
    return {"x402Version": 1, "accepts": accepts, "error": error}


class Rendered(Response):
    """An answer made once and sent many times: its status, body and headers as they go on the
    wire, without Starlette building the headers again for each request (`init_headers`)."""

    def __init__(self, status_code: int, body: bytes, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status_code
        self.body = body
        self.background = None
        self.raw_headers = list(raw_headers)  # each answer's own: what is added to one stays there


# where each answer's own entries (`fresh`) go in a rendered answer: a key no entry has
FRESH = "\x00fresh"
FRESH_TEXT = json_text.encode({FRESH: None})[1:-1]


class PaymentRequiredAnswers:
    """HTTP 402 answers: the document in the `PAYMENT-REQUIRED` header and in the body.

    Each answer is rendered once per agent, resource URL (bounded: the URL may come from a trusted
    proxy) and whether the agent requires a payment identifier, for the price it was rendered from: a
    new price (a reload, the facilitator's `/supported` filling an offer in) is a new object, and
    renders anew; so does one whose signed offers (`offers`, with a signing key) are due for signing
    again. The document's `extensions` are rendered with it (the offer's `extensions`), but for the
    entries each answer holds its own of (`fresh`: a sign-in challenge's nonce), put into the rendered
    text answer by answer.
    """

    def __init__(self, maxsize: int = 1024, offers: OfferReceipts | None = None) -> None:
        self.offers = offers
        # the price it was rendered from, until when it holds, the body, its headers as they go on the
        # wire but its length (PAYMENT-REQUIRED: a kilobyte, encoded once), and the document's text
        # where each answer adds its own entries (its PAYMENT-REQUIRED is then encoded answer by answer)
        self.rendered: LRUCache[
            tuple[str, str, bool], tuple[Price, float, bytes, list[tuple[bytes, bytes]], bytes | None]
        ] = LRUCache(maxsize=maxsize)

    def signed(self, document: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The v2 document with its offers signed (when a key signs them), and until when it holds."""
        return self.offers.with_offers(document) if self.offers is not None else (document, float("inf"))

    def response(self, offer: Offer) -> Response:
        key, fresh = (offer.agent, offer.resource, offer.id_required), offer.fresh
        rendered = self.rendered.get(key)
        if (
            rendered is None
            or rendered[0] is not offer.price
            or rendered[1] <= time.time()
            or (rendered[4] is not None) != (fresh is not None)
        ):
            entries = offer.extensions()
            if fresh is not None:
                entries = {**entries, FRESH: None}
            document, until = self.signed(
                payment_required(offer.price, offer.resource, offer.description, extensions=entries)
            )
            v1 = payment_required_v1(offer.price, offer.resource, offer.description)
            first = JSONResponse({**v1, "detail": "Payment required", "payment_required": document}, status_code=402)
            text = json_text.encode(document)
            headers = [h for h in first.raw_headers if h[0] != b"content-length"]
            if fresh is None:
                headers.append((b"payment-required", pybase64.b64encode(text)))
            rendered = (offer.price, until, bytes(first.body), headers, text if fresh is not None else None)
            self.rendered[key] = rendered
        _, _, body, headers, open_text = rendered
        if fresh is not None and open_text is not None:
            own = json_text.encode(fresh())[1:-1]
            body = body.replace(FRESH_TEXT, own, 1)
            headers = [*headers, (b"payment-required", pybase64.b64encode(open_text.replace(FRESH_TEXT, own, 1)))]
        return Rendered(402, body, [(b"content-length", str(len(body)).encode("ascii")), *headers])

    def corrective(
        self,
        price: Price,
        resource_url: str,
        description: str,
        error: str,
        state: dict[str, dict[str, Any]],
        extensions: dict[str, Any] | None = None,
    ) -> Response:
        """A 402 for one payer: the offers with its own state (a channel's) and the reason it must resync."""
        document, _ = self.signed(payment_required(price, resource_url, description, error, state, extensions))
        v1 = payment_required_v1(price, resource_url, description, error, state)
        return JSONResponse(
            {**v1, "detail": "Payment required", "payment_required": document},
            status_code=402,
            headers={"PAYMENT-REQUIRED": b64_json(document)},
        )
