"""Replicas of one gate on one PostgreSQL schema, each an `a2a-gate serve` process of its own.

For the ownership tests: a replica frozen mid-agent (SIGSTOP), a replica whose wall clock
is off (tests/support/skewed_clock), a replica holding another sealing key. Every replica
names the same public URL, so a token minted from one replica's 402 pays at any of them,
as behind a load balancer. No nginx and no Redis: these tests aim each request at the
replica they mean.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import paid_config
from tests.support.services import PostgresSchema

PUBLIC_URL = "http://replicas.example"  # what every replica's 402 names: one door
SKEWED_CLOCK = Path(__file__).parent / "skewed_clock"


def new_sealing_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def replica_config(
    facilitator: str, database: str, *, lease: float, reconcile: float, extra: str = "", sections: str = ""
) -> str:
    """The paid test config on `database`, with this lease and reconcile interval, `extra` lines
    in its [facilitator] table and more `sections` at the end."""
    text = paid_config(PUBLIC_URL, facilitator, reconcile=reconcile)
    text = text.replace('database = "gate.db"', f'database = "{database}"\nclaim_lease_seconds = {lease}')
    return text.replace("[facilitator]\n", f"[facilitator]\n{extra}", 1) + sections


@dataclass
class Replicas:
    """Gate processes on one PostgreSQL schema, the facilitator they share, and what they stored."""

    home: Path
    facilitator: str
    postgres: PostgresSchema
    sealing_key: str = field(default_factory=new_sealing_key)
    started: list[GateProcess] = field(default_factory=list)

    def config(
        self, name: str, *, lease: float, reconcile: float, facilitator_extra: str = "", sections: str = ""
    ) -> Path:
        """Write replica `name`'s directory and config; its path."""
        home = self.home / name
        home.mkdir(exist_ok=True)
        config = home / "gate.toml"
        database = self.postgres.store_url()
        text = replica_config(
            self.facilitator, database, lease=lease, reconcile=reconcile, extra=facilitator_extra, sections=sections
        )
        config.write_text(text)
        return config

    def env(self, *, sealing_key: str | None = None, clock_offset: float = 0.0) -> dict[str, str]:
        """A replica's environment: the sealing key (the shared one unless told), a skewed clock."""
        env = {"A2A_GATE_SEALING_KEY": sealing_key or self.sealing_key}
        if clock_offset:
            path = os.pathsep.join(p for p in (str(SKEWED_CLOCK), os.environ.get("PYTHONPATH", "")) if p)
            env.update(PYTHONPATH=path, A2A_TEST_CLOCK_OFFSET=str(clock_offset))
        return env

    def start(
        self,
        name: str,
        *,
        lease: float,
        reconcile: float,
        sealing_key: str | None = None,
        clock_offset: float = 0.0,
        facilitator_extra: str = "",
        sections: str = "",
    ) -> GateProcess:
        config = self.config(
            name, lease=lease, reconcile=reconcile, facilitator_extra=facilitator_extra, sections=sections
        )
        env = self.env(sealing_key=sealing_key, clock_offset=clock_offset)
        gate = GateProcess(config, config.parent / "gate.log", port=free_port(), env=env)
        self.started.append(gate)
        return gate.start()

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.postgres.url, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{self.postgres.schema}"')
            return conn.execute(sql, args).fetchall()

    def claim_states(self) -> list[str]:
        return [r[0] for r in self.rows("SELECT state FROM claims ORDER BY created_at")]

    def payment_actions(self) -> list[str]:
        return [r[0] for r in self.rows("SELECT action FROM payments ORDER BY id") if r[0] != "replay"]

    def completed_tasks(self, payer: str) -> int:
        """Tasks of `payer` the store holds as completed: work the payer got."""
        owner = f"payer:{payer.lower()}"
        [(count,)] = self.rows("SELECT COUNT(*) FROM tasks WHERE owner = %s AND state = 'completed'", owner)
        return int(count)

    def ledger(self) -> dict[str, Any]:
        return httpx.get(f"{self.facilitator}/dev/ledger", timeout=10).json()

    def faults(self, **modes: Any) -> None:
        httpx.post(f"{self.facilitator}/dev/faults", json=modes, timeout=10).raise_for_status()


def post(
    gate: GateProcess, agent: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 30
) -> httpx.Response:
    return httpx.post(f"{gate.url}/a2a/{agent}", json=body, headers=headers, timeout=timeout)


@contextlib.contextmanager
def frozen(gate: GateProcess) -> Iterator[None]:
    """The replica's process stopped (SIGSTOP) for the block: a long GC pause, a VM migration."""
    assert gate.process is not None
    os.kill(gate.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(gate.process.pid, signal.SIGCONT)


@pytest.fixture
def replicas(tmp_path: Path, facilitator: str, postgres_schema: PostgresSchema) -> Iterator[Replicas]:
    """Replicas on a fresh PostgreSQL schema; every one started is stopped (and thawed) after the test."""
    fleet = Replicas(tmp_path, facilitator, postgres_schema)
    try:
        yield fleet
    finally:
        for gate in fleet.started:
            if gate.process is not None and gate.process.poll() is None:
                os.kill(gate.process.pid, signal.SIGCONT)
            gate.stop()
