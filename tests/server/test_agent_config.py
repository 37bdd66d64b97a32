"""An operator's agents in the configuration: what `check-config` finds before `serve` runs.

Through the CLI as a subprocess, as an operator runs it: every problem is one line with
its key path, and `serve` and `migrate` stop on the same lines, never with a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gate_helpers import cli
from tests.support.paid import ASSET, PAY_TO

BROKEN_AGENTS = """
database = "gate.db"

[agents.missing]
backend = "python"
callable = "no_such_module_anywhere:answer"

[agents.typo]
backend = "python"
callable = "myagent:anwser"

[agents.crashes-on-import]
backend = "python"
callable = "crashing:answer"

[agents.no-host]
backend = "upstream"
url = "http://:9000/a2a"

[agents.bad-port]
backend = "upstream"
url = "http://127.0.0.1:port/a2a"

[agents.sdk-missing]
backend = "a2a-sdk"
executor = "myagent:NoSuchExecutor"

[agents.sdk-not-an-executor]
backend = "a2a-sdk"
executor = "myagent:NotAnExecutor"

[agents.sdk-needs-arguments]
backend = "a2a-sdk"
executor = "myagent:NeedsArguments"
"""

EXPECTED_PROBLEMS = [
    "agents.missing.callable: cannot import no_such_module_anywhere",
    "agents.typo.callable: myagent has no attribute 'anwser'",
    "agents.crashes-on-import.callable: cannot import crashing: RuntimeError: no database configured",
    "agents.no-host.url: must be an http(s) URL with a host",
    "agents.bad-port.url: must be an http(s) URL with a host",
    "agents.sdk-missing.executor: myagent has no attribute 'NoSuchExecutor'",
    "agents.sdk-not-an-executor.executor: myagent:NotAnExecutor is a class but not an a2a.server.agent_execution",
    "agents.sdk-needs-arguments.executor: myagent:NeedsArguments needs arguments: name a factory",
]

MYAGENT = """
from a2a.server.agent_execution import AgentExecutor


async def answer(request):
    return "hi"


class NotAnExecutor:
    pass


class NeedsArguments(AgentExecutor):
    def __init__(self, model):
        self.model = model

    async def execute(self, context, event_queue):
        pass

    async def cancel(self, context, event_queue):
        pass
"""


def broken_config(tmp_path: Path) -> Path:
    (tmp_path / "myagent.py").write_text(MYAGENT)
    (tmp_path / "crashing.py").write_text("raise RuntimeError('no database configured')\n")
    config = tmp_path / "gate.toml"
    config.write_text(BROKEN_AGENTS)
    return config


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def assert_every_problem(stderr: str) -> None:
    lines = error_lines(stderr)
    for expected in EXPECTED_PROBLEMS:
        assert any(expected in line for line in lines), (expected, stderr)
    assert len(lines) == len(EXPECTED_PROBLEMS), stderr
    assert "Traceback" not in stderr


def test_check_config_imports_every_callable_and_checks_every_upstream_url(tmp_path: Path) -> None:
    done = cli("check-config", str(broken_config(tmp_path)), check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert_every_problem(done.stderr)


@pytest.mark.parametrize("command", [["serve", "--port", "9"], ["migrate"]])
def test_serve_and_migrate_stop_on_the_same_lines_without_a_traceback(tmp_path: Path, command: list[str]) -> None:
    config = broken_config(tmp_path)
    checked = cli("check-config", str(config), check=False)
    done = cli(command[0], "--config", str(config), *command[1:], check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert error_lines(done.stderr) == error_lines(checked.stderr)
    assert "Traceback" not in done.stderr


def test_a_callable_beside_the_config_passes_the_check(tmp_path: Path) -> None:
    (tmp_path / "myagent.py").write_text("async def answer(request):\n    return 'hi'\n")
    config = tmp_path / "gate.toml"
    config.write_text('[agents.mine]\nbackend = "python"\ncallable = "myagent:answer"\n')
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 0, done.stderr
    assert "OK (1 agents" in done.stdout


def test_a_price_that_is_not_a_table_names_the_keys_it_needs(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text('[agents.paid]\nprice = "$0.002"\n')
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 2
    [line] = error_lines(done.stderr)
    assert "agents.paid.price: must be a table" in line
    for key in ("network", "asset", "amount", "pay_to"):
        assert key in line, line
    assert "price = { network = " in line, line  # an example to copy


OTHER_ASSET = "0x" + "ab" * 20  # a token the gate knows no EIP-712 domain for


def test_an_asset_without_a_known_eip712_domain_needs_its_extra(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        f'[agents.paid]\nprice = {{ network = "eip155:8453", asset = "{OTHER_ASSET}", amount = "1",'
        f' pay_to = "{PAY_TO}" }}\n'
    )
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 2, done.stdout
    [line] = error_lines(done.stderr)
    assert "agents.paid.price.extra" in line and "name" in line and "version" in line, line
    served = cli("serve", "--config", str(config), "--port", "9", check=False)
    assert served.returncode == 2 and error_lines(served.stderr) == [line]


def test_an_asset_with_its_extra_or_a_known_asset_passes(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        f'[agents.other]\nprice = {{ network = "eip155:8453", asset = "{OTHER_ASSET}", amount = "1",'
        f' pay_to = "{PAY_TO}", extra = {{ name = "Token", version = "1" }} }}\n'
        f'[agents.usdc]\nprice = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1", pay_to = "{PAY_TO}" }}\n'
    )
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 0, done.stderr


def test_an_extra_without_name_and_version_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        f'[agents.other]\nprice = {{ network = "eip155:8453", asset = "{OTHER_ASSET}", amount = "1",'
        f' pay_to = "{PAY_TO}", extra = {{ name = "Token" }} }}\n'
    )
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 2
    [line] = error_lines(done.stderr)
    assert "agents.other.price.extra" in line and "version" in line, line
