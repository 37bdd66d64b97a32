"""SIGKILL mid-flight: nothing is executed twice, nothing undelivered is charged,
delivered work is settled exactly once after a restart, and no log row is lost."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.gate_helpers import cli, wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body

LEASE = "claim_lease_seconds = 1.5\n"  # short leases, so an orphan is found within seconds


def setup(
    tmp_path: Path, facilitator: str, write_config, *, prefix: list[str] | None = None, extra: str = LEASE
) -> PaidSetup:
    port = free_port()
    config = write_config(extra + paid_config(f"http://127.0.0.1:{port}", facilitator, reconcile=0.5))
    gate = GateProcess(config, tmp_path / "gate.log", port=port, prefix=prefix).start()
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def test_kill_between_delivery_and_settlement_settles_once_after_restart(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url)
        sender = paid.send_while_settle_held(headers)  # its first settle hangs past our kill
        paid.gate.kill()
        sender.join()
        assert paid.ledger()["settlements"] == []

        paid.gate.start()  # same database: the claim is owed and the reconciler settles it
        wait_for(lambda: len(paid.ledger()["settlements"]) == 1)
        wait_for(lambda: paid.claim_states() == ["settled"])
        time.sleep(1.5)  # a few more reconciler passes: still exactly one charge
        assert len(paid.ledger()["settlements"]) == 1
        assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle"]
        task_id = paid.payment_rows("settle")[0]["task_id"]
        assert f"claim for task {task_id} (agent paid) taken over" in paid.gate.log.read_text()
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task_id}}
        task = paid.post("paid", body, headers).json()["result"]
        assert task["status"]["state"] == "completed"
        assert task["metadata"]["x402.payment.status"] == "payment-completed"
        replay = paid.post("paid", send_body("x"), headers)  # the payer's retry replays, no second charge
        assert replay.headers["X-Idempotent-Replay"] == "true"
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()


def test_claim_left_running_by_a_killed_process_is_released_uncharged(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url, "paid-slow")
        task = paid.post("paid-slow", send_body("sleep 30", blocking=False), headers).json()["result"]
        wait_for(lambda: paid.claim_states() == ["running"])
        paid.gate.kill()
        paid.gate.start()
        # found at start if the dead owner's lease already ran out, else by the reconciler within one lease
        wait_for(lambda: paid.claim_states() == [], timeout=15)
        assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
        # the replica that released it says so, naming the task (an operator sees the orphan)
        assert f"claim for task {task['id']} (agent paid-slow) released" in paid.gate.log.read_text()
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
        # the claim is gone, so ownership is proven by the token verifying to the payer again
        after = paid.post("paid-slow", body, headers).json()["result"]
        assert after["status"]["state"] == "failed"
        assert paid.ledger()["settle_calls"] == 0
        retry = paid.post("paid-slow", send_body("sleep 0.1"), headers)  # the payer may use the token again
        assert retry.json()["result"]["status"]["state"] == "completed"
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()


def test_restart_with_the_same_pid_settles_a_settling_claim(tmp_path, facilitator, write_config):
    """pid 1 in a container: the restarted process has the pid the dead one had."""
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url)
        sender = paid.send_while_settle_held(headers)  # its first settle hangs past our kill
        paid.gate.kill()
        sender.join()
        paid.pretend_owner_is_pid_1()
        paid.gate.start()
        wait_for(lambda: paid.claim_states() == ["settled"], timeout=15)
        assert len(paid.ledger()["settlements"]) == 1
        replay = paid.post("paid", send_body("x"), headers).json()["result"]
        assert replay["metadata"]["x402.payment.status"] == "payment-completed"
    finally:
        paid.gate.stop()


def test_restart_with_the_same_pid_releases_a_running_claim(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url, "paid-slow")
        paid.post("paid-slow", send_body("sleep 30", blocking=False), headers)
        wait_for(lambda: paid.claim_states() == ["running"])
        paid.gate.kill()
        paid.pretend_owner_is_pid_1()
        paid.gate.start()
        # the payer's retry is in_flight only while the dead owner's lease could still be alive
        wait_for(lambda: paid.claim_states() == [], timeout=15)
        # a short retry: a running one would hold the graceful stop below for its drain timeout
        retry = paid.post("paid-slow", send_body("sleep 0.2", blocking=False), headers).json()
        assert "result" in retry, retry
        assert [r["action"] for r in paid.payment_rows()][:2] == ["verify", "release"]
    finally:
        paid.gate.stop()


UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"]


def _pid_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        [*UNSHARE, sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return done.returncode == 0 and done.stdout.strip() == "1"


@pytest.mark.skipif(not _pid_namespaces_work(), reason="unprivileged pid namespaces are not available here")
def test_gate_as_pid_1_in_its_own_namespace_recovers_after_restart(tmp_path, facilitator, write_config):
    """The container case for real: the gate is pid 1 before and after the crash."""
    paid = setup(tmp_path, facilitator, write_config, prefix=UNSHARE)
    try:
        headers = Payer().header_for(paid.gate.url)
        sender = paid.send_while_settle_held(headers)  # its first settle hangs past our kill
        paid.gate.kill()
        sender.join()
        paid.gate.start()
        wait_for(lambda: paid.claim_states() == ["settled"], timeout=15)
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        # unshare does not pass SIGTERM on: a graceful stop would only wait its timeout, then kill
        paid.gate.kill()


def test_reconcile_beside_a_live_server_steals_no_live_claim(tmp_path, facilitator, write_config):
    paid = setup(tmp_path, facilitator, write_config)
    try:
        headers = Payer().header_for(paid.gate.url, "paid-slow")
        # the work outlasts the check by far: a reconcile process starting on a loaded machine takes seconds
        task = paid.post("paid-slow", send_body("sleep 25", blocking=False), headers).json()["result"]
        started = time.monotonic()
        wait_for(lambda: paid.claim_states() == ["running"])
        time.sleep(2.0)  # past one lease: only renewal keeps it alive
        cli("reconcile", "--config", str(paid.gate.config))  # exits 0, or the test fails with its output
        assert time.monotonic() - started < 25, "the check came after the work ended: it proves nothing"
        assert paid.claim_states() == ["running"]
        assert "release" not in [r["action"] for r in paid.payment_rows()]
        wait_for(lambda: paid.claim_states() == ["settled"], timeout=40)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
        after = paid.post("paid-slow", body, headers).json()["result"]
        assert after["metadata"]["x402.payment.status"] == "payment-completed"
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()


def test_a_worker_killed_mid_settle_is_recovered_by_the_workers_that_follow(tmp_path, facilitator, write_config):
    """`--workers 2`: the supervisor replaces the dead worker; a live worker or the new one finds the orphan."""
    import psutil

    port = free_port()
    config = write_config(LEASE + paid_config(f"http://127.0.0.1:{port}", facilitator, reconcile=0.5))
    gate = GateProcess(config, tmp_path / "gate.log", port=port, extra_args=["--workers", "2"]).start()
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    try:
        headers = Payer().header_for(paid.gate.url)
        sender = paid.send_while_settle_held(headers)  # its first settle hangs past our kill
        workers = psutil.Process(gate.process.pid).children(recursive=True)
        owner = [
            w
            for w in workers
            if any(
                c.status == "ESTABLISHED" and c.raddr and c.raddr.port == int(facilitator.rsplit(":", 1)[1])
                for c in w.net_connections()
            )
        ]
        assert len(owner) == 1, "the worker that is settling"
        owner[0].kill()
        sender.join()
        wait_for(lambda: paid.claim_states() == ["settled"], timeout=20)
        assert len(paid.ledger()["settlements"]) == 1
    finally:
        paid.gate.stop()
