"""The 402 is rendered once per door and sent as made (`gate.payment_required.PaymentRequiredAnswers`):
every answer carries the same status, headers and body as one built afresh, and each is its own,
so what a later step adds to one answer (the request id) never reaches the next."""

from __future__ import annotations

import base64
import json

from gate.payment_required import Offer, PaymentRequiredAnswers, payment_required, payment_required_v1
from gate.price import Price
from tests.support.paid import ASSET, PAY_TO

PRICE = Price(scheme="exact", network="eip155:84532", asset=ASSET, amount="1000", pay_to=PAY_TO)
DOOR = "https://gate.example/a2a/paid"


def test_every_402_is_the_document_rendered_once_and_each_answer_its_own() -> None:
    answers = PaymentRequiredAnswers()
    first = answers.response(Offer("paid", PRICE, DOOR, "a paid agent"))
    first.raw_headers.append((b"x-request-id", b"one"))  # what the request-id middleware adds to one
    second = answers.response(Offer("paid", PRICE, DOOR, "a paid agent"))
    assert len(answers.rendered) == 1
    for answer in (first, second):
        assert answer.status_code == 402 and answer.background is None
        body = json.loads(answer.body)
        assert body == {
            **payment_required_v1(PRICE, DOOR, "a paid agent"),
            "detail": "Payment required",
            "payment_required": payment_required(PRICE, DOOR, "a paid agent"),
        }
        headers = dict(answer.raw_headers)
        assert headers[b"content-length"] == str(len(answer.body)).encode()
        assert headers[b"content-type"] == b"application/json"
        assert json.loads(base64.b64decode(headers[b"payment-required"])) == body["payment_required"]
    assert (b"x-request-id", b"one") not in second.raw_headers
    assert [name for name, _ in second.raw_headers] == [b"content-length", b"content-type", b"payment-required"]


def test_each_door_has_its_own_402() -> None:
    answers = PaymentRequiredAnswers()
    one = answers.response(Offer("paid", PRICE, DOOR))
    other = answers.response(Offer("paid", PRICE, "https://other.example/a2a/paid"))
    assert json.loads(one.body)["payment_required"]["resource"]["url"] == DOOR
    assert json.loads(other.body)["payment_required"]["resource"]["url"] == "https://other.example/a2a/paid"
