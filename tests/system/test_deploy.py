"""The deployment in deploy/ holds together and runs as shipped, as far as this machine can run it.

Run here: the compose file through docker-compose's own schema check (`config`), the systemd unit
through `systemd-analyze verify` and `security` (in its "OK" band), and the unit's and the
image's process as they would run it: `a2a-gate serve` as an unprivileged uid with a read-only
configuration directory, its secrets from files, its database in the state directory.
deploy/nginx.conf runs in a real nginx in tests/system/test_nginx_sites.py. Only read: the Dockerfile's
build and compose's containers (no Docker engine here); docs/operations.md says which is which."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import httpx
import pytest

from tests.support.gate_helpers import cli
from tests.support.gate_process import GateProcess
from tests.support.paid import send_body
from tests.support.services import in_ci

DEPLOY = Path(__file__).parents[2] / "deploy"
STOP_MARGIN = 20  # seconds past drain_seconds a stop needs (docs/operations.md, "Stopping")


def drain_seconds() -> float:
    return tomllib.loads((DEPLOY / "gate.toml").read_text())["http"]["drain_seconds"]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)s", value)
    assert match, value
    return float(match.group(1))


def test_the_replicas_configuration_is_valid():
    # the file alone: its database (compose's `postgres`) and its secrets are not here
    assert ": OK (2 agents, 1 priced" in cli("check-config", "--file-only", str(DEPLOY / "gate.toml")).stdout
    refused = cli("check-config", str(DEPLOY / "gate.toml"), check=False)  # as serve would: no sealing key here
    assert refused.returncode == 2 and "A2A_GATE_SEALING_KEY" in refused.stderr


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
        assert "./gate.toml:/etc/a2a-gate/gate.toml:ro" in [v.split("#")[0].strip() for v in gate["volumes"]]
        assert gate["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "replicas" in gate["networks"]["gate"]["aliases"]  # the name nginx resolves again and again


def test_compose_passes_secrets_as_files_never_as_plain_environment():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    declared = compose["secrets"]
    for name, service in compose["services"].items():
        environment = service.get("environment", {})
        for variable in ("A2A_GATE_SEALING_KEY", "PGPASSWORD", "POSTGRES_PASSWORD"):
            assert variable not in environment, (name, variable)  # a value in `docker inspect` for anyone
        for variable, value in environment.items():
            if variable.endswith("_FILE"):
                secret = value.removeprefix("/run/secrets/")
                assert value.startswith("/run/secrets/") and secret in service["secrets"] and secret in declared
    gate = compose["services"]["gate1"]
    assert gate["environment"]["A2A_GATE_SEALING_KEY_FILE"] == "/run/secrets/sealing_key"
    assert gate["environment"]["PGPASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert "deploy/secrets/" in (DEPLOY.parent / ".gitignore").read_text().splitlines()


def test_compose_file_passes_composes_own_schema_check(tmp_path):
    compose = shutil.which("docker-compose")
    if compose is None:
        if in_ci():
            pytest.fail("docker-compose is not installed (.ci/run installs it)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    (copy / "secrets").mkdir()
    for name in ("sealing_key", "postgres_password"):
        (copy / "secrets" / name).write_text("not a real secret\n")
    done = subprocess.run(
        [compose, "-f", str(copy / "compose.yaml"), "config", "-q"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (copy / "compose.yaml").write_text(
        (copy / "compose.yaml").read_text().replace("stop_grace_period", "stop_grace_perod", 1)
    )
    broken = subprocess.run(
        [compose, "-f", str(copy / "compose.yaml"), "config", "-q"], capture_output=True, text=True, timeout=60
    )
    assert broken.returncode != 0 and "stop_grace_perod" in broken.stderr  # the check reads the file


def test_the_image_runs_unprivileged_checks_readiness_and_stops_with_sigterm():
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    health = next(i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK "))
    assert "/readyz" in " ".join(lines[health : health + 3])
    assert "STOPSIGNAL SIGTERM" in lines
    assert any(line.startswith("CMD [") and '"serve"' in line for line in lines)


def test_the_image_bakes_in_no_configuration_and_carries_the_fast_http_stack():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if not line.strip().startswith("#")]
    copied = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert copied == ["pyproject.toml", "server", "gate"]  # no config/, no devnet/
    assert "/etc/a2a-gate" not in "\n".join(lines)
    install = next(line for line in lines if line.startswith("RUN pip install"))
    assert "uvloop" in install and "httptools" in install
    assert 'VOLUME ["/var/lib/a2a-gate"]' in lines and "WORKDIR /var/lib/a2a-gate" in lines


def test_the_build_context_is_what_the_image_copies():
    """.dockerignore keeps out everything else: virtualenvs, databases, sealing keys, ledgers, secrets."""
    patterns = [line for line in (DEPLOY.parent / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    lines = [line.split() for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")]
    assert {source for line in lines for source in line[1:-1]} == allowed


def test_the_systemd_unit_waits_for_the_drain():
    unit = (DEPLOY / "a2a-gate.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["KillSignal"] == "SIGTERM"
    assert float(settings["TimeoutStopSec"]) >= drain_seconds() + STOP_MARGIN
    assert settings["User"] not in ("root", "0") and "143" in settings["SuccessExitStatus"].split()
    assert int(settings["LimitNOFILE"]) >= 65536
    assert settings["LoadCredential"].startswith("A2A_GATE_SEALING_KEY:")  # a credential, not an EnvironmentFile
    assert "EnvironmentFile" not in settings and settings["StateDirectory"] == "a2a-gate"


def test_the_systemd_unit_reloads_with_sighup_after_checking_the_file():
    """`systemctl reload`: check-config first (a refused file sends no signal), then SIGHUP to the
    server, which takes the new prices without draining (tests/system/test_reload.py)."""
    unit = (DEPLOY / "a2a-gate.service").read_text()
    reloads = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecReload=")]
    assert reloads == ["/opt/a2a-gate/bin/a2a-gate check-config", "/bin/kill -HUP $MAINPID"]


def unit_copy(tmp_path: Path) -> Path:
    """The unit with its ExecStart and ExecStartPre naming this checkout's command."""
    unit = (DEPLOY / "a2a-gate.service").read_text()
    unit = unit.replace("/opt/a2a-gate/bin/a2a-gate", f"{Path(sys.executable).resolve()} -m gate.cli")
    copy = tmp_path / "a2a-gate.service"
    copy.write_text(unit)
    return copy


def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run([analyze, "verify", str(unit_copy(tmp_path))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "a2a-gate.service" not in done.stderr, done.stderr


def exposure(analyze: str, unit: Path) -> tuple[float, str]:
    done = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True, timeout=60
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert match, done.stdout + done.stderr
    return float(match.group(1)), match.group(2)


def test_the_systemd_unit_is_hardened(tmp_path):
    """systemd-analyze's exposure, 0 (locked down) to 10 (nothing restricted): "OK" or better."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    score, band = exposure(analyze, unit_copy(tmp_path))
    assert score < 5.0 and band in ("OK", "SAFE", "PERFECT"), (score, band)
    bare = tmp_path / "bare" / "a2a-gate.service"  # the check can fail: the unit without its hardening
    bare.parent.mkdir()
    hardening = unit_copy(tmp_path).read_text().split("# Hardening")[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    bare.write_text(hardening)
    assert exposure(analyze, bare)[0] > 7.0


def test_the_unit_runs_as_shipped_unprivileged_with_a_read_only_configuration(request):
    """As systemd would start it: another uid, the configuration root's and read-only, the sealing
    key a credential file, the state directory the only place it writes. The database lands there."""
    if os.geteuid() != 0:
        pytest.skip("runs the gate as another uid: needs root")
    tmp_path = Path(tempfile.mkdtemp(prefix="a2a-gate-unit-"))  # pytest's own is root's alone (0700)
    request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    etc, state, credentials = tmp_path / "etc", tmp_path / "state", tmp_path / "credentials"
    for directory in (etc, state, credentials):
        directory.mkdir()
    (etc / "gate.toml").write_text('[agents.echo]\ndescription = "Echo"\n')  # the default, relative database
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    (credentials / "A2A_GATE_SEALING_KEY").write_text(key + "\n")
    os.chown(state, 10001, 10001)
    os.chmod(state, 0o700)
    os.chmod(credentials / "A2A_GATE_SEALING_KEY", 0o444)
    os.chmod(credentials, 0o555)
    os.chmod(etc / "gate.toml", 0o444)
    os.chmod(etc, 0o555)
    os.chmod(tmp_path, 0o755)
    env = {"STATE_DIRECTORY": str(state), "CREDENTIALS_DIRECTORY": str(credentials)}
    as_service = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "--"]
    command = [*as_service, sys.executable, "-m", "gate.cli", "serve", "--config", str(etc / "gate.toml")]
    refused = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)},
    )
    # without the state directory the database would sit beside the configuration: one line, exit 2
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"{etc}/a2a-gate.db" in refused.stderr and "writable" in refused.stderr
    gate = GateProcess(etc / "gate.toml", tmp_path / "gate.log", env=env, prefix=as_service)
    try:
        gate.start()
        sent = httpx.post(f"{gate.url}/a2a/echo", json=send_body("hi"), timeout=10)
        assert sent.status_code == 401  # anonymous on a free agent: the gate runs and answers
        assert (state / "a2a-gate.db").exists() and sorted(p.name for p in etc.iterdir()) == ["gate.toml"]
        assert not (state / "a2a-gate.db.sealing-key").exists()  # the credential was the key
    finally:
        gate.stop()
    assert key not in (tmp_path / "gate.log").read_text()
