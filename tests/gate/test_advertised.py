"""Offers that leave an address to the facilitator: withheld until its /supported lists it, then made.

Unit tests of `gate.advertised` over /supported documents; the process test (a gate that names no
receiver authorizer, against the development facilitator, paid by the x402 package's channel client)
is in tests/devnet/test_channels_devnet.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gate import advertised
from gate.advertised import Offers
from gate.config import parse_config
from gate.payment_required import payment_required
from tests.support.paid import ASSET, PAY_TO

NETWORK = "eip155:84532"
AUTHORIZER = "0x" + "a5" * 20
SETTLER = "0x" + "5e" * 20
BASE = {"network": NETWORK, "asset": ASSET, "amount": "1000", "pay_to": PAY_TO}


def supported(**extras: dict[str, Any]) -> dict[str, Any]:
    """A /supported document: exact, and the kinds named (scheme=extra), all x402 v2 on NETWORK."""
    kinds = [{"x402Version": 2, "scheme": "exact", "network": NETWORK}]
    kinds += [
        {"x402Version": 2, "scheme": scheme.replace("_", "-"), "network": NETWORK, "extra": extra}
        for scheme, extra in extras.items()
    ]
    return {"kinds": kinds, "extensions": [], "signers": {}}


def agents(**prices: dict[str, Any]) -> Offers:
    raw = {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {n: {"price": p} for n, p in prices.items()}}
    return Offers(parse_config(raw, base_dir=Path("/tmp")).anonymous.agents)


CHANNEL = {**BASE, "accepts": [{"scheme": "exact"}, {"scheme": "batch-settlement"}]}
CHANNEL_ONLY = {**BASE, "scheme": "batch-settlement"}
METERED = {
    **{k: v for k, v in BASE.items() if k != "amount"},
    "scheme": "upto",
    "ceiling": "50000",
    "usage": {"unit": "characters", "unit_price": "10"},
}


def schemes_offered(offers: Offers, name: str) -> list[str]:
    price = offers.agent(name).price
    return [] if price is None else [o.scheme for o in price.offers]


def test_an_offer_waiting_for_an_address_is_withheld_and_an_agent_with_no_other_is_unavailable() -> None:
    offers = agents(mixed=CHANNEL, channel=CHANNEL_ONLY, metered=METERED, plain=BASE)
    assert schemes_offered(offers, "mixed") == ["exact"]
    assert schemes_offered(offers, "plain") == ["exact"]
    assert offers.agent("channel").price is None and offers.agent("metered").price is None
    assert offers.unavailable == {"channel", "metered"}
    assert sorted(o.scheme for o in offers.waiting()) == ["batch-settlement", "batch-settlement", "upto"]
    assert offers.agent("nobody").price is None and "nobody" not in offers.unavailable


def test_what_supported_advertises_completes_the_offers_and_the_402_names_it() -> None:
    offers = agents(mixed=CHANNEL, channel=CHANNEL_ONLY, metered=METERED)
    changed = offers.learn(
        supported(batch_settlement={"receiverAuthorizer": AUTHORIZER}, upto={"facilitatorAddress": SETTLER})
    )
    assert changed and offers.waiting() == [] and offers.unavailable == frozenset()
    assert schemes_offered(offers, "mixed") == ["exact", "batch-settlement"]
    price = offers.agent("mixed").price
    assert price is not None
    accepts = payment_required(price, "http://gate.test/a2a/mixed")["accepts"]
    assert accepts[1]["extra"]["receiverAuthorizer"] == AUTHORIZER and "receiverAuthorizer" not in accepts[0]["extra"]
    metered = offers.agent("metered").price
    assert metered is not None and metered.extra["facilitatorAddress"] == SETTLER
    assert offers.learn(supported(batch_settlement={"receiverAuthorizer": AUTHORIZER})) is False  # nothing left


@pytest.mark.parametrize(
    "document",
    [
        supported(),  # the scheme is not served at all
        supported(batch_settlement={}),
        supported(batch_settlement={"receiverAuthorizer": "0x" + "00" * 20}),  # the zero address
        supported(batch_settlement={"receiverAuthorizer": "not an address"}),
        supported(batch_settlement={"receiverAuthorizer": 7}),
        supported(batch_settlement=[AUTHORIZER]),  # type: ignore[arg-type]
        {
            "kinds": [
                {
                    "x402Version": 1,
                    "scheme": "batch-settlement",
                    "network": NETWORK,
                    "extra": {"receiverAuthorizer": AUTHORIZER},
                }
            ]
        },
        {
            "kinds": [
                {
                    "x402Version": 2,
                    "scheme": "batch-settlement",
                    "network": "eip155:1",
                    "extra": {"receiverAuthorizer": AUTHORIZER},
                }
            ]
        },
        {"kinds": "everything"},
        ["kinds"],
        None,
    ],
)
def test_an_address_not_advertised_as_a_non_zero_address_for_that_kind_leaves_the_offer_waiting(
    document: Any,
) -> None:
    offers = agents(channel=CHANNEL_ONLY)
    assert offers.learn(document) is False
    assert offers.unavailable == {"channel"} and offers.agent("channel").price is None


def test_an_address_the_price_names_itself_is_kept_and_a_different_advertised_one_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = "0x" + "0c" * 20
    offers = agents(channel={**CHANNEL_ONLY, "receiver_authorizer": own})
    assert offers.waiting() == [] and offers.unavailable == frozenset()
    with caplog.at_level(logging.WARNING, logger="a2a_gate.gate"):
        for _ in range(2):
            assert offers.learn(supported(batch_settlement={"receiverAuthorizer": AUTHORIZER})) is False
    price = offers.agent("channel").price
    assert price is not None and price.extra["receiverAuthorizer"] == own
    warned = [r.getMessage() for r in caplog.records if "is not the facilitator's" in r.getMessage()]
    assert len(warned) == 1 and own in warned[0] and AUTHORIZER in warned[0]


def test_advertised_extra_reads_only_the_kind_of_the_offer() -> None:
    document = supported(batch_settlement={"receiverAuthorizer": AUTHORIZER, "note": "x"}, upto={})
    assert advertised.advertised_extra(document, "batch-settlement", NETWORK) == {"receiverAuthorizer": AUTHORIZER}
    assert advertised.advertised_extra(document, "upto", NETWORK) == {}
    assert advertised.advertised_extra(document, "batch-settlement", "eip155:8453") == {}
