"""Shared fixtures: a config writer and a running gate process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.gate_process import GateProcess

if TYPE_CHECKING:
    from tests.support.paid import PaidSetup, PaidView

# redis_service, own_redis, postgres_schema: the servers scale-out tests run against
pytest_plugins = ["tests.support.services"]


def _one_default_tls_context() -> None:
    """Every httpx client of the tests shares one default TLS context.

    `httpx.post(...)` builds a client per call, and each client a TLS context from the CA
    bundle: about 15 ms of CPU per request, though the tests only speak plain HTTP to
    loopback. Thousands of such calls made that a good part of the suite's CPU time on two
    cores. Only the test process is changed; the gate and its facilitators are untouched.
    """
    import functools

    import httpx._transports.default as transports

    build = getattr(transports, "create_ssl_context", None)
    if build is None:  # another httpx: the tests only run slower
        return
    shared = functools.lru_cache(maxsize=1)(lambda: build())

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is True and cert is None and trust_env:
            return shared()
        return build(verify=verify, cert=cert, trust_env=trust_env)

    transports.create_ssl_context = create_ssl_context


_one_default_tls_context()

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


# The longest tests and modules (seconds of waiting on leases, timeouts and locks), started
# first: the workers then end together on short tests instead of one of them running a
# long test alone at the end. A name missing here only costs time, never a result.
LONGEST_FIRST = (
    "tests/system/test_replicas.py::test_postgresql_restarted_mid_run_answers_retryably_and_loses_nothing",
    "tests/gate/test_settlement_truth.py::test_lock_held_when_settle_returns_never_turns_a_charge_into_not_charged",
    "tests/gate/test_fault_matrix.py::test_fault_row[database locked when settle returns]",
    "tests/gate/test_fault_matrix.py",
    "tests/bench/test_bench_smoke.py",
    "tests/system/test_crash_recovery.py",
    "tests/attacks/test_what_buys_work.py::test_a_retry_of_a_settled_request_is_a_replay_after_its_token_expired",
    "tests/attacks/test_fuzz_envelope.py",
    "tests/gate/test_facilitator_client.py::test_the_breaker_opens_answers_at_once_then_probes",
    "tests/system/test_replicas.py",
    "tests/server/test_store_engines.py::test_postgresql_restarted_is_unavailable_meanwhile_and_used_again_at_once",
    "tests/gate/test_settlement_truth.py",
    "tests/gate/test_shared_limiter.py",
    "tests/server/test_services_fixtures.py",
)


# The tiers (pyproject.toml registers the markers; docs/testing.md): `system` tests need a server
# (an `a2a-gate serve` process, a facilitator, nginx, PostgreSQL, Redis, a subprocess); `slow` ones
# take minutes (the money simulation, the benchmark's smoke tests, a newcomer's install, another
# release's build). `pytest -m "not system and not slow"` is the fast tier: seconds, no servers.
SYSTEM_FOLDERS = ("system", "attacks", "simulation", "bench")
SLOW = (
    "tests/simulation/",
    "tests/bench/",
    "tests/system/test_install_extras.py",
    "tests/system/test_rolling_upgrade.py",
)
SERVER_FIXTURES = frozenset(
    {"facilitator", "paid", "start_gate", "replicas", "postgres_schema", "own_postgres", "redis_service", "own_redis"}
)
# a module holding one of these starts or reaches a server: each of its tests is `system`
SERVER_NAMES = frozenset(
    {"GateProcess", "serving", "serve_app", "nginx_in_front", "cli", "subprocess", "uvicorn", "psycopg", "Replicas"}
)


def tier(item: pytest.Item) -> None:
    """Mark `item` with its tier: by its folder, the fixtures it asks for, and what its module uses."""
    path = Path(str(item.path)).relative_to(Path(__file__).parent.parent).as_posix()
    module = getattr(item, "module", None)
    names = set(vars(module)) if module is not None else set()
    code = getattr(getattr(item, "function", None), "__code__", None)
    if code is not None:  # what the test imports or names itself (a local import included)
        names |= set(code.co_names) | set(code.co_varnames)
    folder = path.split("/")[1] if path.count("/") > 1 else ""
    fixtures = set(getattr(item, "fixturenames", ()))
    if folder in SYSTEM_FOLDERS or fixtures & SERVER_FIXTURES or names & SERVER_NAMES:
        item.add_marker(pytest.mark.system)
    if path.startswith(SLOW):
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's tier (`tier`); longest first (LONGEST_FIRST, in its order), the rest in
    pytest's order. Every xdist worker sorts its collection the same way, as the scheduler requires."""
    for item in items:
        tier(item)

    def rank(item: pytest.Item) -> int:
        for index, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid == prefix or item.nodeid.startswith((prefix + "::", prefix + "[")):
                return index
        return len(LONGEST_FIRST)

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def no_servers_unless_system(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside the `system` tier starts no process, listens on no port and connects to none:
    the fast tier runs anywhere. One that does fails here, saying to mark it (its module's
    `pytestmark = pytest.mark.system`, or a server fixture)."""
    if request.node.get_closest_marker("system") is not None:
        return
    import socket
    import subprocess

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{request.node.nodeid} {what} but is not marked system (tests/conftest.py)")

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a process"))
    monkeypatch.setattr(socket.socket, "listen", refuse("listens on a port"))
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connects to {address}")()
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) does not know the hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per available core (at most four more than the cores).

    Most of the suite's time is spent waiting (on leases, timeouts, slow fakes and process
    starts), not computing: with one worker per core the cores sit idle two thirds of
    the time. PYTEST_XDIST_AUTO_NUM_WORKERS still overrides, as in pytest-xdist itself.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2 * cores, cores + 4)


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
        gate.stop_later()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No gate outlives the session: wait for the ones teardowns asked to stop."""
    from tests.support.gate_process import reap_stopped

    reap_stopped()


@pytest.fixture
def facilitator(tmp_path: Path) -> Iterator[str]:
    """The development facilitator on a real loopback port, over a fresh ledger."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_facilitator_app(str(tmp_path / "ledger.db")), wait_on_exit=False) as url:
        yield url


@pytest.fixture
def paid(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    """A gate with priced agents in front of the development facilitator."""
    from tests.support.paid import start_paid

    return start_paid(tmp_path, facilitator, start_gate, write_config)


@pytest.fixture
def own_paid(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    """`paid`, under another name: for a test of a module whose `paid` is shared (`shared_paid`)."""
    from tests.support.paid import start_paid

    return start_paid(tmp_path, facilitator, start_gate, write_config)


@pytest.fixture(scope="session")
def session_paid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PaidSetup]:
    """The `paid` setup started once per worker, for every module that shares it (`shared_paid`):
    a gate process start is most of a short test."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.gate_process import free_port
    from tests.support.paid import PaidSetup, paid_config
    from tests.support.serve import serve_app

    folder = tmp_path_factory.mktemp("paid")
    with serve_app(create_facilitator_app(str(folder / "ledger.db")), wait_on_exit=False) as facilitator:
        port = free_port()
        config = folder / "gate.toml"
        config.write_text(paid_config(f"http://127.0.0.1:{port}", facilitator))
        with GateProcess(config, folder / "gate.log", port=port) as gate:
            yield PaidSetup(gate=gate, facilitator_url=facilitator, db_path=folder / "gate.db")


@pytest.fixture
def shared_paid(session_paid: PaidSetup) -> PaidView:
    """The shared `paid` setup as this test sees it (PaidView): for tests of their own payer's work."""
    from tests.support.paid import PaidView

    return PaidView.since_now(session_paid)
