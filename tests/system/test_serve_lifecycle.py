"""`a2a-gate serve --dev-facilitator` never leaves its facilitator behind.

Under systemd, Docker or any supervisor a stop is a SIGTERM (or worse, a SIGKILL); a
facilitator left running holds its port and the next start fails. Each test stops the
serving process one way and checks that the facilitator's port is free again.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.gate_process import GateProcess, free_port

CONFIG = """
database = "gate.db"

[agents.paid]
price = { network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" }
"""


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.fixture
def serving(tmp_path: Path):
    """`serve --dev-facilitator PORT` running; yields (gate, facilitator port, facilitator pid)."""
    if not Path("/proc/self/task").exists():
        pytest.skip("needs Linux /proc to find the facilitator process")
    config = tmp_path / "gate.toml"
    config.write_text(CONFIG)
    facilitator_port = free_port()
    gate = GateProcess(config, tmp_path / "gate.log", extra_args=["--dev-facilitator", str(facilitator_port)])
    gate.start(timeout=90)
    assert httpx.get(f"http://127.0.0.1:{facilitator_port}/healthz", timeout=5).status_code == 200
    assert gate.process is not None
    pids = children(gate.process.pid)
    assert len(pids) == 1, pids
    try:
        yield gate, facilitator_port, pids[0]
    finally:
        gate.kill()
        if alive(pids[0]):  # the failure under test: clean up what the gate left behind
            os.kill(pids[0], signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopping_serve_stops_its_facilitator(serving, sig):
    gate, port, facilitator = serving
    gate.stop(sig)
    assert wait_until(lambda: not alive(facilitator)), "the facilitator outlived the gate"
    assert wait_until(lambda: port_free(port)), f"port {port} is still held"


def test_killed_serve_takes_its_facilitator_down(serving):
    gate, port, facilitator = serving
    gate.kill()  # SIGKILL: no cleanup code of the gate runs
    assert wait_until(lambda: not alive(facilitator)), "the facilitator outlived the gate"
    assert wait_until(lambda: port_free(port)), f"port {port} is still held"


@pytest.mark.parametrize("wrong", ["database", "role"])
def test_a_postgresql_url_naming_a_wrong_database_or_role_stops_serve_with_one_line(
    tmp_path, write_config, postgres_schema, wrong
):
    """The server answered and refused: waiting will not help, so `serve` says why at once (within
    libpq's connect_timeout), in one line, instead of retrying for half a minute and a traceback."""
    from urllib.parse import urlsplit

    parts = urlsplit(postgres_schema.url)
    user = "postgres" if wrong == "database" else "no_such_role_a2a"
    database = "no_such_database_a2a" if wrong == "database" else parts.path.lstrip("/")
    url = f"postgresql://{user}@{parts.hostname}:{parts.port}/{database}"
    config = write_config(f'database = "{url}"\n\n[agents.echo]\n')
    done = subprocess.run(
        [sys.executable, "-m", "gate.cli", "serve", "--config", str(config), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=20,  # the documented 5 s, with room for a busy machine; the old retries took 30 s
        env={**os.environ, "A2A_GATE_SEALING_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode()},
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not exist" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
