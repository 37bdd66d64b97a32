"""A replica whose clock runs an hour ahead does not fail another replica's paid task as stuck.

Leases are judged by the database's clock, so a replica an hour ahead takes no live claim. Its
housekeeping, though, also fails "stuck" tasks (stored `submitted`/`working` past their deadline),
and that reads the deadline against the process's own clock. Replica B, an hour ahead, then finds
replica A's paid task stuck while A is settling it, and stores it `failed`, "The task passed its
deadline" (a turn failed by housekeeping, uncharged), while the payer is being charged. A payer
polling through B reads "failed, uncharged" and is charged; had B's write come after A's last one,
the stored task would say so for good.

Two `a2a-gate serve` processes on one PostgreSQL schema (B with tests/support/skewed_clock), the
development facilitator holding A's settle for a second.
"""

from __future__ import annotations

import threading
import time

from devnet.payer import encode_header
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import Payer, send_body
from tests.support.replicas import Replicas, post

replicas = support.replicas

LEASE = 3.0


def start_with_housekeeping(fleet: Replicas, name: str, *, clock_offset: float = 0.0) -> GateProcess:
    """A replica whose housekeeping runs every 0.3 s."""
    config = fleet.config(name, lease=LEASE, reconcile=0.5)
    text = config.read_text().replace(
        f"claim_lease_seconds = {LEASE}", f"claim_lease_seconds = {LEASE}\nhousekeeping_interval_seconds = 0.3"
    )
    config.write_text(text)
    gate = GateProcess(config, config.parent / "gate.log", port=free_port(), env=fleet.env(clock_offset=clock_offset))
    fleet.started.append(gate)
    return gate.start()


def test_a_replica_an_hour_ahead_does_not_fail_a_task_another_replica_is_settling(replicas) -> None:
    a = start_with_housekeeping(replicas, "a")
    start_with_housekeeping(replicas, "b", clock_offset=3600.0)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-slow"))}
    replicas.faults(settle="slow:0.6", count=1)  # A's settle takes a while (well under its 1.5 s timeout)
    states: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            states.extend(s for (s,) in replicas.rows("SELECT state FROM tasks WHERE owner LIKE %s", "payer:%"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        answer = post(a, "paid-slow", send_body("sleep 0.5"), headers, timeout=30).json()["result"]
        wait_for(lambda: replicas.claim_states() == ["settled"])
        time.sleep(1.0)  # B's housekeeping has had its turns
    finally:
        done.set()
        watcher.join(5)
    [(final_state, document)] = replicas.rows("SELECT state, document FROM tasks WHERE owner LIKE %s", "payer:%")
    observed = {
        "answer": (answer["status"]["state"], answer["metadata"]["x402.payment.status"]),
        "transfers": len(replicas.ledger()["settlements"]),
        "stored_failed_meanwhile": "failed" in states,
        "final_stored_state": final_state,
        "stored_says_past_deadline": "passed its deadline" in document,
    }
    assert observed == {
        "answer": ("completed", "payment-completed"),
        "transfers": 1,
        "stored_failed_meanwhile": False,
        "final_stored_state": "completed",
        "stored_says_past_deadline": False,
    }, (
        f"observed {observed}; stored states in order {[s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]}"
    )
