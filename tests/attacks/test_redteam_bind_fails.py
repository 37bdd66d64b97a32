"""A paid request whose claim could not name its task still answers its retry with the work.

After verify the gate starts the agent, then names the payer and the task on the claim (`bind`).
Here that write fails: its database connection is cut while it waits on the claim row (a restart,
a failover). The request is answered "store unavailable, retryable", but its execution goes on:
the work is delivered and settled, the payer is charged. The payer does what the answer says and
retries the same token with the same request. That retry must get the work it paid for (a replay),
never "Task not found": a charge whose answer no retry can reach is work charged and not delivered.

Replica A on PostgreSQL, the development facilitator (its verify slowed so the claim row can be
locked between the claim and the bind).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import psycopg

from devnet.payer import encode_header
from tests.attacks.test_redteam_delivery_window import ANSWER, LEASE, WORK, blocked_by, claim_row_locked
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.paid import Payer, send_body
from tests.support.replicas import post

replicas = support.replicas


def bind_waiting(fleet: support.Replicas, holder: psycopg.Connection[Any]) -> list[int]:
    """The bind, waiting on `holder`'s claim row lock: on its own, or sent with the task's INSERT
    (one query, whose text pg_stat_activity cuts at 1 kB, before the bind if the task is long)."""
    return blocked_by(fleet, holder, "%UPDATE claims SET payer%", "INSERT INTO tasks %")


def test_a_charge_whose_bind_failed_is_answered_on_retry(replicas) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-slow"))}
    body = send_body(WORK)
    answers: dict[str, Any] = {}
    replicas.faults(verify="slow:0.9", count=1)

    def send_on_a() -> None:
        try:
            answers["first"] = post(a, "paid-slow", body, headers, timeout=40)
        except httpx.HTTPError as exc:
            answers["first_error"] = type(exc).__name__

    on_a = threading.Thread(target=send_on_a)
    on_a.start()
    wait_for(lambda: replicas.claim_states() == ["running"])  # claimed, verify under way
    with claim_row_locked(replicas) as holder:
        wait_for(lambda: bool(bind_waiting(replicas, holder)), timeout=20)
        [pid] = bind_waiting(replicas, holder)
        replicas.rows("SELECT pg_terminate_backend(%s)", pid)
    on_a.join(30)
    first = answers.get("first")
    wait_for(lambda: replicas.claim_states() in (["settled"], ["settle_failed"], []), timeout=30)
    retry = post(a, "paid-slow", send_body(WORK), headers, timeout=30)
    observed = {
        "first_answer_has_the_work": first is not None and ANSWER in first.text,
        "claim": replicas.claim_states(),
        "claim_task_id_set": [bool(t) for (t,) in replicas.rows("SELECT task_id FROM claims")],
        "transfers": len(replicas.ledger()["settlements"]),
        "retry_has_the_work": ANSWER in retry.text,
    }
    charged = observed["transfers"] == 1
    assert not charged or observed["first_answer_has_the_work"] or observed["retry_has_the_work"], (
        f"charged, and no answer carries the work: {observed}; first {first.text[:300] if first else answers};"
        f" retry {retry.text[:300]}; payment log {replicas.payment_actions()}"
    )
