"""`a2a-gate check-config` on broken and unreadable files: one error line per problem, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gate_helpers import cli

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


# --- the CLI on broken files ----------------------------------------------------------------


BROKEN = f"""
colour = "blue"
max_body_bytes = -1

[limits]
per_ip_per_minute = "many"

[facilitator]
url = "ftp://facilitator.example"

[agents.paid.price]
network = "base"
asset = "0x123"
amount = "1.5"
pay_to = "{ADDRESS}"

[agents.up]
backend = "upstream"
url = "ftp://agent.example"

[[keys]]
sha256 = "abc"
"""
BROKEN_PATHS = [
    "colour",
    "max_body_bytes",
    "limits.per_ip_per_minute",
    "facilitator.url",
    "agents.paid.price.network",
    "agents.paid.price.asset",
    "agents.paid.price.amount",
    "agents.up.url",
    "keys[0].sha256",
]


def test_check_config_prints_one_error_line_per_problem(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(BROKEN)

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith(f"error: {config}: ") for line in lines), lines
    assert sorted(line.split(": ")[2] for line in lines) == sorted(BROKEN_PATHS)


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, "no such file"),
        ("this is = = not toml", "not valid TOML"),
    ],
)
def test_check_config_on_unreadable_files(tmp_path: Path, text: str | None, expected: str) -> None:
    config = tmp_path / "gate.toml"
    if text is not None:
        config.write_text(text)

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and expected in line


def test_check_config_on_a_good_file(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[agents.echo]\n[agents.paid.price]\nnetwork = "eip155:84532"\n'
        f'asset = "{USDC}"\namount = "10"\npay_to = "{ADDRESS}"\n'
    )

    done = cli("check-config", str(config), check=False)

    assert done.returncode == 0, done.stderr
    assert "OK (2 agents, 1 priced" in done.stdout
    assert done.stderr.startswith("warning: ") and "facilitator.url" in done.stderr


def test_check_config_never_shows_a_traceback_for_odd_values(tmp_path: Path) -> None:
    """`public_url = "http://[::1"` made urlsplit raise: exit 1 and a traceback (BUG)."""
    config = tmp_path / "gate.toml"
    config.write_text('public_url = "http://[::1"\n[agents.echo]\n')

    done = cli("check-config", str(config), check=False)

    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {config}: public_url: ")
