"""Usage prices: how a delivery's usage becomes a charge, and how a configuration says so.

The charge is min(priced usage, ceiling), in whole atomic units: property tests over random
usages, unit prices and ceilings find it never above the ceiling, equal to the priced usage
whenever that fits, and nothing when the pricing fails. Each mistake in a price's table is a
`check-config` problem with its key path.
"""

from __future__ import annotations

import asyncio
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.config import parse_config
from gate.flows.metered.usage_charge import charge
from gate.price import UsagePrice, fraction_text
from gate.schemes import upto_permit2
from gate.schemes.base import Rejection
from server.config import ConfigError
from tests.support.paid import ASSET, PAY_TO

FACILITATOR = "0xFB0b6D1F8B44CAeaC383d5AC8C0b374BB08E2619"
UPTO = {
    "scheme": "upto",
    "network": "eip155:84532",
    "asset": ASSET,
    "pay_to": PAY_TO,
    "ceiling": "50000",
    "facilitator_address": FACILITATOR,
    "usage": {"unit": "characters", "unit_price": "10"},
}


def run(awaitable: Any) -> Any:
    return asyncio.run(awaitable)


counts = st.dictionaries(
    st.sampled_from(["characters", "output_tokens", "calls", "seconds"]),
    st.one_of(st.integers(0, 10**9), st.floats(0, 1e6, allow_nan=False, allow_infinity=False)),
)
unit_prices = st.one_of(
    st.integers(0, 10**6).map(Fraction),
    st.decimals(0, 1000, places=4, allow_nan=False, allow_infinity=False).map(lambda d: Fraction(str(d))),
)


@given(used=counts, unit_price=unit_prices, fixed=st.integers(0, 10**6), ceiling=st.integers(1, 10**12))
def test_the_charge_is_the_priced_usage_capped_at_the_ceiling(used, unit_price, fixed, ceiling):
    price = UsagePrice(fixed=fixed, unit="characters", unit_price=unit_price)
    priced = fixed + math.ceil(unit_price * Fraction(str(used.get("characters", 0))))
    charged = run(charge(price, ceiling, used))
    assert 0 <= charged.amount <= ceiling
    assert charged.amount == min(priced, ceiling)
    assert charged.capped == (priced > ceiling)
    receipt = charged.receipt()
    assert receipt["amount"] == str(charged.amount) and receipt["ceiling"] == str(ceiling)
    assert receipt["units"] == used and receipt["unitPrice"] == fraction_text(unit_price)
    assert Fraction(receipt["unitPrice"]) == unit_price


@given(used=counts, ceiling=st.integers(1, 10**12), answer=st.integers(0, 10**15))
def test_a_callable_price_is_capped_and_a_failing_one_charges_nothing(used, ceiling, answer):
    calls: list[dict[str, Any]] = []

    def price_of(usage: dict[str, Any]) -> int:
        calls.append(usage)
        return answer

    charged = run(charge(UsagePrice(callable="m:f", function=price_of), ceiling, used))
    assert calls == [used] and charged.amount == min(answer, ceiling) and charged.error == ""

    def broken(usage: dict[str, Any]) -> int:
        raise ArithmeticError("bug")

    failed = run(charge(UsagePrice(callable="m:f", function=broken), ceiling, used))
    assert failed.amount == 0 and failed.priced is None and failed.error == "pricing_failed: ArithmeticError"
    assert failed.receipt()["error"] == "pricing_failed: ArithmeticError"


@pytest.mark.parametrize("answer", [-1, 1.5, "12", None, True])
def test_a_callable_answering_anything_but_whole_atomic_units_charges_nothing(answer):
    charged = run(charge(UsagePrice(callable="m:f", function=lambda usage: answer), 1000, {"calls": 1}))
    assert charged.amount == 0 and charged.error == "pricing_failed: ValueError"


@given(used=counts, ceiling=st.integers(1, 10**12), answer=st.integers(0, 10**15))
def test_an_async_pricing_callable_is_awaited_and_charges_as_a_plain_one(used, ceiling, answer):
    """An `async def` price passed check-config and charged 0 (`pricing_failed: ValueError`): its
    coroutine was taken for the amount. It is awaited, and charges what a plain function would."""

    async def price_of(usage: dict[str, Any]) -> int:
        await asyncio.sleep(0)
        return answer

    def plain(usage: dict[str, Any]) -> int:
        return answer

    charged = run(charge(UsagePrice(callable="m:f", function=price_of), ceiling, used))
    assert charged == run(charge(UsagePrice(callable="m:f", function=plain), ceiling, used))
    assert charged.amount == min(answer, ceiling) and charged.error == ""


def test_an_async_pricing_callable_that_never_answers_charges_nothing(monkeypatch):
    from gate import price as prices

    monkeypatch.setattr(prices, "PRICING_SECONDS", 0.05)

    async def stuck(usage: dict[str, Any]) -> int:
        await asyncio.sleep(60)
        return 1

    charged = run(charge(UsagePrice(callable="m:f", function=stuck), 1000, {"calls": 1}))
    assert charged.amount == 0 and charged.error == "pricing_failed: TimeoutError"


def test_the_config_s_callable_price_may_be_async_and_is_awaited():
    called = parse_config(
        config(usage={"callable": "tests.support.ceiling_agents:per_character_async"}), base_dir=Path("/tmp")
    )
    assert run(called.anonymous.price("metered").usage.priced({"characters": 7})) == 70


@pytest.mark.parametrize(
    "bad",
    [
        math.nan,
        math.inf,
        -math.inf,
        -1,
        -0.5,
        10**15 + 1,
        1e308,
        pytest.param(10**400, id="10**400"),
        pytest.param(10**5000, id="10**5000"),
        "12",
        None,
        [1],
    ],
)
def test_usage_that_is_not_counts_charges_nothing_and_says_why(bad):
    """The server refuses such reports; the gate's own check prices none of them, never raises."""
    for price in (UsagePrice(unit="characters", unit_price=Fraction(10)), UsagePrice(callable="m:f", function=len)):
        charged = run(charge(price, 50_000, {"characters": bad}))
        assert charged.amount == 0 and charged.priced is None and charged.error.startswith("usage_invalid: ")
        assert charged.receipt()["units"] == {} and not charged.reached


def test_a_sum_of_reports_past_the_bound_is_the_agents_error():
    from server import usage

    once = usage.checked({"characters": 10**15})
    with pytest.raises(usage.BadUsage):
        usage.checked(usage.added(once, {"characters": 1}))
    with pytest.raises(usage.BadUsage):
        usage.checked({"characters": 1e308})  # and 1e308 + 1e308 is past the float range: never summed
    with pytest.raises(usage.BadUsage):
        usage.checked(usage.added({"x": 1.5e308}, {"x": 1.5e308}))  # inf
    # read never raises: an upstream's other metadata stays out, a number that is not a count is carried
    assert usage.read({"model": "gpt", "tokens": 12.0, "bad": -1}) == {"tokens": 12, "bad": -1}


@given(used=counts, ceiling=st.integers(1, 10**6))
def test_reaching_the_ceiling_is_pricing_at_it_or_past_it(used, ceiling):
    charged = run(charge(UsagePrice(unit="characters", unit_price=Fraction(1)), ceiling, used))
    priced = math.ceil(Fraction(str(used.get("characters", 0))))
    assert charged.reached == (priced >= ceiling) and charged.capped == (priced > ceiling)
    assert "ceilingReached" not in charged.receipt()


@pytest.mark.parametrize(("value", "text"), [(Fraction(10), "10"), (Fraction("0.25"), "0.25"), (Fraction(1, 3), "1/3")])
def test_a_unit_price_reads_as_it_was_written(value, text):
    assert fraction_text(value) == text


def config(**price: Any) -> dict[str, Any]:
    body = {**UPTO, **price}
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"metered": {"price": body}}}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, base_dir=Path("/tmp"), source="gate.toml")
    return [p.split(": ")[1] for p in caught.value.problems]


def test_an_upto_price_reads_its_ceiling_facilitator_and_rule():
    price = parse_config(config(), base_dir=Path("/tmp")).anonymous.price("metered")
    assert (price.scheme, price.asset_transfer_method, price.amount) == ("upto", "permit2", "50000")
    assert price.extra["facilitatorAddress"] == FACILITATOR and price.extra["name"] == "USDC"
    assert price.usage == UsagePrice(fixed=0, unit="characters", unit_price=Fraction(10))
    called = parse_config(config(usage={"callable": "tests.support.pricing:per_chunk"}), base_dir=Path("/tmp"))
    rule = called.anonymous.price("metered").usage
    assert (
        rule.callable == "tests.support.pricing:per_chunk" and run(rule.priced({"chunks": 2, "characters": 5})) == 205
    )


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"ceiling": "0"}, "agents.metered.price.ceiling"),
        ({"ceiling": "-5"}, "agents.metered.price.ceiling"),
        ({"amount": "1000"}, "agents.metered.price.amount"),  # an upto price names a ceiling
        ({"facilitator_address": "nobody"}, "agents.metered.price.facilitator_address"),
        ({"usage": None}, "agents.metered.price.usage"),
        ({"usage": {"unit_price": "10"}}, "agents.metered.price.usage.unit"),
        ({"usage": {"unit": "characters", "unit_price": "-1"}}, "agents.metered.price.usage.unit_price"),
        ({"usage": {"unit": "characters", "unit_price": "ten"}}, "agents.metered.price.usage.unit_price"),
        ({"usage": {"unit": "characters", "unit_price": "1", "fixed": "1.5"}}, "agents.metered.price.usage.fixed"),
        ({"usage": {"unit": "characters", "unit_price": "1", "per": "x"}}, "agents.metered.price.usage.per"),
        ({"usage": {"callable": "no.such.module:price"}}, "agents.metered.price.usage.callable"),
        ({"usage": {"callable": "tests.support.pricing:NOPE"}}, "agents.metered.price.usage.callable"),
        ({"usage": {"callable": "not a target"}}, "agents.metered.price.usage.callable"),
        ({"usage": {"callable": "tests.support.pricing:raises", "unit": "x"}}, "agents.metered.price.usage"),
        ({"asset_transfer_method": "eip3009"}, "agents.metered.price.asset_transfer_method"),
    ],
)
def test_every_mistake_in_an_upto_price_is_a_problem_with_its_key_path(change, path):
    raw = config(**change)
    if change.get("usage", {}) is None:
        del raw["agents"]["metered"]["price"]["usage"]
    assert path in problems(raw)


def test_an_exact_price_takes_no_usage_keys():
    raw = {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**UPTO, "scheme": "exact"}}}}
    found = problems(raw)
    assert {"agents.paid.price.ceiling", "agents.paid.price.usage", "agents.paid.price.amount"} <= set(found)


def upto_payload(**changes: Any) -> dict[str, Any]:
    auth = {
        "from": "0x" + "ab" * 20,
        "permitted": {"token": ASSET, "amount": "50000"},
        "spender": "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002",
        "nonce": "12345",
        "deadline": "9999999999",
        "witness": {"to": PAY_TO, "facilitator": FACILITATOR, "validAfter": "0"},
    }
    for key, value in changes.items():
        target = (
            auth["witness"] if key in auth["witness"] else auth["permitted"] if key in ("token", "amount") else auth
        )
        target[key] = value
    return {"permit2Authorization": auth, "signature": "0x" + "11" * 65}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"facilitator": "0x" + "99" * 20}, "upto_facilitator_mismatch"),
        ({"spender": "0x402085c248EeA27D92E8b30b2C58ed07f9E20001"}, "invalid_permit2_spender"),  # exact's proxy
        ({"amount": "49999"}, "amount_mismatch"),
        ({"to": "0x" + "22" * 20}, "recipient_mismatch"),
        ({"token": "0x" + "33" * 20}, "asset_mismatch"),
        ({"facilitator": 7}, "invalid_payload"),
        ({"nonce": "0x01"}, "invalid_payload"),
    ],
)
def test_every_key_of_an_upto_payload_is_checked(change, reason):
    price = parse_config(config(), base_dir=Path("/tmp")).anonymous.price("metered")
    payload = upto_payload(**change)
    if reason is None:
        upto_permit2.SCHEME.check(payload, price)
        key = upto_permit2.SCHEME.nonce_key(payload, "eip155:84532", ASSET)
        assert key == f"eip155:84532|permit2|{'0x' + 'ab' * 20}|12345"  # exact Permit2's key: one nonce, one claim
        return
    with pytest.raises(Rejection) as refused:
        upto_permit2.SCHEME.check(payload, price)
    assert refused.value.reason == reason


def test_an_upto_payload_with_an_extra_witness_key_is_refused():
    price = parse_config(config(), base_dir=Path("/tmp")).anonymous.price("metered")
    payload = upto_payload()
    payload["permit2Authorization"]["witness"]["extra"] = "x"
    with pytest.raises(Rejection) as refused:
        upto_permit2.SCHEME.check(payload, price)
    assert refused.value.reason == "invalid_payload"


def test_the_dev_facilitator_address_the_gate_names_is_the_development_network_s():
    from devnet.chain import FACILITATOR_ADDRESS
    from gate.config import DEV_FACILITATOR_ADDRESS

    assert DEV_FACILITATOR_ADDRESS == FACILITATOR_ADDRESS


def test_the_embedded_defaults_price_paid_metered_as_the_example_configuration_does():
    from dataclasses import replace

    from gate.config import default_settings, load_config

    example = load_config("config/a2a-gate.example.toml").anonymous.price("paid-metered")
    embedded = default_settings().anonymous.price("paid-metered")
    assert replace(example, max_timeout_seconds=embedded.max_timeout_seconds) == embedded
    assert default_settings().agents["paid-metered"].backend == "echo"
