"""`[proxy] trusted` takes IP addresses and CIDR networks only, at check-config and at serve alike.

A host name never matches a peer (the forwarded headers are compared with the peer's address), so
`trusted = ["nginx"]` made every caller the proxy's address: the whole internet in one anonymous
rate-limit bucket. An address that is no address ("300.1.1.1") or a network with host bits set
("10.0.0.5/24", which uvicorn would keep as a literal that matches nothing) is the same mistake.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server import config as server_config
from server.config import ConfigError, load_config
from tests.support.gate_process import free_port

BAD = ["localhost", "nginx", "300.1.1.1", "10.0.0.5/24", "10.0.0.0/33", "*", " 10.0.0.5", "fe80::1%", "::1/129"]
GOOD = ["10.0.0.5", "10.0.0.0/8", "127.0.0.1", "::1", "fd00::/8", "2001:db8::1/128", "::ffff:10.0.0.5"]


def config_with(tmp_path: Path, trusted: list[str]) -> Path:
    path = tmp_path / "gate.toml"
    listed = ", ".join(f'"{item}"' for item in trusted)
    path.write_text(f'database = "gate.db"\n\n[proxy]\ntrusted = [{listed}]\n\n[agents.echo]\n')
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "gate.cli", *args], capture_output=True, text=True, timeout=30, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired:  # serve started (and was killed): the configuration was taken
        pytest.fail(f"{args[0]} took the configuration and ran on")


@pytest.mark.parametrize("value", BAD)
def test_a_name_or_a_malformed_address_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(config_with(tmp_path, ["10.0.0.1", value]))
    assert len(refused.value.problems) == 1, refused.value.problems
    assert "proxy.trusted[1]" in refused.value.problems[0], refused.value.problems
    assert server_config.trusted_proxy_problem(value)


def test_addresses_and_networks_are_taken(tmp_path: Path) -> None:
    settings = load_config(config_with(tmp_path, GOOD))
    assert settings.trusted_proxies == tuple(GOOD)
    assert not any(server_config.trusted_proxy_problem(value) for value in GOOD)


@pytest.mark.parametrize("value", ["localhost", "nginx", "300.1.1.1"])
def test_check_config_and_serve_refuse_it_in_one_line(tmp_path: Path, value: str) -> None:
    config = config_with(tmp_path, [value])
    checked = run("check-config", str(config), cwd=tmp_path)
    served = run("serve", "--config", str(config), "--port", str(free_port()), cwd=tmp_path)
    for done in (checked, served):
        assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done.stderr[-2000:]
        assert "proxy.trusted[0]" in errors[0] and value in errors[0], errors
        assert "Traceback" not in done.stderr
    assert checked.stderr.splitlines()[-1] == served.stderr.splitlines()[-1]
