"""The scheme seam: a price names its scheme, and everything scheme-specific is asked of that module.

A scheme registered in `gate.schemes.SCHEMES` is accepted by the configuration, offered by
the 402 (its `extra`), and is the only reader of its payloads: shape, window, nonce key,
chain evidence and settle refusals.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devnet.payer import new_private_key, sign_payment
from gate import schemes, tokens
from gate.config import DEMO_PRICE, parse_config
from gate.pricing import payment_required, requirement
from gate.schemes.base import Authorization, Rejection
from gate.schemes.exact_eip3009 import SCHEME as EXACT_EIP3009
from gate.settlement import classify
from server.config import ConfigError

RESOURCE = "http://gate.example/a2a/paid"
PRICE = {
    "network": "eip155:84532",
    "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
    "amount": "1000",
    "pay_to": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
}


class Voucher:
    """A made-up scheme: its payload is `{"voucher": "<nonce>"}`, valid for an hour from 0."""

    scheme = "exact"
    transfer_method = "voucher"
    definitive_reasons = frozenset({"voucher_spent_forever"})
    nonce_used_reasons = frozenset({"voucher_used"})

    def extra(self) -> dict[str, Any]:
        return {"assetTransferMethod": "voucher"}

    def check(self, inner: dict[str, Any], price: Any) -> None:
        if set(inner) != {"voucher"}:
            raise Rejection("not_a_voucher")

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        return 0, 2**40

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        return f"{network}|voucher|{inner.get('voucher')}"

    def authorization(
        self, payload: dict[str, Any], requirements: dict[str, Any], network: str
    ) -> Authorization | None:
        return None


@pytest.fixture
def voucher(monkeypatch):
    scheme = Voucher()
    monkeypatch.setitem(schemes.SCHEMES, (scheme.scheme, scheme.transfer_method), scheme)
    return scheme


def priced(**price: Any) -> dict[str, Any]:
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**PRICE, **price}}}}


def test_a_price_names_its_scheme_and_transfer_method():
    read = parse_config(priced(), base_dir=Path("/tmp")).anonymous.price("paid")
    assert (read.scheme, read.asset_transfer_method) == ("exact", "eip3009")
    assert schemes.for_price(read) is EXACT_EIP3009
    assert "assetTransferMethod" not in requirement(read, RESOURCE)["extra"]  # x402's default, as before


@pytest.mark.parametrize(
    ("price", "path"),
    [
        ({"scheme": "auction"}, "agents.paid.price.scheme"),
        ({"asset_transfer_method": "carrier-pigeon"}, "agents.paid.price.asset_transfer_method"),
    ],
)
def test_an_unknown_scheme_or_transfer_method_is_a_problem_with_its_key_path(price, path):
    with pytest.raises(ConfigError) as caught:
        parse_config(priced(**price), base_dir=Path("/tmp"), source="gate.toml")
    assert [p.split(": ")[1] for p in caught.value.problems] == [path]


def test_a_registered_scheme_is_configured_offered_and_alone_reads_its_payloads(voucher):
    price = parse_config(priced(asset_transfer_method="voucher"), base_dir=Path("/tmp")).anonymous.price("paid")
    assert schemes.for_price(price) is voucher
    offered = payment_required(price, RESOURCE)["accepts"]
    assert [o["extra"]["assetTransferMethod"] for o in offered] == ["voucher"]  # the 402 offers what it takes
    eip3009 = sign_payment(payment_required(DEMO_PRICE, RESOURCE), new_private_key())
    document = {**eip3009, "accepted": offered[0], "payload": {"voucher": "v1"}}
    token = tokens.from_object(document, "metadata")
    assert tokens.check_payload(token, price, RESOURCE) == offered[0]
    assert tokens.nonce_key(token, price.asset, voucher) == "eip155:84532|voucher|v1"
    # an EIP-3009 payload is not this scheme's: refused, though it would pass the other scheme
    wrong = tokens.from_object({**eip3009, "accepted": offered[0]}, "metadata")
    with pytest.raises(Rejection) as refused:
        tokens.check_payload(wrong, price, RESOURCE)
    assert refused.value.reason == "not_a_voucher"
    # and the EIP-3009 price still refuses the voucher payload, by its own module
    with pytest.raises(Rejection) as other:
        tokens.check_payload(
            tokens.from_object({**document, "accepted": eip3009["accepted"]}, "metadata"), DEMO_PRICE, RESOURCE
        )
    assert other.value.reason == "unsupported_payload"


def test_settle_refusals_read_as_the_payments_scheme_says(voucher):
    requirements = requirement(replace(DEMO_PRICE, asset_transfer_method="voucher"), RESOURCE)
    scheme = schemes.for_requirements(requirements)
    assert scheme is voucher
    assert classify("voucher_spent_forever", scheme) == "refused"
    assert classify("voucher_used", scheme) == "nonce_used"
    assert classify("invalid_exact_evm_payload_signature", scheme) == "unknown"  # another scheme's word
    eip3009 = schemes.for_requirements(requirement(DEMO_PRICE, RESOURCE))
    assert classify("invalid_exact_evm_payload_signature", eip3009) == "refused"
    assert classify("invalid_exact_evm_nonce_already_used", eip3009) == "nonce_used"
    assert classify("anything", None) == "unknown"  # a payment of no known scheme is never written off unread
