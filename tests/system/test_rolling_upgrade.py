"""A rolling upgrade and its rollback, release against release, on one PostgreSQL schema: the
previous release (tests/support/previous_release.py) serves, this one migrates the schema and
joins, the old replica keeps taking payments on the migrated schema beside the new one, each
answers for the other's tasks, and the previous release starts again on it (the rollback)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support import replicas as support
from tests.support.gate_helpers import cli
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import Payer, send_body
from tests.support.previous_release import built
from tests.support.replicas import Replicas

LEASE, RECONCILE = 30.0, 3600.0
replicas = support.replicas


def paid_call(gate: GateProcess, payer: Payer, text: str) -> dict:
    """One paid send at `gate`, signed for its own 402: the completed, settled task."""
    headers = payer.header_for(gate.url)
    answer = httpx.post(f"{gate.url}/a2a/paid", json=send_body(text), headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    task = answer.json()["result"]
    assert task["status"]["state"] == "completed", task
    assert task["metadata"]["x402.payment.status"] == "payment-completed", task["metadata"]
    return task


def read_task(gate: GateProcess, payer: Payer, task_id: str) -> dict:
    """`tasks/get` as the task's payer (a fresh token of the same payer proves who asks)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task_id}}
    answer = httpx.post(f"{gate.url}/a2a/paid", json=body, headers=payer.header_for(gate.url), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def test_the_previous_release_and_this_one_serve_one_schema_through_an_upgrade_and_a_rollback(
    replicas: Replicas, tmp_path: Path
):
    previous = built()
    config = replicas.config("old", lease=LEASE, reconcile=RECONCILE)
    config.write_text(without_python_agents(config.read_text()))  # (their callables live in this checkout)
    env = replicas.env()
    old = GateProcess(
        config, tmp_path / "old.log", port=free_port(), env=env, python=previous.python, cwd=previous.home
    )
    replicas.started.append(old)
    old.start()
    payer = Payer()
    before = paid_call(old, payer, "paid to the previous release")

    migrated = cli("migrate", "--config", str(config), env=env)
    assert migrated.returncode == 0, migrated.stderr
    new = replicas.start("new", lease=LEASE, reconcile=RECONCILE)

    on_old = paid_call(old, payer, "paid to the previous release, on the migrated schema")
    on_new = paid_call(new, payer, "paid to this release")
    assert read_task(new, payer, before["id"])["status"]["state"] == "completed"
    assert read_task(old, payer, on_new["id"])["status"]["state"] == "completed"

    old.stop()  # the rollback: the previous release starts again on the migrated schema
    old.start()
    paid_call(old, payer, "paid to the previous release after the rollback")
    assert read_task(old, payer, on_old["id"])["status"]["state"] == "completed"

    assert replicas.claim_states() == ["settled"] * 4
    assert replicas.payment_actions().count("settle") == 4
    assert replicas.ledger()["settle_calls"] == 4
    for log in (tmp_path / "old.log", new.log):
        assert "Traceback" not in log.read_text()


def without_python_agents(text: str) -> str:
    """The configuration without the agents whose code is this checkout's tests (the previous
    release runs from its own install, with nothing of this checkout on its path)."""
    head, *tables = text.split("\n[agents.")
    return "\n[agents.".join([head, *(t for t in tables if "callable =" not in t)])
