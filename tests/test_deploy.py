"""The deployment in deploy/ holds together: the compose file runs two replicas, PostgreSQL,
Redis and nginx, publishes nginx alone (never /metrics), and gives a stop the drain's time; the
image runs unprivileged, checks /readyz and stops with SIGTERM; the systemd unit is valid and
waits for the drain; the replicas' configuration is one `check-config` accepts. (docker is not
needed: the files are read; deploy/nginx.conf runs in a real nginx in tests/test_nginx_sites.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.gate_helpers import cli

DEPLOY = Path(__file__).parents[1] / "deploy"
STOP_MARGIN = 20  # seconds past drain_seconds a stop needs (docs/operations.md, "Stopping")


def drain_seconds() -> float:
    return tomllib.loads((DEPLOY / "gate.toml").read_text())["http"]["drain_seconds"]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)s", value)
    assert match, value
    return float(match.group(1))


def test_the_replicas_configuration_is_valid():
    assert ": OK (2 agents, 1 priced" in cli("check-config", str(DEPLOY / "gate.toml")).stdout


def test_compose_runs_two_replicas_behind_nginx_and_publishes_nothing_else():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "nginx", "gate1", "gate2"} <= set(services)
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"nginx"}  # the replicas' 8000 and 9464 (metrics) stay on the compose network
    assert [p.split(":")[-1] for p in services["nginx"]["ports"]] == ["80"]
    assert "./nginx.conf:/etc/nginx/conf.d/default.conf:ro" in services["nginx"]["volumes"]
    config = tomllib.loads((DEPLOY / "gate.toml").read_text())
    assert services["nginx"]["networks"]["gate"]["ipv4_address"] in config["proxy"]["trusted"]
    for name in ("gate1", "gate2"):
        gate = services[name]
        assert gate["stop_signal"] == "SIGTERM"
        assert seconds(gate["stop_grace_period"]) >= drain_seconds() + STOP_MARGIN
        assert (
            "A2A_GATE_SEALING_KEY" in gate["environment"]
            and "./gate.toml:/etc/a2a-gate/gate.toml:ro" in gate["volumes"]
        )
        assert gate["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_the_image_runs_unprivileged_checks_readiness_and_stops_with_sigterm():
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    health = next(i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK "))
    assert "/readyz" in " ".join(lines[health : health + 3])
    assert "STOPSIGNAL SIGTERM" in lines
    assert any(line.startswith("CMD [") and '"serve"' in line for line in lines)


def test_the_systemd_unit_waits_for_the_drain():
    unit = (DEPLOY / "a2a-gate.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["KillSignal"] == "SIGTERM"
    assert float(settings["TimeoutStopSec"]) >= drain_seconds() + STOP_MARGIN
    assert settings["User"] not in ("root", "0") and "143" in settings["SuccessExitStatus"].split()


def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # the unit's ExecStart names the installed command; here it is this checkout's
    unit = (DEPLOY / "a2a-gate.service").read_text()
    unit = unit.replace("/opt/a2a-gate/bin/a2a-gate", f"{Path(sys.executable).resolve()} -m gate.cli")
    copy = tmp_path / "a2a-gate.service"
    copy.write_text(unit)
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "a2a-gate.service" not in done.stderr, done.stderr
