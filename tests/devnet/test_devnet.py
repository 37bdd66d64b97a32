"""The development network as its own program: the README's first commands, and its distribution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devnet import cli
from tests.support.gate_process import free_port
from tests.support.paid import send_body


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def test_serve_with_dev_facilitator_then_devnet_pay_runs_the_paid_flow(tmp_path: Path):
    """`a2a-gate serve --dev-facilitator PORT` on the embedded defaults, then `a2a-gate-devnet pay`."""
    port, facilitator_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gate.cli",
                "serve",
                "--port",
                str(port),
                "--dev-facilitator",
                str(facilitator_port),
                "--log-level",
                "warning",
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", serve, log)
        paid = subprocess.run(
            [sys.executable, "-m", "devnet", "pay", f"http://127.0.0.1:{port}/a2a/paid-echo", "hello, paid world"],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
            check=True,
        )
        outcome = json.loads(paid.stdout)
        assert outcome["http_status"] == 200
        assert outcome["payment_response"]["success"] is True
        assert outcome["payment_response"]["payer"] == outcome["payer"]
        status = outcome["answer"]["result"]["status"]
        assert status["state"] == "completed"
        assert status["message"]["metadata"]["x402.payment.status"] == "payment-completed"
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert (tmp_path / "a2a-gate.db.ledger").exists(), "the ledger sits beside the database"


INSTALL = "pip install ./devnet"


def test_devnet_without_its_dependencies_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(cli, "EXTRA_MODULES", ("x402", "surely_not_installed_module"))
    assert cli.main(["facilitator"]) == cli.MISSING_EXTRA_STATUS
    error = capsys.readouterr().err
    assert "surely_not_installed_module" in error and INSTALL in error


def test_production_server_runs_without_the_extra_and_dev_facilitator_says_what_is_missing(tmp_path: Path):
    """Without x402 and eth-account (the development network's dependencies) the gate serves;
    --dev-facilitator says how to get them."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    # A sitecustomize that hides the x402 package, as on an install without the extra.
    (shadow / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('x402', 'eth_account'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "gate.cli", "serve", "--port", str(free_port()), "--dev-facilitator", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert INSTALL in result.stderr
    assert "the development facilitator exited" in result.stderr
    assert "Traceback" not in result.stderr

    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "gate.cli", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", serve, log)
        assert httpx.post(f"http://127.0.0.1:{port}/a2a/paid-echo", json=send_body("hi")).status_code == 501
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(15)


def test_dev_facilitator_without_the_development_network_says_so_in_one_line(tmp_path: Path):
    """A production install (no a2a-gate-devnet): --dev-facilitator stops before starting anything,
    with one line naming the install, and the gate still imports nothing of the development network."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    # A sitecustomize that makes `devnet` absent, as on an install without the distribution.
    (shadow / "sitecustomize.py").write_text("import sys\nsys.modules['devnet'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    facilitator_port = free_port()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gate.cli",
            "serve",
            "--port",
            str(free_port()),
            "--dev-facilitator",
            str(facilitator_port),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f"--dev-facilitator {facilitator_port}" in result.stderr and "not installed" in result.stderr
    assert INSTALL in result.stderr
