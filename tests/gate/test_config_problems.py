"""The configuration reader (gate/config.py over server/config.py): every problem reported at once, each with its key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate.config import parse_config
from server.config import ConfigError

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


# --- configuration --------------------------------------------------------------------


PRICE = {"network": "eip155:84532", "asset": USDC, "amount": "1000", "pay_to": ADDRESS}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, base_dir=Path("/tmp"), source="gate.toml")
    assert all(p.startswith("gate.toml: ") for p in caught.value.problems)
    return [p.removeprefix("gate.toml: ") for p in caught.value.problems]


def priced(**price: Any) -> dict[str, Any]:
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**PRICE, **price}}}}


def test_a_good_configuration_reads() -> None:
    settings_ = parse_config(
        {**priced(), "public_url": "https://gate.example/", "database": "x.db"}, base_dir=Path("/srv")
    )

    assert settings_.public_url == "https://gate.example"
    assert settings_.database == "/srv/x.db"
    price = settings_.anonymous.price("paid")
    assert price is not None and price.amount == "1000" and price.extra == {"name": "USDC", "version": "2"}
    assert settings_.warnings == ()


@pytest.mark.parametrize("amount", ["-5", "1.5", "0", "abc", "", 0, -1, 1.5, True, "1" * 79, "1e3", " 100"])
def test_a_bad_amount_is_reported_with_its_path(amount: Any) -> None:
    [problem] = problems(priced(amount=amount))

    assert problem.startswith("agents.paid.price.amount: must be a positive whole number")


def test_an_integer_amount_is_accepted() -> None:
    price = parse_config(priced(amount=2500), base_dir=Path("/tmp")).anonymous.price("paid")
    assert price is not None and price.amount == "2500"


@pytest.mark.parametrize("field", ["pay_to", "asset"])
@pytest.mark.parametrize("address", ["0x123", "209693Bc6afc0C5328bA36FaF03C514EF312287C", ADDRESS + "0", 5, ""])
def test_a_bad_address_is_reported_with_its_path(field: str, address: Any) -> None:
    found = problems(priced(**{field: address}))

    assert any(p.startswith(f"agents.paid.price.{field}: must be") for p in found), found


def test_bad_payer_allowlist_entries_are_reported_by_index() -> None:
    raw = priced()
    raw["agents"]["paid"]["allowed_payers"] = [ADDRESS, "0xnope", 7]

    assert problems(raw) == [
        "agents.paid.allowed_payers[1]: must be a 0x address (40 hex digits)",
        "agents.paid.allowed_payers[2]: must be a 0x address (40 hex digits)",
    ]


@pytest.mark.parametrize(
    "raw,path",
    [
        ({"colour": "blue"}, "colour"),
        ({"limits": {"per_second": 1}}, "limits.per_second"),
        ({"facilitator": {"token": "x"}}, "facilitator.token"),
        ({"agents": {"echo": {"prize": 1}}}, "agents.echo.prize"),
        ({"agents": {"echo": {"skills": [{"id": "s", "level": 3}]}}}, "agents.echo.skills[0].level"),
        ({"agents": {"echo": {}}, "keys": [{"sha256": "a" * 64, "agents": ["echo"], "secret": "x"}]}, "keys[0].secret"),
        ({**priced(), "agents": {"paid": {"price": {**PRICE, "currency": "USD"}}}}, "agents.paid.price.currency"),
    ],
)
def test_unknown_keys_are_reported_with_their_path(raw: dict[str, Any], path: str) -> None:
    assert f"{path}: unknown key" in problems(raw)


@pytest.mark.parametrize("url", ["ftp://agent.example/", "agent.example", "file:///etc/passwd", "http://"])
def test_an_upstream_url_must_be_http(url: str) -> None:
    [problem] = problems({"agents": {"up": {"backend": "upstream", "url": url}}})

    assert problem.startswith("agents.up.url: must be an http(s) URL")


def test_an_upstream_needs_a_url_and_a_python_agent_a_callable() -> None:
    found = problems({"agents": {"up": {"backend": "upstream"}, "py": {"backend": "python", "callable": "nope"}}})

    assert found == [
        "agents.up.url: required for an upstream agent",
        "agents.py.callable: required for a python agent, as 'package.module:function'",
    ]


def test_a_priced_agent_without_a_facilitator_is_a_warning_naming_the_key() -> None:
    settings_ = parse_config({"agents": {"paid": {"price": PRICE}}}, base_dir=Path("/tmp"), source="gate.toml")

    [warning] = settings_.warnings
    assert warning.startswith("gate.toml: facilitator.url: missing")


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "colour": "x",
            "max_body_bytes": 0,
            "limits": {"per_ip_per_minute": "many"},
            "facilitator": {"url": "ftp://f"},
            "agents": {"paid": {"price": {**PRICE, "amount": "1.5", "pay_to": "x"}}},
            "keys": [{"sha256": "ABC"}],
        }
    )

    assert sorted(p.split(":")[0] for p in found) == sorted(
        [
            "colour",
            "limits.per_ip_per_minute",
            "keys[0].sha256",
            "facilitator.url",
            "agents.paid.price.pay_to",
            "agents.paid.price.amount",
            "max_body_bytes",
        ]
    )


@pytest.mark.parametrize(
    "raw,path",
    [
        ({"task_deadline_seconds": float("nan")}, "task_deadline_seconds"),
        ({"agents": {"a": {"timeout_seconds": float("nan")}}}, "agents.a.timeout_seconds"),
        ({"agents": {"a": {"deadline_seconds": float("nan")}}}, "agents.a.deadline_seconds"),
    ],
)
def test_nan_is_not_a_positive_number(raw: dict[str, Any], path: str) -> None:
    """TOML has `nan`; `nan <= 0` is False, so it passed the "greater than 0" check (BUG)."""
    assert any(p.startswith(f"{path}: ") for p in problems(raw))


@pytest.mark.parametrize(
    "raw,path",
    [
        (priced(amount="²"), "agents.paid.price.amount"),  # str.isdigit() is true, int() refuses it
        ({"public_url": "http://[::1"}, "public_url"),  # urlsplit raises ValueError
        ({"agents": {"up": {"backend": "upstream", "url": "http://[nope"}}}, "agents.up.url"),
        (
            {"agents": {"echo": {}}, "keys": [{"sha256": "a" * 64, "agents": [["echo"]]}]},
            "keys[0].agents",
        ),  # unhashable
    ],
)
def test_odd_values_are_problems_not_crashes(raw: dict[str, Any], path: str) -> None:
    """Each of these raised ValueError / TypeError out of parse_config (BUG): a traceback
    from `a2a-gate check-config` instead of one `error:` line."""
    assert any(p.startswith(f"{path}: ") for p in problems(raw))
