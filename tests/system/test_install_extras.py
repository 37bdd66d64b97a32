"""The README's steps, run from a virtualenv holding only the gate and the development network
(`pip install -e . -e ./devnet`: the distributions `a2a-gate` and `a2a-gate-devnet`), as a newcomer has.

The suite itself runs with the `test` extra, which pulls in more than that: a package only the
`test` extra installs would hide a README step that cannot run on the newcomer's install (the development
facilitator's Permit2 schemes, `exact` by Permit2 and `upto`, need x402's extensions). This module
drives that other virtualenv's own `a2a-gate` and `a2a-gate-devnet` commands: `serve --dev-facilitator`
with the shipped example, a free call with an API key, then `a2a-gate-devnet pay` to the priced,
the usage-priced and the channel agent (each exits 0 with the receipt), and payments that are refused
or fail (each exits non-zero with one line saying why).

`DEV_EXTRA_PYTHON` names that virtualenv's python (`.ci/run` builds `build/venv-dev`:
`python3 -m venv build/venv-dev && build/venv-dev/bin/pip install -e . -e ./devnet`). Without it the
module is skipped, with `CI` set it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.gate_process import free_port, serving
from tests.support.services import missing

ROOT = Path(__file__).parents[2]
VARIABLE = "DEV_EXTRA_PYTHON"
# what the `test` extra adds and the two distributions do not: none of it may be importable there
TEST_ONLY = ("pytest", "hypothesis", "a2a", "fastapi", "psutil")
SEND = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "message/send",
    "params": {
        "message": {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hello"}]}
    },
}


def dev_only_python() -> Path:
    value = os.environ.get(VARIABLE, "")
    if not value:
        missing(
            f"{VARIABLE} is not set: no newcomer's virtualenv (python3 -m venv V && V/bin/pip install -e . -e ./devnet)"
        )
    python = Path(value)
    if not python.exists():
        missing(f"{VARIABLE}={value}: no such interpreter")
    return python


def check_dev_only(python: Path) -> None:
    """The virtualenv is this checkout's gate and development network and nothing more: a stale or
    richer one would prove nothing about the install the README names."""
    probe = (
        "import importlib.metadata as m, importlib.util as u, json, gate, devnet;"
        "print(json.dumps({'gate': gate.__file__, 'devnet': devnet.__file__,"
        " 'requires': m.requires('a2a-gate-devnet') or [],"
        f" 'present': [n for n in {TEST_ONLY!r} if u.find_spec(n)]}}))"
    )
    run = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, f"{python} lacks the gate or the development network: {run.stderr[-2000:]}"
    found = json.loads(run.stdout)
    assert Path(found["gate"]).resolve().is_relative_to(ROOT.resolve()), f"{python} does not run this checkout"
    devnet = Path(found["devnet"]).resolve()
    assert devnet.is_relative_to((ROOT / "devnet").resolve()), f"{python} runs another development network: {devnet}"
    assert not found["present"], f"{python} has the test extra's {found['present']}: not a newcomer's install"
    declared = tomllib.loads((ROOT / "devnet" / "pyproject.toml").read_text())["project"]["dependencies"]
    installed = [r for r in found["requires"] if "extra ==" not in r]
    assert same(installed) == same(declared), (
        f"{python} was installed from another devnet/pyproject.toml ({installed}, now {declared}): rebuild it"
    )


def newcomer_env(bin: Path) -> dict[str, str]:
    """A shell's plain environment with the virtualenv activated: nothing of this test run's."""
    return {
        "PATH": f"{bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/"),
        "LANG": "C.UTF-8",
    }


def same(requirements: list[str]) -> list[tuple[str, list[str], str]]:
    """Requirements in one spelling (the installed metadata sorts a requirement's extras)."""
    parsed = (Requirement(r.split(";")[0]) for r in requirements)
    return sorted((canonicalize_name(r.name), sorted(r.extras), str(r.specifier)) for r in parsed)


@dataclass
class Newcomer:
    bin: Path
    folder: Path
    config: Path
    url: str
    facilitator: str

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.folder,
            env=newcomer_env(self.bin),
        )

    def pay(self, agent: str, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.run("a2a-gate-devnet", "pay", f"{self.url}/a2a/{agent}", text, *extra)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Newcomer]:
    python = dev_only_python()
    check_dev_only(python)
    folder = tmp_path_factory.mktemp("newcomer")
    config = folder / "a2a-gate.toml"
    shutil.copy(ROOT / "config" / "a2a-gate.example.toml", config)
    port, facilitator_port = free_port(), free_port()
    command = [
        str(python.parent / "a2a-gate"),
        *("serve", "--config", str(config), "--port", str(port), "--dev-facilitator", str(facilitator_port)),
    ]
    url = f"http://127.0.0.1:{port}"
    with serving(command, folder / "serve.log", url, cwd=folder, env=newcomer_env(python.parent)):
        yield Newcomer(python.parent, folder, config, url, f"http://127.0.0.1:{facilitator_port}")


def paid_answer(run: subprocess.CompletedProcess[str]) -> dict:
    assert run.returncode == 0, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    outcome = json.loads(run.stdout)
    assert outcome["http_status"] == 200, outcome
    assert outcome["payment_response"]["success"] is True, outcome
    task = outcome["answer"]["result"]
    assert task["status"]["state"] == "completed", task
    assert task["metadata"]["x402.payment.status"] == "payment-completed", task
    return outcome


def test_a_free_call_with_an_api_key(newcomer: Newcomer) -> None:
    created = newcomer.run("a2a-gate", "keys", "create", "me", "--agent", "echo", "--config", str(newcomer.config))
    assert created.returncode == 0, created.stderr
    prefix = "key (shown once, keep it secret): "
    key = next(line[len(prefix) :] for line in created.stdout.splitlines() if line.startswith(prefix))
    answer = httpx.post(f"{newcomer.url}/a2a/echo", json=SEND, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["status"]["state"] == "completed", answer.text


def test_paying_the_priced_agent(newcomer: Newcomer) -> None:
    outcome = paid_answer(newcomer.pay("paid-echo", "hello, paid world"))
    assert outcome["payment_response"]["amount"] == "1000"


def test_paying_the_usage_priced_agent(newcomer: Newcomer) -> None:
    """`upto`: a Permit2 signature for the ceiling, charged 10 atomic units per character."""
    text = "hello, metered world"
    outcome = paid_answer(newcomer.pay("paid-metered", text))
    assert outcome["payment_response"]["amount"] == str(10 * len(text)), outcome


def test_paying_the_channel_agent(newcomer: Newcomer) -> None:
    outcome = paid_answer(
        newcomer.pay(
            "paid-channel", "hello, channel", "--scheme", "batch-settlement", "--count", "3", "--rpc-url",
            f"{newcomer.facilitator}/rpc",
        )
    )  # fmt: skip
    assert len(outcome["payment_responses"]) == 3, outcome
    assert [r["extra"]["chargedAmount"] for r in outcome["payment_responses"]] == ["1000"] * 3, outcome


def test_a_refused_payment_exits_non_zero(newcomer: Newcomer) -> None:
    faults = httpx.post(f"{newcomer.facilitator}/dev/faults", json={"verify": "invalid", "count": 1}, timeout=10)
    assert faults.status_code == 200, faults.text
    refused = newcomer.pay("paid-echo", "refuse me")
    assert refused.returncode != 0, refused.stdout
    assert json.loads(refused.stdout)["http_status"] == 403
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1, refused.stderr


@pytest.mark.parametrize(
    ("agent", "extra", "status"),
    [("echo", [], "401"), ("no-such-agent", [], "401"), ("paid-echo", ["--scheme", "upto"], None)],
)
def test_an_answer_that_is_not_a_paid_one_exits_non_zero(
    newcomer: Newcomer, agent: str, extra: list[str], status: str | None
) -> None:
    """The free agent (no price for anonymous callers), an unknown one, and a scheme the agent
    does not offer (the x402 client cannot pay): one line on stderr and a non-zero status."""
    run = newcomer.pay(agent, "hello", *extra)
    assert run.returncode != 0, (run.stdout, run.stderr)
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr
    if status is not None:
        assert f"HTTP {status}" in run.stderr, run.stderr


def test_an_unreachable_gate_exits_non_zero(newcomer: Newcomer) -> None:
    run = newcomer.run("a2a-gate-devnet", "pay", f"http://127.0.0.1:{free_port()}/a2a/paid-echo", "hello")
    assert run.returncode != 0 and run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr
