"""A price offering several schemes, and a batch-settlement offer's own keys, as the configuration reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate.config import default_settings, load_config, of, parse_config
from gate.payment_required import payment_required, payment_required_v1
from server.config import ConfigError
from tests.support.paid import ASSET, PAY_TO

AUTHORIZER = "0x" + "a5" * 20
RESOURCE = "http://gate.test/a2a/paid"


def priced(price: dict[str, Any]) -> dict[str, Any]:
    base = {"network": "eip155:84532", "asset": ASSET, "amount": "1000", "pay_to": PAY_TO}
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**base, **price}}}}


def problems(price: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(priced(price), base_dir=Path("/tmp"), source="gate.toml")
    return [p.removeprefix("gate.toml: ") for p in caught.value.problems]


def test_accepts_lists_offers_sharing_the_tables_keys_in_the_402s_order() -> None:
    channel = {"scheme": "batch-settlement", "receiver_authorizer": AUTHORIZER, "amount": "2000"}
    price = parse_config(priced({"accepts": [{"scheme": "exact"}, channel]}), base_dir=Path("/tmp")).anonymous.price(
        "paid"
    )
    assert price is not None and price.scheme == "exact" and price.amount == "1000"
    assert [(o.scheme, o.amount) for o in price.offers] == [("exact", "1000"), ("batch-settlement", "2000")]
    assert price.offer_for("batch-settlement") is price.alternatives[0]
    assert price.offer_for("upto") is None
    v2 = payment_required(price, RESOURCE)["accepts"]
    assert [a["scheme"] for a in v2] == ["exact", "batch-settlement"]
    assert v2[1]["extra"] == {
        "name": "USDC",
        "version": "2",
        "receiverAuthorizer": AUTHORIZER,
        "withdrawDelay": 900,
        "minDeposit": "20000",  # ten requests' worth, by default
    }
    v1 = payment_required_v1(price, RESOURCE)["accepts"]
    assert [(a["scheme"], a["network"]) for a in v1] == [("exact", "base-sepolia")]  # no v1 client opens channels
    # every offer's window is fitted to the agent's payment window, as a lone price's is
    assert all(o.max_timeout_seconds == price.max_timeout_seconds for o in price.offers)


def test_the_single_scheme_form_still_reads_as_one_offer() -> None:
    price = parse_config(priced({}), base_dir=Path("/tmp")).anonymous.price("paid")
    assert price is not None and price.offers == (price,) and price.alternatives == ()
    alone = parse_config(
        priced({"scheme": "batch-settlement", "receiver_authorizer": AUTHORIZER, "withdraw_delay_seconds": 3600}),
        base_dir=Path("/tmp"),
    ).anonymous.price("paid")
    assert alone is not None and [
        a["extra"]["withdrawDelay"] for a in payment_required(alone, RESOURCE)["accepts"]
    ] == [3600]


@pytest.mark.parametrize(
    ("price", "path"),
    [
        (
            {"scheme": "batch-settlement", "receiver_authorizer": "0x" + "00" * 20},
            "agents.paid.price.receiver_authorizer",
        ),
        (
            {"scheme": "batch-settlement", "receiver_authorizer": AUTHORIZER, "withdraw_delay_seconds": 60},
            "agents.paid.price.withdraw_delay_seconds",
        ),
        (
            {"scheme": "batch-settlement", "receiver_authorizer": AUTHORIZER, "min_deposit": "10"},
            "agents.paid.price.min_deposit",
        ),
        ({"receiver_authorizer": AUTHORIZER}, "agents.paid.price.receiver_authorizer"),  # exact takes none
        ({"accepts": "exact"}, "agents.paid.price.accepts"),
        ({"accepts": []}, "agents.paid.price.accepts"),
        ({"accepts": [{"scheme": "exact"}, {"scheme": "exact"}]}, "agents.paid.price.accepts"),
        ({"accepts": [{"scheme": "exact", "accepts": []}]}, "agents.paid.price.accepts[0].accepts"),
        (
            {"accepts": [{"scheme": "exact"}, {"scheme": "batch-settlement", "receiver_authorizer": "nobody"}]},
            "agents.paid.price.accepts[1].receiver_authorizer",
        ),
    ],
)
def test_a_channel_offer_without_what_the_binding_needs_is_a_problem_with_its_key_path(
    price: dict[str, Any], path: str
) -> None:
    found = problems(price)
    assert [p.split(": ")[0] for p in found] == [path], found


def test_the_example_configuration_and_the_embedded_defaults_offer_the_same_paid_channel() -> None:
    example = of(load_config(Path(__file__).parents[4] / "config" / "a2a-gate.example.toml"))
    embedded = of(default_settings())
    assert example.agents["paid-channel"].price == embedded.agents["paid-channel"].price
    assert example.limits.per_ip_per_minute == embedded.limits.per_ip_per_minute
    assert example.limits.per_agent_per_minute == embedded.limits.per_agent_per_minute
    assert example.channels == embedded.channels
    price = embedded.agents["paid-channel"].price
    assert price is not None and [o.scheme for o in price.offers] == ["exact", "batch-settlement"]


def test_channels_table() -> None:
    raw = {**priced({}), "channels": {"claim_at_amount": "5000", "claim_after_seconds": 60, "refund_after_seconds": 0}}
    channels = parse_config(raw, base_dir=Path("/tmp")).anonymous.channels
    assert (channels.claim_at_amount, channels.claim_after_seconds, channels.refund_after_seconds) == (5000, 60, 0)
    with pytest.raises(ConfigError) as caught:
        parse_config({**priced({}), "channels": {"claim_at_amount": "lots", "claims": 1}}, base_dir=Path("/tmp"))
    assert sorted(p.split(": ")[1] for p in caught.value.problems) == ["channels.claim_at_amount", "channels.claims"]
