"""Signed offers and receipts (gate/offer_receipt.py): their payloads, both forms, and when an offer is signed anew."""

from __future__ import annotations

import json

import jwt
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from gate.offer_receipt import OFFER_FIELDS, RECEIPT_FIELDS, OfferReceipts, typed_data_hash
from gate.payment import Payment
from gate.payment_required import Offer, PaymentRequiredAnswers, payment_required
from gate.price import Price
from gate.schemes.batch_settlement import keccak
from server.signing_key import from_text

HEX = "0x" + "5e" * 32
KEY = from_text(HEX, "t")
URL = "http://gate.example/a2a/paid"
PRICE = Price(
    scheme="exact",
    network="eip155:84532",
    asset="0x036CbD53842c5426634e7929541eC2318f3dCF7e",
    amount="1000",
    pay_to="0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
    extra={"name": "USDC", "version": "2"},
)
PAYMENT = Payment(
    "d", 2, {"resource": {"url": URL}}, {"scheme": "upto"}, "paid", "0xpayer", "120", PRICE.network, PRICE.asset
)
SETTLED = {
    "success": True,
    "transaction": "0x" + "ab" * 32,
    "network": PRICE.network,
    "payer": "0xpayer",
    "amount": "120",
    "extra": {"usage": {"units": {"characters": 12}, "amount": "120", "ceiling": "50000"}},
}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def domain_types(primary: str) -> tuple[dict, dict]:
    fields = OFFER_FIELDS if primary == "Offer" else RECEIPT_FIELDS
    name = "x402 offer" if primary == "Offer" else "x402 receipt"
    return {"name": name, "version": "1", "chainId": 1}, {primary: [{"name": n, "type": t} for n, t in fields]}


def recovered(primary: str, signed: dict) -> str:
    """The address eth-account recovers from an EIP-712 signature (a second implementation of the hash)."""
    domain, types = domain_types(primary)
    return Account.recover_message(encode_typed_data(domain, types, signed["payload"]), signature=signed["signature"])


def test_the_eip712_hash_is_eth_accounts() -> None:
    payload = {
        "version": 1,
        "network": "eip155:1",
        "resourceUrl": URL,
        "payer": "0xp",
        "issuedAt": 7,
        "transaction": "",
    }
    domain, types = domain_types("Receipt")
    signable = encode_typed_data(domain, types, payload)
    digest = keccak(b"\x19" + signable.version + signable.header + signable.body)
    assert typed_data_hash("Receipt", payload) == digest


def test_a_jws_receipt_states_what_was_delivered_and_charged() -> None:
    clock = Clock()
    receipt = OfferReceipts(KEY, "jws", clock).receipt(PAYMENT, "task-1", SETTLED, URL)
    assert {k: v for k, v in receipt.items() if k != "extensions"} == SETTLED  # the settle answer, unchanged
    signed = receipt["extensions"]["offer-receipt"]["info"]["receipt"]
    assert signed["format"] == "jws"
    stated = json.loads(jwt.api_jws.decode(signed["signature"], jwt.PyJWK(KEY.public_jwk).key, algorithms=["ES256K"]))
    assert stated == {
        "version": 1,
        "network": PRICE.network,
        "resourceUrl": URL,
        "payer": "0xpayer",
        "issuedAt": int(clock.now),
        "transaction": SETTLED["transaction"],
        "task": "task-1",
        "agent": "paid",
        "scheme": "upto",
        "asset": PRICE.asset,
        "amount": "120",
        "usage": SETTLED["extra"]["usage"],
    }


def test_an_eip712_receipt_recovers_the_operators_address() -> None:
    receipt = OfferReceipts(KEY, "eip712", Clock()).receipt(PAYMENT, "task-1", {**SETTLED, "transaction": ""}, URL)
    signed = receipt["extensions"]["offer-receipt"]["info"]["receipt"]
    assert set(signed["payload"]) == {n for n, _ in RECEIPT_FIELDS}  # the typed fields, nothing unsigned
    assert signed["payload"]["transaction"] == ""  # none (a channel's charge): an empty string, as the package signs
    assert recovered("Receipt", signed) == Account.from_key(HEX).address


def test_the_eip712_form_needs_a_secp256k1_key() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p256 = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ValueError, match="secp256k1"):
        OfferReceipts(from_text(p256.decode(), "t"), "eip712")
    with pytest.raises(ValueError, match="format"):
        OfferReceipts(KEY, "pgp")


@pytest.mark.parametrize("form", ["jws", "eip712"])
def test_each_offer_is_signed_for_its_accepts_entry_and_signed_again_halfway(form: str) -> None:
    clock = Clock()
    signer = OfferReceipts(KEY, form, clock)
    document = payment_required(PRICE, URL)
    with_offers, until = signer.with_offers(document)
    assert {k: v for k, v in with_offers.items() if k != "extensions"} == document
    [offer] = with_offers["extensions"]["offer-receipt"]["info"]["offers"]
    assert offer["acceptIndex"] == 0
    if form == "eip712":
        payload = offer["payload"]
        assert recovered("Offer", offer) == Account.from_key(HEX).address
    else:
        payload = json.loads(
            jwt.api_jws.decode(offer["signature"], jwt.PyJWK(KEY.public_jwk).key, algorithms=["ES256K"])
        )
    accepted = document["accepts"][0]
    assert payload == {
        "version": 1,
        "resourceUrl": URL,
        "scheme": "exact",
        "network": accepted["network"],
        "asset": accepted["asset"],
        "payTo": accepted["payTo"],
        "amount": "1000",
        "validUntil": int(clock.now) + accepted["maxTimeoutSeconds"],
    }
    assert until == clock.now + accepted["maxTimeoutSeconds"] / 2
    clock.now += 1
    assert signer.with_offers(document)[0] == with_offers  # the same offer, until halfway
    clock.now = until
    assert signer.with_offers(document)[0] != with_offers  # then signed anew, valid for as long again


def test_a_cached_402_carries_fresh_offers_and_an_unsigned_one_none() -> None:
    clock = Clock()
    answers = PaymentRequiredAnswers(offers=OfferReceipts(KEY, "jws", clock))
    first = answers.response(Offer("paid", PRICE, URL)).body
    assert answers.response(Offer("paid", PRICE, URL)).body == first  # rendered once...
    answers.rendered[("paid", URL, False)] = (
        PRICE,
        0.0,
        *answers.rendered[("paid", URL, False)][2:],
    )  # ... until it lapses
    clock.now += 1000
    assert answers.response(Offer("paid", PRICE, URL)).body != first
    unsigned = json.loads(PaymentRequiredAnswers().response(Offer("paid", PRICE, URL)).body)
    assert "extensions" not in unsigned["payment_required"]
