"""Shared fixtures: a config writer and a running gate process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.gate_process import GateProcess

if TYPE_CHECKING:
    from tests.support.paid import PaidSetup, PaidView

# redis_service, own_redis, postgres_schema: the servers scale-out tests run against
pytest_plugins = ["tests.support.services"]

FREE_CONFIG = """
public_url = "http://gate.example"
database = "gate.db"

[agents.echo]
description = "Echo"
skills = [{ id = "echo", name = "Echo" }]

[agents.hidden]
exposed = false

[agents.slow]
backend = "python"
callable = "tests.support.agents:slow"

[agents.interrupting]
backend = "python"
callable = "tests.support.agents:ask_then_answer"
"""


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str, name: str = "gate.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture
def start_gate(tmp_path: Path) -> Iterator[Callable[..., GateProcess]]:
    """Start gates on configs; every one started is stopped after the test."""
    started: list[GateProcess] = []

    def start(config: Path, **kwargs) -> GateProcess:
        gate = GateProcess(config, tmp_path / "gate.log", **kwargs).start()
        started.append(gate)
        return gate

    yield start
    for gate in started:
        gate.stop()


@pytest.fixture
def facilitator(tmp_path: Path) -> Iterator[str]:
    """The development facilitator on a real loopback port, over a fresh ledger."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_facilitator_app(str(tmp_path / "ledger.db"))) as url:
        yield url


@pytest.fixture
def paid(tmp_path: Path, facilitator: str, start_gate, write_config):
    """A gate with priced agents in front of the development facilitator."""
    from tests.support.gate_process import free_port
    from tests.support.paid import PaidSetup, paid_config

    port = free_port()
    config = write_config(paid_config(f"http://127.0.0.1:{port}", facilitator))
    gate = start_gate(config, port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


@pytest.fixture(scope="module")
def module_paid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PaidSetup]:
    """The `paid` setup started once for a module: a gate process start is most of a short test."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.gate_process import free_port
    from tests.support.paid import PaidSetup, paid_config
    from tests.support.serve import serve_app

    folder = tmp_path_factory.mktemp("paid")
    with serve_app(create_facilitator_app(str(folder / "ledger.db"))) as facilitator:
        port = free_port()
        config = folder / "gate.toml"
        config.write_text(paid_config(f"http://127.0.0.1:{port}", facilitator))
        with GateProcess(config, folder / "gate.log", port=port) as gate:
            yield PaidSetup(gate=gate, facilitator_url=facilitator, db_path=folder / "gate.db")


@pytest.fixture
def shared_paid(module_paid: PaidSetup) -> PaidView:
    """The module's `paid` setup as this test sees it (PaidView): for tests of their own payer's work."""
    from tests.support.paid import PaidView

    return PaidView.since_now(module_paid)
